"""Hold the simulated card against a real one at stock clocks.

- `calibrate` / `calibration_rows`: a stock-clock probe (kernels_stock.csv). Each probe row
  names a kernel whose shape the name carries (probe_kernels.py); the simulated card runs it
  in auto mode at the temperature the probe recorded, and the two are compared: power, SM
  clock and time per call.
- `step_rows` -> `StepRow`: whole training steps recorded on the card (data/h200/steps/: a
  steps_summary.json with each step's measured time and energy from the counter, and the
  kernel trace of its profiled steps in steps_kernels.csv.gz). Each step's kernels become a
  `trace:` workload (runtime/trace.py: trace_workload) that the simulated card runs at stock,
  noiselessly at its steady temperature (`expected_step`); time and energy per step are
  compared with the measured ones.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kdvfs.runtime.probe_kernels import parse_probe_kernel
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.tables import CsvRow, number, positive, read_csv, require_columns
from kdvfs.runtime.trace import trace_workload
from kdvfs.runtime.types import KdvfsError

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


# --- whole training steps --------------------------------------------------------------------
#: The files of a folder of recorded steps (experiments/record_step_shapes.py writes them).
STEPS_SUMMARY = "steps_summary.json"
STEPS_KERNELS = "steps_kernels.csv.gz"


@dataclass(frozen=True)
class StepRow:
    """One recorded training step against the simulated card's run of its kernels.

    Attributes:
        shape: the step's name in the recording.
        kernels: kernels of one step in the trace (load_trace's period).
        measured_step_s: the step's time (window / steps), s.
        measured_busy_s: its GPU-busy part (x the profiled busy share), s.
        measured_energy_j: its energy from the counter, J.
        measured_power_w: the counter's mean power, W.
        simulated_time_s: the simulated card's time of the step's kernels back to back, s.
        simulated_energy_j: their energy, J.
    """

    shape: str
    kernels: int
    measured_step_s: float
    measured_busy_s: float
    measured_energy_j: float
    measured_power_w: float
    simulated_time_s: float
    simulated_energy_j: float

    @property
    def time_error(self) -> float:
        """Simulated time against the measured step, a fraction."""
        return self.simulated_time_s / self.measured_step_s - 1.0

    @property
    def energy_error(self) -> float:
        """Simulated energy against the measured energy per step, a fraction."""
        return self.simulated_energy_j / self.measured_energy_j - 1.0


def step_rows(device: SimulatedDevice, folder: Path) -> Iterator[StepRow]:
    """Each recorded step of `folder` (STEPS_SUMMARY, STEPS_KERNELS) simulated at stock."""
    summary_path, kernels_path = folder / STEPS_SUMMARY, folder / STEPS_KERNELS
    for path in (summary_path, kernels_path):
        if not path.is_file():
            raise KdvfsError(f"--against-steps {folder}: no {path.name} there (a folder of recorded steps)")
    try:
        shapes = json.loads(summary_path.read_text())["shapes"]
        with gzip.open(kernels_path, "rt", newline="") as f:
            events: dict[str, list[CsvRow]] = {}
            reader = csv.DictReader(f)
            for row in reader:
                rows = events.setdefault(row["shape"], [])
                cells = {
                    "seq": str(len(rows)),
                    "name": row["name"],
                    "start_us": row["start_us"],
                    "duration_us": row["duration_us"],
                }
                rows.append(CsvRow(len(rows) + 1, reader.line_num, cells))
    except (OSError, ValueError, KeyError, TypeError, EOFError) as e:
        raise KdvfsError(
            f"--against-steps {folder}: unreadable recording ({type(e).__name__}: {e})"
        ) from None
    for entry in shapes:
        try:
            shape = str(entry["shape"])
            step_s, energy_j = float(entry["step_s"]), float(entry["energy_per_step_j"])
            busy = float(entry.get("gpu_busy_share", 1.0))
            power_w = float(entry.get("counter_power_w", energy_j / step_s))
        except (KeyError, TypeError, ValueError) as e:
            raise KdvfsError(f"--against-steps {folder}: a step in {STEPS_SUMMARY} lacks {e}") from None
        if not (math.isfinite(step_s) and step_s > 0 and math.isfinite(energy_j) and energy_j > 0):
            raise KdvfsError(f"--against-steps {folder}: step {shape!r} has no positive time and energy")
        if shape not in events:
            raise KdvfsError(f"--against-steps {folder}: step {shape!r} has no kernels in {STEPS_KERNELS}")
        workload = trace_workload(kernels_path, shape, events[shape])  # seq: the events' order
        time_s, sim_j = device.expected_step([(k, None, k.launches) for k in workload.kernels])
        yield StepRow(shape, len(workload.kernels), step_s, step_s * busy, energy_j, power_w, time_s, sim_j)
