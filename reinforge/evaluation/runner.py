"""Running a model on held-out prompts: the trainer's greedy evaluation and ``reinforge eval``'s
sampled evaluation (N completions per prompt, pass@k, maj@k) share these functions, so both build
prompts, generate and score exactly the same way.

The policy to evaluate is a :class:`ModelSource`: a bare model (a local Hugging Face folder or the
default model), a run's final model, or one of a run's checkpoints. Task and reward come from a
:class:`~reinforge.config.RunConfig` (a run's saved config, or one built from a file and
overrides for a bare model).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from reinforge.evaluation.guardrails import Guardrails, flat_metrics, prompt_counts
from reinforge.evaluation.passk import summarize_samples
from reinforge.evaluation.stats import accuracy_summary
from reinforge.evaluation.verdict import guardrail_verdict

if TYPE_CHECKING:
    from reinforge.config import RunConfig
    from reinforge.tasks import Example, Task
    from reinforge.tracking import RunDir

log = logging.getLogger(__name__)

__all__ = [
    "ModelSource",
    "heldout_examples",
    "generate_and_score",
    "greedy_heldout_eval",
    "load_policy",
    "sampled_eval",
    "EvalSetup",
    "build_eval_setup",
    "attach_verdict",
]


def heldout_examples(task: "Task", max_prompts: int | None = None) -> list["Example"]:
    """The task's held-out examples, the first ``max_prompts`` of them when given."""
    examples = list(task.eval_examples())
    return examples[:max_prompts] if max_prompts is not None else examples


def generate_and_score(generator, reward_fn, examples: Sequence["Example"], encode: Callable, params):
    """``params.num_samples`` completions per example (rows of one prompt contiguous), scored
    row by row; returns (rollout, ``rewards.Scores``). The trainer's ReMax baseline and every
    evaluation go through here."""
    if hasattr(generator, "generate_examples"):  # an agent: the environment renders the prompts
        rollout = generator.generate_examples(list(examples), params)
    else:
        rollout = generator.generate([encode(e) for e in examples], params)
    return rollout, reward_fn.score(rollout, row_examples(rollout, examples))


def group_examples(rollout, examples: Sequence["Example"]) -> list["Example"]:
    """Each group's example: ``examples``, or in a game whose every seat trains (self-play) one
    per example and seat (the agent loop's ``group_examples``, agents/seats.py)."""
    return list(getattr(rollout, "group_examples", None) or examples)


def row_examples(rollout, examples: Sequence["Example"]) -> list["Example"]:
    """Each row's example (rows of a group are contiguous)."""
    groups = group_examples(rollout, examples)
    return [groups[int(g)] for g in rollout.group_index]


def greedy_heldout_eval(
    generator, reward_fn, examples: Sequence["Example"], encode: Callable, *, max_new_tokens: int, seed: int,
    guardrails: "Guardrails | None" = None, progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, Any], list[dict]]:
    """Greedy answers on the held-out prompts (the trainer's periodic evaluation). Accuracy counts
    fully correct answers only. Returns (summary with bootstrap intervals, per-prompt rows).

    With ``guardrails`` the summary also holds their record ("guardrails", and its numbers as flat
    keys: well_formed, best_constant_accuracy, ...) and each row its "extracted" answer and
    "well_formed" flag (reinforge/evaluation/guardrails.py). ``progress(done, total)`` is called
    after each generation batch (the generator's own batch size, so the batches, and the answers,
    are those of one call)."""
    from reinforge.rollout import SamplingParams

    params = SamplingParams(num_samples=1, max_new_tokens=max_new_tokens, greedy=True)
    examples = list(examples)
    chunk = getattr(generator, "batch_size", None) if progress is not None else None
    if not chunk or chunk >= len(examples):
        rollout, scores = generate_and_score(generator, reward_fn, examples, encode, params)
        texts, outcomes, lengths = rollout.texts, scores.outcomes, rollout.action_lengths
        episodes = getattr(rollout, "episodes", None)
        rows = row_examples(rollout, examples)
    else:
        texts, outcomes, lengths, episodes, rows = [], [], [], [], []
        for start in range(0, len(examples), chunk):
            rollout, scores = generate_and_score(generator, reward_fn, examples[start:start + chunk], encode, params)
            rows += row_examples(rollout, examples[start:start + chunk])
            texts += rollout.texts
            outcomes += scores.outcomes
            lengths.append(rollout.action_lengths)
            episodes += getattr(rollout, "episodes", None) or []
            progress(min(start + chunk, len(examples)), len(examples))
        lengths = torch.cat(lengths)
        episodes = episodes or None
    correct = [float(o.correct) for o in outcomes]
    rewards = [o.reward for o in outcomes]
    summary = accuracy_summary(correct, rewards, seed=seed)
    summary["completion_length"] = float(lengths.float().mean())
    summary["reward_errors"] = int(sum(len(o.errors) for o in outcomes))  # scored 0: accuracy is a floor
    per_prompt = [
        {"id": e.id, "answer": e.answer, "completion": t, "correct": c, "reward": r}
        for e, t, c, r in zip(rows, texts, correct, rewards)
    ]
    if guardrails is not None:  # (a game whose every seat trains: a row per seat, all seats averaged)
        record, extra = guardrails.measure(rows, [[t] for t in texts], [[c] for c in correct])
        for row, x in zip(per_prompt, extra):
            row["extracted"], row["well_formed"] = x["answers"][0], x["well_formed"][0]
        summary.update(flat_metrics(record))
        summary["guardrails"] = record
    if episodes is not None:  # agents: turns used, tool-call validity, the whole trajectory
        from reinforge.agents import agent_metrics

        summary.update(agent_metrics(episodes))
        for row, ep in zip(per_prompt, episodes):
            row["trajectory"] = ep.to_record()
    return summary, per_prompt


# ----------------------------------------------------------------------------- what to evaluate


@dataclass
class ModelSource:
    """Which weights to evaluate.

    kind:        "base" (a model folder or the default model, no training), "final" (a run's
                 final_model), "checkpoint" (one of a run's checkpoints).
    label:       short name used in file names: "base-<model>", "final", "step_000010".
    model_path:  the config's model.path value for "base"; the run's base model otherwise.
    run:         the run directory for "final" and "checkpoint".
    checkpoint:  the checkpoint folder for "checkpoint".
    step:        training step of the weights (0 for a base model; None when unknown).
    """

    kind: str
    label: str
    model_path: str
    run: "RunDir | None" = None
    checkpoint: Path | None = None
    step: int | None = None

    def describe(self) -> str:
        if self.kind == "base":
            return f"base model {self.model_path}"
        if self.kind == "final":
            return f"final model of run {self.run.path}"
        return f"checkpoint {self.checkpoint.name} of run {self.run.path}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "label": self.label, "model_path": self.model_path,
            "run": str(self.run.path) if self.run is not None else None,
            "checkpoint": str(self.checkpoint) if self.checkpoint is not None else None,
            "step": self.step,
        }

    @classmethod
    def base(cls, model_path: str) -> "ModelSource":
        name = Path(str(model_path)).name or str(model_path)
        return cls(kind="base", label=f"base-{name}", model_path=str(model_path), step=0)

    @classmethod
    def from_run(cls, run: "RunDir", config: "RunConfig", checkpoint: str | None = None) -> "ModelSource":
        """The run's final model, or ``checkpoint`` (``step_000010``, ``10`` or ``latest``).
        A run without final_model (interrupted) falls back to its latest checkpoint."""
        if checkpoint is None and not (run.final_model_dir / "config.json").is_file() and not (
            run.final_model_dir / "adapter_config.json"
        ).is_file():
            if not run.checkpoints():
                raise FileNotFoundError(
                    f"run {str(run.path)!r} has neither final_model/ nor a complete checkpoint: "
                    "nothing to evaluate (was it stopped before its first checkpoint?)"
                )
            log.warning("run %s has no final_model/ (state %s): evaluating its latest checkpoint",
                        run.path, run.status().get("state"))
            checkpoint = "latest"
        # RL after an SFT stage started from the stage's model: LoRA adapters and checkpoints
        # go on top of it, not on model.path.
        base = str(run.warm_start_model() or config.model.path)
        if checkpoint is None:
            steps = [r["step"] for r in run.read_metrics() if isinstance(r.get("step"), int)]
            return cls(kind="final", label="final", model_path=base, run=run,
                       step=max(steps) if steps else None)
        step, path = run.checkpoint(checkpoint)
        return cls(kind="checkpoint", label=path.name, model_path=base, run=run,
                   checkpoint=path, step=step)


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()


def policy_tokenizer(source: ModelSource):
    """(tokenizer, base model path) for ``source``: cheap, so that a folder without a tokenizer, or a
    prompt too long for the model, fails in one line before any weights load."""
    from reinforge.models import load_tokenizer, resolve_model_path

    base_path = resolve_model_path(source.model_path)
    tok_path = base_path
    if source.kind == "final" and _has_tokenizer(source.run.final_model_dir):
        tok_path = source.run.final_model_dir
    return load_tokenizer(tok_path), base_path


def load_policy(config: "RunConfig", source: ModelSource, tokenizer=None):
    """(model, tokenizer) for ``source``, in eval mode (``tokenizer``: one :func:`policy_tokenizer`
    already loaded). A LoRA run's final model is its base with the saved adapters; a checkpoint is
    the base model (with LoRA when the run used it) with the checkpoint's trainable weights copied
    in by name."""
    from reinforge.models import load_model, resolve_model_path

    cfg_model = config.model.model_copy(update={"gradient_checkpointing": False})
    base_path = resolve_model_path(source.model_path)
    if tokenizer is None:
        tokenizer, _ = policy_tokenizer(source)
    if source.kind == "base":
        model = load_model(cfg_model.model_copy(update={"lora": None}), path=base_path)
    elif source.kind == "final":
        final = source.run.final_model_dir
        if (final / "adapter_config.json").is_file():
            from peft import PeftModel

            base = load_model(cfg_model.model_copy(update={"lora": None}), path=base_path)
            model = PeftModel.from_pretrained(base, str(final))
        else:
            model = load_model(cfg_model.model_copy(update={"lora": None}), path=final)
    else:
        from safetensors.torch import load_file

        model = load_model(cfg_model, path=base_path)
        weights = load_file(str(source.checkpoint / "weights.safetensors"))
        params = dict(model.named_parameters())
        unknown = sorted(set(weights) - set(params))
        if unknown:
            raise ValueError(
                f"checkpoint {source.checkpoint} has parameters the model built from the run's config "
                f"does not have (first: {unknown[0]!r}); was the run's model.path or model.lora changed?"
            )
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value)
    model.eval()
    return model, tokenizer


# ----------------------------------------------------------------------------- sampled evaluation


@dataclass
class EvalSetup:
    """Everything a sampled evaluation needs, built from a config: the held-out examples, the
    reward function, the answer format used for majority voting, and the guardrails."""

    task: Any
    examples: list
    reward_fn: Any
    answer_format: str
    guardrails: Guardrails | None = None
    agent_config: Any = None  # the RunConfig when it has an env section (multi-turn agents)


def build_eval_setup(config: "RunConfig", *, max_prompts: int | None = None) -> EvalSetup:
    """Task, held-out examples and reward from ``config`` (cheap: no model is loaded), so a bad
    task or reward fails before the weights load."""
    from reinforge.agents import build_run_task
    from reinforge.rewards import build_reward

    task = build_run_task(config)
    limit = max_prompts if max_prompts is not None else config.trainer.eval_max_prompts
    examples = heldout_examples(task, limit)
    if not examples:
        raise ValueError("the task has no held-out prompts to evaluate (task.eval_size)")
    reward_fn = build_reward(config.reward, task)
    return EvalSetup(task=task, examples=examples, reward_fn=reward_fn, answer_format=config.reward.answer_format,
                     guardrails=Guardrails.build(task, reward_fn, config.reward, seed=config.trainer.seed,
                                                 max_turns=config.env.max_turns if config.env else None),
                     agent_config=config if config.env else None)


def _cached_prompt(cache: dict[str, list[int]], encode, example) -> list[int]:
    ids = cache.get(example.id)
    return list(ids) if ids is not None else encode(example)


def sampled_eval(
    setup: EvalSetup,
    model,
    tokenizer,
    *,
    samples: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    generation_batch_size: int = 64,
    autocast_dtype: torch.dtype | None = None,
    copy_dtype: torch.dtype | None = None,
    n_resamples: int = 10_000,
    prompt_ids: dict[str, list[int]] | None = None,
) -> tuple[dict[str, Any], list[dict]]:
    """N = ``samples`` completions per held-out prompt, scored; pass@k and maj@k for k = 1..N.

    Sampling is seeded (``torch.manual_seed(seed)`` before generating), so the same model, prompts
    and seed give the same completions. Returns (summary, per-prompt rows); the rows hold every
    completion with its extracted answer, correctness and reward. ``prompt_ids``: example id ->
    prompt token ids already encoded (and checked against the model's context, or cut by
    ``task.truncate_prompts=left``) by ``rollout.context.fit_prompts``; unlisted prompts are
    encoded here.
    """
    from reinforge.rewards import extract_answer
    from reinforge.rollout import HFGenerator, SamplingParams
    from reinforge.tasks import encode_prompt, normalize_answer

    if samples < 1:
        raise ValueError(f"--samples must be at least 1, got {samples}")
    if temperature < 0:
        raise ValueError(f"--temperature must be 0 (greedy) or positive, got {temperature}")
    # ``copy_dtype``: decode with a copy in that dtype, as the trainer's generator does
    # (rollout.hf_bf16_copy), so an evaluation here matches the one made during training.
    generator = HFGenerator(model, tokenizer, batch_size=generation_batch_size, autocast_dtype=autocast_dtype,
                            copy_dtype=copy_dtype)
    reward_fn = setup.reward_fn
    if setup.agent_config is not None:  # whole trajectories with the run's environment and budgets
        from reinforge.agents import build_agent

        generator, reward_fn = build_agent(setup.agent_config, generator, reward_fn, setup.task)
    torch.manual_seed(seed)
    # temperature 0 means greedy decoding (dividing logits by 0 would sample from NaNs)
    params = SamplingParams(num_samples=samples, temperature=temperature if temperature > 0 else 1.0,
                            top_p=top_p, max_new_tokens=max_new_tokens, greedy=temperature == 0)
    encode = functools.partial(encode_prompt, tokenizer)
    if prompt_ids:
        encode = functools.partial(_cached_prompt, prompt_ids, encode)
    rollout, scores = generate_and_score(generator, reward_fn, setup.examples, encode, params)
    episodes = getattr(rollout, "episodes", None)
    outcomes = scores.outcomes
    lengths = rollout.action_lengths.tolist()
    rows = []
    for i, e in enumerate(group_examples(rollout, setup.examples)):
        sl = slice(i * samples, (i + 1) * samples)
        texts, outs = rollout.texts[sl], outcomes[sl]
        if episodes is not None:  # the answer is in the final turn; votes and logs read it there
            texts = [ep.final_text for ep in episodes[sl]]
        answers = []
        for t in texts:
            a = extract_answer(t, setup.answer_format)
            answers.append(normalize_answer(a) if a is not None and a.strip() else None)
        rows.append({
            "id": e.id,
            "answer": e.answer,
            "completions": texts,
            "answers": answers,
            "correct": [float(o.correct) for o in outs],
            "rewards": [float(o.reward) for o in outs],
            "lengths": lengths[sl],
            "truncated": [bool(x) for x in rollout.truncated[sl].tolist()],
            "errors": [o.errors for o in outs],
        })
        if episodes is not None:
            rows[-1]["trajectories"] = [ep.to_record() for ep in episodes[sl]]
    summary = summarize_samples(rows, n_resamples=n_resamples, seed=seed)
    summary.pop("per_prompt_pass")
    summary.pop("per_prompt_maj")
    summary["completion_length"] = float(np.mean(lengths)) if lengths else 0.0
    summary["truncated_frac"] = float(rollout.truncated.float().mean()) if len(lengths) else 0.0
    summary["reward_errors"] = int(sum(len(o.errors) for o in outcomes))
    if setup.guardrails is not None:
        guard = setup.guardrails
        guard.n_resamples, guard.seed = n_resamples, seed
        record, extra = guard.measure(setup.examples, [r["completions"] for r in rows], [r["correct"] for r in rows])
        for row, x in zip(rows, extra):
            row["well_formed"] = x["well_formed"]
        summary.update(flat_metrics(record))
        summary["guardrails"] = record
    if episodes is not None:
        from reinforge.agents import agent_metrics

        summary.update(agent_metrics(episodes))
    return summary, rows


def task_differs_from_run(config: "RunConfig", run: "RunDir") -> bool:
    """Whether ``config`` evaluates another task than the run trained on: its task, reward or env
    section differs from the run's (e.g. ``env=null`` to evaluate an agent without its tools)."""
    from reinforge.config import build_config

    own = build_config(run.load_config(), ["tracking.exporters=[]"])
    return task_sections(config) != task_sections(own)


def task_sections(config: "RunConfig") -> dict[str, Any]:
    """What an evaluation's task is: the config's task, reward and env sections, as JSON data."""
    return {k: (None if getattr(config, k, None) is None else getattr(config, k).model_dump(mode="json"))
            for k in ("task", "reward", "env")}


def attach_verdict(summary: dict[str, Any], rows: list[dict], run: "RunDir | None", source: ModelSource,
                   config: "RunConfig", label: str, *, n_resamples: int = 10_000) -> dict[str, Any]:
    """Add the guardrail verdict (reinforge/evaluation/guardrails.py) to a sampled evaluation's
    summary. Its base is, in order: a sampled evaluation of the run's base model with the same
    settings in the same directory (``reinforge eval --boundary`` makes one), else the run's
    step-0 greedy evaluation (the base model before training; greedy against sampled answers,
    said in the verdict) when the evaluated task is the run's own; a base model itself gets a
    verdict against the prior baselines only."""
    from reinforge.evaluation.verdict import spec_from_config
    from reinforge.tracking.sampled_evals import read_sampled_eval, sampled_eval_labels

    if "guardrails" not in summary:
        return summary
    fmt, code = spec_from_config(config.model_dump(mode="json"))
    model = prompt_counts(rows, fmt, code=code)
    base, base_label = None, "the base model"
    if run is not None and source.kind != "base":
        base_source = ModelSource.base(config.model.path)
        base_eval = base_source.label + label[len(source.label):]
        if base_eval in sampled_eval_labels(run):
            base = prompt_counts(read_sampled_eval(run, base_eval)[1], fmt, code=code)
            base_label = f"the base model (sampled evaluation {base_eval})"
        elif run.kind == "train" and 0 in run.eval_steps() and not task_differs_from_run(config, run):
            base = prompt_counts(run.read_eval_details(0), fmt, code=code)
            base_label = "the base model (the run's step-0 greedy evaluation)"
        if base is not None and not set(base.ids) & set(model.ids):
            base = None
    summary["verdict"] = guardrail_verdict(model, summary["guardrails"], base, base_label=base_label,
                                           seed=int(summary.get("seed", 0) or 0), n_resamples=n_resamples)
    return summary
