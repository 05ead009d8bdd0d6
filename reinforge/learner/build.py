"""The learner a run's config describes: the policy, the KL reference and the critic when the
algorithm's components need them, and the optimiser around them. The trainer builds rank 0 with
it, and every other data-parallel learner rank (``scale.learners``) builds its replica the same
way, so the ranks cannot disagree on what they hold."""

from __future__ import annotations

from pathlib import Path

import torch

from ..algorithms import needs_of
from ..config import RunConfig
from ..models import compute_dtype, load_model
from .critic import Critic
from .learner import Learner


def build_learner(cfg: RunConfig, model_path: str | Path, device: torch.device, *, data_parallel=None) -> Learner:
    """The policy loaded from ``model_path`` on ``device`` and its learner. ``data_parallel``:
    this learner's place among several ranks (``scale.data_parallel.DataParallel``)."""
    model = load_model(cfg.model, path=model_path, device=device)
    needs = needs_of(cfg.algorithm)
    full_copy = cfg.model.model_copy(update={"lora": None})
    autocast_dtype = compute_dtype(cfg.model)
    reference = None
    if needs.reference and cfg.model.lora is None:  # (with LoRA: the base, adapters off)
        reference = load_model(full_copy, path=model_path, device=device).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    critic = None
    if needs.critic:
        critic = Critic(
            load_model(full_copy, path=model_path, device=device), cfg.critic,
            micro_batch_tokens=cfg.learner.micro_batch_tokens, autocast_dtype=autocast_dtype,
            betas=tuple(cfg.learner.betas), weight_decay=cfg.learner.weight_decay,
        )
    return Learner(
        model, cfg.learner, cfg.algorithm,
        temperature=cfg.rollout.temperature,
        max_new_tokens=cfg.env.max_tokens if cfg.env else cfg.rollout.max_new_tokens,
        autocast_dtype=autocast_dtype, reference_model=reference, critic=critic, data_parallel=data_parallel,
    )
