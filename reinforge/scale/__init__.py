"""Scale-out: rollout workers as Ray actors with bounded staleness (``ray_source``), and a
data-parallel learner over torch.distributed (``data_parallel``). docs/scaling.md.

Ray is imported only when a run asks for ``scale.mode=ray``."""

from __future__ import annotations


def build_experience_source(trainer):
    """The experience source ``trainer.cfg.scale`` asks for, built from a set-up trainer (its
    training examples, prompt encoder, curriculum and the learner's current weights)."""
    from .ray_source import RayExperienceSource

    return RayExperienceSource(
        trainer.cfg, examples=trainer.train_examples, encode=trainer._encode, curriculum=trainer.curriculum,
        pad_id=trainer.generator.pad_id, weights=trainer.learner.policy_state_dict(), version=0,
        run_path=trainer.run_dir.path,
    )


__all__ = ["build_experience_source"]
