"""The controller loop. A step reads as the algorithm, in named phases:

    collect  the curriculum picks prompts; the generator samples trajectories
    score    the reward function scores them (and shapes by length); the curriculum keeps groups,
             and collect/score repeat while it wants more (dynamic sampling)
    prepare  what the algorithm's components declare they need: old and reference log-probs,
             importance weights, critic values, ReMax's greedy baseline; then the advantages
    update   the learner's optimiser steps over epochs x mini-batches
    sync     the generator gets the new weights (a state dict and a version)
    log      metrics and samples into the run directory

Each phase is a method with a typed result, and is timed as ``time_<phase>`` in the metrics. This
is the one place that knows every part.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..agents import build_agent, build_run_task
from ..algorithms import (
    AdvantageInputs,
    compute_advantages,
    kl_penalty,
    mismatch_stats,
    needs_of,
    off_policy_correction,
)
from ..batch import TrainBatch
from ..config import RunConfig
from ..curriculum import build_curriculum
from ..evaluation.guardrails import Guardrails
from ..evaluation.runner import generate_and_score, greedy_heldout_eval
from ..experience import LocalExperienceSource, PhaseTimer, Scored
from ..learner.build import build_learner
from ..learner.memory import check_memory
from ..lifecycle.checkpoint import (
    rng_state,
)
from ..lifecycle.progress import EvalProgress, Progress
from ..lifecycle.resume import ResumePlan, plan_resume
from ..lifecycle.stopping import StartupInterrupted, StepAbandoned, StopControl
from ..lifecycle.summary import write_run_summary
from ..models import (
    load_tokenizer,
    resolve_device,
    resolve_model_path,
    resolve_precision,
)
from ..rewards import build_reward
from ..rewards.models.guard import RewardHackingGuard
from ..rollout import SamplingParams, build_generator
from ..rollout.context import fit_prompts
from ..tasks import Example, encode_prompt
from ..tracking import RunDir
from ..tracking.curves import plot_learning_curves
from ..tracking.location import check_new_run_location
from .outcome import RunResult, failed, interrupted, non_finite_stopped, startup_interrupted
from .state import checkpoint, restore, save_final_model
from .step_log import step_metrics

log = logging.getLogger("reinforge")


class StopRequested(Exception):
    pass


@dataclass
class Prepared:
    """The prepare phase: the learner's batch, and what it measured on the way (sampler/learner
    log-prob mismatch, KL-in-reward)."""

    batch: TrainBatch
    info: dict[str, float] = field(default_factory=dict)


class Trainer:
    def __init__(self, config: RunConfig, *, run_dir: RunDir | None = None, resume: bool = False,
                 new_segment: bool = False):
        """``resume``: continue ``run_dir`` from its latest checkpoint under ``config``; a change
        that alters what a step computes needs ``new_segment`` (reinforge/lifecycle/resume.py)."""
        self.cfg = config
        self._resume = resume
        self._new_segment = new_segment
        self.run_dir = run_dir
        self._stop_requested = False
        self.stop_after_step: int | None = None  # stop as Ctrl-C does once this step is checkpointed
        # The SFT stage (config `sft:`) runs before RL and gives the weights RL starts from.
        self.init_model_path: Path | None = None
        self.sft_stop_after_step: int | None = None
        self._plan: ResumePlan | None = None      # the resume's checked plan (its intact checkpoint)
        self._stop = StopControl(config.trainer.stop_grace_s)
        self.precision: dict | None = None  # how model.dtype was chosen (set when the run starts)
        self._bar: Progress | None = None

    # -- setup -------------------------------------------------------------------------------
    def _resolve_precision(self) -> None:
        """``model.dtype=auto`` becomes the dtype this hardware computes fastest, before anything
        reads it (the run directory's config.yaml records the result, so a resume keeps it)."""
        if self.cfg.trainer.num_threads:  # (the probe's fp32/bf16 ratio depends on the threads)
            torch.set_num_threads(self.cfg.trainer.num_threads)
        self.cfg, choice = resolve_precision(self.cfg, resolve_device(self.cfg.model.device))
        self.precision = choice.to_dict()

    def _setup(self) -> None:
        if self.precision is None:  # (run() resolves it first; a caller of _setup alone gets it here)
            self._resolve_precision()
        cfg = self.cfg
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        torch.manual_seed(cfg.trainer.seed)
        np.random.seed(cfg.trainer.seed % 2**32)
        random.seed(cfg.trainer.seed)
        # Cheap failures first: the task, the device and the model path are checked before any
        # weights load.
        self.task = build_run_task(cfg)  # an environment may make its own examples (task.source: env)
        # The curriculum may train on a task made of several (difficulty levels, a mixture).
        self.curriculum = build_curriculum(cfg, self.task)
        self.task = self.curriculum.task
        self.train_examples = self.task.train_examples()
        eval_examples = self.task.eval_examples()
        if cfg.trainer.eval_max_prompts is not None:
            eval_examples = eval_examples[: cfg.trainer.eval_max_prompts]
        self.eval_examples = list(eval_examples)
        self.device = resolve_device(cfg.model.device)
        model_path = self.init_model_path or resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(model_path)
        # Reward models load on the learner's device and place token rewards on the policy's tokens.
        # (an agent's length shaping counts against its whole trajectory's budget)
        self.reward_fn = build_reward(cfg.reward, self.task,
                                      max_new_tokens=cfg.env.max_tokens if cfg.env else cfg.rollout.max_new_tokens,
                                      device=self.device, policy_tokenizer=self.tokenizer)
        rm_keys = self.reward_fn.reward_model_keys
        self.hacking_guard = (RewardHackingGuard(rm_keys, **cfg.reward.hacking_guard.model_dump(exclude={"enabled"}))
                              if rm_keys and cfg.reward.hacking_guard.enabled else None)
        self.guardrails = Guardrails.build(self.task, self.reward_fn, cfg.reward, seed=cfg.trainer.seed,
                                           max_turns=cfg.env.max_turns if cfg.env else None)
        # Memory guard: estimate the peak from the config before any weights load; warn naming the
        # setting to change when it will not fit (reinforge/learner/memory.py).
        # Every prompt is encoded once, into the cache the steps read, and checked against the
        # model's context (refused, or cut with task.truncate_prompts=left) before weights load.
        self._prompt_cache: dict[str, list[int]] = {}
        prompt_tokens = fit_prompts(cfg, model_path, self.tokenizer, {"training": self.train_examples, "held-out":
                                    self.eval_examples}, self._prompt_cache).longest_train
        check_memory(cfg, model_path, prompt_tokens=prompt_tokens, device=str(self.device))
        # What the algorithm's components declare they need (algorithms.needs_of): which models to
        # load here, which forwards and generations to run each step.
        self.needs = needs_of(cfg.algorithm)
        self.learner = build_learner(cfg, model_path, self.device)
        self.model = self.learner.model
        self.autocast_dtype = self.learner.autocast_dtype
        self.generator = build_generator(
            cfg.rollout, self.model, self.tokenizer, model_path=model_path, model_dtype=cfg.model.dtype,
            autocast_dtype=self.autocast_dtype, seed=cfg.trainer.seed,
        )
        if cfg.env is not None:  # multi-turn: trajectories from an environment (docs/agents.md)
            # A frozen opponent (env.options.opponent: frozen) decodes with the KL reference's
            # weights when there is one (the same step-0 weights), else a copy loaded for it.
            self.generator, self.reward_fn = build_agent(cfg, self.generator, self.reward_fn, self.task,
                                                         frozen_model=self.learner.reference_model,
                                                         model_path=model_path)
        self.local = LocalExperienceSource(
            examples=self.train_examples, encode=self._encode, generator=self.generator, reward_fn=self.reward_fn,
            curriculum=self.curriculum, sampling=SamplingParams.from_rollout(cfg.rollout),
            prompts_per_step=cfg.trainer.prompts_per_step, seed=cfg.trainer.seed, agent=cfg.env is not None,
        )
        self.start_step = 0
        self.nan_streak = 0
        if self.run_dir is None:
            self.run_dir = RunDir.create(cfg, name=cfg.tracking.run_name, precision=self.precision)
        # Where a step's scored groups come from: this process (``self.local``), or rollout workers
        # elsewhere (scale.mode=ray: reinforge/scale/), which get the weights through ``sync``.
        self.source = None
        if cfg.scale.mode == "ray":
            from ..scale import build_experience_source

            self.source = build_experience_source(self)
        if self._resume:
            restore(self)
        if cfg.scale.learners > 1:  # the other ranks start from this (restored) learner's state
            from ..scale.learner_group import LearnerGroup

            self.learner = LearnerGroup.start(self.learner, cfg, model_path, self.device)

    def _encode(self, example) -> list[int]:
        ids = self._prompt_cache.get(example.id)
        if ids is None:
            ids = self._prompt_cache[example.id] = encode_prompt(self.tokenizer, example)
        return ids

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy answers on the held-out prompts; accuracy counts fully correct answers only.
        Abandonable (nothing is written until it ends): a stop past its grace period raises
        StepAbandoned, and a resume evaluates that step again."""
        t0 = time.perf_counter()
        bar = self._bar
        progress = None
        if bar is not None and bar.enabled:
            label = f"held-out evaluation at step {step}"
            bar.say(f"reinforge: {label}: {len(self.eval_examples)} prompts, greedy")
            progress = EvalProgress(bar.say, label)
        with self._stop.abandonable():
            summary, per_prompt = greedy_heldout_eval(  # shared with `reinforge eval`
                self.generator, self.reward_fn, self.eval_examples, self._encode,
                max_new_tokens=self.cfg.rollout.max_new_tokens, seed=self.cfg.trainer.seed,
                guardrails=self.guardrails, progress=progress,
            )
        self.run_dir.log_eval(step, summary, per_prompt)
        if bar is not None:
            bar.evaluated(time.perf_counter() - t0)
        return summary

    def _is_eval_step(self, step: int) -> bool:
        t = self.cfg.trainer
        if step == 0:
            return t.eval_at_start
        return step == t.steps or bool(t.eval_every and step % t.eval_every == 0)

    # -- the phases of one step --------------------------------------------------------------
    def prepare(self, scored: Scored) -> Prepared:
        """Everything the update needs, as the algorithm's components declare it."""
        algo, needs = self.cfg.algorithm, self.needs
        rollout = scored.rollout
        actions = rollout.action_mask
        info: dict[str, float] = {}
        # Without a rollout-time forward (needs.old_logprobs) the single update's own forward gives
        # the old log-probs, and a generator with its own weights has its mismatch measured from those.
        old_logprobs = self.learner.compute_logprobs(rollout) if needs.old_logprobs else None
        ref_logprobs = self.learner.compute_logprobs(rollout, reference=True) if needs.reference else None
        is_weights = None
        if old_logprobs is not None:  # the proximal log-probs: off-policy correction (algorithms/off_policy.py)
            correction = off_policy_correction(
                algo.off_policy, old_logprobs, rollout.sampler_logprobs, actions, tis_cap=algo.tis_cap,
                tis_level=algo.tis_level, icepop_band=tuple(algo.icepop_band), decoupled_cap=algo.decoupled_cap,
            )
            is_weights = correction.weights
            info.update(correction.stats)
        token_kl = None
        if algo.kl_reward_coef > 0:
            token_kl = kl_penalty(old_logprobs, ref_logprobs, actions, algo.kl_reward_estimator)
            info["kl_reward"] = float(token_kl[actions].mean()) if actions.any() else 0.0
        values = self.learner.values(rollout) if needs.critic else None
        baseline = self._greedy_baseline(scored.examples) if needs.greedy_baseline else None
        scores = scored.scores
        advantages, returns = compute_advantages(algo.advantage, AdvantageInputs(
            rewards=scores.shaped, group_index=rollout.group_index, mask=actions,
            token_rewards=scores.token_rewards, token_kl=token_kl, kl_coef=algo.kl_reward_coef,
            baseline_rewards=baseline, values=values, correct=scores.correct if needs.correctness else None,
            scale=algo.scale_rewards, gamma=algo.gamma, lam=algo.lam, passk_k=algo.passk_k,
        ))
        loss_mask = actions & ~rollout.truncated[:, None] if algo.overlong_filter else None
        batch = TrainBatch(
            rollout=rollout, advantages=advantages.float(), old_logprobs=old_logprobs, ref_logprobs=ref_logprobs,
            loss_mask=loss_mask, is_weights=is_weights, returns=None if returns is None else returns.float(),
            old_values=values,
        )
        return Prepared(batch, info)

    def _greedy_baseline(self, examples: list[Example]) -> torch.Tensor:
        """[P] shaped rewards of each prompt's greedy completion (ReMax's baseline), shaped like
        the samples' rewards."""
        params = SamplingParams(num_samples=1, max_new_tokens=self.cfg.rollout.max_new_tokens, greedy=True)
        _, scores = generate_and_score(self.generator, self.reward_fn, examples, self._encode, params)
        return scores.shaped

    def _mini_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        n = self.cfg.algorithm.mini_batches
        groups = batch.rollout.group_index
        if n <= 1:
            return [batch]
        chunks = np.array_split(np.arange(batch.rollout.num_groups), min(n, batch.rollout.num_groups))
        return [batch.select(torch.isin(groups, torch.as_tensor(c)).nonzero().squeeze(1)) for c in chunks]

    def update(self, prepared: Prepared, step: int) -> dict[str, float]:
        """``algorithm.epochs`` passes of ``algorithm.mini_batches`` learner updates; the stats
        averaged over updates (``ratio_max`` and ``skipped``: their max)."""
        algo, batch = self.cfg.algorithm, prepared.batch
        critic_only = self.needs.critic and step <= self.cfg.critic.critic_only_steps
        updates: list[dict[str, float]] = []
        for epoch in range(algo.epochs):
            for i, mb in enumerate(self._mini_batches(batch)):
                if epoch == 0 and i == 0 and mb.old_logprobs is not None:
                    # The first update sees fresh samples: the current log-probs (detached) are the
                    # old ones exactly, while a separate forward pass would differ by rounding.
                    mb = dataclasses.replace(mb, old_logprobs=None)
                # Until the first optimiser step nothing is applied: a stop past its grace period
                # abandons the step between two micro-batches (one process; ranks of a
                # data-parallel learner must finish their collectives together).
                first = epoch == 0 and i == 0 and not critic_only and self.cfg.scale.learners == 1
                self.learner.before_micro_batch = self._stop.check_abandon if first else None
                try:
                    updates.append(self.learner.update(mb, train_policy=not critic_only))
                finally:
                    self.learner.before_micro_batch = None
        # (an update whose rows all had advantage 0 ran nothing and reports no entropy or ratio)
        keys = list(dict.fromkeys(k for u in updates for k in u))
        stats = {k: float(np.mean([u[k] for u in updates if k in u])) for k in keys}
        if "ratio_max" in stats:
            stats["ratio_max"] = max(u["ratio_max"] for u in updates if "ratio_max" in u)
        # The NaN guard counts a step as skipped if any of its updates was.
        stats["skipped"] = max(u["skipped"] for u in updates) if "skipped" in stats else 0.0
        rollout = batch.rollout
        sampler_has_own_weights = self.generator.needs_sync or self.source is not None
        if batch.old_logprobs is None and sampler_has_own_weights and not critic_only and not stats["skipped"]:
            # One update on fresh samples: its forward pass gave the learner's log-probs.
            # (over the rows the update ran: learner.skip_zero_advantage leaves some out)
            ran = self.learner.last_fresh_rows
            mask = rollout.action_mask if ran is None else rollout.action_mask & ran[:, None]
            stats.update(mismatch_stats(self.learner.last_fresh_logprobs, rollout.sampler_logprobs, mask))
        return stats

    def sync(self, step: int) -> None:
        """Give the generator the weights after ``step`` (every ``rollout.sync_every`` steps for a
        generator with its own copy; one that samples from the live model is always current)."""
        has_own_weights = self.generator.needs_sync or self.source is not None
        if not has_own_weights or step % self.cfg.rollout.sync_every == 0:
            self._sync_generator(step)

    def _sync_generator(self, version: int) -> None:
        # A generator without its own copy samples from the learner's live module: it only
        # records the version, so the weights are not copied for it.
        state = self.learner.policy_state_dict() if self.generator.needs_sync or self.source is not None else {}
        self.generator.sync_weights(state, version)
        if self.source is not None:  # rollout workers: through Ray's object store
            self.source.publish(state, version)

    def log(self, step: int, scored: Scored, prepared: Prepared, stats: dict[str, float], timer: PhaseTimer) -> dict[str, float]:
        """The step's metrics, and its first ``trainer.samples_to_log`` samples into the run
        (trainer/step_log.py)."""
        return step_metrics(self, step, scored, prepared, stats, timer)

    def train_step(self, step: int) -> dict[str, float]:
        timer = PhaseTimer()
        with self._stop.abandonable():       # past the stop grace period, undone (lifecycle/stopping.py)
            # rollout workers elsewhere (streamed, scored there), or collect + score here, as often
            # as the curriculum asks
            scored = (self.source if self.source is not None else self.local).gather(step, timer)
            with timer("prepare"):
                prepared = self.prepare(scored)
        with timer("update"):
            stats = self.update(prepared, step)
            if self.source is None and hasattr(self.reward_fn, "learn"):
                # reward models that learn online (PRIME) step on the batch just trained on; here,
                # not while scoring, so an abandoned step leaves them as they were
                self.reward_fn.learn(scored.rollout, scored.row_examples, scored.scores.outcomes)
        with timer("sync"):
            self.sync(step)
        t_log = time.perf_counter()
        metrics = self.log(step, scored, prepared, stats, timer)
        metrics["time_log"] = time.perf_counter() - t_log
        return metrics

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Train. The run directory's writer lock is held throughout: a second writer is refused
        before anything loads, and a resume's config changes are checked and printed first.
        Ctrl-C, SIGTERM and SIGHUP stop the run as lifecycle/stopping.py says; whatever ends it, status.json
        says how (finished, interrupted with the resume command, or failed with the reason)."""
        if self.run_dir is not None:
            self.run_dir.acquire_writer()  # a new run's directory is created with the lock held
        elif not self._resume:  # where it will be created: refused now, not after the model loaded
            check_new_run_location(self.cfg.tracking.output_dir, self.cfg.tracking.run_name)
        try:
            with self._stop.installed():
                try:
                    self._resolve_precision()
                    if self._resume:
                        self._plan = plan_resume(self.run_dir, self.cfg, new_segment=self._new_segment)
                    if self.cfg.sft is not None:  # the warm start before RL (reinforge/sft/stage.py)
                        from ..sft.stage import run_warm_start

                        self.init_model_path = run_warm_start(self)
                        if self.init_model_path is None:  # the SFT stage was interrupted
                            return RunResult(self.run_dir.path, 0, stopped_by=self.run_dir.status().get("signal"))
                    return self._run()
                except StartupInterrupted as stop:
                    startup_interrupted(self, stop)
                except KeyboardInterrupt:  # a second signal after the last step (final model, summary)
                    return interrupted(self, self.cfg.trainer.steps)
                except Exception as err:
                    reported = failed(self, err)
                    if reported is err:
                        raise
                    raise reported from err
        finally:
            # the workers, then this process's generator (a vLLM engine's KV cache, the bf16 copy,
            # an agent loop's tool threads), then the learner ranks: a sweep runs many trainers in
            # one process
            try:
                for held in (getattr(self, "source", None), getattr(self, "generator", None),
                             getattr(self, "learner", None)):
                    if held is not None and hasattr(held, "close"):
                        try:
                            held.close()
                        except Exception as err:  # noqa: BLE001 - never mask how the run ended
                            log.warning("closing %s failed: %s", type(held).__name__, err)
            finally:
                if self.run_dir is not None:
                    self.run_dir.release_writer()

    def _run(self) -> RunResult:
        self._setup()
        cfg = self.cfg
        rd = self.run_dir
        rd.set_status("running")
        self._stop.steps_begin()  # from here a first stop signal stops after the step under way
        started = time.perf_counter()
        step = self.start_step
        checkpointed = self.start_step if self._resume else 0
        last_eval: dict[str, float] = {}
        try:
            evals_left = lambda s: sum(self._is_eval_step(k) for k in range(s + 1, cfg.trainer.steps + 1))  # noqa: E731
            with Progress(total=cfg.trainer.steps, start=self.start_step, enabled=cfg.tracking.progress,
                          evals_left=evals_left) as bar:
                self._bar = bar
                # The start's evaluation, or one a stop abandoned after the checkpointed step.
                if self._is_eval_step(self.start_step) and self.start_step not in rd.eval_steps():
                    try:
                        last_eval = self.evaluate(self.start_step)
                    except StepAbandoned:
                        raise StopRequested from None
                    bar.update(self.start_step, eval=last_eval)
                for step in range(self.start_step + 1, cfg.trainer.steps + 1):
                    if self._stop.requested:  # came during the first evaluation: no step begun
                        step -= 1
                        raise StopRequested
                    # What an abandoned step changed besides the weights, to put back (stopping.py).
                    step_start = (rng_state(), copy.deepcopy(self.curriculum.state_dict()))
                    try:
                        metrics = self.train_step(step)
                    except StepAbandoned:
                        print(f"reinforge: step {step} was still running after the {cfg.trainer.stop_grace_s:g} s "
                              "grace period: abandoned, it is redone on resume", file=sys.stderr)
                        step -= 1
                        if step > checkpointed:
                            checkpoint(self, step, start_of_next=step_start)
                        raise StopRequested from None
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
                        raise non_finite_stopped(self, step)  # says which checkpoint exists, if any
                    is_last = step == cfg.trainer.steps
                    if self._is_eval_step(step):
                        try:
                            last_eval = self.evaluate(step)
                        except StepAbandoned:  # the step stands; its evaluation is made on resume
                            print(f"reinforge: the evaluation of step {step} was still running after the "
                                  f"{cfg.trainer.stop_grace_s:g} s grace period: abandoned, it is made on "
                                  "resume", file=sys.stderr)
                            checkpoint(self, step)
                            raise StopRequested from None
                    stopping = self._stop_requested or self._stop.requested
                    if is_last or stopping or (
                        cfg.trainer.checkpoint_every and step % cfg.trainer.checkpoint_every == 0
                    ):
                        checkpoint(self, step)
                        checkpointed = step
                    bar.update(step, metrics=metrics, eval=last_eval)
                    if stopping and not is_last:
                        raise StopRequested
        except (KeyboardInterrupt, StopRequested):
            return interrupted(self, step)
        save_final_model(self)
        summary = write_run_summary(rd, recipe=cfg.recipe, task_name=self.task.name, model_path=cfg.model.path,
                                    seed=cfg.trainer.seed, wall_time=time.perf_counter() - started)
        if self.init_model_path is not None:  # say what the SFT stage did before RL's step 0
            from ..sft.stage import add_warm_start_to_summary

            summary = add_warm_start_to_summary(rd)
        plot_learning_curves(rd)
        rd.set_status("finished", step=step)
        return RunResult(rd.path, step, summary)
