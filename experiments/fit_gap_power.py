"""Fit what a kernel draws after an idle gap, from an H100's gap-power recording.

    python -m kdvfs.experiments.fit_gap_power [--recording DIR] [--out FILE]     (CPU, ~5 s)

Map, top to bottom:
  Args          every knob, one line each, with its unit
  idle_w        the card's idle power at 1980 MHz: the energy counter over the recording's idle
                tail (after its last launch and the reported power's 1-s lag), at its temperature
  gemm_runs     the recording's bf16 GEMM runs launched one at a time (not back to back) and not
                held by the power cap: per run the idle gap before each launch (the launch cycle
                less the simulated kernel's time at 1980 MHz) and its energy above idle per launch
                (the counter's power less the idle power at the run's temperature, over the cycle)
  after_gap     the model: energy above idle per launch = E0 x (1 - drop x (1 - exp(-gap / tau))),
                one E0 per GEMM size, drop and tau shared (simulator.after_gap_factor)
  main          weighted least squares (each run's weight: the idle power's uncertainty over its
                cycle), E0 against the simulated H100's energy above idle back to back; prints JSON
The add kernel's runs are left out: beyond 20-us gaps its power above idle (under 7 W) is within
the idle power's uncertainty. presets.H100 / H200 after_gap_* cite this run; the model:
docs/design-runtime.md, "A kernel after an idle gap".
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from kdvfs.experiments.record_job import parse_fields
from kdvfs.runtime.presets import get_preset
from kdvfs.runtime.probe_kernels import parse_probe_kernel
from kdvfs.runtime.simulator import idle_power_w, operating_point
from kdvfs.runtime.tables import REPO_DATA_DIR
from kdvfs.runtime.types import KdvfsError


@dataclasses.dataclass
class Args:
    recording: str = ""  # the gap-power recording's folder; "": the checkout's data/h100/gap_power
    preset: str = "h100"  # the simulated card whose kernels' times and leakage the fit uses
    idle_lag_s: float = 1.2  # the idle tail starts this long after the last launch (reported power's lag); s
    idle_sigma_w: float = 2.0  # uncertainty of the idle power under a run; W
    most_throttled: float = (
        0.05  # a run throttled for more of its samples is held by the cap: left out; share
    )
    out: str = ""  # also write the JSON here


def idle_w(samples: Path, stop_s: float, lag_s: float) -> tuple[float, float]:
    """(power, temperature) of the card idle at its boost clock: the energy counter's mean power
    from `lag_s` after the last launch (`stop_s`, host seconds) to the recording's end, W and C."""
    with gzip.open(samples, "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f) if float(r["host_s"]) >= stop_s + lag_s]
    changes = [rows[0]] + [b for a, b in itertools.pairwise(rows) if b["energy_mj"] != a["energy_mj"]]
    if len(changes) < 3:
        raise KdvfsError(f"{samples}: fewer than three counter updates in the idle tail")
    first, last = changes[1], changes[-1]
    power_w = (
        (float(last["energy_mj"]) - float(first["energy_mj"]))
        * 1e-3
        / (float(last["host_s"]) - float(first["host_s"]))
    )
    return power_w, float(np.mean([float(r["temp_c"]) for r in rows]))


def gemm_runs(recording: dict, preset: str, most_throttled: float) -> list[dict]:
    """The GEMM runs launched one at a time and uncapped, each with its kernel's simulated time
    at 1980 MHz (s) and back-to-back energy above idle (J) at the run's temperature."""
    p = get_preset(preset)
    runs = []
    for r in recording["runs"]:
        if not r["kernel"].startswith("gemm_") or r["throttle_share_any_but_idle"] > most_throttled:
            continue
        kernel = parse_probe_kernel(r["kernel"]).kernel()
        temp_c = 0.5 * (r["temperature_c_start"] + r["temperature_c_end"])
        op = operating_point(p, kernel, None, temp_c, math.inf)
        idle = idle_power_w(p, p.max_core_mhz, p.max_mem_mhz, temp_c)
        cycle_s = r["window_s"] / r["launches"]
        runs.append(
            {
                "kernel": r["kernel"],
                "gap_us": r["gap_us"],
                "temp_c": temp_c,
                "power_w": r["counter_power_w"],
                "cycle_s": cycle_s,
                "idle_gap_s": max(0.0, cycle_s - op.time_s),
                "kernel_s": op.time_s,
                "simulated_b2b_j": op.energy_j - idle * op.time_s,
            }
        )
    return runs


def after_gap(gap_s: np.ndarray, drop: float, tau_s: float) -> np.ndarray:
    """The share of its energy above idle a launch draws after an idle gap (the model)."""
    return 1.0 - drop * -np.expm1(-gap_s / tau_s)


def main(argv: list[str]) -> dict:
    args = parse_fields(Args, argv, "fit_gap_power", __doc__)
    folder = Path(args.recording) if args.recording else REPO_DATA_DIR / "h100" / "gap_power"
    try:
        recording = json.loads((folder / "gap_power.json").read_text())
        idle, idle_temp_c = idle_w(
            folder / "gap_power_samples.csv.gz", recording["idle_decay"]["stop_s"], args.idle_lag_s
        )
    except (OSError, KeyError, ValueError, KdvfsError) as e:
        sys.exit(f"fit_gap_power: {folder}: {e}")
    p = get_preset(args.preset)
    leak_w_per_c = p.static_w * p.leak_per_c  # the simulated card's leakage slope at its top clock
    runs = gemm_runs(recording, args.preset, args.most_throttled)
    sizes = sorted({r["kernel"] for r in runs})
    for r in runs:
        r["idle_w"] = idle + leak_w_per_c * (r["temp_c"] - idle_temp_c)
        r["measured_j"] = (r["power_w"] - r["idle_w"]) * r["cycle_s"]
        r["sigma_j"] = args.idle_sigma_w * r["cycle_s"]
    gap_s = np.array([r["idle_gap_s"] for r in runs])
    y = np.array([r["measured_j"] for r in runs])
    sigma = np.array([r["sigma_j"] for r in runs])
    which = np.array([sizes.index(r["kernel"]) for r in runs])
    b2b0 = np.array([next(r["simulated_b2b_j"] for r in runs if r["kernel"] == s) for s in sizes])

    def cost(x: np.ndarray) -> np.ndarray:
        e0 = b2b0 * x[2:]
        return (y - e0[which] * after_gap(gap_s, x[0], x[1] * 1e-6)) / sigma

    fit = least_squares(
        cost,
        [0.1, 20.0] + [1.0] * len(sizes),
        bounds=([0.0, 0.1] + [0.1] * len(sizes), [1.0, 1e4] + [10.0] * len(sizes)),
    )
    drop, tau_us = round(float(fit.x[0]), 3), round(float(fit.x[1]), 1)
    e0 = b2b0 * fit.x[2:]
    chi2 = float(np.sum(cost(fit.x) ** 2))
    doc = {
        "source": "measured on a real H100 (data/h100/gap_power), kernel times and back-to-back energy simulated "
        f"(sim:{args.preset}, 1980 MHz, uncapped)",
        "model": "energy above idle a launch = E0 x (1 - drop x (1 - exp(-idle gap / tau)))",
        "idle_w": round(idle, 1),
        "idle_temp_c": round(idle_temp_c, 1),
        "leak_w_per_c": leak_w_per_c,
        "after_gap_drop_share": drop,
        "after_gap_tau_us": tau_us,
        "chi2": round(chi2, 1),
        "dof": len(runs) - len(fit.x),
        "back_to_back_j": {
            s: {"fitted": round(float(e0[i]), 7), "simulated": round(float(b2b0[i]), 7)}
            for i, s in enumerate(sizes)
        },
        "runs": [
            {
                "kernel": r["kernel"],
                "gap_us": r["gap_us"],
                "idle_gap_us": round(r["idle_gap_s"] * 1e6, 1),
                "measured_uj": round(r["measured_j"] * 1e6),
                "sigma_uj": round(r["sigma_j"] * 1e6),
                "fitted_uj": round(
                    float(
                        e0[sizes.index(r["kernel"])]
                        * after_gap(np.array(r["idle_gap_s"]), drop, tau_us * 1e-6)
                    )
                    * 1e6
                ),
            }
            for r in runs
        ],
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return doc


if __name__ == "__main__":
    main(sys.argv[1:])
