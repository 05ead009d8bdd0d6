"""One optimisation step on a batch: forward, loss from ``algorithms``, backward, clip, step.

The learner never branches on a recipe's name; what it computes is fixed by the algorithm config's
components (advantage already in the batch, loss aggregation mode, clip ranges, KL estimator).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from ..algorithms import aggregate_loss, clipped_surrogate_loss, kl_penalty
from ..batch import RolloutBatch, TrainBatch
from ..config import AlgorithmConfig, LearnerConfig


def plan_micro_batches(prompt_lens: torch.Tensor, completion_lens: torch.Tensor, token_budget: int) -> list[torch.Tensor]:
    """Split rows into micro-batches whose padded size (rows x (longest prompt + longest completion))
    stays within ``token_budget``. Rows are sorted by length first so that rows of similar length
    share a micro-batch, which keeps padding (wasted compute) low. A single row longer than the
    budget still gets a micro-batch of its own."""
    order = torch.argsort(prompt_lens + completion_lens, descending=True, stable=True)
    batches: list[list[int]] = []
    cur: list[int] = []
    max_p = max_c = 0
    for i in order.tolist():
        p, c = int(prompt_lens[i]), int(completion_lens[i])
        new_p, new_c = max(max_p, p), max(max_c, c)
        if cur and (len(cur) + 1) * (new_p + new_c) > token_budget:
            batches.append(cur)
            cur, new_p, new_c = [], p, c
        cur.append(i)
        max_p, max_c = new_p, new_c
    if cur:
        batches.append(cur)
    return [torch.tensor(b, dtype=torch.long) for b in batches]


@dataclass
class _MicroInputs:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    prompt_width: int


def _micro_inputs(rollout: RolloutBatch, rows: torch.Tensor) -> _MicroInputs:
    """The rows' prompt+completion with padding trimmed to this micro-batch's longest row."""
    p_mask = rollout.prompt_mask[rows]
    c_mask = rollout.completion_mask[rows]
    pw = int(p_mask.sum(dim=1).max())
    cw = max(int(c_mask.sum(dim=1).max()), 1)
    p_ids = rollout.prompt_ids[rows][:, rollout.prompt_ids.shape[1] - pw :]
    p_mask = p_mask[:, p_mask.shape[1] - pw :]
    c_ids = rollout.completion_ids[rows][:, :cw]
    c_mask = c_mask[:, :cw]
    attn = torch.cat([p_mask, c_mask], dim=1)
    # Left padding shifts every prompt; positions count real tokens only so they match generation.
    pos = (attn.long().cumsum(dim=1) - 1).clamp(min=0)
    return _MicroInputs(torch.cat([p_ids, c_ids], dim=1), attn.long(), pos, c_ids, c_mask, pw)


class Learner:
    """Owns the optimiser of ``model``. ``temperature`` is the sampling temperature: log-probs are
    computed from logits / temperature, the distribution the completions were drawn from."""

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
    ):
        self.model = model
        self.cfg = cfg
        self.algo = algo
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.autocast_dtype = autocast_dtype
        self.reference_model = reference_model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        warmup = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0
        )

    # -- log-probs ---------------------------------------------------------------------------
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type="cpu", dtype=self.autocast_dtype)

    def _token_logprobs(self, model, mi: _MicroInputs) -> torch.Tensor:
        cw = mi.completion_ids.shape[1]
        with self._autocast():
            # Only the logits that predict completion tokens are computed (not the prompt's): the
            # last cw+1 positions, minus the final one, which predicts past the end.
            out = model(
                input_ids=mi.input_ids,
                attention_mask=mi.attention_mask,
                position_ids=mi.position_ids,
                logits_to_keep=cw + 1,
                use_cache=False,
            )
        logits = out.logits[:, :-1].float() / self.temperature
        picked = logits.gather(2, mi.completion_ids[:, :, None]).squeeze(2)
        logprobs = picked - torch.logsumexp(logits, dim=-1)
        return logprobs.masked_fill(~mi.completion_mask, 0.0)

    def _reference(self):
        """The KL reference: an explicit frozen model, or the base model with LoRA adapters off."""
        if self.reference_model is not None:
            return self.reference_model, contextlib.nullcontext()
        if hasattr(self.model, "disable_adapter"):
            return self.model, self.model.disable_adapter()
        raise RuntimeError("algorithm.kl_coef > 0 needs a reference model (full fine-tuning) or LoRA")

    @torch.no_grad()
    def compute_logprobs(self, rollout: RolloutBatch, *, reference: bool = False) -> torch.Tensor:
        """[N, T] log-probs of the completion tokens under the current policy (or the reference)."""
        model, ctx = self._reference() if reference else (self.model, contextlib.nullcontext())
        out = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32)
        was_training = model.training
        model.eval()
        try:
            with ctx:
                for rows in self._plan(rollout):
                    mi = _micro_inputs(rollout, rows)
                    lp = self._token_logprobs(model, mi)
                    out[rows, : lp.shape[1]] = lp
        finally:
            model.train(was_training)
        return out

    def _plan(self, rollout: RolloutBatch) -> list[torch.Tensor]:
        return plan_micro_batches(
            rollout.prompt_mask.sum(dim=1), rollout.completion_mask.sum(dim=1), self.cfg.micro_batch_tokens
        )

    # -- the update --------------------------------------------------------------------------
    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimiser step over the whole batch (gradients accumulated over micro-batches with
        whole-batch normalisers, so the result does not depend on the micro-batch split).

        With ``old_logprobs=None`` the batch is on-policy: the ratio's denominator is the current
        log-prob detached (ratio exactly 1, gradient = policy gradient), saving a forward pass.
        A non-finite loss or gradient norm skips the update and reports ``skipped=1``."""
        rollout = batch.rollout
        mask = rollout.completion_mask
        if self.algo.loss_agg == "token_sum_norm":  # Dr. GRPO: a constant, not the batch's length
            num_tokens = float(len(rollout) * self.max_new_tokens)
        else:
            num_tokens = float(mask.sum().clamp(min=1))
        num_sequences = float(len(rollout))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "ratio_max": 0.0}
        finite = True
        for rows in self._plan(rollout):
            mi = _micro_inputs(rollout, rows)
            cw = mi.completion_ids.shape[1]
            logprobs = self._token_logprobs(self.model, mi)
            old = batch.old_logprobs[rows, :cw] if batch.old_logprobs is not None else logprobs.detach()
            adv = batch.advantages[rows]
            per_token, stats = clipped_surrogate_loss(
                logprobs, old, adv, mi.completion_mask,
                clip_eps_low=self.algo.clip_eps_low, clip_eps_high=self.algo.clip_eps_high,
            )
            pg = aggregate_loss(per_token, mi.completion_mask, self.algo.loss_agg,
                                num_tokens=num_tokens, num_sequences=num_sequences)
            loss = pg
            if self.algo.kl_coef > 0 and batch.ref_logprobs is not None:
                kl_tok = kl_penalty(logprobs, batch.ref_logprobs[rows, :cw], mi.completion_mask, self.algo.kl_estimator)
                kl = aggregate_loss(kl_tok, mi.completion_mask, self.algo.loss_agg,
                                    num_tokens=num_tokens, num_sequences=num_sequences)
                loss = loss + self.algo.kl_coef * kl
                sums["kl"] += float(kl.detach())
            if not torch.isfinite(loss):
                finite = False
                break
            loss.backward()
            n_tok = float(mi.completion_mask.sum())
            sums["loss"] += float(loss.detach())
            sums["pg_loss"] += float(pg.detach())
            sums["clip_fraction"] += float(stats["clip_fraction"]) * n_tok / num_tokens
            sums["ratio_max"] = max(sums["ratio_max"], float(stats["ratio_max"]))
        grad_norm = float("nan")
        if finite:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip))
            finite = math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {
            **sums,
            "grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "skipped": 0.0 if finite else 1.0,
        }

    # -- state -------------------------------------------------------------------------------
    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        names = {id(p): n for n, p in self.model.named_parameters()}
        return {names[id(p)]: p.detach().clone() for p in self.params}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        by_name = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state.items():
                if name not in by_name:
                    raise KeyError(f"checkpoint parameter {name!r} is not in the model")
                by_name[name].copy_(value)
