"""A plan made on another GPU for the same workload, carried to this card's clocks.

carry_schedule maps each pair of the other card's schedule to the nearest pair of this card
at the same relative position (memory and core clock as shares of each card's top ones);
stock stays stock. The step-driven tuner verifies the result after its reference, noted and on trial
(plan_source "transferred"), and drops or refines it there.

Design and findings: docs/design-tuner.md#transfer-another-gpus-plan-carried-to-this-card
"""

from __future__ import annotations

from kdvfs.runtime.schedule import Schedule
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
