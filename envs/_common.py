"""What both environments share: `EnvTarget` (the device they measure on and the workload they
walk, given as registry specs or as objects, the device re-opened under an episode's seed)
and the small helpers of their spaces (`scalar_box`, `scalar`, `positive`).
Why seeding works so: docs/design-envs.md.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.types import KdvfsError, Workload

ABSOLUTE_ZERO_C = -273.15
"""The lowest temperature an observation may hold, deg C (the bound of its Box)."""


class EnvTarget:
    """The env's device and workload.

    A device given as a spec ("sim:a100", "replay:PATH.csv") is opened with seed 0 and
    re-opened, fresh, with the seed of every seeded reset: that makes an episode depend on
    its seed alone. A device given as an object is used as it is: its noise continues from
    where it is, so only a caller who seeds it (and makes a new one per episode) gets
    repeatable episodes.

    Args:
        device: a registry spec (`sim:PRESET`, `replay:CSV`) or a device that runs kernels
            itself; anything else is a KdvfsError.
        workload: a registry spec (`gpt3-xl-layer`, `trace:CSV`, `table`) or a Workload.
        noise: measurement-noise scale of a spec'd device (dimensionless; None: its default);
            must be None for a device object.
    """

    def __init__(self, device: str | RunnableDevice, workload: str | Workload, noise: float | None) -> None:
        if not isinstance(device, str) and noise is not None:
            raise KdvfsError(
                "noise applies to a device opened from a spec; set it on the device object instead"
            )
        self._spec = device if isinstance(device, str) else None
        self._noise = noise
        self.device = (
            _open(device, 0, noise) if isinstance(device, str) else _runnable(device, type(device).__name__)
        )
        self.workload = open_workload(workload, self.device) if isinstance(workload, str) else workload

    def reseed(self, seed: int | None) -> None:
        """Re-open a spec'd device with `seed`; nothing for seed None or a device object."""
        if seed is not None and self._spec is not None:
            self.device = _open(self._spec, seed, self._noise)


def _open(spec: str, seed: int, noise: float | None) -> RunnableDevice:
    return _runnable(open_device(spec, seed=seed, noise=noise), spec)


def _runnable(device: object, what: str) -> RunnableDevice:
    if not isinstance(device, RunnableDevice):
        raise KdvfsError(
            f"device {what!r} cannot run kernels itself: use a simulated (sim:) or replayed (replay:) device"
        )
    return device


def scalar_box(low: float) -> spaces.Box:
    """A one-element float32 Box from `low` up."""
    return spaces.Box(low, np.inf, (1,), np.float32)


def scalar(value: float) -> np.ndarray:
    return np.array([value], dtype=np.float32)


def positive(name: str, value: float) -> None:
    if not value > 0:
        raise KdvfsError(f"{name} must be positive, got {value:g}")
