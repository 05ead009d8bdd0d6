"""Reward models on the learner's device: a transformer body and a linear head that give one
scalar at any token, read where the caller asks (the last token for an outcome RM, each step's
last token for a PRM). Models load from local folders only.

A folder is either

- a Hugging Face sequence-classification model (``AutoModelForSequenceClassification``, one or
  two labels; what ``reinforge train-rm`` writes), whose ``score`` head is applied at every
  position, or
- a causal LM with a value head: the LM's folder plus ``value_head.safetensors`` (``weight``
  [1, hidden], ``bias`` [1]) applied to the last hidden state.

``reinforge_rm.json`` beside the weights (written by train-rm) records what the model was trained
for (outcome or process) and how it split steps, which a PRM verifier uses as its defaults.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

RM_META_FILE = "reinforge_rm.json"
VALUE_HEAD_FILE = "value_head.safetensors"


class RewardModelLoadError(ValueError):
    pass


def local_model_folder(path: str | Path, what: str) -> Path:
    """``path`` as a local model folder, or a clear error: reward models never download."""
    folder = Path(str(path)).expanduser()
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise RewardModelLoadError(
            f"{what}: {str(folder)!r} is not a local model folder (a directory with config.json); "
            "reward models load from local paths only. Train one with `reinforge train-rm CONFIG` "
            "(its run's final_model/), or save a Hugging Face model there with save_pretrained"
        )
    return folder


def read_meta(folder: Path) -> dict[str, Any]:
    p = Path(folder) / RM_META_FILE
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}


def load_tokenizer_for(folder: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def render_prompt(tokenizer, messages: list[dict]) -> str:
    """The prompt as the reward model reads it: its own chat template up to the assistant's turn,
    or the messages' contents joined by newlines for a tokenizer without one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n".join(str(m.get("content", "")) for m in messages) + "\n"


class ScalarHeadModel(torch.nn.Module):
    """body (a transformer returning hidden states) + head (hidden -> labels) on ``device``.

    ``logits_at(texts, char_positions)`` tokenizes each text (offsets kept; over ``max_length``
    tokens the text's start is dropped, never its end) and returns, for each requested character
    offset, the head's scalar at the token holding the character just before it: for 1 label its
    logit, for 2 labels ``logit[1] - logit[0]``."""

    def __init__(self, body: torch.nn.Module, head: torch.nn.Module, tokenizer, *, max_length: int = 1024) -> None:
        super().__init__()
        self.body, self.head, self.tokenizer, self.max_length = body, head, tokenizer, max_length
        self.tokenizer.truncation_side = "left"
        self.tokenizer.padding_side = "right"
        if not getattr(tokenizer, "is_fast", False):
            raise RewardModelLoadError("reward models need a fast tokenizer (character offsets of each token)")

    @classmethod
    def load(cls, path: str | Path, *, device: torch.device | str = "cpu", max_length: int = 1024,
             what: str = "reward model") -> "ScalarHeadModel":
        from transformers import AutoModel, AutoModelForSequenceClassification

        folder = local_model_folder(path, what)
        tok = load_tokenizer_for(folder)
        try:
            if (folder / VALUE_HEAD_FILE).is_file():
                from safetensors.torch import load_file

                body = AutoModel.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
                weights = load_file(str(folder / VALUE_HEAD_FILE))
                head = torch.nn.Linear(weights["weight"].shape[1], weights["weight"].shape[0])
                head.load_state_dict(weights)
            else:
                model = AutoModelForSequenceClassification.from_pretrained(
                    folder, dtype=torch.float32, local_files_only=True)
                body, head = model.base_model, getattr(model, "score", None) or getattr(model, "classifier", None)
                if head is None:
                    raise RewardModelLoadError(f"{type(model).__name__} has no `score` head to read")
        except RewardModelLoadError:
            raise
        except Exception as err:  # transformers raises many types; the folder is what to fix
            raise RewardModelLoadError(
                f"{what}: could not load {str(folder)!r} as a sequence-classification model or a causal "
                f"LM with {VALUE_HEAD_FILE}: {err}") from err
        labels = head.weight.shape[0]
        if labels not in (1, 2):
            raise RewardModelLoadError(f"{what}: the head of {str(folder)!r} has {labels} labels; a reward "
                                       "model needs 1 (a score) or 2 (no/yes)")
        return cls(body, head, tok, max_length=max_length).to(device).eval()

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def encode(self, texts: list[str]):
        return self.tokenizer(texts, return_offsets_mapping=True, add_special_tokens=False, padding=True,
                              truncation=True, max_length=self.max_length, return_tensors="pt")

    def position_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, L] scalar per token (with gradients when enabled)."""
        hidden = self.body(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)).last_hidden_state
        out = self.head(hidden.to(self.head.weight.dtype))
        return out[..., 0] if out.shape[-1] == 1 else out[..., 1] - out[..., 0]

    @staticmethod
    def token_index(offsets: torch.Tensor, mask: torch.Tensor, char_end: int) -> int:
        """The last real token starting before ``char_end`` (-1 if none survived truncation)."""
        ok = mask.bool() & (offsets[:, 0] < char_end)
        idx = ok.nonzero()
        return int(idx[-1]) if len(idx) else -1

    def locate(self, enc, char_positions: list[list[int]]) -> list[list[int]]:
        return [[self.token_index(enc["offset_mapping"][i], enc["attention_mask"][i], c) for c in cs]
                for i, cs in enumerate(char_positions)]

    @torch.no_grad()
    def logits_at(self, texts: list[str], char_positions: list[list[int]], *, batch_size: int = 8) -> list[list[float]]:
        out: list[list[float]] = []
        for b in range(0, len(texts), batch_size):
            enc = self.encode(texts[b : b + batch_size])
            where = self.locate(enc, char_positions[b : b + batch_size])
            logits = self.position_logits(enc["input_ids"], enc["attention_mask"]).float().cpu()
            for i, idx in enumerate(where):
                if any(j < 0 for j in idx):
                    raise ValueError(f"a scored position fell outside the {self.max_length} tokens the reward "
                                     "model reads; raise its max_length")
                out.append([float(logits[i, j]) for j in idx])
        return out
