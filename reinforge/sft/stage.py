"""The SFT stage of an RL run: `reinforge train` on a config with an `sft:` section fine-tunes
first, in ``<run>/sft/`` (a run directory of its own: config, metrics, evaluations, checkpoints,
final_model), then RL loads that final model instead of ``model.path``.

On ``--resume`` a finished stage is never repeated (its status is ``finished`` and its
final_model complete); an interrupted one continues from its latest checkpoint, and RL starts
when it finishes. The RL run's own resume policy has already checked the config's changes.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..config import RunConfig
from ..tracking import RunDir
from ..tracking.run_dir import WARM_START_DIR
from .runner import SFTRunner

log = logging.getLogger("reinforge")

__all__ = ["run_warm_start", "stage_config", "add_warm_start_to_summary"]


def stage_config(config: RunConfig, run: RunDir) -> RunConfig:
    """The config of the SFT stage of ``run``: the run's own, written to ``<run>/sft``. Exporters
    are off there (the RL run exports; the stage's records stay in its folder)."""
    tracking = config.tracking.model_copy(update={"output_dir": str(run.path), "run_name": WARM_START_DIR,
                                                  "exporters": []})
    return config.model_copy(update={"tracking": tracking}, deep=True)


def run_warm_start(trainer) -> Path | None:
    """Run (or finish, or skip) ``trainer``'s SFT stage; returns the final model RL starts from,
    or None when the stage was interrupted (the RL run is then marked interrupted too)."""
    cfg = trainer.cfg
    if trainer.run_dir is None:  # created with the writer lock held, which Trainer.run gives back
        trainer.run_dir = RunDir.create(cfg, name=cfg.tracking.run_name, precision=trainer.precision)
    run = trainer.run_dir
    stage_dir = run.path / WARM_START_DIR
    final = run.warm_start_model()
    resume_command = f"reinforge train --resume {run.path}"
    if (stage_dir / "config.yaml").is_file():
        stage = RunDir.open(stage_dir)
        if stage.status().get("state") == "finished" and final is not None:
            log.info("SFT stage finished before: RL starts from %s", final)
            return final
        runner = SFTRunner(stage_config(cfg, run), run_dir=stage, resume=True, check_resume=False)
    else:
        runner = SFTRunner(stage_config(cfg, run))
    runner.stop_after_step = trainer.sft_stop_after_step
    run.set_status("running", stage="sft")
    result = runner.run(resume_command=resume_command)
    runner.close()
    if not result.finished:
        run.set_status("interrupted", step=0, stage="sft", resume=resume_command,
                       **({"signal": result.stopped_by} if result.stopped_by else {}))
        return None
    run.set_status("running", stage="rl")
    return run.warm_start_model()


def add_warm_start_to_summary(run: RunDir) -> dict:
    """Add the SFT stage to the RL run's summary.md/.json: held-out accuracy of the base model
    (the stage's step 0), after SFT (RL's step 0) and after RL, so the gain of each stage shows."""
    import json

    stage = RunDir.open(run.path / WARM_START_DIR)
    summary = json.loads((run.path / "summary.json").read_text())
    sft_summary = json.loads((stage.path / "summary.json").read_text()) if (stage.path / "summary.json").is_file() else {}
    acc = sft_summary.get("heldout_accuracy")
    lines = ["", f"Warm start: an SFT stage ran before RL (`{WARM_START_DIR}/`, its summary in "
             f"`{WARM_START_DIR}/summary.md`); RL started from `{WARM_START_DIR}/final_model`, so RL's step 0 is "
             "the SFT model."]
    if acc:
        summary["warm_start"] = {"heldout_accuracy": acc}
        lines.append(f"SFT stage: held-out accuracy {acc['before']:.3f} (base model) -> {acc['after']:.3f} after "
                     f"{acc['to_step']} SFT steps, difference {acc['diff']:+.3f} "
                     f"[{acc['ci_low']:+.3f}, {acc['ci_high']:+.3f}] (95% paired bootstrap)")
    md = (run.path / "summary.md").read_text().rstrip("\n") + "\n" + "\n".join(lines) + "\n"
    run.write_summary(summary, md)
    return summary
