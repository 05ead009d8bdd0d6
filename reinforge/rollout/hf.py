"""Batched generation with Hugging Face ``generate`` (KV cache on), keeping each sampled token's
log-prob under the sampling distribution."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..batch import RolloutBatch


@dataclass
class SamplingParams:
    num_samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    greedy: bool = False


class _SampledLogprobRecorder:
    """The sampling distribution of ``generate``, as a logits processor that also records it.

    It applies temperature and top-p itself (``generate`` gets neither), because ``generate``
    places user processors *before* its own warpers, where they would see the raw logits. At step
    t it receives the token sampled at t-1 in ``input_ids`` and gathers that token's log-prob from
    the distribution kept one step earlier: one [B, V] tensor alive instead of the [steps, B, V]
    that ``output_scores`` would keep.
    """

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.prev: torch.Tensor | None = None
        self.picked: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self._gather(input_ids[:, -1])
        scores = scores.float()
        if self.temperature != 1.0:
            scores = scores / self.temperature
        if self.top_p < 1.0:
            scores = _top_p_filter(scores, self.top_p)
        self.prev = torch.log_softmax(scores, dim=-1)
        return scores

    def _gather(self, tokens: torch.Tensor) -> None:
        assert self.prev is not None
        self.picked.append(self.prev.gather(1, tokens[:, None]).squeeze(1))
        self.prev = None

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self._gather(last_tokens)
        return torch.stack(self.picked, dim=1) if self.picked else torch.zeros(len(last_tokens), 0)


def _top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al., 2019, arXiv:1904.09751): keep the smallest set of tokens
    whose probability reaches top_p (always at least the most likely one)."""
    sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
    cum = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
    drop_sorted = (cum - torch.softmax(sorted_scores, dim=-1)) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = True
    return ids, mask


class HFGenerator:
    """Generates completions from an in-process HF model; the learner updates the same model
    object, so no weight sync is needed on one machine."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 64,
        autocast_dtype: torch.dtype | None = None,
        share_prefix: bool = True,
    ):
        self.model = model
        self.share_prefix = share_prefix
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.autocast_dtype = autocast_dtype
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))

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
        )

    def _prefill(self, prompts: list[list[int]], repeats: int, autocast):
        """The KV cache of every prompt but its last token, computed once per distinct prompt and
        repeated for its samples: G samples of a prompt share their prefix, so prefill costs
        1/G of prefilling every row. ``generate`` then runs only the last prompt token."""
        from transformers import DynamicCache

        ids, mask = left_pad(prompts, self.pad_id)
        if ids.shape[1] < 2:
            return None
        pos = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        with autocast:
            self.model(
                input_ids=ids[:, :-1].to(self.model.device),
                attention_mask=mask[:, :-1].long().to(self.model.device),
                position_ids=pos[:, :-1].to(self.model.device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        if repeats > 1:
            cache.batch_repeat_interleave(repeats)
        return cache

    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams):
        from transformers import GenerationConfig, LogitsProcessorList

        rows = [p for p in prompts for _ in range(params.num_samples)]
        ids, mask = left_pad(rows, self.pad_id)
        recorder = (
            _SampledLogprobRecorder() if params.greedy else _SampledLogprobRecorder(params.temperature, params.top_p)
        )
        gen_cfg = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=not params.greedy,
            # The recorder applies temperature and top-p; generate's top_k=50 default is turned off
            # when sampling (greedy ignores it, and warns if it is set).
            temperature=1.0,
            top_p=1.0,
            top_k=None if params.greedy else 0,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            use_cache=True,
        )
        autocast = (
            torch.autocast(device_type=ids.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        was_training = self.model.training
        self.model.eval()
        try:
            cache = self._prefill(prompts, params.num_samples, autocast) if self.share_prefix else None
            with autocast:
                out = self.model.generate(
                    input_ids=ids.to(self.model.device),
                    attention_mask=mask.long().to(self.model.device),
                    generation_config=gen_cfg,
                    logits_processor=LogitsProcessorList([recorder]),
                    past_key_values=cache,
                )
        finally:
            self.model.train(was_training)
        completion = out[:, ids.shape[1]:].cpu()
        logprobs = recorder.finish(completion[:, -1]).cpu() if completion.shape[1] else torch.zeros(len(rows), 0)
        # A completion ends at its first stop token (kept, so the model learns to stop); what follows
        # is padding that generate filled in after the row finished.
        is_stop = torch.zeros_like(completion, dtype=torch.bool)
        for e in self.eos_ids:
            is_stop |= completion == e
        after_stop = (is_stop.cumsum(dim=1) - is_stop.long()) > 0
        cmask = ~after_stop
        stopped = is_stop.any(dim=1)
        completion = completion.masked_fill(~cmask, self.pad_id)
        logprobs = logprobs.masked_fill(~cmask, 0.0)
        return completion, cmask, logprobs, ~stopped
