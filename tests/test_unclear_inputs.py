"""Messages about the user's own files (issue 28, finding 7): a data file that is not UTF-8, a model
folder without a tokenizer, a reward file with a syntax error or one that fails at import. Each is
one line naming the file (and the line, where there is one) and the fix, given before any weights
load, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tiny_run import cli_in_process, save_tiny_run_inputs, tiny_run_overrides

from reinforge.config import ConfigError, load_config
from reinforge.config.callables import load_callable
from reinforge.models import ModelLoadError, load_tokenizer
from reinforge.sft.data import demos_from_file
from reinforge.tasks import FileTask, TaskError
from reinforge.tasks.code_task import load_code_problems

LATIN1_ROW = '{"prompt": "café 2", "answer": "7"}\n'.encode("latin-1")  # é is the byte 0xe9


def _latin1_file(path: Path, good_lines: list[str]) -> tuple[int, int]:
    """``good_lines`` in UTF-8, then a Latin-1 line; returns (line, byte offset) of the bad byte."""
    head = "".join(good_lines).encode("utf-8")
    path.write_bytes(head + LATIN1_ROW)
    return len(good_lines) + 1, len(head) + LATIN1_ROW.index(b"\xe9")


def _one_line(proc: subprocess.CompletedProcess) -> str:
    out = proc.stderr + proc.stdout
    assert "Traceback" not in out, out
    lines = [line for line in proc.stderr.splitlines() if line.startswith("reinforge:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return save_tiny_run_inputs(tmp_path_factory.mktemp("unclear"))


def _train(root: Path, *args: str) -> subprocess.CompletedProcess:
    return cli_in_process("train", *args)  # a refusal needs no process of its own


def _model_without_weights(root: Path) -> Path:
    """The tiny model folder with garbage for weights: a run that reached them would fail on them."""
    folder = root / "model-no-weights"
    if not folder.exists():
        shutil.copytree(root / "model", folder)
        (folder / "model.safetensors").write_bytes(b"not safetensors")
    return folder


# ----------------------------------------------------------------------------- non-UTF-8 data files


def test_a_latin1_task_file_is_one_line_naming_the_file_line_and_byte(root):
    data = root / "latin1.jsonl"
    line, offset = _latin1_file(data, [json.dumps({"prompt": f"say {i}", "answer": "7"}) + "\n" for i in range(8)])
    proc = _train(root, *tiny_run_overrides(root, "latin1", task=data))
    msg = _one_line(proc)
    assert proc.returncode != 0
    assert f"task.path: {str(data)!r} is not UTF-8 text: byte 0xe9 at offset {offset} (line {line}," in msg
    assert "re-save the file as UTF-8" in msg and "iconv -f latin1 -t utf-8 latin1.jsonl" in msg
    assert not (root / "runs" / "latin1").exists()


def _rows(n: int) -> list[str]:
    return [json.dumps({"prompt": f"q {i}", "answer": "7"}) + "\n" for i in range(n)]


def test_every_text_file_a_run_reads_names_itself(tmp_path):
    # a CSV task file
    csv_file = tmp_path / "data.csv"
    csv_file.write_bytes(b"prompt,answer\nq 1,7\nq 2,7\ncaf\xe9,7\n")
    with pytest.raises(TaskError, match=r"task.path: .*data.csv' is not UTF-8 text: byte 0xe9 at offset 29 \(line 4, "
                                        r"byte 4 of the line\)"):
        FileTask(str(csv_file), eval_size=1)
    # a held-out file
    good, bad = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    good.write_text("".join(_rows(5)))
    line, offset = _latin1_file(bad, _rows(2))
    with pytest.raises(TaskError, match=rf"task.eval_path: .*eval.jsonl' is not UTF-8 text: byte 0xe9 at offset "
                                        rf"{offset} \(line {line},"):
        FileTask(str(good), eval_path=str(bad))
    # code problems
    problems = tmp_path / "problems.jsonl"
    problems.write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(TaskError, match=r"task.path: .*problems.jsonl' is not UTF-8 text: byte 0xff at offset 12 "
                                        r"\(line 1, byte 13 of the line\)"):
        load_code_problems(problems)
    # SFT demonstrations
    demos = tmp_path / "demos.jsonl"
    _latin1_file(demos, [])
    with pytest.raises(TaskError, match=r"sft.path: .*demos.jsonl' is not UTF-8 text"):
        demos_from_file(demos)
    # the config file itself (few-shot examples and prompts live in it)
    config = tmp_path / "run.yaml"
    text = b"task:\n  few_shot:\n    - {user: 'caf\xe9', assistant: '<answer>1</answer>'}\n"
    config.write_bytes(text)
    at = text.index(b"\xe9")
    with pytest.raises(ConfigError, match=rf"config file: .*run.yaml' is not UTF-8 text: byte 0xe9 at offset {at} "
                                          r"\(line 3,"):
        load_config(config)


def test_a_byte_order_mark_is_no_error(tmp_path):
    data = tmp_path / "bom.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + "".join(_rows(4)).encode())
    assert len(FileTask(str(data), eval_size=1).train_examples()) == 3


# ----------------------------------------------------------------------------- a model folder without a tokenizer


def test_a_model_folder_without_a_tokenizer_names_the_folder_and_what_is_missing(root):
    folder = root / "model-no-tokenizer"
    shutil.copytree(root / "model", folder)
    for f in folder.iterdir():
        if f.name not in ("config.json", "generation_config.json", "model.safetensors"):
            f.unlink()
    proc = _train(root, *tiny_run_overrides(root, "no-tokenizer", model=folder))
    msg = _one_line(proc)
    assert proc.returncode != 0
    assert f"the model folder {str(folder)!r} has no tokenizer (none of tokenizer.json, tokenizer_config.json" in msg
    assert "it holds config.json, generation_config.json, model.safetensors" in msg
    assert f".save_pretrained({str(folder)!r})" in msg
    assert not (root / "runs" / "no-tokenizer").exists()


def test_a_tokenizer_transformers_cannot_load_is_named_too(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=rf"could not load the tokenizer in the model folder {str(tmp_path)!r}"):
        load_tokenizer(tmp_path)


# ----------------------------------------------------------------------------- reward files

BROKEN = {
    "syntax": ("def score(completion, example):\n    return 1.0\n\n\ndef helper(:\n    pass\n",
               [" line 5: SyntaxError: ", "(`def helper(:`)", "fix that line of the file"]),
    "raises": ('import json\n\nLIMITS = json.loads("{not json")\n\n\ndef score(completion, example):\n    return 1.0\n',
               [" line 3 (`LIMITS = json.loads(\"{not json\")`) raised JSONDecodeError: Expecting property name",
                "at import; fix that line, or what it calls"]),
    "missing": ("import numpy\nimport not_a_package_issue28\n\n\ndef score(completion, example):\n    return 1.0\n",
                [(" line 2 (`import not_a_package_issue28`) raised ModuleNotFoundError: No module named "
                  "'not_a_package_issue28' at import; install 'not_a_package_issue28' or remove that import")]),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_reward_file_is_one_line_with_its_file_and_line_before_the_weights_load(root, kind):
    text, words = BROKEN[kind]
    reward = root / f"reward_{kind}.py"
    reward.write_text(text)
    proc = _train(root, *tiny_run_overrides(root, f"reward-{kind}", reward=f"{reward}:score",
                                            model=_model_without_weights(root)))
    msg = _one_line(proc)
    assert proc.returncode != 0
    assert msg.startswith(f"reinforge: reward.verifiers[0].options.function: cannot load reward function "
                          f"'{reward}:score': {reward}"), msg
    assert all(w in msg for w in words), msg
    assert not (root / "runs" / f"reward-{kind}").exists()


def test_a_module_that_cannot_be_found_says_where_python_looks(root):
    proc = _train(root, *tiny_run_overrides(root, "reward-nomodule", reward="no_such_reward_module_28:score",
                                            model=_model_without_weights(root)))
    msg = _one_line(proc)
    assert "cannot import module 'no_such_reward_module_28' for reward function 'no_such_reward_module_28:score'" in msg
    assert "PYTHONPATH" in msg and "'path/to/file.py:function'" in msg


def test_a_named_module_names_its_own_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "rewards_issue28_a.py").write_text("X = 1\nY = 1 / 0\n\ndef score(c, e):\n    return 1.0\n")
    (tmp_path / "rewards_issue28_b.py").write_text("def score(c, e)\n    return 1.0\n")
    (tmp_path / "rewards_issue28_c.py").write_text("def scores(c, e):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"rewards_issue28_a.py line 2 \(`Y = 1 / 0`\) raised ZeroDivisionError"):
        load_callable("rewards_issue28_a:score", "reward function")
    with pytest.raises(ConfigError, match=r"rewards_issue28_b.py line 1: SyntaxError: .*fix that line"):
        load_callable("rewards_issue28_b:score", "reward function")
    with pytest.raises(ConfigError, match=r"'rewards_issue28_c' has no callable 'score'; it defines: scores"):
        load_callable("rewards_issue28_c:score", "reward function")
    with pytest.raises(ConfigError, match="environment factory file '/nonexistent.py' does not exist"):
        load_callable("/nonexistent.py:make", "environment factory")
