"""The compute-waste reward both environments pay (`compute_waste_reward`): relative energy
saved against the reference, less a penalty that grows with the slowdown beyond the budget.

    reward = (E_ref - E) / E_ref  -  penalty_scale * max(0, T / T_ref - 1 - budget) / budget

Within the budget the reward is the plain relative saving (0 at the reference, up to 1);
a slowdown of 2 x budget pays penalty_scale. `trial_reward` pays it on a trial in training
from the tuner's own judgement of it (runtime/trials.py: `judge`), stock as the reference.
Why this shape: docs/design-envs.md.
"""

from __future__ import annotations

import math

from kdvfs.runtime.trials import Judgement
from kdvfs.runtime.types import KdvfsError


def compute_waste_reward(
    time_s: float,
    energy_j: float,
    ref_time_s: float,
    ref_energy_j: float,
    budget: float,
    penalty_scale: float = 1.0,
) -> float:
    """The reward of a measurement (time_s, energy_j) against its reference (module docstring)."""
    if budget <= 0:
        raise KdvfsError(f"slowdown budget must be positive, got {budget:g}")
    if ref_time_s <= 0 or ref_energy_j <= 0:
        raise KdvfsError(
            f"reference must have positive time and energy, got {ref_time_s:g} s, {ref_energy_j:g} J"
        )
    saving = (ref_energy_j - energy_j) / ref_energy_j
    excess = time_s / ref_time_s - 1.0 - budget
    return float(saving - penalty_scale * max(0.0, excess) / budget)


def trial_reward(judgement: Judgement, budget: float, penalty_scale: float = 1.0) -> float:
    """The compute-waste reward of a judged trial's candidate against stock: its step time
    1 + slowdown and energy energy_ratio against stock's 1 and 1. A figure the trial could not
    measure (no block completed: energy; no step of B ran: time) counts as stock's."""
    slowdown = judgement.slowdown if math.isfinite(judgement.slowdown) else 0.0
    energy = judgement.energy_ratio if math.isfinite(judgement.energy_ratio) else 1.0
    return compute_waste_reward(1.0 + slowdown, energy, 1.0, 1.0, budget, penalty_scale)
