"""Batched generation with a Hugging Face model and its KV cache, keeping each sampled token's
log-prob under the sampling distribution.

The decode loop is reinforge's own rather than ``generate``'s, for three savings that ``generate``
cannot make (docs/benchmarks.md has the measurements):

- each distinct prompt is prefilled once and its KV cache repeated for its G samples;
- rows that have stopped leave the batch (their KV cache rows are dropped), so a batch of mixed
  lengths does not keep paying for finished completions;
- sampling is by inverse CDF (one uniform draw per row against the cumulative probabilities),
  which draws exactly from the same distribution as ``torch.multinomial`` but avoids the [B, V]
  exponential draw that made up about 15% of a decode step on a CPU.

Its KV cache is preallocated for the prompt and the new tokens (``kv_cache.py``): each step writes
its keys and values in place, where ``DynamicCache`` copied the whole cache with ``torch.cat``.
The head every prompt of a batch shares (chat template, system prompt, few-shot turns) is run once
and its cache repeated for the batch: the main job's held-out evaluation generated 1.53x faster
(79 of ~190 prompt tokens shared; same greedy tokens), its 8 x 8 training batch 1.14x.

With ``copy_dtype`` the generator decodes with its own copy of the policy in that dtype (bf16:
1.35x faster decoding than the fp32 master weights under autocast on a 2-core CPU with AVX512-BF16),
refreshed in memory from the learner's weights by ``sync_weights`` after each update, like the
vLLM backend. On a CPU decode steps use the grouped-query attention of ``attention.py``, which
reads the KV cache without copying it per query head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import torch

from ..batch import RolloutBatch
from ..models import autocast, cache_kwargs, merged_state_dict, model_device
from .attention import decode_attention
from .base import SamplingParams
from .kv_cache import PreallocatedCache


def _top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al., 2019, arXiv:1904.09751): keep the smallest set of tokens
    whose probability reaches top_p (always at least the most likely one)."""
    sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
    cum = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
    drop_sorted = (cum - torch.softmax(sorted_scores, dim=-1)) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def sampling_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[B, V] float32 log-probs of the distribution a token is drawn from: logits / temperature,
    then top-p. Greedy decoding records temperature-1 log-probs (and takes their argmax)."""
    scores = logits.float()
    if not params.greedy and params.temperature <= 0:
        raise ValueError(f"temperature must be positive when sampling, got {params.temperature}; "
                         "set greedy=True for greedy decoding")
    if not params.greedy:
        if params.temperature != 1.0:
            scores = scores / params.temperature
        if params.top_p < 1.0:
            scores = _top_p_filter(scores, params.top_p)
    return torch.log_softmax(scores, dim=-1)


def sample_tokens(logprobs: torch.Tensor, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row drawn from exp(logprobs) by inverse CDF, with torch's global RNG
    (``uniforms``: [B, 1] float64 draws in [0, 1) to use instead, one per row).

    The cumulative sum is in float64, so tokens with probabilities far below float32's resolution
    of the total keep their share. ``right=True`` finds the first index whose cumulative
    probability exceeds the draw, so a zero-probability token (a flat step) is never picked."""
    cdf = logprobs.exp().cumsum(dim=-1, dtype=torch.float64)
    if uniforms is None:
        uniforms = torch.rand(logprobs.shape[0], 1, dtype=torch.float64, device=logprobs.device)
    u = uniforms.to(device=logprobs.device, dtype=torch.float64) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=logprobs.shape[-1] - 1).squeeze(1)


# Shorter common heads are not worth a separate forward.
_MIN_SHARED_PREFIX = 16


def common_prefix_length(seqs: list[list[int]]) -> int:
    """Tokens every sequence starts with, leaving each at least one token of its own (whose
    position predicts the first new token)."""
    first = seqs[0]
    limit = min(len(s) for s in seqs) - 1
    n = 0
    while n < limit and all(s[n] == first[n] for s in seqs):
        n += 1
    return max(n, 0)


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = True
    return ids, mask


def generation_copy(model, dtype: torch.dtype):
    """An eval-mode copy of ``model``'s weights (LoRA merged) as a plain HF model in ``dtype``."""
    from transformers import AutoModelForCausalLM

    try:  # every weight is overwritten below: skip the random initialisation (2.6 s of 3 for 135M)
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover - older transformers
        no_init_weights = contextlib.nullcontext

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    device = model_device(base)
    with no_init_weights():
        copy = AutoModelForCausalLM.from_config(base.config, dtype=dtype)
    copy.tie_weights()  # (initialisation would have tied them; the config decides)
    copy = copy.to(device).eval()
    copy.generation_config = base.generation_config
    # The parameters keep requires_grad=True although the copy only ever runs under no_grad:
    # on a CPU, torch routes a bf16 linear layer with a frozen weight through a path that made
    # the prompt forward 2x slower (measured with SmolLM2-135M, torch 2.13).
    copy.load_state_dict(merged_state_dict(model))
    return copy


class HFGenerator:
    """Generates completions from an in-process HF model (a ``rollout.base.Generator``).

    Without ``copy_dtype`` it decodes with the learner's own model object (under ``autocast_dtype``
    if given): the learner's updates are seen at once and ``sync_weights`` only records the
    version. With it, it decodes with a copy in that dtype, on the model's device, that
    ``sync_weights`` refreshes (``needs_sync`` is then True, which tells the trainer to sync and
    to log the sampler/learner log-prob mismatch)."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 64,
        autocast_dtype: torch.dtype | None = None,
        copy_dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.engine = generation_copy(model, copy_dtype) if copy_dtype is not None else model
        self.autocast_dtype = None if copy_dtype is not None else autocast_dtype
        self.needs_sync = copy_dtype is not None
        self.version = 0
        # In-flight weight updates (rollout.partial): called between decode steps; it loads newer
        # weights if there are any (through sync_weights, which moves ``version``).
        self.weight_poll: Callable[[], object] | None = None
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))

    @torch.no_grad()
    def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load the policy's weights (LoRA merged) into the generation copy; without a copy the
        live model already has them, and only the version is recorded."""
        if self.needs_sync:
            self.engine.load_state_dict(state_dict)
        self.version = int(version)

    def close(self) -> None:
        if self.needs_sync:
            self.engine = None

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        """``num_samples`` completions for each prompt; rows of one prompt are contiguous."""
        g = params.num_samples
        rows = [p for p in prompts for _ in range(g)]
        group_index = torch.arange(len(prompts)).repeat_interleave(g)
        # Chunks hold whole groups, so each chunk prefills its distinct prompts once.
        per_chunk = max(1, self.batch_size // g)
        chunks = [self._generate_chunk(prompts[i : i + per_chunk], params) for i in range(0, len(prompts), per_chunk)]
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id)
        width = max(c[0].shape[1] for c in chunks)

        def cat(idx: int, fill) -> torch.Tensor:
            parts = []
            for c in chunks:
                t = c[idx]
                pad = width - t.shape[1]
                parts.append(torch.nn.functional.pad(t, (0, pad), value=fill) if pad else t)
            return torch.cat(parts, dim=0)

        completion_ids = cat(0, self.pad_id)
        completion_mask = cat(1, False)
        logprobs = cat(2, 0.0)
        truncated = torch.cat([c[3] for c in chunks])
        first_version, last_version = (torch.cat([c[i] for c in chunks]) for i in (4, 5))
        texts = self.tokenizer.batch_decode(
            [ids[m].tolist() for ids, m in zip(completion_ids, completion_mask)], skip_special_tokens=True
        )
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            sampler_logprobs=logprobs,
            truncated=truncated,
            group_index=group_index,
            texts=texts,
            versions=first_version, last_versions=last_version,
        )

    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams):
        """Completions for ``prompts`` x ``num_samples`` rows: (ids, mask, log-probs, truncated,
        the version of each row's first and last token), tensors [rows, longest completion] and [rows]."""
        model = self.engine
        was_training = model.training
        model.eval()
        try:
            with decode_attention(model):
                return self._decode(model, prompts, params, autocast(model_device(model), self.autocast_dtype))
        finally:
            model.train(was_training)

    def _decode(self, model, prompts: list[list[int]], params: SamplingParams, autocast):
        device = model_device(model)
        g, steps = params.num_samples, params.max_new_tokens
        n = len(prompts) * g
        eos = torch.tensor(sorted(self.eos_ids), device=device)
        tokens = torch.full((n, steps), self.pad_id, dtype=torch.long)
        logprobs = torch.zeros((n, steps), dtype=torch.float32)
        lengths = torch.zeros(n, dtype=torch.long)
        stopped = torch.zeros(n, dtype=torch.bool)
        first_version = torch.full((n,), self.version, dtype=torch.long)
        last_version = first_version.clone()
        # The prompts' common head (chat template, system prompt, few-shot turns: 79 of the main
        # job's ~190 tokens) is run once for all of them; each prompt's own tail, left-padded,
        # follows it in the cache, so the padding sits between the two (masked out).
        c = common_prefix_length(prompts) if len(prompts) > 1 else 0
        c = c if c >= _MIN_SHARED_PREFIX else 0
        ids, mask = left_pad([p[c:] for p in prompts], self.pad_id)
        ids, mask = ids.to(device), mask.to(device)
        pw = c + ids.shape[1]
        # Room for the prompt and every token fed back (the last one sampled never is).
        cache = PreallocatedCache(model.config, pw + steps - 1)
        if c:
            mask = torch.cat([mask.new_ones(len(prompts), c), mask], dim=1)
        with autocast:
            if c:
                head = torch.tensor([prompts[0][:c]], dtype=torch.long, device=device)
                model(input_ids=head, position_ids=torch.arange(c, device=device)[None], logits_to_keep=1,
                      **cache_kwargs(model, cache))
                cache.batch_repeat_interleave(len(prompts))
            # Each distinct prompt once; its last position predicts every sample's first token.
            logits = model(
                input_ids=ids,
                attention_mask=mask.long(),
                position_ids=(mask.long().cumsum(dim=1) - 1).clamp(min=0)[:, c:],
                logits_to_keep=1,
                **cache_kwargs(model, cache),
            ).logits[:, -1]
        if g > 1:
            cache.batch_repeat_interleave(g)
            logits = logits.repeat_interleave(g, dim=0)
        # The attention mask for every step at once: the prompt's, then a real token per step.
        attn = torch.cat([mask, mask.new_ones(len(prompts), steps)], dim=1).long().repeat_interleave(g, dim=0)
        pos = mask.sum(dim=1).repeat_interleave(g)  # the next token's position: real tokens so far
        active = torch.arange(n, device=device)  # batch row -> output row
        done = torch.zeros(n, dtype=torch.bool, device=device)
        for t in range(steps):
            lp = sampling_logprobs(logits, params)
            pick = lp.argmax(dim=-1) if params.greedy else sample_tokens(lp)
            live = active[~done].cpu()
            tokens[live, t] = pick[~done].cpu()
            logprobs[live, t] = lp.gather(1, pick[:, None]).squeeze(1)[~done].float().cpu()
            lengths[live] += 1
            last_version[live] = self.version
            newly = ~done & torch.isin(pick, eos)
            stopped[active[newly].cpu()] = True
            done |= newly
            if t == steps - 1 or bool(done.all()):
                break
            # Drop finished rows once they are an eighth of the batch: selecting KV cache rows
            # copies the cache, so it is batched rather than done for every stop.
            if int(done.sum()) * 8 >= len(done):
                keep = (~done).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                active, attn, pos, pick, done = active[keep], attn[keep], pos[keep], pick[keep], done[keep]
            if self.weight_poll is not None:
                # PipelineRL's in-flight update: the next tokens come from the newer weights; the
                # KV cache of the tokens so far, computed under the older ones, is kept.
                self.weight_poll()
            with autocast:
                logits = model(
                    input_ids=pick[:, None],
                    attention_mask=attn[:, : pw + t + 1],
                    position_ids=pos[:, None],
                    **cache_kwargs(model, cache),
                ).logits[:, -1]
            pos = pos + 1
        width = int(lengths.max()) if n else 0
        cmask = torch.arange(width)[None, :] < lengths[:, None]
        # A completion ends at its first stop token (kept, so the model learns to stop).
        return tokens[:, :width], cmask, logprobs[:, :width], ~stopped, first_version, last_version
