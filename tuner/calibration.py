"""Hold the simulated card against a stock-clock probe of a real one (kernels_stock.csv).

Each probe row names a kernel whose shape the name carries (probe_kernels.py); the simulated
card runs it in auto mode at the temperature the probe recorded, and the two are compared:
power, SM clock and time per call.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kdvfs.runtime.probe_kernels import parse_probe_kernel
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.tables import number, positive, read_csv, require_columns

#: Columns a probe table must have.
REQUIRED = ("kernel", "per_call_us", "avg_power_W", "sm_clock_median", "temp_end")


@dataclass(frozen=True)
class CalibrationRow:
    kernel: str
    measured_power_w: float
    simulated_power_w: float
    measured_sm_mhz: float
    simulated_sm_mhz: float
    measured_time_s: float
    simulated_time_s: float
    capped: bool

    def rel_error(self, field: str) -> float:
        measured = getattr(self, f"measured_{field}")
        return getattr(self, f"simulated_{field}") / measured - 1.0


def calibrate(device: SimulatedDevice, probe_csv: Path) -> list[CalibrationRow]:
    """The simulated card against every row of a probe table, in its order."""
    return list(calibration_rows(device, probe_csv))


def calibration_rows(device: SimulatedDevice, probe_csv: Path) -> Iterator[CalibrationRow]:
    """calibrate's rows one by one (an interrupted calibration keeps the rows it has)."""
    header, rows = read_csv(probe_csv)
    require_columns(probe_csv, header, REQUIRED)
    for row in rows:
        probe = parse_probe_kernel(row.cells["kernel"])
        kernel = probe.kernel()
        temp_c = number(probe_csv, row, "temp_end")
        op = device.point(kernel, None, temp_c)
        yield (
            CalibrationRow(
                kernel=probe.name,
                measured_power_w=positive(probe_csv, row, "avg_power_W"),
                simulated_power_w=op.power_w,
                measured_sm_mhz=positive(probe_csv, row, "sm_clock_median"),
                simulated_sm_mhz=op.core_mhz,
                measured_time_s=positive(probe_csv, row, "per_call_us") * 1e-6,
                simulated_time_s=op.time_s,
                capped=op.capped,
            )
        )
