"""What every strategy shares: per-task measurement logs, ask/tell/best bookkeeping, the cost
a task is judged by, the monotone-time facts of a clock grid, and the small initial design.

- `TaskLog`: one task's measurements (per-config counts and sums, per launch);
- cost: `log_cost` (energy + rate x time as a log ratio to the reference's, at each of
  `exchange_rates_w`), `mean_log_cost`,
  `best_config`, `incumbents`, `steps_since_improvement`, `log_ratios`;
- limits: `time_limit_s` (the budget), `safe_log_limit` (too slow even to try);
- `GridFacts`: monotone-time pruning and bounds, and the initial design (`DESIGN_RATIOS`);
- `BaseStrategy`: logs, seeded generators, the cap, CPU time per ask, `best()`;
- `SafeExplorer`: the initial design first, then the subclass's `_pick`.

Why cost is judged at several exchange rates, and the physics behind the pruning:
docs/design-policies.md.
"""

from __future__ import annotations

import time
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from kdvfs.policies.base import SearchSpace, Task

DESIGN_RATIOS = ((1.0, 1.0), (1.0, 0.75), (0.7, 1.0), (1.0, 0.5), (0.5, 1.0), (0.7, 0.5))
"""The initial design, in order: (core, mem) clock targets as fractions (dimensionless) of the
grid's highest clocks; why these: docs/design-policies.md ("The initial design")."""


@dataclass
class TaskLog:
    """The measurements of one task: per-config counts and sums (per launch).

    Attributes:
        count: measurements per config.
        time_sum_s: per config, the sum of the measured times per launch, s.
        energy_sum_j: per config, the sum of the measured energies per launch, J.
        order: the configs the strategy was told, in order (a seeded reference is not in it).
        done_for: the rates (J/s) at which the strategy converged; None while it has not.
    """

    count: np.ndarray
    time_sum_s: np.ndarray
    energy_sum_j: np.ndarray
    order: list[int] = field(default_factory=list)
    done_for: tuple[float, ...] | None = None  # the rates at which the strategy converged

    @classmethod
    def empty(cls, n: int) -> TaskLog:
        return cls(np.zeros(n, dtype=int), np.zeros(n), np.zeros(n))

    def add(self, config: int, time_s: float, energy_j: float) -> None:
        self.count[config] += 1
        self.time_sum_s[config] += time_s
        self.energy_sum_j[config] += energy_j
        self.order.append(config)

    @property
    def measured(self) -> np.ndarray:
        return self.count > 0

    @property
    def mean_time_s(self) -> np.ndarray:
        """Mean time per config; NaN where unmeasured."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.measured, self.time_sum_s / self.count, np.nan)

    @property
    def mean_energy_j(self) -> np.ndarray:
        """Mean energy per config; NaN where unmeasured."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.measured, self.energy_sum_j / self.count, np.nan)


def time_limit_s(task: Task) -> float:
    """The largest mean time per launch that is within the task's budget."""
    return (1.0 + task.budget) * task.ref_time_s


def safe_log_limit(task: Task, margin: float) -> float:
    """Log time ratio above which a config is too slow even to try: (1 + 3 budget + margin)."""
    return float(np.log(1.0 + 3.0 * task.budget + margin))


def log_cost(log_t: np.ndarray, log_e: np.ndarray, relative_rate: np.ndarray | float) -> np.ndarray:
    """log((energy + rate x time) / the reference's), from log time and log energy ratios to the
    reference; relative_rate = rate x reference time / reference energy (0: energy alone). Broadcasts."""
    relative_rate = np.asarray(relative_rate, dtype=float)
    with np.errstate(divide="ignore"):
        return np.logaddexp(log_e, np.log(relative_rate) + log_t) - np.log1p(relative_rate)


def mean_log_cost(log: TaskLog, task: Task, relative_rate: np.ndarray | float) -> np.ndarray:
    """Per config, the log cost ratio of its mean time and energy; NaN where unmeasured."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return log_cost(
            np.log(log.mean_time_s / task.ref_time_s),
            np.log(log.mean_energy_j / task.ref_energy_j),
            relative_rate,
        )


def best_config(log: TaskLog, task: Task, relative_rate: float = 0.0) -> int | None:
    """Least mean cost among measured configs whose mean time is within budget."""
    ok = log.measured & (log.mean_time_s <= time_limit_s(task))
    if not ok.any():
        return None
    return int(np.nanargmin(np.where(ok, mean_log_cost(log, task, relative_rate), np.nan)))


def incumbents(log: TaskLog, task: Task, relative_rates: np.ndarray) -> np.ndarray:
    """Per rate, the least log cost ratio a plan can already have: the best measured config
    within budget, or the stock reference (0)."""
    ok = log.measured & (log.mean_time_s <= time_limit_s(task))
    cost = mean_log_cost(log, task, relative_rates[:, None])
    return np.minimum(np.where(ok, cost, np.inf).min(axis=1), 0.0)


def steps_since_improvement(log: TaskLog, task: Task, tol: float, relative_rates: np.ndarray) -> int:
    """How many of the task's last measurements did not lower the best cost at any rate by more
    than tol (relative); the stock reference and seeded configs are the starting point."""
    feasible = log.mean_time_s <= time_limit_s(task)
    cost = mean_log_cost(log, task, relative_rates[:, None])
    seeded = log.measured.copy()
    seeded[log.order] = False
    best = np.minimum(np.where(seeded & feasible, cost, np.inf).min(axis=1), 0.0)
    since = 0
    for config in log.order:
        better = feasible[config] & (cost[:, config] < best + np.log1p(-tol))
        best = np.minimum(best, np.where(feasible[config], cost[:, config], np.inf))
        since = 0 if better.any() else since + 1
    return since


def log_ratios(log: TaskLog, task: Task) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Measured config indices with their mean log time and log energy relative to the reference."""
    idx = np.flatnonzero(log.measured)
    return (
        idx,
        np.log(log.mean_time_s[idx] / task.ref_time_s),
        np.log(log.mean_energy_j[idx] / task.ref_energy_j),
    )


class GridFacts:
    """Monotone-time facts of a clock grid, precomputed once per search space.

    Args:
        space: the grid; its configs in MHz.
    """

    def __init__(self, space: SearchSpace) -> None:
        mhz = np.asarray(space.configs_mhz, dtype=float)
        self.unit = space.unit
        # at_least[i, j]: config i has both clocks >= config j's, so t_i <= t_j.
        self.at_least = (mhz[:, None, :] >= mhz[None, :, :]).all(axis=2)
        # slow_factor_log[i, j]: log of the most config j can be slower than config i.
        ratio = mhz[:, None, :] / mhz[None, :, :]
        self.slow_factor_log = np.log(np.maximum(ratio.max(axis=2), 1.0))
        self.design = self._design(mhz)

    @staticmethod
    def _design(mhz: np.ndarray) -> list[int]:
        rel = mhz / mhz.max(axis=0)
        picks = [int(np.argmin(((rel - np.array(t)) ** 2).sum(axis=1))) for t in DESIGN_RATIOS]
        return list(dict.fromkeys(picks))

    def known_infeasible(self, log: TaskLog, task: Task) -> np.ndarray:
        """Configs no faster than a measured config that is over budget (itself included)."""
        slow = log.measured & (log.mean_time_s > time_limit_s(task))
        return self.at_least[slow].any(axis=0)

    def log_time_bounds(self, log: TaskLog, task: Task) -> tuple[np.ndarray, np.ndarray]:
        """Per-config bounds on log(time / reference time) implied by the measurements.

        Lower: the slowest measured config with both clocks >= this one. Upper: a measured
        config's time times the most that lowering clocks from it can slow a kernel.
        """
        idx, log_t, _ = log_ratios(log, task)
        n = self.at_least.shape[0]
        if idx.size == 0:
            return np.full(n, -np.inf), np.full(n, np.inf)
        lower = np.where(self.at_least[idx], log_t[:, None], -np.inf).max(axis=0)
        upper = (log_t[:, None] + self.slow_factor_log[idx]).min(axis=0)
        return lower, upper

    def next_design(self, log: TaskLog, task: Task, length: int | None = None) -> int | None:
        """The first design config (of the first `length`) not yet measured nor known too slow."""
        blocked = log.measured | self.known_infeasible(log, task)
        for config in self.design[:length]:
            if not blocked[config]:
                return config
        return None


class BaseStrategy(ABC):
    """Bookkeeping shared by every strategy: per-task logs, the cap, CPU timing, best().

    When the task's reference (its own, else the space's) is a grid config, each task's log
    starts with the caller's reference measurement at it, so no strategy spends a measurement
    on it again.
    ask() returns only unmeasured configs (no strategy here re-samples); once it has returned
    None for a task it keeps doing so until exchange_rates_w changes (a task converged at some rates may
    still have configs worth measuring at others).

    Args:
        space: the candidate clock configurations.
        seed: seeds every per-task generator (with the task key).
        max_per_task: the most measurements a task is told before ask() returns None; None:
            no cap.
    """

    name: str = ""

    def __init__(self, space: SearchSpace, seed: int, *, max_per_task: int | None = None) -> None:
        if len(space) == 0:
            raise ValueError("search space has no configs")
        self.space = space
        self.seed = int(seed)
        self.max_per_task = max_per_task
        self.ask_cpu_s: list[float] = []
        self.exchange_rates_w: tuple[float, ...] = (0.0,)
        self._logs: dict[str, TaskLog] = {}
        self._rngs: dict[str, np.random.Generator] = {}

    def log(self, task: Task) -> TaskLog:
        """This task's measurements (created on first use, seeded with the reference)."""
        log = self._logs.get(task.key)
        if log is None:
            log = TaskLog.empty(len(self.space))
            reference = task.reference_in(self.space)
            if reference is not None:
                log.add(reference, task.ref_time_s, task.ref_energy_j)
                log.order.clear()
            self._logs[task.key] = log
        return log

    def measurements(self, task: Task) -> int:
        """How many measurements this task was told (the seeded reference not counted)."""
        return len(self.log(task).order)

    def rng(self, task: Task) -> np.random.Generator:
        """This task's generator, seeded by the policy seed and the task key.

        Per task, so a task's draws do not depend on how other tasks are interleaved.
        """
        rng = self._rngs.get(task.key)
        if rng is None:
            rng = np.random.default_rng([self.seed, zlib.crc32(task.key.encode())])
            self._rngs[task.key] = rng
        return rng

    def relative_rates(self, task: Task) -> np.ndarray:
        """The exchange rates relative to the task: rate x reference time / reference energy (no unit)."""
        return np.asarray(self.exchange_rates_w, dtype=float) * task.ref_time_s / task.ref_energy_j

    def ask(self, task: Task) -> int | None:
        start = time.process_time()
        try:
            log = self.log(task)
            if (
                log.done_for == self.exchange_rates_w
                or log.measured.all()
                or (self.max_per_task is not None and len(log.order) >= self.max_per_task)
            ):
                log.done_for = self.exchange_rates_w
                return None
            config = self._choose(task, log)
            if config is None:
                log.done_for = self.exchange_rates_w
                return None
            assert not log.measured[config], f"{self.name} chose measured config {config}"
            return int(config)
        finally:
            self.ask_cpu_s.append(time.process_time() - start)

    def tell(self, task: Task, config: int, time_s: float, energy_j: float) -> None:
        if not 0 <= config < len(self.space):
            raise IndexError(f"config {config} outside the search space of {len(self.space)}")
        self.log(task).add(int(config), float(time_s), float(energy_j))

    def best(self, task: Task) -> int | None:
        """Least mean cost within budget at the middle rate (least energy at the default)."""
        return best_config(
            self.log(task), task, float(self.relative_rates(task)[len(self.exchange_rates_w) // 2])
        )

    @abstractmethod
    def _choose(self, task: Task, log: TaskLog) -> int | None:
        """The next unmeasured config for this task, or None when converged."""


class SafeExplorer(BaseStrategy):
    """A strategy with safe exploration: the initial design first, then its own `_pick`.

    Args:
        space, seed, max_per_task: as BaseStrategy.
        margin: a config whose predicted time exceeds (1 + 3 budget + margin) x reference is not
            tried (fraction of the reference time).
        tol: relative cost improvement (fraction, 0.002 = 0.2 %) below which a strategy calls a
            task converged.
    """

    def __init__(
        self,
        space: SearchSpace,
        seed: int,
        *,
        max_per_task: int | None = None,
        margin: float = 0.1,
        tol: float = 0.002,
    ) -> None:
        super().__init__(space, seed, max_per_task=max_per_task)
        self.facts = GridFacts(space)
        self.margin = margin
        self.tol = tol

    def _choose(self, task: Task, log: TaskLog) -> int | None:
        config = self.facts.next_design(log, task)
        return config if config is not None else self._pick(task, log)

    @abstractmethod
    def _pick(self, task: Task, log: TaskLog) -> int | None:
        """The next config after the initial design, or None when converged."""
