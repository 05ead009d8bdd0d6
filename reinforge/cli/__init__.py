"""`reinforge train / recipes / eval / sweep / compare / runs / reproduce` command line.

Only the standard library and the run-directory helpers are imported with this module: the
config (and with it torch) loads inside :func:`main`, after SIGTERM and Ctrl-C are handled, so a
stop during the imports ends with one line instead of a traceback.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import threading
from pathlib import Path

from .tracking.io import DiskFullError
from .tracking.lock import RunLockedError


def _train(args: argparse.Namespace) -> int:
    from .config import ConfigError, load_config
    from .trainer import Trainer
    from .lifecycle.resume import resume_config
    from .tracking import RunDir

    if args.resume:
        if args.config:
            raise ConfigError(f"--resume continues {args.resume} under its saved config; give changes as key=value "
                              f"(got the config file {args.config!r})")
        rd = RunDir.open(args.resume)
        # The trainer takes the run's writer lock, then checks these changes against the resume
        # policy and prints them, before anything loads (reinforge/trainer/resume.py).
        cfg = resume_config(rd.load_config(), args.overrides)
        trainer = Trainer(cfg, run_dir=rd, resume=True, new_segment=args.new_segment)
    else:
        if args.new_segment:
            raise ConfigError("--new-segment applies to --resume RUN_DIR (a run continued under a changed config)")
        cfg = load_config(args.config, args.overrides)
        trainer = Trainer(cfg)
    try:
        result = trainer.run()
    except KeyboardInterrupt as stop:  # only a stop during start-up gets here (trainer/stopping.py)
        hint = f" Resume with: reinforge train --resume {args.resume}" if args.resume else ""
        print(f"reinforge: stopped by {stop.args[0] if stop.args else 'SIGINT'} during start-up; nothing was "
              f"trained.{hint}", file=sys.stderr)
        return 130
    print(f"run directory: {result.run_dir}")
    summary_md = Path(result.run_dir) / "summary.md"
    if result.summary and summary_md.is_file():
        print(summary_md.read_text())
    return 0


def _train_rm(args: argparse.Namespace) -> int:
    """`reinforge train-rm CONFIG [key=value ...]` or `--resume RUN_DIR`: an outcome RM or a PRM
    trained on labels made here, measured on held-out prompts (reinforge/reward_models/train.py)."""
    from .config import ConfigError
    from .reward_models.config import RMRunConfig, load_rm_config
    from .reward_models.train import RewardModelTrainer
    from .tracking import RunDir

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
    path = trainer.run()
    print(f"run directory: {path}\nreward model: {path / 'final_model'}")
    return 0


def _sft(args: argparse.Namespace) -> int:
    """`reinforge sft CONFIG [key=value ...]` / `--resume RUN_DIR`: supervised fine-tuning alone
    (docs/sft.md); the run's final_model/ can be an RL run's model.path."""
    from .config import ConfigError, load_config
    from .sft import SFTRunner
    from .tracking import RunDir
    from .lifecycle.resume import resume_config

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
    print(f"run directory: {result.run_dir}")
    if result.finished:
        print((Path(result.run_dir) / "summary.md").read_text())
        print(f"start RL from it with: reinforge train CONFIG model.path={Path(result.run_dir) / 'final_model'}")
    return 0


def _recipes(args: argparse.Namespace) -> int:
    """`reinforge recipes`: one line per recipe with its paper; `recipes show NAME`: the paper,
    notes and the full resolved config the recipe starts from (any key can be overridden)."""
    from .config import build_config
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


def _terminate_as_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    """The command line. SIGTERM is treated as Ctrl-C from the start (a training run then stops as
    reinforge/trainer/stopping.py says); a stop before a run began prints one line, no traceback."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        return _main(argv)
    except KeyboardInterrupt as stop:  # the trainer handles its own; this is before it began, or another command
        words = list(sys.argv[1:] if argv is None else argv)
        when = " during start-up; nothing was trained" if words[:1] == ["train"] else ""
        print(f"reinforge: stopped by {stop.args[0] if stop.args else 'SIGINT'}{when}", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None = None) -> int:
    from .config import ConfigError

    parser = argparse.ArgumentParser(prog="reinforge", description="RL post-training of language models.")
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="run RL training from a YAML config plus key=value overrides")
    tr.add_argument("config", nargs="?", help="YAML config (omit for the defaults)")
    tr.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.steps=20")
    tr.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    tr.add_argument("--new-segment", action="store_true",
                    help="with --resume: accept overrides that change what a step computes (lr, task, "
                    "algorithm, ...); the run continues in a new, recorded segment")
    trm = sub.add_parser("train-rm", help="train an outcome RM or a PRM (Math-Shepherd labels) and measure it",
                         description="Label completions with the verifiers (outcome) or Monte-Carlo rollouts from each "
                         "step (PRM, Math-Shepherd), train a reward model on them, and report held-out step AUC and "
                         "best-of-N against majority vote (docs/reward_models.md).")
    trm.add_argument("config", nargs="?", help="YAML config: a training config plus an rm: section")
    trm.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rm.mc_rollouts=8")
    trm.add_argument("--resume", metavar="RUN_DIR", help="continue a train-rm run")
    sf = sub.add_parser("sft", help="supervised fine-tuning on demonstrations (a warm start before RL; docs/sft.md)",
                        description="Supervised fine-tuning with the loss on response tokens only, from the config's "
                        "`sft` section (defaults when it has none): demonstrations from the task's answers, from a "
                        "JSONL/Parquet file, or expert iteration (sft.source=expert_iteration). Same run directory, "
                        "resume and tracking as `reinforge train`.")
    sf.add_argument("config", nargs="?", help="YAML config (omit for the defaults)")
    sf.add_argument("overrides", nargs="*", help="key=value overrides, e.g. sft.steps=100")
    sf.add_argument("--resume", metavar="RUN_DIR", help="continue an SFT run from its latest checkpoint")
    sf.add_argument("--new-segment", action="store_true",
                    help="with --resume: accept overrides that change what a step computes")
    rc = sub.add_parser("recipes", help="list recipes with their papers; `recipes show NAME` prints one preset")
    rc.add_argument("name", nargs="*", metavar="show NAME")
    _add_experiment_commands(sub)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # key=value overrides placed after an option (argparse stops a positional list there)
        if args.command in _EXPERIMENT_COMMANDS and not any(u.startswith("-") for u in unknown):
            args.items += unknown
        else:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    # `reinforge train key=value` without a config file: the first positional is an override.
    if args.command in ("train", "sft") and args.config and "=" in args.config and not Path(args.config).exists():
        args.overrides.insert(0, args.config)
        args.config = None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "transformers", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "train-rm":
            return _train_rm(args)
        if args.command == "sft":
            return _sft(args)
        if args.command in _EXPERIMENT_COMMANDS:
            return _EXPERIMENT_COMMANDS[args.command](args)
        return _recipes(args)
    except ConfigError as err:
        print(f"reinforge: {err}", file=sys.stderr)
        return 2
    except RunLockedError as err:  # one line: who holds the run
        print(f"reinforge: {err}", file=sys.stderr)
        return 1
    except DiskFullError as err:  # one line: what filled up, what is intact (the status says failed)
        print(f"reinforge: {err.strerror}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"reinforge: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


# ----------------------------------------------------------------------------- experiments
# eval / sweep / compare / runs / reproduce: thin wrappers over reinforge.evaluation and
# reinforge.tracking (docs/experiments.md).


def _split_items(items: list[str]) -> tuple[list[str], list[str]]:
    """(targets, key=value overrides) from the positional words."""
    overrides = [i for i in items if "=" in i and not Path(i).exists()]
    return [i for i in items if i not in overrides], overrides


def _eval_raw_config(raw: dict, args: argparse.Namespace, *, model_path: str | None = None) -> dict:
    """raw config <- --task <- model path; values set as data, never re-parsed from text."""
    from .config import set_dotted
    import copy

    raw = copy.deepcopy(raw)
    if args.task:
        if Path(args.task).exists():
            set_dotted(raw, "task.source", "file")
            set_dotted(raw, "task.path", str(args.task))
        else:
            set_dotted(raw, "task.source", "reasoning_gym")
            set_dotted(raw, "task.name", args.task)
    if model_path is not None:
        set_dotted(raw, "model.path", model_path)
    return raw


def _model_target(target: str) -> str:
    """The model.path for a bare-model target, or an error naming what was expected."""
    from .config import DEFAULT_MODEL, ConfigError

    if target in ("default", DEFAULT_MODEL):
        return DEFAULT_MODEL
    p = Path(target)
    if (p / "config.json").is_file():
        return str(p)
    if (p / "adapter_config.json").is_file():
        raise ConfigError(f"{target!r} holds LoRA adapters, not a whole model: evaluate the run directory it "
                          "belongs to (its final_model/ is loaded on top of the run's base model)")
    if p.exists():
        raise ConfigError(f"{target!r} is neither a run directory (config.yaml) nor a Hugging Face model folder "
                          "(config.json)")
    raise ConfigError(f"{target!r} does not exist; pass a run directory, a model folder, or 'default' for the "
                      "default model")


def _resolve_eval_target(target: str, args: argparse.Namespace, overrides: list[str]):
    """(config, ModelSource, RunDir or None) for `reinforge eval TARGET`."""
    from .config import ConfigError, build_config, load_config
    from .evaluation.runner import ModelSource
    from .tracking import RunDir

    never_export = ["tracking.exporters=[]"]
    p = Path(target)
    if (p / "config.yaml").is_file():
        rd = RunDir.open(p)
        if args.config:
            raise ConfigError("--config is for a bare model; a run is evaluated with its own saved config "
                              "(change keys with key=value)")
        if rd.kind == "eval":  # an eval directory: evaluate its model again
            cfg = build_config(_eval_raw_config(rd.load_config(), args), overrides + never_export)
            return cfg, ModelSource.base(cfg.model.path), rd
        changed = [o.split("=", 1)[0] for o in overrides if o.startswith(("task.", "reward."))]
        if args.task or changed:
            logging.getLogger("reinforge").warning(
                "evaluating run %s on a task/reward other than its own (%s)", rd.path,
                ", ".join(changed + (["--task"] if args.task else [])))
        cfg = build_config(_eval_raw_config(rd.load_config(), args), overrides + never_export)
        return cfg, ModelSource.from_run(rd, cfg, args.checkpoint), rd
    if args.checkpoint:
        raise ConfigError("--checkpoint needs a run directory as the target")
    model_path = _model_target(target)
    raw: dict = {}
    if args.config:  # a train-rm config names the policy that samples: its `rm:` section is not eval's
        raw = load_config(args.config, ignore_sections=("rm",)).to_dict()
    cfg = build_config(_eval_raw_config(raw, args, model_path=model_path), overrides + never_export)
    return cfg, ModelSource.base(model_path), None


def _sampling(args: argparse.Namespace, cfg) -> dict:
    return {
        "samples": int(args.samples),
        "temperature": float(args.temperature if args.temperature is not None else cfg.rollout.temperature),
        "top_p": float(args.top_p if args.top_p is not None else cfg.rollout.top_p),
        "max_new_tokens": int(args.max_new_tokens or cfg.rollout.max_new_tokens),
        "max_prompts": args.max_prompts if args.max_prompts is not None else cfg.trainer.eval_max_prompts,
        "seed": int(args.seed if args.seed is not None else cfg.trainer.seed),
    }


def _eval_label(source, params: dict) -> str:
    label = f"{source.label}_n{params['samples']}_T{params['temperature']:g}"
    if params["top_p"] < 1:
        label += f"_p{params['top_p']:g}"
    if params["max_prompts"] is not None:
        label += f"_m{params['max_prompts']}"
    return label + f"_len{params['max_new_tokens']}_seed{params['seed']}"


def _task_variant(cfg, rd) -> str:
    """A label suffix for an evaluation of a training run under another task, reward or env than
    the run's own (overrides such as env=null): ``_cfg`` and a hash of those sections, so that it
    neither replaces the run's own evaluation of the same checkpoint nor is paired with the run's
    step-0 evaluation; the base model evaluated with the same overrides gets the same suffix."""
    import hashlib
    import json

    from .evaluation.runner import task_differs_from_run, task_sections

    if rd is None or rd.kind != "train" or not task_differs_from_run(cfg, rd):
        return ""
    return "_cfg" + hashlib.sha1(json.dumps(task_sections(cfg), sort_keys=True, default=str).encode()).hexdigest()[:8]


def _run_sampled_eval(cfg, source, rd, params: dict, args: argparse.Namespace, *, policy_cfg=None):
    """Evaluate ``source`` (cached in ``rd`` when the same evaluation exists); returns (summary, rows, folder)."""
    import hashlib
    import json

    import torch

    from .evaluation.report import passk_csv, passk_markdown, plot_passk
    from .evaluation.runner import attach_verdict, build_eval_setup, load_policy, sampled_eval
    from .tracking import atomic_write_bytes, atomic_write_text
    from .tracking.sampled_evals import read_sampled_eval, sampled_eval_dir, sampled_eval_labels, write_sampled_eval
    from .models import compute_dtype, resolve_precision

    cfg, _ = resolve_precision(cfg)  # model.dtype=auto: what this machine computes fastest
    if policy_cfg is not None:
        policy_cfg, _ = resolve_precision(policy_cfg)

    setup = build_eval_setup(cfg, max_prompts=params["max_prompts"])
    label = _eval_label(source, params) + _task_variant(cfg, rd)
    # Same weights, prompts, task, reward and settings: the stored evaluation is reused.
    identity = {"params": params, "source": source.to_dict(), "task": cfg.task.model_dump(mode="json"),
                "reward": cfg.reward.model_dump(mode="json"), "prompts": [e.id for e in setup.examples],
                "resamples": args.resamples}
    if cfg.env is not None:
        identity["env"] = cfg.env.model_dump(mode="json")
    fingerprint = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
    if label in sampled_eval_labels(rd) and not args.force:
        summary, rows = read_sampled_eval(rd, label)
        if summary.get("fingerprint") == fingerprint:
            print(f"reusing {sampled_eval_dir(rd, label)} (same model, prompts and sampling; --force redoes it)",
                  file=sys.stderr)
            return summary, rows, sampled_eval_dir(rd, label)
    print(f"evaluating {source.describe()}: {len(setup.examples)} prompts x {params['samples']} samples",
          file=sys.stderr)
    model, tokenizer = load_policy(policy_cfg or cfg, source)
    summary, rows = sampled_eval(
        setup, model, tokenizer, samples=params["samples"], temperature=params["temperature"],
        top_p=params["top_p"], max_new_tokens=params["max_new_tokens"], seed=params["seed"],
        generation_batch_size=cfg.rollout.generation_batch_size,
        autocast_dtype=compute_dtype(cfg.model),
        copy_dtype=torch.bfloat16 if cfg.rollout.resolved_hf_bf16_copy(cfg.model.dtype) else None,
        n_resamples=args.resamples,
    )
    summary = {"label": label, "model": source.to_dict(), **params, **summary,
               "task": cfg.task.model_dump(mode="json"), "reward": cfg.reward.model_dump(mode="json"),
               "fingerprint": fingerprint}
    summary = attach_verdict(summary, rows, rd, source, cfg, label, n_resamples=args.resamples)
    folder = write_sampled_eval(rd, label, summary, rows)
    title = f"{source.describe()}: pass@k and maj@k"
    atomic_write_bytes(folder / "passk.png", plot_passk(summary, title=f"{source.label}, {label}"))
    atomic_write_text(folder / "passk.csv", passk_csv(summary))
    atomic_write_text(folder / "report.md", passk_markdown(summary, title=title, figure="passk.png"))
    del model
    return summary, rows, folder


def _eval(args: argparse.Namespace) -> int:
    from .config import ConfigError
    from .tracking import RunDir

    targets, overrides = _split_items(args.items)
    if args.boundary:
        if targets:
            raise ConfigError(f"with --boundary BASE RUN give no other target (got {targets})")
        return _eval_boundary(args, overrides)
    if len(targets) != 1:
        raise ConfigError("reinforge eval needs one MODEL_OR_RUN: a run directory, a model folder, or 'default'"
                          + (f" (got {targets})" if targets else ""))
    cfg, source, rd = _resolve_eval_target(targets[0], args, overrides)
    params = _sampling(args, cfg)
    created = rd is None
    if created:
        if args.output_dir:
            cfg.tracking.output_dir = args.output_dir
        cfg.tracking.run_name = None  # a training run's name from the config file is not this directory's
        try:
            rd = RunDir.create(cfg, name=args.name, kind="eval")
        except FileExistsError:
            raise ConfigError(f"eval directory {Path(cfg.tracking.output_dir) / args.name} already exists: pass it "
                              "as MODEL_OR_RUN to add this evaluation to it, or choose another --name") from None
    try:
        summary, _, folder = _run_sampled_eval(cfg, source, rd, params, args)
    except BaseException as err:
        if created:
            from .tracking.sampled_evals import sampled_eval_labels

            if sampled_eval_labels(rd):
                rd.set_status("failed", reason=f"{type(err).__name__}: {err}")
            else:  # nothing was evaluated (bad task options, a missing model): leave no empty directory
                shutil.rmtree(rd.path, ignore_errors=True)
        raise
    if created:
        rd.set_status("finished")
    print((folder / "report.md").read_text())
    print(f"written to {folder}")
    return 0


def _eval_boundary(args: argparse.Namespace, overrides: list[str]) -> int:
    from .config import ConfigError, build_config, load_config
    from .evaluation.boundary import boundary_analysis, boundary_csv, boundary_markdown, plot_boundary
    from .evaluation.runner import ModelSource
    from .tracking import RunDir, atomic_write_bytes, atomic_write_json, atomic_write_text
    from .tracking.sampled_evals import boundary_dir

    base_target, run_target = args.boundary
    if not (Path(run_target) / "config.yaml").is_file():
        raise ConfigError(f"--boundary BASE RUN: RUN={run_target!r} must be a training run directory")
    rd = RunDir.open(run_target)
    if rd.kind != "train":
        raise ConfigError(f"--boundary BASE RUN: {run_target!r} is an eval directory, not a training run")
    cfg = build_config(_eval_raw_config(rd.load_config(), args), overrides + ["tracking.exporters=[]"])
    trained = ModelSource.from_run(rd, cfg, args.checkpoint)
    base_cfg = None
    if (Path(base_target) / "config.yaml").is_file():  # another run's final model as the baseline
        other = RunDir.open(base_target)
        base_cfg = build_config(other.load_config(), ["tracking.exporters=[]"])
        base = ModelSource.from_run(other, base_cfg)
        base.label = f"run-{other.name}-{base.label}"
    else:
        base = ModelSource.base(_model_target(base_target))
    params = _sampling(args, cfg)
    base_summary, base_rows, base_dir = _run_sampled_eval(cfg, base, rd, params, args, policy_cfg=base_cfg)
    tr_summary, tr_rows, tr_dir = _run_sampled_eval(cfg, trained, rd, params, args)
    result = boundary_analysis(base_rows, tr_rows, n_resamples=args.resamples, seed=params["seed"])
    label = f"{base.label}_vs_{trained.label}_n{params['samples']}"
    out = boundary_dir(rd, label)
    base_name, trained_name = base.describe(), trained.describe()
    atomic_write_bytes(out / "boundary.png", plot_boundary(result, base_name=base.label, trained_name=trained.label))
    atomic_write_text(out / "boundary.csv", boundary_csv(result))
    md = boundary_markdown(result, base_name=base_name, trained_name=trained_name, figure="boundary.png")
    atomic_write_text(out / "boundary.md", md)
    atomic_write_json(out / "boundary.json", {**result, "base": {**result["base"], "eval": str(base_dir)},
                                              "trained": {**result["trained"], "eval": str(tr_dir)},
                                              "sampling": params})
    print(md)
    print(f"written to {out}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from .config import ConfigError
    from .tracking import RunDir
    from .tracking.index import run_state
    from .tracking.sweep import load_sweep, plan_sweep, run_sweep

    targets, overrides = _split_items(args.items)
    if len(targets) != 1 or overrides:
        raise ConfigError("usage: reinforge sweep SWEEP.yaml [--output-dir DIR] [--plan] (overrides go in the "
                          "sweep file's 'overrides')")
    spec = load_sweep(targets[0], output_dir=args.output_dir)
    runs = plan_sweep(spec)
    if args.plan:
        for r in runs:
            path = spec.output_dir / r.name
            state = run_state(RunDir.open(path)) if (path / "config.yaml").is_file() else "not started"
            print(f"{path}  {state}")
        return 0

    def train(cfg, run_dir):
        from .trainer import Trainer

        Trainer(cfg, run_dir=run_dir, resume=run_dir is not None).run()

    print(f"sweep {spec.name}: {len(runs)} runs in {spec.output_dir}", file=sys.stderr)
    outcome = run_sweep(spec, train, echo=lambda m: print(m, file=sys.stderr))
    print(f"sweep {spec.name}: {len(outcome.finished)} trained, {len(outcome.skipped)} already finished, "
          f"{len(outcome.failed)} failed" + (", stopped by Ctrl-C" if outcome.interrupted else ""))
    for name, why in outcome.failed:
        print(f"  failed: {name}: {why}")
    if outcome.interrupted or outcome.failed:
        print(f"run `reinforge sweep {targets[0]}` again to resume")
        return 1
    print(f"compare them with: reinforge compare {spec.output_dir}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .config import ConfigError
    import time

    from .evaluation.compare import compare_runs

    paths, overrides = _split_items(args.items)
    if not paths or overrides:
        raise ConfigError("usage: reinforge compare RUN_OR_SWEEP [RUN_OR_SWEEP ...] [--out DIR]")
    out = args.out
    if out is None:
        one = Path(paths[0])
        out = (one / "compare") if len(paths) == 1 and not (one / "config.yaml").is_file() else Path(
            f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
    result = compare_runs(paths, out, metric=args.metric, include_unfinished=args.include_unfinished,
                          ignore=args.ignore or (), split_tasks=args.split_tasks, n_resamples=args.resamples,
                          seed=args.seed)
    print((Path(out) / "report.md").read_text())
    print(f"report, CSV and figures in {out}")
    for p, why in result.skipped:
        print(f"left out {p}: {why}", file=sys.stderr)
    return 0


def _runs(args: argparse.Namespace) -> int:
    from .tracking.index import find_runs, format_runs_table, run_info

    targets, _ = _split_items(args.items)
    root = Path(targets[0] if targets else "runs")
    runs = find_runs(root)
    if not runs:
        print(f"no runs under {root}")
        return 0
    print(format_runs_table([run_info(r, args.metric) for r in runs], root, args.metric))
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from .config import ConfigError, build_config
    from .tracking import RunDir, atomic_write_json, atomic_write_text
    from .tracking.reproduce import compare_run_dirs, format_repro_report
    from .tracking.segments import read_segments
    from .trainer import Trainer

    targets, overrides = _split_items(args.items)
    if len(targets) != 1:
        raise ConfigError("usage: reinforge reproduce RUN_DIR [key=value ...]")
    original = RunDir.open(targets[0])
    if original.kind != "train":
        raise ConfigError(f"{targets[0]!r} is an eval directory; reproduce re-runs training runs")
    if original.status().get("stage") == "sft" and not (original.path / "sft").is_dir():
        raise ConfigError(f"{targets[0]!r} is a `reinforge sft` run; reproduce re-runs RL runs (run `reinforge sft "
                          f"{original.path / 'config.yaml'}` and compare the two with `reinforge compare`)")
    out_dir = Path(args.output_dir) if args.output_dir else original.path.parent / "reproductions"
    name = args.name
    if name is None:
        name, i = f"{original.name}-repro", 2
        while (out_dir / name).exists():
            name, i = f"{original.name}-repro{i}", i + 1
    # A run resumed under a changed config is replayed segment by segment: each segment's config
    # from its first step to the checkpoint the next one resumed from (segments.json).
    segments = read_segments(original)
    # Exporters off and no sweep tag: a reproduction is a check, not another seed of the experiment.
    pinned = ["tracking.exporters=[]", "tracking.sweep=null", f"tracking.output_dir={out_dir}",
              f"tracking.run_name={name}"]
    configs = [build_config(seg.config, overrides + pinned) for seg in segments]
    print(f"reproducing {original.path} as {out_dir / name}"
          + (f", replaying {len(segments)} config segments" if len(segments) > 1 else ""), file=sys.stderr)
    repro = RunDir.create(configs[0])
    repro.set_status("running", reproduces=str(original.path))  # compare leaves reproductions out
    for i, cfg in enumerate(configs):
        trainer = Trainer(cfg, run_dir=repro, resume=i > 0, new_segment=True)
        stop = segments[i + 1].from_step - 1 if i + 1 < len(segments) else None
        trainer.stop_after_step = stop
        result = trainer.run()
        if stop is not None and result.steps_done != stop:
            raise RuntimeError(f"replaying segment {i + 1} of {original.path} ended at step {result.steps_done}, "
                               f"not at step {stop} where the next segment resumed")
    report = compare_run_dirs(original, repro)
    md = format_repro_report(report, original, repro)
    atomic_write_text(repro.path / "reproduction.md", md)
    atomic_write_json(repro.path / "reproduction.json", {
        "original": str(original.path), "matched": report.matched, "steps_compared": report.steps_compared,
        "first_mismatch_step": report.first_mismatch_step, "ignored_keys": report.ignored_keys,
        "mismatches": [m.__dict__ for m in report.mismatches], "missing_steps": report.missing_steps,
        "extra_steps": report.extra_steps, "environment": report.environment,
        "segments_replayed": [s.from_step for s in segments], "segment_differences": report.segments,
    })
    repro.release_writer()
    print(md)
    return 0 if report.matched else 1


_EXPERIMENT_COMMANDS = {"eval": _eval, "sweep": _sweep, "compare": _compare, "runs": _runs, "reproduce": _reproduce}


def _add_experiment_commands(sub) -> None:
    ev = sub.add_parser(
        "eval", help="pass@k, maj@k and mean reward of a model, run or checkpoint on held-out prompts",
        description="Evaluate MODEL_OR_RUN (a run directory, a Hugging Face model folder, or 'default') with "
        "N samples per held-out prompt: mean reward, pass@k (unbiased, Chen et al. 2021) and maj@k for "
        "k=1..N with 95%% bootstrap intervals over prompts. `--boundary BASE RUN` compares the pass@k curves "
        "of a base model and a trained run (Yue et al. 2025).")
    ev.add_argument("items", nargs="*", metavar="MODEL_OR_RUN [key=value ...]")
    ev.add_argument("--boundary", nargs=2, metavar=("BASE", "RUN"), help="capability-boundary analysis")
    ev.add_argument("--checkpoint", help="evaluate this checkpoint of the run (step_000010, 10 or latest)")
    ev.add_argument("--config", help="config file for a bare model (task, reward, sampling)")
    ev.add_argument("--task", help="reasoning-gym task name, or a data file (sets task.source=file)")
    ev.add_argument("--samples", type=int, default=8, help="completions per prompt, N (default 8)")
    ev.add_argument("--temperature", type=float, help="sampling temperature, 0 for greedy decoding (default: rollout.temperature)")
    ev.add_argument("--top-p", type=float, help="nucleus sampling (default: rollout.top_p)")
    ev.add_argument("--max-new-tokens", type=int, help="default: rollout.max_new_tokens")
    ev.add_argument("--max-prompts", type=int, help="evaluate the first M held-out prompts only")
    ev.add_argument("--seed", type=int, help="sampling seed (default: trainer.seed)")
    ev.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    ev.add_argument("--output-dir", help="where a bare model's eval directory is created (default tracking.output_dir)")
    ev.add_argument("--name", help="name of a bare model's eval directory")
    ev.add_argument("--force", action="store_true", help="redo an evaluation that exists with the same settings")

    sw = sub.add_parser("sweep", help="run a grid of config overrides x seeds, resumably",
                        description="Run every grid point x seed of SWEEP.yaml one after another; finished runs "
                        "are skipped and interrupted ones resumed (docs/experiments.md).")
    sw.add_argument("items", nargs="*", metavar="SWEEP.yaml")
    sw.add_argument("--output-dir", help="override the sweep file's output_dir")
    sw.add_argument("--plan", action="store_true", help="list the runs and their states; train nothing")

    cp = sub.add_parser("compare", help="multi-seed comparison: IQM, intervals, probability of improvement",
                        description="Group runs by the config keys that differ and report IQM with stratified "
                        "bootstrap intervals, probability of improvement, learning curves and performance "
                        "profiles (Agarwal et al. 2021).")
    cp.add_argument("items", nargs="*", metavar="RUN_OR_SWEEP")
    cp.add_argument("--out", help="output folder (default: <sweep dir>/compare, or compare-<time>)")
    cp.add_argument("--metric", default="accuracy", help="held-out metric from evals.jsonl (default accuracy)")
    cp.add_argument("--include-unfinished", action="store_true", help="also use runs that did not finish")
    cp.add_argument("--ignore", action="append", metavar="KEY", help="config key that must not define a group")
    cp.add_argument("--split-tasks", action="store_true", help="make the task a group key instead of a stratum")
    cp.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    cp.add_argument("--seed", type=int, default=0, help="bootstrap seed")

    rn = sub.add_parser("runs", help="list the runs under a folder (default: runs)")
    rn.add_argument("items", nargs="*", metavar="DIR")
    rn.add_argument("--metric", default="accuracy", help="held-out metric shown (default accuracy)")

    rp = sub.add_parser("reproduce", help="re-run a recorded run and check its metrics match step by step")
    rp.add_argument("items", nargs="*", metavar="RUN_DIR [key=value ...]")
    rp.add_argument("--output-dir", help="where the reproduction goes (default: next to the original)")
    rp.add_argument("--name", help="name of the reproduction's run directory")


if __name__ == "__main__":
    sys.exit(main())
