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
from pathlib import Path

import numpy as np
import torch

# RMSettings, load_rm_config, roc_auc and majority_pick are not used here: imported so that this
# module still offers every name it offered before config.py and metrics.py were cut out of it.
from reinforge.reward_models.config import RMRunConfig, RMSettings, load_rm_config  # noqa: F401
from reinforge.reward_models.metrics import evaluate_records, format_summary, majority_pick, roc_auc  # noqa: F401
from reinforge.rewards.models.scorer import RM_META_FILE, ScalarHeadModel, render_prompt
from reinforge.rewards.models.steps import StepSplitter
from reinforge.tracking.io import append_jsonl_many, atomic_write_json, read_jsonl

log = logging.getLogger("reinforge")


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
            resume = f"reinforge train-rm --resume {rd.path}"
            if isinstance(err, KeyboardInterrupt):  # a stop signal (the command line's handler names it)
                rd.set_status("interrupted", signal=err.args[0] if err.args else "SIGINT", resume=resume)
            else:
                rd.set_status("failed", reason=f"{type(err).__name__}: {err}", resume=resume)
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

        from reinforge.rewards.models.scorer import load_tokenizer_for
        from reinforge.lifecycle.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state

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
