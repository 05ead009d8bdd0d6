"""`reinforge train / recipes / eval / sweep / compare / runs / reproduce` command line.

Only the standard library, the run-directory helpers and the stop handling (lifecycle/stopping.py)
are imported with this module: the config (and with it torch) loads inside :func:`main`, after
SIGTERM, SIGHUP and Ctrl-C are handled, so a stop during the imports ends with one line instead of
a traceback. The handler modules imported here (train.py, eval.py, runs.py, common.py, exits.py)
keep to the same rule: they import everything heavy inside their functions, and none of them
imports this package.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from ..lifecycle.stopping import detach_lost_terminal, handled_signals
from ..tracking.io import DiskFullError
from ..tracking.lock import RunLockedError
from .common import _split_items  # noqa: F401  (re-exported)
from .eval import _eval
from .exits import end_process, stopped_code
from .runs import _compare, _reproduce, _runs, _sweep
from .train import _recipes, _sft, _train, _train_rm


# Handled from the start, as Ctrl-C is: a cluster's stop and a closed terminal or ssh session.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _terminate_as_interrupt(signum, frame):
    if signum == getattr(signal, "SIGHUP", None):
        detach_lost_terminal()  # writing to a terminal that hung up fails (EIO)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    """The command line. SIGTERM and SIGHUP are treated as Ctrl-C from the start (a training run
    then stops as reinforge/lifecycle/stopping.py says); a stop before a run began prints one line,
    no traceback. The exit status says how it ended (reinforge/cli/exits.py): called with no
    ``argv`` (the `reinforge` command), a stop by a signal ends the process by that signal."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _terminate_as_interrupt) for sig in handled_signals(_STOP_SIGNALS)}
    try:
        code = _main(argv)
    except KeyboardInterrupt as stop:  # the trainer handles its own; this is before it began, or another command
        name = stop.args[0] if stop.args else "SIGINT"
        words = list(sys.argv[1:] if argv is None else argv)
        when = " during start-up; nothing was trained" if words[:1] in (["train"], ["sft"]) else ""
        try:
            print(f"reinforge: stopped by {name}{when}", file=sys.stderr)
        except OSError:  # the terminal is gone
            pass
        code = stopped_code(name)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return end_process(code) if argv is None else code


def _main(argv: list[str] | None = None) -> int:
    from ..config import ConfigError

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
    for command in (tr, trm, sf):
        _add_import_option(command)
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
    from ..config.plugins import command_line_imports

    try:
        with command_line_imports(getattr(args, "imports", None)):  # before any config is validated
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
    except (FileNotFoundError, ValueError, RuntimeError, FloatingPointError) as err:  # (the NaN guard's stop)
        print(f"reinforge: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


# ----------------------------------------------------------------------------- experiments
# eval / sweep / compare / runs / reproduce: thin wrappers over reinforge.evaluation and
# reinforge.tracking (docs/experiments.md), in eval.py and runs.py.

def _add_import_option(command) -> None:
    command.add_argument(
        "--import", dest="imports", action="append", metavar="MODULE_OR_FILE",
        help="import a plugin (a module name or a .py file) before the config is validated, so that its "
        "register_env / register_verifier calls count; repeatable; saved with the run in its `imports` key")


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
    _add_import_option(ev)

    sw = sub.add_parser("sweep", help="run a grid of config overrides x seeds, resumably",
                        description="Run every grid point x seed of SWEEP.yaml one after another; finished runs "
                        "are skipped and interrupted ones resumed (docs/experiments.md).")
    sw.add_argument("items", nargs="*", metavar="SWEEP.yaml")
    sw.add_argument("--output-dir", help="override the sweep file's output_dir")
    sw.add_argument("--plan", action="store_true", help="list the runs and their states; train nothing")
    _add_import_option(sw)

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
    _add_import_option(rp)
