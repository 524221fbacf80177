"""What has been measured so far, per kernel and clock pair, and the plan it supports.

- Observations: the table of cells (time, energy, counts, paired ratios), the stock
  references, and the per-kernel plan (kernel_level_choice: solver.solve_budget under
  time_limit_s, stock always an option).
- measure_cell: one cell measured in isolated replay, a throttled pair paired with a stock
  measurement right after it.
- On a real card (`Observations.on_real_card`): every cell is planned as its ratio to the
  kernel's isolated stock measurement times the training reference, and each kernel's stock
  is measured twice (before and after its pairs); the spread of those A/A pairs
  (`null_sd`) sets a family-wise energy margin (`energy_margin`, FAMILY_ALPHA) that a pair
  must beat, against the lower of the two (`stock_plan_energy_j`), to be chosen, so that
  noise alone does not make a plan (the null test); a cell that beats it is measured again
  beside a fresh stock and must beat it again (`unconfirmed_savings`, `add_confirmation`).
  The time limit's noise is then the A/A pairs' times (the replayed reference's cancels).

Design and findings (two references, because temperature matters):
docs/design-tuner.md#observations-what-has-been-measured-and-the-plan-it-supports
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from kdvfs.runtime.device import KernelRunner
from kdvfs.runtime.measure import StepReference, measure_isolated
from kdvfs.runtime.types import ClockPair, Measurement, Workload
from kdvfs.tuner.solver import solve_budget

#: Safety margin of a plan's time limit: standard deviations of plan and reference time.
SAFETY_Z = 2.0
#: On a real card: the chance that noise alone makes any of a sweep's cells look like a saving
#: beyond the energy margin (a family-wise false-positive rate over all its pair cells).
FAMILY_ALPHA = 0.05


@dataclass
class Observations:
    """Per-step (launches included) mean time and energy per (kernel, pair), NaN where
    unmeasured, with the references (docs/design-tuner.md, two references)."""

    workload: Workload
    pairs: tuple[ClockPair, ...]
    reference: StepReference
    time_s: np.ndarray = field(init=False)
    energy_j: np.ndarray = field(init=False)
    counts: np.ndarray = field(init=False)
    paired_ratio: np.ndarray = field(init=False)  # (time, energy) / stock's, where throttled
    stock_time_s: np.ndarray = field(init=False)  # isolated stock measurement per kernel
    stock_energy_j: np.ndarray = field(init=False)
    measurements: int = 0
    throttled: int = 0
    cost_s: float = 0.0
    on_real_card: bool = False  # plan cells as ratios to their isolated stock, with energy_margin
    stock_repeat_energy_j: np.ndarray = field(init=False)  # the second stock measurement per kernel
    stock_repeat_time_s: np.ndarray = field(init=False)
    confirmed_ratio: np.ndarray = field(init=False)  # a cell's energy / stock's, measured again

    def __post_init__(self) -> None:
        shape = (len(self.workload), len(self.pairs))
        self.time_s = np.full(shape, np.nan)
        self.energy_j = np.full(shape, np.nan)
        self.counts = np.zeros(shape, dtype=int)
        self.paired_ratio = np.full((*shape, 2), np.nan)
        self.stock_time_s = np.full(len(self.workload), np.nan)
        self.stock_energy_j = np.full(len(self.workload), np.nan)
        self.stock_repeat_energy_j = np.full(len(self.workload), np.nan)
        self.stock_repeat_time_s = np.full(len(self.workload), np.nan)
        self.confirmed_ratio = np.full(shape, np.nan)
        self.cost_s = self.reference.cost_s
        self._pair_index = {p: j for j, p in enumerate(self.pairs)}

    @property
    def ref_time_s(self) -> np.ndarray:
        """Each kernel's time per step at stock, in training."""
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

    def unconfirmed_savings(self) -> list[tuple[int, int]]:
        """On a real card: the (kernel, pair index) cells whose energy beats the kernel's stock
        by the margin and that were not measured again yet (measure_every_pair confirms them)."""
        if not self.on_real_card:
            return []
        _, energy_j = self.plannable()
        beats = (energy_j < self.stock_plan_energy_j()[:, None]) & np.isnan(self.confirmed_ratio)
        return [(int(k), int(j)) for k, j in zip(*np.nonzero(beats))]

    def add_confirmation(self, k: int, j: int, m: Measurement, stock: Measurement, cost_s: float) -> None:
        """A cell measured again with a stock measurement right after it."""
        self.confirmed_ratio[k, j] = m.energy_j / stock.energy_j
        self.measurements += 2
        self.cost_s += cost_s

    def add_stock_repeat(self, k: int, m: Measurement, cost_s: float) -> None:
        """A kernel's second isolated stock measurement (after its pairs): its A/A pair."""
        self.stock_repeat_energy_j[k] = m.energy_j * self.workload.kernels[k].launches
        self.stock_repeat_time_s[k] = m.time_s * self.workload.kernels[k].launches
        self.measurements += 1
        self.cost_s += cost_s

    def null_sd(self, of: str = "energy") -> float:
        """Relative s.d. of one cell's energy (of="time": time), from the kernels' A/A stock
        pairs: the RMS of their relative differences over sqrt(2) (drift between them counted
        as noise); NaN with fewer than two pairs."""
        if of == "time":
            first, second = self.stock_time_s, self.stock_repeat_time_s
        else:
            first, second = self.stock_energy_j, self.stock_repeat_energy_j
        both = ~(np.isnan(first) | np.isnan(second))
        if both.sum() < 2:
            return math.nan
        d = (second[both] - first[both]) / (0.5 * (first[both] + second[both]))
        return float(np.sqrt(np.mean(d**2)) / math.sqrt(2.0))

    def stock_plan_energy_j(self) -> np.ndarray:
        """Each kernel's stock energy as plans are chosen against it: its isolated stock
        measurement; on a real card the lower of its two (a stock window that ran slow, as a
        host's hiccup makes one, must not make every pair look like a saving); 0 where not
        measured (such a kernel stays at stock, whose energy is the same in every plan)."""
        stock = self.stock_energy_j
        if self.on_real_card:
            stock = np.fmin(stock, self.stock_repeat_energy_j)
        return np.where(np.isnan(stock), 0.0, stock)

    def energy_margin(self) -> float:
        """On a real card: the relative energy below its stock that a pair must show to be
        planned, z x null_sd x sqrt(2) with z such that noise alone crosses it in any of the
        measured pair cells with chance FAMILY_ALPHA (Bonferroni); 0 for a model's table
        and infinite on a real card whose noise is unknown yet."""
        if not self.on_real_card:
            return 0.0
        cells = max(int((self.counts > 0).sum()), 1)
        sd = self.null_sd()
        if math.isnan(sd):
            return math.inf
        return NormalDist().inv_cdf(1.0 - FAMILY_ALPHA / cells) * sd * math.sqrt(2.0)

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
        time_s, energy_j = self.measured_cells()
        # a confirmed cell is planned at the worse of its two measurements: it must pass twice
        again = self.confirmed_ratio * self.stock_plan_energy_j()[:, None]
        energy_j = np.where(np.isnan(again), energy_j, np.fmax(energy_j, again))
        margin = self.energy_margin()
        if margin:
            energy_j = (
                energy_j * (1.0 + margin)
                if math.isfinite(margin)
                else np.where(np.isnan(energy_j), np.nan, np.inf)
            )
        return time_s, energy_j

    def measured_cells(self) -> tuple[np.ndarray, np.ndarray]:
        """(time, energy) per kernel and pair as measured (no margin): NaN where unmeasured;
        for a throttled pair, or any pair on a real card, its ratio to the kernel's isolated
        stock measurement times the kernel's references."""
        paired = ~np.isnan(self.paired_ratio[..., 0])
        time_s = np.where(paired, self.paired_ratio[..., 0] * self.ref_time_s[:, None], self.time_s)
        energy_j = np.where(paired, self.paired_ratio[..., 1] * self.stock_energy_j[:, None], self.energy_j)
        if self.on_real_card:
            time_s = np.where(
                paired, time_s, self.time_s / self.stock_time_s[:, None] * self.ref_time_s[:, None]
            )
        return time_s, energy_j

    def time_limit_s(self, budget: float) -> float:
        """(1 + budget) x the training reference, less SAFETY_Z s.d. of the error of plan and
        reference time over the kernels measured at some pair (a kernel left at stock runs as
        the reference did). Below the reference, only the all-stock plan is safe."""
        ref = self.ref_time_s
        explored = self.counts.sum(axis=1) > 0
        rel_sd = self.reference.time_rel_sd
        if self.on_real_card and not math.isnan(self.null_sd("time")):
            # a real card's cells are planned as ratios to the isolated stock, in which the
            # replayed reference's own noise cancels: the ratios' noise is the A/A pairs'
            rel_sd = self.null_sd("time")
        sd_s = rel_sd * np.sqrt(2.0 * np.sum(ref[explored] ** 2))
        return (1.0 + budget) * float(ref.sum()) - SAFETY_Z * sd_s

    def no_time_budget(self, budget: float) -> bool:
        """Whether the time limit is below the reference (the noise margin leaves no budget):
        then only the all-stock plan is safe, and every plan must be it (a planner that must
        fit under the limit would otherwise pick a pair whose noise made it look fast)."""
        return self.time_limit_s(budget) < float(self.ref_time_s.sum())

    def kernel_level_choice(self, budget: float) -> dict[str, ClockPair | None]:
        """Least measured energy per kernel within the time limit; stock where best, and for
        kernels not measured yet; all stock when the noise margin leaves no budget."""
        if self.no_time_budget(budget):
            return {k.name: None for k in self.workload.kernels}
        time_s, energy_j = self.plannable()
        stock_e = self.stock_plan_energy_j()
        times = np.column_stack([time_s, self.ref_time_s])
        energies = np.column_stack([energy_j, stock_e])
        sol = solve_budget(list(times), list(energies), self.time_limit_s(budget))
        options = (*self.pairs, None)
        return {k.name: options[c] for k, c in zip(self.workload.kernels, sol.choice)}


def measure_cell(
    device: KernelRunner, obs: Observations, k: int, pair: ClockPair | None, window_s: float
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
