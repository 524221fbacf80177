"""The drift watch's inputs on a real GPU (read-only): does drift.ConditionWatch stay silent
under a steady load, and does it see a thermal step?

    python -m kdvfs.experiments.h200_inputs --out DIR

Read-only: the only device is NvmlDevice(0, dry_run=True). `run_load` runs a bf16 matmul loop
busy half the time (--duty) for --steady-s seconds (the watch must stay silent), then all the
time (a thermal step made by the load); a poller reads the temperature, the power limit and
the throttle reasons every --poll-s seconds, and "would_hold_plan" says what the tuner's rule
(keep the plan through a warming only while no runtime.measure.THROTTLES reason is set)
decides at each alarm. Prints JSON, measured on a real GPU (docs/gpu-validation.md). Without
one, a smoke run against the tests' fake NVML:
KDVFS_NVML_MODULE=fake_pynvml PYTHONPATH=.:tests/runtime python -m kdvfs.experiments.h200_inputs
--device cpu --size 64 --steady-s 2 --step-s 1 --out /tmp/inputs
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from kdvfs.runtime.measure import THROTTLES
from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.tuner.drift import ConditionWatch


def run_load(
    gpu: NvmlDevice,
    watch: ConditionWatch,
    device: str,
    size: int,
    duty: float,
    seconds: float,
    poll_s: float,
    t0: float,
    log: dict,
) -> list[float]:
    """Matmuls of size x size, busy a `duty` share of the time, until `seconds` pass, the
    inputs polled every poll_s; the times (s since t0) of the watch's alarms. log collects
    the readings, when the watch armed, and at each alarm whether the tuner would hold its
    plan (a temperature step up with no throttle reason)."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    alarms, end, next_poll = [], time.monotonic() + seconds, time.monotonic()
    while time.monotonic() < end:
        busy_from = time.monotonic()
        for _ in range(8):
            torch.matmul(a, b, out=c)
        if device == "cuda":
            torch.cuda.synchronize()
        time.sleep((time.monotonic() - busy_from) * (1.0 / duty - 1.0))
        if time.monotonic() >= next_poll:
            now = time.monotonic() - t0
            temp_c, limit_w, reasons = (
                gpu.temperature_c(),
                gpu.power_limit_w(),
                sorted(gpu.throttle_reasons()),
            )
            log["readings"].append((round(now, 2), temp_c, limit_w, round(gpu.power_w(), 1), reasons))
            moved = watch.update(now, temp_c, limit_w)
            if moved:
                alarms.append(round(now, 2))
                log["would_hold_plan"].append(
                    moved == ["temperature"] and watch.step_c > 0.0 and not set(reasons) & THROTTLES
                )
            if watch.centre_c is not None and log.get("armed_at_s") is None:
                log["armed_at_s"] = round(now, 2)
            next_poll += poll_s
    return alarms


def _reason_counts(readings) -> dict[str, int]:
    """How many readings showed each throttle reason ("none": readings with none)."""
    counts: dict[str, int] = {}
    for r in readings:
        for reason in r[4] or ["none"]:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steady-s", type=float, default=240.0)
    p.add_argument("--step-s", type=float, default=60.0)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument(
        "--duty", type=float, default=0.5, help="busy share of the steady phase (the step runs at 1)"
    )
    p.add_argument("--poll-s", type=float, default=0.1)
    p.add_argument(
        "--device", default="cuda", help="torch device of the load (cpu: a smoke run against a fake NVML)"
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    with NvmlDevice(0, dry_run=True) as gpu:
        watch, log, t0 = ConditionWatch(), {"readings": [], "would_hold_plan": []}, time.monotonic()
        steady_alarms = run_load(
            gpu, watch, args.device, args.size, args.duty, args.steady_s, args.poll_s, t0, log
        )
        centre_c, half_width_c = watch.centre_c, watch.half_width_c
        step_at = time.monotonic() - t0
        held_steady = len(log["would_hold_plan"])
        step_alarms = run_load(gpu, watch, args.device, args.size, 1.0, args.step_s, args.poll_s, t0, log)
        readings = log["readings"]
        steady = [r for r in readings if args.steady_s / 2 <= r[0] < step_at]
        step = [r for r in readings if r[0] >= step_at + args.step_s / 2]
        doc = {
            "source": "measured",
            "gpu": gpu.name,
            "poll_s": args.poll_s,
            "power_limit_w_seen": sorted({r[2] for r in readings}),
            "steady": {
                "seconds": args.steady_s,
                "size": args.size,
                "duty": args.duty,
                "armed_at_s": log.get("armed_at_s"),
                "alarms_at_s": steady_alarms,
                "centre_c": centre_c,
                "half_width_c": half_width_c,
                "temperature_min_max_c_second_half": [min(r[1] for r in steady), max(r[1] for r in steady)],
                "power_w_mean_second_half": round(sum(r[3] for r in steady) / len(steady), 1),
                "throttle_reasons_seen": _reason_counts(r for r in readings if r[0] < step_at),
            },
            "step": {
                "at_s": round(step_at, 2),
                "size": args.size,
                "duty": 1.0,
                "alarms_at_s": step_alarms,
                "detected_after_s": round(step_alarms[0] - step_at, 2) if step_alarms else None,
                "temperature_min_max_c_second_half": [min(r[1] for r in step), max(r[1] for r in step)],
                "power_w_mean_second_half": round(sum(r[3] for r in step) / len(step), 1),
                "throttle_reasons_seen": _reason_counts(r for r in readings if r[0] >= step_at),
                "would_hold_plan_at_alarms": log["would_hold_plan"][held_steady:],
            },
            "clock_calls_made": len(gpu.calls),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "readings.json").write_text(json.dumps(readings))
    text = json.dumps(doc, indent=2)
    (args.out / "h200_inputs.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
