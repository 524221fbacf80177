"""The device interfaces: what callers need of a GPU, and of a GPU whose kernels we run.

`Device` is the control and sensing surface every GPU has (NVML on a real card, a model on
the simulated one). `RunnableDevice` adds what only the simulated and replayed devices can do:
run a kernel themselves on a clock that they keep, and give their noiseless answer, which is
what plans are evaluated against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from kdvfs.runtime.types import ClockGrid, ClockPair, Kernel, Source


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
class RunnableDevice(Device, Protocol):
    """A device whose kernels we run ourselves (simulated or replayed).

    Its clock `now_s` advances only through run()/idle(); set_clocks takes effect after
    `switch_latency_s`, the old clocks running meanwhile.
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

    def expected(self, kernel: Kernel, pair: ClockPair | None) -> tuple[float, float]:
        """Noiseless (time_s, energy_j) of one launch at a locked pair, or at the reference
        (pair=None: stock auto mode on a simulated card, the highest pair on a table)."""

    def expected_iteration(
        self, items: Sequence[tuple[Kernel, ClockPair | None, float]]
    ) -> tuple[float, float]:
        """Noiseless (time_s, energy_j) of one training iteration run over and over: items are
        (kernel, pair, launches). Unlike a sum of expected(), this is at the temperature the
        iteration itself settles at (a plan that draws less power runs cooler)."""
