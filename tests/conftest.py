"""Tiny real models and tokenizers built in code (random weights, no downloads)."""

from __future__ import annotations

import string

import pytest
import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer():
    """A character-level fast tokenizer with a ChatML template and <|im_end|> as EOS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
    chars = list(string.ascii_letters + string.digits + string.punctuation + " \n")
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>",
        bos_token="<|im_start|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(tokenizer, *, seed: int = 0, hidden: int = 64, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


@pytest.fixture
def tiny_tokenizer():
    return make_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer):
    return make_model(tiny_tokenizer)


def save_tiny_model(path, **model_kwargs):
    """Build a tiny model and its tokenizer and save both as a local HF folder at ``path``."""
    tok = make_tokenizer()
    make_model(tok, **model_kwargs).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def tiny_model_dir(tmp_path, tiny_tokenizer):
    """A tiny model saved as a local HF folder, loadable through model.path."""
    path = tmp_path / "tiny-model"
    make_model(tiny_tokenizer).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path
