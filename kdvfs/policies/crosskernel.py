"""Cross-kernel transfer: a task that behaves like one tuned before starts from its curves.

A training step has few kinds of kernels (GEMMs, norms, elementwise, attention) repeated many
times, and kernels of a kind respond alike to clocks once time and energy are taken relative to
their own reference. The policy keeps a library of tasks BO has tuned: their log time / log
energy ratio curves over the whole grid (BotorchPolicy.curves).

A new task is similar to a known one when its task.features are close (relative RMS
difference <= feature_rms) and its measurements so far agree with the known curves (RMS log
ratio difference <= match_rms); a gate without data (no features, nothing measured yet)
passes, but at least one must have data. Tasks with features go straight to matching; tasks
without are first probed at the first configs of the shared initial design. Then:
- "transfer" when similar tasks exist: the predicted curves are the similarity-weighted mean
  of theirs, shifted to agree with the task's own measurements on average. It measures the
  config of least predicted energy among those that could be within budget, and stops when
  no unmeasured config could beat its best measured energy by more than tol ("could": within
  the curves' RMS error at the task's measurements). Once its measurements stop agreeing with
  every known task it falls back to BO, which sees everything measured so far.
- "bo" otherwise: BotorchPolicy tunes it, and its final curves join the library.
Later tasks of a known kind so need one to a few measurements instead of a full BO run.
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
    """A task BO finished: its log time / log energy ratio curves over the grid."""

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
    """BO for tasks unlike any seen; transfer from similar known tasks otherwise.

    feature_rms, match_rms: the similarity gates (module docstring). probes: how many configs
    of the initial design a task without features measures before matching. neighbours: how
    many similar tasks are averaged. bo_opts: options of the inner BotorchPolicy.
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
        feature_rms: float = 0.25,
        match_rms: float = 0.03,
        neighbours: int = 3,
        **bo_opts: Any,
    ) -> None:
        super().__init__(space, seed, max_per_task=max_per_task, margin=margin, tol=tol)
        self.probes = probes
        self.feature_rms = feature_rms
        self.match_rms = match_rms
        self.neighbours = neighbours
        self.bo = BotorchPolicy(
            space, seed, max_per_task=max_per_task, margin=margin, tol=tol, **bo_opts
        )
        self.library: list[KnownTask] = []
        self._mode: dict[str, str] = {}  # task key -> "transfer" | "bo", once decided

    def mode(self, task: Task) -> str:
        """How the task is being tuned: "probe" (not decided yet), "transfer" or "bo"."""
        return self._mode.get(task.key, "probe")

    def tell(self, task: Task, config: int, time_s: float, energy_j: float) -> None:
        super().tell(task, config, time_s, energy_j)
        self.bo.tell(task, config, time_s, energy_j)

    def _choose(self, task: Task, log: TaskLog) -> int | None:
        if self.mode(task) == "probe":
            config = None if task.features else self.facts.next_design(log, task, self.probes)
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
        could beat the best measured energy by more than tol."""
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
        """Predicted curves from the similar known tasks, None if none is similar."""
        idx, y_t, y_e = log_ratios(log, task)
        if self.space.reference is not None:  # its ratios are 0 for every task: no information
            keep = idx != self.space.reference
            idx, y_t, y_e = idx[keep], y_t[keep], y_e[keep]
        if not self.library or (idx.size == 0 and not task.features):
            return None
        scores = [self._dissimilarity(task, known, idx, y_t, y_e) for known in self.library]
        similar = sorted((s, i) for i, s in enumerate(scores) if s is not None)[: self.neighbours]
        if not similar:
            return None
        weight = np.array([1.0 / (s + 0.1) for s, _ in similar])
        weight /= weight.sum()
        log_t = sum(w * self.library[i].log_t for w, (_, i) in zip(weight, similar))
        log_e = sum(w * self.library[i].log_e for w, (_, i) in zip(weight, similar))
        if idx.size == 0:
            return _Prior(log_t, log_e, 0.0, 0.0)
        log_t = log_t + np.mean(y_t - log_t[idx])
        log_e = log_e + np.mean(y_e - log_e[idx])
        return _Prior(log_t, log_e, _rms(y_t - log_t[idx]), _rms(y_e - log_e[idx]))

    def _dissimilarity(
        self, task: Task, known: KnownTask, idx: np.ndarray, y_t: np.ndarray, y_e: np.ndarray
    ) -> float | None:
        """Distance in units of the gates (RMS of feature and measurement distances over their
        thresholds), or None when a gate fails."""
        parts = []
        if task.features and len(task.features) == len(known.features):
            mine, theirs = np.array(task.features), np.array(known.features)
            size = np.maximum(np.maximum(np.abs(mine), np.abs(theirs)), 1e-12)
            parts.append(_rms((mine - theirs) / size) / self.feature_rms)
        if idx.size:
            diff = np.concatenate([y_t - known.log_t[idx], y_e - known.log_e[idx]])
            parts.append(_rms(diff) * np.sqrt(2.0) / self.match_rms)
        if not parts or max(parts) > 1.0:
            return None
        return _rms(np.array(parts))

    def _learn(self, task: Task) -> None:
        """Add a task BO has finished (converged or capped) to the library: once, and only if
        it found a feasible config, so that its curves mean something."""
        known = any(k.key == task.key for k in self.library)
        if known or best_config(self.log(task), task) is None:
            return
        log_t, log_e = self.bo.curves(task)
        self.library.append(KnownTask(task.key, log_t, log_e, tuple(task.features)))


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(values**2)))
