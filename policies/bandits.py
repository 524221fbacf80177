"""Constrained discrete bandits over the config set: UCB and Thompson sampling.

Both hold Gaussian beliefs about every config's log time and log energy (BeliefModel: a
smoothing prior across neighbouring clocks), explore only safe configs (safe_candidates), and
never re-measure a config: a measurement per config is enough once noise is in the beliefs.
Costs are judged at every exchange rate of the policy (_common: energy + rate x time); a
config is worth measuring when it could beat the incumbent at some rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kdvfs.policies._common import SafeExplorer, TaskLog, incumbents, log_cost
from kdvfs.policies.base import SearchSpace, Task
from kdvfs.policies.beliefs import BeliefModel, safe_candidates


class _GaussianBandit(SafeExplorer):
    """Shared constructor: beliefs, safety kappa, margin and tolerance."""

    def __init__(
        self,
        space: SearchSpace,
        seed: int,
        *,
        max_per_task: int | None = None,
        kappa: float = 1.0,
        margin: float = 0.1,
        tol: float = 0.002,
    ) -> None:
        super().__init__(space, seed, max_per_task=max_per_task, margin=margin, tol=tol)
        self.kappa = kappa
        self.model = BeliefModel(self.facts)


class UcbPolicy(_GaussianBandit):
    """Optimism on cost, pessimism on safety.

    Among safe configs that could be within budget (time mean - beta sd <= budget), measure
    the one whose lower confidence bound on cost (time and energy at mean - beta sd) beats
    the incumbent by the most, at any rate. Converged when no bound beats it by more than tol.
    """

    name = "ucb"

    def __init__(self, space: SearchSpace, seed: int, *, beta: float = 2.0, **opts: Any) -> None:
        super().__init__(space, seed, **opts)
        self.beta = beta

    def _pick(self, task: Task, log: TaskLog) -> int | None:
        b = self.model.posterior(log, task)
        cand = safe_candidates(self.facts, log, task, b, self.kappa, self.margin)
        cand &= b.mean_t - self.beta * b.sd_t <= np.log1p(task.budget)
        if not cand.any():
            return None
        relative_rates = self.relative_rates(task)
        lcb = log_cost(b.mean_t - self.beta * b.sd_t, b.mean_e - self.beta * b.sd_e, relative_rates[:, None])
        gain = np.where(cand, incumbents(log, task, relative_rates)[:, None] - lcb, -np.inf)
        rate, config = np.unravel_index(int(np.argmax(gain)), gain.shape)
        if gain[rate, config] <= -np.log1p(-self.tol):
            return None
        return int(config)


class ThompsonPolicy(_GaussianBandit):
    """Thompson sampling with a time constraint.

    Draws log time and log energy for every safe config from its Gaussian belief and
    measures the config whose drawn cost beats the incumbent by the most at any rate, among
    configs drawn within budget. Converged when no safe config has probability >= stop_prob
    (estimated from `draws` joint draws) of being within budget and beating the incumbent by
    more than tol at some rate.
    """

    name = "thompson"

    def __init__(
        self, space: SearchSpace, seed: int, *, stop_prob: float = 0.05, draws: int = 256, **opts: Any
    ) -> None:
        super().__init__(space, seed, **opts)
        self.stop_prob = stop_prob
        self.draws = draws

    def _pick(self, task: Task, log: TaskLog) -> int | None:
        b = self.model.posterior(log, task)
        cand = safe_candidates(self.facts, log, task, b, self.kappa, self.margin)
        limit_t = np.log1p(task.budget)
        relative_rates = self.relative_rates(task)
        target = incumbents(log, task, relative_rates)[:, None, None] + np.log1p(-self.tol)
        rng = self.rng(task)
        draw_t = b.mean_t + b.sd_t * rng.standard_normal((self.draws, b.mean_t.size))
        draw_e = b.mean_e + b.sd_e * rng.standard_normal((self.draws, b.mean_e.size))
        cost = log_cost(draw_t, draw_e, relative_rates[:, None, None])  # rate x draw x config
        useful = (draw_t <= limit_t) & (cost < target)
        if not (cand & (useful.mean(axis=1) >= self.stop_prob).any(axis=0)).any():
            return None
        pool = cand & (draw_t[0] <= limit_t)
        if not pool.any():
            pool = cand
        gain = np.where(pool, target[:, 0, :] - cost[:, 0, :], -np.inf)
        return int(np.unravel_index(int(np.argmax(gain)), gain.shape)[1])
