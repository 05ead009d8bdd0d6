"""The learner's optimiser settings: AdamW built from the learner config, the warm-up schedule,
and the same settings applied again after a checkpoint's optimiser state is loaded.

A checkpoint's optimiser state carries the rates, betas and weight decay it was saved with. On a
resume the config's values must win (an accepted ``learner.lr`` change reaches the optimiser), so
the learner sets them again and rebuilds its scheduler at the saved position: LambdaLR's own
constructor computes the rate there, which with unchanged settings is the restored rate bit for
bit. This module is the one place these settings are written."""

from __future__ import annotations

from functools import partial

import torch


def _warmup(warmup: int, step: int) -> float:
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def adamw(params, lr: float, betas, weight_decay: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)


def warmup_schedule(optimizer, warmup_steps: int, *, position: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps`` optimiser steps, then constant; ``position`` is how
    many steps were already taken (a resumed run's scheduler continues from there)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, partial(_warmup, warmup_steps), last_epoch=position - 1)


def apply_settings(optimizer, lr: float, betas, weight_decay: float, *, scheduled: bool) -> None:
    """Set ``lr`` (as the base rate when a scheduler derives the rate from it), betas and weight
    decay on every parameter group, over whatever a loaded state dict brought back."""
    for group in optimizer.param_groups:
        group["betas"] = tuple(betas)
        group["weight_decay"] = weight_decay
        if scheduled:
            group["initial_lr"] = lr
        else:
            group["lr"] = lr
