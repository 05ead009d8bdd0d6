"""What the RL trainer saves and restores: a checkpoint of its state after a step (the learner's,
learning verifiers', RNG and curriculum state), the restore a resume starts with, and the final
model. Functions of a set-up ``Trainer``; the checkpoint format is lifecycle/checkpoint.py's."""

from __future__ import annotations

import logging
import os
import shutil

from ..lifecycle.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    remove_partial_checkpoints,
    save_checkpoint,
    set_rng_state,
)
from ..lifecycle.resume import record_segment

log = logging.getLogger("reinforge")


def restore(trainer) -> None:
    # The plan chose the newest checkpoint whose checksums match (reinforge/lifecycle/resume.py).
    ckpt = trainer._plan.checkpoint if trainer._plan is not None else latest_checkpoint(trainer.run_dir.path)
    for name in remove_partial_checkpoints(trainer.run_dir.path):
        log.info("removed %s, a checkpoint a killed process left half-written", name)
    if ckpt is None:
        log.warning("no checkpoint in %s: starting from step 0", trainer.run_dir.path)
        trainer.run_dir.truncate_after(0)
        record_segment(trainer.run_dir, trainer.cfg, 0)
        return
    data = load_checkpoint(ckpt)  # DamagedCheckpointError names an unreadable file
    learner_state = dict(data["optimizer"])
    reward_state = learner_state.pop("reward_models", {})
    trainer.learner.load_state_dict({"weights": data["weights"], **learner_state})
    if hasattr(trainer.reward_fn, "load_state_dict"):  # verifiers that learn during the run
        trainer.reward_fn.load_state_dict(reward_state)
    set_rng_state(data["rng"])
    st = data["state"]
    trainer.curriculum.load_state_dict(st["sampler"])
    _restore_rollouts(trainer, data.get("extra", {}).get("rollouts"))
    trainer.nan_streak = st.get("nan_streak", 0)
    trainer.start_step = st["step"]
    # A generator with its own weights started from the base model's.
    trainer._sync_generator(trainer.start_step)
    trainer.run_dir.truncate_after(trainer.start_step)
    if trainer.hacking_guard is not None:
        trainer.hacking_guard.replay(trainer.run_dir.read_metrics())
    record_segment(trainer.run_dir, trainer.cfg, trainer.start_step)  # segments.json, then config.yaml
    log.info("resumed %s from step %d", trainer.run_dir.path, trainer.start_step)

def _restore_rollouts(trainer, rollouts) -> None:
    """Rollout workers sample ahead: the checkpoint's requests and results they depend on
    (scale/replay.py) are taken back, unless the resume changes what a step computes (then the
    prompts are sampled again from the curriculum's state before them, as loaded above)."""
    if rollouts is None or trainer.source is None:
        return
    if trainer._plan is not None and any(c.kind == "segment" for c in trainer._plan.changes):
        log.info("a new segment: the rollouts sampled ahead before the checkpoint are sampled again")
        return
    trainer.source.load_state(rollouts)


def checkpoint(trainer, step: int, start_of_next: tuple[dict, dict] | None = None) -> None:
    """Checkpoint the state after ``step``. ``start_of_next``: the (RNG, curriculum) states
    taken when the next step began, for a step that was abandoned after changing them."""
    state = trainer.learner.state_dict()
    reward_state = trainer.reward_fn.state_dict() if hasattr(trainer.reward_fn, "state_dict") else {}
    if reward_state:  # verifiers that learn during the run (PRIME's implicit PRM)
        state["reward_models"] = reward_state
    rng, sampler = start_of_next if start_of_next is not None else (None, trainer.curriculum.state_dict())
    extra = {}
    with trainer._stop.critical():  # a second Ctrl-C/SIGTERM waits for the write to end
        if trainer.source is not None:
            # Rollout workers sample ahead: the checkpoint holds what those samples depend on
            # (scale/replay.py; it may wait for a request issued before this step's update), and
            # the curriculum as it was before them, for a resume that samples them again.
            sampler, extra["rollouts"] = trainer.source.checkpoint_state(step)
        save_checkpoint(
            trainer.run_dir.path, step,
            weights=state.pop("weights"),
            optimizer_state=state,
            trainer_state={"sampler": sampler, "nan_streak": trainer.nan_streak},
            keep=trainer.cfg.trainer.keep_checkpoints, rng=rng, extra=extra,
        )


def save_final_model(trainer) -> None:
    target = trainer.run_dir.path / "final_model"
    tmp = trainer.run_dir.path / ".tmp-final_model"
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.model.save_pretrained(tmp)
    trainer.tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
