"""The step-driven tuner on a simulated training job, cold starts over seeds.

    python -m kdvfs.experiments.step_tuning --device sim:rtx3080ti --workload gpt3-xl-layer

For each seed: a SimulatedJob trains for --seconds under a StepTuner; reported are when the
adopted schedule first reached >= 95% of the realisable oracle's saving (and stayed), the final
schedule's noiseless saving and slowdown, and the largest cumulative slowdown at any reported
point (each step; after the first second) against the true stock step. Then the null test:
the same in dry run (every request recorded, none applied): nothing may be adopted and the
measured running saving must lie within +-0.3% of zero. The oracle is sweep.py's realisable
schedule over a sweep of a noiseless copy of the card (the best schedule it can run with its
switch latency within the budget); --ideal also reports the per-kernel saving, switches
ignored (the -fastswitch target). --prior model: the tuner's groups and first candidate
from the card's own per-kernel model (tuner/step_priors.py); none: groups from segment
times. Prints JSON.
"""

from __future__ import annotations

import argparse
import json

from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule, schedule_figures
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.tuner.session import reached_after_s
from kdvfs.tuner.step_priors import model_plan
from kdvfs.tuner.step_tuner import StepTuner
from kdvfs.tuner.sweep import evaluate, realisable, run_sweep

#: Training before the cumulative slowdown is watched (a few steps' noise dominates before); s.
SLOWDOWN_FROM_S = 1.0


def run_seed(
    spec: str,
    workload_spec: str,
    seed: int,
    seconds: float,
    budget: float,
    oracle: float,
    dry_run: bool,
    prior: Schedule | None = None,
):
    device = open_device(spec, seed=seed)
    workload = open_workload(workload_spec, device)
    stock_s, stock_j = device.expected_step([(k, None, k.launches) for k in workload.kernels])
    tuner = StepTuner(
        workload,
        device.grid.pairs,
        switch_latency_s=device.switch_latency_s,
        energy_update_period_s=device.energy_update_period_s,
        budget=budget,
        seed=seed,
        prior=prior,
    )
    job = SimulatedJob(device, workload, dry_run=dry_run)
    worst = [0.0]

    def watch(report) -> None:
        if report.end_s >= SLOWDOWN_FROM_S:
            worst[0] = max(worst[0], report.end_s / (stock_s * (report.step + 1)) - 1.0)

    job.run(tuner, seconds=seconds, on_report=watch)
    reached_s = reached_after_s(
        tuner.adoptions, lambda x: schedule_figures(device, workload, x)[0], 0.95 * oracle
    )
    final_saving, final_slowdown = schedule_figures(device, workload, tuner.incumbent)
    measured_saving = 1.0 - device.true_energy_j() / (stock_j * job.steps)
    return {
        "seed": seed,
        "reached_95pct_oracle_after_s": None if reached_s is None else round(reached_s, 1),
        "running": {
            "energy_saving": round(final_saving, 4),
            "slowdown": round(final_slowdown, 4),
            "groups": len(tuner.incumbent.groups),
            "schedule": [[s, None if p is None else str(p)] for s, p in tuner.incumbent.groups],
        },
        "measured_whole_run": {"energy_saving": round(measured_saving, 4), "steps": job.steps},
        "largest_cumulative_slowdown": round(worst[0], 4),
        "tuner_running_saving": round(tuner.running_saving(), 4),
        "adopted": len(tuner.adoptions),
        "phases": tuner.phases,
        "clock_requests": len(job.requests),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="sim:rtx3080ti")
    p.add_argument("--workload", default="gpt3-xl-layer")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument(
        "--first-seed", type=int, default=0, help="seeds run: first-seed .. first-seed + seeds - 1"
    )
    p.add_argument(
        "--sites",
        choices=("modules", "kernels"),
        default="modules",
        help="where the job may switch: passes and submodules, or every kernel (a fast-switch card's hooks)",
    )
    p.add_argument("--seconds", type=float, default=600.0, help="simulated training per run, s")
    p.add_argument("--budget", type=float, default=0.01)
    p.add_argument("--prior", choices=("model", "none"), default="model")
    p.add_argument("--no-null", action="store_true", help="skip the dry-run null test")
    p.add_argument("--ideal", action="store_true", help="also the ideal per-kernel saving (switches ignored)")
    args = p.parse_args()
    noiseless = open_device(args.device, noise=0.0)
    workload = open_workload(args.workload, noiseless)
    obs = run_sweep(noiseless, workload)
    best = realisable(noiseless, obs, args.budget)
    schedule, oracle, oracle_slowdown = best.schedule, best.energy_saving, best.slowdown
    ideal = (
        evaluate(noiseless, workload, obs.kernel_level_choice(args.budget)).energy_saving
        if args.ideal
        else None
    )
    sites = list(range(len(workload))) if args.sites == "kernels" else None
    prior = model_plan(noiseless, workload, args.budget, sites) if args.prior == "model" else None
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    runs = [
        run_seed(args.device, args.workload, s, args.seconds, args.budget, oracle, False, prior)
        for s in seeds
    ]
    nulls = [
        run_seed(args.device, args.workload, s, args.seconds, args.budget, oracle, True, prior)
        for s in (() if args.no_null else seeds)
    ]
    reached = [r["reached_95pct_oracle_after_s"] for r in runs]
    doc = {
        "device": args.device,
        "workload": args.workload,
        "budget": args.budget,
        "seconds": args.seconds,
        "oracle": {
            "energy_saving": round(oracle, 4),
            "slowdown": round(oracle_slowdown, 4),
            "groups": len(schedule.groups),
        },
        "ideal_per_kernel_saving": None if ideal is None else round(ideal, 4),
        "prior": None
        if prior is None
        else {
            "groups": len(prior.groups),
            "energy_saving": round(schedule_figures(noiseless, workload, prior)[0], 4),
            "slowdown": round(schedule_figures(noiseless, workload, prior)[1], 4),
        },
        "runs": runs,
        "summary": {
            "reached_95pct_within_600s": sum(1 for r in reached if r is not None and r <= 600.0),
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
                        "tuner_running_saving",
                        "measured_whole_run",
                        "largest_cumulative_slowdown",
                    )
                }
                for r in nulls
            ],
            "adopted_any": any(r["adopted"] for r in nulls),
            "largest_abs_running_saving": max(abs(r["tuner_running_saving"]) for r in nulls),
        },
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
