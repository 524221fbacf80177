"""Any schedule of a noisy-job row in the card's own in-step truth, and the realisable oracle at
any switch sites: the yardstick of `noisy_jobs`, open to what-if questions.

A row is PRESET:WORKLOAD:NOISE, as noisy_jobs names it. Each schedule is evaluated noiselessly
in the step (tuner/oracle.py's InStep: switch latencies, the power cap's window and the job's
waits charged as the yardstick charges them), and, with `--alone-s`, also run alone on the
row's simulated job, noise and all, for its busy time: the time the step tuner holds to the
budget, which leaves the job's waits out where the yardstick's slowdown keeps them in.

    python -m kdvfs.experiments.in_step_truth --row rtx3080ti:gpt3-xl:none \
        --schedules '[[0,[1680,9251]]];[[0,[1680,9251]],[824,[1260,9501]]]' --oracle-sites 0,560

Map, top to bottom:
  Args      every knob, one line each, with its unit
  parse     schedules (JSON lists of [first site, [core MHz, memory MHz] or null], ';'-separated),
            sites and budgets; a bad one is one line naming it, exit 2
  truth     each schedule's saving and slowdown in the in-step truth, and alone on the job
  oracle    the realisable oracle at the sites asked for, at each budget
  main      prints JSON [simulated, no tuner, yardstick: the in-step truth]
"""

from __future__ import annotations

import dataclasses
import itertools

from kdvfs.experiments import window_bias
from kdvfs.experiments._json_main import json_main, parse_floats
from kdvfs.experiments.noisy_jobs import in_step, noise_of, schedule_json
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.types import KdvfsError


@dataclasses.dataclass
class Args:
    row: str = "rtx3080ti:gpt3-xl:none"  # PRESET:WORKLOAD:NOISE (noise: a recorded job's, or none)
    schedules: str = ""  # schedules, JSON, ';'-separated (first group at site 0); '' none
    oracle_sites: str = ""  # the realisable oracle at these sites: '' none, 'job' the job's, or site indices
    budgets: str = "0.01"  # the oracle's allowed slowdowns, fractions, comma-separated
    alone_s: float = 0.0  # each schedule and stock also run alone on the simulated job this long, s (0: not)
    seed: int = 0  # the simulated job's card and noise, for --alone-s


def parse_row(text: str) -> tuple[str, str, str]:
    """PRESET:WORKLOAD:NOISE, the noise known (runtime/job_noise.py) or none."""
    parts = text.split(":")
    if len(parts) != 3 or not all(parts):
        raise KdvfsError(f"--row must be PRESET:WORKLOAD:NOISE, got {text!r}")
    try:
        noise_of(text)
    except (KeyError, ValueError) as e:
        raise KdvfsError(f"--row's noise {parts[2]!r} is not a recorded job's: {e}") from None
    return parts[0], parts[1], parts[2]


def parse_schedules(text: str) -> list[Schedule]:
    """';'-separated JSON schedules, each starting at site 0 ('': none)."""
    return [window_bias.parse_schedule(part, "schedules") for part in text.split(";")] if text else []


def parse_sites(text: str, kernels: int) -> list[int] | str | None:
    """'' (None), 'job', or increasing site indices from 0, each a kernel of the step."""
    if not text:
        return None
    if text == "job":
        return "job"
    try:
        sites = [int(x) for x in text.split(",")]
    except ValueError:
        raise KdvfsError(
            f"--oracle-sites must be 'job' or comma-separated kernel indices, got {text!r}"
        ) from None
    if sites[0] != 0 or any(b <= a for a, b in itertools.pairwise(sites)) or sites[-1] >= kernels:
        raise KdvfsError(
            f"--oracle-sites must rise from 0 and stay below the step's {kernels} kernels, got {text!r}"
        )
    return sites


def parse_budgets(text: str) -> list[float]:
    budgets = parse_floats(text, "budgets", "comma-separated fractions")
    if not all(0.0 <= b < 1.0 for b in budgets):
        raise KdvfsError(f"--budgets must be fractions in [0, 1), got {text!r}")
    return budgets


def _alone(args: Args, preset: str, workload: str, noise: str, schedule: Schedule) -> dict:
    """The schedule alone on the row's simulated job (window_bias.alone: a minute's warm-up)."""
    run = window_bias.Args(
        device=f"sim:{preset}", workload=workload, job_noise=noise, alone_s=args.alone_s, seed=args.seed
    )
    return window_bias.alone(run, schedule)


def truth(args: Args) -> dict:
    preset, workload, noise = parse_row(args.row)
    schedules = parse_schedules(args.schedules)
    budgets = parse_budgets(args.budgets)
    if not (args.alone_s >= 0.0):
        raise KdvfsError(f"--alone-s must be 0 or more seconds, got {args.alone_s}")
    step = in_step(args.row, budgets[0])
    sites = parse_sites(args.oracle_sites, len(step.workload))
    if not schedules and sites is None:
        raise KdvfsError("nothing to evaluate: give --schedules, --oracle-sites or both")
    for schedule in schedules:
        if schedule.groups[-1][0] >= len(step.workload):
            raise KdvfsError(f"--schedules: a group starts past the step's {len(step.workload)} kernels")
        try:
            step.schedule(schedule)
        except KdvfsError as e:
            raise KdvfsError(f"--schedules: {e}") from None
    stock_alone = _alone(args, preset, workload, noise, Schedule(((0, None),))) if args.alone_s else None
    rows = []
    for schedule in schedules:
        saving, slowdown = step.figures(*step.schedule(schedule))
        row = {"schedule": schedule_json(schedule), "energy_saving": saving, "slowdown": slowdown}
        if stock_alone is not None:
            alone = _alone(args, preset, workload, noise, schedule)
            row["alone"] = {
                "energy_saving": 1.0 - alone["energy_per_step_j"] / stock_alone["energy_per_step_j"],
                "busy_slowdown": alone["busy_step_ms"] / stock_alone["busy_step_ms"] - 1.0,
            }
        rows.append(row)
    oracles = []
    if sites is not None:
        from kdvfs.tuner.oracle import one_knob_oracle, realisable_oracle
        from kdvfs.tuner.run import job_sites

        device, kernels = step.device, step.workload
        at = job_sites(kernels, device.switch_latency_s) if sites == "job" else sites
        for budget in budgets:
            b_step = in_step(args.row, budget)
            one_knob = one_knob_oracle(device, kernels, budget, step=b_step)
            best = realisable_oracle(device, kernels, budget, at, one_knob=one_knob, step=b_step)
            oracles.append(
                {
                    "budget": budget,
                    "sites": len(at),
                    "energy_saving": best.energy_saving,
                    "slowdown": best.slowdown,
                    "schedule": best.json()["schedule"],
                    "method": best.method,
                }
            )
    return {
        "source": "simulated",
        "prior": "none (no tuner)",
        "yardstick": "the in-step truth of a noiseless card, the job's waits charged (tuner/oracle.py's InStep)"
        + ("; alone: each schedule run alone on the simulated job, busy time" if args.alone_s else ""),
        "args": dataclasses.asdict(args),
        "schedules": rows,
        "oracles": oracles,
    }


def main(argv: list[str] | None = None) -> None:
    json_main(Args, argv, "in_step_truth", __doc__, truth)


if __name__ == "__main__":
    main()
