"""The memory guard: the estimate from a config, against numbers computed here by hand, and the
warning that names the setting to change."""

from __future__ import annotations

import logging

import pytest

from reinforge.config import build_config
from reinforge.learner.memory import GB, ModelShape, check_memory, estimate_memory, model_shape

# conftest's tiny Llama: vocab 100 (4 specials + 96 characters), hidden 64, intermediate 128,
# 2 layers, 4 heads, 2 KV heads of 16 dims, tied embeddings.
V, H, I, L, KV = 100, 64, 128, 2, 2 * 16
PER_LAYER = (H * H + H * KV + H * KV + H * H) + 3 * H * I + 2 * H  # attention, MLP, two norms
PARAMS = V * H + L * PER_LAYER + H  # embedding (= LM head), layers, final norm
# LoRA r=4 on every linear but the head: r x (in + out) each
LORA = L * 4 * ((H + H) + (H + KV) + (H + KV) + (H + H) + 3 * (H + I))


def test_model_shape_counts_parameters_and_lora(tiny_model_dir, tiny_model):
    from peft import LoraConfig, get_peft_model

    shape = model_shape(tiny_model_dir)
    assert shape == ModelShape(params=PARAMS, layers=L, hidden=H, intermediate=I, heads=4, kv_heads=2,
                               head_dim=16, vocab=V)
    assert PARAMS == sum(p.numel() for p in tiny_model.parameters())
    cfg = build_config({}, ["model.lora={r: 4}"])
    assert model_shape(tiny_model_dir, cfg.model.lora).lora_params == LORA
    peft = get_peft_model(tiny_model, LoraConfig(r=4, target_modules="all-linear"))
    assert LORA == sum(p.numel() for p in peft.parameters() if p.requires_grad)


def _cfg(*extra):
    return build_config({}, [
        "model.dtype=float32", "algorithm.kl_coef=0", "rollout.num_samples=4", "trainer.prompts_per_step=2",
        "rollout.max_new_tokens=8", "rollout.generation_batch_size=64",
        "learner.micro_batch_tokens=100", "learner.logits_chunk_tokens=16", *extra,
    ])


SHAPE = ModelShape(params=PARAMS, layers=L, hidden=H, intermediate=I, heads=4, kv_heads=2, head_dim=16, vocab=V)


def test_estimate_by_hand():
    est = estimate_memory(_cfg(), SHAPE, prompt_tokens=12)
    assert est.resident == {"weights": 4 * PARAMS, "bf16_weight_copies": 0, "gradients": 4 * PARAMS,
                            "adamw_states": 8 * PARAMS, "reference_model": 0, "critic": 0}
    rows = 2 * 4  # generation holds all 8 rows (batch size 64)
    assert est.generation == {"generation_copy": 0, "kv_cache": L * 2 * KV * (12 + 8) * rows * 4,
                              "generation_scores": 5 * rows * V * 4}
    per_token_layer = (10 * H + 2 * KV + 4 * I) * 4
    # the whole step is 2 prompts of 12 tokens (run once per group) + 8 rows x 8 new tokens = 88
    # tokens, under the budget of 100; 64 of them are completion tokens, more than one chunk of 16
    assert est.learner == {"activations": 88 * L * per_token_layer, "logits": 16 * V * 16}
    assert est.peak == 16 * PARAMS + 88 * L * per_token_layer + 16 * V * 16

    # bf16 halves the KV cache (activations stay ~fp32 on CPU), adds bf16 weight copies; a KL
    # reference without LoRA is a second copy; unchunked logits cover every completion position
    est = estimate_memory(_cfg("model.dtype=bfloat16", "algorithm.kl_coef=0.1", "learner.logits_chunk_tokens=0"),
                          SHAPE, prompt_tokens=12)
    assert est.resident["bf16_weight_copies"] == 2 * PARAMS and est.resident["reference_model"] == 4 * PARAMS
    assert est.generation["kv_cache"] == L * 2 * KV * 20 * rows * 2
    assert est.generation["generation_copy"] == 2 * PARAMS  # rollout.hf_bf16_copy follows model.dtype
    est_vllm = estimate_memory(_cfg("rollout.backend=vllm", "rollout.vllm_kv_cache_gb=0.5"), SHAPE, prompt_tokens=12)
    assert est_vllm.generation == {"generation_copy": 4 * PARAMS, "kv_cache": GB // 2}
    assert "lower rollout.vllm_kv_cache_gb (now 0.5)" in est_vllm.advice
    assert est.learner == {"activations": 88 * L * per_token_layer, "logits": 64 * V * 18}

    # LoRA: gradients and AdamW only for the adapters, no reference copy; checkpointing keeps
    # only each layer's input plus one layer's activations (and no shared prompt: the step is
    # 8 rows x 20 tokens, so the budget of 100 binds); PPO's critic is a trained full copy
    shape = ModelShape(**{**SHAPE.__dict__, "lora_params": LORA})
    est = estimate_memory(_cfg("model.lora={r: 4}", "algorithm.kl_coef=0.1", "model.gradient_checkpointing=true",
                               "algorithm.advantage=gae"), shape, prompt_tokens=12)
    assert est.resident == {"weights": 4 * PARAMS, "bf16_weight_copies": 0, "gradients": 4 * LORA,
                            "adamw_states": 8 * LORA, "reference_model": 0, "critic": 16 * PARAMS}
    assert est.learner["activations"] == 100 * L * H * 4 + 100 * (10 * H + 2 * KV + 4 * I) * 4


def test_agent_trajectories_are_budgeted_by_env_max_tokens():
    # an agent's rows hold every turn and observation: env.max_tokens, not rollout.max_new_tokens
    single = estimate_memory(_cfg(), SHAPE, prompt_tokens=12)
    agent = estimate_memory(_cfg("env={name: calculator, max_tokens: 200}"), SHAPE, prompt_tokens=12)
    assert agent.generation["kv_cache"] == L * 2 * KV * (12 + 200) * 8 * 4
    assert agent.generation["kv_cache"] > single.generation["kv_cache"]
    assert agent.learner["activations"] >= single.learner["activations"]
    assert "lower env.max_tokens (now 200)" in agent.advice


def test_guard_warns_naming_the_setting(tiny_model_dir, caplog):
    # a step of 4096 prompts x 4 samples x 64 tokens in micro-batches of a million tokens:
    # activations dominate, ~10 GB on a tiny model
    cfg = _cfg("learner.micro_batch_tokens=1000000", "trainer.prompts_per_step=4096", "rollout.max_new_tokens=64")
    with caplog.at_level(logging.INFO, logger="reinforge"):
        est = check_memory(cfg, tiny_model_dir, prompt_tokens=12, available=2 * 1024**3)
    assert not est.fits
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0]
    assert "learner.micro_batch_tokens (now 1000000)" in msg and "model.gradient_checkpointing=true" in msg
    # the biggest component's setting comes first
    assert msg.index("learner.micro_batch_tokens") < msg.index("rollout.generation_batch_size")

    caplog.clear()
    cfg = _cfg("rollout.generation_batch_size=4096", "trainer.prompts_per_step=1024", "rollout.max_new_tokens=4096")
    with caplog.at_level(logging.INFO, logger="reinforge"):
        check_memory(cfg, tiny_model_dir, prompt_tokens=12, available=2 * 1024**3)
    (msg,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert msg.split("To fit: ")[1].startswith("lower rollout.generation_batch_size (now 4096)")


def test_guard_is_quiet_when_it_fits(tiny_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="reinforge"):
        est = check_memory(_cfg(), tiny_model_dir, prompt_tokens=12, available=64 * 1024**3)
    assert est.fits
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("memory guard" in r.getMessage() for r in caplog.records)


def test_trainer_runs_the_guard_before_loading(tmp_path, tiny_model_dir, monkeypatch, caplog):
    import reinforge.learner.memory as memory
    from reinforge.trainer import Trainer

    def no_load(*a, **k):
        raise RuntimeError("stop after the guard")

    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": (1024**2, "test"))
    monkeypatch.setattr("reinforge.learner.build.load_model", no_load)
    task = tmp_path / "t.jsonl"
    task.write_text("".join(f'{{"prompt": "q{i}", "answer": "1"}}\n' for i in range(10)))
    cfg = build_config({}, [f"model.path={tiny_model_dir}", "task.source=file", f"task.path={task}",
                            "task.eval_size=2", f"tracking.output_dir={tmp_path}"])
    with caplog.at_level(logging.WARNING, logger="reinforge"), pytest.raises(RuntimeError, match="after the guard"):
        Trainer(cfg)._setup()
    assert any("learner.micro_batch_tokens" in r.getMessage() for r in caplog.records)
