"""The full-sweep baseline: measure every clock pair of every kernel, then solve for the plan.

As the founding paper did, each kernel runs in isolation at each supported pair (>= 1 s of
repeats per measurement), and the plan is the exact least-energy choice under the step's
time limit (observations.Observations); the pass-level plan is the same with one pair per pass.
The reference comes first: training steps at stock clocks, then each kernel's isolated
stock measurement (observations.py says why both).

On a real card (runtime/op_device.py: the recorded ops of a step, rebuilt) nothing gives a
noiseless answer: `measured_figures` and `measured_realisable` evaluate plans from the
measured table itself (each kernel's cells as ratios to its isolated stock, times the training
reference), and each kernel's stock is measured again after its pairs, whose A/A spread sets
the margin a pair must beat (observations.py, `energy_margin`).

A model's card runs a plan in the step as its noiseless evaluation says; where that is slower
than the budget (a windowed power cap spreads a kernel's power over its neighbours, so a
kernel measured alone misjudges its time in the step: the H200 and H100 presets),
`held_to_budget` plans again at a tighter budget until the step holds it (`held_realisable`
for the schedule; `kdvfs sweep` reports every plan so). A held plan is the best the isolated
measurements can promise, not the best the card can run: where they misjudge a pair's sign
(faster alone, slower in the step) nothing short of stock holds. `realisable` itself is not
held: the experiments' oracles use it, and docs/benchmarks.md says where it runs over budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

from kdvfs.runtime.device import KernelRunner, RunnableDevice
from kdvfs.runtime.measure import measure_isolated, measure_reference_steps
from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.types import ClockPair, Kernel, Workload
from kdvfs.tuner.grouping import group_kernels
from kdvfs.tuner.observations import Observations, measure_cell
from kdvfs.tuner.solver import pass_level

#: Planning budgets tried by bisection when the plan of the budget runs over it in the step; plans.
MAX_REPLANS = 8


class _Figures(Protocol):
    energy_saving: float
    slowdown: float


P = TypeVar("P", bound=_Figures)


@dataclass(frozen=True)
class Held(Generic[P]):
    """A plan held to the budget in the step.

    Attributes:
        plan: the plan, planned at planned_budget (stock where no planning budget held).
        planned_budget: the budget it was planned at: the budget itself, or tighter where the
            step ran the plan of the budget slower than the budget (a fraction; 0 for stock).
        first: the plan planned at the budget itself (plan, where the step held it).
    """

    plan: P
    planned_budget: float
    first: P

    @property
    def first_slowdown(self) -> float:
        """The in-step slowdown of the plan planned at the budget itself."""
        return self.first.slowdown


def held_to_budget(plan_at: Callable[[float], P], stock: Callable[[], P], budget: float) -> Held[P]:
    """plan_at(budget), evaluated in the step; where its slowdown exceeds the budget, the
    planning budget is bisected between 0 and the budget MAX_REPLANS times, and the plan of
    most saving among those the step holds is kept (stock() if none holds). A plan's in-step
    slowdown need not grow with its planning budget: bisection finds a good plan, not the best."""
    first = plan_at(budget)
    if first.slowdown <= budget:
        return Held(first, budget, first)
    best = Held(stock(), 0.0, first)
    low, high = 0.0, budget
    for _ in range(MAX_REPLANS):
        middle = 0.5 * (low + high)
        plan = plan_at(middle)
        if plan.slowdown <= budget:
            if plan.energy_saving > best.plan.energy_saving:
                best = Held(plan, middle, first)
            low = middle
        else:
            high = middle
    return best


@dataclass(frozen=True)
class PlanFigures:
    """A plan (a pair per kernel, None = stock) and its noiseless evaluation."""

    choice: dict[str, ClockPair | None]
    energy_saving: float
    slowdown: float
    time_s: float
    energy_j: float


def run_sweep(
    device: KernelRunner,
    workload: Workload,
    window_s: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
) -> Observations:
    """Measure the reference, then every distinct kernel at stock and at every pair of the
    grid (sweep_reference, then measure_every_pair)."""
    return measure_every_pair(device, sweep_reference(device, workload), window_s, progress)


def sweep_reference(
    device: KernelRunner,
    workload: Workload,
    pairs: tuple[ClockPair, ...] | None = None,
    warmup_s: float = 120.0,
    window_s: float = 20.0,
) -> Observations:
    """A sweep's first phase: training steps at stock (warmup_s, then window_s of them,
    s); nothing measured at a pair yet. pairs: those to sweep (None: the whole grid)."""
    reference = measure_reference_steps(device, workload.kernels, warmup_s, window_s)
    obs = Observations(workload, device.grid.pairs if pairs is None else pairs, reference)
    obs.on_real_card = device.source == "measured"
    return obs


def spread_pairs(pairs: tuple[ClockPair, ...], count: int) -> tuple[ClockPair, ...]:
    """`count` pairs spread evenly over a grid's pairs in its order (both ends included)."""
    if count >= len(pairs):
        return pairs
    if count == 1:
        return (pairs[0],)
    return tuple(pairs[round(i * (len(pairs) - 1) / (count - 1))] for i in range(count))


def measure_every_pair(
    device: KernelRunner,
    obs: Observations,
    window_s: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
) -> Observations:
    """A sweep's second phase, into `obs` as it goes (an interrupted sweep keeps what it
    measured): every distinct kernel at stock and at every pair of the grid. A kernel doing the
    same work as one already measured (the same kernel of another layer) shares its
    measurements instead of being measured again. On a real card each kernel's stock is
    measured again after its pairs (the A/A pair of Observations.null_sd), and at the end each
    cell that beat its stock by the margin is measured again beside a fresh stock."""
    workload = obs.workload
    copies = sources(device, workload)
    distinct = [i for i, source in enumerate(copies) if source == i]
    total = len(distinct) * len(obs.pairs)
    try:
        for n, i in enumerate(distinct):
            measure_cell(device, obs, i, None, window_s)
            for j, pair in enumerate(obs.pairs):
                measure_cell(device, obs, i, pair, window_s)
                if progress is not None:
                    progress(n * len(obs.pairs) + j + 1, total)
            if obs.on_real_card:
                again = measure_isolated(device, workload.kernels[i], None, window_s)
                obs.add_stock_repeat(i, again.measurement, again.cost_s)
            share_with_copies(obs, copies, i)
        for k, j in obs.unconfirmed_savings():  # a real card's apparent savings, measured again
            again = measure_isolated(device, workload.kernels[k], obs.pairs[j], window_s)
            stock = measure_isolated(device, workload.kernels[k], None, window_s)
            obs.add_confirmation(k, j, again.measurement, stock.measurement, again.cost_s + stock.cost_s)
    finally:
        device.reset_clocks()
    return obs


def sources(device: KernelRunner, workload: Workload) -> list[int]:
    """Each kernel's source: the first kernel doing the same work (itself where none before
    does), whose measurements it may share; on a device whose costs go by a kernel's name (a
    replayed table), each kernel is its own."""
    first: dict[tuple, int] = {}
    by_work = getattr(device, "costs_by_work", False)
    return [first.setdefault(_work(k) if by_work else (k.name,), i) for i, k in enumerate(workload.kernels)]


def share_with_copies(obs: Observations, sources_: list[int], source: int) -> list[int]:
    """Give every copy of kernel `source` (sources_[copy] == source: sources()) its
    measurements; the copies."""
    copies = [k for k, s in enumerate(sources_) if s == source and k != source]
    for copy in copies:
        obs.share(source, copy)
    return copies


def _work(kernel: Kernel) -> tuple:
    """What a kernel's measurements depend on: everything but its name and pass."""
    return (
        kernel.flops,
        kernel.bytes_moved,
        kernel.tensor_core,
        kernel.kind,
        kernel.wait_s,
        kernel.launches,
        kernel.ref_time_s,
    )


def pass_level_choice(obs: Observations, budget: float) -> dict[str, ClockPair | None]:
    """One setting per pass (forward / backward / optimizer): a pair every kernel of the pass
    holds, or stock; same time limit (all stock when the noise margin leaves no budget, as
    for the kernel-level plan: otherwise a dry-run sweep on the H200 plans noise per pass)."""
    if obs.no_time_budget(budget):
        return {k.name: None for k in obs.workload.kernels}
    passes = [k.pass_name for k in obs.workload.kernels]
    time_s, energy_j = obs.plannable()
    times = np.column_stack([time_s, obs.ref_time_s])
    energies = np.column_stack([energy_j, obs.stock_plan_energy_j()])
    per_pass, _ = pass_level(list(times), list(energies), passes, obs.time_limit_s(budget))
    options = (*obs.pairs, None)
    return {k.name: options[per_pass[k.pass_name]] for k in obs.workload.kernels}


def _stock_energy_j(obs: Observations) -> np.ndarray:
    """Each kernel's isolated stock energy, 0 where not measured yet (an interrupted sweep):
    such a kernel stays at stock, whose energy is the same in every plan."""
    return np.where(np.isnan(obs.stock_energy_j), 0.0, obs.stock_energy_j)


def evaluate(device: RunnableDevice, workload: Workload, choice: dict[str, ClockPair | None]) -> PlanFigures:
    """Noiseless evaluation of a per-kernel plan against the reference, each step at its
    own steady temperature (switch cost ignored, as the founding paper did; tuner/grouping.py
    prices switches)."""
    ref_t, ref_e = device.expected_step([(k, None, k.launches) for k in workload.kernels])
    t, e = device.expected_step([(k, choice[k.name], k.launches) for k in workload.kernels])
    return PlanFigures(dict(choice), 1.0 - e / ref_e, t / ref_t - 1.0, t, e)


@dataclass(frozen=True)
class Realisable:
    """The best schedule a card can run with its clock-switch latency within the budget,
    planned from a sweep's measurements, and its noiseless figures (switches included)."""

    schedule: Schedule
    energy_saving: float
    slowdown: float

    @property
    def groups(self) -> int:
        return len(self.schedule.groups)


def held_realisable(device: ModelDevice, obs: Observations, budget: float) -> Held[Realisable]:
    """realisable(), held to the budget in the step (held_to_budget)."""
    return held_to_budget(
        lambda b: realisable(device, obs, b), lambda: _realisable_stock(device, obs), budget
    )


def held_plan(
    device: RunnableDevice,
    obs: Observations,
    choose: Callable[[float], dict[str, ClockPair | None]],
    budget: float,
) -> Held[PlanFigures]:
    """A per-kernel plan chosen at a budget (obs.kernel_level_choice, or a pass-level choice),
    evaluated in the step and held to the budget (held_to_budget; stock where none holds)."""
    stock = {k.name: None for k in obs.workload.kernels}
    return held_to_budget(
        lambda b: evaluate(device, obs.workload, choose(b)),
        lambda: evaluate(device, obs.workload, stock),
        budget,
    )


def _realisable_stock(device: ModelDevice, obs: Observations) -> Realisable:
    from kdvfs.runtime.schedule import schedule_figures

    saving, slowdown = schedule_figures(device, obs.workload, Schedule.stock())
    return Realisable(Schedule.stock(), saving, slowdown)


def realisable(device: ModelDevice, obs: Observations, budget: float) -> Realisable:
    """Group the swept kernels so that clock switches pay for themselves (grouping.py), then
    evaluate the schedule as the card runs it (all stock when no grouping fits the budget).
    Planned at the budget from the isolated measurements; not held to it (held_realisable).
    All stock, too, when the noise margin leaves no time budget."""
    from kdvfs.runtime.schedule import schedule_figures

    if obs.no_time_budget(budget):
        return _realisable_stock(device, obs)
    time_m, energy_m = obs.plannable()
    t = np.column_stack([time_m, obs.ref_time_s])
    e = np.column_stack([energy_m, _stock_energy_j(obs)])
    columns = [*obs.pairs, None]
    grouping = group_kernels(t, e, device.switch_latency_s, obs.time_limit_s(budget), 0.0)
    schedule = (
        Schedule(tuple((g.start, columns[g.pair_index]) for g in grouping.groups))
        if grouping.feasible
        else Schedule.stock()
    )
    saving, slowdown = schedule_figures(device, obs.workload, schedule)
    return Realisable(schedule, saving, slowdown)


def measured_figures(obs: Observations, choice: dict[str, ClockPair | None]) -> PlanFigures:
    """A per-kernel plan evaluated from the measured table (a real card has no noiseless
    answer): each kernel at its pair as measured (a ratio to its isolated stock, times its
    training reference), at stock as the references; switch cost ignored. Kernels not
    measured at their pair count as stock."""
    time_m, energy_m = obs.measured_cells()
    ref_t = obs.ref_time_s
    ref_e = _stock_energy_j(obs)
    index = {p: j for j, p in enumerate(obs.pairs)}
    t, e = ref_t.copy(), ref_e.copy()
    for k, kernel in enumerate(obs.workload.kernels):
        pair = choice[kernel.name]
        if pair is not None and not np.isnan(energy_m[k, index[pair]]):
            t[k], e[k] = time_m[k, index[pair]], energy_m[k, index[pair]]
    time_s, energy_j = float(t.sum()), float(e.sum())
    return PlanFigures(
        dict(choice), 1.0 - energy_j / float(ref_e.sum()), time_s / float(ref_t.sum()) - 1.0, time_s, energy_j
    )


def measured_realisable(obs: Observations, budget: float, switch_latency_s: float) -> Realisable:
    """The realisable schedule planned from a real card's table (the energy margin applied,
    as for the per-kernel plan) and evaluated on the measured cells, switches priced as
    grouping.evaluate_grouping does. All stock when the noise margin leaves no time budget
    (a dry-run sweep on a loaded CPU planned a pair whose noise made it look 25% faster)."""
    from kdvfs.tuner.grouping import evaluate_grouping

    time_m, energy_m = obs.measured_cells()
    stock_e = _stock_energy_j(obs)
    columns = [*obs.pairs, None]
    t = np.column_stack([time_m, obs.ref_time_s])
    groups = [(0, len(obs.pairs))]  # stock
    if not obs.no_time_budget(budget):
        time_p, energy_p = obs.plannable()
        grouping = group_kernels(
            np.column_stack([time_p, obs.ref_time_s]),
            np.column_stack([energy_p, obs.stock_plan_energy_j()]),
            switch_latency_s,
            obs.time_limit_s(budget),
            0.0,
        )
        if grouping.feasible:
            groups = [(g.start, g.pair_index) for g in grouping.groups]
    figures = evaluate_grouping(t, np.column_stack([energy_m, stock_e]), groups, switch_latency_s)
    schedule = Schedule(tuple((start, columns[j]) for start, j in groups))
    ref_t, ref_e = float(obs.ref_time_s.sum()), float(stock_e.sum())
    return Realisable(schedule, 1.0 - figures.energy_j / ref_e, figures.time_s / ref_t - 1.0)
