"""A plan made on another GPU for the same workload, carried to this card's clocks.

A job that restarts on a card its plan store has no plan for would cold-start: on the
simulated 3080 Ti and H200 that is 0.9 M and 10.7 M iterations (15 and 20 hours of training)
before the per-kernel plan settles. But which kernels want a low core clock, and how far below
its top the whole iteration can run, carry over between cards of one kind more than the clocks
themselves do. So each pair of the other card's plan is carried to the nearest pair of this
card at the same relative position: memory clock as a share of the other card's top memory
clock, core clock as a share of its top core clock. Stock stays stock.

The result is never applied silently (issue 6): the tuner notes where it came from
(state.store_note, plan_source "transferred") and runs it only after the normal reference,
its chunks never spending more than the slack at its worst-case slowdown. It is dropped for a
cold start when plainly slow after ABORT_S, over the budget after its judge window, or when
the slack is spent (OnlineTuner._train); kept, it is refined in training like any one-pair
schedule (refinement.py).
"""

from __future__ import annotations

from kdvfs.runtime.iteration import Schedule
from kdvfs.runtime.types import ClockGrid, ClockPair


def carry_pair(pair: ClockPair | None, from_grid: ClockGrid, to_grid: ClockGrid) -> ClockPair | None:
    """The pair of to_grid at pair's relative position in from_grid (None, stock, stays None)."""
    if pair is None:
        return None
    mem_share = pair.mem_mhz / max(from_grid.mem_levels_mhz)
    mem = min(to_grid.mem_levels_mhz, key=lambda m: abs(m - mem_share * max(to_grid.mem_levels_mhz)))
    cores = [p.core_mhz for p in to_grid.pairs if p.mem_mhz == mem]
    core_share = pair.core_mhz / max(from_grid.core_levels_mhz)
    return ClockPair(min(cores, key=lambda c: abs(c - core_share * max(cores))), mem)


def carry_schedule(schedule: Schedule, from_grid: ClockGrid, to_grid: ClockGrid) -> Schedule:
    """Every group's pair carried over; neighbouring groups that land on one pair merge."""
    groups: list[tuple[int, ClockPair | None]] = []
    for start, pair in schedule.groups:
        carried = carry_pair(pair, from_grid, to_grid)
        if not groups or groups[-1][1] != carried:
            groups.append((start, carried))
    return Schedule(tuple(groups))
