"""PPO's value model: the policy's transformer body with a scalar head, and its own optimiser.

It values the state before each completion token (the same positions whose logits predict the
completion), is trained on PPO's clipped value loss towards GAE returns, and lives beside the
policy: separate weights, separate AdamW, saved in the same checkpoint.
"""

from __future__ import annotations

import torch

from ..algorithms import aggregate_loss, value_loss
from ..batch import RolloutBatch, TrainBatch
from ..config import CriticConfig
from ..models import autocast, model_device
from .forward import guarded_step, micro_inputs, plan_micro_batches
from .optim import adamw, apply_settings


class Critic(torch.nn.Module):
    def __init__(self, causal_lm, cfg: CriticConfig, *, micro_batch_tokens: int = 4096,
                 autocast_dtype: torch.dtype | None = None, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0):
        super().__init__()
        # The decoder body of a causal LM loaded from the policy's weights; the LM head is unused.
        self.body = causal_lm.get_decoder()
        hidden = causal_lm.config.hidden_size
        # A zero head starts every value at 0: the first advantages are the plain returns.
        self.device = model_device(causal_lm)
        self.head = torch.nn.Linear(hidden, 1, dtype=torch.float32, device=self.device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.cfg = cfg
        self.micro_batch_tokens = micro_batch_tokens
        self.autocast_dtype = autocast_dtype
        self.betas, self.weight_decay = tuple(betas), weight_decay
        self.optimizer = adamw(self.parameters(), cfg.lr, betas, weight_decay)

    def _plan(self, rollout: RolloutBatch) -> list[torch.Tensor]:
        return plan_micro_batches(rollout.prompt_mask.sum(dim=1), rollout.completion_mask.sum(dim=1),
                                  self.micro_batch_tokens)

    def _values(self, rollout: RolloutBatch, rows: torch.Tensor):
        mi = micro_inputs(rollout, rows, device=self.device)
        cw = mi.completion_ids.shape[1]
        with autocast(self.device, self.autocast_dtype):
            hidden = self.body(input_ids=mi.input_ids, attention_mask=mi.attention_mask,
                               position_ids=mi.position_ids, use_cache=False).last_hidden_state
        # Position p's state predicts token p+1: the states before the completion tokens are the
        # last cw+1 positions without the final one.
        h = hidden[:, -(cw + 1):-1].float()
        v = self.head(h).squeeze(-1)
        return v.masked_fill(~mi.action_mask, 0.0), mi.action_mask, cw

    @torch.no_grad()
    def values(self, rollout: RolloutBatch) -> torch.Tensor:
        """[N, T] value of the state before each of the model's tokens, on the CPU; 0 on padding
        and observation tokens."""
        out = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32)
        was = self.training
        self.eval()
        try:
            for rows in self._plan(rollout):
                v, _, cw = self._values(rollout, rows)
                out[rows, :cw] = v.cpu()
        finally:
            self.train(was)
        return out

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One AdamW step on the clipped value loss towards ``batch.returns``, token-mean over
        the batch's loss mask (whole-batch normaliser, exact under micro-batching)."""
        if batch.returns is None or batch.old_values is None:
            raise ValueError("the critic's step needs batch.returns and batch.old_values (gae advantages)")
        rollout = batch.rollout
        loss_mask = batch.effective_loss_mask
        n_tok = float(loss_mask.sum().clamp(min=1))
        self.train()
        self.optimizer.zero_grad(set_to_none=True)
        total, clip_frac, finite = 0.0, 0.0, True
        for rows in self._plan(rollout):
            v, actions, cw = self._values(rollout, rows)
            m = loss_mask[rows, :cw].to(self.device) & actions
            per_token, stats = value_loss(v, batch.old_values[rows, :cw].to(self.device),
                                          batch.returns[rows, :cw].to(self.device), m, clip_eps=self.cfg.value_clip)
            loss = aggregate_loss(per_token, m, "token_mean", num_tokens=n_tok)
            if not torch.isfinite(loss):
                finite = False
                break
            loss.backward()
            total += float(loss.detach())
            clip_frac += float(stats["vf_clip_fraction"]) * float(m.sum()) / n_tok
        grad_norm, _ = guarded_step(self.optimizer, list(self.parameters()), self.cfg.grad_clip, finite=finite)
        return {"value_loss": total, "vf_clip_fraction": clip_frac, "critic_grad_norm": grad_norm}

    def state(self) -> dict:
        """Weights (CPU copies) and optimiser state: the critic's part of ``Learner.state_dict``."""
        return {"weights": {k: v.detach().cpu().clone() for k, v in self.state_dict().items()},
                "optimizer": self.optimizer.state_dict()}

    def load(self, state: dict) -> None:
        self.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
        apply_settings(self.optimizer, self.cfg.lr, self.betas, self.weight_decay, scheduled=False)
