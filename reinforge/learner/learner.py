"""One optimisation step on a batch: forward, loss from ``algorithms``, backward, clip, step.

The learner never branches on a recipe's name; what it computes is fixed by the algorithm config's
components (advantage already in the batch, policy loss, loss aggregation mode, clip ranges, KL
and entropy terms, covariance penalty, importance weights in the batch).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from ..algorithms import (
    aggregate_loss,
    apply_cov_penalty,
    covariance_token_selection,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    tokens_with_gradient,
)
from ..batch import RolloutBatch, TrainBatch
from ..config import AlgorithmConfig, LearnerConfig


def plan_micro_batches(
    prompt_lens: torch.Tensor,
    completion_lens: torch.Tensor,
    token_budget: int,
    group_index: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Split rows into micro-batches whose padded token count stays within ``token_budget``.

    Without ``group_index`` a micro-batch of n rows costs n x (longest prompt + longest completion).
    With it, the rows of a group share one prompt (see ``_shared_prefix_logits``): the unit is a
    whole group, and a micro-batch costs distinct prompts x longest prompt + rows x longest
    completion. Units are sorted by length so that similar lengths share a micro-batch (little
    padding). A group over the budget is split into row chunks; a single row over it still gets a
    micro-batch of its own.
    """
    n = len(prompt_lens)
    if group_index is None:
        units = [[i] for i in range(n)]
    else:
        by_group: dict[int, list[int]] = {}
        for i, g in enumerate(group_index.tolist()):
            by_group.setdefault(g, []).append(i)
        units = list(by_group.values())
    shared = group_index is not None

    def cost(n_prompts: int, n_rows: int, p: int, c: int) -> int:
        return n_prompts * p + n_rows * c if shared else n_rows * (p + c)

    # Split units that alone exceed the budget.
    pieces: list[list[int]] = []
    for unit in units:
        p = int(prompt_lens[unit].max())
        chunk: list[int] = []
        for i in sorted(unit, key=lambda r: -int(completion_lens[r])):
            c = int(completion_lens[chunk + [i]].max())
            if chunk and cost(1 if shared else len(chunk) + 1, len(chunk) + 1, p, c) > token_budget:
                pieces.append(chunk)
                chunk = []
            chunk.append(i)
        pieces.append(chunk)
    pieces.sort(key=lambda u: -(int(prompt_lens[u].max()) + int(completion_lens[u].max())))

    batches: list[list[int]] = []
    cur: list[int] = []
    cur_prompts = max_p = max_c = 0
    for piece in pieces:
        p, c = int(prompt_lens[piece].max()), int(completion_lens[piece].max())
        k = 1 if shared else len(piece)
        new_p, new_c = max(max_p, p), max(max_c, c)
        if cur and cost(cur_prompts + k, len(cur) + len(piece), new_p, new_c) > token_budget:
            batches.append(cur)
            cur, cur_prompts, new_p, new_c = [], 0, p, c
        cur.extend(piece)
        cur_prompts += k
        max_p, max_c = new_p, new_c
    if cur:
        batches.append(cur)
    return [torch.tensor(sorted(b), dtype=torch.long) for b in batches]


@dataclass
class _MicroInputs:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    prompt_width: int
    # Shared-prefix form: one row per distinct prompt, and each row's index into them.
    prompt_rows: torch.Tensor | None = None
    prompt_index: torch.Tensor | None = None


def _micro_inputs(rollout: RolloutBatch, rows: torch.Tensor, *, share_prefix: bool = False) -> _MicroInputs:
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
    mi = _MicroInputs(torch.cat([p_ids, c_ids], dim=1), attn.long(), pos, c_ids, c_mask, pw)
    if share_prefix:
        _, inverse = torch.unique(rollout.group_index[rows], return_inverse=True)
        first = torch.full((int(inverse.max()) + 1,), len(rows), dtype=torch.long)
        first = first.scatter_reduce(0, inverse, torch.arange(len(rows)), reduce="amin")
        mi.prompt_rows, mi.prompt_index = first, inverse
    return mi


def _shared_prefix_logits(model, mi: _MicroInputs) -> torch.Tensor:
    """Logits predicting each completion token, [N, T, V], running every distinct prompt once.

    The G completions of a group share their prompt: the prompt goes through the model once, its
    KV cache is repeated for the group's rows, and only completion tokens are run per row.
    Gradients flow back through the repeated cache into the shared prompt activations, so the
    result (values and gradients) equals running every row in full, at 1/G of the prompt cost.
    (The learner's default path, ``_shared_prefix_hidden``, is the same with final hidden states
    instead of logits; this one serves models whose LM head is not a plain projection.)
    """
    return _shared_prefix_run(model, mi, lambda out: out.logits, logits_to_keep=1)


def _shared_prefix_hidden(body, mi: _MicroInputs) -> torch.Tensor:
    """The final hidden states [N, T, H] at the positions that predict each completion token,
    computed like ``_shared_prefix_logits`` (each distinct prompt run once, its KV cache repeated
    for the group's rows) but by the decoder body alone: no LM head, so no [N, T, V] logits."""
    return _shared_prefix_run(body, mi, lambda out: out.last_hidden_state[:, -1:])


def _shared_prefix_run(module, mi: _MicroInputs, pick, **first_kwargs) -> torch.Tensor:
    from transformers import DynamicCache

    pw = mi.prompt_width
    p_ids = mi.input_ids[mi.prompt_rows, :pw]
    p_attn = mi.attention_mask[mi.prompt_rows, :pw]
    p_pos = mi.position_ids[mi.prompt_rows, :pw]
    cache = DynamicCache(config=module.config)
    # The prompt's last position predicts each completion's first token.
    head = pick(module(input_ids=p_ids, attention_mask=p_attn, position_ids=p_pos, past_key_values=cache,
                       use_cache=True, **first_kwargs))
    first = head[mi.prompt_index]
    if mi.completion_ids.shape[1] == 1:
        return first
    cache.batch_select_indices(mi.prompt_index)
    out = module(
        input_ids=mi.completion_ids[:, :-1],
        attention_mask=mi.attention_mask[:, :-1],
        position_ids=mi.position_ids[:, pw:-1],
        past_key_values=cache,
        use_cache=True,
    )
    rest = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return torch.cat([first, rest], dim=1)


def _body_and_head(model):
    """(decoder body, LM head) of a causal LM, through a PEFT wrapper, or None when the logits are
    not simply ``head(body(...).last_hidden_state)`` (logit soft-capping or scaling), where the
    learner falls back to the model's own forward."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale"):
        if getattr(cfg, attr, None) not in (None, 1, 1.0):
            return None
    try:
        body, head = base.get_decoder(), base.get_output_embeddings()
    except Exception:  # exotic models without the lookups
        return None
    if head is None or body is None or body is base:
        return None
    return body, head


def _chunk_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool):
    """Log-probs of ``targets`` [n] (and entropies) from hidden states [n, H] through the LM head,
    in float32 at ``temperature``. Everything [n, V] lives only inside this call."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(1, targets[:, None]).squeeze(1) - logz
    if not entropy:
        return logprobs, None
    # H = logsumexp(l) - sum_v softmax(l)_v l_v, as algorithms.entropy_from_logits.
    ent = logz - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    return logprobs, ent


def chunked_token_logprobs(
    head, hidden: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
    chunk_tokens: int = 1024, entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` [..., ] under ``head(hidden)`` [..., V] / temperature, and
    optionally the entropies, without materialising the [..., V] logits of every position at once.

    Positions are flattened and taken ``chunk_tokens`` at a time; each chunk's logits, log-softmax
    and softmax exist only inside the chunk. When gradients are needed each chunk runs under
    ``torch.utils.checkpoint``: autograd stores only the chunk's hidden states, and the backward
    recomputes that chunk's logits, so the peak is one chunk's [chunk_tokens, V] tensors instead of
    the whole micro-batch's. Values and gradients equal the unchunked computation.
    """
    from torch.utils.checkpoint import checkpoint

    shape = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    need_grad = torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in head.parameters()))
    lps, ents = [], []
    for start in range(0, h.shape[0], max(1, chunk_tokens)):
        hc, tc = h[start : start + chunk_tokens], t[start : start + chunk_tokens]
        if need_grad:
            lp, ent = checkpoint(_chunk_logprobs, head, hc, tc, temperature, entropy, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(head, hc, tc, temperature, entropy)
        lps.append(lp)
        ents.append(ent)
    logprobs = torch.cat(lps).reshape(shape) if lps else h.new_zeros(shape, dtype=torch.float32)
    if not entropy:
        return logprobs, None
    ent = torch.cat(ents).reshape(shape) if ents else h.new_zeros(shape, dtype=torch.float32)
    return logprobs, ent


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
        self.last_fresh_logprobs: torch.Tensor | None = None
        # A KV cache cannot be kept under activation checkpointing, so sharing is off there.
        checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.x name
        if checkpointing is None:
            checkpointing = getattr(model, "is_gradient_checkpointing", False)
        self.share_prefix = cfg.share_prompt_prefix and not checkpointing
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

    def _logits(self, model, mi: _MicroInputs) -> torch.Tensor:
        """[n, cw, V] float32 logits / temperature predicting each completion token (the plain,
        unchunked path: ``learner.logits_chunk_tokens=0`` or a model without a separable head)."""
        cw = mi.completion_ids.shape[1]
        with self._autocast():
            if mi.prompt_rows is not None:
                logits = _shared_prefix_logits(model, mi)
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

    def _hidden(self, body, mi: _MicroInputs) -> torch.Tensor:
        """[n, cw, H] final hidden states at the positions predicting each completion token."""
        cw = mi.completion_ids.shape[1]
        if mi.prompt_rows is not None:
            return _shared_prefix_hidden(body, mi)
        hidden = body(
            input_ids=mi.input_ids,
            attention_mask=mi.attention_mask,
            position_ids=mi.position_ids,
            use_cache=False,
        ).last_hidden_state
        return hidden[:, -(cw + 1) : -1]

    def _token_logprobs(self, model, mi: _MicroInputs, *, entropy: str = "none"):
        """[n, cw] log-probs of the completion tokens (0 on padding). With ``entropy`` "grad" or
        "detached", also the per-token entropy of the sampling distribution.

        By default the decoder body gives the final hidden states and the LM head is applied
        ``learner.logits_chunk_tokens`` positions at a time (``chunked_token_logprobs``): the
        [n, cw, V] float32 logits, their softmax and their gradient are never held for the whole
        micro-batch. Values and gradients equal the plain path's."""
        parts = _body_and_head(model) if self.cfg.logits_chunk_tokens > 0 else None
        if parts is None or not mi.completion_mask.any():  # (no real token: keep a graph for backward)
            return self._token_logprobs_plain(model, mi, entropy=entropy)
        body, head = parts
        mask = mi.completion_mask
        with self._autocast():
            hidden = self._hidden(body, mi)
            # Only real completion tokens go through the head: padding costs nothing.
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

    def _token_logprobs_plain(self, model, mi: _MicroInputs, *, entropy: str = "none"):
        """``_token_logprobs`` from the whole micro-batch's [n, cw, V] logits at once."""
        logits = self._logits(model, mi)
        picked = logits.gather(2, mi.completion_ids[:, :, None]).squeeze(2)
        logprobs = (picked - torch.logsumexp(logits, dim=-1)).masked_fill(~mi.completion_mask, 0.0)
        if entropy == "none":
            return logprobs
        if entropy == "grad":
            ent = entropy_from_logits(logits)
        else:
            with torch.no_grad():
                ent = entropy_from_logits(logits.detach())
        return logprobs, ent.masked_fill(~mi.completion_mask, 0.0)

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
        """[N, T] log-probs of the completion tokens under the current policy (or the reference)."""
        model, ctx = self._reference() if reference else (self.model, contextlib.nullcontext())
        out = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32)
        was_training = model.training
        model.eval()
        try:
            with ctx:
                for rows in self._plan(rollout):
                    mi = _micro_inputs(rollout, rows, share_prefix=self.share_prefix)
                    lp = self._token_logprobs(model, mi)
                    out[rows, : lp.shape[1]] = lp
        finally:
            model.train(was_training)
        return out

    def _plan(self, rollout: RolloutBatch) -> list[torch.Tensor]:
        return plan_micro_batches(
            rollout.prompt_mask.sum(dim=1), rollout.completion_mask.sum(dim=1), self.cfg.micro_batch_tokens,
            group_index=rollout.group_index if self.share_prefix else None,
        )

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
        loss_opts = dict(clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high, dual_clip=algo.dual_clip)
        # Which tokens Clip-Cov/KL-Cov act on is decided once for the whole batch, so that the
        # micro-batch split cannot change it.
        selected = None
        if algo.cov_penalty != "none":
            lp_ref = batch.old_logprobs if batch.old_logprobs is not None else rollout.sampler_logprobs
            eligible = None
            if algo.cov_penalty == "clip_cov":
                # Clip-Cov draws among tokens that still have a gradient; whether the ratio clip
                # cuts one off needs the current log-probs (one no-grad forward), except on a
                # fresh batch (ratio 1).
                current = lp_ref if batch.old_logprobs is None else self.compute_logprobs(rollout)
                eligible = tokens_with_gradient(
                    algo.policy_loss, current, lp_ref, batch.advantages, loss_mask, **loss_opts
                )
            selected = covariance_token_selection(
                lp_ref, batch.advantages, loss_mask, algo.cov_penalty,
                ratio=algo.cov_ratio, bounds=tuple(algo.cov_bounds), eligible=eligible,
            )
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
        for rows in self._plan(rollout):
            mi = _micro_inputs(rollout, rows, share_prefix=self.share_prefix)
            cw = mi.completion_ids.shape[1]
            logprobs, ent = self._token_logprobs(
                self.model, mi, entropy="grad" if algo.entropy_coef > 0 else "detached"
            )
            m = loss_mask[rows, :cw] & mi.completion_mask
            if fresh is None:
                old = batch.old_logprobs[rows, :cw]
            else:
                old = logprobs.detach()
                fresh[rows, :cw] = old.float()
            adv = batch.advantages[rows]
            adv = adv[:, :cw] if adv.dim() == 2 else adv
            per_token, stats = policy_loss(algo.policy_loss, logprobs, old, adv, m, **loss_opts)
            if selected is not None:
                per_token, stats = apply_cov_penalty(
                    algo.cov_penalty, per_token, stats, logprobs=logprobs, old_logprobs=old, advantages=adv,
                    mask=m, selected=selected[rows, :cw], kl_coef=algo.kl_cov_coef,
                )
            if batch.is_weights is not None:
                per_token = per_token * batch.is_weights[rows, :cw].to(per_token.dtype)
            pg = aggregate_loss(per_token, m, algo.loss_agg, **agg)
            loss = pg
            entropy = aggregate_loss(ent, m, "token_mean", num_tokens=float(loss_mask.sum().clamp(min=1)))
            if algo.entropy_coef > 0:
                loss = loss - algo.entropy_coef * entropy
            if use_kl:
                kl_tok = kl_penalty(logprobs, batch.ref_logprobs[rows, :cw], m, algo.kl_estimator)
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
            sums["clip_fraction"] += float(stats["clip_fraction"]) * n_tok / max(float(loss_mask.sum()), 1.0)
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
