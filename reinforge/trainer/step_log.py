"""What a step logs: its metrics (rewards, accuracy, lengths, advantages, phase times, the
learner's statistics, agent metrics) and its first samples, and for an agent run every trajectory
of the step, into the run directory."""

from __future__ import annotations

import numpy as np
import torch

from ..agents import agent_metrics, write_trajectories
from ..experience import PhaseTimer, Scored


def step_metrics(trainer, step: int, scored: Scored, prepared, stats: dict[str, float], timer: PhaseTimer) -> dict[str, float]:
    """The step's metrics, and its first ``trainer.samples_to_log`` samples into the run."""
    rollout, scores = scored.rollout, scored.scores
    batch = prepared.batch
    rewards, outcomes, actions = scores.shaped, scores.outcomes, rollout.action_mask
    elapsed = sum(timer.times.values())
    lengths = rollout.action_lengths.float()
    n_tokens = float(lengths.sum())
    groups = rollout.num_groups
    grouped_min = torch.full((groups,), torch.inf).scatter_reduce(0, rollout.group_index, rewards, "amin")
    grouped_max = torch.full((groups,), -torch.inf).scatter_reduce(0, rollout.group_index, rewards, "amax")
    adv = batch.advantages
    adv_tok = adv if adv.dim() == 2 else adv[:, None].expand_as(actions)
    metrics = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "accuracy": float(np.mean([o.correct for o in outcomes])),
        "uniform_group_frac": float((grouped_max == grouped_min).float().mean()),
        "advantage_abs_mean": float(adv_tok[actions].abs().mean()) if actions.any() else 0.0,
        "completion_length": float(lengths.mean()),
        "truncated_frac": float(rollout.truncated.float().mean()),
        "reward_errors": float(sum(len(o.errors) for o in outcomes)),
        "generated_tokens": n_tokens,
        "tokens_per_s": n_tokens / max(elapsed, 1e-9),
        "time_step": elapsed,
        **timer.metrics(),
        **{f"reward/{k}": float(np.mean([o.components.get(k, 0.0) for o in outcomes]))
           for k in (outcomes[0].components if outcomes else {})},
        **scored.info,
        **prepared.info,
        **stats,
    }
    # Mean length of right and of wrong completions apart: GRPO's per-sequence normalisation
    # lets wrong answers grow longer (Liu et al. 2025, arXiv:2503.20783, their Figure 5).
    correct = torch.tensor([bool(o.correct) for o in outcomes], dtype=torch.bool)
    if len(correct) == len(lengths):
        for key, sel in (("completion_length_correct", correct), ("completion_length_incorrect", ~correct)):
            if sel.any():
                metrics[key] = float(lengths[sel].mean())
    if trainer.hacking_guard is not None:
        metrics.update(trainer.hacking_guard.observe(step, metrics))
    k = min(trainer.cfg.trainer.samples_to_log, len(rollout))
    if k:
        rows = []
        row_examples = scored.row_examples
        for i in range(k):
            o, e, a = outcomes[i], row_examples[i], adv[i]
            rows.append({"prompt_id": e.id, "answer": e.answer, "completion": rollout.texts[i],
                         "reward": float(rewards[i]), "correct": o.correct,
                         "advantage": float(a if a.dim() == 0 else a[actions[i]].mean() if actions[i].any() else 0.0),
                         "version": int(rollout.versions[i]), "errors": o.errors})
        trainer.run_dir.log_samples(step, rows)
    if trainer.cfg.env is not None:  # every trajectory of the step, whole, and the agent metrics
        episodes = trainer.generator.pop_recorded()
        metrics.update(agent_metrics(episodes))
        write_trajectories(trainer.run_dir.path / "trajectories" / f"step_{step:06d}.jsonl",
                           [e.to_record() for e in episodes])
    return metrics
