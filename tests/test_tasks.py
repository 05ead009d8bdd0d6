"""Tasks: real reasoning-gym datasets, real files written in the test, a tokenizer built in code."""

from __future__ import annotations

import csv
import json

import pytest

from reinforge.config import TaskConfig
from reinforge.tasks import (
    Example,
    FileTask,
    PromptFormat,
    ReasoningGymTask,
    TaskError,
    build_task,
    encode_prompt,
    normalize_answer,
)


def _questions(examples) -> list[str]:
    return [e.metadata["question"] for e in examples]


# -- reasoning-gym ------------------------------------------------------------------------------


def test_rg_split_never_overlaps_and_is_distinct():
    task = ReasoningGymTask("leg_counting", train_size=400, eval_size=50, seed=3)
    train, held = task.train_examples(), task.eval_examples()
    assert len(train) == 400 and len(held) == 50
    assert not set(_questions(train)) & set(_questions(held))
    assert len(set(_questions(held))) == 50
    assert train[0].id == "leg_counting/train/0" and held[7].id == "leg_counting/eval/7"


def test_rg_split_never_overlaps_in_a_tiny_question_space():
    # 1 animal x 1..3 instances: 37 * 3 = 111 possible questions, a third of them held out, so
    # most training slots first draw a held-out question and must take a replacement.
    opts = dict(min_animals=1, max_animals=1, min_instances=1, max_instances=3)
    task = ReasoningGymTask("leg_counting", options=opts, train_size=300, eval_size=40, seed=0)
    held = set(_questions(task.eval_examples()))
    train = _questions(task.train_examples())
    assert len(held) == 40 and len(train) == 300
    assert not held & set(train)


def test_rg_eval_larger_than_question_space_is_a_clear_error():
    opts = dict(min_animals=1, max_animals=1, min_instances=1, max_instances=1)  # 37 questions
    with pytest.raises(TaskError, match=r"task\.eval_size=50.*task\.options"):
        ReasoningGymTask("leg_counting", options=opts, train_size=10, eval_size=50)


def test_rg_seeds_are_reproducible():
    a = ReasoningGymTask("leg_counting", train_size=30, eval_size=10, seed=7)
    b = ReasoningGymTask("leg_counting", train_size=30, eval_size=10, seed=7)
    c = ReasoningGymTask("leg_counting", train_size=30, eval_size=10, seed=8)
    assert _questions(a.train_examples()) == _questions(b.train_examples())
    assert _questions(a.eval_examples()) == _questions(b.eval_examples())
    assert [e.answer for e in a.train_examples()] == [e.answer for e in b.train_examples()]
    assert _questions(a.train_examples()) != _questions(c.train_examples())


def test_rg_eval_set_does_not_depend_on_train_size():
    small = ReasoningGymTask("leg_counting", train_size=10, eval_size=20, seed=1)
    large = ReasoningGymTask("leg_counting", train_size=3000, eval_size=20, seed=1)
    assert _questions(small.eval_examples()) == _questions(large.eval_examples())


def test_rg_training_set_is_lazy_sequence():
    # futoshiki takes ~0.2 s per puzzle: building 5000 eagerly would take many minutes.
    task = ReasoningGymTask("futoshiki", train_size=5000, eval_size=2, seed=0)
    train = task.train_examples()
    assert len(train) == 5000
    last = train[-1]
    assert last.id == "futoshiki/train/4999" and train[4999] is last
    assert [e.id for e in train[1:3]] == ["futoshiki/train/1", "futoshiki/train/2"]
    with pytest.raises(IndexError):
        train[5000]


def test_rg_messages_answer_and_metadata():
    task = ReasoningGymTask(
        "leg_counting", train_size=5, eval_size=2,
        prompt_format=PromptFormat(system_prompt="Be brief.", suffix="\nSUFFIX"),
    )
    ex = task.train_examples()[0]
    assert ex.messages[0] == {"role": "system", "content": "Be brief."}
    assert ex.messages[1]["role"] == "user"
    assert ex.messages[1]["content"] == ex.metadata["question"] + "\nSUFFIX"
    assert ex.answer == ex.metadata["answer"] and isinstance(ex.answer, str)
    assert ex.metadata["metadata"]["source_dataset"] == "leg_counting"  # full entry, for scoring


def test_rg_score_and_partial_credit():
    task = ReasoningGymTask("leg_counting", train_size=5, eval_size=2)
    ex = task.train_examples()[0]
    assert task.score(ex.answer, ex) == 1.0
    partial = task.score(f"{ex.answer} legs", ex)  # right number, wrong format
    assert 0.0 < partial < 1.0
    assert task.score("no idea", ex) == 0.0


def test_rg_unknown_name_suggests_and_says_how_to_list():
    with pytest.raises(TaskError) as err:
        ReasoningGymTask("leg_countin", train_size=5, eval_size=2)
    msg = str(err.value)
    assert "'leg_countin'" in msg and "leg_counting" in msg and "task.name" in msg
    assert "reasoning_gym.factory" in msg and "DATASETS" in msg


def test_rg_unknown_option_lists_accepted_ones():
    with pytest.raises(TaskError) as err:
        ReasoningGymTask("leg_counting", options={"min_animal": 2}, train_size=5, eval_size=2)
    msg = str(err.value)
    assert "task.options" in msg and "'min_animal'" in msg and "min_animals" in msg
    assert "max_instances" in msg


def test_rg_reserved_option_points_at_the_task_key():
    with pytest.raises(TaskError, match=r"task\.seed"):
        ReasoningGymTask("leg_counting", options={"seed": 3}, train_size=5, eval_size=2)


def test_rg_invalid_option_value_is_named():
    with pytest.raises(TaskError) as err:
        ReasoningGymTask("leg_counting", options={"min_animals": 0}, train_size=5, eval_size=2)
    msg = str(err.value)
    assert "task.options" in msg and "min_animals must be positive" in msg


def test_build_task_reasoning_gym_from_config():
    cfg = TaskConfig(name="leg_counting", train_size=20, eval_size=5, seed=2, options={"max_animals": 4})
    task = build_task(cfg)
    assert isinstance(task, ReasoningGymTask)
    assert len(task.train_examples()) == 20 and len(task.eval_examples()) == 5
    assert all(e.metadata["metadata"]["num_animals"] <= 4 for e in task.train_examples())


# -- files --------------------------------------------------------------------------------------


def _rows(n: int) -> list[dict]:
    return [{"prompt": f"What is {i} + {i}?", "answer": 2 * i, "extra": i} for i in range(n)]


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_file_jsonl_split_reproducible_and_disjoint(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", _rows(50))
    a = FileTask(path, eval_size=10, seed=0)
    b = FileTask(path, eval_size=10, seed=0)
    c = FileTask(path, eval_size=10, seed=1)
    assert len(a.train_examples()) == 40 and len(a.eval_examples()) == 10
    assert [e.id for e in a.eval_examples()] == [e.id for e in b.eval_examples()]
    assert [e.id for e in a.eval_examples()] != [e.id for e in c.eval_examples()]
    ids_train = {e.id.rsplit("/", 1)[1] for e in a.train_examples()}
    ids_eval = {e.id.rsplit("/", 1)[1] for e in a.eval_examples()}
    assert not ids_train & ids_eval and len(ids_train | ids_eval) == 50
    ex = a.train_examples()[0]
    assert ex.id.startswith("file:data.jsonl/train/")
    row = int(ex.id.rsplit("/", 1)[1])
    assert ex.messages == [{"role": "user", "content": f"What is {row} + {row}?"}]
    assert ex.answer == str(2 * row) and ex.metadata["extra"] == row


def test_file_train_size_caps_and_duplicate_prompts_never_cross_the_split(tmp_path):
    rows = _rows(30) + _rows(30)  # every prompt twice
    task = FileTask(_write_jsonl(tmp_path / "d.jsonl", rows), eval_size=10, train_size=25, seed=0)
    held = {e.prompt_text for e in task.eval_examples()}
    train = [e.prompt_text for e in task.train_examples()]
    assert len(train) == 25 and not held & set(train)


def test_file_eval_path(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", _rows(20))
    held = _write_jsonl(tmp_path / "test.jsonl", _rows(3))  # overlaps rows 0..2 of train
    task = FileTask(train, eval_path=held, eval_size=1)
    assert [e.id for e in task.eval_examples()] == [f"file:test.jsonl/eval/{i}" for i in range(3)]
    assert len(task.train_examples()) == 17
    assert not {e.prompt_text for e in task.eval_examples()} & {e.prompt_text for e in task.train_examples()}


def test_file_formats_parquet_csv_json_and_saved_dataset(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows(12)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    with open(tmp_path / "d.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["prompt", "answer", "extra"])
        w.writeheader()
        w.writerows(rows)
    (tmp_path / "d.json").write_text(json.dumps(rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    reference = FileTask(_write_jsonl(tmp_path / "d.jsonl", rows), eval_size=4, seed=5)
    for name in ["d.parquet", "d.csv", "d.json", "saved"]:
        task = FileTask(str(tmp_path / name), eval_size=4, seed=5)
        assert [(e.prompt_text, e.answer) for e in task.eval_examples()] == [
            (e.prompt_text, e.answer) for e in reference.eval_examples()
        ], name
        assert len(task.train_examples()) == 8


def test_file_prompt_as_chat_messages(tmp_path):
    rows = [
        {"messages": [{"role": "system", "content": "old"}, {"role": "user", "content": f"q{i}"}], "y": i}
        for i in range(6)
    ]
    task = FileTask(
        _write_jsonl(tmp_path / "chat.jsonl", rows), prompt_field="messages", answer_field="y",
        eval_size=2, prompt_format=PromptFormat(system_prompt="new", suffix=" (answer in tags)"),
    )
    ex = task.train_examples()[0]
    row = int(ex.id.rsplit("/", 1)[1])
    assert ex.messages == [
        {"role": "system", "content": "new"},
        {"role": "user", "content": f"q{row} (answer in tags)"},
    ]
    assert rows[row]["messages"][1]["content"] == f"q{row}"  # the raw row is left untouched


def test_file_missing_file_names_task_path(tmp_path):
    with pytest.raises(TaskError, match=r"task\.path.*nope\.jsonl"):
        FileTask(str(tmp_path / "nope.jsonl"))
    good = _write_jsonl(tmp_path / "d.jsonl", _rows(5))
    with pytest.raises(TaskError, match=r"task\.eval_path.*nope\.jsonl"):
        FileTask(good, eval_path=str(tmp_path / "nope.jsonl"))


def test_file_row_missing_prompt_field_names_line_field_and_fix(tmp_path):
    rows = _rows(5)
    rows[2] = {"question": "Q?", "answer": 1}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))
    with pytest.raises(TaskError) as err:
        FileTask(str(path), eval_size=1)
    msg = str(err.value)
    # rows[2] sits on line 4 (line 2 is blank)
    assert "bad.jsonl" in msg and "line 4" in msg and "'prompt'" in msg
    assert "'question'" in msg and "task.prompt_field" in msg and "task.answer_field" in msg


def test_file_row_missing_answer_field(tmp_path):
    rows = _rows(5)
    del rows[4]["answer"]
    with pytest.raises(TaskError, match=r"line 5 has no field 'answer' \(task\.answer_field\)"):
        FileTask(_write_jsonl(tmp_path / "d.jsonl", rows), eval_size=1)
    with open(tmp_path / "d.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["q", "answer"])
        w.writeheader()
        w.writerows([{"q": "a", "answer": "1"}])
    with pytest.raises(TaskError, match=r"d\.csv.*row 1 has no field 'prompt'.*'q', 'answer'"):
        FileTask(str(tmp_path / "d.csv"), eval_size=1)


def test_file_eval_size_too_large_and_bad_extension(tmp_path):
    with pytest.raises(TaskError, match=r"task\.eval_size=10.*only 5 rows"):
        FileTask(_write_jsonl(tmp_path / "d.jsonl", _rows(5)), eval_size=10)
    (tmp_path / "d.txt").write_text("hi")
    with pytest.raises(TaskError, match=r"unsupported extension '\.txt'"):
        FileTask(str(tmp_path / "d.txt"))


def test_file_score_normalises():
    task = FileTask.__new__(FileTask)  # score() needs no data
    ex = Example("x", [], "Paris", {})
    assert task.score("  paris. ", ex) == 1.0
    assert task.score("London", ex) == 0.0
    assert normalize_answer("A  b.\n") == "a b"
    assert normalize_answer("A b", case_sensitive=True) == "A b"


def test_build_task_file_from_config(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", _rows(10))
    task = build_task(TaskConfig(source="file", path=path, eval_size=3, prompt_suffix="!"))
    assert isinstance(task, FileTask)
    assert len(task.eval_examples()) == 3
    assert task.train_examples()[0].messages[-1]["content"].endswith("?!")


# -- prompts ------------------------------------------------------------------------------------


def test_encode_prompt_uses_chat_template(tiny_tokenizer):
    ex = Example("x", [{"role": "system", "content": "S"}, {"role": "user", "content": "hi 2"}], "2", {})
    ids = encode_prompt(tiny_tokenizer, ex)
    assert isinstance(ids, list) and all(type(t) is int for t in ids)
    expected = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi 2<|im_end|>\n<|im_start|>assistant\n"
    assert tiny_tokenizer.decode(ids) == expected


def test_encode_prompt_without_chat_template_joins_contents(tiny_tokenizer):
    tiny_tokenizer.chat_template = None
    ex = Example("x", [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}], "2", {})
    ids = encode_prompt(tiny_tokenizer, ex)
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "S\nhi"


def test_few_shot_turns_come_before_the_question_with_the_suffix():
    from reinforge.tasks.base import build_messages

    msgs = build_messages(
        "What is 2+2?", system_prompt="Be brief.", prompt_suffix=" Use <answer> tags.",
        few_shot=[{"user": "What is 1+1?", "assistant": "<answer>2</answer>"}],
    )
    assert msgs == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1+1? Use <answer> tags."},
        {"role": "assistant", "content": "<answer>2</answer>"},
        {"role": "user", "content": "What is 2+2? Use <answer> tags."},
    ]


def test_few_shot_from_config_reaches_reasoning_gym_prompts():
    from reinforge.config import build_config
    from reinforge.tasks import build_task

    cfg = build_config({"task": {"name": "chain_sum", "train_size": 5, "eval_size": 5,
                                 "few_shot": [{"user": "1+1?", "assistant": "2"}]}})
    ex = build_task(cfg.task).train_examples()[0]
    assert [m["role"] for m in ex.messages] == ["user", "assistant", "user"]
    assert ex.messages[1]["content"] == "2"
