"""The controller loop. It reads as the algorithm: sample prompts, generate, score, compute
advantages, update, evaluate, checkpoint, log. It is the one place that knows every part."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..algorithms import compute_advantages, informative_groups, kl_penalty, truncated_importance_weights
from ..batch import RolloutBatch, TrainBatch, concat_rollouts
from ..config import RunConfig
from ..evaluation.runner import greedy_heldout_eval
from ..learner import Learner
from ..learner.critic import Critic
from ..learner.memory import check_memory
from ..models import load_model, load_tokenizer, resolve_model_path
from ..rewards import build_reward
from ..rewards.shaping import soft_overlong_penalty
from ..rollout import SamplingParams, build_generator
from ..tasks import build_task, encode_prompt
from ..tracking import RunDir
from ..tracking.curves import plot_learning_curves
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state
from .progress import Progress
from .resume import apply_optimizer_settings, plan_resume, record_segment
from .summary import write_run_summary

log = logging.getLogger("reinforge")


class PromptSampler:
    """Seeded epochs over the training prompts; its position is part of every checkpoint."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self.epoch, self.pos = 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n)

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self._perm = self._permutation()
            take = min(k - len(out), self.n - self.pos)
            out.extend(int(i) for i in self._perm[self.pos : self.pos + take])
            self.pos += take
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._perm = self._permutation()


class StopRequested(Exception):
    pass


@dataclass
class RunResult:
    run_dir: Path
    steps_done: int
    summary: dict[str, Any] = field(default_factory=dict)


class Trainer:
    def __init__(self, config: RunConfig, *, run_dir: RunDir | None = None, resume: bool = False,
                 new_segment: bool = False):
        """``resume``: continue ``run_dir`` from its latest checkpoint under ``config``; a change
        that alters what a step computes needs ``new_segment`` (reinforge/trainer/resume.py)."""
        self.cfg = config
        self._resume = resume
        self._new_segment = new_segment
        self.run_dir = run_dir
        self._stop_requested = False
        self.stop_after_step: int | None = None  # stop as Ctrl-C does once this step is checkpointed

    # -- setup -------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg = self.cfg
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        torch.manual_seed(cfg.trainer.seed)
        np.random.seed(cfg.trainer.seed % 2**32)
        random.seed(cfg.trainer.seed)
        # Cheap failures first: the task and the model path are checked before any weights load.
        self.task = build_task(cfg.task)
        self.train_examples = self.task.train_examples()
        eval_examples = self.task.eval_examples()
        if cfg.trainer.eval_max_prompts is not None:
            eval_examples = eval_examples[: cfg.trainer.eval_max_prompts]
        self.eval_examples = list(eval_examples)
        self.reward_fn = build_reward(cfg.reward, self.task)
        model_path = resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(model_path)
        # Memory guard: estimate the peak from the config before any weights load; warn naming the
        # setting to change when it will not fit (reinforge/learner/memory.py).
        prompt_tokens = max((len(encode_prompt(self.tokenizer, e)) for e in self.train_examples[:64]), default=1)
        check_memory(cfg, model_path, prompt_tokens=prompt_tokens)
        self.model = load_model(cfg.model, path=model_path)
        self.autocast_dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else None
        algo = cfg.algorithm
        self.uses_reference = algo.kl_coef > 0 or algo.kl_reward_coef > 0
        reference = None
        if self.uses_reference and cfg.model.lora is None:
            reference = load_model(cfg.model.model_copy(update={"lora": None}), path=model_path).eval()
            for p in reference.parameters():
                p.requires_grad_(False)
        self.critic = None
        if algo.advantage == "gae":
            self.critic = Critic(
                load_model(cfg.model.model_copy(update={"lora": None}), path=model_path), cfg.critic,
                micro_batch_tokens=cfg.learner.micro_batch_tokens, autocast_dtype=self.autocast_dtype,
                betas=tuple(cfg.learner.betas), weight_decay=cfg.learner.weight_decay,
            )
        # A forward pass for the policy's own log-probs at rollout time is needed whenever the
        # policy will have moved before a token is trained on, or for the pieces that read them.
        # Otherwise the single update's own forward gives them (the learner keeps them detached),
        # and a generator with its own weights has its mismatch measured from those.
        self.needs_old_logprobs = (
            algo.epochs > 1 or algo.mini_batches > 1 or algo.tis_cap is not None
            or algo.cov_penalty != "none" or algo.kl_reward_coef > 0
        )
        self.generator = build_generator(
            cfg.rollout, self.model, self.tokenizer, model_path=model_path, model_dtype=cfg.model.dtype,
            autocast_dtype=self.autocast_dtype, seed=cfg.trainer.seed,
        )
        self.separate_weights = bool(getattr(self.generator, "separate_weights", False))
        self.learner = Learner(
            self.model, cfg.learner, cfg.algorithm,
            temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens,
            autocast_dtype=self.autocast_dtype, reference_model=reference,
        )
        self.sampler = PromptSampler(len(self.train_examples), cfg.trainer.seed)
        self._prompt_cache: dict[str, list[int]] = {}
        self.start_step = 0
        self.nan_streak = 0
        if self.run_dir is None:
            self.run_dir = RunDir.create(cfg, name=cfg.tracking.run_name)
        if self._resume:
            self._restore()

    def _restore(self) -> None:
        ckpt = latest_checkpoint(self.run_dir.path)
        if ckpt is None:
            log.warning("no checkpoint in %s: starting from step 0", self.run_dir.path)
            self.run_dir.truncate_after(0)
            record_segment(self.run_dir, self.cfg, 0)
            return
        data = load_checkpoint(ckpt)
        self.learner.load_trainable_state_dict(data["weights"])
        if self.separate_weights:  # the engine started from the base weights
            self.generator.sync_weights(self.model)
        self.learner.optimizer.load_state_dict(data["optimizer"]["optimizer"])
        self.learner.scheduler.load_state_dict(data["optimizer"]["scheduler"])
        if self.critic is not None:
            self.critic.load_checkpoint_state(data["optimizer"]["critic"])
        # The optimiser state brings back the saved rates: an accepted new lr must win over it.
        apply_optimizer_settings(self.learner, self.cfg, critic=self.critic)
        set_rng_state(data["rng"])
        st = data["state"]
        self.sampler.load(st["sampler"])
        self.nan_streak = st.get("nan_streak", 0)
        self.start_step = st["step"]
        self.run_dir.truncate_after(self.start_step)
        record_segment(self.run_dir, self.cfg, self.start_step)  # segments.json, then config.yaml
        log.info("resumed %s from step %d", self.run_dir.path, self.start_step)

    def _checkpoint(self, step: int) -> None:
        optimizer_state = {
            "optimizer": self.learner.optimizer.state_dict(),
            "scheduler": self.learner.scheduler.state_dict(),
        }
        if self.critic is not None:
            optimizer_state["critic"] = self.critic.checkpoint_state()
        save_checkpoint(
            self.run_dir.path, step,
            weights=self.learner.trainable_state_dict(),
            optimizer_state=optimizer_state,
            trainer_state={"sampler": self.sampler.state(), "nan_streak": self.nan_streak},
            keep=self.cfg.trainer.keep_checkpoints,
        )

    def _encode(self, example) -> list[int]:
        ids = self._prompt_cache.get(example.id)
        if ids is None:
            ids = self._prompt_cache[example.id] = encode_prompt(self.tokenizer, example)
        return ids

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy answers on the held-out prompts; accuracy counts fully correct answers only."""
        summary, per_prompt = greedy_heldout_eval(  # shared with `reinforge eval`
            self.generator, self.reward_fn, self.eval_examples, self._encode,
            max_new_tokens=self.cfg.rollout.max_new_tokens, seed=self.cfg.trainer.seed,
        )
        self.run_dir.log_eval(step, summary, per_prompt)
        return summary

    # -- one step ----------------------------------------------------------------------------
    def _shape(self, rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Rewards plus DAPO's soft overlong punishment, when configured."""
        cfg = self.cfg
        if cfg.reward.overlong_buffer <= 0:
            return rewards
        buffer = max(1, round(cfg.reward.overlong_buffer * cfg.rollout.max_new_tokens))
        return rewards + soft_overlong_penalty(lengths, cfg.rollout.max_new_tokens, buffer, cfg.reward.overlong_penalty)

    def _sample_and_score(self, examples: list) -> tuple[RolloutBatch, list, torch.Tensor]:
        """Generate ``num_samples`` completions per example and score them. Returns the rollout,
        one RewardOutcome per row, and the verifiers' rewards (before length shaping)."""
        cfg = self.cfg
        rollout = self.generator.generate(
            [self._encode(e) for e in examples],
            SamplingParams(
                num_samples=cfg.rollout.num_samples, temperature=cfg.rollout.temperature,
                top_p=cfg.rollout.top_p, max_new_tokens=cfg.rollout.max_new_tokens,
            ),
        )
        outcomes = self.reward_fn(rollout.texts, [examples[int(g)] for g in rollout.group_index])
        return rollout, outcomes, torch.tensor([o.reward for o in outcomes], dtype=torch.float32)

    def _collect(self) -> tuple[RolloutBatch, list, list, torch.Tensor, dict[str, float]]:
        """The step's rollout: ``prompts_per_step`` groups. With dynamic sampling (DAPO), groups
        whose verifier rewards are all equal are dropped and more prompts are drawn, up to
        ``max_sampling_rounds`` rounds; if none is informative by then, the last round is used.
        The filter reads the verifiers' rewards before length shaping (for 0/1 rewards: DAPO's
        accuracy filter), so completions that differ only in length do not make a group count.
        Returns (rollout, group examples, row outcomes, shaped row rewards, sampling metrics)."""
        cfg = self.cfg
        need = cfg.trainer.prompts_per_step
        if not cfg.algorithm.dynamic_sampling:
            examples = [self.train_examples[i] for i in self.sampler.next(need)]
            rollout, outcomes, rewards = self._sample_and_score(examples)
            return rollout, examples, outcomes, self._shape(rewards, rollout.completion_lengths), {}
        parts: list[tuple[RolloutBatch, list, list, torch.Tensor]] = []
        kept = rounds = 0
        last = None
        while kept < need and rounds < cfg.algorithm.max_sampling_rounds:
            rounds += 1
            examples = [self.train_examples[i] for i in self.sampler.next(need)]
            rollout, outcomes, rewards = self._sample_and_score(examples)
            last = (rollout, examples, outcomes, rewards)
            good = informative_groups(rewards, rollout.group_index).nonzero().squeeze(1)[: need - kept]
            if len(good):
                rows = torch.isin(rollout.group_index, good).nonzero().squeeze(1)
                parts.append((rollout.select(rows), [examples[int(g)] for g in good],
                              [outcomes[int(r)] for r in rows], rewards[rows]))
                kept += len(good)
        info = {"sampling_rounds": float(rounds), "informative_groups": float(kept)}
        if not parts:
            rollout, examples, outcomes, rewards = last
        else:
            rollout = concat_rollouts([p[0] for p in parts], pad_id=self.generator.pad_id)
            examples, outcomes = [e for p in parts for e in p[1]], [o for p in parts for o in p[2]]
            rewards = torch.cat([p[3] for p in parts])
        return rollout, examples, outcomes, self._shape(rewards, rollout.completion_lengths), info

    def _greedy_baseline(self, examples: list) -> torch.Tensor:
        """[P] rewards of each prompt's greedy completion (ReMax's baseline), shaped like the
        samples' rewards."""
        rollout = self.generator.generate(
            [self._encode(e) for e in examples],
            SamplingParams(num_samples=1, max_new_tokens=self.cfg.rollout.max_new_tokens, greedy=True),
        )
        rewards = torch.tensor([o.reward for o in self.reward_fn(rollout.texts, examples)], dtype=torch.float32)
        return self._shape(rewards, rollout.completion_lengths)

    def _mini_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        n = self.cfg.algorithm.mini_batches
        groups = batch.rollout.group_index
        if n <= 1:
            return [batch]
        chunks = np.array_split(np.arange(batch.rollout.num_groups), min(n, batch.rollout.num_groups))
        return [batch.select(torch.isin(groups, torch.as_tensor(c)).nonzero().squeeze(1)) for c in chunks]

    def train_step(self, step: int) -> dict[str, float]:
        cfg, algo = self.cfg, self.cfg.algorithm
        t0 = time.perf_counter()
        rollout, group_examples, outcomes, rewards, extra = self._collect()
        t_gen = time.perf_counter()
        per_row_examples = [group_examples[int(g)] for g in rollout.group_index]
        mask = rollout.completion_mask
        old = self.learner.compute_logprobs(rollout) if self.needs_old_logprobs else None
        ref = self.learner.compute_logprobs(rollout, reference=True) if self.uses_reference else None
        if old is not None:
            weights, mismatch = truncated_importance_weights(old, rollout.sampler_logprobs, mask, algo.tis_cap or 1.0)
            extra.update(mismatch)
            if algo.tis_cap is None:
                weights = None
                extra.pop("tis_truncated_frac")
        else:
            weights = None
        token_kl = None
        if algo.kl_reward_coef > 0:
            token_kl = kl_penalty(old, ref, mask, algo.kl_reward_estimator)
            extra["kl_reward"] = float(token_kl[mask].mean()) if mask.any() else 0.0
        values = self.critic.values(rollout) if self.critic is not None else None
        baseline = self._greedy_baseline(group_examples) if algo.advantage == "remax" else None
        advantages, returns = compute_advantages(
            algo.advantage, rewards=rewards, group_index=rollout.group_index, mask=mask,
            scale=algo.scale_rewards, token_kl=token_kl, kl_coef=algo.kl_reward_coef,
            baseline_rewards=baseline, values=values,
            correct=torch.tensor([float(o.correct) for o in outcomes]),
            gamma=algo.gamma, lam=algo.lam, passk_k=algo.passk_k,
        )
        advantages = advantages.float()
        loss_mask = mask & ~rollout.truncated[:, None] if algo.overlong_filter else None
        batch = TrainBatch(
            rollout=rollout, advantages=advantages, old_logprobs=old, ref_logprobs=ref, loss_mask=loss_mask,
            is_weights=weights, returns=None if returns is None else returns.float(), old_values=values,
        )
        updates: list[dict[str, float]] = []
        critic_only = self.critic is not None and step <= cfg.critic.warmup_steps
        for epoch in range(algo.epochs):
            for i, mb in enumerate(self._mini_batches(batch)):
                if epoch == 0 and i == 0 and mb.old_logprobs is not None:
                    # The first update sees fresh samples: the current log-probs (detached) are the
                    # old ones exactly, while a separate forward pass would differ by rounding.
                    mb = dataclasses.replace(mb, old_logprobs=None)
                stats = {} if critic_only else self.learner.step(mb)
                if self.critic is not None:
                    stats = {**stats, **self.critic.step(mb)}
                updates.append(stats)
        stats = {k: float(np.mean([u[k] for u in updates])) for k in updates[0]} if updates[0] else {}
        if "ratio_max" in stats:
            stats["ratio_max"] = max(u["ratio_max"] for u in updates)
        if "skipped" in stats:  # the NaN guard counts a step as skipped if any of its updates was
            stats["skipped"] = max(u["skipped"] for u in updates)
        else:
            stats["skipped"] = 0.0
        if old is None and self.separate_weights and not critic_only and not stats["skipped"]:
            # One update on fresh samples: its forward pass gave the learner's log-probs.
            _, mismatch = truncated_importance_weights(
                self.learner.last_fresh_logprobs, rollout.sampler_logprobs, mask, 1.0
            )
            mismatch.pop("tis_truncated_frac")
            extra.update(mismatch)
        if self.separate_weights and step % cfg.rollout.sync_every == 0:
            t_sync = time.perf_counter()
            self.generator.sync_weights(self.model)  # in memory, no restart
            stats["time_weight_sync"] = time.perf_counter() - t_sync
        t_end = time.perf_counter()

        lengths = rollout.completion_lengths.float()
        n_tokens = float(lengths.sum())
        grouped_min = torch.full((rollout.num_groups,), torch.inf).scatter_reduce(0, rollout.group_index, rewards, "amin")
        grouped_max = torch.full((rollout.num_groups,), -torch.inf).scatter_reduce(0, rollout.group_index, rewards, "amax")
        adv_tok = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(mask)
        metrics = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            "accuracy": float(np.mean([o.correct for o in outcomes])),
            "uniform_group_frac": float((grouped_max == grouped_min).float().mean()),
            "advantage_abs_mean": float(adv_tok[mask].abs().mean()) if mask.any() else 0.0,
            "completion_length": float(lengths.mean()),
            "truncated_frac": float(rollout.truncated.float().mean()),
            "reward_errors": float(sum(len(o.errors) for o in outcomes)),
            "generated_tokens": n_tokens,
            "tokens_per_s": n_tokens / max(t_end - t0, 1e-9),
            "time_generate": t_gen - t0,
            "time_step": t_end - t0,
            **{f"reward/{k}": float(np.mean([o.components.get(k, 0.0) for o in outcomes]))
               for k in (outcomes[0].components if outcomes else {})},
            **extra,
            **stats,
        }
        k = min(cfg.trainer.samples_to_log, len(rollout))
        if k:
            rows = []
            for i in range(k):
                o = outcomes[i]
                e = per_row_examples[i]
                a = advantages[i]
                rows.append({"prompt_id": e.id, "answer": e.answer, "completion": rollout.texts[i],
                             "reward": float(rewards[i]), "correct": o.correct,
                             "advantage": float(a if a.dim() == 0 else a[mask[i]].mean() if mask[i].any() else 0.0),
                             "errors": o.errors})
            self.run_dir.log_samples(step, rows)
        return metrics

    # -- the loop ----------------------------------------------------------------------------
    def _on_sigint(self, signum, frame):  # pragma: no cover - exercised by the CLI test in a subprocess
        if self._stop_requested:
            raise KeyboardInterrupt
        self._stop_requested = True
        print("\nreinforge: stopping after this step and writing a checkpoint (Ctrl-C again to abort now)",
              file=sys.stderr)

    def run(self) -> RunResult:
        """Train. The run directory's writer lock is held throughout: a second writer is refused
        before anything loads, and a resume's config changes are checked and printed first."""
        if self.run_dir is not None:
            self.run_dir.acquire_writer()  # a new run's directory is created with the lock held
        try:
            if self._resume:
                plan_resume(self.run_dir, self.cfg, new_segment=self._new_segment)
            return self._run()
        finally:
            if self.run_dir is not None:
                self.run_dir.release_writer()

    def _run(self) -> RunResult:
        self._setup()
        cfg = self.cfg
        rd = self.run_dir
        rd.set_status("running")
        old_handler = None
        try:
            old_handler = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not in the main thread
            pass
        started = time.perf_counter()
        step = self.start_step
        last_eval: dict[str, float] = {}
        try:
            with Progress(total=cfg.trainer.steps, start=self.start_step, enabled=cfg.tracking.progress) as bar:
                if cfg.trainer.eval_at_start and 0 not in rd.eval_steps():
                    last_eval = self.evaluate(0)
                    bar.update(self.start_step, eval=last_eval)
                for step in range(self.start_step + 1, cfg.trainer.steps + 1):
                    metrics = self.train_step(step)
                    if step == self.stop_after_step:  # `reinforge reproduce` replaying a segment
                        self._stop_requested = True
                    if metrics["skipped"]:
                        self.nan_streak += 1
                        log.warning("step %d: non-finite loss or gradient, update skipped (%d in a row)",
                                    step, self.nan_streak)
                    else:
                        self.nan_streak = 0
                    rd.log_metrics(step, metrics)
                    if self.nan_streak >= cfg.trainer.max_consecutive_nan:
                        rd.set_status("failed", reason=f"{self.nan_streak} non-finite losses in a row at step {step}")
                        raise FloatingPointError(
                            f"{self.nan_streak} consecutive non-finite losses (step {step}); the last "
                            f"checkpoint in {rd.path / 'checkpoints'} is intact. Lower learner.lr or "
                            "raise learner.grad_clip's strictness, then resume."
                        )
                    is_last = step == cfg.trainer.steps
                    if is_last or (cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0):
                        last_eval = self.evaluate(step)
                    if is_last or self._stop_requested or (
                        cfg.trainer.checkpoint_every and step % cfg.trainer.checkpoint_every == 0
                    ):
                        self._checkpoint(step)
                    bar.update(step, metrics=metrics, eval=last_eval)
                    if self._stop_requested and not is_last:
                        raise StopRequested
        except (KeyboardInterrupt, StopRequested):
            rd.set_status("interrupted", step=step,
                          resume=f"reinforge train --resume {rd.path}")
            print(f"reinforge: interrupted. Resume with: reinforge train --resume {rd.path}", file=sys.stderr)
            return RunResult(rd.path, step)
        except Exception as err:
            if rd.status().get("state") != "failed":
                rd.set_status("failed", reason=f"{type(err).__name__}: {err}", step=step)
            raise
        finally:
            if old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
        self._save_final_model()
        summary = write_run_summary(rd, recipe=cfg.recipe, task_name=self.task.name, model_path=cfg.model.path,
                                    seed=cfg.trainer.seed, wall_time=time.perf_counter() - started)
        plot_learning_curves(rd)
        rd.set_status("finished", step=step)
        return RunResult(rd.path, step, summary)

    def _save_final_model(self) -> None:
        target = self.run_dir.path / "final_model"
        tmp = self.run_dir.path / ".tmp-final_model"
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
