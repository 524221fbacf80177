"""How a real job's stock step time follows its card's warming: a recording binned in time.

A tuner measures stock first (its reference), on a card still warming. Near its power limit a
warmer card runs a lower SM clock, so the step it settles at is slower than the one measured
first, and a candidate alternated with stock sits at both arms' temperature
(docs/design-step-tuner.md, "A verification reads a plan at both arms' temperature"). This
reads a bare recording of experiments/record_job.py (at stock, read-only):

    python -m kdvfs.experiments.stock_warming --recording data/h200/jobs --job sync

Map, top to bottom:
  Args     every knob, one line each, with its unit
  load     the recording's steps (GPU step time from CUDA events at step starts) and its NVML
           samples (temperature, SM clock, power, power limit)
  binned   per `bin_s` of the recording: the median GPU step time, and the samples' mean
           temperature, SM clock and power
  main     the bins and the change of the median step time from the first bin to the mean of
           the last `last_bins`; prints JSON [measured on a real GPU, at stock]
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import math
from pathlib import Path

import numpy as np

from kdvfs.experiments._json_main import json_main
from kdvfs.runtime.types import KdvfsError


@dataclasses.dataclass
class Args:
    recording: str = "data/h200/jobs"  # the folder of a record_job.py recording
    job: str = "sync"  # the job's name in it (its <job>_steps.csv.gz, <job>_nvml.csv.gz)
    bin_s: float = 30.0  # length of one bin, s
    last_bins: int = 3  # bins averaged as the settled end; bins


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    if not path.is_file():
        raise KdvfsError(f"no recording file {path}")
    with gzip.open(path, "rt") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        raise KdvfsError(f"{path} holds no rows")
    return rows[0], rows[1:]


def _column(header: list[str], rows: list[list[str]], name: str, path: Path) -> np.ndarray:
    if name not in header:
        raise KdvfsError(f"{path} has no column {name!r}")
    i = header.index(name)

    def number(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            return math.nan

    return np.array([number(r[i]) for r in rows])


def load(folder: Path, job: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The steps' start (host s) and GPU step time (s); the samples' time (host s), temperature
    (C), SM clock (MHz) and power (W)."""
    steps_path, nvml_path = folder / f"{job}_steps.csv.gz", folder / f"{job}_nvml.csv.gz"
    header, rows = _rows(steps_path)
    steps = {name: _column(header, rows, name, steps_path) for name in ("host_start_s", "gpu_step_s")}
    header, rows = _rows(nvml_path)
    samples = {
        name: _column(header, rows, name, nvml_path)
        for name in ("host_s", "temperature_c", "sm_mhz", "power_w")
    }
    return steps, samples


def binned(steps: dict[str, np.ndarray], samples: dict[str, np.ndarray], bin_s: float) -> list[dict]:
    start_s = float(steps["host_start_s"][0])
    end_s = float(steps["host_start_s"][-1])
    bins = []
    lo = 0.0
    while start_s + lo < end_s:
        in_steps = (steps["host_start_s"] >= start_s + lo) & (steps["host_start_s"] < start_s + lo + bin_s)
        in_samples = (samples["host_s"] >= start_s + lo) & (samples["host_s"] < start_s + lo + bin_s)
        gpu_s = steps["gpu_step_s"][in_steps]
        gpu_s = gpu_s[np.isfinite(gpu_s)]
        if gpu_s.size and in_samples.any():
            bins.append(
                {
                    "from_s": lo,
                    "steps": int(gpu_s.size),
                    "median_gpu_step_ms": 1e3 * float(np.median(gpu_s)),
                    "temperature_c": float(np.nanmean(samples["temperature_c"][in_samples])),
                    "sm_clock_mhz": float(np.nanmean(samples["sm_mhz"][in_samples])),
                    "power_w": float(np.nanmean(samples["power_w"][in_samples])),
                }
            )
        lo += bin_s
    return bins


def measure(args: Args) -> dict:
    if not (args.bin_s > 0.0 and args.last_bins >= 1):
        raise KdvfsError(f"--bin-s must be > 0 and --last-bins >= 1, got {args.bin_s} and {args.last_bins}")
    steps, samples = load(Path(args.recording), args.job)
    bins = binned(steps, samples, args.bin_s)
    if len(bins) < args.last_bins + 1:
        raise KdvfsError(
            f"the recording spans {len(bins)} bins of {args.bin_s} s: too few for --last-bins {args.last_bins}"
        )
    last = bins[-args.last_bins :]

    def settled(key: str) -> float:
        return float(np.mean([b[key] for b in last]))

    first = bins[0]
    return {
        "source": "measured on a real GPU (a bare recording at stock, read-only)",
        "args": dataclasses.asdict(args),
        "bins": bins,
        "step_time_change": settled("median_gpu_step_ms") / first["median_gpu_step_ms"] - 1.0,
        "temperature_change_c": settled("temperature_c") - first["temperature_c"],
        "sm_clock_change_mhz": settled("sm_clock_mhz") - first["sm_clock_mhz"],
    }


def main(argv: list[str] | None = None) -> None:
    json_main(Args, argv, "stock_warming", __doc__, measure)


if __name__ == "__main__":
    main()
