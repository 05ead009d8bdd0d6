"""One optimisation step on a batch: forward, loss from ``algorithms``, backward, clip, step.

The learner never branches on a recipe's name; what it computes is fixed by the algorithm config's
components (advantage already in the batch, policy loss, loss aggregation mode, clip ranges, KL
and entropy terms, covariance penalty, importance weights in the batch). It owns the policy's
optimiser and scheduler and, for PPO, the critic; ``state_dict``/``load_state_dict`` carry all of
them, which is what checkpoints save and resume restores. Every loss term lives on the batch's
action mask: tokens the model did not write (tool output) are context only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from ..algorithms import (
    aggregate_loss,
    apply_cov_penalty,
    clip_cov_candidates,
    covariance_token_selection,
    entropy_from_logits,
    is_advantage_weighted,
    kl_penalty,
    policy_loss,
    policy_loss_options,
)
from ..batch import RolloutBatch, TrainBatch
from ..config import AlgorithmConfig, LearnerConfig
from ..models import autocast, merged_state_dict, model_device
from .forward import (
    MicroInputs,
    body_and_head,
    chunked_token_logprobs,
    guarded_step,
    micro_inputs,
    plan_micro_batches,
    shared_prefix_hidden,
    shared_prefix_logits,
)
from .optim import adamw, apply_settings, warmup_schedule


class Learner:
    """Owns the optimiser of ``model`` (and the ``critic``, when PPO has one). ``temperature`` is
    the sampling temperature: log-probs are computed from logits / temperature, the distribution
    the completions were drawn from. Computes on the model's device; batches arrive on the CPU
    and results return there."""

    def __init__(
        self,
        model,
        cfg: LearnerConfig,
        algo: AlgorithmConfig,
        *,
        temperature: float = 1.0,
        max_new_tokens: int = 1,
        autocast_dtype: torch.dtype | None = None,
        reference_model=None,
        critic=None,
        data_parallel=None,
    ):
        """``data_parallel``: a ``scale.data_parallel.DataParallel`` when this learner is one rank
        of several: each rank takes its share of the micro-batches and the gradients are summed
        before the step, so every rank applies the one-process update."""
        if data_parallel is not None and critic is not None:
            raise ValueError("the data-parallel learner trains the policy only: PPO's critic (advantage=gae) "
                             "needs a single learner process")
        self.data_parallel = data_parallel
        self.model = model
        self.device = model_device(model)
        self.critic = critic
        self.cfg = cfg
        self.algo = algo
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.autocast_dtype = autocast_dtype
        self.reference_model = reference_model
        self.last_fresh_logprobs: torch.Tensor | None = None
        self.last_fresh_rows: torch.Tensor | None = None  # [N] bool: the rows last_fresh_logprobs holds
        self.last_cov_selected: torch.Tensor | None = None  # [N, T] bool: Clip-Cov/KL-Cov's tokens, last step
        # Called before each micro-batch of ``step`` (nothing is applied until its optimiser step):
        # the trainer's stop control raises there to abandon the update within one micro-batch.
        self.before_micro_batch: Callable[[], None] | None = None
        # A KV cache cannot be kept under activation checkpointing, so sharing is off there.
        checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.x name
        if checkpointing is None:
            checkpointing = getattr(model, "is_gradient_checkpointing", False)
        self.share_prefix = cfg.share_prompt_prefix and not checkpointing
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = adamw(self.params, cfg.lr, cfg.betas, cfg.weight_decay)
        self.scheduler = warmup_schedule(self.optimizer, cfg.lr_warmup_steps)

    # -- log-probs ---------------------------------------------------------------------------
    def _autocast(self):
        return autocast(self.device, self.autocast_dtype)

    def _inputs(self, rollout: RolloutBatch, rows: torch.Tensor) -> MicroInputs:
        return micro_inputs(rollout, rows, share_prefix=self.share_prefix, device=self.device)

    def _logits(self, model, mi: MicroInputs) -> torch.Tensor:
        """[n, cw, V] float32 logits / temperature predicting each completion token (the plain,
        unchunked path: ``learner.logits_chunk_tokens=0`` or a model without a separable head)."""
        cw = mi.completion_ids.shape[1]
        with self._autocast():
            if mi.prompt_rows is not None:
                logits = shared_prefix_logits(model, mi)
            else:
                # Only the logits that predict completion tokens are computed (not the prompt's):
                # the last cw+1 positions, minus the final one, which predicts past the end.
                logits = model(
                    input_ids=mi.input_ids,
                    attention_mask=mi.attention_mask,
                    position_ids=mi.position_ids,
                    logits_to_keep=cw + 1,
                    use_cache=False,
                ).logits[:, :-1]
        return logits.float() / self.temperature

    def _hidden(self, body, mi: MicroInputs) -> torch.Tensor:
        """[n, cw, H] final hidden states at the positions predicting each completion token."""
        cw = mi.completion_ids.shape[1]
        if mi.prompt_rows is not None:
            return shared_prefix_hidden(body, mi)
        hidden = body(
            input_ids=mi.input_ids,
            attention_mask=mi.attention_mask,
            position_ids=mi.position_ids,
            use_cache=False,
        ).last_hidden_state
        return hidden[:, -(cw + 1) : -1]

    def _token_logprobs(self, model, mi: MicroInputs, *, entropy: str = "none"):
        """[n, cw] log-probs of the model's own tokens (0 elsewhere: padding and observations).
        With ``entropy`` "grad" or "detached", also the per-token entropy of the sampling
        distribution there.

        By default the decoder body gives the final hidden states and the LM head is applied
        ``learner.logits_chunk_tokens`` positions at a time (``chunked_token_logprobs``): the
        [n, cw, V] float32 logits, their softmax and their gradient are never held for the whole
        micro-batch. Values and gradients equal the plain path's."""
        parts = body_and_head(model) if self.cfg.logits_chunk_tokens > 0 else None
        if parts is None or not mi.action_mask.any():  # (no action token: keep a graph for backward)
            return self._token_logprobs_plain(model, mi, entropy=entropy)
        body, head = parts
        mask = mi.action_mask
        with self._autocast():
            hidden = self._hidden(body, mi)
            # Only the model's own tokens go through the head: padding and observations cost nothing.
            sel = mask.nonzero(as_tuple=True)
            lp, ent = chunked_token_logprobs(
                head, hidden[sel], mi.completion_ids[sel], temperature=self.temperature,
                chunk_tokens=self.cfg.logits_chunk_tokens, entropy=entropy != "none",
            )
        logprobs = hidden.new_zeros(mask.shape, dtype=torch.float32).index_put(sel, lp)
        if entropy == "none":
            return logprobs
        if entropy == "detached":
            ent = ent.detach()
        return logprobs, hidden.new_zeros(mask.shape, dtype=torch.float32).index_put(sel, ent)

    def _token_logprobs_plain(self, model, mi: MicroInputs, *, entropy: str = "none"):
        """``_token_logprobs`` from the whole micro-batch's [n, cw, V] logits at once."""
        logits = self._logits(model, mi)
        picked = logits.gather(2, mi.completion_ids[:, :, None]).squeeze(2)
        logprobs = (picked - torch.logsumexp(logits, dim=-1)).masked_fill(~mi.action_mask, 0.0)
        if entropy == "none":
            return logprobs
        if entropy == "grad":
            ent = entropy_from_logits(logits)
        else:
            with torch.no_grad():
                ent = entropy_from_logits(logits.detach())
        return logprobs, ent.masked_fill(~mi.action_mask, 0.0)

    def _reference(self):
        """The KL reference: an explicit frozen model, or the base model with LoRA adapters off."""
        if self.reference_model is not None:
            return self.reference_model, contextlib.nullcontext()
        if hasattr(self.model, "disable_adapter"):
            return self.model, self.model.disable_adapter()
        raise RuntimeError(
            "a KL term (algorithm.kl_coef or kl_reward_coef > 0) needs a reference model (full fine-tuning) or LoRA"
        )

    @torch.no_grad()
    def compute_logprobs(self, rollout: RolloutBatch, *, reference: bool = False) -> torch.Tensor:
        """[N, T] log-probs of the model's own tokens under the current policy (or the reference),
        on the CPU; 0 on padding and observation tokens."""
        model, ctx = self._reference() if reference else (self.model, contextlib.nullcontext())
        out = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32)
        was_training = model.training
        model.eval()
        try:
            with ctx:
                plan = self._plan(rollout)
                if self.data_parallel is not None:  # each rank fills its rows; the sum is the whole
                    plan = self.data_parallel.shard(plan)
                for rows in plan:
                    lp = self._token_logprobs(model, self._inputs(rollout, rows))
                    out[rows, : lp.shape[1]] = lp.cpu()
        finally:
            model.train(was_training)
        if self.data_parallel is not None:
            self.data_parallel.all_reduce_(out)
        return out

    def _plan(self, rollout: RolloutBatch, rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The micro-batches of the batch (or of its ``rows``), as row indices into it.
        Data-parallel: a smaller token budget where the batch would leave ranks idle or unevenly
        loaded (one that fits one micro-batch would use one rank)."""
        if rows is None:
            rows = torch.arange(len(rollout))
        if len(rows) == 0:
            return []

        def plan(budget: int) -> list[torch.Tensor]:
            return [rows[mb] for mb in plan_micro_batches(
                rollout.prompt_mask[rows].sum(dim=1), rollout.completion_mask[rows].sum(dim=1), budget,
                group_index=rollout.group_index[rows] if self.share_prefix else None,
            )]

        budget = self.cfg.micro_batch_tokens
        out = plan(budget)
        if self.data_parallel is not None:
            w = self.data_parallel.world_size

            def unbalanced(n: int) -> bool:  # ranks idle, or one with a whole extra micro-batch of few
                return n < w or (n % w != 0 and n < 4 * w)

            while unbalanced(len(out)) and len(out) < len(rows) and budget > 1:
                budget //= 2
                out = plan(budget)
        return out

    def rows_with_gradient(self, batch: TrainBatch) -> torch.Tensor | None:
        """The rows the update must run (``learner.skip_zero_advantage``): those with a non-zero
        advantage on a trained token. None when every row must run because something besides the
        advantage-weighted policy loss reads them: a KL term, an entropy bonus, a covariance
        penalty, a critic, or a policy loss not registered as advantage-weighted."""
        algo = self.algo
        if (not self.cfg.skip_zero_advantage or algo.kl_coef > 0 or algo.entropy_coef > 0
                or algo.cov_penalty != "none" or self.critic is not None
                or not is_advantage_weighted(algo.policy_loss)):
            return None
        adv = batch.advantages
        mask = batch.effective_loss_mask
        nonzero = (adv != 0) & mask if adv.dim() == 2 else (adv != 0)[:, None] & mask
        return nonzero.any(dim=1).nonzero().squeeze(1)

    # -- the update --------------------------------------------------------------------------
    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimiser step over the whole batch (gradients accumulated over micro-batches with
        whole-batch normalisers, so the result does not depend on the micro-batch split).

        Per micro-batch: log-probs (and entropy) from one forward; the configured policy loss;
        times the batch's truncated importance weights; Clip-Cov/KL-Cov on the tokens selected
        from the whole batch; aggregated over ``loss_mask``; plus the KL and entropy terms.
        With ``old_logprobs=None`` the batch is fresh: the ratio's denominator is the current
        log-prob detached (ratio exactly 1, gradient = policy gradient), saving a forward pass.
        A non-finite loss or gradient norm skips the update and reports ``skipped=1``."""
        algo = self.algo
        rollout = batch.rollout
        loss_mask = batch.effective_loss_mask
        if algo.loss_agg == "token_sum_norm":  # Dr. GRPO: a constant, not the batch's length
            num_tokens = float(len(rollout) * self.max_new_tokens)
        else:
            num_tokens = float(loss_mask.sum().clamp(min=1))
        num_sequences = float(len(rollout))
        agg = dict(num_tokens=num_tokens, num_sequences=num_sequences)
        loss_opts = policy_loss_options(algo.policy_loss, algo)
        # Which tokens Clip-Cov/KL-Cov act on is decided once for the whole batch, so that the
        # micro-batch split cannot change it.
        selected = None
        if algo.cov_penalty != "none":
            # The covariance is the CURRENT policy's (Cui et al.: Cov(log pi_theta, A) at the
            # parameters being updated). On a fresh batch the policy is the one that sampled it and
            # the sampler's log-probs stand in; after the batch's first update it has moved, and one
            # no-grad forward gives them.
            if batch.old_logprobs is None:
                current, old = rollout.sampler_logprobs, rollout.sampler_logprobs
            else:
                current, old = self.compute_logprobs(rollout), batch.old_logprobs
            eligible = None
            if algo.cov_penalty == "clip_cov":
                # Clip-Cov draws among tokens the ratio clip has not cut off (none is on a fresh batch).
                eligible = clip_cov_candidates(algo.policy_loss, current, old, batch.advantages, loss_mask,
                                               **loss_opts)
            selected = covariance_token_selection(
                current, batch.advantages, loss_mask, algo.cov_penalty,
                ratio=algo.cov_ratio, bounds=tuple(algo.cov_bounds), eligible=eligible,
            )
        self.last_cov_selected = selected
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "pg_loss": 0.0, "clip_fraction": 0.0, "ratio_max": 0.0, "entropy": 0.0}
        use_kl = algo.kl_coef > 0 and batch.ref_logprobs is not None
        if use_kl:  # logged only when it is part of the loss
            sums["kl"] = 0.0
        if selected is not None:
            sums["cov_selected_frac"] = float(selected.sum()) / max(float(loss_mask.sum()), 1.0)
        finite = True
        # On fresh samples the forward's detached log-probs are the policy's rollout-time ones:
        # kept so that the sampler/learner mismatch can be measured without another forward.
        fresh = torch.zeros(rollout.completion_ids.shape) if batch.old_logprobs is None else None
        self.last_fresh_logprobs = fresh
        # Rows whose advantage is 0 everywhere add exactly 0 to this loss and its gradient: they
        # are left out of the passes, and the normalisers above stay the whole batch's.
        run_rows = self.rows_with_gradient(batch)
        ran = torch.ones(len(rollout), dtype=torch.bool)
        metric_tokens = max(float(loss_mask.sum()), 1.0)
        if run_rows is not None:
            ran = torch.zeros(len(rollout), dtype=torch.bool).index_fill_(0, run_rows, True)
            metric_tokens = max(float(loss_mask[ran].sum()), 1.0)
        self.last_fresh_rows = ran
        plan = self._plan(rollout, run_rows)
        if self.data_parallel is not None:  # this rank's micro-batches; normalisers stay whole-batch
            plan = self.data_parallel.shard(plan)
        for rows in plan:
            if self.before_micro_batch is not None:
                try:
                    self.before_micro_batch()
                except BaseException:
                    self.optimizer.zero_grad(set_to_none=True)  # abandoned: no gradient is left behind
                    raise
            mi = self._inputs(rollout, rows)
            cw = mi.completion_ids.shape[1]

            def part(x: torch.Tensor) -> torch.Tensor:  # this micro-batch's rows, on the device
                return (x[rows, :cw] if x.dim() == 2 else x[rows]).to(self.device, non_blocking=True)

            logprobs, ent = self._token_logprobs(
                self.model, mi, entropy="grad" if algo.entropy_coef > 0 else "detached"
            )
            m = part(loss_mask) & mi.action_mask
            if fresh is None:
                old = part(batch.old_logprobs)
            else:
                old = logprobs.detach()
                fresh[rows, :cw] = old.float().cpu()
            adv = part(batch.advantages)
            per_token, stats = policy_loss(algo.policy_loss, logprobs, old, adv, m, **loss_opts)
            if selected is not None:
                per_token, stats = apply_cov_penalty(
                    algo.cov_penalty, per_token, stats, logprobs=logprobs, old_logprobs=old, advantages=adv,
                    mask=m, selected=part(selected), kl_coef=algo.kl_cov_coef,
                )
            if batch.is_weights is not None:
                per_token = per_token * part(batch.is_weights).to(per_token.dtype)
            pg = aggregate_loss(per_token, m, algo.loss_agg, **agg)
            loss = pg
            entropy = aggregate_loss(ent, m, "token_mean", num_tokens=metric_tokens)
            if algo.entropy_coef > 0:
                loss = loss - algo.entropy_coef * entropy
            if use_kl:
                kl_tok = kl_penalty(logprobs, part(batch.ref_logprobs), m, algo.kl_estimator)
                kl = aggregate_loss(kl_tok, m, algo.loss_agg, **agg)
                loss = loss + algo.kl_coef * kl
                sums["kl"] += float(kl.detach())
            if not torch.isfinite(loss):
                finite = False
                break
            loss.backward()
            n_tok = float(m.sum())
            sums["loss"] += float(loss.detach())
            sums["pg_loss"] += float(pg.detach())
            sums["entropy"] += float(entropy.detach())
            sums["clip_fraction"] += float(stats["clip_fraction"]) * n_tok / metric_tokens
            sums["ratio_max"] = max(sums["ratio_max"], float(stats["ratio_max"]))
        if finite and run_rows is not None:
            # A zero gradient, not none: AdamW still decays the weights and its moments, as the
            # full update over all-zero-advantage rows would.
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        if self.data_parallel is not None:  # sum gradients and stats over ranks: the whole batch's
            finite = self.data_parallel.reduce(self.params, sums, finite, fresh)
        grad_norm, finite = guarded_step(
            self.optimizer, self.params, self.cfg.grad_clip, finite=finite, scheduler=self.scheduler
        )
        if not bool(ran.any()):  # no token was run: there is no entropy or ratio to report
            for key in ("entropy", "clip_fraction", "ratio_max"):
                sums.pop(key, None)
        return {
            **sums,
            "learner_rows_skipped": float((~ran).sum()) / max(len(rollout), 1),
            "grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "skipped": 0.0 if finite else 1.0,
        }

    def update(self, batch: TrainBatch, *, train_policy: bool = True) -> dict[str, float]:
        """One update on a (mini-)batch: the policy's step (unless ``train_policy`` is False, e.g.
        during the critic's warm-up) and the critic's, when there is one."""
        stats = self.step(batch) if train_policy else {}
        if self.critic is not None:
            stats = {**stats, **self.critic.step(batch)}
        return stats

    @torch.no_grad()
    def values(self, rollout: RolloutBatch) -> torch.Tensor:
        """[N, T] the critic's value of the state before each action token (PPO), on the CPU."""
        if self.critic is None:
            raise RuntimeError("values() needs a critic: the advantage estimator declares one (gae)")
        return self.critic.values(rollout)

    # -- state -------------------------------------------------------------------------------
    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights as a generator loads them (HF names, LoRA merged)."""
        return merged_state_dict(self.model)

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs from the learner: trainable weights, optimiser and
        scheduler state, and the critic's weights and optimiser when there is one. Tensors are
        copies on the CPU, so the result can be saved or sent to another process."""
        state: dict[str, Any] = {
            "weights": self.trainable_state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        if self.critic is not None:
            state["critic"] = self.critic.state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s output; a checkpoint with a critic needs a learner with one."""
        self.load_trainable_state_dict(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
        # The saved state brings back the saved rates: this learner's config wins (an accepted new
        # lr on resume), and warm-up goes on from the saved position at the config's rate.
        apply_settings(self.optimizer, self.cfg.lr, self.cfg.betas, self.cfg.weight_decay, scheduled=True)
        self.scheduler = warmup_schedule(self.optimizer, self.cfg.lr_warmup_steps,
                                         position=state["scheduler"]["last_epoch"])
        if ("critic" in state) != (self.critic is not None):
            raise ValueError(
                "the checkpoint and the run disagree on the critic (algorithm.advantage=gae has one): "
                "resume with the algorithm the run was started with"
            )
        if self.critic is not None:
            self.critic.load(state["critic"])

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        names = {id(p): n for n, p in self.model.named_parameters()}
        return {names[id(p)]: p.detach().cpu().clone() for p in self.params}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        by_name = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state.items():
                if name not in by_name:
                    raise KeyError(f"checkpoint parameter {name!r} is not in the model")
                by_name[name].copy_(value)
