"""An advantage estimator written in the training script: the main job (GRPO's loss on
SmolLM2-135M-Instruct, reasoning-gym needle_haystack) with rank-based advantages instead of GRPO's
group-normalised ones.

    python examples/custom_advantage.py               # about 4 min on a 2-core CPU
    python examples/custom_advantage.py trainer.steps=40 task.eval_size=200   # key=value overrides
"""

import sys
from pathlib import Path

import reinforge


@reinforge.register_advantage("pairwise_rank")
def pairwise_rank(x: reinforge.AdvantageInputs) -> reinforge.Advantages:
    """A_i = mean over the other samples j of i's group of sign(r_i - r_j): i's win rate against
    its group, in [-1, 1]. Only the order of the rewards counts, not their scale; a group whose
    rewards are all equal gets 0. One value per sample, applied to all its tokens."""
    r = x.sequence_rewards()                                       # [N], minus any KL in the reward
    same = x.group_index[:, None] == x.group_index[None, :]        # [N, N] same prompt
    wins = (r[:, None] - r[None, :]).sign() * same                 # 0 across groups and against itself
    return reinforge.Advantages(wins.sum(1) / (same.sum(1) - 1).clamp(min=1))


# Training stays under the guard: the estimator is registered by importing this file, which must
# not start another run.
if __name__ == "__main__":
    config = reinforge.load_config(
        Path(__file__).resolve().parents[1] / "configs" / "main.yaml",
        ["algorithm.advantage=pairwise_rank", "trainer.steps=10", "trainer.eval_every=10", "task.eval_size=50",
         *sys.argv[1:]],
        # a graded reward (the right name 1, a well-formed <answer> tag 0.1), so that ranks differ
        # from a mean baseline: with 0/1 rewards this estimator equals RLOO's
        reward={"verifiers": [{"name": "exact_match"}, {"name": "format", "weight": 0.1}]},
    )
    result = reinforge.Trainer(config).run()
    print(f"run: {result.run_dir} ({result.steps_done} steps)")
    acc, verdict = result.summary.get("heldout_accuracy"), result.summary.get("verdict")
    if acc:  # the same held-out prompts before and after, greedy; summary.md has the details
        print(f"held-out accuracy {acc['before']:.3f} -> {acc['after']:.3f}"
              + (f"; {verdict['text']}" if verdict else ""))
