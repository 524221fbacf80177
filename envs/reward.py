"""The compute-waste reward both environments pay (`compute_waste_reward`): relative energy
saved against the reference, less a penalty that grows with the slowdown beyond the budget.

    reward = (E_ref - E) / E_ref  -  penalty_scale * max(0, T / T_ref - 1 - budget) / budget

Within the budget the reward is the plain relative saving (0 at the reference, up to 1);
a slowdown of 2 x budget pays penalty_scale. Why this shape: docs/design-envs.md.
"""

from __future__ import annotations

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
