"""`reinforge train / train-rm / sft / recipes`: the handlers that start a training run.

Only the standard library at module level: the package imports this module before its signal
handlers are installed, so the config, the trainer and torch are imported inside the functions
(reinforge/cli/__init__.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .exits import stopped_code


def _train(args: argparse.Namespace) -> int:
    from ..config import ConfigError, load_config
    from ..trainer import Trainer
    from ..lifecycle.resume import resume_config
    from ..tracking import RunDir

    if args.resume:
        if args.config:
            raise ConfigError(f"--resume continues {args.resume} under its saved config; give changes as key=value "
                              f"(got the config file {args.config!r})")
        rd = RunDir.open(args.resume)
        # The trainer takes the run's writer lock, then checks these changes against the resume
        # policy and prints them, before anything loads (reinforge/lifecycle/resume.py).
        cfg = resume_config(rd.load_config(), args.overrides)
        trainer = Trainer(cfg, run_dir=rd, resume=True, new_segment=args.new_segment)
    else:
        if args.new_segment:
            raise ConfigError("--new-segment applies to --resume RUN_DIR (a run continued under a changed config)")
        cfg = load_config(args.config, args.overrides)
        trainer = Trainer(cfg)
    try:
        result = trainer.run()
    except KeyboardInterrupt as stop:  # only a stop during start-up gets here (lifecycle/stopping.py)
        name = stop.args[0] if stop.args else "SIGINT"
        hint = f" Resume with: reinforge train --resume {args.resume}" if args.resume else ""
        _say(f"reinforge: stopped by {name} during start-up; nothing was trained.{hint}")
        return stopped_code(name)
    if result.stopped_by:  # the run said how it stopped and how to resume (trainer/outcome.py)
        return stopped_code(result.stopped_by)
    print(f"run directory: {result.run_dir}")
    summary_md = Path(result.run_dir) / "summary.md"
    if result.summary and summary_md.is_file():
        print(summary_md.read_text())
    return 0


def _train_rm(args: argparse.Namespace) -> int:
    """`reinforge train-rm CONFIG [key=value ...]` or `--resume RUN_DIR`: an outcome RM or a PRM
    trained on labels made here, measured on held-out prompts (reinforge/reward_models/train.py)."""
    from ..config import ConfigError
    from ..reward_models.config import RMRunConfig, load_rm_config
    from ..reward_models.train import RewardModelTrainer
    from ..tracking import RunDir

    if args.config and "=" in args.config and not Path(args.config).exists():
        args.overrides.insert(0, args.config)
        args.config = None
    if args.resume:
        if args.config:
            raise ConfigError(f"--resume continues {args.resume} under its saved config (got {args.config!r})")
        rd = RunDir.open(args.resume)
        if rd.kind != "train_rm":
            raise ConfigError(f"{args.resume} is not a train-rm run (resume training runs with `reinforge train --resume`)")
        trainer = RewardModelTrainer(RMRunConfig.from_dict(rd.load_config(), args.overrides), run_dir=rd, resume=True)
    else:
        trainer = RewardModelTrainer(load_rm_config(args.config, args.overrides))
    try:
        path = trainer.run()
    except KeyboardInterrupt as stop:  # train-rm stops at once; the labels made so far are kept
        name = stop.args[0] if stop.args else "SIGINT"
        if trainer.run_dir is None or not (trainer.run_dir.path / "config.yaml").is_file():
            raise  # nothing was written: the command line's one line says it
        _say(f"reinforge: stopped by {name}; the labels made so far are kept. Resume with: reinforge train-rm "
             f"--resume {trainer.run_dir.path}")
        return stopped_code(name)
    print(f"run directory: {path}\nreward model: {path / 'final_model'}")
    return 0


def _sft(args: argparse.Namespace) -> int:
    """`reinforge sft CONFIG [key=value ...]` / `--resume RUN_DIR`: supervised fine-tuning alone
    (docs/sft.md); the run's final_model/ can be an RL run's model.path."""
    from ..config import ConfigError, load_config
    from ..sft import SFTRunner
    from ..tracking import RunDir
    from ..lifecycle.resume import resume_config

    if args.resume:
        if args.config:
            raise ConfigError(f"--resume continues {args.resume} under its saved config; give changes as key=value "
                              f"(got the config file {args.config!r})")
        rd = RunDir.open(args.resume)
        runner = SFTRunner(resume_config(rd.load_config(), args.overrides), run_dir=rd, resume=True,
                           new_segment=args.new_segment)
    else:
        if args.new_segment:
            raise ConfigError("--new-segment applies to --resume RUN_DIR (a run continued under a changed config)")
        runner = SFTRunner(load_config(args.config, args.overrides))
    result = runner.run()
    if result.stopped_by:  # the runner said how it stopped and how to resume
        return stopped_code(result.stopped_by)
    print(f"run directory: {result.run_dir}")
    if result.finished:
        print((Path(result.run_dir) / "summary.md").read_text())
        print(f"start RL from it with: reinforge train CONFIG model.path={Path(result.run_dir) / 'final_model'}")
    return 0


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except OSError:  # a terminal that hung up (SIGHUP): status.json says the same
        pass


def _recipes(args: argparse.Namespace) -> int:
    """`reinforge recipes`: one line per recipe with its paper; `recipes show NAME`: the paper,
    notes and the full resolved config the recipe starts from (any key can be overridden)."""
    from ..config import build_config
    import textwrap

    import yaml

    from ..recipes import RECIPES as RECIPE_INFO

    words = list(args.name or [])
    if words and words[0] == "show":
        words = words[1:]
        if len(words) != 1:
            print("usage: reinforge recipes show NAME", file=sys.stderr)
            return 2
    if words:
        name = words[0]
        if name not in RECIPE_INFO:
            print(f"unknown recipe {name!r}; accepted: {', '.join(sorted(RECIPE_INFO))}", file=sys.stderr)
            return 2
        r = RECIPE_INFO[name]
        print(f"# {r.name}: {r.description}")
        print(f"# paper: {r.paper.cite()}")
        for line in textwrap.wrap(r.notes, 96):
            print(f"# {line}")
        print("# The full config this recipe starts from; override any key with key=value.")
        print(yaml.safe_dump(build_config({"recipe": name}).to_dict(), sort_keys=False), end="")
        return 0
    width = max(len(n) for n in RECIPE_INFO)
    for name in sorted(RECIPE_INFO):
        r = RECIPE_INFO[name]
        print(f"{name:<{width}}  {r.description}")
        print(f"{'':<{width}}  {r.paper.title} ({r.paper.authors}, {r.paper.year}, arXiv:{r.paper.arxiv})")
    print("\n`reinforge recipes show NAME` prints a recipe's full preset.")
    return 0
