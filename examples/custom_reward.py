"""A reward function written in the training script: the main job (GRPO, SmolLM2-135M-Instruct,
reasoning-gym needle_haystack) scored by `name_reward` below instead of the config's verifier.

    python examples/custom_reward.py                  # about 4 min on a 2-core CPU
    python examples/custom_reward.py trainer.steps=40 task.eval_size=200   # key=value overrides
"""

import re
import sys
from pathlib import Path

import reinforge

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def name_reward(completion: str, example: reinforge.Example) -> reinforge.VerifierResult:
    """1 for the right name in <answer> tags, plus 0.1 for exactly one non-empty tag: the format
    credit gives a signal while few samples of a group name the right person."""
    answers = ANSWER.findall(completion)
    correct = bool(answers) and answers[-1].strip().lower() == example.answer.lower()
    well_formed = len(answers) == 1 and answers[0].strip() != ""
    return reinforge.VerifierResult(float(correct) + 0.1 * well_formed, correct=correct)


# Training stays under the guard: `reinforge reproduce` (or any later process) loads name_reward
# by importing this file, which must not start another run.
if __name__ == "__main__":
    config = reinforge.load_config(
        Path(__file__).resolve().parents[1] / "configs" / "main.yaml",
        # a short run: 10 steps, held-out accuracy on 50 prompts before and after
        ["trainer.steps=10", "trainer.eval_every=10", "task.eval_size=50", *sys.argv[1:]],
        reward={"verifiers": [{"name": "python", "options": {"function": name_reward}}]},
    )
    result = reinforge.Trainer(config).run()
    print(f"run: {result.run_dir} ({result.steps_done} steps)")
    acc, verdict = result.summary.get("heldout_accuracy"), result.summary.get("verdict")
    if acc:  # the same held-out prompts before and after, greedy; summary.md has the details
        print(f"held-out accuracy {acc['before']:.3f} -> {acc['after']:.3f}"
              + (f"; {verdict['text']}" if verdict else ""))
