"""Constrained discrete bandits over the config set: UCB (`UcbStrategy`) and Thompson sampling
(`ThompsonStrategy`), sharing their constructor through `_GaussianBandit`.

Both hold Gaussian beliefs about every config's log time and log energy (beliefs.BeliefModel),
explore only safe configs (beliefs.safe_candidates), never re-measure a config, and judge
cost at every exchange rate of the policy (_common.log_cost). How each picks and when it
stops: docs/design-policies.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kdvfs.policies._common import SafeExplorer, TaskLog, incumbents, log_cost
from kdvfs.policies.base import SearchSpace, Task
from kdvfs.policies.beliefs import BeliefModel, safe_candidates


class _GaussianBandit(SafeExplorer):
    """Shared constructor: beliefs, safety kappa, margin and tolerance.

    Args:
        space, seed, max_per_task, margin, tol: as SafeExplorer.
        kappa: pessimism of the safety check, in standard deviations of the believed time.
    """

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


class UcbStrategy(_GaussianBandit):
    """Optimism on cost, pessimism on safety.

    Among safe configs that could be within budget (time mean - beta sd <= budget), measure
    the one whose lower confidence bound on cost (time and energy at mean - beta sd) beats
    the incumbent by the most, at any rate. Converged when no bound beats it by more than tol.

    Args:
        space, seed: as BaseStrategy.
        beta: optimism, in standard deviations of the beliefs.
        **opts: max_per_task, kappa, margin, tol (see _GaussianBandit).
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


class ThompsonStrategy(_GaussianBandit):
    """Thompson sampling with a time constraint.

    Draws log time and log energy for every safe config from its Gaussian belief and
    measures the config whose drawn cost beats the incumbent by the most at any rate, among
    configs drawn within budget. Converged when no safe config has probability >= stop_prob
    (estimated from `draws` joint draws) of being within budget and beating the incumbent by
    more than tol at some rate.

    Args:
        space, seed: as BaseStrategy.
        stop_prob: probability (0..1) below which a config is no longer worth measuring.
        draws: joint draws per ask that estimate that probability.
        **opts: max_per_task, kappa, margin, tol (see _GaussianBandit).
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
