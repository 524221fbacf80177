"""Detection delay of the drift watch's CUSUM, with and without confirmation.

One stream of Gaussian residuals (sd 1%) learns its baseline over 200 windows, then shifts
by `shift` s.d.; the windows until drift.DriftMonitor reports it are counted, per seed. With
confirm=N an alarm counts only when the stream alarms again within its next N windows
(tuner/step_tuner.py uses WATCH_CONFIRM_WINDOWS). Also counted: bursts of `burst` wild windows (+4%,
a kernel run at the wrong pair) on a stable stream, reported or not.

    python -m kdvfs.experiments.cusum_delay [--seeds 200]

Prints JSON. Synthetic: no device is involved.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from kdvfs.tuner.drift import DriftMonitor
from kdvfs.tuner.step_tuner import WATCH_CONFIRM_WINDOWS

SD = 0.01
"""S.d. of a window's residual, relative (1 %)."""
BASELINE_WINDOWS = 200
"""Windows the monitor learns its baseline from before the shift."""
MAX_WINDOWS = 300
"""Windows after the shift within which a report counts."""


def delay(shift_sd: float, confirm: int, seed: int) -> int | None:
    """Windows from the shift until the monitor reports it (None: not within MAX_WINDOWS)."""
    rng = np.random.default_rng(seed)
    monitor = DriftMonitor(["g"], confirm=confirm)
    for _ in range(BASELINE_WINDOWS):
        monitor.update({"g": 1.0 + SD * rng.standard_normal()}, {"g": 1.0})
    for i in range(MAX_WINDOWS):
        if monitor.update({"g": 1.0 + SD * (shift_sd + rng.standard_normal())}, {"g": 1.0}):
            return i + 1
    return None


def burst_reported(burst: int, confirm: int, seed: int) -> bool:
    """A stable stream with `burst` consecutive +4% windows: is anything reported?"""
    rng = np.random.default_rng(seed)
    monitor = DriftMonitor(["g"], confirm=confirm)
    xs = SD * rng.standard_normal(BASELINE_WINDOWS + 2 * MAX_WINDOWS)
    xs[BASELINE_WINDOWS : BASELINE_WINDOWS + burst] += 0.04
    return any(monitor.update({"g": 1.0 + x}, {"g": 1.0}) for x in xs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=200)
    args = p.parse_args()
    seeds = range(args.seeds)
    doc: dict = {
        "source": "synthetic",
        "seeds": args.seeds,
        "sd": SD,
        "delay_windows": {},
        "burst_reported": {},
    }
    for confirm in (0, WATCH_CONFIRM_WINDOWS):
        for shift_sd in (1.5, 2.0, 3.0, 5.0):
            delays = [delay(shift_sd, confirm, s) for s in seeds]
            found = [d for d in delays if d is not None]
            doc["delay_windows"][f"confirm={confirm},shift={shift_sd}sd"] = {
                "median": float(np.median(found)) if found else None,
                "p90": float(np.percentile(found, 90)) if found else None,
                "missed": delays.count(None),
            }
        for burst in (2, 3, 4):
            doc["burst_reported"][f"confirm={confirm},burst={burst}"] = sum(
                burst_reported(burst, confirm, s) for s in seeds
            )
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
