"""Multi-turn tool-using agents: tools from typed functions, environments, and the token-in/
token-out agent loop that returns the trainer's ``RolloutBatch`` (docs/agents.md)."""

from __future__ import annotations

from reinforge.agents.env import Env, StepResult, ToolEnv
from reinforge.agents.registry import ENVS, EnvSpec, env_factory, env_spec, make_env_task, register_env
from reinforge.agents.loop import AgentBudgets, AgentGenerator, Episode, TurnRecord
from reinforge.agents.render import ChatRenderer
from reinforge.agents.scoring import AgentReward, agent_metrics, turn_returns, write_trajectories
from reinforge.agents.tools import Tool, ToolCall, ToolExecutor, ToolResult, parse_tool_calls


def build_run_task(cfg):
    """The run's task: the environment's own examples for ``task.source: env``, else the task
    section's (``tasks.build_task``)."""
    from reinforge.tasks import build_task
    from reinforge.tasks.base import TaskError

    if cfg.task.source != "env":
        return build_task(cfg.task)
    if cfg.env.name == "verifiers":  # a verifiers taskset's tasks (imported only when named)
        from reinforge.agents.verifiers_source import verifiers_task

        return verifiers_task(cfg)
    spec = env_spec(cfg.env.name)
    if spec.make_task is None:
        raise TaskError(f"task.source=env but environment {cfg.env.name!r} makes no examples: give it a "
                        "make_task (register_env(name, make_task=...), or for a factory named as "
                        "'module:function' the attribute function.make_task = make_my_task; docs/agents.md), "
                        "or use a task source (reasoning_gym, file, code) for it")
    return make_env_task(spec, cfg.task, dict(cfg.env.options))


def build_agent(cfg, generator, reward_fn, task, *, frozen_model=None,
                model_path=None) -> tuple[AgentGenerator, AgentReward]:
    """The agent generator (wrapping the run's HF generator) and the trajectory reward, from the
    config's ``env`` section (``env.name: verifiers``: a verifiers taskset's episodes,
    reinforge/agents/verifiers_source.py). With ``env.options.opponent: frozen`` the opponent's
    seats decode with ``frozen_model`` (the trainer passes its KL reference when it has one), else
    a frozen copy loaded from ``model_path`` (the run's starting weights; default model.path)."""
    e = cfg.env
    if e.name == "verifiers":  # episodes run by verifiers against the loopback endpoint
        from reinforge.agents.verifiers_source import build_verifiers_agent

        return build_verifiers_agent(cfg, generator, reward_fn)
    budgets = AgentBudgets(max_turns=e.max_turns, max_tokens_per_turn=e.max_tokens_per_turn or cfg.rollout.max_new_tokens,
                           max_tokens=e.max_tokens)
    if e.workers:  # the environments in worker processes (agents/env_workers.py)
        from reinforge.agents.env_workers import EnvWorkerPool

        make_env = EnvWorkerPool(e.name, dict(e.options), task, workers=e.workers, step_timeout_s=e.step_timeout_s,
                                 imports=list(getattr(cfg, "imports", None) or []))
    else:
        make_env = env_factory(e.name, dict(e.options), task)
    if e.seat_mode == "frozen" and frozen_model is None:
        frozen_model = frozen_copy(cfg, model_path, generator.engine)
    agent = AgentGenerator(generator, make_env, budgets, tool_format=e.tool_format,
                           tool_workers=e.tool_workers, overlap_tools=e.overlap_tools, frozen_model=frozen_model)
    reward = AgentReward(reward_fn, turn_rewards=e.turn_rewards, turn_discount=e.turn_discount,
                         truncated_reward=e.truncated_reward)
    return agent, reward


def frozen_copy(cfg, model_path, like):
    """The starting weights (``model_path``, default ``model.path``), whole (no LoRA), in eval mode
    with no gradients, on ``like``'s device: the frozen opponent (never updated)."""
    from reinforge.models import load_model, model_device, resolve_model_path

    path = model_path or resolve_model_path(cfg.model.path)
    model = load_model(cfg.model.model_copy(update={"lora": None}), path=path, device=model_device(like)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


__all__ = [
    "ENVS", "AgentBudgets", "AgentGenerator", "AgentReward", "ChatRenderer", "Env", "EnvSpec", "Episode", "StepResult",
    "Tool", "ToolCall", "ToolEnv", "ToolExecutor", "ToolResult", "TurnRecord", "agent_metrics", "build_agent",
    "build_run_task", "env_factory", "env_spec", "parse_tool_calls", "register_env", "turn_returns",
    "write_trajectories",
]
