"""What a resume may change, how an accepted change takes effect, and how it is recorded.

``reinforge train --resume RUN_DIR key=value ...`` continues a run from its latest checkpoint with
the saved config and those overrides. Every changed key is one of three kinds:

- **free**: changes what is logged, kept or how fast it runs, not what a step computes: the number
  of steps, evaluation and checkpoint cadence, samples logged, the NaN patience, exporters,
  progress, and speed/memory settings (micro-batch and logit-chunk sizes, prefix sharing,
  activation checkpointing, generation batch size, vLLM memory, threads; these may change float
  rounding, never the algorithm). Applied on any resume.
- **segment**: changes what a step computes or what the evaluations measure: the task, the reward,
  sampling, the algorithm, the learning rate and the other optimiser settings, the recipe, the
  seeds. Refused unless ``--new-segment`` is given; then the run continues in a new *segment*.
- **fixed**: cannot change within a run, because the checkpoint was made for the old value (the
  model, its dtype, LoRA, adding or removing PPO's critic) or because the directory itself is the
  answer (output_dir, run_name, sweep). Refused always; start a new run instead.

Keys not listed (new config options) are "segment": a change is never silently assumed harmless.
A resume with no checkpoint starts over, so any change but the fixed directory keys is accepted.

Which checkpoint a resume continues from is decided here too, before anything loads: the newest
one whose files match the sizes and SHA-256 digests recorded in its ``state.json``
(reinforge/tracking/checkpoints.py). A damaged newer one is named (which file, how) and skipped;
the steps after the checkpoint used are dropped from the logs and trained again, exactly. With no
intact checkpoint left, or a damaged line in the run's logs, the resume is refused with the fix
(:class:`DamagedCheckpointError`): a run never silently starts over from step 0. Every other file
the continued run depends on is read first too (status.json, config.yaml, segments.json, the
evaluation details; tracking/validate.py), so a damaged one is one line before anything loads, and
records lost while the checkpoint is intact (a truncated metrics.jsonl) are a warning naming them.

The changes are printed before anything loads. Every accepted change is recorded, with the step it
took effect, in the run directory's segments.json (reinforge/tracking/segments.py); config.yaml
becomes the new config. ``recipe=NAME`` on a resume applies the recipe's preset over the saved
config (the saved config pins every key a recipe sets, so a bare name would change nothing), and
every key the preset changes is listed. The optimiser's learning rate, betas and weight decay are
restored from the checkpoint with its state; the learner sets its config's values again as it
loads that state (reinforge/learner/optim.py), so an accepted change reaches the optimiser.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..config import (
    ConfigError,
    RunConfig,
    deep_merge,
    parse_override,
    recipe_preset,
    set_dotted,
    validate_config,
)
from ..tracking import RunDir, read_jsonl
from ..tracking.checkpoints import (
    DamagedCheckpointError,
    damaged_checkpoints,
    list_checkpoints,
    verify_checkpoint,
)
from ..tracking.segments import (
    Change,
    Segment,
    config_changes,
    read_segments,
    record_resume,
)
from ..tracking.validate import check_records, check_run_files

__all__ = ["FREE_KEYS", "FIXED_KEYS", "ResumeRefused", "ResumePlan", "change_kind", "resume_config", "plan_resume",
           "record_segment", "EVAL_KEYS", "choose_checkpoint", "check_logs",
           "DamagedCheckpointError"]

# Keys (or sections, as prefixes) a resume may change freely.
FREE_KEYS = (
    "trainer.steps", "trainer.eval_every", "trainer.eval_at_start", "trainer.checkpoint_every",
    "trainer.keep_checkpoints", "trainer.stop_grace_s", "trainer.samples_to_log", "trainer.max_consecutive_nan",
    "trainer.num_threads",
    "tracking.progress", "tracking.exporters", "tracking.wandb", "tracking.mlflow", "tracking.tensorboard",
    "tracking.trackio",
    # speed and memory: same algorithm, possibly other float rounding
    "learner.micro_batch_tokens", "learner.logits_chunk_tokens", "learner.share_prompt_prefix",
    "learner.skip_zero_advantage",
    "model.gradient_checkpointing", "model.device", "rollout.generation_batch_size", "rollout.vllm_kv_cache_gb",
    "rollout.vllm_gpu_memory_utilization", "rollout.vllm_enforce_eager", "rollout.vllm_max_model_len",
    # the SFT stage's evaluation and checkpoint cadence (reinforge/sft)
    "sft.eval_every", "sft.checkpoint_every",
)

# Keys no resume may change, with the reason.
FIXED_KEYS = {
    "model.path": "the checkpoint holds this model's weights",
    "model.dtype": "the checkpoint's weights and optimiser state are in the saved dtype",
    "model.lora": "the checkpoint holds the saved LoRA (or full) weights",
    "tracking.output_dir": "the run directory is the one given to --resume",
    "tracking.run_name": "the run directory is the one given to --resume",
    "tracking.sweep": "sweep membership is set by `reinforge sweep`",
}
# Still fixed when the run restarts from step 0 (no checkpoint): they name the directory.
_DIRECTORY_KEYS = ("tracking.output_dir", "tracking.run_name", "tracking.sweep")

# Keys that change what the held-out evaluation measures: a summary never pairs evaluations
# made on either side of such a change.
EVAL_KEYS = ("task", "reward", "rollout.max_new_tokens", "trainer.eval_max_prompts", "model")


def _under(key: str, prefixes) -> str | None:
    for p in prefixes:
        if key == p or key.startswith(p + "."):
            return p
    return None


def change_kind(key: str, before: Any = None, after: Any = None) -> str:
    """``"free"``, ``"segment"`` or ``"fixed"`` for a change of ``key`` from ``before`` to
    ``after`` on a resume from a checkpoint (see the module docstring)."""
    if _under(key, FIXED_KEYS):
        return "fixed"
    if key == "algorithm.advantage" and _has_critic(before) != _has_critic(after):
        return "fixed"  # the checkpoint has a critic's state exactly when the estimator declares one
    if _under(key, FREE_KEYS):
        return "free"
    return "segment"


def _has_critic(advantage: Any) -> bool:
    from ..algorithms import ADVANTAGE_ESTIMATORS

    return isinstance(advantage, str) and advantage in ADVANTAGE_ESTIMATORS and ADVANTAGE_ESTIMATORS.needs(advantage).critic


def _fixed_reason(c: Change) -> str:
    if c.key == "algorithm.advantage":
        return "a critic (PPO's gae) cannot be added to or removed from a run (its state is in the checkpoint or missing)"
    return FIXED_KEYS[_under(c.key, FIXED_KEYS)]


class ResumeRefused(ConfigError):
    """The overrides of a resume change a key the resume policy does not allow (the message lists
    each such key, why, and what to do)."""


@dataclass
class ResumePlan:
    """A resume's checked changes: the recorded config -> the config the run continues under."""

    run_path: Path
    checkpoint_step: int            # the step the run continues from (0: no checkpoint, starts over)
    changes: list[Change] = field(default_factory=list)
    new_segment: bool = False
    checkpoint: Path | None = None  # the checkpoint folder it continues from (verified)

    def describe(self) -> str:
        where = (f"from the checkpoint of step {self.checkpoint_step}" if self.checkpoint_step
                 else "from step 0 (no checkpoint)")
        if not self.changes:
            return f"resuming {self.run_path} {where} with its saved config"
        kinds = {"free": "free", "segment": "new segment", "fixed": "fixed"}
        lines = [f"resuming {self.run_path} {where}; config changes:"]
        lines += [f"  {c.describe()}  [{kinds[c.kind]}]" for c in self.changes]
        return "\n".join(lines)


def resume_config(saved: dict[str, Any], overrides: list[str] | None) -> RunConfig:
    """The saved config with ``key=value`` overrides set. ``recipe=NAME`` first applies that
    recipe's preset over the saved values (the other overrides then go on top)."""
    raw = copy.deepcopy(saved)
    parsed = [parse_override(item) for item in overrides or []]
    for key, value in parsed:
        if key == "recipe":
            raw = deep_merge(raw, recipe_preset(str(value)))
            raw["recipe"] = value
    for key, value in parsed:
        if key != "recipe":
            set_dotted(raw, key, value)
    return validate_config(deep_merge(recipe_preset(raw.get("recipe", "grpo")), raw))


def plan_resume(run_dir: RunDir, config: RunConfig, *, new_segment: bool = False,
                out: TextIO | None = None) -> ResumePlan:
    """Check ``config`` against the run's recorded config under the resume policy, before anything
    loads; print the changes to ``out`` (default: stderr). Raises ResumeRefused naming every
    refused key."""
    out = out if out is not None else sys.stderr
    # Every file the continued run depends on is read now, so a damaged one is one line before
    # anything loads (tracking/validate.py), not a raw error after the model has loaded.
    check_run_files(run_dir)
    # Against the recorded history, not config.yaml alone: a hand edit of config.yaml is a change.
    saved = read_segments(run_dir)[-1].config
    try:  # options added since the run was made read as their defaults, not as changes
        saved = resume_config(saved, []).to_dict()
    except ConfigError:
        pass
    check_logs(run_dir)
    step, ckpt = choose_checkpoint(run_dir, out=out)
    check_records(run_dir, step, out=out)  # the records kept up to that checkpoint
    changes = [Change(k, a, b, change_kind(k, a, b)) for k, a, b in config_changes(saved, config.to_dict())]
    plan = ResumePlan(run_dir.path, step, changes, new_segment, ckpt)
    print(plan.describe(), file=out)
    if step == 0:
        fixed = [c for c in changes if _under(c.key, _DIRECTORY_KEYS)]
        segment = []
    else:
        fixed = [c for c in changes if c.kind == "fixed"]
        segment = [c for c in changes if c.kind == "segment"] if not new_segment else []
    if fixed or segment:
        lines = [f"cannot resume {run_dir.path} with these changes:"]
        lines += [f"  {c.describe()}: {_fixed_reason(c)}" for c in fixed]
        if fixed:
            lines.append("  (these cannot change within a run: start a new run from its config, e.g. "
                         f"`reinforge train {run_dir.path}/config.yaml key=value tracking.run_name=NEW_NAME`)")
        lines += [f"  {c.describe()}: changes what a step computes" for c in segment]
        if segment:
            lines.append(f"  (pass --new-segment to continue from step {step} under the new values; the change "
                         "and its step are recorded in segments.json, and summaries, compare and reproduce "
                         "treat the run accordingly)")
        raise ResumeRefused("\n".join(lines))
    return plan


def choose_checkpoint(run_dir: RunDir, *, out: TextIO | None = None) -> tuple[int, Path | None]:
    """(step, folder) of the newest checkpoint whose files match their recorded checksums, or
    (0, None) when the run has none at all. Each damaged newer one is named on ``out``. Raises
    DamagedCheckpointError, naming the damage and the fix, when checkpoints exist but none is
    intact: the run is never silently started over."""
    out = out if out is not None else sys.stderr
    damaged = [(s, p, "its state.json is missing") for s, p in damaged_checkpoints(run_dir.path)]
    chosen = None
    for step, path in reversed(list_checkpoints(run_dir.path)):
        check = verify_checkpoint(path)
        if check.intact:
            chosen = (step, path)
            if not check.verified:
                print(f"note: checkpoint {path.name} was written before checksums were recorded; its files are "
                      "not verified", file=out)
            break
        damaged.append((step, path, check.problem))
    newer = sorted((d for d in damaged if chosen is None or d[0] > chosen[0]), key=lambda d: -d[0])
    if chosen is None and newer:
        step, path, problem = newer[0]
        raise DamagedCheckpointError(
            f"cannot resume {run_dir.path}: checkpoint {path.name} is damaged ({problem}) and no intact earlier "
            f"checkpoint is left (trainer.keep_checkpoints=2 or more keeps one); restore {path} from a copy, "
            f"or start a new run from the same config: `reinforge train {run_dir.path / 'config.yaml'} "
            "tracking.run_name=NEW_NAME`"
        )
    for step, path, problem in newer:
        print(f"warning: checkpoint {path.name} is damaged ({problem}); resuming from the newest intact one, "
              f"{chosen[1].name} (the steps after {chosen[0]} are trained again)", file=out)
    return chosen if chosen is not None else (0, None)


def check_logs(run_dir: RunDir) -> None:
    """Refuse a resume, naming the file, line and fix, when one of the run's logs has a line that
    is not JSON (a torn final line from a crash is not damage: it is dropped as usual)."""
    from ..tracking.run_dir import EVALS_FILE, METRICS_FILE, SAMPLES_FILE

    for name in (METRICS_FILE, EVALS_FILE, SAMPLES_FILE):
        try:
            read_jsonl(run_dir.path / name)
        except ValueError as err:
            raise DamagedCheckpointError(
                f"cannot resume {run_dir.path}: {err}; the run's records are damaged there (the checkpoints are "
                f"not affected): delete or repair that line of {name}, then resume"
            ) from None


def _record_kind(key: str) -> str:
    # A fixed key changes only on a restart from step 0, which records no change at all.
    return "free" if change_kind(key) == "free" else "segment"


def record_segment(run_dir: RunDir, config: RunConfig, step: int) -> list[Segment]:
    """Record that the run continues from the checkpoint of ``step`` under ``config`` (written
    atomically: segments.json, then config.yaml). Call it once the checkpoint is restored and
    before the first new record is logged. With no checkpoint (``step`` 0) and a change to what
    the evaluation measures, the step-0 evaluation goes too."""
    if step == 0:
        before = read_segments(run_dir)[-1].config
        if any(_under(k, EVAL_KEYS) for k, _, _ in config_changes(before, config.to_dict())):
            run_dir.truncate_after(-1)
    return record_resume(run_dir, step, config.to_dict(), _record_kind)
