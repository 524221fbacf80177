"""Epsilon-greedy over the config set, with a time constraint and safe exploration."""

from __future__ import annotations

import numpy as np

from kdvfs.policies._common import SafeExplorer, TaskLog, incumbents, log_cost, steps_since_improvement
from kdvfs.policies.base import SearchSpace, Task
from kdvfs.policies.beliefs import BeliefModel, safe_candidates


class EpsilonGreedyStrategy(SafeExplorer):
    """With probability epsilon a random safe config, else, among safe configs believed within
    budget, the one whose believed cost beats the incumbent by the most at any rate (beliefs:
    BeliefModel; cost: _common.log_cost).

    Converged after `patience` measurements in a row that did not lower the best cost at any
    rate by more than tol, or when no safe config is left. Never re-measures a config.

    Args:
        space, seed, max_per_task, margin, tol: as SafeExplorer.
        epsilon: probability (0..1) of a random safe config.
        patience: measurements without improvement before the task is converged.
        kappa: pessimism of the safety check, in standard deviations of the believed time.
    """

    name = "egreedy"

    def __init__(
        self,
        space: SearchSpace,
        seed: int,
        *,
        max_per_task: int | None = None,
        epsilon: float = 0.1,
        patience: int = 5,
        kappa: float = 1.0,
        margin: float = 0.1,
        tol: float = 0.002,
    ) -> None:
        super().__init__(space, seed, max_per_task=max_per_task, margin=margin, tol=tol)
        self.epsilon = epsilon
        self.patience = patience
        self.kappa = kappa
        self.model = BeliefModel(self.facts)

    def _pick(self, task: Task, log: TaskLog) -> int | None:
        relative_rates = self.relative_rates(task)
        if steps_since_improvement(log, task, self.tol, relative_rates) >= self.patience:
            return None
        beliefs = self.model.posterior(log, task)
        safe = safe_candidates(self.facts, log, task, beliefs, self.kappa, self.margin)
        if not safe.any():
            return None
        rng = self.rng(task)
        if rng.random() < self.epsilon:
            return int(rng.choice(np.flatnonzero(safe)))
        within = safe & (beliefs.mean_t <= np.log1p(task.budget))
        pool = within if within.any() else safe
        cost = log_cost(beliefs.mean_t, beliefs.mean_e, relative_rates[:, None])
        gain = np.where(pool, incumbents(log, task, relative_rates)[:, None] - cost, -np.inf)
        return int(np.unravel_index(int(np.argmax(gain)), gain.shape)[1])
