"""Cross-kernel transfer: kernels of a kind share their relative curves.

A kind is founded by a task BO tuned (BotorchStrategy) and grows as tasks join it; a task of
a known kind is predicted from what every member measured and needs one to a few
measurements instead of a full BO run. A task no kind explains is tuned by BO.

- `CrossKernelStrategy`: `_pick` (transfer or BO), `_kind_weights` (which kind a task is of),
  `_posterior` / `kind_model` (the kind's prediction for a task), `_transfer_pick` and
  `_expected_improvement` (what to measure), `_found` (a BO task founds a kind);
- the model's fixed hyperparameters: `NOISE_SD`, `OFFSET_SD`, `KIND_SD`, `LENGTHSCALE`,
  `GATE_P`, `FEATURE_SCALE`.

The model of a kind and how a task's kind is decided: docs/design-policies.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import chi2, norm

from kdvfs.policies._common import SafeExplorer, TaskLog, best_config, log_cost, log_ratios, safe_log_limit
from kdvfs.policies.base import SearchSpace, Task
from kdvfs.policies.botorch_bo import BotorchStrategy, Curves

NOISE_SD = (0.008, 0.03)
"""S.d. of one measurement's (log time, log energy) ratio, natural log units (time ~0.5 %,
energy 1-3 %; a throttled pair's ratio to its paired stock measurement has both noises)."""
OFFSET_SD = (0.01, 0.03)
"""S.d. of a member's level against its kind's (log time, log energy), natural log units."""
KIND_SD = (0.05, 0.1)
"""S.d. of how far a kind's curves may be from its founder's (log time, log energy)."""
LENGTHSCALE = 0.3
"""Length scale of that difference, in unit-scaled clock coordinates (as beliefs.BeliefModel)."""
GATE_P = 1e-3
"""Probability below which measurements reject a kind (chi-square test)."""
FEATURE_SCALE = 0.25
"""Relative RMS feature distance (dimensionless) at which a kind's prior weight falls by e^-1/2."""


@dataclass(frozen=True)
class _Prediction:
    """A task's predicted log ratio curves under a kind, with their posterior covariances."""

    log_t: np.ndarray
    cov_t: np.ndarray
    log_e: np.ndarray
    cov_e: np.ndarray


class CrossKernelStrategy(SafeExplorer):
    """BO for tasks of no known kind; transfer within the task's kind otherwise.

    `kinds` holds, per kind, its member tasks (founder first).

    Args:
        space, seed, max_per_task, margin, tol: as SafeExplorer.
        kappa: pessimism of the safety check on a prediction, in standard deviations.
        **bo_opts: options of the inner BotorchStrategy (refit_every, ...), which is told
            everything this policy is told.
    """

    name = "crosskernel"

    def __init__(
        self,
        space: SearchSpace,
        seed: int,
        *,
        max_per_task: int | None = None,
        margin: float = 0.1,
        tol: float = 0.002,
        kappa: float = 1.0,
        **bo_opts: Any,
    ) -> None:
        super().__init__(space, seed, max_per_task=max_per_task, margin=margin, tol=tol)
        self.kappa = kappa
        self.bo = BotorchStrategy(space, seed, max_per_task=max_per_task, margin=margin, tol=tol, **bo_opts)
        self.kinds: list[list[Task]] = []
        self._founder_curves: list[Curves] = []
        self._kind: dict[str, int | None] = {}  # task key -> kind index; None: tuned by BO
        unit = self.facts.unit
        self._corr = np.exp(-0.5 * ((unit[:, None, :] - unit[None, :, :]) ** 2).sum(axis=2) / LENGTHSCALE**2)

    def mode(self, task: Task) -> str:
        """How the task is being tuned: "new" (not asked yet), "transfer" or "bo"."""
        if task.key not in self._kind:
            return "new"
        return "bo" if self._kind[task.key] is None else "transfer"

    def tell(self, task: Task, config: int, time_s: float, energy_j: float) -> None:
        super().tell(task, config, time_s, energy_j)
        self.bo.tell(task, config, time_s, energy_j)

    def _choose(self, task: Task, log: TaskLog) -> int | None:
        """No initial design of its own: the kind's prediction decides, or BO (with its design)."""
        return self._pick(task, log)

    def _pick(self, task: Task, log: TaskLog) -> int | None:
        if self.mode(task) != "bo":
            weights = self._kind_weights(task, log)
            self._join(task, max(weights, key=weights.get) if weights else None)
            if weights:
                return self._transfer_pick(task, log, weights)
        self.bo.exchange_rates_w, self.bo.tol = self.exchange_rates_w, self.tol
        config = self.bo.ask(task)
        if config is None:
            self._found(task)
        return config

    def _kind_weights(self, task: Task, log: TaskLog) -> dict[int, float]:
        """Posterior probability of each kind the task may be of: a prior from features
        (FEATURE_SCALE of relative RMS distance to a kind's nearest member; uniform without
        features) times the likelihood of the task's measurements; kinds the chi-square test
        rejects are out. Empty: no kind explains the task (BO from now on)."""
        log_w = {}
        for k in range(len(self.kinds)):
            ll = self._log_likelihood(k, task, log)
            if ll > -np.inf:
                log_w[k] = ll - 0.5 * (self._feature_distance(task, k) / FEATURE_SCALE) ** 2
        if not log_w:
            return {}
        top = max(log_w.values())
        w = {k: float(np.exp(v - top)) for k, v in log_w.items()}
        total = sum(w.values())
        return {k: v / total for k, v in w.items()}

    def _join(self, task: Task, kind: int | None) -> None:
        """Make the task a member of `kind` only (None: of none, BO tunes it)."""
        old = self._kind.get(task.key)
        if old is not None and old != kind:
            self.kinds[old] = [m for m in self.kinds[old] if m.key != task.key]
        if kind is not None and old != kind:
            self.kinds[kind].append(task)
        self._kind[task.key] = kind

    def _feature_distance(self, task: Task, kind: int) -> float:
        """Relative RMS feature distance to the kind's nearest member (0 without features)."""
        best = np.inf
        for member in self.kinds[kind]:
            if member.key != task.key and task.features and len(member.features) == len(task.features):
                mine, theirs = np.array(task.features), np.array(member.features)
                size = np.maximum(np.maximum(np.abs(mine), np.abs(theirs)), 1e-12)
                best = min(best, float(np.sqrt(np.mean(((mine - theirs) / size) ** 2))))
        return 0.0 if best == np.inf else best

    def _own_data(self, task: Task, log: TaskLog) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The task's measured configs and log ratios, without a grid reference (its ratios are
        0 for every task: they tell nothing about the kind)."""
        idx, y_t, y_e = log_ratios(log, task)
        keep = idx != task.reference_in(self.space)
        return idx[keep], y_t[keep], y_e[keep]

    def _log_likelihood(self, kind: int, task: Task, log: TaskLog) -> float:
        """Log density of the task's measurements under the kind given its other members;
        -inf when the chi-square test at GATE_P rejects the kind."""
        idx, y_t, y_e = self._own_data(task, log)
        if idx.size == 0:
            return 0.0
        total, d2 = 0.0, 0.0
        for out, y in ((0, y_t), (1, y_e)):
            mean, cov = self._posterior(kind, task, out, idx, own_data=False)
            chol = np.linalg.cholesky(cov + NOISE_SD[out] ** 2 * np.eye(idx.size))
            z = np.linalg.solve(chol, y - mean)
            d2 += float(z @ z)
            total += -0.5 * float(z @ z) - float(np.log(np.diag(chol)).sum())
        return total if d2 <= chi2.ppf(1.0 - GATE_P, 2 * idx.size) else -np.inf

    def _posterior(
        self, kind: int, task: Task, out: int, at: np.ndarray, own_data: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and covariance of the task's curve (output 0: log time, 1: log
        energy) at configs `at`, given the kind's members' measurements (the task's own only
        if own_data): kind curve + the task's offset (docs/design-policies.md)."""
        members = [m for m in self.kinds[kind] if m.key != task.key] + ([task] if own_data else [])
        me = len(members) - 1 if own_data else -1
        data = [(i, *self._own_data(m, self.log(m))) for i, m in enumerate(members)]
        x = np.concatenate([d[1] for d in data]) if data else np.zeros(0, dtype=int)
        who = np.concatenate([np.full(d[1].size, d[0]) for d in data]) if data else np.zeros(0, dtype=int)
        y = np.concatenate([d[2 + out] for d in data]) if data else np.zeros(0)

        curves = self._founder_curves[kind]
        founder, founder_sd = (curves.log_t, curves.sd_t) if out == 0 else (curves.log_e, curves.sd_e)

        def cov(xa: np.ndarray, wa: np.ndarray, xb: np.ndarray, wb: np.ndarray) -> np.ndarray:
            shared = KIND_SD[out] ** 2 + founder_sd[xa][:, None] * founder_sd[xb][None, :]
            return shared * self._corr[np.ix_(xa, xb)] + OFFSET_SD[out] ** 2 * (wa[:, None] == wb[None, :])

        mine = np.full(at.size, me)
        prior = cov(at, mine, at, mine)
        if x.size == 0:
            return founder[at], prior
        chol = np.linalg.cholesky(cov(x, who, x, who) + NOISE_SD[out] ** 2 * np.eye(x.size))
        v = np.linalg.solve(chol, cov(x, who, at, mine))
        return founder[at] + v.T @ np.linalg.solve(chol, y - founder[x]), prior - v.T @ v

    def kind_model(self, kind: int, task: Task) -> _Prediction:
        """The task's curves at every config under the kind, given every member's
        measurements (the task's own included)."""
        every = np.arange(len(self.space))
        log_t, cov_t = self._posterior(kind, task, 0, every, own_data=True)
        log_e, cov_e = self._posterior(kind, task, 1, every, own_data=True)
        return _Prediction(log_t, cov_t, log_e, cov_e)

    def _transfer_pick(self, task: Task, log: TaskLog, weights: dict[int, float]) -> int | None:
        """The config of largest expected improvement on the incumbent's cost at any rate,
        averaged over the kinds the task may be of (their weights), if that exceeds tol."""
        ei = sum(
            w * self._expected_improvement(task, log, self.kind_model(k, task)) for k, w in weights.items()
        )
        rate, config = np.unravel_index(int(np.argmax(ei)), ei.shape)
        return int(config) if ei[rate, config] > self.tol else None

    def _expected_improvement(self, task: Task, log: TaskLog, pred: _Prediction) -> np.ndarray:
        """Per rate and config, the expected improvement on the incumbent's cost under one
        kind's prediction: the incumbent's predicted cost less the config's (the stock
        reference's 0 when no measured config beats it; a common offset cancels), Gaussian to
        first order. 0 for measured configs, those known too slow, or predicted over budget or
        unsafe."""
        lower_t, upper_t = self.facts.log_time_bounds(log, task)
        mean_t = np.clip(pred.log_t, lower_t, upper_t)
        var_t, var_e = np.diag(pred.cov_t), np.diag(pred.cov_e)
        safe = np.minimum(mean_t + self.kappa * np.sqrt(var_t), upper_t) <= safe_log_limit(task, self.margin)
        open_ = ~log.measured & ~self.facts.known_infeasible(log, task) & safe
        open_ &= mean_t <= np.log1p(task.budget)
        ei = np.zeros((len(self.exchange_rates_w), open_.size))
        for r, relative_rate in enumerate(self.relative_rates(task)):
            cost = log_cost(mean_t, pred.log_e, relative_rate)
            # d cost / d log time and d log energy: the shares of rate x time and of energy
            share_t = (
                np.exp(
                    np.log(relative_rate) + mean_t - np.logaddexp(pred.log_e, np.log(relative_rate) + mean_t)
                )
                if relative_rate > 0
                else np.zeros(cost.size)
            )
            share_e = 1.0 - share_t
            var = share_t**2 * var_t + share_e**2 * var_e
            b = best_config(log, task, float(relative_rate))
            if b is None or cost[b] >= 0.0:
                gain = -cost
            else:
                gain = cost[b] - cost
                var += share_t[b] ** 2 * var_t[b] + share_e[b] ** 2 * var_e[b]
                var -= 2.0 * (
                    share_t * share_t[b] * pred.cov_t[:, b] + share_e * share_e[b] * pred.cov_e[:, b]
                )
            sd = np.sqrt(np.maximum(var, 1e-12))
            ei[r] = np.where(open_, gain * norm.cdf(gain / sd) + sd * norm.pdf(gain / sd), 0.0)
        return ei

    def _found(self, task: Task) -> None:
        """A task BO has finished (converged or capped) founds a kind: once, and only if it
        found a config within budget, so that its measurements mean something."""
        if any(m.key == task.key for members in self.kinds for m in members):
            return
        if best_config(self.log(task), task) is None:
            return
        self.kinds.append([task])
        self._founder_curves.append(self.bo.curves(task))
