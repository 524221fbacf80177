"""The device interfaces: what callers need of a GPU, and of a GPU whose kernels we run.

`Device` is the control and sensing surface every GPU has (NVML on a real card, a model on
the simulated one). `KernelRunner` adds running a kernel ourselves and timing it: the
simulated and replayed devices on a clock they keep, a real card through the recorded ops of
a training step (runtime/op_device.py) on the host's clock. `RunnableDevice` adds what only a
model can give: the noiseless answer that plans are evaluated against (a real card's plans
are evaluated from the table it measured instead: tuner/sweep.py `measured_figures`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from kdvfs.runtime.types import ClockGrid, ClockPair, HostWait, Kernel, Source


@runtime_checkable
class Device(Protocol):
    """Control and sensing of one GPU. Clocks are locked by set_clocks and released to the
    card's own stock behaviour (boost + power cap) by reset_clocks."""

    name: str
    grid: ClockGrid
    source: Source

    def set_clocks(self, pair: ClockPair) -> None:
        """Lock core and memory clocks to a pair of the grid (KdvfsError if it is not)."""

    def reset_clocks(self) -> None:
        """Release locks: back to stock clocks."""

    def energy_j(self) -> float:
        """The cumulative energy counter as the card reports it (it advances in steps)."""

    def temperature_c(self) -> float:
        """GPU temperature."""

    def power_w(self) -> float:
        """Power draw as the card reports it."""

    def throttle_reasons(self) -> frozenset[str]:
        """Active clock-event reasons, e.g. {"sw_power_cap", "hw_thermal"}; empty when none."""

    def power_limit_w(self) -> float:
        """The power limit the card enforces (the operator's cap); math.inf when it has none."""


@runtime_checkable
class KernelRunner(Device, Protocol):
    """A device whose kernels we run ourselves, one at a time, and time.

    Its clock `now_s` advances through run()/idle() (and, on a real card, on its own);
    set_clocks takes effect after `switch_latency_s`, the old clocks running meanwhile.
    """

    energy_update_period_s: float
    switch_latency_s: float

    def now_s(self) -> float:
        """Device time since creation."""

    def run(self, kernel: Kernel, launches: int = 1) -> float:
        """Run `launches` back-to-back launches of a kernel at the clocks in effect; returns
        their elapsed seconds (as CUDA events would report it, with noise)."""

    def idle(self, duration_s: float) -> None:
        """Let time pass with no kernel running."""


@runtime_checkable
class RunnableDevice(KernelRunner, Protocol):
    """A device whose kernels we run ourselves and that knows their noiseless cost (a model:
    simulated or replayed)."""

    def expected(self, kernel: Kernel, pair: ClockPair | None) -> tuple[float, float]:
        """Noiseless (time_s, energy_j) of one launch at a locked pair, or at the reference
        (pair=None: stock auto mode on a simulated card, the highest pair on a table)."""

    def expected_step(
        self,
        items: Sequence[tuple[Kernel, ClockPair | None, float]],
        waits: Sequence[Sequence[tuple[float, ClockPair | None]]] = (),
        rare_idle: Sequence[tuple[float, ClockPair | None]] = (),
        host_waits: Sequence[HostWait] = (),
    ) -> tuple[float, float]:
        """Noiseless (time_s, energy_j) of one training step run over and over: items are
        (kernel, pair, launches); waits: equally likely waits for the job's host each step ends
        with, each as (s, clocks held) parts, or host_waits: the same each as a share of the
        step's kernels' time (as a simulated job waits), and rare_idle: (s, clocks) per step on
        average in long waits (a checkpoint), all included. Unlike a sum of expected(), this is at the
        temperature the step itself settles at (a plan that draws less power runs cooler)."""


def optional_sensor(device: object, name: str, default: object) -> object:
    """The device's sensor `name` read now, or `default` where it has none (a replayed table has
    no temperature)."""
    read = getattr(device, name, None)
    return read() if callable(read) else default
