"""Constrained discrete bandits over the config set: UCB and Thompson sampling.

Both hold Gaussian beliefs about every config's log time and log energy (BeliefModel: a
smoothing prior across neighbouring clocks), explore only safe configs (safe_candidates), and
never re-measure a config: a measurement per config is enough once noise is in the beliefs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import ndtr

from kdvfs.policies._common import SafeExplorer, TaskLog
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
    """Optimism on energy, pessimism on time.

    Among safe configs that could be within budget (time mean - beta sd <= budget), measure
    the one of least lower confidence bound on energy (mean - beta sd). Converged when even
    that bound does not beat the best measured energy by more than tol.
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
        lcb = np.where(cand, b.mean_e - self.beta * b.sd_e, np.inf)
        config = int(np.argmin(lcb))
        if lcb[config] >= self.incumbent_log_energy(log, task) + np.log1p(-self.tol):
            return None
        return config


class ThompsonPolicy(_GaussianBandit):
    """Thompson sampling with a time constraint.

    Draws log time and log energy for every safe config from its Gaussian belief and
    measures the least drawn energy among configs drawn within budget. Converged when no
    safe config has probability >= stop_prob of being within budget and beating the best
    measured energy by more than tol.
    """

    name = "thompson"

    def __init__(
        self, space: SearchSpace, seed: int, *, stop_prob: float = 0.05, **opts: Any
    ) -> None:
        super().__init__(space, seed, **opts)
        self.stop_prob = stop_prob

    def _pick(self, task: Task, log: TaskLog) -> int | None:
        b = self.model.posterior(log, task)
        cand = safe_candidates(self.facts, log, task, b, self.kappa, self.margin)
        limit_t = np.log1p(task.budget)
        target_e = self.incumbent_log_energy(log, task) + np.log1p(-self.tol)
        p_useful = ndtr((limit_t - b.mean_t) / b.sd_t) * ndtr((target_e - b.mean_e) / b.sd_e)
        if not (cand & (p_useful >= self.stop_prob)).any():
            return None
        rng = self.rng(task)
        draw_t = b.mean_t + b.sd_t * rng.standard_normal(b.mean_t.shape)
        draw_e = b.mean_e + b.sd_e * rng.standard_normal(b.mean_e.shape)
        pool = cand & (draw_t <= limit_t)
        if not pool.any():
            pool = cand
        return int(np.argmin(np.where(pool, draw_e, np.inf)))
