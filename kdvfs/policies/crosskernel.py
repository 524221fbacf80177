"""Cross-kernel transfer: a task that behaves like one tuned before starts from its curves.

A training step has few kinds of kernels (GEMMs, norms, elementwise, attention) repeated many
times, and kernels of a kind respond alike to clocks once time and energy are taken relative to
their own reference. So each task is first probed at the first few configs of the shared
initial design. Then:
- If earlier tasks (tuned to convergence by BO) are close, in those probes and in
  task.features, the task is a "transfer" task: its predicted curves are the similarity-weighted
  mean of the neighbours' log time / log energy curves over the whole grid, shifted to agree
  with its own measurements on average. It measures the config of least predicted energy
  among those that could be within budget, and stops when no unmeasured config could beat
  its best measured energy by more than tol ("could": within the curves' RMS error at the
  task's own measurements). If its measurements drift from the
  neighbours' curves, it falls back to BO.
- Otherwise it is tuned by BotorchPolicy (which sees all its measurements), and its final
  GP curves join the library of known tasks.
Later tasks of a known kind so need a handful of measurements instead of a full BO run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.policies._common import SafeExplorer, TaskLog, best_config, log_ratios
from kdvfs.policies.base import SearchSpace, Task
from kdvfs.policies.botorch_bo import BotorchPolicy


@dataclass(frozen=True)
class KnownTask:
    """A task tuned to convergence: its log time / log energy ratio curves over the grid."""

    key: str
    log_t: np.ndarray
    log_e: np.ndarray
    features: tuple[float, ...]


@dataclass(frozen=True)
class _Prior:
    """A transfer task's predicted log ratio curves and their RMS error at its measurements."""

    log_t: np.ndarray
    log_e: np.ndarray
    err_t: float
    err_e: float


class CrossKernelPolicy(SafeExplorer):
    """BO for tasks unlike any seen; transfer from similar converged tasks otherwise.

    probes: how many configs of the initial design every task measures before matching.
    match_rms: largest distance (RMS difference in log time and log energy ratios at the task's
    measured configs, plus task.features, see _distance) for a known task to count as similar.
    neighbours: how many similar tasks are averaged.
    bo_opts: options of the inner BotorchPolicy.
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
        probes: int = 3,
        match_rms: float = 0.03,
        neighbours: int = 3,
        **bo_opts: Any,
    ) -> None:
        super().__init__(space, seed, max_per_task=max_per_task, margin=margin, tol=tol)
        self.probes = probes
        self.match_rms = match_rms
        self.neighbours = neighbours
        self.bo = BotorchPolicy(
            space, seed, max_per_task=max_per_task, margin=margin, tol=tol, **bo_opts
        )
        self.library: list[KnownTask] = []
        self._mode: dict[str, str] = {}  # task key -> "transfer" | "bo", once probed

    def mode(self, task: Task) -> str:
        """How the task is being tuned: "probe" (not decided yet), "transfer" or "bo"."""
        return self._mode.get(task.key, "probe")

    def tell(self, task: Task, config: int, time_s: float, energy_j: float) -> None:
        super().tell(task, config, time_s, energy_j)
        self.bo.tell(task, config, time_s, energy_j)

    def _choose(self, task: Task, log: TaskLog) -> int | None:
        if self.mode(task) == "probe":
            config = self.facts.next_design(log, task, self.probes)
            if config is not None:
                return config
            self._mode[task.key] = "transfer" if self._prior(task, log) is not None else "bo"
        return self._pick(task, log)

    def _pick(self, task: Task, log: TaskLog) -> int | None:
        if self.mode(task) == "transfer":
            prior = self._prior(task, log)
            if prior is not None:
                return self._transfer_pick(task, log, prior)
            self._mode[task.key] = "bo"
        config = self.bo.ask(task)
        if config is None:
            self._learn(task)
        return config

    def _transfer_pick(self, task: Task, log: TaskLog, prior: _Prior) -> int | None:
        """The unmeasured config of least predicted energy that could be within budget, if it
        could beat the best measured energy by more than tol. "Could": the predictions are
        trusted to within their RMS error at this task's measured configs."""
        open_ = ~log.measured & ~self.facts.known_infeasible(log, task)
        lower_t, upper_t = self.facts.log_time_bounds(log, task)
        log_t = np.clip(prior.log_t, lower_t, upper_t) - prior.err_t
        within = open_ & (log_t <= np.log1p(task.budget))
        if not within.any():
            return None
        config = int(np.argmin(np.where(within, prior.log_e, np.inf)))
        target_e = self.incumbent_log_energy(log, task) + np.log1p(-self.tol)
        if prior.log_e[config] - prior.err_e >= target_e:
            return None
        return config

    def _prior(self, task: Task, log: TaskLog) -> _Prior | None:
        """Predicted curves from similar known tasks, None if none is similar."""
        idx, y_t, y_e = log_ratios(log, task)
        if self.space.reference is not None:  # its ratios are 0 for every task: no information
            keep = idx != self.space.reference
            idx, y_t, y_e = idx[keep], y_t[keep], y_e[keep]
        if idx.size == 0 or not self.library:
            return None
        dist = np.array([self._distance(task, known, idx, y_t, y_e) for known in self.library])
        near = np.argsort(dist)[: self.neighbours]
        near = near[dist[near] <= self.match_rms]
        if near.size == 0:
            return None
        weight = 1.0 / (dist[near] + 0.1 * self.match_rms)
        weight /= weight.sum()
        log_t = sum(w * self.library[i].log_t for w, i in zip(weight, near))
        log_e = sum(w * self.library[i].log_e for w, i in zip(weight, near))
        log_t = log_t + np.mean(y_t - log_t[idx])
        log_e = log_e + np.mean(y_e - log_e[idx])
        return _Prior(log_t, log_e, _rms(y_t - log_t[idx]), _rms(y_e - log_e[idx]))

    def _distance(
        self, task: Task, known: KnownTask, idx: np.ndarray, y_t: np.ndarray, y_e: np.ndarray
    ) -> float:
        """RMS log-ratio difference at the measured configs, plus the feature difference.

        Each feature is compared relative to its larger magnitude; a feature that differs by
        its whole size adds as much as a log-ratio difference of match_rms.
        """
        sq = np.mean((y_t - known.log_t[idx]) ** 2 + (y_e - known.log_e[idx]) ** 2)
        if task.features and len(task.features) == len(known.features):
            mine, theirs = np.array(task.features), np.array(known.features)
            size = np.maximum(np.maximum(np.abs(mine), np.abs(theirs)), 1e-12)
            rel = np.abs(mine - theirs) / size
            sq += self.match_rms**2 * np.mean(rel**2)
        return float(np.sqrt(sq))

    def _learn(self, task: Task) -> None:
        """Add a task BO has finished (converged or capped) to the library: once, and only if
        it found a feasible config, so that its curves mean something."""
        known = any(k.key == task.key for k in self.library)
        if known or best_config(self.log(task), task) is None:
            return
        log_t, log_e = self.bo.curves(task)
        self.library.append(KnownTask(task.key, log_t, log_e, tuple(task.features)))


def _rms(residual: np.ndarray) -> float:
    return float(np.sqrt(np.mean(residual**2)))
