"""Tiny real models and tokenizers built in code (random weights, no downloads)."""

from __future__ import annotations

import signal
import string

import pytest
import torch


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Every test leaves torch's thread count as it found it: a run in this process with
    trainer.num_threads set changes it for the whole process, and a later in-process resume
    compared with a run made in a subprocess would then reduce floats in another order."""
    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


@pytest.fixture(autouse=True)
def _stop_signals_as_a_fresh_process_has_them():
    """Every test starts with the stop signals handled as in a fresh Python process (SIGINT:
    KeyboardInterrupt, SIGTERM and SIGHUP: default) and not blocked, set again at the OS level:
    a library imported by another test, or the runner that started pytest, may leave one ignored
    or blocked, and children inherit that across exec, so the signal tests' `reinforge`
    processes, shells and terminals would not stop as a user's do."""
    import threading

    if threading.current_thread() is threading.main_thread():
        for s in _STOP_SIGNALS:
            signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    yield


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


def make_model(tokenizer, *, seed: int = 0, hidden: int = 64, layers: int = 2, max_positions: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def chat_prompts(tok, texts) -> list[list[int]]:
    """Token prompts: each text as one user turn through the tokenizer's chat template."""
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                    tokenize=True, return_dict=False) for t in texts]


def forward_logprobs(model, rollout, temperature: float = 1.0) -> torch.Tensor:
    """[N, T] log-probs of every token after the prompt (at ``temperature``) from one full forward
    pass over prompt + continuation, 0 on padding: the reference the fast paths are checked against."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    attn = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
    pos = (attn.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn.long(), position_ids=pos).logits
    P = rollout.prompt_ids.shape[1]
    lp = torch.log_softmax(logits[:, P - 1 : -1].float() / temperature, -1)
    return lp.gather(2, rollout.completion_ids[:, :, None]).squeeze(2).masked_fill(~rollout.completion_mask, 0.0)


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


def add_stop_bias(model, eos: int, bias: float):
    """Add ``bias`` to the stop token's logit (a forward hook on the head): turns of a few tokens."""
    def hook(_m, _i, out):
        out = out.clone()
        out[..., eos] += bias
        return out

    model.lm_head.register_forward_hook(hook)
    return model


def eos_biased_model(tok, bias: float = 2.5, seed: int = 0):
    """A tiny random model whose stop token is likelier (turns of a few tokens, as a chat model's)."""
    return add_stop_bias(make_model(tok, seed=seed), tok.eos_token_id, bias)


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (the autouse fixture above restores the count afterwards)."""
    torch.set_num_threads(1)
