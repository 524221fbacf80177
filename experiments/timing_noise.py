"""Timed-run noise of a simulated card, as a tuner measuring in training sees it.

Two figures, beside the real H200's (data/h200-window-noise/README.md: 0.15% for
the mean step time over 1 s):
- `step_cv_per_root_s`: a stock job's steps (runtime/steps.py SimulatedJob), their mean time
  over consecutive 1-s windows, CV across windows (relative s.d. x sqrt(1 s));
- `group_window_sd`: one group's time over consecutive 2-s windows of a schedule that leaves
  one group at stock (capped) among locked ones, run as tests/tuner/test_drift.py runs it
  (StepRunner: one step kernel by kernel, the rest fast-forwarded), relative s.d.

    python -m kdvfs.experiments.timing_noise --device sim:h200 [--workload gpt3-xl-layer]
        [--seconds 60] [--windows 100] [--seed 0]

Prints JSON [simulated].
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

import numpy as np

from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule, StepRunner
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.runtime.types import ClockPair

SETTLE_S = 120.0
"""Device seconds run before measuring, so that the card sits at its training temperature, s."""
STEP_WINDOW_S = 1.0
"""Window over which steps' times are averaged, s (the README's 1-s figure)."""
GROUP_WINDOW_S = 2.0
"""Window over which a group's time is measured, s (the tuner's windows)."""


def mixed_schedule(grid_pairs: list[ClockPair], kernels: int) -> Schedule:
    """Four groups: a low pair, stock (capped), a middle pair, the low pair again (the drift
    test's schedule, on the card's own grid)."""
    mems = sorted({p.mem_mhz for p in grid_pairs})
    top = [p for p in grid_pairs if p.mem_mhz == mems[-1]]
    low = min(top, key=lambda p: abs(p.core_mhz - 900))
    mid = min(top, key=lambda p: abs(p.core_mhz - 1200))
    cuts = [0, round(kernels * 11 / 44), round(kernels * 30 / 44), round(kernels * 36 / 44)]
    return Schedule(((cuts[0], low), (cuts[1], None), (cuts[2], mid), (cuts[3], low)))


def step_cv(device_spec: str, workload_spec: str, seconds: float, seed: int) -> dict:
    """CV of the mean step time over consecutive 1-s windows of a stock job."""
    job = SimulatedJob(open_device(device_spec, seed=seed), open_workload(workload_spec))
    job.runner.run(Schedule.stock(), max(1, int(SETTLE_S / job.runner.run(Schedule.stock(), 1)[1])))
    start_s = job.seconds
    windows: dict[int, list[float]] = {}
    while job.seconds - start_s < seconds:
        report = job.step(Schedule.stock())
        windows.setdefault(int((report.end_s - start_s) / STEP_WINDOW_S), []).append(report.step_time_s)
    means = np.array([np.mean(v) for _, v in sorted(windows.items())][:-1])  # the last one is cut short
    return {
        "windows": len(means),
        "mean_step_ms": float(means.mean() * 1e3),
        "step_cv_per_root_s": float(means.std(ddof=1) / means.mean() * math.sqrt(STEP_WINDOW_S)),
    }


def group_sd(device_spec: str, workload_spec: str, windows: int, seed: int) -> dict:
    """Relative s.d. of each group's time over consecutive 2-s windows of a mixed schedule."""
    device = open_device(device_spec, seed=seed)
    workload = open_workload(workload_spec)
    runner = StepRunner(device, workload)
    schedule = mixed_schedule(list(device.grid.pairs), len(workload))
    starts = [s for s, _ in schedule.groups] + [len(workload)]
    spans = list(itertools.pairwise(starts))
    step_s = runner.run(schedule, 1)[1]
    steps = max(1, int(GROUP_WINDOW_S / step_s))
    runner.run(schedule, int(SETTLE_S / step_s))
    values = np.array(
        [
            [float(times[a:b].sum()) for a, b in spans]
            for times, _ in (runner.run(schedule, steps) for _ in range(windows))
        ]
    )
    sd = values.std(axis=0, ddof=1) / values.mean(axis=0)
    return {"windows": windows, "schedule": str(schedule), "group_sd": [float(x) for x in sd]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="sim:h200")
    p.add_argument("--workload", default="gpt3-xl-layer")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--windows", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    doc = {
        "source": "simulated",
        "device": args.device,
        "workload": args.workload,
        "seed": args.seed,
        "steps": step_cv(args.device, args.workload, args.seconds, args.seed),
        "groups": group_sd(args.device, args.workload, args.windows, args.seed),
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
