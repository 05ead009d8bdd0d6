"""The trajectory-shaped core: action masks with holes, rewards that see trajectories, the
learner's state, the device option and the curriculum interface."""

from __future__ import annotations

import copy

import pytest
import torch

from reinforge.batch import RolloutBatch, Segment, TrainBatch, concat_rollouts
from reinforge.config import AlgorithmConfig, LearnerConfig, build_config
from reinforge.learner import Learner
from reinforge.rewards import RewardFunction, VerifierResult
from reinforge.rewards.verifiers import ExactMatchVerifier
from reinforge.tasks.base import Example

from conftest import chat_prompts


def _multi_turn_batch(tok, *, holes: bool = True, seed: int = 0) -> RolloutBatch:
    """Two groups of two rows: assistant tokens, then (with ``holes``) 3 observation tokens the
    model did not write, then assistant tokens again; row 3 is shorter (padding)."""
    g = torch.Generator().manual_seed(seed)
    prompts = chat_prompts(tok, ["2+2?", "hi"])
    rows = [prompts[0], prompts[0], prompts[1], prompts[1]]
    P = max(len(p) for p in rows)
    T = 11
    prompt_ids = torch.zeros(4, P, dtype=torch.long)
    prompt_mask = torch.zeros(4, P, dtype=torch.bool)
    for i, p in enumerate(rows):
        prompt_ids[i, P - len(p):] = torch.tensor(p)
        prompt_mask[i, P - len(p):] = True
    completion_ids = torch.randint(5, len(tok), (4, T), generator=g)
    completion_mask = torch.ones(4, T, dtype=torch.bool)
    completion_mask[3, 8:] = False
    completion_ids[3, 8:] = 0
    action = completion_mask.clone()
    if holes:
        action[:, 3:6] = False  # a tool's answer: context, not the model's
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
        completion_mask=completion_mask, action_mask=action,
        sampler_logprobs=torch.where(action, -torch.rand(4, T, generator=g), torch.zeros(4, T)),
        truncated=torch.zeros(4, dtype=torch.bool), group_index=torch.tensor([0, 0, 1, 1]),
        texts=["a", "b", "c", "d"],
        segments=[[Segment("assistant", 0, 3), Segment("tool", 3, 6), Segment("assistant", 6, 11 if i < 3 else 8)]
                  for i in range(4)],
    )


def _learner(model, **kw):
    return Learner(model, LearnerConfig(lr=1e-2, **kw), AlgorithmConfig(), temperature=0.8, max_new_tokens=11)


@pytest.mark.parametrize("chunk,share", [(0, False), (64, False), (64, True)])
def test_logprobs_with_holes_equal_the_contiguous_case_where_they_coincide(tiny_model, tiny_tokenizer, chunk, share):
    holed = _multi_turn_batch(tiny_tokenizer, holes=True)
    full = _multi_turn_batch(tiny_tokenizer, holes=False)
    learner = _learner(tiny_model, logits_chunk_tokens=chunk, share_prompt_prefix=share)
    a, b = learner.compute_logprobs(holed), learner.compute_logprobs(full)
    assert torch.allclose(a[holed.action_mask], b[holed.action_mask], atol=1e-5)
    assert (a[~holed.action_mask] == 0).all()  # observation and padding tokens are not scored
    assert (b[full.action_mask] != 0).all()


def test_tokens_outside_the_action_mask_get_exactly_zero_gradient(tiny_model, tiny_tokenizer):
    """The gradient of the learner's loss w.r.t. the logits that predict an observation token is
    exactly zero, and it is not zero on the model's own tokens."""
    batch = _multi_turn_batch(tiny_tokenizer)
    learner = _learner(tiny_model, logits_chunk_tokens=0, share_prompt_prefix=False, lr_warmup_steps=0)
    captured = {}

    def keep(_module, _inputs, output):
        output.retain_grad()
        captured["logits"] = output

    handle = tiny_model.lm_head.register_forward_hook(keep)
    try:
        learner.step(TrainBatch(rollout=batch, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5])))
    finally:
        handle.remove()
    grad = captured["logits"].grad  # [4, cw + 1, V]: position j predicts completion token j (last: past the end)
    per_token = grad[:, :-1].abs().sum(-1)
    assert (per_token[~batch.action_mask] == 0).all()
    assert (per_token[batch.action_mask] > 0).all()


def _gradients_of_one_step(learner, batch) -> tuple[dict, list[torch.Tensor]]:
    """The learner's step stats and the accumulated gradients just before its optimiser step."""
    grads: list[torch.Tensor] = []
    step = learner.optimizer.step

    def record_then_step(*a, **k):
        grads.extend(p.grad.detach().clone() for p in learner.params)
        return step(*a, **k)

    learner.optimizer.step = record_then_step
    return learner.step(batch), grads


def test_update_with_holes_does_not_depend_on_the_micro_batch_split(tiny_model, tiny_tokenizer):
    batch = _multi_turn_batch(tiny_tokenizer)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    results = []
    for budget in (4096, 20):  # one micro-batch, or one row (group) at a time
        learner = _learner(copy.deepcopy(tiny_model), micro_batch_tokens=budget, logits_chunk_tokens=0)
        results.append(_gradients_of_one_step(learner, TrainBatch(rollout=batch, advantages=adv)))
    (s1, g1), (s2, g2) = results
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-6)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(g1, g2))
    assert any(x.abs().max() > 1e-4 for x in g1)


def test_select_and_concat_carry_action_masks_versions_and_segments(tiny_tokenizer):
    batch = _multi_turn_batch(tiny_tokenizer)
    batch.versions = torch.tensor([3, 3, 4, 4])
    part = batch.select(torch.tensor([2, 3]))
    assert torch.equal(part.action_mask, batch.action_mask[2:4, : part.completion_ids.shape[1]])
    assert part.versions.tolist() == [4, 4] and part.group_index.tolist() == [0, 0]
    assert part.segments == batch.segments[2:]
    both = concat_rollouts([batch.select(torch.tensor([0, 1])), part], pad_id=0)
    assert torch.equal(both.action_mask, batch.action_mask) and both.versions.tolist() == [3, 3, 4, 4]
    traj = batch.trajectory(3)
    assert len(traj) == 8 and traj.action_mask == [True] * 3 + [False] * 3 + [True] * 2
    assert traj.segments[1].role == "tool"


def test_action_mask_must_be_inside_the_completion_mask(tiny_tokenizer):
    batch = _multi_turn_batch(tiny_tokenizer)
    bad = batch.completion_mask.clone()
    bad[3, 9] = True  # padding
    with pytest.raises(ValueError, match="action_mask"):
        RolloutBatch(prompt_ids=batch.prompt_ids, prompt_mask=batch.prompt_mask, completion_ids=batch.completion_ids,
                     completion_mask=batch.completion_mask, action_mask=bad,
                     sampler_logprobs=batch.sampler_logprobs, truncated=batch.truncated,
                     group_index=batch.group_index)


class _TokenCounter:
    """A trajectory-aware verifier: 1 per assistant segment, and a token reward of 0.5 on the last
    token of every segment (the shape a process reward model's step scores take)."""

    name = "segments"
    takes_trajectory = True

    def __call__(self, trajectory, example):
        token = [0.0] * len(trajectory)
        for seg in trajectory.segments:
            token[seg.end - 1] = 0.5
        return VerifierResult(float(sum(s.role == "assistant" for s in trajectory.segments)), None, token_rewards=token)


def test_rewards_see_trajectories_and_return_token_rewards(tiny_tokenizer):
    batch = _multi_turn_batch(tiny_tokenizer)
    fn = RewardFunction([(_TokenCounter(), 2.0), (ExactMatchVerifier(answer_format="raw"), 1.0)])
    examples = [Example(id=str(i), messages=[], answer=t) for i, t in enumerate(["a", "x", "c", "y"])]
    scores = fn.score(batch, examples)
    assert scores.rewards.tolist() == [5.0, 4.0, 5.0, 4.0]  # 2 x 2 segments + exact match
    assert scores.correct.tolist() == [1.0, 0.0, 1.0, 0.0]
    tok = scores.token_rewards
    assert tok.shape == batch.completion_ids.shape
    # Segment ends are tokens 2, 5 and 10 (row 3: 7); token 5 is the tool's: not the model's, dropped.
    assert tok[0].nonzero().squeeze(1).tolist() == [2, 10] and tok[0, 2] == 1.0
    assert tok[3].nonzero().squeeze(1).tolist() == [2, 7]
    assert (tok[~batch.action_mask] == 0).all()


def test_a_wrong_length_of_token_rewards_is_an_error_for_that_sample_only(tiny_tokenizer):
    class Short(_TokenCounter):
        def __call__(self, trajectory, example):
            return VerifierResult(1.0, None, token_rewards=[1.0])

    batch = _multi_turn_batch(tiny_tokenizer)
    examples = [Example(id=str(i), messages=[], answer="a") for i in range(4)]
    scores = RewardFunction([(Short(), 1.0), (ExactMatchVerifier(answer_format="raw"), 1.0)]).score(batch, examples)
    assert scores.token_rewards is None and scores.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert all("1 token rewards for a trajectory" in o.errors[0] for o in scores.outcomes)


def test_length_shaping_counts_the_models_tokens(tiny_tokenizer):
    from reinforge.config import RewardConfig
    from reinforge.rewards.shaping import LengthShaping

    batch = _multi_turn_batch(tiny_tokenizer)
    shaping = LengthShaping.from_config(RewardConfig(overlong_buffer=0.5, overlong_penalty=1.0), max_new_tokens=8)
    fn = RewardFunction([(ExactMatchVerifier(answer_format="raw"), 1.0)], shaping=shaping)
    examples = [Example(id=str(i), messages=[], answer="nope") for i in range(4)]
    scores = fn.score(batch, examples)
    # 8 action tokens in rows 0-2 (11 - 3 observation tokens): at the limit, -1; row 3 has 5: -0.25.
    assert scores.rewards.tolist() == [0.0] * 4
    assert scores.shaped.tolist() == pytest.approx([-1.0, -1.0, -1.0, -0.25])


def test_learner_state_dict_round_trip_equals_an_uninterrupted_learner(tiny_model, tiny_tokenizer):
    """Two updates, a save, a third: a fresh learner loaded from the save makes the same third
    update, bit for bit (weights, AdamW moments, scheduler position)."""
    batch = _multi_turn_batch(tiny_tokenizer)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    model = copy.deepcopy(tiny_model)
    a = Learner(model, LearnerConfig(lr=1e-2, lr_warmup_steps=5), AlgorithmConfig(), max_new_tokens=11)
    a.step(TrainBatch(rollout=batch, advantages=adv))
    a.step(TrainBatch(rollout=batch, advantages=-adv))
    saved = copy.deepcopy(a.state_dict())
    a.step(TrainBatch(rollout=batch, advantages=adv))

    b_model = copy.deepcopy(tiny_model)  # the initial weights: everything must come from the state
    b = Learner(b_model, LearnerConfig(lr=1e-2, lr_warmup_steps=5), AlgorithmConfig(), max_new_tokens=11)
    b.load_state_dict(saved)
    assert b.scheduler.get_last_lr() == pytest.approx([1e-2 * 3 / 5])
    b.step(TrainBatch(rollout=batch, advantages=adv))
    for (n, p), q in zip(model.named_parameters(), b_model.parameters()):
        assert torch.equal(p, q), n


def test_learner_state_refuses_a_critic_mismatch(tiny_model, tiny_tokenizer):
    learner = _learner(tiny_model)
    state = learner.state_dict()
    state["critic"] = {"weights": {}, "optimizer": {}}
    with pytest.raises(ValueError, match="critic"):
        learner.load_state_dict(state)


def test_model_device_option():
    from reinforge.models import ModelLoadError, resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert build_config({}, ["model.device=cuda:1"]).model.device == "cuda:1"
    with pytest.raises(ValueError, match="model.device"):
        build_config({}, ["model.device=gpu"])
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="model.device='cuda'.*model.device=cpu"):
            resolve_device("cuda")


def test_curriculum_interface_default_and_dynamic_sampling():
    from reinforge.curriculum import Curriculum, DynamicSampling, build_curriculum

    cfg = build_config({}, ["trainer.seed=3"])
    cur = build_curriculum(cfg, 10)
    assert type(cur) is Curriculum and cur.max_rounds == 1
    first = cur.sample(4)
    state = cur.state_dict()
    nxt = cur.sample(8)  # crosses into the next epoch
    again = build_curriculum(cfg, 10)
    again.load_state_dict(state)
    assert again.sample(8) == nxt and sorted(first + nxt[:6]) == list(range(10))
    rewards, groups = torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1])
    assert cur.keep(rewards, groups).tolist() == [True, True]
    dyn = build_curriculum(build_config({}, ["algorithm.dynamic_sampling=true", "algorithm.max_sampling_rounds=3"]), 10)
    assert isinstance(dyn, DynamicSampling) and dyn.max_rounds == 3
    assert dyn.keep(rewards, groups).tolist() == [False, True]


def test_renamed_warmup_keys_still_load():
    cfg = build_config({"learner": {"warmup_steps": 4}, "critic": {"warmup_steps": 2}}, [])
    assert cfg.learner.lr_warmup_steps == 4 and cfg.critic.critic_only_steps == 2


def test_token_rewards_from_the_reward_side_reach_token_level_estimators(tiny_tokenizer):
    from reinforge.algorithms import AdvantageInputs, compute_advantages

    batch = _multi_turn_batch(tiny_tokenizer)
    examples = [Example(id=str(i), messages=[], answer="a") for i in range(4)]
    scores = RewardFunction([(_TokenCounter(), 1.0), (ExactMatchVerifier(answer_format="raw"), 1.0)]).score(batch, examples)

    def advantages(name, token_rewards):
        return compute_advantages(name, AdvantageInputs(
            rewards=scores.shaped, group_index=batch.group_index, mask=batch.action_mask,
            token_rewards=token_rewards, scale="none", gamma=1.0,
        )).advantages

    with_tokens, without = advantages("reinforce_pp", scores.token_rewards), advantages("reinforce_pp", None)
    assert with_tokens.shape == batch.completion_ids.shape
    assert not torch.allclose(with_tokens[batch.action_mask], without[batch.action_mask])
    assert (with_tokens[~batch.action_mask] == 0).all()
    with pytest.raises(ValueError, match="per-token rewards"):
        advantages("grpo", scores.token_rewards)  # a sequence-level estimator would drop them
