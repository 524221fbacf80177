"""A learning agent as a search strategy: a trained MaskablePPO model (sb3-contrib, over
stable-baselines3) picks a task's next clock pair from what the task has measured so far.

- `search_observation`, `observation_space`: the agent's view of one task's search, numbers
  only: per config, whether it was measured, its time against the task's limit and its energy
  against the reference. The same view whether the task is a kernel (`kdvfs compare`'s
  isolated replay) or a group of a training step (envs/trial_env.py, where it is trained).
- `search_mask`: the configs it may pick: unmeasured, and not known or bounded too slow.
- `task_log`: a task's empty log as every strategy starts it (the reference seeded).
- `AgentStrategy` ("ppo"): ask = the model's greedy action on that view, masked; converged
  after PATIENCE measurements that improved nothing.
- `train_agent`, `load_agent`: train one through a Gymnasium env that shows this view and has
  `action_masks()` (kdvfs/TrialDVFS-v0), or load a saved one.

stable-baselines3 and sb3-contrib load on first use (they pull in torch). Why the agent is
built so: docs/agent-strategy.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from kdvfs.policies._common import (
    BaseStrategy,
    GridFacts,
    TaskLog,
    safe_log_limit,
    steps_since_improvement,
)
from kdvfs.policies.base import SearchSpace, Task

#: Features per config in the observation: measured, time against the limit, energy; count.
FEATURES = 3
#: Largest magnitude of an observation's feature (they are clipped to it); no unit.
CLIP = 5.0
#: Scale of the energy feature: log(energy / reference energy) times this; no unit.
ENERGY_SCALE = 10.0
#: Measurements in a row that improved nothing before the agent calls a task converged; count.
PATIENCE = 3
#: Slack above the budget's time within which the agent may still try a config; a fraction.
MARGIN = 0.1
#: PPO's rollout length per update (steps) and minibatch size (samples); small, for short training.
N_STEPS = 64
BATCH_SIZE = 32


def observation_space(n_configs: int) -> spaces.Box:
    """The Box of `search_observation` for a grid of n_configs."""
    return spaces.Box(-CLIP, CLIP, (FEATURES * n_configs,), np.float32)


def search_observation(task: Task, log: TaskLog) -> np.ndarray:
    """Per config (flattened, config-major): 1 if measured else 0; log(time / reference time)
    in units of log(1 + budget) (1: at the limit); log(energy / reference energy) x
    ENERGY_SCALE. Unmeasured configs are zeros; everything clipped to +-CLIP."""
    measured = log.measured
    with np.errstate(invalid="ignore", divide="ignore"):
        log_t = np.log(log.mean_time_s / task.ref_time_s) / np.log1p(max(task.budget, 1e-3))
        log_e = np.log(log.mean_energy_j / task.ref_energy_j) * ENERGY_SCALE
    obs = np.column_stack(
        [measured.astype(float), np.where(measured, log_t, 0.0), np.where(measured, log_e, 0.0)]
    )
    return np.clip(np.nan_to_num(obs, nan=0.0), -CLIP, CLIP).astype(np.float32).ravel()


def search_mask(facts: GridFacts, task: Task, log: TaskLog) -> np.ndarray:
    """The configs the agent may pick: unmeasured, not known over budget (no faster than a
    measured config that is), and whose lower time bound is below (1 + 3 budget + MARGIN)."""
    lower, _ = facts.log_time_bounds(log, task)
    return ~log.measured & ~facts.known_infeasible(log, task) & (lower <= safe_log_limit(task, MARGIN))


def task_log(space: SearchSpace, task: Task) -> TaskLog:
    """A task's log as BaseStrategy starts it: the reference config seeded where it is a grid pair."""
    log = TaskLog.empty(len(space))
    reference = task.reference_in(space)
    if reference is not None:
        log.add(reference, task.ref_time_s, task.ref_energy_j)
        log.order.clear()
    return log


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread meanwhile: the agent's network is tiny, and torch's default thread
    pool made training 4x slower on a busy 2-core machine (20 s against 5.5 s for 200 steps)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def load_agent(path: str | Path):
    """A MaskablePPO model saved by `model.save(path)`."""
    from sb3_contrib import MaskablePPO

    return MaskablePPO.load(str(path), device="cpu")


def train_agent(env, steps: int, *, seed: int = 0):
    """A MaskablePPO model ("MlpPolicy", on CPU) trained `steps` env steps through `env` (a
    Gymnasium env with this module's observation and `action_masks()`)."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.logger import Logger

    with one_thread():
        model = MaskablePPO(
            "MlpPolicy",
            env,
            n_steps=min(N_STEPS, steps),
            batch_size=min(BATCH_SIZE, steps),
            seed=seed,
            device="cpu",
            verbose=0,
        )
        model.set_logger(Logger(folder=None, output_formats=[]))  # no SB3-* log folder in the temp dir
        return model.learn(total_timesteps=steps)


class AgentStrategy(BaseStrategy):
    """A trained agent as a strategy: each ask is the model's greedy (deterministic) action on
    `search_observation` of the task, among `search_mask`'s configs.

    Args:
        space, seed, max_per_task: as BaseStrategy (the agent acts greedily: the seed changes nothing).
        model: a MaskablePPO model (`train_agent`) or the path of a saved one; its action space
            must be Discrete(len(space)).
        tol: relative cost improvement (fraction) below which a measurement counts as none.
    """

    name = "ppo"

    def __init__(
        self,
        space: SearchSpace,
        seed: int,
        *,
        model: Any = None,
        max_per_task: int | None = None,
        tol: float = 0.002,
        **_: Any,
    ) -> None:
        super().__init__(space, seed, max_per_task=max_per_task)
        if model is None:
            raise ValueError("the ppo strategy needs a trained agent (model=...): see docs/agent-strategy.md")
        self.model = load_agent(model) if isinstance(model, str | Path) else model
        n = getattr(self.model.action_space, "n", None)
        if n != len(space):
            raise ValueError(f"the agent was trained on {n} clock pairs, this grid has {len(space)}")
        self.facts = GridFacts(space)
        self.tol = tol

    def _choose(self, task: Task, log: TaskLog) -> int | None:
        rates = self.relative_rates(task)
        if log.order and steps_since_improvement(log, task, self.tol, rates) >= PATIENCE:
            return None
        mask = search_mask(self.facts, task, log)
        if not mask.any():
            return None
        with one_thread():
            action, _ = self.model.predict(
                search_observation(task, log), action_masks=mask, deterministic=True
            )
        return int(action)
