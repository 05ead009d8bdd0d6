"""`reinforge eval` (and `eval --boundary`): sampled evaluation of a model, run or checkpoint;
thin wrappers over reinforge.evaluation (docs/experiments.md).

Only the standard library at module level: the package imports this module before its signal
handlers are installed, so the config, the models and torch are imported inside the functions
(reinforge/cli/__init__.py).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

from .common import _split_items


def _eval_raw_config(raw: dict, args: argparse.Namespace, *, model_path: str | None = None) -> dict:
    """raw config <- --task <- model path; values set as data, never re-parsed from text."""
    from ..config import set_dotted
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
    from ..config import DEFAULT_MODEL, ConfigError

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
    from ..config import ConfigError, build_config, load_config
    from ..evaluation.runner import ModelSource
    from ..tracking import RunDir

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

    from ..evaluation.runner import task_differs_from_run, task_sections

    if rd is None or rd.kind != "train" or not task_differs_from_run(cfg, rd):
        return ""
    return "_cfg" + hashlib.sha1(json.dumps(task_sections(cfg), sort_keys=True, default=str).encode()).hexdigest()[:8]


def _run_sampled_eval(cfg, source, rd, params: dict, args: argparse.Namespace, *, policy_cfg=None):
    """Evaluate ``source`` (cached in ``rd`` when the same evaluation exists); returns (summary, rows, folder)."""
    import hashlib
    import json

    import torch

    from ..evaluation.report import passk_csv, passk_markdown, plot_passk
    from ..evaluation.runner import attach_verdict, build_eval_setup, load_policy, policy_tokenizer, sampled_eval
    from ..rollout.context import fit_prompts
    from ..tracking import atomic_write_bytes, atomic_write_text
    from ..tracking.sampled_evals import read_sampled_eval, sampled_eval_dir, sampled_eval_labels, write_sampled_eval
    from ..models import compute_dtype, resolve_precision

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
    tokenizer, model_path = policy_tokenizer(source)
    # Every prompt plus --max-new-tokens must fit the model's context, as in training: refused in one
    # line naming the longest prompt (or cut when task.truncate_prompts=left) before the weights load.
    prompt_ids: dict[str, list[int]] = {}
    rollout = cfg.rollout.model_copy(update={"max_new_tokens": params["max_new_tokens"]})
    fit_cfg = cfg.model_copy(update={"rollout": rollout})
    fit_prompts(fit_cfg, model_path, tokenizer, {"held-out": setup.examples}, prompt_ids,
                budget_name="--max-new-tokens")
    model, tokenizer = load_policy(policy_cfg or cfg, source, tokenizer)
    summary, rows = sampled_eval(
        setup, model, tokenizer, samples=params["samples"], temperature=params["temperature"],
        top_p=params["top_p"], max_new_tokens=params["max_new_tokens"], seed=params["seed"],
        generation_batch_size=cfg.rollout.generation_batch_size,
        autocast_dtype=compute_dtype(cfg.model),
        copy_dtype=torch.bfloat16 if cfg.rollout.resolved_hf_bf16_copy(cfg.model.dtype) else None,
        n_resamples=args.resamples, prompt_ids=prompt_ids,
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
    from ..config import ConfigError
    from ..tracking import RunDir

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
            from ..tracking.sampled_evals import sampled_eval_labels

            if sampled_eval_labels(rd) and isinstance(err, KeyboardInterrupt):  # a stop signal, named by the CLI
                rd.set_status("interrupted", signal=err.args[0] if err.args else "SIGINT")
            elif sampled_eval_labels(rd):
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
    from ..config import ConfigError, build_config
    from ..evaluation.boundary import boundary_analysis, boundary_csv, boundary_markdown, plot_boundary
    from ..evaluation.runner import ModelSource
    from ..tracking import RunDir, atomic_write_bytes, atomic_write_json, atomic_write_text
    from ..tracking.sampled_evals import boundary_dir

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
