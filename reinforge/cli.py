"""`reinforge train / recipes` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .config import ConfigError, build_config, load_config


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
    """`reinforge recipes`: one line per recipe with its paper; `recipes show NAME`: the paper,
    notes and the full resolved config the recipe starts from (any key can be overridden)."""
    import textwrap

    import yaml

    from .recipes import RECIPES as RECIPE_INFO

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reinforge", description="RL post-training of language models.")
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="run RL training from a YAML config plus key=value overrides")
    tr.add_argument("config", nargs="?", help="YAML config (omit for the defaults)")
    tr.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.steps=20")
    tr.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    rc = sub.add_parser("recipes", help="list recipes with their papers; `recipes show NAME` prints one preset")
    rc.add_argument("name", nargs="*", metavar="show NAME")
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
