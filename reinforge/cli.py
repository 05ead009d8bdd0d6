"""`reinforge train / recipes` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .config import RECIPES, ConfigError, build_config, load_config


def _train(args: argparse.Namespace) -> int:
    from .trainer import Trainer
    from .tracking import RunDir

    if args.resume:
        rd = RunDir.open(args.resume)
        cfg = build_config(rd.load_config(), args.overrides)
        trainer = Trainer(cfg, run_dir=rd, resume=True)
    else:
        cfg = load_config(args.config, args.overrides)
        trainer = Trainer(cfg)
    result = trainer.run()
    print(f"run directory: {result.run_dir}")
    summary_md = Path(result.run_dir) / "summary.md"
    if result.summary and summary_md.is_file():
        print(summary_md.read_text())
    return 0


def _recipes(args: argparse.Namespace) -> int:
    import yaml

    if args.name:
        if args.name not in RECIPES:
            print(f"unknown recipe {args.name!r}; accepted: {', '.join(sorted(RECIPES))}", file=sys.stderr)
            return 2
        print(yaml.safe_dump(build_config({"recipe": args.name}).to_dict(), sort_keys=False))
        return 0
    for name in sorted(RECIPES):
        print(name)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reinforge", description="RL post-training of language models.")
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="run RL training from a YAML config plus key=value overrides")
    tr.add_argument("config", nargs="?", help="YAML config (omit for the defaults)")
    tr.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.steps=20")
    tr.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    rc = sub.add_parser("recipes", help="list recipes, or print one preset")
    rc.add_argument("name", nargs="?")
    args = parser.parse_args(argv)
    # `reinforge train key=value` without a config file: the first positional is an override.
    if args.command == "train" and args.config and "=" in args.config and not Path(args.config).exists():
        args.overrides.insert(0, args.config)
        args.config = None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "transformers", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.command == "train":
            return _train(args)
        return _recipes(args)
    except ConfigError as err:
        print(f"reinforge: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"reinforge: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
