"""Drift scenarios on the simulated device: what changes under a settled plan, and when.

Each scenario is a change to the simulated job that lands after `at_step` training
steps have run:
- ambient-step: the inlet air warms by 15 C (the card heats up, leaks more, may throttle);
- power-cap: the operator lowers the power limit to 5/7 of it (h200: 700 -> 500 W);
- gpu-swap: the job restarts on another card (h200 <-> h100, rtx3080ti <-> a100): a new device;
- workload-change: the batch size doubles (the kernels' sizes, hence the workload signature).
The card is changed in place where it stays the same card (ambient, cap), as an operator
would; a swap returns a new device. A loop running chunks of steps cuts its chunk at the
change (Scenario.steps_before) and applies it when it is due (Scenario.due).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kdvfs.runtime.presets import FAST_SWITCH_SUFFIX
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import KdvfsError, Workload
from kdvfs.runtime.workloads import gpt3_xl_layer

AMBIENT_STEP_C = 15.0
"""How much the inlet air warms in ambient-step, deg C."""
POWER_CAP_FACTOR = 500.0 / 700.0
"""The lowered power limit of power-cap, as a fraction of the card's (h200: 700 -> 500 W)."""
SWAP_PARTNER = {"h200": "h100", "h100": "h200", "rtx3080ti": "a100", "a100": "rtx3080ti"}
"""The card a job restarts on: the same family where there is one (H200 -> H100: same core,
slower memory with a single clock), else the other generation."""

Change = Callable[[SimulatedDevice, Workload, int], tuple[SimulatedDevice, Workload]]
"""(device, workload, seed for a new device) -> the device and workload after the change."""


@dataclass(frozen=True)
class Scenario:
    """A named change to the simulated job, landing after at_step training steps."""

    name: str
    summary: str
    change: Change
    at_step: int = 0

    def at(self, step: int) -> Scenario:
        """The same change, landing after `step` steps."""
        if step < 0:
            raise KdvfsError(f"scenario {self.name}: step {step} is negative")
        return replace(self, at_step=step)

    def steps_before(self, done: int, n: int) -> int:
        """How many of the next n steps to run so that a chunk stops at the change."""
        return min(n, self.at_step - done) if done < self.at_step else n

    def due(self, done_before: int, done: int) -> bool:
        """The change lands in the steps (done_before, done] just run."""
        return done_before < self.at_step <= done

    def apply(
        self, device: SimulatedDevice, workload: Workload, *, seed: int = 0
    ) -> tuple[SimulatedDevice, Workload]:
        """Make the change now; seed seeds a new device (gpu-swap)."""
        return self.change(device, workload, seed)


def _ambient_step(device: SimulatedDevice, workload: Workload, seed: int) -> tuple[SimulatedDevice, Workload]:
    device.set_ambient_c(device.ambient_c + AMBIENT_STEP_C)
    return device, workload


def _power_cap(device: SimulatedDevice, workload: Workload, seed: int) -> tuple[SimulatedDevice, Workload]:
    device.set_power_cap_w(round(device.power_cap_w * POWER_CAP_FACTOR))
    return device, workload


def _gpu_swap(device: SimulatedDevice, workload: Workload, seed: int) -> tuple[SimulatedDevice, Workload]:
    base = device.preset_name.removesuffix(FAST_SWITCH_SUFFIX)
    if base not in SWAP_PARTNER:
        raise KdvfsError(
            f"gpu-swap: no card to swap preset {device.preset_name!r} for (known: {', '.join(SWAP_PARTNER)})"
        )
    partner = SWAP_PARTNER[base] + device.preset_name[len(base) :]
    p = device.preset
    # the same noise scale and the same choice of grid (full, or the preset's search grid)
    full_grid = p.search_core_mhz is not None and len(device.grid) == len(p.core_levels_mhz) * len(
        p.mem_levels_mhz
    )
    return SimulatedDevice(
        partner, seed=seed, noise=device.time_noise / p.time_noise, full_grid=full_grid
    ), workload


def _workload_change(
    device: SimulatedDevice, workload: Workload, seed: int
) -> tuple[SimulatedDevice, Workload]:
    meta = dict(workload.meta)
    if workload.name != "gpt3-xl-layer" or not {"batch", "seq", "d_model", "heads"} <= meta.keys():
        raise KdvfsError(
            f"workload-change: workload {workload.name!r} cannot be rebuilt at another batch size "
            "(only gpt3-xl-layer workloads say theirs)"
        )
    dims = {key: int(meta[key]) for key in ("batch", "seq", "d_model", "heads")}
    return device, gpt3_xl_layer(**{**dims, "batch": 2 * dims["batch"]})


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("ambient-step", f"inlet air +{AMBIENT_STEP_C:.0f} C", _ambient_step),
        Scenario("power-cap", "power limit lowered to 5/7 (h200: 700 -> 500 W)", _power_cap),
        Scenario(
            "gpu-swap", "the job restarts on another card (h200 <-> h100, rtx3080ti <-> a100)", _gpu_swap
        ),
        Scenario("workload-change", "batch size doubles", _workload_change),
    )
}


def get_scenario(name: str, at_step: int = 0) -> Scenario:
    """A scenario by name, landing after at_step steps."""
    if name not in SCENARIOS:
        raise KdvfsError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    return SCENARIOS[name].at(at_step)
