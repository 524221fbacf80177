"""How a plan's step time reads when it alternates with stock, against the same plan run alone.

A trial or verification alternates its arms in A-B-B-A windows of a few seconds, so the card
sits between the two arms' temperatures; run alone, a plan that draws less cools the card
over tens of seconds. On a card near its power limit the cooler card limits the plan less.
This measures the difference on a simulated card (seeded, the job's sites, no tuner):

    python -m kdvfs.experiments.thermal_carryover --device sim:rtx3080ti --workload gpt3-xl --pair 1680/9251

Map, top to bottom:
  Args       every knob, one line each, with its unit
  alone      one schedule run for `warmup_s`, then `measure_s` measured: mean step time, energy
             per step and temperature
  alternated stock and the plan in A-B-B-A windows of `window_s` after `warmup_s` at stock,
             `measure_s` of them: each arm's mean step time, energy per step and temperature
  main       both, and the card's noiseless in-step figures of the plan (tuner/oracle.py's
             InStep, at its own steady temperature); prints JSON
The step time is the busy time (the job's waits left out), as the tuner reads it. [simulated]
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kdvfs.experiments._json_main import json_main
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.runtime.types import ClockPair, KdvfsError
from kdvfs.tuner.oracle import InStep


@dataclasses.dataclass
class Args:
    device: str = "sim:rtx3080ti"  # a simulated card (sim:PRESET)
    workload: str = "gpt3-xl"  # a workload name
    pair: str = "1680/9251"  # the plan: one pair for the whole step, CORE/MEM in MHz
    window_s: float = 2.0  # one window of the alternation, s (a trial's window)
    warmup_s: float = 200.0  # run before measuring, s
    measure_s: float = 300.0  # measured, s
    seed: int = 1  # the card's noise


def parse_pair(text: str) -> ClockPair:
    try:
        core_mhz, mem_mhz = (int(x) for x in text.split("/"))
    except ValueError:
        raise KdvfsError(f"--pair must be CORE/MEM in MHz (e.g. 1680/9251), got {text!r}") from None
    return ClockPair(core_mhz, mem_mhz)


def _job(args: Args) -> SimulatedJob:
    device = open_device(args.device, seed=args.seed)
    return SimulatedJob(device, open_workload(args.workload, device))


def _figures(steps: int, busy_s: float, energy_j: float, temps_c: list[float]) -> dict:
    return {
        "step_ms": 1e3 * busy_s / steps,
        "energy_per_step_j": energy_j / steps,
        "temperature_c": float(np.mean(temps_c)),
        "steps": steps,
    }


def alone(args: Args, schedule: Schedule) -> dict:
    job = _job(args)
    device = job.device
    while device.now_s() < args.warmup_s:
        job.step_until_update(schedule)
    start_s, start_j = device.now_s(), device.true_energy_j()
    steps, busy_s, temps = 0, 0.0, []
    while device.now_s() - start_s < args.measure_s:
        report = job.step_until_update(schedule)
        steps += report.steps
        busy_s += (report.step_time_s - report.wait_s) * report.steps
        temps.append(report.temperature_c)
    return _figures(steps, busy_s, device.true_energy_j() - start_j, temps)


def alternated(args: Args, plan: Schedule) -> dict:
    job = _job(args)
    device = job.device
    stock = Schedule.stock()
    while device.now_s() < args.warmup_s:
        job.step_until_update(stock)
    arms = {"stock": [0, 0.0, 0.0, []], "plan": [0, 0.0, 0.0, []]}
    start_s, k = device.now_s(), 0
    while device.now_s() - start_s < args.measure_s:
        arm = ("stock", "plan", "plan", "stock")[k % 4]
        k += 1
        schedule = stock if arm == "stock" else plan
        window_start_s, window_start_j = device.now_s(), device.true_energy_j()
        acc = arms[arm]
        while device.now_s() - window_start_s < args.window_s:
            report = job.step_until_update(schedule)
            acc[0] += report.steps
            acc[1] += (report.step_time_s - report.wait_s) * report.steps
            acc[3].append(report.temperature_c)
        acc[2] += device.true_energy_j() - window_start_j
    return {arm: _figures(*acc) for arm, acc in arms.items()}


def measure(args: Args) -> dict:
    """The plan alone, stock alone, both alternated, and the plan's in-step truth (JSON-ready)."""
    plan = Schedule(((0, parse_pair(args.pair)),))
    stock_alone, plan_alone = alone(args, Schedule.stock()), alone(args, plan)
    both = alternated(args, plan)
    noiseless = open_device(args.device, noise=0.0)
    step = InStep(noiseless, open_workload(args.workload, noiseless), 0.01)
    saving, slowdown = step.figures(*step.schedule(plan))
    doc = {
        "source": "simulated",
        "args": dataclasses.asdict(args),
        "alone": {"stock": stock_alone, "plan": plan_alone},
        "alternated": both,
        "slowdown_alone": plan_alone["step_ms"] / stock_alone["step_ms"] - 1.0,
        "slowdown_alternated": both["plan"]["step_ms"] / both["stock"]["step_ms"] - 1.0,
        "in_step_truth": {
            "energy_saving": saving,
            "slowdown": slowdown,
            "method": "the card's noiseless in-step figures at the plan's own steady temperature",
        },
    }
    return doc


def main(argv: list[str] | None = None) -> None:
    json_main(Args, argv, "thermal_carryover", __doc__, measure)


if __name__ == "__main__":
    main()
