"""The tuner of `kdvfs tune` on a simulated training job, cold starts over seeds.

    python -m kdvfs.experiments.step_tuning --device sim:rtx3080ti --workload gpt3-xl-layer --prior none

For each seed, a TuneSession (tuner/session.py: a SimulatedJob fed to the one TuningRun that
`kdvfs tune` and `kdvfs.tune` use, with the same prior, sites and oracle) trains for
--seconds. Reported: when the adopted schedule first reached ORACLE_SHARE of the realisable
oracle's saving and stayed there (run.reached_after_s), the final schedule's noiseless saving
and slowdown, and the largest cumulative slowdown at any step after SLOWDOWN_FROM_S against
the true stock step. Then the null test: the same in dry run (every request recorded, none
applied): nothing may be adopted and the tuner's running saving must lie within +-0.3% of
zero. The oracles are tuner/oracle.py's (the one-knob, realisable and ideal per-kernel
schedules of a noiseless copy of the card, each evaluated in the step and held to the budget,
the realisable one at the job's sites; each says how it was computed); --ideal also reports
the ideal per-kernel saving on its own line.
--prior model starts from the simulator's own noiseless model of the card, which no real
card has; --prior none from nothing. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import schedule_figures
from kdvfs.tuner.oracle import oracles
from kdvfs.tuner.run import ORACLE_SHARE, Prior, choose_prior, job_sites, reached_after_s
from kdvfs.tuner.session import TuneSession

#: Training before the cumulative slowdown is watched (a few steps' noise dominates before); s.
SLOWDOWN_FROM_S = 1.0


@dataclass(frozen=True)
class Args:
    device: str = "sim:rtx3080ti"  # the card: sim:PRESET or replay:CSV
    workload: str = "gpt3-xl-layer"  # the step's kernels (kdvfs tune --workload)
    seeds: int = 5  # seeds run, from first_seed
    first_seed: int = 0  # the first seed
    sites: str = "auto"  # where the job may switch: auto, modules or kernels (kdvfs tune --sites)
    seconds: float = 600.0  # simulated training per run, s
    budget: float = 0.01  # the largest cumulative slowdown, a fraction
    prior: str = "model"  # model (the simulator's own noiseless model) or none
    null: bool = True  # run the dry-run null test too
    ideal: bool = False  # also report the ideal per-kernel saving


def parse_args() -> Args:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=Args.device)
    p.add_argument("--workload", default=Args.workload)
    p.add_argument("--seeds", type=int, default=Args.seeds)
    p.add_argument("--first-seed", type=int, default=Args.first_seed, help="the first seed run")
    p.add_argument("--sites", choices=("auto", "modules", "kernels"), default=Args.sites)
    p.add_argument("--seconds", type=float, default=Args.seconds, help="simulated training per run, s")
    p.add_argument("--budget", type=float, default=Args.budget)
    p.add_argument("--prior", choices=("model", "none"), default=Args.prior)
    p.add_argument("--no-null", action="store_true", help="skip the dry-run null test")
    p.add_argument("--ideal", action="store_true", help="also the ideal per-kernel saving")
    a = p.parse_args()
    return Args(
        a.device,
        a.workload,
        a.seeds,
        a.first_seed,
        a.sites,
        a.seconds,
        a.budget,
        a.prior,
        not a.no_null,
        a.ideal,
    )


def run_seed(args: Args, seed: int, prior: Prior, sites: list[int], oracle_saving: float, dry_run: bool):
    """One simulated job of `args.seconds` under the tuner, from `prior`; its figures."""
    device = open_device(args.device, seed=seed)
    workload = open_workload(args.workload, device)
    stock_s, stock_j = device.expected_step([(k, None, k.launches) for k in workload.kernels])
    session = TuneSession(
        device, workload, budget=args.budget, seed=seed, prior=prior, dry_run=dry_run, sites=sites
    )
    worst = [0.0]

    def watch(report) -> None:
        if report.end_s >= SLOWDOWN_FROM_S:
            worst[0] = max(worst[0], report.end_s / (stock_s * (report.step + 1)) - 1.0)

    session.run_until(args.seconds, on_report=watch)
    tuner = session.tuner
    reached_s = reached_after_s(
        tuner.adoptions,
        lambda x: schedule_figures(device, workload, x)[0],
        ORACLE_SHARE * oracle_saving,
    )
    final_saving, final_slowdown = schedule_figures(device, workload, tuner.incumbent)
    measured_saving = 1.0 - device.true_energy_j() / (stock_j * session.job.steps)
    return {
        "seed": seed,
        "reached_95pct_oracle_after_s": None if reached_s is None else round(reached_s, 1),
        "running": {
            "energy_saving": round(final_saving, 4),
            "slowdown": round(final_slowdown, 4),
            "groups": len(tuner.incumbent.groups),
            "schedule": [[s, None if p is None else str(p)] for s, p in tuner.incumbent.groups],
        },
        "measured_whole_run": {"energy_saving": round(measured_saving, 4), "steps": session.job.steps},
        "largest_cumulative_slowdown": round(worst[0], 4),
        "tuner_plan_energy_saving": round(tuner.plan_energy_saving(), 4),
        "adopted": len(tuner.adoptions),
        "phases": tuner.phases,
        "clock_requests": len(session.job.requests),
    }


def main() -> None:
    args = parse_args()
    noiseless = open_device(args.device, noise=0.0)
    workload = open_workload(args.workload, noiseless)
    sites = job_sites(workload, noiseless.switch_latency_s, args.sites)
    yardstick = oracles(noiseless, workload, args.budget, sites=sites)
    prior = choose_prior(
        noiseless,
        workload,
        args.budget,
        store=None,
        model=noiseless if args.prior == "model" else None,
        sites=sites,
    )
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    runs = [run_seed(args, s, prior, sites, yardstick.energy_saving, False) for s in seeds]
    nulls = [
        run_seed(args, s, prior, sites, yardstick.energy_saving, True) for s in (seeds if args.null else ())
    ]
    reached = [r["reached_95pct_oracle_after_s"] for r in runs]
    doc = {
        "device": args.device,
        "source": noiseless.source,
        "workload": args.workload,
        "budget": args.budget,
        "seconds": args.seconds,
        "prior": {
            "source": prior.source,
            "note": "the simulator's own noiseless model of the card, which a real card does not have"
            if prior.source == "model"
            else None,
            **(
                {}
                if prior.schedule is None
                else {
                    "groups": len(prior.schedule.groups),
                    "energy_saving": round(schedule_figures(noiseless, workload, prior.schedule)[0], 4),
                    "slowdown": round(schedule_figures(noiseless, workload, prior.schedule)[1], 4),
                }
            ),
        },
        "oracle": {
            "energy_saving": round(yardstick.energy_saving, 4),
            "slowdown": round(yardstick.slowdown, 4),
            "groups": len(yardstick.schedule.groups),
            "method": yardstick.realisable.method,
        },
        "one_knob_oracle": {
            "energy_saving": round(yardstick.one_knob.energy_saving, 4),
            "slowdown": round(yardstick.one_knob.slowdown, 4),
            "pair": None
            if yardstick.one_knob.schedule.one_pair() is None
            else str(yardstick.one_knob.schedule.one_pair()),
            "method": yardstick.one_knob.method,
        },
        "ideal_per_kernel_saving": round(yardstick.ideal_energy_saving, 4) if args.ideal else None,
        "runs": runs,
        "summary": {
            "reached_95pct_within_run": sum(1 for r in reached if r is not None and r <= args.seconds),
            "worst_final_saving": min(r["running"]["energy_saving"] for r in runs),
            "worst_whole_run_saving": min(r["measured_whole_run"]["energy_saving"] for r in runs),
            "seeds": args.seeds,
            "worst_reached_s": None if None in reached else max(reached),
            "largest_cumulative_slowdown": max(r["largest_cumulative_slowdown"] for r in runs),
        },
        "null_test": None
        if not nulls
        else {
            "runs": [
                {
                    k: r[k]
                    for k in (
                        "seed",
                        "adopted",
                        "tuner_plan_energy_saving",
                        "measured_whole_run",
                        "largest_cumulative_slowdown",
                    )
                }
                for r in nulls
            ],
            "adopted_any": any(r["adopted"] for r in nulls),
            "largest_abs_plan_energy_saving": max(abs(r["tuner_plan_energy_saving"]) for r in nulls),
        },
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
