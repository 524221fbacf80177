"""What has been measured so far, per kernel and clock pair, and the plan it supports.

- Observations: the table of cells (time, energy, counts, paired ratios), the stock
  references, and the per-kernel plan (kernel_level_choice: solver.solve_budget under
  time_limit_s, stock always an option).
- measure_cell: one cell measured in isolated replay, a throttled pair paired with a stock
  measurement right after it.

Design and findings (two references, because temperature matters):
docs/design-tuner.md#observations-what-has-been-measured-and-the-plan-it-supports
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.measure import IterationReference, measure_isolated
from kdvfs.runtime.types import ClockPair, Measurement, Workload
from kdvfs.tuner.solver import solve_budget

#: Safety margin of a plan's time limit: standard deviations of plan and reference time.
SAFETY_Z = 2.0


@dataclass
class Observations:
    """Per-iteration (launches included) mean time and energy per (kernel, pair), NaN where
    unmeasured, with the references (docs/design-tuner.md, two references)."""

    workload: Workload
    pairs: tuple[ClockPair, ...]
    reference: IterationReference
    time_s: np.ndarray = field(init=False)
    energy_j: np.ndarray = field(init=False)
    counts: np.ndarray = field(init=False)
    paired_ratio: np.ndarray = field(init=False)  # (time, energy) / stock's, where throttled
    stock_time_s: np.ndarray = field(init=False)  # isolated stock measurement per kernel
    stock_energy_j: np.ndarray = field(init=False)
    measurements: int = 0
    throttled: int = 0
    cost_s: float = 0.0

    def __post_init__(self) -> None:
        shape = (len(self.workload), len(self.pairs))
        self.time_s = np.full(shape, np.nan)
        self.energy_j = np.full(shape, np.nan)
        self.counts = np.zeros(shape, dtype=int)
        self.paired_ratio = np.full((*shape, 2), np.nan)
        self.stock_time_s = np.full(len(self.workload), np.nan)
        self.stock_energy_j = np.full(len(self.workload), np.nan)
        self.cost_s = self.reference.cost_s
        self._pair_index = {p: j for j, p in enumerate(self.pairs)}

    @property
    def ref_time_s(self) -> np.ndarray:
        """Each kernel's time per iteration at stock, in training."""
        return self.reference.kernel_time_s

    def add(self, k: int, pair: ClockPair | None, m: Measurement, cost_s: float) -> None:
        """Record one isolated measurement (per launch) of kernel k; pair None is stock."""
        launches = self.workload.kernels[k].launches
        t, e = m.time_s * launches, m.energy_j * launches
        self.measurements += 1
        self.cost_s += cost_s
        if pair is None:
            if np.isnan(self.stock_time_s[k]):
                self.stock_time_s[k], self.stock_energy_j[k] = t, e
            return
        self.throttled += m.throttled
        j = self._pair_index[pair]
        n = self.counts[k, j]
        self.time_s[k, j] = t if n == 0 else (self.time_s[k, j] * n + t) / (n + 1)
        self.energy_j[k, j] = e if n == 0 else (self.energy_j[k, j] * n + e) / (n + 1)
        self.counts[k, j] = n + 1

    def add_paired(self, k: int, pair: ClockPair, m: Measurement, stock: Measurement, cost_s: float) -> None:
        """A throttled pair's measurement with the stock one taken right after it."""
        self.add(k, pair, m, cost_s)
        self.measurements += 1
        j = self._pair_index[pair]
        ratio = np.array([m.time_s / stock.time_s, m.energy_j / stock.energy_j])
        old = self.paired_ratio[k, j]
        n = self.counts[k, j]
        self.paired_ratio[k, j] = ratio if np.isnan(old[0]) else (old * (n - 1) + ratio) / n

    def share(self, source: int, target: int) -> None:
        """Give kernel `target` the measurements of kernel `source`, a launch of the same work
        (the same layer's kernel in another layer): what one measures, the other would."""
        for cells in (
            self.time_s,
            self.energy_j,
            self.counts,
            self.paired_ratio,
            self.stock_time_s,
            self.stock_energy_j,
        ):
            cells[target] = cells[source]

    def plannable(self) -> tuple[np.ndarray, np.ndarray]:
        """(time, energy) per kernel and pair that a plan may use: NaN where unmeasured; for a
        throttled pair, its paired ratio to stock times the kernel's references."""
        paired = ~np.isnan(self.paired_ratio[..., 0])
        time_s = np.where(paired, self.paired_ratio[..., 0] * self.ref_time_s[:, None], self.time_s)
        energy_j = np.where(paired, self.paired_ratio[..., 1] * self.stock_energy_j[:, None], self.energy_j)
        return time_s, energy_j

    def time_limit_s(self, budget: float) -> float:
        """(1 + budget) x the training reference, less SAFETY_Z s.d. of the error of plan and
        reference time over the kernels measured at some pair (a kernel left at stock runs as
        the reference did). Below the reference, only the all-stock plan is safe."""
        ref = self.ref_time_s
        explored = self.counts.sum(axis=1) > 0
        sd_s = self.reference.time_rel_sd * np.sqrt(2.0 * np.sum(ref[explored] ** 2))
        return (1.0 + budget) * float(ref.sum()) - SAFETY_Z * sd_s

    def kernel_level_choice(self, budget: float) -> dict[str, ClockPair | None]:
        """Least measured energy per kernel within the time limit; stock where best, and for
        kernels not measured yet; all stock when the noise margin leaves no budget."""
        if self.time_limit_s(budget) < float(self.ref_time_s.sum()):
            return {k.name: None for k in self.workload.kernels}
        time_s, energy_j = self.plannable()
        stock_e = np.where(np.isnan(self.stock_energy_j), 0.0, self.stock_energy_j)
        times = np.column_stack([time_s, self.ref_time_s])
        energies = np.column_stack([energy_j, stock_e])
        sol = solve_budget(list(times), list(energies), self.time_limit_s(budget))
        options = (*self.pairs, None)
        return {k.name: options[c] for k, c in zip(self.workload.kernels, sol.choice)}


def measure_cell(
    device: RunnableDevice, obs: Observations, k: int, pair: ClockPair | None, window_s: float
) -> Measurement | None:
    """Measure kernel k at a pair (None: stock) into obs, with a paired stock measurement
    when the card throttled at the pair. Returns the stock measurement it took, if any (the
    measurement itself for pair None), for a caller that pairs the next cell with it."""
    kernel = obs.workload.kernels[k]
    res = measure_isolated(device, kernel, pair, window_s)
    if pair is None or not res.measurement.throttled:
        obs.add(k, pair, res.measurement, res.cost_s)
        return res.measurement if pair is None else None
    stock = measure_isolated(device, kernel, None, window_s)
    obs.add_paired(k, pair, res.measurement, stock.measurement, res.cost_s + stock.cost_s)
    return stock.measurement
