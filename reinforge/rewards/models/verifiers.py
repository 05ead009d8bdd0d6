"""Reward models behind the verifier interface: composable by weight with the verifiable rewards
(``reward.verifiers``), batched on the learner's device, each loaded from a local folder.

- ``outcome_rm``: one scalar per completion from a sequence-classification model or a causal LM
  with a value head (reinforge/rewards/models/scorer.py).
- ``prm``: a process reward model's score at each step's last token; a credit rule
  (reinforge/algorithms/credit.py) turns step scores into token rewards on the policy's tokens.
- ``judge``: a local causal LM asked whether the answer (or each step) is correct; its score is
  the probability of its "yes" verdict token against "no".
- ``implicit_prm``: PRIME's implicit PRM, token rewards from the log-ratio of a causal LM to its
  frozen reference, the model itself updated online from the run's outcome labels.

Every one sets ``is_reward_model`` (the reward-hacking guard watches their scores) and
``takes_trajectory`` (token rewards are placed on the trajectory's own tokens).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from reinforge.algorithms.credit import CREDIT_RULES, credit_options, implicit_prm_loss, implicit_process_rewards
from reinforge.batch import Trajectory
from reinforge.rewards.models.scorer import ScalarHeadModel, load_tokenizer_for, local_model_folder, read_meta, render_prompt
from reinforge.rewards.models.steps import StepSplitter, token_ends
from reinforge.rewards.verifiers import VerifierResult
from reinforge.tasks.base import Example

log = logging.getLogger(__name__)

AGGREGATES = ("min", "last", "mean", "prod")
MODES = ("tokens", "score")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def aggregate_steps(values: Sequence[float], how: str) -> float:
    """One score from a solution's step scores: the minimum (Lightman et al.'s "Let's Verify Step
    by Step" convention; a chain is as good as its worst step), the last step's, the mean or the
    product."""
    if not values:
        return 0.0
    if how == "min":
        return float(min(values))
    if how == "last":
        return float(values[-1])
    if how == "mean":
        return float(sum(values) / len(values))
    return float(math.prod(values))


def place_on_tokens(policy_tokenizer, trajectory: Trajectory, char_ends: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """Token rewards [len(trajectory)]: each reward on the policy's token that completes its
    step's last character (moved back to the model's own token before it if that one is not an
    action, e.g. inside tool output; dropped if there is none)."""
    out = [0.0] * len(trajectory)
    if not len(trajectory):
        return out
    # The last action at or before each token, in one pass (walking back from every step end
    # was quadratic when many steps end inside a long observation).
    last_action, last = [], -1
    for i, is_action in enumerate(trajectory.action_mask):
        last = i if is_action else last
        last_action.append(last)
    for idx, r in zip(token_ends(policy_tokenizer, trajectory.token_ids, list(char_ends)), rewards):
        idx = last_action[idx] if idx >= 0 else -1
        if idx >= 0:
            out[idx] += float(r)
    return out


class RewardModelVerifier:
    """Shared by the model-based verifiers: batch of one for ``__call__``, and the error text
    for a verifier used without the policy's tokenizer."""

    is_reward_model = True
    takes_trajectory = True
    name = "reward_model"

    def __call__(self, trajectory: Trajectory, example: Example) -> VerifierResult:
        out = self.score_batch([trajectory], [example])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def score_batch(self, trajectories: Sequence[Trajectory], examples: Sequence[Example]) -> list[VerifierResult | Exception]:
        raise NotImplementedError


class _StepCredit:
    """How step scores become rewards: a splitter, a credit rule with its options, an aggregate
    for the scalar score and the mode (token rewards, or the aggregate as the reward)."""

    def __init__(self, *, separator: str | None, pattern: str | None, max_steps: int | None, credit: str,
                 gamma: float | None, temperature: float | None, shift: float, aggregate: str, mode: str,
                 meta_steps: dict | None = None) -> None:
        steps = dict(meta_steps or {})
        if separator is not None or pattern is not None:
            steps = {"separator": separator if separator is not None else "\n", "pattern": pattern}
        if max_steps is not None:
            steps["max_steps"] = max_steps
        self.splitter = StepSplitter(**{k: v for k, v in steps.items() if k in ("separator", "pattern", "max_steps")})
        CREDIT_RULES.check(credit)
        given = {k: v for k, v in (("gamma", gamma), ("temperature", temperature)) if v is not None}
        accepted = credit_options(credit)
        wrong = [k for k in given if k not in accepted]
        if wrong:
            raise ValueError(f"option(s) {', '.join(wrong)} do not apply to credit={credit!r} (it takes: "
                             f"{', '.join(accepted) or 'nothing'})")
        self.credit = functools.partial(CREDIT_RULES.lookup(credit), **given)
        self.credit_name = credit
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate={aggregate!r}; accepted: {', '.join(AGGREGATES)}")
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; accepted: tokens (credit-assigned token rewards) or score "
                             "(the aggregate step score as the reward)")
        self.shift, self.aggregate, self.mode = float(shift), aggregate, mode

    def result(self, probs: list[float], ends: list[int], trajectory: Trajectory, policy_tokenizer,
               details: dict) -> VerifierResult:
        score = aggregate_steps(probs, self.aggregate)
        details = {**details, "step_scores": [round(p, 4) for p in probs], "steps": len(probs)}
        if self.mode == "score":
            return VerifierResult(score, None, details)
        if policy_tokenizer is None:  # scored outside training (an evaluation): the score only
            return VerifierResult(score, None, details, in_reward=False)
        tokens = [0.0] * len(trajectory)
        if probs:
            s = torch.tensor([[p - self.shift for p in probs]], dtype=torch.float64)
            step_rewards = self.credit(s, torch.ones_like(s, dtype=torch.bool))[0].tolist()
            tokens = place_on_tokens(policy_tokenizer, trajectory, ends, step_rewards)
        return VerifierResult(score, None, details, token_rewards=tokens, in_reward=False)


def _text_of(trajectory: Trajectory) -> str:
    return trajectory.text


class OutcomeRMVerifier(RewardModelVerifier):
    """An outcome reward model: one score per completion, read at its last token.

    path:        local folder (sequence-classification model, or causal LM + value_head.safetensors).
    normalize:   "sigmoid" (default: the score is a probability, as train-rm's RMs are trained
                 with a cross-entropy on verifier labels) or "none" (the raw head value, e.g. a
                 Bradley-Terry reward model).
    batch_size:  completions per forward pass.
    max_length:  tokens the model reads (a longer text loses its start, never its end)."""

    name = "outcome_rm"
    OPTIONS = ("path", "normalize", "batch_size", "max_length")

    def __init__(self, path: str, *, device="cpu", policy_tokenizer=None, normalize: str = "sigmoid",
                 batch_size: int = 8, max_length: int = 1024) -> None:
        if normalize not in ("sigmoid", "none"):
            raise ValueError(f"normalize={normalize!r}; accepted: sigmoid, none")
        self.model = ScalarHeadModel.load(path, device=device, max_length=max_length, what="outcome_rm")
        self.normalize, self.batch_size = normalize, batch_size

    def score_batch(self, trajectories, examples):
        tok = self.model.tokenizer
        texts, ends = [], []
        for t, e in zip(trajectories, examples):
            text = render_prompt(tok, e.messages) + _text_of(t)
            texts.append(text)
            ends.append([len(text)])
        logits = self.model.logits_at(texts, ends, batch_size=self.batch_size)
        out: list[VerifierResult | Exception] = []
        for (z,) in logits:
            out.append(VerifierResult(_sigmoid(z) if self.normalize == "sigmoid" else z, None, {"logit": z}))
        return out


_STEP_OPTIONS = ("separator", "pattern", "max_steps", "credit", "gamma", "temperature", "shift", "aggregate", "mode")


class ProcessRewardVerifier(RewardModelVerifier):
    """A process reward model: the completion split into steps, each scored at its last token.

    path:         local folder (as for outcome_rm; train-rm writes one from Math-Shepherd labels).
    separator:    literal string between steps (default: the model's training split, else "\\n").
    pattern:      regular expression between steps (wins over separator).
    max_steps:    the most steps scored; the rest of the text joins the last.
    credit:       credit rule turning step scores into rewards: "min" (PURE, default), "sum"
                  (discounted), or any registered rule (reinforge/algorithms/credit.py).
    gamma:        credit=sum: discount per step.
    temperature:  credit=min: softmax temperature (PURE: 0.1).
    shift:        subtracted from each step probability before credit (0.5: an even-odds step is
                  worth 0; default 0).
    aggregate:    scalar score from step probabilities: min (default), last, mean, prod.
    mode:         "tokens" (default): credit-assigned rewards on each step's last token, and the
                  aggregate is logged, not added (use a token-level estimator: reinforce_pp, gae);
                  "score": the aggregate is the reward (any estimator), no token rewards."""

    name = "prm"
    OPTIONS = ("path", "normalize", "batch_size", "max_length") + _STEP_OPTIONS

    def __init__(self, path: str, *, device="cpu", policy_tokenizer=None, normalize: str = "sigmoid",
                 separator: str | None = None, pattern: str | None = None, max_steps: int | None = None,
                 credit: str = "min", gamma: float | None = None, temperature: float | None = None,
                 shift: float = 0.0, aggregate: str = "min", mode: str = "tokens", batch_size: int = 8,
                 max_length: int = 1024) -> None:
        if normalize not in ("sigmoid", "none"):
            raise ValueError(f"normalize={normalize!r}; accepted: sigmoid, none")
        folder = local_model_folder(path, "prm")
        self.steps = _StepCredit(separator=separator, pattern=pattern, max_steps=max_steps, credit=credit,
                                 gamma=gamma, temperature=temperature, shift=shift, aggregate=aggregate, mode=mode,
                                 meta_steps=read_meta(folder).get("steps"))
        self.model = ScalarHeadModel.load(folder, device=device, max_length=max_length, what="prm")
        self.policy_tokenizer, self.normalize, self.batch_size = policy_tokenizer, normalize, batch_size

    def step_scores(self, prompts: Sequence[list[dict]], completions: Sequence[str]) -> list[tuple[list[float], list[int]]]:
        """For each completion: its step probabilities (or raw values with normalize=none) and
        the character offsets where its steps end."""
        tok = self.model.tokenizer
        texts, where, ends = [], [], []
        for messages, text in zip(prompts, completions):
            prefix = render_prompt(tok, messages)
            spans = self.steps.splitter.spans(text)
            texts.append(prefix + text)
            where.append([len(prefix) + b for _, b in spans])
            ends.append([b for _, b in spans])
        todo = [i for i, w in enumerate(where) if w]
        values = self.model.logits_at([texts[i] for i in todo], [where[i] for i in todo], batch_size=self.batch_size)
        out: list[tuple[list[float], list[int]]] = [([], e) for e in ends]
        for i, v in zip(todo, values):
            out[i] = ([_sigmoid(z) if self.normalize == "sigmoid" else z for z in v], ends[i])
        return out

    def score_batch(self, trajectories, examples):
        scored = self.step_scores([e.messages for e in examples], [_text_of(t) for t in trajectories])
        return [self.steps.result(p, ends, t, self.policy_tokenizer, {}) for (p, ends), t in zip(scored, trajectories)]


# Characters per token at most, generously (text averages ~4; long whitespace tokens ~16).
_CHARS_PER_TOKEN = 32

DEFAULT_ANSWER_TEMPLATE = ("Question:\n{question}\n\nProposed solution:\n{solution}\n\n"
                           "Is this solution correct? Answer Yes or No.")
DEFAULT_STEP_TEMPLATE = ("Question:\n{question}\n\nSolution so far:\n{solution}\n\n"
                         "Is the last step correct? Answer Yes or No.")


class JudgeVerifier(RewardModelVerifier):
    """A generative judge: a local causal LM asked whether the answer (or each step) is correct;
    the score is ``p(yes) / (p(yes) + p(no))`` of its next token after the question (the verdict
    probability scoring of generative verifiers, e.g. "Generative Verifiers: Reward Modeling as
    Next-Token Prediction", Zhang et al., 2024, arXiv:2408.15240).

    path:      local folder of a causal LM (with its tokenizer; its chat template is used).
    unit:      "answer" (one verdict per completion, the score) or "step" (one verdict per step,
               with the step options and credit rules of the prm verifier).
    template:  the question put to the judge, with {question} and {solution} (the solution up to
               the judged step for unit=step).
    yes, no:   the verdict words; their first token is compared (default "Yes"/"No").
    plus separator, pattern, max_steps, credit, gamma, temperature, shift, aggregate, mode as for prm."""

    name = "judge"
    OPTIONS = ("path", "unit", "template", "yes", "no", "batch_size", "max_length") + _STEP_OPTIONS

    def __init__(self, path: str, *, device="cpu", policy_tokenizer=None, unit: str = "answer",
                 template: str | None = None, yes: str = "Yes", no: str = "No", batch_size: int = 8,
                 max_length: int = 1024, separator: str | None = None, pattern: str | None = None,
                 max_steps: int | None = None, credit: str = "min", gamma: float | None = None,
                 temperature: float | None = None, shift: float = 0.0, aggregate: str = "min",
                 mode: str = "tokens") -> None:
        from transformers import AutoModelForCausalLM

        if unit not in ("answer", "step"):
            raise ValueError(f"unit={unit!r}; accepted: answer, step")
        folder = local_model_folder(path, "judge")
        self.tokenizer = load_tokenizer_for(folder)
        self.tokenizer.padding_side = "left"
        self.tokenizer.truncation_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).to(device).eval()
        self.template = template or (DEFAULT_STEP_TEMPLATE if unit == "step" else DEFAULT_ANSWER_TEMPLATE)
        for key in ("{question}", "{solution}"):
            if key not in self.template:
                raise ValueError(f"the judge template must contain {key}")
        ids = [self.tokenizer.encode(w, add_special_tokens=False) for w in (yes, no)]
        if not ids[0] or not ids[1] or ids[0][0] == ids[1][0]:
            raise ValueError(f"the verdict words {yes!r} and {no!r} must start with different tokens")
        self.yes_id, self.no_id = ids[0][0], ids[1][0]
        self.unit, self.batch_size, self.max_length = unit, batch_size, max_length
        self.policy_tokenizer = policy_tokenizer
        self.steps = _StepCredit(separator=separator, pattern=pattern, max_steps=max_steps, credit=credit,
                                 gamma=gamma, temperature=temperature, shift=shift, aggregate=aggregate, mode=mode)

    def _question(self, example: Example, solution: str) -> str:
        user = [m for m in example.messages if m.get("role") == "user"]
        question = str(user[-1].get("content", "")) if user else example.prompt_text
        content = self.template.replace("{question}", question).replace("{solution}", solution)
        return render_prompt(self.tokenizer, [{"role": "user", "content": content}])

    @torch.no_grad()
    def verdicts(self, prompts: list[str]) -> list[float]:
        """p(yes) / (p(yes) + p(no)) of the judge's next token after each prompt."""
        device = next(self.model.parameters()).device
        out: list[float] = []
        for b in range(0, len(prompts), self.batch_size):
            enc = self.tokenizer(prompts[b : b + self.batch_size], add_special_tokens=False, padding=True,
                                 truncation=True, max_length=self.max_length, return_tensors="pt")
            mask = enc["attention_mask"].to(device)
            logits = self.model(input_ids=enc["input_ids"].to(device), attention_mask=mask,
                                position_ids=(mask.cumsum(1) - 1).clamp(min=0), logits_to_keep=1).logits[:, -1].float()
            pair = torch.log_softmax(logits[:, [self.yes_id, self.no_id]], dim=-1)
            out += pair[:, 0].exp().tolist()
        return out

    def score_batch(self, trajectories, examples):
        if self.unit == "answer":
            probs = self.verdicts([self._question(e, _text_of(t)) for t, e in zip(trajectories, examples)])
            return [VerifierResult(p, None, {"verdict": p}) for p in probs]
        prompts, owner, ends = [], [], []
        for i, (t, e) in enumerate(zip(trajectories, examples)):
            text = _text_of(t)
            spans = self.steps.splitter.spans(text)
            ends.append([b for _, b in spans])
            for _, b in spans:
                # The judge reads the prompt's last max_length tokens: the solution's last
                # _CHARS_PER_TOKEN x max_length characters hold them (the whole prefix per step
                # made building and tokenizing the prompts quadratic in the completion).
                prompts.append(self._question(e, text[max(0, b - _CHARS_PER_TOKEN * self.max_length):b]))
                owner.append(i)
        probs = self.verdicts(prompts) if prompts else []
        per: list[list[float]] = [[] for _ in trajectories]
        for i, p in zip(owner, probs):
            per[i].append(p)
        return [self.steps.result(per[i], ends[i], t, self.policy_tokenizer, {}) for i, t in enumerate(trajectories)]


def sequence_logprobs(model, rows: Sequence[tuple[list[int], list[int]]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [B, T] of each row's continuation tokens after its prompt (right-padded, 0 on
    padding) and the padding mask [B, T]; with gradients when enabled."""
    pad = 0
    full = [p + c for p, c in rows]
    width = max(len(f) for f in full)
    ids = torch.full((len(full), width), pad, dtype=torch.long)
    attn = torch.zeros((len(full), width), dtype=torch.long)
    for i, f in enumerate(full):
        ids[i, : len(f)] = torch.tensor(f)
        attn[i, : len(f)] = 1
    T = max(len(c) for _, c in rows)
    logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits.float()
    lp = torch.log_softmax(logits, dim=-1)
    out = torch.zeros((len(rows), T), dtype=torch.float32, device=device)
    mask = torch.zeros((len(rows), T), dtype=torch.bool)
    for i, (p, c) in enumerate(rows):
        if c:
            pos = torch.arange(len(p) - 1, len(p) - 1 + len(c), device=device)
            out[i, : len(c)] = lp[i, pos, torch.tensor(c, device=device)]
            mask[i, : len(c)] = True
    return out, mask.to(device)


class ImplicitPRMVerifier(RewardModelVerifier):
    """PRIME's implicit process reward model ("Process Reinforcement through Implicit Rewards",
    Cui et al., 2025, arXiv:2502.01456): a causal LM ``pi_phi`` and its frozen copy ``pi_ref``
    give each of the model's tokens the reward ``beta * log(pi_phi / pi_ref)``
    (``algorithms.credit.implicit_process_rewards``), and after each training batch is scored
    ``pi_phi`` takes one AdamW step on the cross-entropy of its implicit outcome
    ``sigmoid(beta * sum_t log(pi_phi / pi_ref))`` against the verifiers' correctness
    (``algorithms.credit.implicit_prm_loss``). PRIME initialises both from the policy's starting
    model. Its score (logged, not added) is the implicit outcome probability.

    path:        local folder of a causal LM that shares the policy's tokenizer (it scores the
                 policy's token ids); usually the policy's own model.path.
    beta:        the reward scale (PRIME: 0.05).
    lr:          the implicit PRM's learning rate (PRIME: 1e-6).
    update:      update it online from outcome labels (default true; false: a fixed implicit PRM).
    batch_size:  trajectories per forward pass.

    Its weights and optimiser are in the run's checkpoints (``state_dict``), so a resumed run
    continues with the implicit PRM it had, not a fresh one from ``path``."""

    name = "implicit_prm"
    OPTIONS = ("path", "beta", "lr", "update", "batch_size")

    def __init__(self, path: str, *, device="cpu", policy_tokenizer=None, beta: float = 0.05, lr: float = 1e-6,
                 update: bool = True, batch_size: int = 4) -> None:
        from transformers import AutoModelForCausalLM

        folder = local_model_folder(path, "implicit_prm")
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).to(device)
        self.ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).to(device).eval()
        for p in self.ref.parameters():
            p.requires_grad_(False)
        if policy_tokenizer is not None:
            rows = self.model.get_input_embeddings().weight.shape[0]
            if rows < len(policy_tokenizer):
                raise ValueError(f"implicit_prm: {str(folder)!r} has {rows} token embeddings but the policy's "
                                 f"tokenizer has {len(policy_tokenizer)} tokens; it must share the policy's tokenizer")
        if beta <= 0:
            raise ValueError(f"implicit_prm beta must be > 0, got {beta}")
        self.beta, self.update, self.batch_size = float(beta), bool(update), int(batch_size)
        self.device = device
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=lr)
        self.last_loss: float | None = None
        self.steps_taken = 0

    def _rows(self, trajectories):
        return [(list(t.prompt_ids), list(t.token_ids)) for t in trajectories]

    @torch.no_grad()
    def score_batch(self, trajectories, examples):
        out: list[VerifierResult | Exception] = []
        self.model.eval()
        for b in range(0, len(trajectories), self.batch_size):
            chunk = trajectories[b : b + self.batch_size]
            rows = self._rows(chunk)
            lp_phi, mask = sequence_logprobs(self.model, rows, self.device)
            lp_ref, _ = sequence_logprobs(self.ref, rows, self.device)
            actions = torch.zeros_like(mask)
            for i, t in enumerate(chunk):
                actions[i, : len(t)] = torch.tensor(t.action_mask, dtype=torch.bool)
            rewards = implicit_process_rewards(lp_phi, lp_ref, mask & actions.to(mask.device), beta=self.beta).cpu()
            for i, t in enumerate(chunk):
                tokens = rewards[i, : len(t)].tolist()
                out.append(VerifierResult(_sigmoid(sum(tokens)), None, {}, token_rewards=tokens, in_reward=False))
        return out

    def state_dict(self) -> dict | None:
        """What a checkpoint keeps: the online-updated model's weights (CPU copies) and its AdamW
        state; None until it has taken a step (it is then ``path`` itself, as is the frozen
        reference), so a fixed implicit PRM adds nothing to checkpoints."""
        if not self.steps_taken:
            return None
        return {"weights": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict(), "last_loss": self.last_loss,
                "steps_taken": self.steps_taken}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.last_loss = state.get("last_loss")
        self.steps_taken = int(state.get("steps_taken", 1))

    def learn_from_outcomes(self, trajectories: Sequence[Trajectory], examples: Sequence[Example], correct: torch.Tensor) -> None:
        """One optimiser step of PRIME's cross-entropy on this batch's outcome labels."""
        if not self.update or not len(trajectories):
            return
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total, n = 0.0, len(trajectories)
        for b in range(0, n, self.batch_size):
            chunk = trajectories[b : b + self.batch_size]
            rows = self._rows(chunk)
            lp_phi, mask = sequence_logprobs(self.model, rows, self.device)
            with torch.no_grad():
                lp_ref, _ = sequence_logprobs(self.ref, rows, self.device)
            actions = torch.zeros_like(mask)
            for i, t in enumerate(chunk):
                actions[i, : len(t)] = torch.tensor(t.action_mask, dtype=torch.bool)
            labels = correct[b : b + len(chunk)].to(lp_phi.device)
            # Each chunk's mean loss weighted by its share, so the step equals one whole-batch loss.
            loss = implicit_prm_loss(lp_phi, lp_ref, mask & actions.to(mask.device), labels, beta=self.beta) * len(chunk) / n
            loss.backward()
            total += float(loss.detach())
        self.optimizer.step()
        self.model.eval()
        self.last_loss = total
        self.steps_taken += 1


VERIFIERS: dict[str, type[RewardModelVerifier]] = {
    v.name: v for v in (OutcomeRMVerifier, ProcessRewardVerifier, JudgeVerifier, ImplicitPRMVerifier)
}


def build_reward_model_verifier(name: str, options: dict[str, Any], *, device="cpu", policy_tokenizer=None,
                                where: str = "reward.verifiers") -> RewardModelVerifier:
    """The reward-model verifier ``name`` from its config options; unknown or missing options are
    named in the error."""
    cls = VERIFIERS[name]
    unknown = [k for k in options if k not in cls.OPTIONS]
    if unknown:
        raise ValueError(f"{where}.options: unknown option(s) {', '.join(map(repr, unknown))} for verifier "
                         f"{name!r}; accepted: {', '.join(cls.OPTIONS)}")
    if "path" not in options:
        raise ValueError(f"{where}.options.path is required for the {name} verifier: a local model folder "
                         "(e.g. the final_model/ of a `reinforge train-rm` run)")
    opts = dict(options)
    path = opts.pop("path")
    try:
        return cls(path, device=device, policy_tokenizer=policy_tokenizer, **opts)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}.options ({name} verifier): {err}") from None
