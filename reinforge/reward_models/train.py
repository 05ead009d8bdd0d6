"""``reinforge train-rm CONFIG``: make a reward model here, and measure it.

Three stages, each resumable, in one run directory (``kind: train_rm`` in status.json):

1. **label** (``data/train.jsonl``, ``data/eval.jsonl``): the policy (``model``) samples
   ``rm.samples_per_prompt`` completions per prompt of the task, which the configured verifiers
   (``reward``) judge. For an outcome RM the label is that verdict. For a PRM each completion is
   split into steps and each step labelled by Monte-Carlo rollouts (Math-Shepherd: "Math-Shepherd:
   Verify and Reinforce LLMs Step-by-step without Human Annotations", Wang et al., 2024,
   arXiv:2312.08935): ``rm.mc_rollouts`` completions are sampled from the prompt plus the solution
   up to that step, and the step's label is the fraction that reach a correct answer (``soft``) or
   whether any does (``hard``); the last step's label is the completion's own verdict. Prompts
   already labelled are skipped on resume.
2. **train** (``checkpoints/``, ``metrics.jsonl``): a sequence-classification model (from
   ``rm.init``, default the policy's weights) learns the labels with a binary cross-entropy at the
   last token (outcome) or at each step's last token (PRM); a checkpoint after each epoch.
3. **evaluate** (``summary.json``/``summary.md``): on the held-out prompts' labelled completions,
   step-label (or outcome-label) accuracy and AUC, and best-of-N reranking accuracy of the RM
   against majority vote and a random choice, with bootstrap intervals over prompts and paired
   differences (reinforge/evaluation/stats.py). ``final_model/`` is then usable as a verifier:
   ``reward.verifiers=[{name: task}, {name: prm, weight: 0.5, options: {path: RUN/final_model}}]``.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import yaml
from pydantic import Field, ValidationError

from reinforge.config import ConfigError, RunConfig, _Section, apply_overrides, build_config
from reinforge.reward_models.scorer import RM_META_FILE, ScalarHeadModel, render_prompt
from reinforge.reward_models.steps import StepSplitter
from reinforge.reward_models.verifiers import AGGREGATES, aggregate_steps
from reinforge.tracking.io import append_jsonl_many, atomic_write_json, read_jsonl

log = logging.getLogger("reinforge")


class RMSettings(_Section):
    """What ``reinforge train-rm`` trains, from which data, and how it is measured."""

    kind: Literal["prm", "outcome"] = Field(
        "prm", description="'prm': a process reward model from Monte-Carlo step labels (Math-Shepherd, "
        "arXiv:2312.08935); 'outcome': an outcome reward model from the verifiers' verdicts.")
    init: str | None = Field(None, description="Local model folder the reward model starts from "
                             "(null: model.path, the policy's weights, as Math-Shepherd and PRIME do).")
    train_prompts: int = Field(32, ge=1, description="Training prompts labelled (from the task's training split).")
    eval_prompts: int = Field(16, ge=1, description="Held-out prompts labelled and measured on.")
    samples_per_prompt: int = Field(4, ge=1, description="Completions per prompt: N of the best-of-N measurement.")
    mc_rollouts: int = Field(4, ge=1, description="kind=prm: completions sampled from each step's prefix (Math-Shepherd's N).")
    labels: Literal["soft", "hard"] = Field(
        "soft", description="kind=prm: 'soft' = the fraction of rollouts reaching a correct answer "
        "(Math-Shepherd's soft estimation), 'hard' = 1 if any does (hard estimation).")
    separator: str = Field("\n", description="Literal string between steps.")
    pattern: str | None = Field(None, description="Regular expression between steps (wins over separator).")
    max_steps: int = Field(8, ge=1, description="The most steps per completion (the rest joins the last).")
    aggregate: Literal[AGGREGATES] = Field("min", description="kind=prm: a completion's score for best-of-N "
                                           "from its step scores (min, last, mean, prod).")
    lr: float = Field(2e-5, gt=0, description="AdamW learning rate of the reward model.")
    weight_decay: float = Field(0.0, ge=0)
    epochs: int = Field(2, ge=1, description="Passes over the labelled training completions.")
    batch_size: int = Field(8, ge=1, description="Completions per optimiser step.")
    max_length: int = Field(512, ge=16, description="Tokens the reward model reads (longer texts lose their start).")
    freeze_body: bool = Field(False, description="Train the score head only (PURE's first stage).")
    bootstrap_resamples: int = Field(2000, ge=100, description="Bootstrap resamples of the intervals.")
    generation_batch_size: int = Field(64, ge=1, description="Completions generated together.")


class RMRunConfig:
    """A train-rm config: a training config (model = the sampling policy, task, reward = the
    labelling verifiers, rollout = sampling settings, tracking, trainer.seed) plus ``rm``."""

    def __init__(self, run: RunConfig, rm: RMSettings) -> None:
        self.run, self.rm = run, rm

    def __getattr__(self, name: str):  # tracking, model, task, trainer, recipe: RunDir.create reads them
        if name in ("run", "rm"):
            raise AttributeError(name)
        return getattr(self.run, name)

    def to_dict(self) -> dict[str, Any]:
        return {**self.run.to_dict(), "rm": self.rm.model_dump(mode="json")}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], overrides: list[str] | None = None) -> "RMRunConfig":
        raw = apply_overrides(raw, overrides)
        rm_raw = raw.pop("rm", None) or {}
        if not isinstance(rm_raw, dict):
            raise ConfigError("rm: must be a mapping of train-rm settings (kind, train_prompts, ...)")
        run = build_config(raw)
        try:
            rm = RMSettings.model_validate(rm_raw)
        except ValidationError as err:
            lines = [f"  rm.{'.'.join(map(str, e['loc']))}: {e['msg']}" + (
                f"; accepted keys here: {', '.join(RMSettings.model_fields)}" if e["type"] == "extra_forbidden" else "")
                for e in err.errors()]
            raise ConfigError("invalid train-rm config:\n" + "\n".join(lines)) from None
        if any(v.name in ("outcome_rm", "prm", "judge", "implicit_prm") for v in run.reward.verifiers):
            raise ConfigError("train-rm labels completions with verifiers of the answer (reward.verifiers: task, "
                              "math_verify, ...), not with reward models")
        return cls(run, rm)


def load_rm_config(path: str | Path | None, overrides: list[str] | None = None) -> RMRunConfig:
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        raw = yaml.safe_load(p.read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections")
    return RMRunConfig.from_dict(raw, overrides)


# ----------------------------------------------------------------------------- metrics


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (the probability a random positive outscores a random negative,
    ties counting half); NaN when one class is missing."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    pos, neg = scores[labels], scores[~labels]
    if not len(pos) or not len(neg):
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    allv = np.concatenate([pos, neg])[order]
    ranks = np.empty(len(allv))
    i = 0
    while i < len(allv):  # average ranks over ties
        j = i
        while j + 1 < len(allv) and allv[j + 1] == allv[i]:
            j += 1
        ranks[i : j + 1] = (i + j) / 2 + 1
        i = j + 1
    r = np.empty(len(allv))
    r[order] = ranks
    return float((r[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def majority_pick(answers: list[str | None]) -> int:
    """Index of a completion holding the most common answer (ties: the answer seen first;
    completions without an answer never win unless none has one)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return 0
    best = max(counts.values())
    for i, a in enumerate(answers):
        if a is not None and counts[a] == best:
            return i
    return 0


def _cluster_interval(groups: list[np.ndarray], stat, n_resamples: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` over items clustered by prompt: prompts are
    resampled with replacement, their items kept together (steps of one prompt are not independent)."""
    from reinforge.evaluation.stats import bootstrap_ci

    def on(idx):
        picked = [groups[int(i)] for i in np.asarray(idx)]
        v = stat(np.concatenate(picked) if picked else np.zeros(0, dtype=int))
        return 0.5 if np.isnan(v) else v

    return bootstrap_ci(np.arange(len(groups), dtype=float), statistic=on, n_resamples=n_resamples, seed=seed)


def evaluate_records(records: list[dict], rm: RMSettings, *, seed: int = 0) -> dict[str, Any]:
    """The held-out measurement from labelled records carrying the reward model's predictions
    (``pred``: a probability per step, or one per completion for an outcome RM)."""
    from reinforge.evaluation.stats import bootstrap_ci, paired_bootstrap_diff

    by_prompt: dict[str, list[dict]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    prompts = sorted(by_prompt)
    # Step (or outcome) labels: binary = any rollout from the prefix reached a correct answer.
    preds, labels, groups, pos = [], [], [], 0
    for p in prompts:
        start = pos
        for r in by_prompt[p]:
            ys = r["step_labels"] if rm.kind == "prm" else [float(r["correct"])]
            for y, q in zip(ys, r["pred"]):
                preds.append(q)
                labels.append(y > 0)
                pos += 1
        groups.append(np.arange(start, pos))
    preds_a, labels_a = np.asarray(preds, float), np.asarray(labels, bool)
    n_res = rm.bootstrap_resamples
    unit = "step" if rm.kind == "prm" else "outcome"
    out: dict[str, Any] = {"kind": rm.kind, "prompts": len(prompts), f"{unit}_labels": int(len(labels_a)),
                           f"{unit}_positive_frac": float(labels_a.mean()) if len(labels_a) else float("nan")}
    if len(labels_a):
        acc = lambda idx: float(((preds_a[idx] > 0.5) == labels_a[idx]).mean()) if len(idx) else float("nan")  # noqa: E731
        auc = lambda idx: roc_auc(preds_a[idx], labels_a[idx])  # noqa: E731
        all_idx = np.arange(len(labels_a))
        out[f"{unit}_accuracy"] = acc(all_idx)
        out[f"{unit}_accuracy_ci"] = _cluster_interval(groups, acc, n_res, seed)
        out[f"{unit}_auc"] = auc(all_idx)
        out[f"{unit}_auc_ci"] = _cluster_interval(groups, auc, n_res, seed) if not np.isnan(out[f"{unit}_auc"]) else None
    # Best-of-N: the RM's pick vs majority vote vs a random pick (its exact expectation), per prompt.
    rm_pick, maj, rand, oracle = [], [], [], []
    for p in prompts:
        rows = sorted(by_prompt[p], key=lambda r: r["sample"])
        correct = [float(r["correct"]) for r in rows]
        score = [aggregate_steps(r["pred"], rm.aggregate) if rm.kind == "prm" else r["pred"][0] for r in rows]
        rm_pick.append(correct[int(np.argmax(score))])
        maj.append(correct[majority_pick([r["answer"] for r in rows])])
        rand.append(float(np.mean(correct)))
        oracle.append(float(max(correct)))
    for name, v in (("rm", rm_pick), ("majority", maj), ("random", rand), ("oracle", oracle)):
        out[f"best_of_n_{name}"] = float(np.mean(v))
        out[f"best_of_n_{name}_ci"] = bootstrap_ci(v, n_resamples=n_res, seed=seed)
    out["rm_minus_majority"] = paired_bootstrap_diff(maj, rm_pick, n_resamples=n_res, seed=seed)
    out["rm_minus_random"] = paired_bootstrap_diff(rand, rm_pick, n_resamples=n_res, seed=seed)
    out["n"] = max((len(v) for v in by_prompt.values()), default=0)
    return out


def format_summary(ev: dict[str, Any], run: Path) -> str:
    unit = "step" if ev["kind"] == "prm" else "outcome"

    def ci(key: str) -> str:
        v = ev.get(key)
        return f"[{v[0]:.3f}, {v[1]:.3f}]" if v else "n/a"

    lines = [f"# train-rm: {ev['kind']} reward model", "", f"run: {run}", "",
             f"Held-out: {ev['prompts']} prompts, {ev[f'{unit}_labels']} {unit} labels "
             f"({ev[f'{unit}_positive_frac']:.3f} positive), 95% bootstrap intervals over prompts.", "",
             "| measure | value | 95% interval |", "|---|---|---|"]
    if f"{unit}_accuracy" in ev:
        lines.append(f"| {unit}-label accuracy (p > 0.5) | {ev[f'{unit}_accuracy']:.3f} | {ci(f'{unit}_accuracy_ci')} |")
        lines.append(f"| {unit}-label AUC | {ev[f'{unit}_auc']:.3f} | {ci(f'{unit}_auc_ci')} |")
    for name in ("rm", "majority", "random", "oracle"):
        label = {"rm": "best-of-N, reward model's pick", "majority": "best-of-N, majority vote",
                 "random": "best-of-N, random pick", "oracle": "pass@N (any correct)"}[name]
        lines.append(f"| {label} (N={ev['n']}) | {ev[f'best_of_n_{name}']:.3f} | {ci(f'best_of_n_{name}_ci')} |")
    for key, label in (("rm_minus_majority", "reward model - majority"), ("rm_minus_random", "reward model - random")):
        d = ev[key]
        lines.append(f"| {label} (paired) | {d['diff']:+.3f} | [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- fitting


def fit_reward_model(scorer: ScalarHeadModel, optimizer, examples: list[tuple[str, list[int], list[float]]], *,
                     epochs: int, batch_size: int, seed: int = 0, start_epoch: int = 0, grad_clip: float = 1.0,
                     on_epoch=None) -> list[float]:
    """Binary cross-entropy of the scorer's logit at each labelled position: ``examples`` are
    (text, character offsets whose token is scored, a label in [0, 1] per offset). Epochs
    ``start_epoch + 1 .. epochs``, each in a seeded order; ``on_epoch(epoch, mean loss, seconds)``
    after each (the checkpoint). Returns the mean loss of each epoch run."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    history = []
    for epoch in range(start_epoch + 1, epochs + 1):
        order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        scorer.train()
        losses, t0 = [], time.perf_counter()
        for b in range(0, len(order), batch_size):
            batch = [examples[int(i)] for i in order[b : b + batch_size]]
            enc = scorer.encode([t for t, _, _ in batch])
            where = scorer.locate(enc, [p for _, p, _ in batch])
            logits = scorer.position_logits(enc["input_ids"], enc["attention_mask"])
            picked, targets = [], []
            for i, (idx, (_, _, ys)) in enumerate(zip(where, batch)):
                for j, y in zip(idx, ys):
                    if j >= 0:  # a position truncation dropped is not learned from
                        picked.append(logits[i, j])
                        targets.append(float(y))
            if not picked:
                continue
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                torch.stack(picked), torch.tensor(targets, device=logits.device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
            optimizer.step()
            losses.append(float(loss.detach()))
        scorer.eval()
        mean = float(np.mean(losses)) if losses else float("nan")
        history.append(mean)
        if on_epoch is not None:
            on_epoch(epoch, mean, time.perf_counter() - t0)
    return history


# ----------------------------------------------------------------------------- the stages


class RewardModelTrainer:
    """Runs the three stages of train-rm in a run directory (new, or resumed)."""

    def __init__(self, cfg: RMRunConfig, *, run_dir=None, resume: bool = False) -> None:
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume

    def run(self) -> Path:
        from reinforge.tracking import RunDir
        from reinforge.tracking.run_dir import safe_name, task_label

        cfg = self.cfg
        if self.run_dir is None:
            name = cfg.run.tracking.run_name or safe_name(
                f"{time.strftime('%Y%m%d-%H%M%S')}-train-rm-{cfg.rm.kind}-{task_label(cfg.run.task.model_dump())}")
            self.run_dir = RunDir.create(cfg, name=name, kind="train_rm")
        else:
            self.run_dir.acquire_writer()
        rd = self.run_dir
        try:
            rd.set_status("running")
            self._run()
        except BaseException as err:
            rd.set_status("failed" if isinstance(err, Exception) else "interrupted", reason=f"{type(err).__name__}: {err}",
                          resume=f"reinforge train-rm --resume {rd.path}")
            raise
        finally:
            rd.release_writer()
        return rd.path

    def _run(self) -> None:
        from reinforge.models import load_model, load_tokenizer, resolve_device, resolve_model_path
        from reinforge.rewards import build_reward
        from reinforge.tasks import build_task

        cfg, rm, rd = self.cfg.run, self.cfg.rm, self.run_dir
        seed = cfg.trainer.seed
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        self.splitter = StepSplitter(rm.separator, rm.pattern, rm.max_steps)
        task = build_task(cfg.task)
        self.reward_fn = build_reward(cfg.reward, task)
        self.device = resolve_device(cfg.model.device)
        policy_path = resolve_model_path(cfg.model.path)
        init = Path(rm.init).expanduser() if rm.init else policy_path
        train_ex = list(task.train_examples())[: rm.train_prompts]
        eval_ex = list(task.eval_examples())[: rm.eval_prompts]
        if not eval_ex:
            raise ValueError("the task has no held-out prompts to measure the reward model on (task.eval_size)")
        data = rd.path / "data"
        data.mkdir(exist_ok=True)
        todo = [(split, ex) for split, ex in (("train", train_ex), ("eval", eval_ex))
                if len({r["prompt_id"] for r in read_jsonl(data / f"{split}.jsonl")}) < len(ex)]
        if todo:
            self.tokenizer = load_tokenizer(policy_path)
            self.policy = load_model(cfg.model.model_copy(update={"lora": None}), path=policy_path, device=self.device).eval()
            from reinforge.rollout import HFGenerator

            self.generator = HFGenerator(self.policy, self.tokenizer, batch_size=rm.generation_batch_size)
            for split, ex in todo:
                self._label(split, ex, data / f"{split}.jsonl")
            del self.policy, self.generator
        model, tok = self._train(init, read_jsonl(data / "train.jsonl"))
        records = read_jsonl(data / "eval.jsonl")
        self._predict(model, tok, records)
        ev = evaluate_records(records, rm, seed=seed)
        ev["train_completions"] = len(read_jsonl(data / "train.jsonl"))
        rd.write_summary(ev, format_summary(ev, rd.path))
        self._save_final(model, tok)
        rd.set_status("finished")
        print(format_summary(ev, rd.path))

    # -- stage 1: labels

    def _label(self, split: str, examples: list, path: Path) -> None:
        """Sample and label the prompts of ``examples`` not yet in ``path``, a few prompts at a
        time, each prompt's records appended together (a crash loses at most the prompts in flight)."""
        from reinforge.rewards import extract_answer
        from reinforge.rollout import SamplingParams
        from reinforge.tasks import encode_prompt, normalize_answer

        cfg, rm = self.cfg.run, self.cfg.rm
        done = {r["prompt_id"] for r in read_jsonl(path)}
        pending = [e for e in examples if e.id not in done]
        params = SamplingParams(num_samples=rm.samples_per_prompt, temperature=cfg.rollout.temperature,
                                top_p=cfg.rollout.top_p, max_new_tokens=cfg.rollout.max_new_tokens)
        per_chunk = max(1, rm.generation_batch_size // rm.samples_per_prompt)
        for c in range(0, len(pending), per_chunk):
            chunk = pending[c : c + per_chunk]
            rollout = self.generator.generate([encode_prompt(self.tokenizer, e) for e in chunk], params)
            rows = [chunk[int(g)] for g in rollout.group_index]
            outcomes = self.reward_fn.score(rollout, rows).outcomes
            records = []
            for i, (text, e, o) in enumerate(zip(rollout.texts, rows, outcomes)):
                answer = extract_answer(text, cfg.reward.answer_format)
                records.append({"prompt_id": e.id, "sample": i % rm.samples_per_prompt, "messages": e.messages,
                                "completion": text, "correct": bool(o.correct),
                                "answer": normalize_answer(answer) if answer and answer.strip() else None,
                                "steps": self.splitter.spans(text)})
            if rm.kind == "prm":
                self._mc_labels(records, rows)
            append_jsonl_many(path, records)
            log.info("train-rm: labelled %d/%d %s prompts", c + len(chunk), len(pending), split)

    def _mc_labels(self, records: list[dict], examples: list) -> None:
        """Math-Shepherd step labels: rollouts from every step's prefix but the last (whose label
        is the completion's own verdict)."""
        from reinforge.rollout import SamplingParams
        from reinforge.tasks import encode_prompt

        cfg, rm = self.cfg.run, self.cfg.rm
        prompts, owners, prefixes = [], [], []
        for i, (r, e) in enumerate(zip(records, examples)):
            steps = r["steps"]
            for k in range(len(steps) - 1):
                prefix = r["completion"][: steps[k + 1][0]]  # through step k and the separator after it
                prompts.append(encode_prompt(self.tokenizer, e) + self.tokenizer.encode(prefix, add_special_tokens=False))
                owners.append((i, k))
                prefixes.append(prefix)
        for r in records:
            r["step_labels"] = [0.0] * max(len(r["steps"]) - 1, 0) + ([float(r["correct"])] if r["steps"] else [])
        if not prompts:
            return
        k_roll = rm.mc_rollouts
        params = SamplingParams(num_samples=k_roll, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                max_new_tokens=cfg.rollout.max_new_tokens)
        rollout = self.generator.generate(prompts, params)
        texts = [prefixes[j // k_roll] + t for j, t in enumerate(rollout.texts)]
        rows = [examples[owners[j // k_roll][0]] for j in range(len(texts))]
        correct = [float(o.correct) for o in self.reward_fn(texts, rows)]
        for j, (i, k) in enumerate(owners):
            hits = correct[j * k_roll : (j + 1) * k_roll]
            frac = sum(hits) / k_roll
            records[i]["step_labels"][k] = frac if rm.labels == "soft" else float(frac > 0)

    # -- stage 2: training

    def _examples(self, tok, records: list[dict]) -> list[tuple[str, list[int], list[float]]]:
        out = []
        for r in records:
            prefix = render_prompt(tok, r["messages"])
            if self.cfg.rm.kind == "prm":
                if not r["steps"]:
                    continue
                out.append((prefix + r["completion"], [len(prefix) + b for _, b in r["steps"]], list(r["step_labels"])))
            else:
                text = prefix + r["completion"]
                out.append((text, [len(text)], [float(r["correct"])]))
        return out

    def _train(self, init: Path, records: list[dict]):
        from transformers import AutoModelForSequenceClassification

        from reinforge.reward_models.scorer import load_tokenizer_for
        from reinforge.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state

        rm, rd = self.cfg.rm, self.run_dir
        tok = load_tokenizer_for(init)
        model = AutoModelForSequenceClassification.from_pretrained(init, num_labels=1, dtype=torch.float32,
                                                                   local_files_only=True)
        model.config.pad_token_id = tok.pad_token_id
        scorer = ScalarHeadModel(model.base_model, model.score, tok, max_length=rm.max_length).to(self.device)
        if rm.freeze_body:
            for p in scorer.body.parameters():
                p.requires_grad_(False)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=rm.lr, weight_decay=rm.weight_decay)
        start = 0
        ckpt = latest_checkpoint(rd.path)
        if ckpt is not None:
            data = load_checkpoint(ckpt)
            model.load_state_dict(data["weights"])
            opt.load_state_dict(data["optimizer"]["optimizer"])
            set_rng_state(data["rng"])
            start = data["state"]["step"]
            log.info("train-rm: resumed after epoch %d", start)
        rd.truncate_after(start)
        examples = self._examples(tok, records)
        if not examples:
            raise ValueError("no labelled training completion has a step to learn from; check rm.separator/pattern "
                             "against what the model writes (data/train.jsonl)")

        def checkpoint(epoch: int, loss: float, seconds: float) -> None:
            rd.log_metrics(epoch, {"rm_loss": loss, "rm_examples": float(len(examples)), "time_epoch": seconds})
            save_checkpoint(rd.path, epoch, weights={k: v.detach().cpu() for k, v in model.state_dict().items()},
                            optimizer_state={"optimizer": opt.state_dict()}, trainer_state={"kind": rm.kind})

        fit_reward_model(scorer, opt, examples, epochs=rm.epochs, start_epoch=start, batch_size=rm.batch_size,
                         seed=self.cfg.run.trainer.seed, on_epoch=checkpoint)
        self._hf_model = model
        return scorer, tok

    # -- stage 3: measurement and the model folder

    def _predict(self, scorer: ScalarHeadModel, tok, records: list[dict]) -> None:
        for r in records:
            prefix = render_prompt(tok, r["messages"])
            if self.cfg.rm.kind == "prm":
                r["pred"] = []
                if r["steps"]:
                    (logits,) = scorer.logits_at([prefix + r["completion"]], [[len(prefix) + b for _, b in r["steps"]]])
                    r["pred"] = [float(torch.sigmoid(torch.tensor(z))) for z in logits]
            else:
                text = prefix + r["completion"]
                ((z,),) = scorer.logits_at([text], [[len(text)]])
                r["pred"] = [float(torch.sigmoid(torch.tensor(z)))]

    def _save_final(self, scorer: ScalarHeadModel, tok) -> None:
        rd, rm = self.run_dir, self.cfg.rm
        tmp, target = rd.path / ".tmp-final_model", rd.final_model_dir
        shutil.rmtree(tmp, ignore_errors=True)
        self._hf_model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        atomic_write_json(tmp / RM_META_FILE, {
            "kind": rm.kind, "steps": self.splitter.to_dict(), "labels": rm.labels if rm.kind == "prm" else "verdict",
            "aggregate": rm.aggregate, "trained_by": "reinforge train-rm", "run": str(rd.path)})
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
