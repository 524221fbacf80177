"""The yardstick: the best a card can do within the budget, from the card's own in-step truth.

A simulated (or replayed) card evaluates any schedule noiselessly inside the step: each kernel
at the pair in effect when it starts, the power cap held over its windows, at the step's own
steady temperature (`device.expected_step`). Every figure here is that evaluation against the
stock step's, held to the budget (slowdown <= budget); none comes from isolated measurements.
A job that waits for its host (runtime/job_noise.py) is charged its wait after every step, the
card idling at the clocks in effect (`InStep`'s wait_rel, wait_fixed_s, wait_rel_strata; none
by default): a locked card idles at the pair it holds, a stock one at its lowest core clock.
- `one_knob_oracle`: every pair of the grid for the whole step (what a one-knob peer such as
  EnvPipe or Zeus could at best reach).
- `realisable_oracle`: a pair per group between the job's switch sites, switch latency included;
  `ideal_oracle`: a pair per kernel with free switches (latency 0). Both are searched from
  starts (the one-knob optimum, the realisable oracle's pairs in effect, the plan of the card's
  isolated per-kernel figures) by `_Search`: rounds of in-step probes of every kind of group or
  kernel at candidate pairs, combined by a knapsack over the probed changes, until no round
  improves. Searched, not proven optimal; by construction ideal >= realisable >= one-knob
  (with a wait, the ideal's own unit, the realisable's only as searched: its last switch may
  land in the wait, which a plan per kernel does not copy exactly).
- `oracles` -> `Oracles` (the three, each an `OracleFigures` with its `method`); `oracle` /
  `Oracle`: the same under the names tuner/run.py has always had.
Design: docs/design-step-tuner.md ("The yardstick"); figures: docs/benchmarks.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.runtime.schedule import Schedule, schedule_items, steady_step
from kdvfs.runtime.types import ClockPair, HostWait, KdvfsError, Workload
from kdvfs.tuner.solver import solve_budget
from kdvfs.tuner.step_priors import model_prior, prior_schedule
from kdvfs.tuner.sweep import held_to_budget, sources

#: Rounds of probes a search of tied kinds runs at most (each round: every kind at each of its
#: candidate pairs); rounds.
MAX_ROUNDS = 8
#: Rounds of the search of each group (or kernel) alone that follows, at most; rounds.
MAX_UNTIED_ROUNDS = 1
#: Groups (or kernels) searched one by one after the tied search, when there are at most this
#: many; units.
MAX_UNTIED_UNITS = 64
#: A move must save at least this share of the stock step's energy more to count (0.01 point
#: of saving: the figures are reported to 0.01%); a fraction.
IMPROVE_TOL = 1e-4
#: Grids of at most this many pairs are probed whole in a broad round; larger ones at
#: SPREAD_CORES core clocks per memory clock, the kind's isolated front and the neighbours of
#: its current pair; pairs.
WHOLE_GRID_PAIRS = 32
#: Core clocks per memory clock a large grid is probed at in a broad round; clocks.
SPREAD_CORES = 4
#: Pairs of a kind's isolated (time, energy) front probed in a broad round; pairs.
FRONT_PAIRS = 4
#: Core-clock steps either side of the current pair, at its memory clock, probed in every
#: round (BROAD_STEPS too in a broad one); the nearest core clock at every other memory clock
#: is probed as well; grid steps.
LOCAL_STEPS, BROAD_STEPS = (1, 2), (4,)
#: Times a knapsack combination that ran over the budget in the step is planned again tighter.
COMBINE_RETRIES = 4

Pair = ClockPair | None
LAST = "last"
"""InStep.per_kernel's wait_pair for the wait at the last kernel's pair."""


@dataclass(frozen=True)
class OracleFigures:
    """One oracle: a schedule and its in-step figures against stock.

    Attributes:
        name: "one-knob", "realisable" or "ideal per-kernel".
        schedule: its clock requests (the ideal's: a group at each change of pair, run with
            free switches).
        energy_saving: 1 - its step energy / stock's, in the step, a fraction.
        slowdown: its step time / stock's - 1, in the step, a fraction (<= the budget).
        switch_latency_s: the latency it was evaluated with, s (0 for the ideal).
        method: how it was computed, in words (the JSON and the docs carry it).
        evaluations: in-step evaluations the search ran (distinct schedules).
    """

    name: str
    schedule: Schedule
    energy_saving: float
    slowdown: float
    switch_latency_s: float
    method: str
    evaluations: int

    def json(self) -> dict[str, Any]:
        return {
            "energy_saving": self.energy_saving,
            "slowdown": self.slowdown,
            "groups": len(self.schedule.groups),
            "schedule": [[s, None if p is None else p.as_list()] for s, p in self.schedule.groups],
            "switch_latency_s": self.switch_latency_s,
            "evaluations": self.evaluations,
            "method": self.method,
        }


@dataclass(frozen=True)
class Oracles:
    """The three yardsticks of one card, workload and budget (each held to the budget in the
    step); `schedule`, `energy_saving`, `slowdown`, `ideal_energy_saving` and `ideal_slowdown`
    are the names tuner/run.py's Oracle always had (the realisable oracle and the ideal).
    stock_step_s and stock_energy_j include the job's wait; wait_rel (a fraction of the step),
    wait_fixed_s (s) and wait_rel_strata (fractions) are the wait charged after each step
    (InStep)."""

    one_knob: OracleFigures
    realisable: OracleFigures
    ideal: OracleFigures
    budget: float
    stock_step_s: float
    stock_energy_j: float
    wait_rel: float = 0.0
    wait_fixed_s: float = 0.0
    wait_rel_strata: tuple[float, ...] = ()

    @property
    def schedule(self) -> Schedule:
        return self.realisable.schedule

    @property
    def energy_saving(self) -> float:
        return self.realisable.energy_saving

    @property
    def slowdown(self) -> float:
        return self.realisable.slowdown

    @property
    def ideal_energy_saving(self) -> float:
        return self.ideal.energy_saving

    @property
    def ideal_slowdown(self) -> float:
        return self.ideal.slowdown

    def json(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "stock_step_s": self.stock_step_s,
            "stock_energy_per_step_j": self.stock_energy_j,
            "evaluated": IN_STEP,
            "job_wait_rel": self.wait_rel,
            "job_wait_fixed_s": self.wait_fixed_s,
            "job_wait_rel_strata": list(self.wait_rel_strata),
            "one_knob": self.one_knob.json(),
            "realisable": self.realisable.json(),
            "ideal_per_kernel": self.ideal.json(),
        }


Oracle = Oracles
"""tuner/run.py's name for the yardstick."""

IN_STEP = (
    "the card's noiseless in-step evaluation (device.expected_step: each kernel at the pair in effect "
    "when it starts, the power cap held over its windows, at the step's steady temperature) against "
    "the stock step's, held to the budget"
)


# --- the card's in-step truth ------------------------------------------------------------------
class InStep:
    """Noiseless in-step figures of a card's schedules against stock, cached and counted, the
    job's waits for its host charged.

    Each evaluated step (stock's and every schedule's) is followed by the job's wait: wait_rel
    x the step's kernels' time + wait_fixed_s, the card idling through it at the clocks in
    effect (device.idle_power_at): those the kernels ended at, then, when a schedule's last
    switch is still in flight, its pair from when it lands; stock idles at stock, a plan per
    kernel at its last kernel's pair. The relative wait is charged as the simulated job
    (runtime/steps.py's SimulatedJob) waits it (device.expected_step's host_waits): a share
    of the kernels' time as they run at the step's temperature with the wait in the power
    cap's window that holds their end (a windowed cap lets more through a window that idles,
    so a waiting step's kernels may run faster than a quiet one's). Time and energy include
    the wait, as a job's step from one start to the next does, and so does the card's steady
    temperature. The relative wait is taken at each of `wait_rel_strata`
    (equally likely; JobNoise.wait_rel_strata), since a switch lands in a long wait and not in
    a short one: each schedule runs from the start each previous wait leaves it in
    (runtime/schedule.py's steady_step), the figures averaged. wait_fixed_s stands for long
    periodic waits (a checkpoint every N steps), amortised per step: their windows hold no
    kernel and the switch in flight has landed in them, so the steps after them (their share
    after_wait_share) start at the clocks that landed there, the next step's first request in
    flight for the switch latency. With no wait the figures are the card's expected_step as they are.

    Args:
        device: the card (a simulated or replayed ModelDevice: expected_step, switch_latency_s,
            and idle_power_at when a wait is charged).
        workload: the kernels of one step.
        budget: the largest slowdown against stock, a fraction.
        wait_rel: the job's mean wait per step as a share of the step's own time, a fraction
            (>= 0; JobNoise.mean_wait_rel).
        wait_fixed_s: the job's mean wait per step that does not scale with the step, s (>= 0;
            JobNoise.mean_periodic_wait_s).
        wait_rel_strata: equally likely relative waits whose mean is wait_rel, fractions
            (JobNoise.wait_rel_strata); empty: every step waits wait_rel.
        after_wait_share: the share of steps that start after a periodic wait
            (JobNoise.after_periodic_share; 0: those steps are left out), a fraction.
    """

    def __init__(
        self,
        device: Any,
        workload: Workload,
        budget: float,
        wait_rel: float = 0.0,
        wait_fixed_s: float = 0.0,
        wait_rel_strata: Sequence[float] = (),
        after_wait_share: float = 0.0,
    ) -> None:
        if not (budget >= 0.0 and math.isfinite(budget)):
            raise KdvfsError(f"budget must be a finite fraction >= 0, got {budget}")
        for name, value in (("wait_rel", wait_rel), ("wait_fixed_s", wait_fixed_s), *_named(wait_rel_strata)):
            if not (value >= 0.0 and math.isfinite(value)):
                raise KdvfsError(f"the job's wait {name} must be finite and >= 0, got {value}")
        strata = tuple(float(r) for r in wait_rel_strata)
        if strata and not math.isclose(sum(strata) / len(strata), wait_rel, rel_tol=1e-9, abs_tol=1e-12):
            raise KdvfsError(
                f"the job's wait_rel ({wait_rel}) must be the mean of its wait_rel_strata "
                f"({sum(strata) / len(strata)})"
            )
        self.device = device
        self.workload = workload
        self.budget = budget
        self.wait_rel = float(wait_rel)
        self.wait_fixed_s = float(wait_fixed_s)
        self.wait_rel_strata = strata
        if not 0.0 <= after_wait_share <= 1.0:
            raise KdvfsError(
                f"the job's after_wait_share must be a fraction in [0, 1], got {after_wait_share}"
            )
        self.after_wait_share = float(after_wait_share) if self.wait_fixed_s > 0.0 else 0.0
        self._cache: dict[tuple, tuple[float, float]] = {}
        self.stock_s, self.stock_j = self._waited([(k, None, k.launches) for k in workload.kernels], None)
        self.limit_s = (1.0 + budget) * self.stock_s * (1.0 + 1e-12)

    @property
    def waits(self) -> bool:
        """Whether a wait is charged after each step."""
        return self.wait_rel > 0.0 or self.wait_fixed_s > 0.0

    @property
    def wait_note(self) -> str:
        """The wait charged, in words for an oracle's method ("" when none)."""
        if not self.waits:
            return ""
        spread = f" ({len(self.wait_rel_strata)} equally likely strata)" if self.wait_rel_strata else ""
        after = (
            f", {self.after_wait_share:.2%} of the steps starting after a periodic wait"
            if self.after_wait_share > 0.0
            else ""
        )
        return (
            f"; job waits charged: {self.wait_rel:.1%} of the step{spread} + {self.wait_fixed_s * 1e3:.1f} ms"
            f"{after}, idling at the clocks in effect (a switch in flight landing in the wait)"
        )

    @property
    def evaluations(self) -> int:
        return len(self._cache)

    def per_kernel(self, pairs: Sequence[Pair], wait_pair: Pair | str = LAST) -> tuple[float, float]:
        """(time s, energy J) of one step with kernel k at pairs[k], switches free, and the
        job's wait after it, idle at wait_pair (LAST: the last kernel's)."""
        key = ("kernels", tuple(pairs), wait_pair)
        if key not in self._cache:
            items = [(k, p, k.launches) for k, p in zip(self.workload.kernels, pairs, strict=True)]
            self._cache[key] = self._waited(items, items[-1][1] if wait_pair == LAST else wait_pair)
        return self._cache[key]

    def schedule(self, schedule: Schedule) -> tuple[float, float]:
        """(time s, energy J) of one steady step of a schedule, each switch landing after the
        card's switch latency, and the job's wait after it (steady_step: a switch still in flight
        at the kernels' end lands in the wait, or in the next step)."""
        key = ("schedule", schedule.groups)
        if key not in self._cache:
            if not self.waits:
                self._cache[key] = self.device.expected_step(
                    schedule_items(self.device, self.workload, schedule)
                )
                return self._cache[key]
            starts: dict[tuple, int] = {}  # the steps the previous step's waits leave, and how many
            for rel in self.strata:
                steady = steady_step(self.device, self.workload, schedule, rel)
                state = (tuple(steady.items), steady.end_pair, steady.in_flight)
                starts[state] = starts.get(state, 0) + 1
            total = sum(starts.values())
            figures = [
                ((1.0 - self.after_wait_share) * n / total, self._waited(list(items), end, in_flight))
                for (items, end, in_flight), n in starts.items()
            ]
            if self.after_wait_share > 0.0:  # a step after a periodic wait, the mean one's length
                after = steady_step(
                    self.device,
                    self.workload,
                    schedule,
                    self.wait_rel,
                    self.wait_fixed_s / self.after_wait_share,
                )
                figures.append(
                    (self.after_wait_share, self._waited(list(after.items), after.end_pair, after.in_flight))
                )
            self._cache[key] = (sum(w * t for w, (t, _) in figures), sum(w * e for w, (_, e) in figures))
        return self._cache[key]

    @property
    def strata(self) -> tuple[float, ...]:
        """The equally likely relative waits evaluated (wait_rel alone when none were given)."""
        return self.wait_rel_strata or (self.wait_rel,)

    def _waited(
        self, items: list[tuple[Any, Pair, float]], end: Pair, in_flight: tuple[float, Pair] | None = None
    ) -> tuple[float, float]:
        """(time s, energy J) of the items and the job's wait after them: each stratum's wait
        (its share of the items' own time), the card idle at `end` until the switch in flight
        (s after the kernels' end, pair) lands and at its pair after; the periodic part
        (wait_fixed_s, long waits of their own) at the pair the clocks land at."""
        if not self.waits:
            return self.device.expected_step(items)
        waits = [HostWait(rel, end, in_flight) for rel in self.strata]
        landed = end if in_flight is None else in_flight[1]
        return self.device.expected_step(items, rare_idle=[(self.wait_fixed_s, landed)], host_waits=waits)

    def figures(self, time_s: float, energy_j: float) -> tuple[float, float]:
        """(energy saving, slowdown) against stock."""
        return 1.0 - energy_j / self.stock_j, time_s / self.stock_s - 1.0

    def holds(self, time_s: float) -> bool:
        return time_s <= self.limit_s


def _named(strata: Sequence[float]) -> list[tuple[str, float]]:
    return [(f"wait_rel_strata[{i}]", float(r)) for i, r in enumerate(strata)]


@dataclass(frozen=True)
class _Waits:
    """The job's waits an oracle function was given (InStep's wait_rel, wait_fixed_s,
    wait_rel_strata)."""

    rel: float = 0.0
    fixed_s: float = 0.0
    strata: tuple[float, ...] = ()


def _step_of(step: InStep | None, device: Any, workload: Workload, budget: float, waits: _Waits) -> InStep:
    """The given InStep (whose waits must be these, when any are given), or a new one."""
    if step is None:
        return InStep(device, workload, budget, waits.rel, waits.fixed_s, waits.strata)
    if waits != _Waits() and waits != _Waits(step.wait_rel, step.wait_fixed_s, step.wait_rel_strata):
        raise KdvfsError("the job's waits are the given InStep's: pass them to it, not beside it")
    return step


# --- the one-knob oracle -----------------------------------------------------------------------
def one_knob_oracle(
    device: Any,
    workload: Workload,
    budget: float,
    *,
    step: InStep | None = None,
    wait_rel: float = 0.0,
    wait_fixed_s: float = 0.0,
    wait_rel_strata: Sequence[float] = (),
) -> OracleFigures:
    """The best single pair for the whole step within the budget: every pair of the grid
    evaluated in the step (stock where none holds the budget). wait_rel (a fraction of the
    step), wait_fixed_s (s) and wait_rel_strata (fractions): the job's waits charged after
    each step (InStep; a given step carries its own)."""
    step = _step_of(step, device, workload, budget, _Waits(wait_rel, wait_fixed_s, tuple(wait_rel_strata)))
    best: tuple[float, Pair, float] = (step.stock_j, None, step.stock_s)
    for pair in device.grid.pairs:
        t, e = step.schedule(Schedule(((0, pair),)))
        if step.holds(t) and e < best[0]:
            best = (e, pair, t)
    saving, slowdown = step.figures(best[2], best[0])
    return OracleFigures(
        "one-knob",
        Schedule(((0, best[1]),)),
        saving,
        slowdown,
        0.0,
        f"every pair of the grid ({len(device.grid.pairs)}) locked for the whole step, each evaluated in "
        f"the step; the least energy within the budget{step.wait_note}",
        step.evaluations,
    )


# --- the search --------------------------------------------------------------------------------
class _Search:
    """A local search over a pair per unit (a group between switch sites, or a kernel), each
    state evaluated in the step by `evaluate` -> (time s, energy J).

    Moves set every unit of one kind (units doing the same work, as one layer's attention in
    every layer) to one pair. A round probes every kind at its candidate pairs (a broad round,
    the first: the whole grid when small, else SPREAD_CORES core clocks per memory clock, the
    kind's isolated (time, energy) front and the current pairs' neighbours; a local round:
    the neighbours and stock), then takes the better of the best single move within the
    budget and a multiple-choice knapsack over the probed changes (each kind's change priced
    at its probed time and energy, their sum within the budget's slack), planned tighter while
    the step runs the combination over the budget. It stops when a round improves nothing
    (`converged`) or after `max_rounds`.

    Args:
        step: the card's in-step truth (its budget and cache).
        evaluate: a state's (time s, energy J) in the step.
        kinds: the units of each kind (moved together).
        grid: the card's pairs.
        fronts: each kind's isolated front (_front).
        max_rounds: rounds at most.
        say: called with a line after each round (progress), or None.
    """

    def __init__(
        self,
        step: InStep,
        evaluate: Callable[[tuple[Pair, ...]], tuple[float, float]],
        kinds: list[list[int]],
        grid: Sequence[ClockPair],
        fronts: list[list[ClockPair]],
        max_rounds: int = MAX_ROUNDS,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.step = step
        self.evaluate = evaluate
        self.kinds = kinds
        self.fronts = fronts
        self.grid = tuple(grid)
        self.max_rounds = max_rounds
        self.say = say
        self._by_mem: dict[int, list[int]] = {}
        for p in self.grid:
            self._by_mem.setdefault(p.mem_mhz, []).append(p.core_mhz)
        for cores in self._by_mem.values():
            cores.sort()
        self.rounds = 0
        self.converged = False

    def candidates(self, kind: int, state: tuple[Pair, ...], broad: bool) -> list[Pair]:
        """The pairs a round probes for one kind (its current pair left out)."""
        current = {state[u] for u in self.kinds[kind]}
        out: list[Pair] = [None]
        if broad and len(self.grid) <= WHOLE_GRID_PAIRS:
            out.extend(self.grid)
        elif broad:
            for mem, cores in self._by_mem.items():
                picks = np.linspace(0, len(cores) - 1, SPREAD_CORES).round().astype(int)
                out.extend(ClockPair(cores[i], mem) for i in dict.fromkeys(picks.tolist()))
            out.extend(self.fronts[kind])
        for pair in sorted(current, key=_order):
            out.extend(self.neighbours(pair, broad))
        return [p for p in dict.fromkeys(out) if current != {p}]

    def neighbours(self, pair: Pair, broad: bool) -> list[ClockPair]:
        """Core clocks LOCAL_STEPS (and, broad, BROAD_STEPS) steps either side at the same
        memory clock, and the nearest core clock at every other memory clock; stock's: the two
        top core clocks at every memory clock."""
        steps = (*LOCAL_STEPS, *(BROAD_STEPS if broad else ()))
        out = []
        for mem, cores in self._by_mem.items():
            if pair is None:
                out.extend(ClockPair(c, mem) for c in cores[-2:])
                continue
            i = int(np.argmin([abs(c - pair.core_mhz) for c in cores]))
            moves = (0, *steps, *(-s for s in steps)) if mem == pair.mem_mhz else (0,)
            out.extend(ClockPair(cores[i + m], mem) for m in moves if 0 <= i + m < len(cores))
        return out

    def run(self, state: tuple[Pair, ...], broad_first: bool = True) -> tuple[Pair, ...]:
        """Rounds from `state`, the first broad when broad_first, until one improves nothing."""
        t, e = self.evaluate(state)
        tol_j = IMPROVE_TOL * self.step.stock_j
        broad = broad_first
        while self.rounds < self.max_rounds:
            self.rounds += 1
            probes: list[list[tuple[Pair, float, float]]] = []
            best_single: tuple[float, tuple[Pair, ...]] | None = None
            for kind in range(len(self.kinds)):
                row = []
                for pair in self.candidates(kind, state, broad):
                    moved = self._set(state, kind, pair)
                    tm, em = self.evaluate(moved)
                    row.append((pair, tm - t, em - e))
                    if (
                        self.step.holds(tm)
                        and em < e - tol_j
                        and (best_single is None or em < best_single[0])
                    ):
                        best_single = (em, moved)
                probes.append(row)
            combined = self._combine(state, t, probes)
            options = [x for x in (best_single, combined) if x is not None and x[0] < e - tol_j]
            if options:
                e, state = min(options, key=lambda x: x[0])
                t = self.evaluate(state)[0]
            if self.say is not None:
                saving, slowdown = self.step.figures(t, e)
                self.say(
                    f"round {self.rounds} ({'broad' if broad else 'local'}, {len(self.kinds)} kinds): "
                    f"saving {saving:.2%} at {slowdown:+.2%}, {self.step.evaluations} evaluations"
                )
            if not options:
                self.converged = True
                break
            broad = False
        return state

    def _set(self, state: tuple[Pair, ...], kind: int, pair: Pair) -> tuple[Pair, ...]:
        moved = list(state)
        for u in self.kinds[kind]:
            moved[u] = pair
        return tuple(moved)

    def _combine(
        self, state: tuple[Pair, ...], t: float, probes: list[list[tuple[Pair, float, float]]]
    ) -> tuple[float, tuple[Pair, ...]] | None:
        """The knapsack over the probed changes (each kind: unchanged, or one probed pair),
        evaluated in the step; planned with a tighter slack while the step runs it over."""
        rows = [[(None, 0.0, 0.0), *row] for row in probes]
        if sum(len(r) > 1 for r in rows) < 2:
            return None
        shift_t = [min(dt for _, dt, _ in r) for r in rows]
        shift_e = [min(de for _, _, de in r) for r in rows]
        times = [np.array([dt for _, dt, _ in r]) - s for r, s in zip(rows, shift_t)]
        energies = [np.array([de for _, _, de in r]) - s for r, s in zip(rows, shift_e)]
        slack_s = self.step.limit_s - t
        best = None
        for _ in range(COMBINE_RETRIES):
            limit = slack_s - sum(shift_t)
            if limit < 0.0:
                break
            solution = solve_budget(times, energies, limit)
            if not solution.feasible:
                break
            moved = list(state)
            for kind, option in enumerate(solution.choice):
                if option > 0:
                    for u in self.kinds[kind]:
                        moved[u] = rows[kind][option][0]
            tm, em = self.evaluate(tuple(moved))
            if self.step.holds(tm):
                best = (em, tuple(moved))
                break
            slack_s -= 1.5 * (tm - self.step.limit_s)
        return best


def _order(pair: Pair) -> tuple[int, int]:
    return (0, 0) if pair is None else (pair.core_mhz, pair.mem_mhz)


def _kinds(signatures: Sequence[Any]) -> list[list[int]]:
    """Units grouped by signature, in order of first appearance."""
    first: dict[Any, list[int]] = {}
    for u, sig in enumerate(signatures):
        first.setdefault(sig, []).append(u)
    return list(first.values())


def _front(time_s: np.ndarray, energy_j: np.ndarray, pairs: Sequence[ClockPair]) -> list[ClockPair]:
    """Up to FRONT_PAIRS pairs spread along the (time, energy) front of one unit's isolated
    figures (pairs no other pair beats on both)."""
    order = np.lexsort((energy_j, time_s))
    front, best_e = [], math.inf
    for j in order:
        if energy_j[j] < best_e:
            front.append(pairs[j])
            best_e = energy_j[j]
    if len(front) <= FRONT_PAIRS:
        return front
    return [front[round(i * (len(front) - 1) / (FRONT_PAIRS - 1))] for i in range(FRONT_PAIRS)]


def _schedule_of(starts: Sequence[int], state: Sequence[Pair]) -> Schedule:
    """The schedule of a pair per unit (units starting at `starts`), equal neighbours merged."""
    groups = [(s, p) for i, (s, p) in enumerate(zip(starts, state)) if i == 0 or p != state[i - 1]]
    return Schedule(tuple(groups))


@dataclass(frozen=True)
class _Planned:
    """A start planned from isolated figures, with its in-step figures (held_to_budget's)."""

    state: tuple[Pair, ...]
    energy_saving: float
    slowdown: float


# --- the realisable and ideal oracles -----------------------------------------------------------
def _searched(
    step: InStep,
    evaluate: Callable[[tuple[Pair, ...]], tuple[float, float]],
    start: tuple[Pair, ...],
    kinds: list[list[int]],
    fronts: Callable[[int], list[ClockPair]],
    grid: Sequence[ClockPair],
    unit: str,
    say: Callable[[str], None] | None,
) -> tuple[tuple[Pair, ...], str]:
    """_Search from `start` over tied kinds, then (at most MAX_UNTIED_UNITS units, more than
    the kinds) over each unit alone; the state and how it was searched, in words."""
    search = _Search(step, evaluate, kinds, grid, [fronts(k[0]) for k in kinds], MAX_ROUNDS, say)
    state = search.run(start)
    words = (
        f"{len(kinds)} kinds of {unit} (the same work) tied, {_rounds(search)} of in-step probes "
        f"combined by a knapsack"
    )
    units = len(start)
    if len(kinds) < units <= MAX_UNTIED_UNITS:
        alone = _Search(
            step,
            evaluate,
            [[u] for u in range(units)],
            grid,
            [fronts(u) for u in range(units)],
            MAX_UNTIED_ROUNDS,
            say,
        )
        state = alone.run(state, broad_first=False)
        words += f"; then each {unit} alone, {_rounds(alone)} of its neighbouring pairs"
    return state, words


def _rounds(search: _Search) -> str:
    plural = "round" if search.rounds == 1 else "rounds"
    end = "until one improved nothing" if search.converged else "stopped at the round limit"
    return f"{search.rounds} {plural} ({end})"


def realisable_oracle(
    device: Any,
    workload: Workload,
    budget: float,
    sites: Sequence[int],
    *,
    starts: Sequence[Schedule] = (),
    step: InStep | None = None,
    one_knob: OracleFigures | None = None,
    say: Callable[[str], None] | None = None,
    wait_rel: float = 0.0,
    wait_fixed_s: float = 0.0,
    wait_rel_strata: Sequence[float] = (),
) -> OracleFigures:
    """The best schedule found with a pair per group between switch sites (switch latency
    included), in the step, within the budget: searched (_Search) from the best of the
    one-knob optimum, the plan of the card's isolated per-kernel figures at the sites (held to
    the budget in the step) and `starts` (schedules carried onto the sites: each group at the
    pair its first kernel requests), kinds of group tied, then (at most MAX_UNTIED_UNITS
    groups) each group alone. At least the one-knob optimum. say: progress lines; wait_rel (a
    fraction of the step), wait_fixed_s (s) and wait_rel_strata (fractions): the job's waits
    charged after each step (InStep; a given step carries its own)."""
    step = _step_of(step, device, workload, budget, _Waits(wait_rel, wait_fixed_s, tuple(wait_rel_strata)))
    sites = _checked_sites(sites, len(workload))
    one_knob = one_knob or one_knob_oracle(device, workload, budget, step=step)
    ends = [*sites[1:], len(workload)]

    def evaluate(state: tuple[Pair, ...]) -> tuple[float, float]:
        return step.schedule(_schedule_of(sites, state))

    def at_sites(schedule: Schedule) -> tuple[Pair, ...]:
        per_kernel = schedule.pair_per_kernel(len(workload))
        return tuple(per_kernel[s] for s in sites)

    isolated = model_prior(device, workload)
    unit_t = np.array([isolated.time_s[a:b].sum(axis=0) for a, b in zip(sites, ends)])
    unit_e = np.array([isolated.energy_j[a:b].sum(axis=0) for a, b in zip(sites, ends)])

    def planned_at(b: float) -> _Planned:
        state = at_sites(prior_schedule(isolated, list(sites), device.switch_latency_s, b))
        return _Planned(state, *step.figures(*evaluate(state)))

    stock_state = (None,) * len(sites)
    planned = held_to_budget(planned_at, lambda: _Planned(stock_state, 0.0, 0.0), budget).plan
    candidates = [
        ("the one-knob optimum", at_sites(one_knob.schedule)),
        ("the plan of the isolated per-kernel figures at the sites", planned.state),
        *((f"given schedule {i + 1}", at_sites(s)) for i, s in enumerate(starts)),
    ]
    start_name, start = _best_start(step, evaluate, candidates)
    copies = sources(device, workload)
    kinds = _kinds([tuple(copies[a:b]) for a, b in zip(sites, ends)])
    state, words = _searched(
        step,
        evaluate,
        start,
        kinds,
        lambda u: _front(unit_t[u, :-1], unit_e[u, :-1], isolated.pairs),
        device.grid.pairs,
        "group",
        say,
    )
    saving, slowdown = step.figures(*evaluate(state))
    return OracleFigures(
        "realisable",
        _schedule_of(sites, state),
        saving,
        slowdown,
        device.switch_latency_s,
        f"a pair per group between the job's {len(sites)} switch sites, each switch landing "
        f"{device.switch_latency_s * 1e3:g} ms after its request, evaluated in the step; searched from "
        f"{start_name} (the best start of: {', '.join(name for name, _ in candidates)}), {words}"
        f"{step.wait_note}",
        step.evaluations,
    )


def ideal_oracle(
    device: Any,
    workload: Workload,
    budget: float,
    *,
    realisable: OracleFigures | None = None,
    starts: Sequence[Schedule] = (),
    step: InStep | None = None,
    say: Callable[[str], None] | None = None,
    wait_rel: float = 0.0,
    wait_fixed_s: float = 0.0,
    wait_rel_strata: Sequence[float] = (),
) -> OracleFigures:
    """The best plan found with a pair per kernel and free switches (latency 0), in the step,
    within the budget: searched (_Search) from the best of the realisable oracle's pairs in
    effect (so that it is at least the realisable oracle), the per-kernel plan of the card's
    isolated figures (held to the budget in the step) and `starts` (each kernel at the pair
    its group requests: another card's ideal), kernels doing the same work tied, then (at most
    MAX_UNTIED_UNITS kernels) each kernel alone. say: progress lines; wait_rel (a fraction of
    the step), wait_fixed_s (s) and wait_rel_strata (fractions): the job's waits charged after
    each step (InStep; a given step carries its own), the wait then a unit of the search of its
    own (free switches: the card idles at the pair the plan sets for it)."""
    step = _step_of(step, device, workload, budget, _Waits(wait_rel, wait_fixed_s, tuple(wait_rel_strata)))
    n = len(workload)
    isolated = model_prior(device, workload)
    limit_s = (1.0 + budget) * float(isolated.time_s[:, -1].sum())
    columns = [*isolated.pairs, None]

    def planned_at(b: float) -> _Planned:
        limit = (1.0 + b) / (1.0 + budget) * limit_s
        solution = solve_budget(list(isolated.time_s), list(isolated.energy_j), limit)
        state = tuple(columns[c] for c in solution.choice) if solution.feasible else (None,) * n
        return _Planned(state, *step.figures(*step.per_kernel(state)))

    planned = held_to_budget(planned_at, lambda: _Planned((None,) * n, 0.0, 0.0), budget).plan
    candidates = [("the per-kernel plan of the isolated figures", _with_wait(step, planned.state))]
    if realisable is not None:
        steady = steady_step(device, workload, realisable.schedule)
        in_effect = tuple(p for _, p, _ in steady.items)
        landed = steady.end_pair if steady.in_flight is None else steady.in_flight[1]
        candidates.insert(0, ("the realisable oracle's pairs in effect", _with_wait(step, in_effect, landed)))
    candidates.extend(
        (f"given plan {i + 1}", _with_wait(step, tuple(s.pair_per_kernel(n)))) for i, s in enumerate(starts)
    )

    def evaluate(state: tuple[Pair, ...]) -> tuple[float, float]:
        return step.per_kernel(state[:n], state[n]) if step.waits else step.per_kernel(state)

    units = [*sources(device, workload), *(["the wait"] if step.waits else [])]
    start_name, start = _best_start(step, evaluate, candidates)
    state, words = _searched(
        step,
        evaluate,
        start,
        _kinds(units),
        lambda u: (
            [] if u == n else _front(isolated.time_s[u, :-1], isolated.energy_j[u, :-1], isolated.pairs)
        ),
        device.grid.pairs,
        "kernel",
        say,
    )
    saving, slowdown = step.figures(*evaluate(state))
    wait_words = ""
    if step.waits:
        wait_words = (
            f"; the job's wait a unit of its own, idling at {'stock' if state[n] is None else state[n]}"
        )
    return OracleFigures(
        "ideal per-kernel",
        _schedule_of(range(n), state[:n]),
        saving,
        slowdown,
        0.0,
        f"a pair per kernel, switches free (latency 0), evaluated in the step; searched from {start_name} "
        f"(the best start of: {', '.join(name for name, _ in candidates)}), {words}{step.wait_note}{wait_words}",
        step.evaluations,
    )


def _with_wait(step: InStep, state: tuple[Pair, ...], wait_pair: Pair | str = LAST) -> tuple[Pair, ...]:
    """A per-kernel state with, when the step charges a wait, the wait's pair as one unit more
    (LAST: the last kernel's)."""
    if not step.waits:
        return state
    return (*state, state[-1] if wait_pair == LAST else wait_pair)


def _best_start(
    step: InStep,
    evaluate: Callable[[tuple[Pair, ...]], tuple[float, float]],
    candidates: list[tuple[str, tuple]],
) -> tuple[str, tuple[Pair, ...]]:
    """The candidate start of least energy within the budget (the first where none holds)."""
    held = [(evaluate(s)[1], i) for i, (_, s) in enumerate(candidates) if step.holds(evaluate(s)[0])]
    return candidates[min(held)[1] if held else 0]


def _checked_sites(sites: Sequence[int], n: int) -> list[int]:
    sites = list(sites)
    if not sites or sites[0] != 0 or any(b <= a for a, b in itertools.pairwise(sites)) or sites[-1] >= n:
        raise KdvfsError(f"switch sites must start at kernel 0 and increase within the step, got {sites[:5]}")
    return sites


def oracles(
    device: Any,
    workload: Workload,
    budget: float,
    *,
    sites: Sequence[int] | None = None,
    starts: Sequence[Schedule] = (),
    ideal_starts: Sequence[Schedule] = (),
    say: Callable[[str], None] | None = None,
    wait_rel: float = 0.0,
    wait_fixed_s: float = 0.0,
    wait_rel_strata: Sequence[float] = (),
    after_wait_share: float = 0.0,
) -> Oracles:
    """The one-knob, realisable and ideal per-kernel oracles of a noiseless card (a simulated
    card opened with noise 0, or a replayed one), in the step, each within the budget.
    sites: where the job switches clocks (None: tuner/run.py's job_sites, "auto"); starts:
    schedules the realisable search also starts from; ideal_starts: plans the ideal search
    also starts from (the ideal of the same card with another switch latency); say: progress;
    wait_rel (a fraction of the step), wait_fixed_s (s) and wait_rel_strata (fractions): the
    job's waits for its host per step (JobNoise.mean_wait_rel, mean_periodic_wait_s,
    wait_rel_strata), charged after every step with the card idle at the clocks in effect
    (InStep)."""
    if sites is None:
        from kdvfs.tuner.run import job_sites

        sites = job_sites(workload, device.switch_latency_s)
    step = InStep(device, workload, budget, wait_rel, wait_fixed_s, wait_rel_strata, after_wait_share)
    one = one_knob_oracle(device, workload, budget, step=step)
    best = realisable_oracle(device, workload, budget, sites, starts=starts, step=step, one_knob=one, say=say)
    ideal = ideal_oracle(device, workload, budget, realisable=best, starts=ideal_starts, step=step, say=say)
    return Oracles(
        one,
        best,
        ideal,
        budget,
        step.stock_s,
        step.stock_j,
        step.wait_rel,
        step.wait_fixed_s,
        step.wait_rel_strata,
    )


def oracle(noiseless: Any, workload: Workload, budget: float, sites: Sequence[int] | None = None) -> Oracles:
    """tuner/run.py's oracle: `oracles` of a noiseless copy of the card (the realisable
    schedule as `schedule` / `energy_saving` / `slowdown`, the ideal as `ideal_*`)."""
    return oracles(noiseless, workload, budget, sites=sites)
