"""Gaussian beliefs about every config of a task, for the bandit strategies.

- `BeliefModel.posterior`: a fixed-hyperparameter GP posterior of log time and log energy
  relative to the reference at every config (`Beliefs`), the time mean clipped into the
  monotone bounds the measurements imply (GridFacts);
- `safe_candidates`: the unmeasured configs worth and safe to try.

Nothing is fitted, so one update costs well under a millisecond. Why a smoothing prior:
docs/design-policies.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdvfs.policies._common import GridFacts, TaskLog, log_ratios, safe_log_limit
from kdvfs.policies.base import Task


@dataclass(frozen=True)
class Beliefs:
    """Posterior mean and standard deviation per config of log time and log energy ratios.

    Attributes:
        mean_t, sd_t: of log(time / reference time), per config.
        mean_e, sd_e: of log(energy / reference energy), per config.
        upper_t: physical upper bound on log time (GridFacts.log_time_bounds).
    """

    mean_t: np.ndarray
    sd_t: np.ndarray
    mean_e: np.ndarray
    sd_e: np.ndarray
    upper_t: np.ndarray


@dataclass(frozen=True)
class BeliefModel:
    """Fixed-hyperparameter Gaussian beliefs over a grid (docs/design-policies.md).

    Attributes:
        facts: the grid's monotone-time facts (bounds on the time mean).
        lengthscale: of the squared-exponential kernel, in unit-scaled clock coordinates.
        prior_sd_t, prior_sd_e: spread of log time / log energy ratios across a grid before
            any measurement, natural log units.
        noise_sd_t, noise_sd_e: measurement noise of one launch mean, same units.
    """

    facts: GridFacts
    lengthscale: float = 0.3
    prior_sd_t: float = 0.3
    prior_sd_e: float = 0.3
    noise_sd_t: float = 0.01
    noise_sd_e: float = 0.03

    def posterior(self, log: TaskLog, task: Task) -> Beliefs:
        idx, y_t, y_e = log_ratios(log, task)
        mean_t, sd_t = self._gp(idx, y_t, log.count[idx], self.prior_sd_t, self.noise_sd_t)
        mean_e, sd_e = self._gp(idx, y_e, log.count[idx], self.prior_sd_e, self.noise_sd_e)
        lower_t, upper_t = self.facts.log_time_bounds(log, task)
        return Beliefs(np.clip(mean_t, lower_t, upper_t), sd_t, mean_e, sd_e, upper_t)

    def _gp(
        self, idx: np.ndarray, y: np.ndarray, count: np.ndarray, prior_sd: float, noise_sd: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """GP posterior mean and sd at every config given mean observations y at idx."""
        unit = self.facts.unit
        n = unit.shape[0]
        if idx.size == 0:
            return np.zeros(n), np.full(n, prior_sd)
        sq = ((unit[:, None, :] - unit[None, idx, :]) ** 2).sum(axis=2)
        k_all = prior_sd**2 * np.exp(-0.5 * sq / self.lengthscale**2)
        k_obs = k_all[idx] + np.diag(noise_sd**2 / count)
        chol = np.linalg.cholesky(k_obs)
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
        v = np.linalg.solve(chol, k_all.T)
        var = np.maximum(prior_sd**2 - (v**2).sum(axis=0), 1e-12)
        return k_all @ alpha, np.sqrt(var)


def safe_candidates(
    facts: GridFacts, log: TaskLog, task: Task, beliefs: Beliefs, kappa: float, margin: float
) -> np.ndarray:
    """Unmeasured configs that are worth and safe to try.

    Excluded: configs known over budget by monotonicity, and configs whose pessimistic time
    (mean + kappa sd, but never above the physical upper bound) exceeds the wide safety limit
    (1 + 3 budget + margin) x reference.
    """
    pessimistic_t = np.minimum(beliefs.mean_t + kappa * beliefs.sd_t, beliefs.upper_t)
    return (
        ~log.measured & ~facts.known_infeasible(log, task) & (pessimistic_t <= safe_log_limit(task, margin))
    )
