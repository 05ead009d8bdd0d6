"""Reward models as verifiers (outcome RM, PRM, judge, PRIME's implicit PRM), the reward-hacking
guard, a PRM that learns to tell good steps from bad, and `reinforge train-rm` end to end, on
tiny real models and real reasoning-gym."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from conftest import chat_prompts, make_model, make_tokenizer
from reinforge.algorithms import min_form_credit, sum_form_credit
from reinforge.config import build_config
from reinforge.reward_models import RewardHackingGuard, StepSplitter, token_ends
from reinforge.reward_models.train import (
    RMRunConfig,
    RewardModelTrainer,
    evaluate_records,
    fit_reward_model,
    majority_pick,
    roc_auc,
)
from reinforge.rewards import RewardFunction, build_reward
from reinforge.rewards.models.scorer import ScalarHeadModel, render_prompt
from reinforge.rewards.models.verifiers import JudgeVerifier, OutcomeRMVerifier, ProcessRewardVerifier
from reinforge.rewards.verifiers import ExactMatchVerifier
from reinforge.rollout import HFGenerator, SamplingParams
from reinforge.tasks import Example
from reinforge.tasks.reasoning_gym_task import ReasoningGymTask
from reinforge.tracking import RunDir


def _seq_cls(tok, *, seed=0, labels=1):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      num_labels=labels, pad_token_id=tok.pad_token_id)
    return LlamaForSequenceClassification(cfg).eval()


@pytest.fixture
def rm_dir(tmp_path):
    tok = make_tokenizer()
    path = tmp_path / "rm"
    _seq_cls(tok, seed=1).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _rollout(tok, model, prompts, n=2, tokens=12, seed=0):
    torch.manual_seed(seed)
    return HFGenerator(model, tok).generate(chat_prompts(tok, prompts), SamplingParams(num_samples=n, max_new_tokens=tokens))


# ----------------------------------------------------------------------------- steps


def test_steps_split_by_separator_pattern_and_max_steps():
    text = "first step\n\n  second\nthird  \n"
    assert [text[a:b] for a, b in StepSplitter().spans(text)] == ["first step", "second", "third"]
    assert [text[a:b] for a, b in StepSplitter(separator="\n\n").spans(text)] == ["first step", "second\nthird"]
    numbered = "Step 1: a=2 Step 2: b=3 Step 3: done"
    assert [numbered[a:b] for a, b in StepSplitter(pattern=r"(?=Step \d+:)").spans(numbered)] == [
        "Step 1: a=2", "Step 2: b=3", "Step 3: done"]
    assert [text[a:b] for a, b in StepSplitter(max_steps=2).spans(text)] == ["first step", "second\nthird"]
    assert StepSplitter().spans("  \n ") == []
    with pytest.raises(ValueError, match="regular expression"):
        StepSplitter(pattern="(")


def test_token_ends_find_the_token_that_completes_each_step(tiny_tokenizer):
    ids = tiny_tokenizer.encode("ab\ncd", add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
    # character tokenizer: "b" is token 1, "d" token 4; the EOS decodes to nothing
    assert token_ends(tiny_tokenizer, ids, [2, 5]) == [1, 4]


# ----------------------------------------------------------------------------- verifiers


def test_outcome_rm_scores_the_whole_text_at_its_last_token(rm_dir, tiny_tokenizer, tiny_model):
    rollout = _rollout(tiny_tokenizer, tiny_model, ["say 1", "say 2"])
    examples = [Example(id=str(i), messages=[{"role": "user", "content": f"say {i // 2 + 1}"}], answer="1")
                for i in range(4)]
    rm = OutcomeRMVerifier(str(rm_dir))
    fn = RewardFunction([(rm, 2.0), (ExactMatchVerifier(answer_format="raw"), 1.0)])
    scores = fn.score(rollout, examples)
    # the same numbers from the HF model's own sequence-classification forward (last real token)
    ref = _seq_cls(make_tokenizer(), seed=1)
    for i, (o, e) in enumerate(zip(scores.outcomes, examples)):
        text = render_prompt(tiny_tokenizer, e.messages) + rollout.texts[i]
        ids = tiny_tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        want = torch.sigmoid(ref(input_ids=ids).logits[0, 0]).item()
        assert o.components["outcome_rm"] == pytest.approx(want, abs=1e-5)
        assert o.reward == pytest.approx(2.0 * want + o.components["exact_match"], abs=1e-5)
    assert scores.token_rewards is None and fn.reward_model_keys == ["outcome_rm"]


def test_a_causal_lm_with_a_value_head_is_an_outcome_rm(tmp_path, tiny_tokenizer):
    from safetensors.torch import save_file

    path = tmp_path / "vh"
    lm = make_model(tiny_tokenizer, seed=2)
    lm.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    torch.manual_seed(5)
    w, b = torch.randn(1, 64), torch.randn(1)
    save_file({"weight": w, "bias": b}, str(path / "value_head.safetensors"))
    rm = OutcomeRMVerifier(str(path), normalize="none")
    ex = Example(id="0", messages=[{"role": "user", "content": "hi"}], answer=None)
    traj = type("T", (), {"text": "abc"})()
    (res,) = rm.score_batch([traj], [ex])
    ids = tiny_tokenizer(render_prompt(tiny_tokenizer, ex.messages) + "abc", add_special_tokens=False,
                         return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = lm.model(input_ids=ids).last_hidden_state[0, -1]
    assert res.score == pytest.approx(float(hidden @ w[0] + b[0]), abs=1e-4)


def test_prm_places_credit_assigned_step_rewards_on_step_end_tokens(rm_dir, tiny_tokenizer):
    from reinforge.batch import Segment, Trajectory

    text = "12\n34\n5"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
    traj = Trajectory(prompt_ids=[2], token_ids=ids, action_mask=[True] * len(ids), text=text,
                      segments=[Segment("assistant", 0, len(ids), text)], truncated=False)
    ex = Example(id="0", messages=[{"role": "user", "content": "count"}], answer="5")
    for credit, opts, rule in (("min", {"temperature": 0.5}, min_form_credit), ("sum", {"gamma": 0.9}, sum_form_credit)):
        prm = ProcessRewardVerifier(str(rm_dir), policy_tokenizer=tiny_tokenizer, credit=credit, **opts)
        (res,) = prm.score_batch([traj], [ex])
        probs = prm.step_scores([ex.messages], [text])[0][0]
        assert len(probs) == 3 and res.details["steps"] == 3
        assert res.score == pytest.approx(min(probs)) and res.in_reward is False
        step_rewards = rule(torch.tensor([probs], dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool), **opts)[0]
        want = [0.0] * len(ids)
        for pos, r in zip([1, 4, 6], step_rewards.tolist()):  # "2", "4", "5" end the steps
            want[pos] = r
        assert res.token_rewards == pytest.approx(want)
    # the step probabilities are the model's own logits at those tokens
    ref = _seq_cls(make_tokenizer(), seed=1)
    full = render_prompt(tiny_tokenizer, ex.messages) + text
    enc = tiny_tokenizer(full, add_special_tokens=False, return_tensors="pt")
    hidden = ref.model(input_ids=enc["input_ids"]).last_hidden_state[0]
    n = enc["input_ids"].shape[1]
    expected = [torch.sigmoid(ref.score(hidden[n - len(text) + j])).item() for j in (1, 4, 6)]
    assert probs == pytest.approx(expected, abs=1e-5)
    # mode=score: the aggregate is the reward and there are no token rewards
    (res,) = ProcessRewardVerifier(str(rm_dir), mode="score", aggregate="mean").score_batch([traj], [ex])
    assert res.token_rewards is None and res.in_reward and res.score == pytest.approx(sum(expected) / 3, abs=1e-5)


def test_prm_token_rewards_reach_scores_but_not_the_scalar_reward(rm_dir, tiny_tokenizer, tiny_model):
    rollout = _rollout(tiny_tokenizer, tiny_model, ["a", "b"], tokens=16)
    examples = [Example(id=str(i), messages=[{"role": "user", "content": "a"}], answer="zz") for i in range(4)]
    prm = ProcessRewardVerifier(str(rm_dir), policy_tokenizer=tiny_tokenizer, pattern=r"\s+")
    scores = RewardFunction([(prm, 0.5), (ExactMatchVerifier(answer_format="raw"), 1.0)]).score(rollout, examples)
    assert scores.rewards.tolist() == [0.0] * 4  # only the exact match (all wrong) adds to the scalar
    assert all(0 < o.components["prm"] < 1 for o in scores.outcomes)
    tok = scores.token_rewards
    assert tok is not None and (tok[~rollout.action_mask] == 0).all()
    for i, o in enumerate(scores.outcomes):
        steps = len(prm.steps.splitter.spans(rollout.texts[i]))
        assert int((tok[i] != 0).sum()) <= steps and (steps == 0 or tok[i].abs().sum() > 0)


def test_judge_scores_by_the_verdict_tokens_probability(tmp_path, tiny_tokenizer):
    path = tmp_path / "judge"
    lm = make_model(tiny_tokenizer, seed=4).eval()
    lm.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    judge = JudgeVerifier(str(path))
    ex = Example(id="0", messages=[{"role": "user", "content": "2+2?"}], answer="4")
    traj = type("T", (), {"text": "<answer>4</answer>"})()
    (res,) = judge.score_batch([traj], [ex])
    prompt = render_prompt(tiny_tokenizer, [{"role": "user", "content":
                           "Question:\n2+2?\n\nProposed solution:\n<answer>4</answer>\n\nIs this solution correct? Answer Yes or No."}])
    ids = tiny_tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[0, -1]
    y, n = tiny_tokenizer.convert_tokens_to_ids(["Y", "N"])  # first tokens of "Yes"/"No"
    want = math.exp(logits[y]) / (math.exp(logits[y]) + math.exp(logits[n]))
    assert res.score == pytest.approx(want, abs=1e-5)
    # per step: one verdict per step, batched with the others; a batch gives the same as one by one
    step_judge = JudgeVerifier(str(path), unit="step", mode="score")
    two = [type("T", (), {"text": "a\nb"})(), type("T", (), {"text": "c"})()]
    together = step_judge.score_batch(two, [ex, ex])
    alone = [step_judge.score_batch([t], [ex])[0] for t in two]
    assert [r.details["steps"] for r in together] == [2, 1]
    assert [r.score for r in together] == pytest.approx([r.score for r in alone], abs=1e-5)


def test_reward_model_config_errors_name_the_fix(tmp_path, rm_dir):
    task = ReasoningGymTask("leg_counting", train_size=4, eval_size=2, seed=0)

    def build(spec):
        return build_reward(build_config({"reward": {"verifiers": [{"name": "task"}, spec]}}).reward, task)

    with pytest.raises(ValueError, match="local paths only.*train-rm"):
        build({"name": "prm", "options": {"path": str(tmp_path / "nope")}})
    with pytest.raises(ValueError, match="options.path is required"):
        build({"name": "outcome_rm"})
    with pytest.raises(ValueError, match="unknown option.*'temp'.*accepted"):
        build({"name": "prm", "options": {"path": str(rm_dir), "temp": 1}})
    with pytest.raises(ValueError, match="gamma do not apply to credit='min'"):
        build({"name": "prm", "options": {"path": str(rm_dir), "gamma": 0.9}})
    with pytest.raises(ValueError, match="unknown credit assignment rule 'max'"):
        build({"name": "prm", "options": {"path": str(rm_dir), "credit": "max"}})
    with pytest.raises(ValueError, match="reward.verifiers\\[1\\]"):
        build({"name": "judge", "options": {"path": str(rm_dir), "unit": "paragraph"}})


def test_implicit_prm_rewards_start_at_zero_and_learn_from_outcomes(tiny_model_dir, tiny_tokenizer, tiny_model):
    from reinforge.rewards.models.verifiers import ImplicitPRMVerifier

    rollout = _rollout(tiny_tokenizer, tiny_model, ["x", "y"], n=2, tokens=8)
    examples = [Example(id=str(i), messages=[], answer="a") for i in range(4)]
    prm = ImplicitPRMVerifier(str(tiny_model_dir), policy_tokenizer=tiny_tokenizer, beta=1.0, lr=1e-2)
    fn = RewardFunction([(prm, 1.0)])
    first = fn.score(rollout, examples)
    # pi_phi == pi_ref before any update: every token reward is 0, the implicit outcome 0.5
    assert first.token_rewards is not None and first.token_rewards.abs().max() < 1e-6
    assert all(o.components["implicit_prm"] == pytest.approx(0.5) for o in first.outcomes)
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    trajectories = [rollout.trajectory(i) for i in range(4)]
    for _ in range(5):
        prm.learn_from_outcomes(trajectories, examples, labels)
    after = fn.score(rollout, examples)
    z = [o.components["implicit_prm"] for o in after.outcomes]
    assert z[0] > 0.5 and z[2] > 0.5 and z[1] < 0.5 and z[3] < 0.5
    # the implicit outcome is sigmoid of the summed token rewards
    assert z[0] == pytest.approx(1 / (1 + math.exp(-float(after.token_rewards[0].sum()))), abs=1e-5)
    # RewardFunction.learn updates it with the verifiers' verdicts; scoring alone never does
    before = [p.clone() for p in prm.model.parameters()][0]
    fn.score(rollout, examples)
    assert torch.equal(before, next(prm.model.parameters()))
    fn2 = RewardFunction([(prm, 1.0), (ExactMatchVerifier(answer_format="raw"), 1.0)])
    fn2.learn(rollout, examples, fn2.score(rollout, examples).outcomes)
    assert not torch.equal(before, next(prm.model.parameters()))


# ----------------------------------------------------------------------------- the guard


def test_hacking_guard_fires_when_rm_reward_rises_while_accuracy_falls(caplog):
    guard = RewardHackingGuard(["prm"], window=6, min_rise=0.05, min_fall=0.05)
    flags = []
    history = ([(0.50, 0.40)] * 6                                     # flat: no warning
               + [(0.50 + 0.05 * i, 0.40 - 0.04 * i) for i in range(1, 7)]  # RM up, accuracy down
               + [(0.80, 0.20 + 0.05 * i) for i in range(1, 7)])           # accuracy recovers
    with caplog.at_level("WARNING", logger="reinforge"):
        for step, (rm, acc) in enumerate(history, 1):
            out = guard.observe(step, {"reward/prm": rm, "accuracy": acc})
            assert out["rm_reward"] == rm and out["verifier_accuracy"] == acc
            flags.append(out.get("rm_hacking"))
    assert flags[:5] == [None] * 5 and flags[5] == 0.0  # the window fills first
    assert flags[6:8] == [0.0, 0.0]  # too little divergence yet
    assert 1.0 in flags[8:12] and flags[-1] == 0.0
    fired = [m for m in caplog.messages if "possible reward hacking" in m]
    assert len(fired) == 1  # warned once, when it started firing
    # both rising (the RM tracks accuracy) never fires
    calm = RewardHackingGuard(["prm"], window=4, min_rise=0.0, min_fall=0.0)
    assert not any(calm.observe(s, {"reward/prm": 0.1 * s, "accuracy": 0.1 * s}).get("rm_hacking") for s in range(1, 12))
    # a resumed run refills the window from its logged metrics
    resumed = RewardHackingGuard(["prm"], window=6, min_rise=0.05, min_fall=0.05)
    logged = [{"rm_reward": rm, "verifier_accuracy": acc} for rm, acc in history[:10]]
    resumed.replay(logged)
    fresh = RewardHackingGuard(["prm"], window=6, min_rise=0.05, min_fall=0.05)
    for s, (rm, acc) in enumerate(history[:10], 1):
        fresh.observe(s, {"reward/prm": rm, "accuracy": acc})
    nxt = {"reward/prm": history[10][0], "accuracy": history[10][1]}
    assert resumed.observe(11, dict(nxt)) == fresh.observe(11, dict(nxt))


# ----------------------------------------------------------------------------- a PRM that learns


def _successor_chain(rng: random.Random):
    """Three steps "a+1=c"; a step is wrong (label 0) when c was corrupted."""
    a, steps, labels = rng.randint(0, 5), [], []
    for _ in range(3):
        c = a + 1
        good = rng.random() >= 0.3
        if not good:
            c += rng.choice([-2, -1, 1, 2])
        steps.append(f"{a}+1={c}")
        labels.append(float(good))
        a = c
    text = "\n".join(steps)
    ends = [sum(len(s) + 1 for s in steps[: k + 1]) - 1 for k in range(3)]
    return text, ends, labels


def test_a_tiny_prm_learns_to_separate_good_from_bad_steps(tiny_tokenizer):
    rng = random.Random(0)
    train = [_successor_chain(rng) for _ in range(300)]
    held_out = [_successor_chain(rng) for _ in range(200)]
    model = _seq_cls(tiny_tokenizer, seed=0)
    scorer = ScalarHeadModel(model.base_model, model.score, tiny_tokenizer, max_length=64)
    labels = [y > 0.5 for _, _, ys in held_out for y in ys]

    def auc() -> float:
        preds = scorer.logits_at([t for t, _, _ in held_out], [e for _, e, _ in held_out], batch_size=64)
        return roc_auc([p for row in preds for p in row], labels)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only contend (20x slower on a busy 2-core box)
    try:
        before = auc()
        history = fit_reward_model(scorer, torch.optim.AdamW(model.parameters(), lr=3e-3), train, epochs=6, batch_size=16)
        after = auc()
    finally:
        torch.set_num_threads(threads)
    assert history[-1] < history[0]
    assert abs(before - 0.5) < 0.15 and after > 0.85, (before, after)


# ----------------------------------------------------------------------------- measurement helpers


def test_auc_and_majority_vote_by_hand():
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert roc_auc([0.5, 0.5], [0, 1]) == pytest.approx(0.5)  # a tie counts half
    assert math.isnan(roc_auc([0.1, 0.2], [1, 1]))
    assert majority_pick(["3", None, "4", "4", "3"]) == 0  # tie between 3 and 4: the first seen
    assert majority_pick([None, "7", "7", "2"]) == 1
    assert majority_pick([None, None]) == 0


def test_best_of_n_measurement_on_hand_made_records():
    from reinforge.reward_models.train import RMSettings

    def rec(p, s, correct, answer, pred, labels):
        return {"prompt_id": p, "sample": s, "correct": correct, "answer": answer, "pred": pred, "step_labels": labels}

    records = [  # prompt a: the majority is wrong, the PRM picks the right one; prompt b: both right
        rec("a", 0, False, "1", [0.9, 0.2], [1.0, 0.0]), rec("a", 1, False, "1", [0.4, 0.3], [1.0, 0.0]),
        rec("a", 2, True, "2", [0.9, 0.7], [1.0, 1.0]),
        rec("b", 0, True, "5", [0.6], [1.0]), rec("b", 1, True, "5", [0.7], [1.0]), rec("b", 2, False, "6", [0.1], [0.0]),
    ]
    ev = evaluate_records(records, RMSettings(bootstrap_resamples=200), seed=0)
    assert ev["best_of_n_rm"] == 1.0 and ev["best_of_n_majority"] == 0.5
    assert ev["best_of_n_random"] == pytest.approx((1 / 3 + 2 / 3) / 2) and ev["best_of_n_oracle"] == 1.0
    assert ev["rm_minus_majority"]["diff"] == 0.5
    # 9 steps: 6 positive (one, 0.4, under 0.5) and 3 negative (all under 0.5): accuracy 8/9;
    # every positive outscores every negative: AUC 1
    assert ev["step_labels"] == 9 and ev["step_accuracy"] == pytest.approx(8 / 9)
    assert ev["step_auc"] == 1.0
    lo, hi = ev["step_auc_ci"]
    assert lo <= ev["step_auc"] <= hi


# ----------------------------------------------------------------------------- train-rm and RL with a PRM


def _rm_config(tmp_path, model_dir, *extra):
    return RMRunConfig.from_dict({}, [
        f"model.path={model_dir}", "task.name=basic_arithmetic", "task.train_size=8", "task.eval_size=4",
        "rollout.max_new_tokens=12", "rollout.temperature=1.0", "trainer.seed=0",
        f"tracking.output_dir={tmp_path / 'runs'}", "tracking.progress=false",
        "rm.train_prompts=3", "rm.eval_prompts=2", "rm.samples_per_prompt=2", "rm.mc_rollouts=2",
        "rm.epochs=2", "rm.batch_size=4", "rm.lr=1e-3", "rm.bootstrap_resamples=200", "rm.pattern='\\s+'",
        *extra,
    ])


def test_train_rm_makes_a_prm_usable_as_a_verifier_and_resumes(tmp_path, tiny_model_dir, tiny_tokenizer):
    cfg = _rm_config(tmp_path, tiny_model_dir)
    path = RewardModelTrainer(cfg).run()
    rd = RunDir.open(path)
    assert rd.status()["state"] == "finished" and rd.kind == "train_rm"
    train = [json.loads(line) for line in (path / "data" / "train.jsonl").read_text().splitlines()]
    assert len(train) == 3 * 2 and len({r["prompt_id"] for r in train}) == 3
    for r in train:  # Math-Shepherd labels: one per step, fractions of 2 rollouts; the last is the verdict
        assert len(r["step_labels"]) == len(r["steps"])
        assert all(y in (0.0, 0.5, 1.0) for y in r["step_labels"])
        if r["steps"]:
            assert r["step_labels"][-1] == float(r["correct"])
    summary = json.loads((path / "summary.json").read_text())
    for key in ("step_auc", "step_accuracy", "best_of_n_rm", "best_of_n_majority", "best_of_n_random", "rm_minus_majority"):
        assert key in summary
    assert [m["step"] for m in rd.read_metrics()] == [1, 2]
    meta = json.loads((path / "final_model" / "reinforge_rm.json").read_text())
    assert meta["kind"] == "prm" and meta["steps"]["pattern"] == "\\s+"
    # the trained folder is a PRM verifier in a train config (its step split comes from the folder)
    task = ReasoningGymTask("basic_arithmetic", train_size=4, eval_size=2, seed=0)
    reward = build_reward(build_config({"reward": {"verifiers": [
        {"name": "task"}, {"name": "prm", "weight": 0.5, "options": {"path": str(path / "final_model")}}]}}).reward,
        task, policy_tokenizer=tiny_tokenizer)
    prm = [v for _, v, _, _ in reward._entries if v.name == "prm"][0]
    assert prm.steps.splitter.pattern == "\\s+"
    # resume: nothing is relabelled or retrained, and the measurement is the same
    data_before = (path / "data" / "train.jsonl").read_bytes()
    RewardModelTrainer(RMRunConfig.from_dict(rd.load_config()), run_dir=rd, resume=True).run()
    assert (path / "data" / "train.jsonl").read_bytes() == data_before
    assert json.loads((path / "summary.json").read_text()) == summary
    assert [m["step"] for m in rd.read_metrics()] == [1, 2]


def test_train_rm_config_errors():
    from reinforge.config import ConfigError

    with pytest.raises(ConfigError, match="rm.epochs"):
        RMRunConfig.from_dict({"rm": {"epochs": 0}})
    with pytest.raises(ConfigError, match="accepted keys here"):
        RMRunConfig.from_dict({"rm": {"epoch": 1}})
    with pytest.raises(ConfigError, match="not with reward models"):
        RMRunConfig.from_dict({"reward": {"verifiers": [{"name": "prm", "options": {"path": "x"}}]}})


def test_two_trainer_steps_with_a_prm_verifier_and_reinforce_pp_token_rewards(tmp_path, tiny_model_dir, rm_dir):
    from reinforge.trainer import Trainer

    cfg = build_config({}, [
        f"model.path={tiny_model_dir}", "task.name=basic_arithmetic", "task.train_size=8", "task.eval_size=2",
        f"reward.verifiers=[{{name: task}}, {{name: prm, weight: 0.5, options: {{path: '{rm_dir}', pattern: '\\s+', "
        "credit: min, temperature: 0.1}}]",
        "reward.hacking_guard.window=4",
        "algorithm.advantage=reinforce_pp", "algorithm.scale_rewards=none",
        "rollout.num_samples=2", "rollout.max_new_tokens=10", "trainer.prompts_per_step=2", "trainer.steps=2",
        "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.eval_max_prompts=2", "trainer.seed=1",
        f"tracking.output_dir={tmp_path / 'runs'}", "tracking.progress=false",
    ])
    trainer = Trainer(cfg)
    captured = []
    original = trainer.prepare

    def spy(scored):
        captured.append(scored.scores)
        return original(scored)

    trainer.prepare = spy
    result = trainer.run()
    metrics = RunDir.open(result.run_dir).read_metrics()
    assert len(metrics) == 2
    for m in metrics:
        assert 0 < m["reward/prm"] < 1 and m["rm_reward"] == m["reward/prm"]
        assert m["verifier_accuracy"] == m["accuracy"] and "rm_hacking" not in m  # window of 4 not yet full
    assert all(s.token_rewards is not None and s.token_rewards.abs().sum() > 0 for s in captured)
    # the PRM's aggregate is logged, not added: the scalar reward is the task verifier's alone
    for s in captured:
        assert [o.reward for o in s.outcomes] == [o.components["task"] for o in s.outcomes]


def test_a_run_with_an_implicit_prm_resumes_exactly(tmp_path, tiny_model_dir):
    """PRIME's implicit PRM changes during the run: its weights and optimiser are checkpointed, so
    resuming from step 2 gives the uninterrupted run's rewards (they used to restart from path)."""
    from reinforge.trainer import Trainer

    def cfg(name, steps):
        return build_config({}, [
            f"model.path={tiny_model_dir}", "task.name=basic_arithmetic", "task.train_size=8", "task.eval_size=2",
            f"reward.verifiers=[{{name: task}}, {{name: implicit_prm, options: {{path: '{tiny_model_dir}', "
            "beta: 0.5, lr: 0.01}}]",
            "algorithm.advantage=reinforce_pp", "algorithm.scale_rewards=none",
            "rollout.num_samples=2", "rollout.max_new_tokens=6", "trainer.prompts_per_step=2", f"trainer.steps={steps}",
            "trainer.eval_every=0", "trainer.checkpoint_every=2", "trainer.seed=1",
            f"tracking.output_dir={tmp_path / 'runs'}", f"tracking.run_name={name}", "tracking.progress=false",
        ])

    straight = Trainer(cfg("straight", 4)).run()
    half = Trainer(cfg("cut", 2)).run()
    rd = RunDir.open(half.run_dir)
    Trainer(build_config(rd.load_config(), ["trainer.steps=4"]), run_dir=rd, resume=True).run()
    a, b = RunDir.open(straight.run_dir).read_metrics(), rd.read_metrics()
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    # the implicit PRM learned in steps 1-2 (its outcome probability moved), and step 3-4's
    # rewards after the resume are the uninterrupted run's
    assert a[0]["reward/implicit_prm"] != a[2]["reward/implicit_prm"]
    for x, y in zip(a, b):
        for key in ("reward/implicit_prm", "loss", "reward_mean"):
            assert x[key] == y[key], (key, x["step"], x[key], y[key])
    # a checkpoint without the implicit PRM's state (written before it was saved) still resumes:
    # the PRM starts from its path, as it used to
    from reinforge.tracking.checkpoints import list_checkpoints
    from reinforge.tracking.checkpoints import file_digest, state_digest

    ckpt = list_checkpoints(rd.path)[-1][1]
    opt = torch.load(ckpt / "optimizer.pt", weights_only=False)
    assert "implicit_prm" in opt.pop("reward_models")
    torch.save(opt, ckpt / "optimizer.pt")
    state = json.loads((ckpt / "state.json").read_text())
    state["files"]["optimizer.pt"] = file_digest(ckpt / "optimizer.pt")
    state["state_sha256"] = state_digest(state)
    (ckpt / "state.json").write_text(json.dumps(state))
    Trainer(build_config(rd.load_config(), ["trainer.steps=5"]), run_dir=rd, resume=True).run()
    assert [m["step"] for m in rd.read_metrics()] == [1, 2, 3, 4, 5]
