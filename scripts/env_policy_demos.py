"""Demonstrations played in a text environment by one of its declared baseline policies (GEM's
`bisect` for GuessTheNumber, say), for the SFT warm start of a multi-turn run (`sft.source: file`,
`apply_prompt_format: false`). Episodes are the config's *training* examples (never held-out ones);
every turn of an episode the policy won is one row, `{"messages": [...]}`: the conversation up to
that turn exactly as the agent loop shows it (system prompt, few-shot turns, the environment's
observations) with the policy's action as the last, assistant, message.

    python scripts/env_policy_demos.py configs/gem_guess.yaml --policy hinted_random --n 512 \
        --out gem_hinted_demos.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reinforge.agents import build_run_task  # noqa: E402
from reinforge.agents.adapters.base import BaselineNotApplicable, TextEnvTask, run_policy  # noqa: E402
from reinforge.config import load_config  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--policy", required=True, help="a baseline the environment declares (e.g. bisect, random)")
    ap.add_argument("--n", type=int, default=256, help="episodes played (the first N training examples)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = load_config(args.config)
    if cfg.env is None or cfg.task.source != "env":
        ap.error(f"{args.config}: needs an env section and task.source: env (a text environment's episodes)")
    task = build_run_task(cfg)
    if not isinstance(task, TextEnvTask):
        ap.error(f"env.name={cfg.env.name} is not a text environment with declared baselines")
    policies = task.baselines
    if args.policy not in policies:
        ap.error(f"{cfg.env.name} declares no baseline {args.policy!r}; it has: {', '.join(sorted(policies)) or 'none'}")
    examples = list(task.train_examples())[: args.n]
    conversations: list[dict] = []
    try:
        won = run_policy(task.spec, task.options, examples, policies[args.policy], max_turns=cfg.env.max_turns,
                         task=task, conversations=conversations)
    except BaselineNotApplicable as err:
        ap.error(f"the {args.policy} policy does not play this environment: {err}")
    rows = []
    for ok, played in zip(won, conversations):
        messages = played["messages"]
        if ok:  # each of the episode's turns, with the conversation before it
            rows += [{"messages": messages[: i + 1]} for i in range(played["opening"], len(messages))
                     if messages[i]["role"] == "assistant"]
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{sum(won)} of {len(won)} episodes won by {args.policy}; {len(rows)} turns written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
