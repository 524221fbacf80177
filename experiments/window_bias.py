"""How a trial reads a candidate against an incumbent at each window length, against both run alone.

A trial alternates its arms in A-B-B-A windows; whatever one arm leaves behind at a window's
edge (a clock request still in flight, a wait that straddles the edge, the card's temperature)
lands in the other arm's window. Where that is a fixed amount per change of arm it shrinks as
the windows grow; where it depends on the job's own waits it need not. This measures it on a
simulated card carrying a recorded job's noise (seeded, the job's sites, no tuner):

    python -m kdvfs.experiments.window_bias --device sim:h200 --workload gpt3-xl-layer --job-noise sync \
        --incumbent '[[0,null],[37,[345,2201]]]' --candidate '[[0,[1440,3201]],[37,[345,2201]]]'

Map, top to bottom:
  Args      every knob, one line each, with its unit
  alone     one schedule run for `warmup_s`, then `alone_s` measured: energy per step (the
            card's true energy, the job's waits in it) and busy step time
  trial     for each window length: a NoiseMeter fitted on three null trials of the incumbent
            (the job's wait power, as the tuner learns it), then one trial of `trial_s`, read as
            the tuner reads it (runtime/trials.py's Trial.outcome)
  main      both; prints JSON: each window length's reading, its error, and its bias against
            the schedules run alone
Schedules are JSON lists of [first site, [core MHz, memory MHz] or null (stock)]. [simulated]
"""

from __future__ import annotations

import dataclasses
import json

from kdvfs.experiments._json_main import json_main, parse_floats
from kdvfs.experiments.noisy_jobs import schedule_of_json
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.runtime.trials import NoiseMeter, Trial
from kdvfs.runtime.types import KdvfsError


@dataclasses.dataclass
class Args:
    device: str = "sim:h200"  # a simulated card (sim:PRESET)
    workload: str = "gpt3-xl-layer"  # a workload name
    job_noise: str = "sync"  # a recorded job's noise (runtime/job_noise.py), or none
    incumbent: str = "[[0,null],[37,[345,2201]]]"  # arm A: a schedule, JSON
    candidate: str = "[[0,[1440,3201]],[37,[345,2201]]]"  # arm B: a schedule, JSON
    windows_s: str = "2,4,8"  # the window lengths compared, s, comma-separated
    trial_s: float = 160.0  # one trial's length at each window length, s
    alone_s: float = 600.0  # each schedule measured alone, s
    warmup_s: float = 60.0  # run before measuring, s
    settle_s: float = 0.01  # a window's steps that began this soon after its opening left out, s
    seed: int = 2  # the card's and the job's noise


def parse_schedule(text: str, name: str) -> Schedule:
    """A schedule from JSON: [[first site, [core, mem] or null], ...], the first at site 0."""
    try:
        schedule = schedule_of_json(json.loads(text))
    except (ValueError, TypeError):
        raise KdvfsError(
            f"--{name} must be a JSON list of [first site, [core, mem] or null], got {text!r}"
        ) from None
    if not schedule.groups or schedule.groups[0][0] != 0:
        raise KdvfsError(f"--{name}'s first group must start at site 0, got {text!r}")
    return schedule


def parse_windows(text: str) -> list[float]:
    windows = parse_floats(text, "windows-s", "window lengths in s, comma-separated")
    if min(windows) <= 0.0:
        raise KdvfsError(f"--windows-s must be positive, got {text!r}")
    return windows


def _job(args: Args) -> SimulatedJob:
    from kdvfs.runtime.job_noise import job_noise

    device = open_device(args.device, seed=args.seed)
    noise = None if args.job_noise == "none" else job_noise(args.job_noise)
    return SimulatedJob(
        device, open_workload(args.workload, device), job_noise=noise, job_noise_seed=args.seed
    )


def alone(args: Args, schedule: Schedule) -> dict:
    """One schedule alone: energy per step (waits in it) and busy step time."""
    job = _job(args)
    device = job.device
    while device.now_s() < args.warmup_s:
        job.step_until_update(schedule)
    start_s, start_j, steps, busy_s = device.now_s(), device.true_energy_j(), 0, 0.0
    while device.now_s() - start_s < args.alone_s:
        report = job.step_until_update(schedule)
        steps += report.steps
        busy_s += (report.step_time_s - report.wait_s) * report.steps
    return {
        "energy_per_step_j": (device.true_energy_j() - start_j) / steps,
        "busy_step_ms": 1e3 * busy_s / steps,
    }


def trial(args: Args, incumbent: Schedule, candidate: Schedule, window_s: float) -> dict:
    """One trial of trial_s at window_s after the job's wait power is learnt from null trials."""
    job = _job(args)
    device = job.device
    while device.now_s() < args.warmup_s:
        job.step_until_update(incumbent)

    def run(b: Schedule, blocks: int, wait_power_w: float) -> Trial:
        t = Trial(incumbent, b, blocks, window_s, args.settle_s, wait_power_w=wait_power_w)
        while not t.done:
            if t.current is None:
                t.open(device.now_s())
            t.add(job.step_until_update(t.schedule()))
        return t

    meter = NoiseMeter()
    for _ in range(3):
        meter.add_pairs(run(incumbent, 4, meter.wait_power_w).outcome().pairs)
    outcome = run(candidate, max(1, round(args.trial_s / (4 * window_s))), meter.wait_power_w).outcome()
    return {
        "window_s": window_s,
        "blocks": outcome.blocks,
        "energy_saving": -outcome.energy_diff,
        "energy_se": outcome.energy_se,
        "slowdown": outcome.time_diff,
        "time_se": outcome.time_se,
        "wait_power_w": meter.wait_power_w,
    }


def measure(args: Args) -> dict:
    """Both schedules alone, and a trial at each window length (JSON-ready)."""
    incumbent = parse_schedule(args.incumbent, "incumbent")
    candidate = parse_schedule(args.candidate, "candidate")
    windows = parse_windows(args.windows_s)
    a, b = alone(args, incumbent), alone(args, candidate)
    saving = 1.0 - b["energy_per_step_j"] / a["energy_per_step_j"]
    slowdown = b["busy_step_ms"] / a["busy_step_ms"] - 1.0
    trials = []
    for window_s in windows:
        t = trial(args, incumbent, candidate, window_s)
        t["energy_bias"] = t["energy_saving"] - saving
        t["energy_bias_errors"] = t["energy_bias"] / t["energy_se"] if t["energy_se"] > 0 else None
        trials.append(t)
    return {
        "source": "simulated",
        "prior": "none (no tuner)",
        "yardstick": "both schedules run alone, the job's waits in their energy",
        "args": dataclasses.asdict(args),
        "alone": {"incumbent": a, "candidate": b, "energy_saving": saving, "slowdown": slowdown},
        "trials": trials,
    }


def main(argv: list[str] | None = None) -> None:
    json_main(Args, argv, "window_bias", __doc__, measure)


if __name__ == "__main__":
    main()
