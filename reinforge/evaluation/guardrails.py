"""Guardrails: what a held-out score must beat before it counts as learning.

A small model trained with RL often gains held-out accuracy by learning the task's *answer
distribution* (answering the most common answer to every prompt) or the *answer format* (the
base model knew some answers but wrote them where the extractor could not find them), not the
skill. Each held-out evaluation (the trainer's greedy one and ``reinforge eval``'s sampled one)
therefore records, beside its accuracy:

- **well-formed share**: completions in which the answer extractor finds a non-empty answer in
  the format the reward requires (``reward.answer_format``; for code verifiers: a program that
  parses as Python and defines the entry point), and the accuracy among those completions.
- **answer spread**: how many distinct answers the model gave and its most frequent answer's
  share of all completions (1 distinct answer at share 1.0 is a constant answerer).
- **best constant answer**: of a capped set of candidates (the most common gold answers of the
  training and held-out examples and the model's own most common answers), the one that would be
  correct on the most held-out prompts if given to every prompt. Candidates are scored by the
  run's own reward function (its correctness verdict, so equivalent forms count as the verifiers
  accept them), not by string equality. It is chosen on the held-out prompts it is scored on, so
  it is an optimistic (hard to beat) baseline.
- **training answers' distribution**: the expected accuracy of answering each held-out prompt
  with a random draw from the training examples' gold answers, sum_a p_train(a) * acc(a).
- paired bootstrap intervals (over prompts) of the model's accuracy minus each baseline.

:func:`reinforge.evaluation.verdict.guardrail_verdict` turns two evaluations (the base model's and a later one) into one
verdict: the gain over the base model and over the prior baselines (best constant answer,
training distribution, and the *format-only baseline*, the base model's accuracy among its
well-formed completions: what fixing the format alone would give), each with a 95% paired
bootstrap interval, and plain words when the prior or the format explains the gain.

Code tasks have no answer to hold constant: both prior baselines are recorded as not applicable.
Neither has an environment's episodes (a game: ``task.source: env`` with a text environment,
reinforge/agents/adapters): there the baselines are the policies the environment declares (a
random policy, a scripted one), each run over the same held-out episodes without the model, its
success rate recorded beside the model's with the paired interval of the difference
(``baselines``).
"""

from __future__ import annotations

import ast
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from reinforge.evaluation.stats import paired_bootstrap_diff

if TYPE_CHECKING:
    from reinforge.tasks import Example, Task

log = logging.getLogger(__name__)

__all__ = [
    "Guardrails",
    "PromptCounts",
    "answer_completion",
    "answer_spread",
    "extract_answers",
    "prompt_counts",
    "well_formed_flags",
]

# Candidates for the best constant answer taken from each source (held-out golds, training
# golds, the model's answers), most frequent first; the union is scored on every prompt.
CANDIDATES_PER_SOURCE = 16
# Training answers scored exactly for the training-distribution baseline (the most frequent);
# rarer ones are matched to held-out golds by normalised string equality (see _train_prior).
TRAIN_PRIOR_SCORED = 32
# Training examples read for the answer distribution, evenly spaced over the training set.
TRAIN_ANSWER_SAMPLE = 2000
# A longer candidate is no plausible constant answer (and would only cost scoring time).
MAX_CANDIDATE_CHARS = 200
_SCORE_CHUNK = 4096


# ----------------------------------------------------------------------------- per completion


def _norm(text: str) -> str:
    from reinforge.tasks import normalize_answer

    return normalize_answer(text, case_sensitive=True)


def _program_well_formed(completion: str, entry_point: str | None) -> bool:
    """A program was found that parses as Python (parsed, never run) and defines the entry point
    when the problem has one."""
    from reinforge.rewards.code import extract_code

    program = extract_code(completion, entry_point)
    if program is None or not program.strip():
        return False
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if not entry_point:
        return True
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point for n in tree.body)


def well_formed_flags(completions: Sequence[str], answer_format: str, *, code: bool = False,
                      entry_points: Sequence[str | None] | None = None) -> list[bool]:
    """Whether each completion is well-formed: the answer extractor of ``answer_format`` finds a
    non-empty answer (code: a program that parses and defines its entry point)."""
    from reinforge.rewards import extract_answer

    if code:
        eps = entry_points if entry_points is not None else [None] * len(completions)
        return [_program_well_formed(c, ep) for c, ep in zip(completions, eps)]
    out = []
    for c in completions:
        a = extract_answer(c, answer_format)
        out.append(a is not None and bool(a.strip()))
    return out


def extract_answers(completions: Sequence[str], answer_format: str, *, code: bool = False) -> list[str | None]:
    """Each completion's answer, whitespace-normalised (case kept), None when none was found. For
    code the 'answer' is the program with its whitespace normalised."""
    if code:
        from reinforge.rewards.code import extract_code

        progs = [extract_code(c) for c in completions]
        return [_norm(p) if p is not None and p.strip() else None for p in progs]
    from reinforge.rewards import extract_answer

    out: list[str | None] = []
    for c in completions:
        a = extract_answer(c, answer_format)
        out.append(_norm(a) if a is not None and a.strip() else None)
    return out


def answer_spread(answers: Sequence[str | None]) -> dict[str, Any]:
    """Distinct answers (case-insensitive, as maj@k votes) among the answered completions, and
    the most frequent one with its count and share of ALL completions (unanswered included)."""
    keyed = [a.lower() for a in answers if a is not None]
    n = len(answers)
    if not keyed:
        return {"n_completions": n, "n_answered": 0, "distinct_answers": 0, "top_answer": None,
                "top_answer_count": 0, "top_answer_share": 0.0}
    counts = Counter(keyed)
    top_key, top_count = counts.most_common(1)[0]
    shown = Counter(a for a in answers if a is not None and a.lower() == top_key).most_common(1)[0][0]
    return {"n_completions": n, "n_answered": len(keyed), "distinct_answers": len(counts), "top_answer": shown,
            "top_answer_count": int(top_count), "top_answer_share": top_count / n}


def answer_completion(answer: str, answer_format: str) -> str:
    """The shortest completion that gives ``answer`` in ``answer_format`` (what a model that always
    answers ``answer`` would write)."""
    if answer_format == "tags":
        return f"<answer>{answer}</answer>"
    if answer_format == "boxed":
        return f"\\boxed{{{answer}}}"
    if answer_format in ("last_line", "raw"):
        return answer
    raise ValueError(f"unknown answer format {answer_format!r}")


# ----------------------------------------------------------------------------- per evaluation


def _top(counter: Counter, k: int) -> list[str]:
    # most frequent first, ties in a stable (alphabetical) order so runs are reproducible
    return [a for a, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


@dataclass
class Guardrails:
    """Measures the guardrails of one evaluation; built once per run and reused for every
    evaluation (scores of constant candidates are cached, so later evaluations only score the
    model's new answers).

    reward_fn:      the run's RewardFunction; its correctness verdict scores constant answers.
    answer_format:  reward.answer_format.
    code:           a code verifier scores the task: no constant answer, programs as answers.
    train_answers:  gold answers of (a sample of) the training examples; empty when they have none,
                    None to read them from ``train_examples`` when first needed.
    not_applicable: why the prior baselines are not computed (None when they are).
    policies:       a task whose ``run_baselines(examples, max_turns=)`` gives each declared
                    baseline policy's per-episode success (an environment's task), else None.
    max_turns:      the turns a baseline policy gets per episode (the run's ``env.max_turns``).
    """

    reward_fn: Any
    answer_format: str
    code: bool = False
    train_answers: list[str] | None = field(default_factory=list)
    train_examples: Sequence["Example"] | None = None
    not_applicable: str | None = None
    seed: int = 0
    n_resamples: int = 10_000
    candidates_per_source: int = CANDIDATES_PER_SOURCE
    train_prior_scored: int = TRAIN_PRIOR_SCORED
    policies: Any = None
    max_turns: int = 8
    _cache: dict[tuple[str, str], bool] = field(default_factory=dict, repr=False)
    _policy_cache: dict[str, dict[str, bool]] = field(default_factory=dict, repr=False)
    # (candidate, prompt id) pairs whose scoring was a reward error (a verifier raised or returned
    # no valid score): counted as not correct, and reported, since they say nothing either way.
    _errors: set[tuple[str, str]] = field(default_factory=set, repr=False)

    @classmethod
    def build(cls, task: "Task", reward_fn: Any, reward_cfg: Any, *, seed: int = 0,
              n_resamples: int = 10_000, max_turns: int | None = None) -> "Guardrails":
        """From the task (its training answers, read at the first evaluation) and the reward
        config (format, verifiers); ``max_turns``: an environment's turns per episode."""
        if callable(getattr(task, "run_baselines", None)):  # an environment's episodes: policies, not answers
            return cls(reward_fn=reward_fn, answer_format=reward_cfg.answer_format, train_answers=[],
                       not_applicable="the task is an environment's episodes: there is no answer to hold "
                       "constant (its baselines are policies, see baselines)", seed=seed,
                       n_resamples=n_resamples, policies=task, max_turns=int(max_turns or 8))
        names = {v.name for v in reward_cfg.verifiers}
        code = "code" in names or getattr(task, "needs_verifier", None) == "code"
        reason = "the task is scored by running code: there is no answer to hold constant" if code else None
        return cls(reward_fn=reward_fn, answer_format=reward_cfg.answer_format, code=code,
                   train_answers=None if not code else [], train_examples=None if code else task.train_examples(),
                   not_applicable=reason, seed=seed, n_resamples=n_resamples)

    def _load_train_answers(self) -> list[str]:
        """Gold answers of up to TRAIN_ANSWER_SAMPLE training examples, evenly spaced (reasoning-gym
        makes training examples on first access, so they are read once, when first needed)."""
        if self.train_answers is None:
            examples = self.train_examples if self.train_examples is not None else []
            n = len(examples)
            idx = np.unique(np.linspace(0, n - 1, min(n, TRAIN_ANSWER_SAMPLE)).round().astype(int)) if n else []
            self.train_answers = [str(examples[int(i)].answer) for i in idx if examples[int(i)].answer is not None]
        return self.train_answers

    # -- scoring constant answers

    def _correct_matrix(self, candidates: list[str], examples: Sequence["Example"]) -> np.ndarray:
        """[candidates, prompts] bool: the reward function's correctness verdict on a completion
        that gives the candidate in the required format."""
        todo = [(c, e) for c in candidates for e in examples if (c, e.id) not in self._cache]
        for start in range(0, len(todo), _SCORE_CHUNK):
            chunk = todo[start:start + _SCORE_CHUNK]
            outcomes = self.reward_fn([answer_completion(c, self.answer_format) for c, _ in chunk],
                                      [e for _, e in chunk])
            for (c, e), o in zip(chunk, outcomes):
                self._cache[(c, e.id)] = bool(o.correct)
                if getattr(o, "errors", None):
                    self._errors.add((c, e.id))
        return np.array([[self._cache[(c, e.id)] for e in examples] for c in candidates], dtype=bool).reshape(
            len(candidates), len(examples))

    def _candidates(self, examples: Sequence["Example"], model_answers: Sequence[str | None]) -> list[str]:
        """The most common held-out golds, training golds and model answers, in that order, deduplicated."""
        def usable(a: str | None) -> bool:
            return a is not None and bool(a.strip()) and len(a) <= MAX_CANDIDATE_CHARS

        sources = [
            Counter(_norm(e.answer) for e in examples if usable(e.answer)),
            Counter(_norm(a) for a in self._load_train_answers() if usable(a)),
            Counter(a for a in model_answers if usable(a)),
        ]
        out: list[str] = []
        for counter in sources:
            out += [a for a in _top(counter, self.candidates_per_source) if a not in out]
        return out

    def _train_prior(self, examples: Sequence["Example"]) -> tuple[np.ndarray, dict[str, Any], int]:
        """Per prompt: the probability that a random training answer is correct for it. The most
        frequent training answers are scored by the reward function; the rarer rest (each a small
        share) are counted correct where they equal the prompt's gold answer after normalisation,
        so equivalent forms among them are missed (a slight underestimate). Also returns how many
        scorings were made (info's reward_errors: how many of them failed)."""
        counts = Counter(_norm(a) for a in self._load_train_answers() if a.strip())
        total = sum(counts.values())
        scored = [a for a in _top(counts, self.train_prior_scored) if len(a) <= MAX_CANDIDATE_CHARS]
        q = np.zeros(len(examples))
        if scored:
            q += (np.array([counts[a] / total for a in scored])[:, None]
                  * self._correct_matrix(scored, examples)).sum(axis=0)
        exact = set(scored)
        rest = {a: c / total for a, c in counts.items() if a not in exact}
        for i, e in enumerate(examples):
            if e.answer is not None:
                q[i] += rest.get(_norm(e.answer), 0.0)
        top = _top(counts, 1)[0]
        return q, {"train_answers": total, "distinct_train_answers": len(counts),
                   "scored_share": sum(counts[a] for a in scored) / total, "top_train_answer": top,
                   "top_train_share": counts[top] / total,
                   "reward_errors": self._failed(scored, examples)}, len(scored) * len(examples)

    # -- the record of one evaluation

    def measure(self, examples: Sequence["Example"], completions: Sequence[Sequence[str]],
                correct: Sequence[Sequence[float]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Guardrails of one evaluation: ``completions[i]`` and ``correct[i]`` are prompt i's
        samples (one for greedy). Returns (record, per-prompt fields {"answers", "well_formed"}),
        the record as described in the module docstring (``docs/experiments.md``)."""
        if not (len(examples) == len(completions) == len(correct)):
            raise ValueError(f"{len(examples)} prompts, {len(completions)} completion lists, {len(correct)} "
                             "correctness lists: one of each per prompt is needed")
        per_prompt = []
        all_answers: list[str | None] = []
        for e, comps in zip(examples, completions):
            ep = (e.metadata or {}).get("entry_point") if self.code else None
            answers = extract_answers(comps, self.answer_format, code=self.code)
            wf = well_formed_flags(comps, self.answer_format, code=self.code, entry_points=[ep] * len(comps))
            per_prompt.append({"answers": answers, "well_formed": wf})
            all_answers += answers
        counts = PromptCounts.from_lists(correct, [p["well_formed"] for p in per_prompt])
        record: dict[str, Any] = {
            "n_prompts": len(examples), "n_completions": int(counts.n.sum()),
            "well_formed": counts.well_formed_share,
            "n_well_formed": int(counts.wf.sum()),
            "accuracy_well_formed": counts.accuracy_well_formed,
            **{k: v for k, v in answer_spread(all_answers).items() if k not in ("n_completions",)},
        }
        if self.code:
            record["top_answer"] = None if record["top_answer"] is None else _short(record["top_answer"], 80)
        model_acc = counts.per_prompt_accuracy
        boot = dict(n_resamples=self.n_resamples, seed=self.seed)
        if self.policies is not None:
            record["baselines"] = self._policy_baselines(examples, model_acc, boot)
        if self.not_applicable is not None:
            na = {"applicable": False, "reason": self.not_applicable}
            record["best_constant"] = dict(na)
            record["train_prior"] = dict(na)
            return record, per_prompt
        candidates = self._candidates(examples, all_answers)
        if not candidates:
            record["best_constant"] = {"applicable": False, "reason": "no gold or model answer to try as a constant"}
        else:
            matrix = self._correct_matrix(candidates, examples)
            failed = self._failed(candidates, examples)
            if failed == matrix.size:  # an accuracy of 0 here would be a claim nothing measured
                record["best_constant"] = _unmeasured(failed, "constant answers")
            else:
                acc = matrix.mean(axis=1)
                best = int(np.argmax(acc))  # first of the ties: the most frequent source's order
                diff = paired_bootstrap_diff(matrix[best].astype(float), model_acc, **boot)
                record["best_constant"] = {
                    "applicable": True, "answer": candidates[best], "accuracy": float(acc[best]),
                    "n_candidates": len(candidates), "model_minus": _diff_fields(diff), "reward_errors": failed}
        if not self._load_train_answers():
            record["train_prior"] = {"applicable": False, "reason": "the training examples have no gold answers"}
        else:
            q, info, tried = self._train_prior(examples)
            if tried and info["reward_errors"] == tried:
                record["train_prior"] = _unmeasured(tried, "training answers")
            else:
                diff = paired_bootstrap_diff(q, model_acc, **boot)
                record["train_prior"] = {"applicable": True, "accuracy": float(q.mean()), **info,
                                         "model_minus": _diff_fields(diff)}
        return record, per_prompt

    def _policy_baselines(self, examples: Sequence["Example"], model_acc: np.ndarray,
                          boot: dict[str, Any]) -> dict[str, Any]:
        """Each declared baseline policy's success on these held-out episodes (run once per
        episode, then cached) and the model's per-prompt accuracy minus it, paired by episode."""
        todo = [e for e in examples if e.id not in self._policy_cache.setdefault("", {})]
        if todo:
            for name, wins in self.policies.run_baselines(todo, max_turns=self.max_turns).items():
                self._policy_cache.setdefault(name, {}).update({e.id: bool(w) for e, w in zip(todo, wins)})
            self._policy_cache[""].update({e.id: True for e in todo})  # "": the episodes already run
        out: dict[str, Any] = {}
        for name, by_id in self._policy_cache.items():
            if not name or any(e.id not in by_id for e in examples):
                continue
            wins = np.array([by_id[e.id] for e in examples], dtype=float)
            diff = paired_bootstrap_diff(wins, model_acc, **boot)
            out[name] = {"applicable": True, "success": float(wins.mean()), "n_episodes": len(examples),
                         "max_turns": self.max_turns, "model_minus": _diff_fields(diff)}
        return out

    def _failed(self, candidates: Sequence[str], examples: Sequence["Example"]) -> int:
        """How many of the candidates' scorings on these prompts were reward errors."""
        return sum((c, e.id) in self._errors for c in candidates for e in examples)


def _unmeasured(failed: int, what: str) -> dict[str, Any]:
    return {"applicable": False, "reward_errors": failed,
            "reason": f"the reward function gave no valid score: all {failed} scorings of {what} were reward errors, "
                      "see the run's reward_errors and the logged reason"}


def _diff_fields(diff: dict[str, Any]) -> dict[str, Any]:
    return {k: diff[k] for k in ("diff", "ci_low", "ci_high", "excludes_zero")}


def flat_metrics(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers as flat top-level keys of an evaluation summary (evals.jsonl), so
    ``reinforge compare --metric`` and the exporters see them."""
    out: dict[str, float] = {"well_formed": record["well_formed"], "distinct_answers": record["distinct_answers"],
                             "top_answer_share": record["top_answer_share"]}
    if record.get("accuracy_well_formed") is not None:
        out["accuracy_well_formed"] = record["accuracy_well_formed"]
    if record["best_constant"].get("applicable"):
        out["best_constant_accuracy"] = record["best_constant"]["accuracy"]
    if record["train_prior"].get("applicable"):
        out["train_prior_accuracy"] = record["train_prior"]["accuracy"]
    for name, b in (record.get("baselines") or {}).items():
        out[f"baseline_{name}_success"] = b["success"]
    return out


# ----------------------------------------------------------------------------- per-prompt counts (the verdict's input)


@dataclass
class PromptCounts:
    """Per prompt: completions, correct ones, well-formed ones, correct well-formed ones."""

    ids: list[str]
    n: np.ndarray
    correct: np.ndarray
    wf: np.ndarray
    correct_wf: np.ndarray

    @classmethod
    def from_lists(cls, correct: Sequence[Sequence[float]], well_formed: Sequence[Sequence[bool]],
                   ids: Sequence[str] | None = None) -> "PromptCounts":
        c = [np.asarray(x, dtype=float) for x in correct]
        w = [np.asarray(x, dtype=float) for x in well_formed]
        return cls(ids=list(ids) if ids is not None else [str(i) for i in range(len(c))],
                   n=np.array([len(x) for x in c], dtype=float), correct=np.array([x.sum() for x in c]),
                   wf=np.array([x.sum() for x in w]), correct_wf=np.array([(x * y).sum() for x, y in zip(c, w)]))

    @property
    def per_prompt_accuracy(self) -> np.ndarray:
        return self.correct / np.maximum(self.n, 1)

    @property
    def accuracy(self) -> float:
        return float(self.correct.sum() / max(self.n.sum(), 1))

    @property
    def well_formed_share(self) -> float:
        return float(self.wf.sum() / max(self.n.sum(), 1))

    @property
    def accuracy_well_formed(self) -> float | None:
        return float(self.correct_wf.sum() / self.wf.sum()) if self.wf.sum() > 0 else None

    def select(self, ids: Sequence[str]) -> "PromptCounts":
        pos = {i: k for k, i in enumerate(self.ids)}
        idx = [pos[i] for i in ids]
        return PromptCounts(list(ids), self.n[idx], self.correct[idx], self.wf[idx], self.correct_wf[idx])


def prompt_counts(rows: Sequence[dict[str, Any]], answer_format: str, *, code: bool = False) -> PromptCounts:
    """PromptCounts from an evaluation's per-prompt rows: greedy rows ({"completion", "correct"})
    or sampled rows ({"completions", "correct": [...]}). Rows written before the guardrails
    existed have no "well_formed": it is computed from the completions."""
    correct, wf = [], []
    for r in rows:
        comps = r["completions"] if "completions" in r else [r["completion"]]
        cor = r["correct"] if isinstance(r["correct"], list) else [r["correct"]]
        flags = r.get("well_formed")
        if flags is None:
            ep = (r.get("metadata") or {}).get("entry_point") if code else None
            flags = well_formed_flags(comps, answer_format, code=code, entry_points=[ep] * len(comps))
        elif not isinstance(flags, list):
            flags = [flags]
        correct.append([float(x) for x in cor])
        wf.append([bool(x) for x in flags])
    return PromptCounts.from_lists(correct, wf, ids=[str(r["id"]) for r in rows])
