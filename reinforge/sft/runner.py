"""The supervised fine-tuning loop: `reinforge sft`, and the warm-start stage `reinforge train`
runs before RL.

A step reads as SFT: take the next ``sft.batch_size`` demonstrations (seeded epochs), make the
learner's batch (prompt as context, the response as the tokens trained on), one optimiser step
of the mean negative log-likelihood of the response tokens, log. The step is the RL learner's
own ``Learner.step`` with the REINFORCE loss and an advantage of 1 on every response token, whose
loss is exactly ``-mean log p(response token)``: the same micro-batching under a token budget,
chunked LM head, AdamW, warm-up, gradient clipping and NaN guard as RL, and the same
``state_dict`` for checkpoints.

The run directory is an RL run's: config.yaml, segments.json, environment.json, status.json,
metrics.jsonl, evals.jsonl + evals/ (greedy held-out evaluations through the trainer's own
``greedy_heldout_eval``), checkpoints/, final_model/ (always a whole model: LoRA adapters are
merged, so ``model.path=<run>/final_model`` starts an RL run from it), summary.md and
learning_curves.png. Expert iteration adds ``expert_iteration/round_NNN.json``: each round's
accepted samples and counts.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..batch import TrainBatch
from ..config import AlgorithmConfig, RunConfig
from ..evaluation.runner import greedy_heldout_eval
from ..evaluation.guardrails import Guardrails
from ..learner import Learner
from ..models import compute_dtype, load_model, load_tokenizer, resolve_device, resolve_model_path, resolve_precision
from ..rewards import build_reward
from ..rollout import SamplingParams, build_generator
from ..rollout.context import fit_prompts, model_context
from ..agents import build_agent, build_run_task
from ..tasks import encode_prompt
from ..tracking import RunDir, atomic_write_json
from ..tracking.curves import plot_learning_curves
from ..tracking.location import check_new_run_location
from ..tracking.run_dir import safe_name, task_label
from ..lifecycle.checkpoint import latest_checkpoint, load_checkpoint, non_finite_stop, save_checkpoint, set_rng_state
from ..lifecycle.progress import Progress
from ..lifecycle.resume import plan_resume, record_segment
from ..lifecycle.stopping import StopControl
from ..lifecycle.summary import write_run_summary
from .data import TokenizedDemo, collate, demos_from_file, demos_from_task, stop_token_id, tokenize_demos
from .expert import round_prompts, round_seed, select_accepted

log = logging.getLogger("reinforge")

ROUNDS_DIR = "expert_iteration"

__all__ = ["SFTRunner", "SFTResult", "batch_positions", "ROUNDS_DIR"]


class _Stop(Exception):
    pass


@dataclass
class SFTResult:
    run_dir: Path
    steps_done: int
    finished: bool
    summary: dict[str, Any] = field(default_factory=dict)
    stopped_by: str | None = None  # the signal that stopped it (SIGINT, SIGTERM, SIGHUP)


def batch_positions(num_demos: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Demonstration indices of (1-based) ``step``: the ``batch_size`` next positions of a stream
    of epochs, each a seeded permutation. A function of the step alone, so a resumed run draws
    what the uninterrupted run drew without any sampler state."""
    out = []
    for pos in range((step - 1) * batch_size, step * batch_size):
        epoch, j = divmod(pos, num_demos)
        out.append(int(np.random.default_rng([seed, epoch]).permutation(num_demos)[j]))
    return out


def sft_learner_config(cfg: RunConfig):
    """(learner config, algorithm config) of the SFT step: the learner section's optimiser and
    memory settings with the SFT learning rate and warm-up; REINFORCE with advantage 1 and a
    token mean, i.e. the mean negative log-likelihood of the response tokens."""
    lcfg = cfg.learner.model_copy(update={"lr": cfg.sft.lr, "lr_warmup_steps": cfg.sft.lr_warmup_steps})
    algo = AlgorithmConfig(policy_loss="reinforce", loss_agg="token_mean", kl_coef=0.0, entropy_coef=0.0)
    return lcfg, algo


def new_run_name(cfg: RunConfig) -> str:
    """``<time>-sft-<task>`` (``-2``, ``-3``... when taken), or ``tracking.run_name``."""
    if cfg.tracking.run_name:
        return cfg.tracking.run_name
    base = safe_name(f"{time.strftime('%Y%m%d-%H%M%S')}-sft-{task_label(cfg.task.model_dump())}")
    name, i = base, 2
    while (Path(cfg.tracking.output_dir) / name).exists():
        name, i = f"{base}-{i}", i + 1
    return name


class SFTRunner:
    """Supervised fine-tuning under ``config`` (its ``sft`` section; defaults when it has none).

    ``run_dir``: the run to write (created when None). ``resume``: continue it from its latest
    checkpoint, after the resume policy checked the config (``check_resume``; the warm-start
    stage of an RL run is checked by the RL run's own resume). ``stop_after_step``: stop as
    Ctrl-C does once that step is checkpointed (tests, replays)."""

    def __init__(self, config: RunConfig, *, run_dir: RunDir | None = None, resume: bool = False,
                 new_segment: bool = False, check_resume: bool = True):
        if config.sft is None:
            from ..config import SFTConfig

            config = config.model_copy(update={"sft": SFTConfig()})
        self.cfg = config
        self.precision: dict | None = None  # how model.dtype was chosen (set when the run starts)
        self.run_dir = run_dir
        self._resume = resume
        self._new_segment = new_segment
        self._check_resume = check_resume
        self._stop_requested = False
        self.stop_after_step: int | None = None

    # -- setup -------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg, sft = self.cfg, self.cfg.sft
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        torch.manual_seed(cfg.trainer.seed)
        np.random.seed(cfg.trainer.seed % 2**32)
        random.seed(cfg.trainer.seed)
        # Cheap failures first: task, demonstrations (every row checked), device, model path.
        self.task = build_run_task(cfg)  # an environment makes its own examples (task.source: env)
        eval_examples = self.task.eval_examples()
        if cfg.trainer.eval_max_prompts is not None:
            eval_examples = eval_examples[: cfg.trainer.eval_max_prompts]
        self.eval_examples = list(eval_examples)
        self.reward_fn = build_reward(cfg.reward, self.task, max_new_tokens=cfg.rollout.max_new_tokens)
        self.guardrails = Guardrails.build(self.task, self.reward_fn, cfg.reward, seed=cfg.trainer.seed,
                                           max_turns=cfg.env.max_turns if cfg.env else None)
        if sft.source == "task":
            self.demos = demos_from_task(self.task, num_examples=sft.num_examples,
                                         answer_format=cfg.reward.answer_format, solution_keys=sft.solution_keys)
        elif sft.source == "file":
            self.demos = demos_from_file(
                sft.path, prompt_field=sft.prompt_field, response_field=sft.response_field,
                messages_field=sft.messages_field, limit=sft.num_examples,
                prompt_format=self.task.prompt_format if sft.apply_prompt_format else None)
        else:
            self.demos = []
        self.device = resolve_device(cfg.model.device)
        self.model_path = resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(self.model_path)
        self._prompt_cache: dict[str, list[int]] = {}
        # The prompts sampled from (held-out, and expert iteration's training prompts) must fit the model's
        # context with rollout.max_new_tokens after them, as in RL: refused, or cut by task.truncate_prompts=left.
        splits = {"held-out": self.eval_examples}
        if sft.source == "expert_iteration":
            splits = {"training": list(self.task.train_examples()), **splits}
        fit_prompts(cfg, self.model_path, self.tokenizer, splits, self._prompt_cache)
        context, context_source = model_context(self.model_path, self.tokenizer)
        self.model = load_model(cfg.model, path=self.model_path, device=self.device)
        self.autocast_dtype = compute_dtype(cfg.model)
        self.stop_id = stop_token_id(self.model, self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id
        self.data: list[TokenizedDemo] = (
            tokenize_demos(self.tokenizer, self.demos, self.stop_id, max_tokens=sft.max_tokens,
                           context=(context, context_source) if context else None) if self.demos else [])
        lcfg, algo = sft_learner_config(cfg)
        self.learner = Learner(self.model, lcfg, algo, temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens,
                               autocast_dtype=self.autocast_dtype)
        self.generator = build_generator(
            cfg.rollout, self.model, self.tokenizer, model_path=self.model_path, model_dtype=cfg.model.dtype,
            autocast_dtype=self.autocast_dtype, seed=cfg.trainer.seed,
        )
        # Held-out episodes of a multi-turn run are played through the environment, as RL plays them.
        self.eval_generator, self.eval_reward = self.generator, self.reward_fn
        if cfg.env is not None:
            self.eval_generator, self.eval_reward = build_agent(cfg, self.generator, self.reward_fn, self.task,
                                                                model_path=self.model_path)
        self.start_step = 0
        self.nan_streak = 0
        self.round_data: dict[int, list[TokenizedDemo]] = {}
        if self.run_dir is None:
            self.run_dir = RunDir.create(cfg, name=new_run_name(cfg), precision=self.precision)
        if self._resume:
            self._restore()

    def _restore(self) -> None:
        rd = self.run_dir
        ckpt = latest_checkpoint(rd.path)
        if ckpt is None:
            log.warning("no checkpoint in %s: SFT starts from step 0", rd.path)
            self._drop_rounds_after(0)
            rd.truncate_after(0)
            record_segment(rd, self.cfg, 0)
            return
        data = load_checkpoint(ckpt)
        self.learner.load_state_dict({"weights": data["weights"], **data["optimizer"]})
        set_rng_state(data["rng"])
        self.start_step = data["state"]["step"]
        self.nan_streak = data["state"].get("nan_streak", 0)
        self._drop_rounds_after(self.start_step)
        rd.truncate_after(self.start_step)
        record_segment(rd, self.cfg, self.start_step)
        log.info("resumed SFT %s from step %d", rd.path, self.start_step)

    def _encode(self, example) -> list[int]:
        ids = self._prompt_cache.get(example.id)
        if ids is None:
            ids = self._prompt_cache[example.id] = encode_prompt(self.tokenizer, example)
        return ids

    def _sync(self, version: int) -> None:
        state = self.learner.policy_state_dict() if self.generator.needs_sync else {}
        self.generator.sync_weights(state, version)

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, float]:
        self._sync(step)
        summary, per_prompt = greedy_heldout_eval(
            self.eval_generator, self.eval_reward, self.eval_examples, self._encode,
            max_new_tokens=self.cfg.rollout.max_new_tokens, seed=self.cfg.trainer.seed,
            guardrails=self.guardrails,
        )
        self.run_dir.log_eval(step, summary, per_prompt)
        return summary

    # -- expert iteration --------------------------------------------------------------------
    @property
    def expert_iteration(self) -> bool:
        return self.cfg.sft.source == "expert_iteration"

    def round_of(self, step: int) -> int:
        """The (1-based) expert-iteration round of ``step``."""
        return (step - 1) // self.cfg.sft.steps + 1

    def _round_file(self, r: int) -> Path:
        return self.run_dir.path / ROUNDS_DIR / f"round_{r:03d}.json"

    def _drop_rounds_after(self, step: int) -> None:
        # A round that began after the checkpoint is sampled again, from the checkpoint's weights.
        folder = self.run_dir.path / ROUNDS_DIR
        if not folder.is_dir():
            return
        for p in folder.glob("round_*.json"):
            r = int(p.stem.split("_")[1])
            if (r - 1) * self.cfg.sft.steps + 1 > step:
                p.unlink()

    def _round_demos(self, r: int) -> tuple[list[TokenizedDemo], dict[str, float] | None]:
        """Round ``r``'s accepted samples (loaded when the round was sampled before a resume),
        and the round's counts when it was sampled now."""
        if r in self.round_data:
            return self.round_data[r], None
        path = self._round_file(r)
        train = self.task.train_examples()
        if path.is_file():
            import json

            saved = json.loads(path.read_text())
            demos = [TokenizedDemo(k["id"], self._encode(train[k["train_index"]]), k["response_ids"])
                     for k in saved["kept"]]
            self.round_data = {r: demos}
            return demos, None
        demos, record = self._sample_round(r)
        atomic_write_json(path, record)
        self.round_data = {r: demos}
        return demos, {k: v for k, v in record.items() if isinstance(v, (int, float))}

    def _sample_round(self, r: int) -> tuple[list[TokenizedDemo], dict[str, Any]]:
        cfg, ei = self.cfg, self.cfg.sft.expert_iteration
        train = self.task.train_examples()
        indices = round_prompts(len(train), ei.prompts_per_round, cfg.trainer.seed, r)
        examples = [train[i] for i in indices]
        self._sync((r - 1) * cfg.sft.steps)
        params = SamplingParams(num_samples=ei.samples_per_prompt, temperature=ei.temperature, top_p=ei.top_p,
                                max_new_tokens=cfg.rollout.max_new_tokens)
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(round_seed(cfg.trainer.seed, r))
            rollout = self.generator.generate([self._encode(e) for e in examples], params)
        scores = self.reward_fn.score(rollout, [examples[int(g)] for g in rollout.group_index])
        lengths = rollout.completion_mask.sum(dim=1).tolist()
        tokens = [rollout.completion_ids[i, :n].tolist() for i, n in enumerate(lengths)]
        rewards = scores.rewards.tolist()
        truncated = rollout.truncated.tolist()
        groups = rollout.group_index.tolist()
        kept_rows = select_accepted(groups, tokens, rewards, truncated, threshold=ei.accept_threshold,
                                    dedupe=ei.dedupe, max_per_prompt=ei.max_per_prompt)
        accepted = sum(1 for x, cut in zip(rewards, truncated) if x >= ei.accept_threshold and not cut)
        kept = [{"id": examples[groups[i]].id, "train_index": indices[groups[i]], "text": rollout.texts[i],
                 "reward": rewards[i], "response_ids": tokens[i]} for i in kept_rows]
        demos = [TokenizedDemo(k["id"], self._encode(train[k["train_index"]]), k["response_ids"]) for k in kept]
        record = {
            "round": r, "first_step": (r - 1) * cfg.sft.steps + 1, "prompts": len(examples),
            "samples_generated": len(rollout), "samples_accepted": accepted, "samples_kept": len(kept),
            "prompts_with_accepted": len({groups[i] for i in kept_rows}),
            "sample_reward_mean": float(np.mean(rewards)) if rewards else 0.0,
            "accept_threshold": ei.accept_threshold, "time_sampling": time.perf_counter() - t0, "kept": kept,
        }
        log.info("expert iteration round %d: %d of %d prompts have an accepted sample; %d samples kept of %d",
                 r, record["prompts_with_accepted"], len(examples), len(kept), len(rollout))
        return demos, record

    # -- one step ----------------------------------------------------------------------------
    def step_data(self, step: int) -> tuple[list[TokenizedDemo], dict[str, float]]:
        """The demonstrations of ``step`` and what to log about where they came from."""
        sft, seed = self.cfg.sft, self.cfg.trainer.seed
        if not self.expert_iteration:
            pos = batch_positions(len(self.data), sft.batch_size, step, seed)
            return [self.data[i] for i in pos], {"epoch": (step - 1) * sft.batch_size / len(self.data)}
        r = self.round_of(step)
        demos, counts = self._round_demos(r)
        info: dict[str, float] = {"round": float(r)}
        if counts:
            info.update({f"ei_{k}": float(v) for k, v in counts.items() if k not in ("round", "first_step")})
        if not demos:
            return [], info
        local = step - (r - 1) * sft.steps
        pos = batch_positions(len(demos), sft.batch_size, local, seed + r)
        return [demos[i] for i in pos], info

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        demos, info = self.step_data(step)
        if not demos:  # an expert-iteration round in which nothing was accepted: no update
            return {**info, "skipped": 1.0, "no_data": 1.0, "response_tokens": 0.0, "tokens_per_s": 0.0,
                    "time_step": time.perf_counter() - t0}
        rollout = collate(demos, self.pad_id)
        batch = TrainBatch(rollout=rollout, advantages=torch.ones(len(demos)))
        t1 = time.perf_counter()
        stats = self.learner.step(batch)
        elapsed = time.perf_counter() - t0
        response_tokens = float(rollout.action_mask.sum())
        all_tokens = response_tokens + float(rollout.prompt_mask.sum())
        return {
            "loss": stats["loss"], "grad_norm": stats["grad_norm"], "lr": stats["lr"], "skipped": stats["skipped"],
            "entropy": stats["entropy"], "response_tokens": response_tokens, "sequence_tokens": all_tokens,
            "tokens_per_s": response_tokens / max(elapsed, 1e-9), "sequence_tokens_per_s": all_tokens / max(elapsed, 1e-9),
            "time_step": elapsed, "time_update": time.perf_counter() - t1, **info,
        }

    def _checkpoint(self, step: int) -> None:
        state = self.learner.state_dict()
        save_checkpoint(self.run_dir.path, step, weights=state.pop("weights"), optimizer_state=state,
                        trainer_state={"stage": "sft", "nan_streak": self.nan_streak},
                        keep=self.cfg.trainer.keep_checkpoints)

    # -- the loop ----------------------------------------------------------------------------
    def run(self, *, resume_command: str | None = None) -> SFTResult:
        """Fine-tune, holding the run's writer lock throughout. ``resume_command``: what
        status.json tells the user to run after an interruption."""
        if self.run_dir is not None:
            self.run_dir.acquire_writer()
        elif not self._resume:  # where it will be created: refused now, not after the model loaded
            check_new_run_location(self.cfg.tracking.output_dir, self.cfg.tracking.run_name,
                                   resume="reinforge sft --resume")
        try:
            if self.cfg.trainer.num_threads:  # (the dtype probe's ratio depends on the threads)
                torch.set_num_threads(self.cfg.trainer.num_threads)
            self.cfg, choice = resolve_precision(self.cfg)  # model.dtype=auto: before anything reads it
            self.precision = choice.to_dict()
            if self._resume and self._check_resume:
                plan_resume(self.run_dir, self.cfg, new_segment=self._new_segment)
            return self._run(resume_command)
        finally:
            if getattr(self, "generator", None) is not None:  # its copy or engine, as the trainer does
                self.generator.close()
            if self.run_dir is not None:
                self.run_dir.release_writer()

    def _is_eval_step(self, step: int, total: int) -> bool:
        sft = self.cfg.sft
        if step == total or (sft.eval_every and step % sft.eval_every == 0):
            return True
        return self.expert_iteration and step % sft.steps == 0  # every round's end

    def _run(self, resume_command: str | None) -> SFTResult:
        self._setup()
        cfg, rd = self.cfg, self.run_dir
        total = cfg.sft.total_steps
        resume_command = resume_command or f"reinforge sft --resume {rd.path}"
        rd.set_status("running", stage="sft")
        # Ctrl-C, SIGTERM, SIGHUP: the step under way (short, never abandoned) ends and is checkpointed
        # first; a second signal stops at once (lifecycle/stopping.py).
        stop = StopControl(0.0)
        started = time.perf_counter()
        step = self.start_step
        last_eval: dict[str, float] = {}
        try:
            with stop.installed(), Progress(total=total, start=self.start_step, enabled=cfg.tracking.progress) as bar:
                stop.steps_begin()
                if cfg.trainer.eval_at_start and 0 not in rd.eval_steps():
                    last_eval = self.evaluate(0)
                    bar.update(self.start_step, eval=last_eval)
                for step in range(self.start_step + 1, total + 1):
                    if stop.requested:  # came during the first evaluation: no step begun
                        step -= 1
                        raise _Stop
                    metrics = self.train_step(step)
                    if step == self.stop_after_step:
                        self._stop_requested = True
                    if metrics["skipped"] and not metrics.get("no_data"):
                        self.nan_streak += 1
                        log.warning("SFT step %d: non-finite loss or gradient, update skipped", step)
                    else:
                        self.nan_streak = 0
                    rd.log_metrics(step, metrics)
                    if self.nan_streak >= cfg.trainer.max_consecutive_nan:
                        err = non_finite_stop(rd.path, self.nan_streak, step, lr_key="sft.lr", resume=resume_command,
                                              checkpoint_key="sft.checkpoint_every")
                        rd.set_status("failed", step=step, reason=f"SFT: {err}")
                        raise err
                    if self._is_eval_step(step, total):
                        last_eval = self.evaluate(step)
                    is_last = step == total
                    stopping = self._stop_requested or stop.requested
                    if is_last or stopping or (cfg.sft.checkpoint_every and step % cfg.sft.checkpoint_every == 0):
                        with stop.critical():
                            self._checkpoint(step)
                    bar.update(step, metrics=metrics, eval=last_eval)
                    if stopping and not is_last:
                        raise _Stop
        except (KeyboardInterrupt, _Stop):
            name = stop.signal_name
            rd.set_status("interrupted", step=step, resume=resume_command, **({"signal": name} if name else {}))
            try:  # after a SIGHUP the terminal may be gone; status.json says the same
                print(f"reinforge: SFT {'stopped by ' + name if name else 'interrupted'} at step {step}. Resume "
                      f"with: {resume_command}", file=sys.stderr)
            except OSError:
                pass
            return SFTResult(rd.path, step, finished=False, stopped_by=name)
        except Exception as err:
            if rd.status().get("state") != "failed":
                rd.set_status("failed", reason=f"{type(err).__name__}: {err}", step=step)
            raise
        self._save_final_model()
        summary = self._write_summary(time.perf_counter() - started)
        plot_learning_curves(rd)
        rd.set_status("finished", step=step)
        return SFTResult(rd.path, step, finished=True, summary=summary)

    def _save_final_model(self) -> None:
        """final_model/: the whole fine-tuned model (LoRA adapters merged into the weights) and
        the tokenizer, written under a temporary name and renamed, so it is a plain Hugging Face
        folder that ``model.path`` can name."""
        target = self.run_dir.final_model_dir
        tmp = self.run_dir.path / ".tmp-final_model"
        shutil.rmtree(tmp, ignore_errors=True)
        model = self.model
        if hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)

    def _write_summary(self, wall_time: float) -> dict[str, Any]:
        cfg, rd = self.cfg, self.run_dir
        summary = write_run_summary(rd, recipe="sft", task_name=self.task.name, model_path=cfg.model.path,
                                    seed=cfg.trainer.seed, wall_time=wall_time)
        metrics = [m for m in rd.read_metrics() if "loss" in m]
        lines = ["", f"Supervised fine-tuning (docs/sft.md): source `{cfg.sft.source}`, "
                 f"{cfg.sft.total_steps} steps of {cfg.sft.batch_size} demonstrations, lr {cfg.sft.lr:g}"
                 + (f", LoRA r={cfg.model.lora.r}" if cfg.model.lora else ", full fine-tuning")]
        if self.data:
            solved = sum(1 for d in self.demos if d.metadata.get("worked_solution"))
            lines.append(f"{len(self.data)} demonstrations" + (f" ({solved} with a worked solution)" if solved else ""))
        if metrics:
            tok = sum(m["response_tokens"] for m in metrics)
            seconds = sum(m["time_step"] for m in metrics)
            summary["sft"] = {"response_tokens": tok, "time_s": seconds, "response_tokens_per_s": tok / max(seconds, 1e-9),
                              "first_loss": metrics[0]["loss"], "last_loss": metrics[-1]["loss"]}
            lines.append(f"loss {metrics[0]['loss']:.3f} at step {metrics[0]['step']} -> {metrics[-1]['loss']:.3f} at "
                         f"step {metrics[-1]['step']}; {tok:.0f} response tokens in {seconds:.1f} s of steps "
                         f"({tok / max(seconds, 1e-9):.0f} tokens/s)")
        if self.expert_iteration:
            rounds = self._round_table()
            summary["expert_iteration"] = rounds
            lines += ["", "| round | prompts with >=1 accepted | samples kept / generated | held-out accuracy after [95% CI] |",
                      "|---|---|---|---|"]
            for r in rounds:
                acc = r.get("heldout_accuracy")
                acc_s = (f"{acc:.3f} [{r['heldout_ci_low']:.3f}, {r['heldout_ci_high']:.3f}]"
                         if acc is not None else "-")
                lines.append(f"| {r['round']} | {r['prompts_with_accepted']} / {r['prompts']} | "
                             f"{r['samples_kept']} / {r['samples_generated']} | {acc_s} |")
        md = (rd.path / "summary.md").read_text().rstrip("\n") + "\n" + "\n".join(lines) + "\n"
        rd.write_summary(summary, md)
        return summary

    def _round_table(self) -> list[dict[str, Any]]:
        import json

        evals = {e["step"]: e for e in self.run_dir.read_evals()}
        rows = []
        for r in range(1, self.cfg.sft.expert_iteration.rounds + 1):
            path = self._round_file(r)
            if not path.is_file():
                continue
            rec = {k: v for k, v in json.loads(path.read_text()).items() if k != "kept"}
            e = evals.get(r * self.cfg.sft.steps)
            if e is not None:
                rec.update(heldout_accuracy=e["accuracy"], heldout_ci_low=e["accuracy_ci_low"],
                           heldout_ci_high=e["accuracy_ci_high"])
            rows.append(rec)
        return rows

    def close(self) -> None:
        """Free the model (the warm-start stage hands the machine to RL next)."""
        agent = getattr(self, "eval_generator", None)
        if agent is not None and agent is not getattr(self, "generator", None) and hasattr(agent, "close"):
            agent.close()  # an environment's workers and tool threads
        for name in ("eval_generator", "generator", "learner", "model"):
            if hasattr(self, name):
                delattr(self, name)
        gc.collect()
