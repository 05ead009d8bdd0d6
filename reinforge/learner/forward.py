"""The forward passes shared by the learner and the critic: micro-batch planning, a micro-batch's
inputs on the compute device, the shared-prompt-prefix forward, the LM head applied in chunks, and
the guarded optimiser step (skip on a non-finite loss or gradient).

A row's tokens after its prompt are context (``completion_mask``); the model's own tokens among
them (``action_mask``) are the only ones scored. Nothing here assumes the action mask is a prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..batch import RolloutBatch
from ..models import cache_kwargs


def plan_micro_batches(
    prompt_lens: torch.Tensor,
    completion_lens: torch.Tensor,
    token_budget: int,
    group_index: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Split rows into micro-batches whose padded token count stays within ``token_budget``.

    Without ``group_index`` a micro-batch of n rows costs n x (longest prompt + longest completion).
    With it, the rows of a group share one prompt (see ``shared_prefix_logits``): the unit is a
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
class MicroInputs:
    """One micro-batch's model inputs, on the compute device.

    input_ids / attention_mask / position_ids: [n, pw + cw], the prompts (left-padded) then the
    tokens after them. completion_ids [n, cw]; completion_mask [n, cw]: real tokens after the
    prompt (context); action_mask [n, cw]: the model's own tokens (scored and trained on), which
    may have holes where observations were inserted.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    action_mask: torch.Tensor
    prompt_width: int
    # Shared-prefix form: one row per distinct prompt, and each row's index into them.
    prompt_rows: torch.Tensor | None = None
    prompt_index: torch.Tensor | None = None


def micro_inputs(
    rollout: RolloutBatch, rows: torch.Tensor, *, share_prefix: bool = False, device: torch.device | None = None
) -> MicroInputs:
    """The rows' prompt + continuation with padding trimmed to this micro-batch's longest row, on
    ``device`` (default: where the rollout is)."""
    p_mask = rollout.prompt_mask[rows]
    c_mask = rollout.completion_mask[rows]
    pw = int(p_mask.sum(dim=1).max())
    cw = max(int(c_mask.sum(dim=1).max()), 1)
    p_ids = rollout.prompt_ids[rows][:, rollout.prompt_ids.shape[1] - pw :]
    p_mask = p_mask[:, p_mask.shape[1] - pw :]
    c_ids = rollout.completion_ids[rows][:, :cw]
    c_mask = c_mask[:, :cw]
    a_mask = rollout.action_mask[rows][:, :cw]
    attn = torch.cat([p_mask, c_mask], dim=1)
    # Left padding shifts every prompt; positions count real tokens only so they match generation.
    pos = (attn.long().cumsum(dim=1) - 1).clamp(min=0)
    mi = MicroInputs(torch.cat([p_ids, c_ids], dim=1), attn.long(), pos, c_ids, c_mask, a_mask, pw)
    if share_prefix:
        _, inverse = torch.unique(rollout.group_index[rows], return_inverse=True)
        first = torch.full((int(inverse.max()) + 1,), len(rows), dtype=torch.long)
        first = first.scatter_reduce(0, inverse, torch.arange(len(rows)), reduce="amin")
        mi.prompt_rows, mi.prompt_index = first, inverse
    if device is not None:
        for name in ("input_ids", "attention_mask", "position_ids", "completion_ids", "completion_mask",
                     "action_mask", "prompt_rows", "prompt_index"):
            value = getattr(mi, name)
            if value is not None:
                setattr(mi, name, value.to(device, non_blocking=True))
    return mi


def shared_prefix_logits(model, mi: MicroInputs) -> torch.Tensor:
    """Logits predicting each completion token, [N, T, V], running every distinct prompt once.

    The G completions of a group share their prompt: the prompt goes through the model once, its
    KV cache is repeated for the group's rows, and only completion tokens are run per row.
    Gradients flow back through the repeated cache into the shared prompt activations, so the
    result (values and gradients) equals running every row in full, at 1/G of the prompt cost.
    (The learner's default path, ``shared_prefix_hidden``, is the same with final hidden states
    instead of logits; this one serves models whose LM head is not a plain projection.)
    """
    return _shared_prefix_run(model, mi, lambda out: out.logits, logits_to_keep=1)


def shared_prefix_hidden(body, mi: MicroInputs) -> torch.Tensor:
    """The final hidden states [N, T, H] at the positions that predict each completion token,
    computed like ``shared_prefix_logits`` (each distinct prompt run once, its KV cache repeated
    for the group's rows) but by the decoder body alone: no LM head, so no [N, T, V] logits."""
    return _shared_prefix_run(body, mi, lambda out: out.last_hidden_state[:, -1:])


def _shared_prefix_run(module, mi: MicroInputs, pick, **first_kwargs) -> torch.Tensor:
    from transformers import DynamicCache

    pw = mi.prompt_width
    p_ids = mi.input_ids[mi.prompt_rows, :pw]
    p_attn = mi.attention_mask[mi.prompt_rows, :pw]
    p_pos = mi.position_ids[mi.prompt_rows, :pw]
    cache = DynamicCache(config=module.config)
    # The prompt's last position predicts each completion's first token.
    head = pick(module(input_ids=p_ids, attention_mask=p_attn, position_ids=p_pos, **cache_kwargs(module, cache),
                       **first_kwargs))
    first = head[mi.prompt_index]
    if mi.completion_ids.shape[1] == 1:
        return first
    cache.batch_select_indices(mi.prompt_index)
    out = module(
        input_ids=mi.completion_ids[:, :-1],
        attention_mask=mi.attention_mask[:, :-1],
        position_ids=mi.position_ids[:, pw:-1],
        **cache_kwargs(module, cache),
    )
    rest = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return torch.cat([first, rest], dim=1)


def body_and_head(model):
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


def guarded_step(optimizer, params, grad_clip: float, *, finite: bool, scheduler=None) -> tuple[float, bool]:
    """The tail of every update: clip the gradient norm, and step the optimiser (and scheduler)
    only when the loss was finite (``finite``) and the gradient norm is too; gradients are then
    cleared. Returns (gradient norm, whether the update was applied); a skipped update leaves the
    weights and the optimiser state untouched."""
    grad_norm = float("nan")
    if finite:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
        finite = math.isfinite(grad_norm)
    if finite:
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite
