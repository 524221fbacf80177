"""Whole training steps recorded on a real card, read from their folder.

A folder of recorded steps (experiments/record_step_shapes.py writes it): STEPS_SUMMARY, each
step's measured time and energy from the counter; STEPS_KERNELS, the kernel trace of its
profiled steps (with each event's launch and grid where recorded); STEPS_GRIDS, the launch
shapes recorded apart, matched to the kernels by their names in order.

- `RecordedStep`, `recorded_steps`: the folder's steps, each with its trace rows and figures;
- `recorded_card`: the preset of the card a recording names;
- `recorded_step_workload`: one step's kernels as a Workload (`step:DIR:SHAPE`), sized for the
  card it was recorded on, busy as runtime/trace.py's in-step model gives them.

tuner/calibration.py holds them against the simulated card; runtime/registry.py opens a step
as a workload.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path

from kdvfs.runtime.presets import PRESETS
from kdvfs.runtime.tables import CsvRow
from kdvfs.runtime.trace import repeating_period, trace_workload
from kdvfs.runtime.types import KdvfsError, Workload

#: The files of a folder of recorded steps (experiments/record_step_shapes.py writes them).
STEPS_SUMMARY = "steps_summary.json"
STEPS_KERNELS = "steps_kernels.csv.gz"
#: The launch shapes of the recorded steps' GPU events (record_step_shapes.py --grids-only 1),
#: where recorded: each kernel's blocks per SM, matched to the kernels by their names in order.
STEPS_GRIDS = "steps_grids.csv.gz"
#: Columns of STEPS_KERNELS read where present (recorded since 2026-12-06): each event's launch
#: by the host and its grid's blocks per SM.
OPTIONAL_KERNEL_COLUMNS = ("launch_us", "blocks_per_sm")


@dataclass(frozen=True)
class RecordedStep:
    """One training step recorded on a real card.

    Attributes:
        shape: the step's name in the recording.
        source: the file its kernel trace came from (named in errors).
        rows: its GPU events (cells seq, name, start_us, duration_us; seq in trace order;
            blocks_per_sm where the folder's STEPS_GRIDS matched them).
        step_s: the step's measured time, s.
        energy_j: its measured energy, J.
        busy_share: the profiled GPU-busy share of its time (1.0 where not recorded).
        power_w: its measured mean power, W.
        host_issue_s: the host's time to issue one step to an idle GPU, without the profiler,
            s (0.0 where not recorded).
        card: the preset of the card it was recorded on (the recording's GPU name; the H200
            where the recording names none), whose simulated twin runs each kernel its recorded
            duration.
    """

    shape: str
    source: Path
    rows: tuple[CsvRow, ...]
    step_s: float
    energy_j: float
    busy_share: float = 1.0
    power_w: float = 0.0
    host_issue_s: float = 0.0
    card: str = "h200"


def recorded_steps(folder: Path) -> list[RecordedStep]:
    """The recorded steps of `folder` (STEPS_SUMMARY, STEPS_KERNELS), in the summary's order;
    a shape the recorder could not run (its entry holds an "error") is left out."""
    summary_path, kernels_path = folder / STEPS_SUMMARY, folder / STEPS_KERNELS
    for path in (summary_path, kernels_path):
        if not path.is_file():
            raise KdvfsError(f"recorded steps {folder}: no {path.name} there (a folder of recorded steps)")
    try:
        summary = json.loads(summary_path.read_text())
        shapes = summary["shapes"]
        gpu = summary.get("gpu")
        card = recorded_card(str(gpu.get("gpu_name", "")) if isinstance(gpu, dict) else "")
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
                    **{c: row[c] for c in OPTIONAL_KERNEL_COLUMNS if row.get(c)},
                }
                if "launch_us" in cells and not math.isfinite(float(cells["launch_us"])):
                    raise ValueError(f"line {reader.line_num}: launch_us {cells['launch_us']!r}")
                rows.append(CsvRow(len(rows) + 1, reader.line_num, cells))
    except (OSError, ValueError, KeyError, TypeError, EOFError) as e:
        raise KdvfsError(f"recorded steps {folder}: unreadable recording ({type(e).__name__}: {e})") from None
    steps = []
    for entry in shapes:
        if "error" in entry:
            continue  # the recorder could not run this shape: its entry holds why, and no figures
        try:
            shape = str(entry["shape"])
            step_s, energy_j = float(entry["step_s"]), float(entry["energy_per_step_j"])
            busy = float(entry.get("gpu_busy_share", 1.0))
            power_w = float(entry.get("counter_power_w", 0.0))
            issue_s = float(entry.get("host_issue_s", 0.0))
        except (KeyError, TypeError, ValueError) as e:
            raise KdvfsError(f"recorded steps {folder}: a step in {STEPS_SUMMARY} lacks {e}") from None
        if not (math.isfinite(step_s) and step_s > 0 and math.isfinite(energy_j) and energy_j > 0):
            raise KdvfsError(f"recorded steps {folder}: step {shape!r} has no positive time and energy")
        power_w = power_w or energy_j / step_s
        if shape not in events:
            raise KdvfsError(f"recorded steps {folder}: step {shape!r} has no kernels in {STEPS_KERNELS}")
        if not (math.isfinite(issue_s) and issue_s >= 0):
            raise KdvfsError(f"recorded steps {folder}: step {shape!r} has a host_issue_s of {issue_s!r}")
        rows = tuple(events[shape])
        steps.append(RecordedStep(shape, kernels_path, rows, step_s, energy_j, busy, power_w, issue_s, card))
    grids = _launch_shapes(folder / STEPS_GRIDS)
    return [_with_grids(step, grids.get(step.shape, [])) for step in steps]


def recorded_card(gpu_name: str) -> str:
    """The preset whose GPU name is `gpu_name` ("h200" where none is)."""
    return next((name for name, p in PRESETS.items() if p.gpu_name == gpu_name), "h200")


def _launch_shapes(path: Path) -> dict[str, list[tuple[str, str]]]:
    """shape -> its profiled GPU events' (name, blocks per SM) in order ({} without the file)."""
    if not path.is_file():
        return {}
    try:
        with gzip.open(path, "rt", newline="") as f:
            grids: dict[str, list[tuple[str, str]]] = {}
            for row in csv.DictReader(f):
                grids.setdefault(row["shape"], []).append((row["name"], row["blocks_per_sm"]))
    except (OSError, ValueError, KeyError, TypeError, EOFError) as e:
        raise KdvfsError(f"{path}: unreadable launch shapes ({type(e).__name__}: {e})") from None
    return grids


def _with_grids(step: RecordedStep, grids: list[tuple[str, str]]) -> RecordedStep:
    """The step with each kernel's blocks per SM, where its events' names repeat the launch
    shapes' sequence (profiled apart: matched position by position over that sequence's
    period); unchanged where they do not."""
    names = [n for n, _ in grids]
    period = repeating_period(names)
    rows = step.rows
    if any("blocks_per_sm" in r.cells for r in rows):
        return step  # recorded with its kernels
    if not period or any(r.cells["name"] != names[i % period] for i, r in enumerate(rows)):
        return step
    with_grid = tuple(
        CsvRow(r.row, r.line, {**r.cells, "blocks_per_sm": grids[i % period][1]}) for i, r in enumerate(rows)
    )
    return dataclasses.replace(step, rows=with_grid)


def recorded_step_workload(folder: Path, shape: str) -> Workload:
    """The recorded step `shape` of `folder` as a Workload: its kernels in order, each its
    recorded duration on the card it was recorded on (runtime/trace.py trace_workload, grids
    matched); a one-line KdvfsError naming the folder's steps where it has no such step."""
    steps = {step.shape: step for step in recorded_steps(folder)}
    if shape not in steps:
        raise KdvfsError(
            f"workload step:{folder}:{shape}: no such recorded step (the folder has {', '.join(steps) or 'none'})"
        )
    step = steps[shape]
    return trace_workload(step.source, step.shape, step.rows, card=step.card)
