"""Hold the simulated card against a real one at stock clocks.

- `calibrate` / `calibration_rows`: a stock-clock probe (kernels_stock.csv). Each probe row
  names a kernel whose shape the name carries (probe_kernels.py); the simulated card runs it
  in auto mode at the temperature the probe recorded, and the two are compared: power, SM
  clock and time per call.
- `step_rows` -> `StepRow`: whole training steps recorded on the card (data/h200/steps/: a
  steps_summary.json with each step's measured time and energy from the counter, and the
  kernel trace of its profiled steps in steps_kernels.csv.gz; runtime/recorded_steps.py's
  `recorded_steps` reads them as `RecordedStep`s). Each step's kernels become a `trace:` workload (runtime/trace.py:
  trace_workload: each kernel its recorded duration, the launch gap before it, busy for its
  kind's in-step share) that the simulated card runs at stock, noiselessly at its steady
  temperature (`simulate_step`, expected_step); time and energy per step are compared with the
  measured ones. Where the GPU waits on its host it idles at its boost clocks: for the wait the
  recorded launches give (`launch_paced_wait_s`: each event after its launch by a host that
  issues a step in its measured issue time) where the recording has them, else for its host's
  pace (`host_pace_s`: the profiled trace's time a step less PROFILER_OVERHEAD_S a GPU event)
  less the kernels' time. A trace is sized for the card it was recorded on (recorded_steps.recorded_card).
  Each kernel carries the GPU's idle before it (Kernel.idle_before_s: `launch_paced_gaps_s`, or
  the profiled trace's gaps, trace.idle_gaps_s, scaled to the wait), after which it draws less
  (simulator.after_gap_factor, fitted to AFTER_GAP_FITTED_ON alone). `fit_role`: whether a step
  was fitted (the in-step busy shares, presets.STEP_BUSY_FITTED_ON; the profiler's overhead, to
  time only) or held out.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from kdvfs.runtime.presets import STEP_BUSY_FITTED_ON
from kdvfs.runtime.probe_kernels import parse_probe_kernel
from kdvfs.runtime.recorded_steps import RecordedStep, recorded_steps
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.tables import number, positive, read_csv, require_columns
from kdvfs.runtime.trace import idle_gaps_s, repeating_period, trace_workload
from kdvfs.runtime.types import ClockPair, Workload

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
        energy_at_measured_time_j: the simulated energy of the step where it lasts its
            measured time (the GPU idle at its boost clocks for what its kernels leave of it):
            the card's energy error apart from the host's pace, J.
        wait_source: where the simulated wait on the host came from: "launches" (the
            recorded launches at the host's issue time, launch_paced_wait_s) or "profiled
            span" (host_pace_s).
    """

    shape: str
    kernels: int
    measured_step_s: float
    measured_busy_s: float
    measured_energy_j: float
    measured_power_w: float
    simulated_time_s: float
    simulated_energy_j: float
    energy_at_measured_time_j: float = math.nan
    wait_source: str = "profiled span"

    @property
    def time_error(self) -> float:
        """Simulated time against the measured step, a fraction."""
        return self.simulated_time_s / self.measured_step_s - 1.0

    @property
    def energy_error(self) -> float:
        """Simulated energy against the measured energy per step, a fraction."""
        return self.simulated_energy_j / self.measured_energy_j - 1.0

    @property
    def energy_error_at_measured_time(self) -> float:
        """Simulated energy of the step at its measured time against the measured energy."""
        return self.energy_at_measured_time_j / self.measured_energy_j - 1.0


PROFILER_OVERHEAD_S = 7.66e-6
"""Host time torch.profiler (CPU and CUDA activities) adds a GPU event, s: a profiled trace's time
a step, less this for each of its events, is the pace of the unprofiled host. Fitted to the
recorded steps by experiments/fit_step_power.py (only a step whose GPU waits on its host, the
ResNet-18 at batch 32, constrains it; every GPU-bound step asks only that it exceed ~4.5 us)."""


PROFILER_OVERHEAD_FITTED_ON = ("resnet18_bf16_b32_sgd",)
"""The recorded steps whose time PROFILER_OVERHEAD_S was fitted to (with the busy shares and their
ramp since 2026-12-06: the step's energy fitted too, presets.STEP_BUSY_FITTED_ON)."""


def host_pace_s(workload: Workload, profiler_overhead_s: float = PROFILER_OVERHEAD_S) -> float:
    """The unprofiled host's time a step from a profiled trace workload: its time a step
    (first event's start to last event's end, trace_workload's span_us_per_step) less the
    profiler's overhead for each of its GPU events, s (0 where the trace has no span)."""
    meta = dict(workload.meta)
    span_s = float(meta.get("span_us_per_step", 0.0)) * 1e-6
    return max(0.0, span_s - len(workload.kernels) * profiler_overhead_s)


STEADY_STEPS = 4
"""Steps launch_paced_wait_s runs one after another; the last one's time is the steady pace (a
step that the host delays starts its successor late at most once over)."""


def launch_paced_wait_s(step: RecordedStep, launch_latency_s: float) -> float | None:
    """The GPU's idle time a step, waiting for its host's launches, in steady state (s), from the
    recorded launches: the sum of launch_paced_gaps_s. None where the recording has no
    host_issue_s, an event without its launch, or fewer than two whole steps."""
    gaps_s = launch_paced_gaps_s(step, launch_latency_s)
    return None if gaps_s is None else sum(gaps_s)


def launch_paced_gaps_s(step: RecordedStep, launch_latency_s: float) -> list[float] | None:
    """The GPU's idle time before each GPU event of a step, waiting for its host's launches, in
    steady state (s, one per event of the step in order), from the recorded launches: each GPU
    event starts at the later of its predecessor's end (plus the card's launch latency,
    `launch_latency_s`) and its launch by the host. The launches are the profiled trace's, each
    at its offset from its step's first launch (the mean over the profiled steps), scaled so that
    a step's launches span the host's time to issue it without the profiler (host_issue_s); the
    steps follow one another every host_issue_s, and each event runs its recorded duration (the
    mean over the steps); the last of STEADY_STEPS steps is the steady one. None where the
    recording has no host_issue_s, an event without its launch, or fewer than two whole steps."""
    rows = step.rows
    if step.host_issue_s <= 0.0 or not rows or any("launch_us" not in r.cells for r in rows):
        return None
    period = repeating_period([r.cells["name"] for r in rows])
    steps = len(rows) // period if period else 0
    if steps < 2:
        return None
    launch_s = [float(r.cells["launch_us"]) * 1e-6 for r in rows]
    duration_s = [float(r.cells["duration_us"]) * 1e-6 for r in rows]
    host_span_s = (launch_s[(steps - 1) * period] - launch_s[0]) / (steps - 1)
    if not host_span_s > 0.0:
        return None
    scale = step.host_issue_s / host_span_s
    offsets_s = [
        scale * fmean(launch_s[k * period + i] - launch_s[k * period] for k in range(steps))
        for i in range(period)
    ]
    runs_s = [
        launch_latency_s + fmean(duration_s[k * period + i] for k in range(steps)) for i in range(period)
    ]
    end_s, gaps_s = 0.0, []
    for k in range(STEADY_STEPS):
        gaps_s = []
        for offset_s, run_s in zip(offsets_s, runs_s, strict=True):
            start_s = max(end_s, k * step.host_issue_s + offset_s)
            gaps_s.append(start_s - end_s)
            end_s = start_s + run_s
    return gaps_s


def graph_launch_gap_s(step: RecordedStep) -> float | None:
    """The GPU's gap between kernels of a step replayed as one CUDA graph, s: the median over
    the recorded events of each one's start less its predecessor's end within a replay (at least
    0). None where the step is not a graph replay: an event without its launch, or events of
    one step launched by more than one host call (a graph's events share its launch)."""
    rows = step.rows
    if not rows or any("launch_us" not in r.cells for r in rows):
        return None
    period = repeating_period([r.cells["name"] for r in rows])
    steps = len(rows) // period if period else 0
    replays = [rows[k * period : (k + 1) * period] for k in range(steps)]
    if not replays or any(len({r.cells["launch_us"] for r in replay}) != 1 for replay in replays):
        return None
    gaps_us = sorted(
        max(0.0, float(b.cells["start_us"]) - float(a.cells["start_us"]) - float(a.cells["duration_us"]))
        for replay in replays
        for a, b in itertools.pairwise(replay)
    )
    return gaps_us[len(gaps_us) // 2] * 1e-6 if gaps_us else None


def simulate_step(
    device: SimulatedDevice,
    step: RecordedStep,
    busy_shares: Mapping[str, float] | None = None,
    profiler_overhead_s: float = PROFILER_OVERHEAD_S,
    ramp_s: float | None = None,
) -> StepRow:
    """A recorded step's kernels (a `trace:` workload, each kind busy for its in-step share:
    busy_shares, default the H200 preset's) run at stock on the simulated card, noiselessly at
    their steady temperature, against the measured step. Where the GPU waits on its host it
    idles at its boost clocks (between a running step's kernels the card keeps them: the
    host-bound recordings' SM clock read 1980 MHz throughout), for the wait of the recorded
    launches (launch_paced_wait_s) where the recording has them, else for the host's pace less
    the kernels' time (host_pace_s, the profiled trace's span less `profiler_overhead_s` a GPU
    event) where that is longer. A step replayed as one CUDA graph runs its kernels after the
    graph's own gap between them (graph_launch_gap_s), not the card's launch latency."""
    graph_gap_s = graph_launch_gap_s(step)
    if graph_gap_s is not None:
        device = SimulatedDevice(
            dataclasses.replace(device.preset, launch_latency_s=graph_gap_s),
            noise=0.0,
            ambient_c=device.ambient_c,
            power_cap_w=device.power_cap_w,
        )
    workload = trace_workload(
        step.source, step.shape, step.rows, busy_shares, step.card, ramp_s
    )  # seq: the events' order
    items = [(k, None, k.launches) for k in workload.kernels]
    kernels_s, kernels_j = device.expected_step(items)
    boost = ClockPair(device.preset.max_core_mhz, device.preset.max_mem_mhz)
    latency_s = device.preset.launch_latency_s

    gaps_s, source = launch_paced_gaps_s(step, latency_s), "launches"
    if gaps_s is None or len(gaps_s) != len(items):
        gaps_s, source = idle_gaps_s(step.source, step.rows, latency_s), "profiled span"
        wait_s = host_pace_s(workload, profiler_overhead_s) - kernels_s
    else:
        wait_s = sum(gaps_s)

    def waiting(wait_s: float) -> tuple[float, float]:
        """The step's time and energy where the GPU waits `wait_s` a step, each kernel after its
        share of the wait (the gaps before it, scaled to the wait)."""
        if wait_s <= 0.0:
            return kernels_s, kernels_j
        scale = wait_s / sum(gaps_s) if sum(gaps_s) > 0.0 else 0.0
        after_gaps = [
            (dataclasses.replace(k, idle_before_s=gap_s * scale), pair, n)
            for (k, pair, n), gap_s in zip(items, gaps_s, strict=True)
        ]
        return device.expected_step(after_gaps, waits=[[(wait_s, boost)]])

    time_s, sim_j = waiting(wait_s)
    _, at_measured_j = waiting(step.step_s - kernels_s)
    return StepRow(
        step.shape,
        len(workload.kernels),
        step.step_s,
        step.step_s * step.busy_share,
        step.energy_j,
        step.power_w or step.energy_j / step.step_s,
        time_s,
        sim_j,
        at_measured_j,
        source,
    )


AFTER_GAP_FITTED_ON = "data/h100/gap_power"
"""What the drop of a kernel after an idle gap (presets.AFTER_GAP_*) was fitted to: one H100's GEMMs
launched one at a time after idle gaps, no whole step; every recorded step is held out of it."""
AFTER_GAP_NOTE = (
    f", each kernel drawing less above idle after the GPU's idle before it (fitted to {AFTER_GAP_FITTED_ON}"
    " alone: every step held out of it)"
)
"""What calibrate's header says of the drop after idle gaps, on a card that models it."""


def fit_role(shape: str) -> str:
    """What the recorded step `shape` was to the fit of the in-step model: "fitted" (the busy
    shares were fitted to its time and energy: presets.STEP_BUSY_FITTED_ON), "time fitted" (the
    profiler's overhead to its time, its energy held out: PROFILER_OVERHEAD_FITTED_ON) or "held
    out"."""
    if shape in STEP_BUSY_FITTED_ON:
        return "fitted"
    return "time fitted" if shape in PROFILER_OVERHEAD_FITTED_ON else "held out"


def step_rows(device: SimulatedDevice, folder: Path) -> Iterator[StepRow]:
    """Each recorded step of `folder` (STEPS_SUMMARY, STEPS_KERNELS) simulated at stock."""
    for step in recorded_steps(folder):
        yield simulate_step(device, step)
