"""The curriculum a run config asks for."""

from __future__ import annotations

from .adaptive import ReinforceAda
from .base import Curriculum, DynamicSampling
from .filters import DifficultyFilter, Greso
from .pools import DifficultySchedule, PooledTask, TaskMixture


def _sub_task(cfg, overrides: dict):
    from ..config import ConfigError, TaskConfig, deep_merge
    from ..tasks import build_task

    base = cfg.task.model_dump()
    if overrides.get("name", base["name"]) != base["name"]:
        base["options"] = {}  # another task: the configured task's options are not its options
    merged = deep_merge(base, overrides)
    try:
        return build_task(TaskConfig.model_validate(merged))
    except ValueError as err:
        raise ConfigError(f"curriculum: the task {overrides!r} cannot be built: {err}") from None


def build_curriculum(cfg, task_or_count) -> Curriculum:
    """The curriculum of ``cfg.curriculum`` (and ``algorithm.dynamic_sampling``) over ``task``
    (or a count of training examples, for the strategies that need no task). Its ``task`` is
    the task to train on: the given one, or a PooledTask of difficulty levels or of a mixture."""
    cc, seed = cfg.curriculum, cfg.trainer.seed
    task = None if isinstance(task_or_count, int) else task_or_count
    n = task_or_count if task is None else len(task.train_examples())
    kw = dict(success_threshold=cc.success_threshold)
    if cc.strategy == "epochs":
        if cfg.algorithm.dynamic_sampling:
            cur = DynamicSampling(n, seed, max_rounds=cfg.algorithm.max_sampling_rounds, **kw)
        else:
            cur = Curriculum(n, seed, **kw)
    elif cc.strategy == "difficulty_filter":
        cur = DifficultyFilter(n, seed, band=cc.pass_rate_band, max_rounds=cc.max_rounds,
                               skip_known=cc.filter_skip_known, **kw)
    elif cc.strategy == "greso":
        cur = Greso(n, seed, max_rounds=cc.max_rounds, target_zero_variance=cc.greso_target_zero_variance,
                    p_init=cc.greso_p_init, p_step=cc.greso_p_step, p_range=cc.greso_p_range, **kw)
    elif cc.strategy == "reinforce_ada":
        cur = ReinforceAda(n, seed, group_size=cfg.rollout.num_samples,
                           samples_per_round=cc.ada_samples_per_round or cfg.rollout.num_samples,
                           max_rounds=cc.max_rounds, target=cc.ada_target, **kw)
    elif cc.strategy == "difficulty_schedule":
        if task is None:
            raise ValueError("curriculum.strategy=difficulty_schedule builds its levels from the task: pass the task")
        from ..config import ConfigError

        if cfg.task.source != "reasoning_gym":
            raise ConfigError("curriculum.strategy=difficulty_schedule sets task.options per level, which only "
                              f"reasoning-gym tasks have (task.source={cfg.task.source!r})")
        # A level's own held-out set is never used (evaluation stays on the configured task), so
        # it holds out a single question: the least a reasoning-gym task can.
        levels = [(f"level{i}", _sub_task(cfg, {"options": {**cfg.task.options, **lvl}, "eval_size": 1}))
                  for i, lvl in enumerate(cc.levels)]
        pooled = PooledTask(f"{task.name}-levels", levels, eval_from=[(None, task)])
        return DifficultySchedule(pooled, seed, threshold=cc.level_threshold, window=cc.level_window, **kw)
    elif cc.strategy == "mixture":
        if task is None:
            raise ValueError("curriculum.strategy=mixture builds its tasks from the config: pass the task")
        parts = [(e.label or e.task["name"], _sub_task(cfg, e.task)) for e in cc.mixture]
        pooled = PooledTask("mixture", parts, eval_from=parts)
        return TaskMixture(pooled, seed, weights=[e.weight for e in cc.mixture], adapt=cc.mixture_adapt,
                           explore=cc.mixture_explore, ema=cc.mixture_ema, **kw)
    else:  # the config's Literal makes this unreachable
        raise ValueError(f"curriculum.strategy={cc.strategy!r} is unknown")
    cur.task = task
    return cur
