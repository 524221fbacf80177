"""ReplayDevice: a device that answers from a recorded measurement table.

Kernels run at the recorded (time_s, energy_j) of their clock pair, with optional noise,
a clock-switch latency and an NVML-like stepped energy counter (all from ModelDevice).
Stock clocks ("auto") cannot be replayed from a table, so the reference is the table's
highest clock pair, as architecture.md prescribes for recorded tables. Idle power
(`idle_power_at`) is the table's lowest recorded power, whatever the clocks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.tables import MeasurementTable, load_table
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel, Source

NOT_RECORDED_TEMPERATURE_C = 60.0
"""Tables record no temperature: a constant, typical of a loaded card, stands in for it."""


class ReplayDevice(ModelDevice):
    """Replays a MeasurementTable; figures it gives are "replayed".

    noise is a relative standard deviation: energy gets `noise`, time `noise / 4`, the ratio
    a real card shows (time ~0.5 %, energy ~2 %); ModelDevice draws it once per second of
    device time, so launches close together share it. Idle power is the lowest average power of
    any recorded cell: the table holds no idle reading, and that is the closest the data
    comes to it (an upper bound: the card drew at least that little while running a kernel).

    Args:
        table: the recorded measurements.
        noise: relative s.d. of energy (time gets a quarter of it); 0: the recorded values.
        seed: seeds the noise.
        energy_update_period_s: how often the energy counter advances, s.
        switch_latency_s: time from a clock request to the new clocks, s.
    """

    source: Source = "replayed"

    def __init__(
        self,
        table: MeasurementTable,
        *,
        noise: float = 0.0,
        seed: int = 0,
        energy_update_period_s: float = 0.1,
        switch_latency_s: float = 0.0,
    ) -> None:
        if noise < 0:
            raise KdvfsError(f"replay noise must be >= 0, got {noise:g}")
        super().__init__(
            table.name,
            table.grid,
            energy_update_period_s=energy_update_period_s,
            switch_latency_s=switch_latency_s,
            time_noise=noise / 4,
            energy_noise=noise,
            seed=seed,
        )
        self.table = table
        self._idle_w = table.lowest_power_w

    @classmethod
    def from_csv(cls, path: str | Path, **kwargs: Any) -> ReplayDevice:
        """A ReplayDevice over the table at `path` (canonical or NV-DVFS CSV)."""
        return cls(load_table(path), **kwargs)

    def temperature_c(self) -> float:
        """Not recorded: the constant NOT_RECORDED_TEMPERATURE_C."""
        return NOT_RECORDED_TEMPERATURE_C

    def power_limit_w(self) -> float:
        """A table records no power limit: math.inf."""
        return math.inf

    def throttle_reasons(self) -> frozenset[str]:
        """A table records no throttling: always empty."""
        return frozenset()

    def _launch_cost(self, kernel: Kernel, pair: ClockPair | None) -> tuple[float, float]:
        return self.table.cost(kernel.name, self.grid.highest() if pair is None else pair)

    def idle_power_at(self, pair: ClockPair | None, temp_c: float | None = None) -> float:
        """Power with no kernel running, W: the table's lowest recorded power whatever the clocks
        and temperature (the table holds no idle reading; see the class).

        Args:
            pair: the clocks held, or None for stock (the same figure).
            temp_c: the card's temperature, C (not recorded: ignored).
        """
        return self._idle_w

    def _idle_power_w(self) -> float:
        return self.idle_power_at(self._clocks)
