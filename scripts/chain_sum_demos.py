"""Worked-solution demonstrations for reasoning-gym's chain_sum, for an SFT warm start
(`sft.source: file`): one line per operation, left to right, then the answer in tags, the format
of configs/chain_sum_sft.yaml's few-shot example. Made from the config's *training* examples
(never held-out ones), with the prompt exactly as training and evaluation render it (system
prompt, few-shot turns, suffix), so the warm start sees the prompts RL and train-rm will show.

    python scripts/chain_sum_demos.py configs/chain_sum_sft.yaml --n 768 --out chain_sum_demos.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reinforge.config import load_config  # noqa: E402
from reinforge.tasks import build_task  # noqa: E402


def worked_solution(expression: str) -> tuple[str, int]:
    """'0 - 4 - 8' -> ('0 - 4 = -4\\n-4 - 8 = -12', -12): one line per operation, left to right."""
    tokens = expression.split()
    if len(tokens) < 3 or len(tokens) % 2 == 0 or any(op not in "+-" for op in tokens[1::2]):
        raise ValueError(f"not a chain of + and - over integers: {expression!r}")
    total, lines = int(tokens[0]), []
    for op, term in zip(tokens[1::2], tokens[2::2]):
        new = total + int(term) if op == "+" else total - int(term)
        lines.append(f"{total} {op} {term} = {new}")
        total = new
    return "\n".join(lines), total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--n", type=int, default=768, help="demonstrations (the first N training examples)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = load_config(args.config, ignore_sections=("rm",))
    if cfg.task.name != "chain_sum":
        raise SystemExit(f"task.name is {cfg.task.name!r}; this script writes chain_sum solutions")
    train = build_task(cfg.task).train_examples()
    if args.n > len(train):
        raise SystemExit(f"--n {args.n} is more than the {len(train)} training examples (task.train_size)")
    with args.out.open("w") as f:
        for ex in (train[i] for i in range(args.n)):
            steps, total = worked_solution(ex.metadata["metadata"]["expression"])
            if str(total) != str(ex.answer).strip():
                raise SystemExit(f"{ex.id}: computed {total}, the task's answer is {ex.answer!r}")
            f.write(json.dumps({"messages": [*ex.messages, {"role": "assistant",
                                                           "content": f"{steps}\n<answer>{total}</answer>"}]}) + "\n")
    print(f"{args.n} demonstrations written to {args.out}")


if __name__ == "__main__":
    main()
