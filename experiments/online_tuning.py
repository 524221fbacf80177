"""Online tuning against the full sweep and the pass-level plan (issue 4), top to bottom.

    python -m kdvfs.experiments.online_tuning --devices sim:rtx3080ti,sim:rtx3080ti-fastswitch

For each device:
1. The full sweep (the founding paper's method): its ideal per-kernel plan (switch cost
   ignored) and its pass-level plan, the latter also as a schedule with the device's clock
   switch latency (what a pass-level plan really gives).
2. `kdvfs tune`'s session (tuner/online.py) for --iterations training iterations: its ideal
   per-kernel plan, its grouped schedule (switch cost included), the largest cumulative
   slowdown at any reported point, and when it converged.
Prints JSON. Every figure is simulated; plan figures are the device's noiseless evaluation.
"""

from __future__ import annotations

import argparse
import json

from kdvfs.runtime.iteration import Schedule, schedule_figures
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.tuner.online import OnlineTuner
from kdvfs.tuner.report import tune_report
from kdvfs.tuner.sweep import evaluate, pass_level_choice, run_sweep


def pass_schedule(workload, choice) -> Schedule:
    """The pass-level plan as a schedule: one request at each pass's first kernel."""
    kernels = workload.kernels
    starts = [0] + [i for i in range(1, len(kernels)) if kernels[i].pass_name != kernels[i - 1].pass_name]
    return Schedule(tuple((s, choice[kernels[s].name]) for s in starts))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="sim:rtx3080ti,sim:rtx3080ti-fastswitch")
    p.add_argument("--workload", default="gpt3-xl-layer")
    p.add_argument("--strategy", default="ucb")
    p.add_argument("--budget", type=float, default=0.01)
    p.add_argument("--iterations", type=int, default=1_500_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    results = {}
    for spec in args.devices.split(","):
        device = open_device(spec, seed=args.seed)
        workload = open_workload(args.workload, device)
        sweep = run_sweep(device, workload)
        ideal = evaluate(device, workload, sweep.kernel_level_choice(args.budget))
        passes = pass_level_choice(sweep, args.budget)
        pass_ideal = evaluate(device, workload, passes)
        pass_real = schedule_figures(device, workload, pass_schedule(workload, passes))

        device = open_device(spec, seed=args.seed)
        tuner = OnlineTuner(device, workload, strategy=args.strategy, budget=args.budget, seed=args.seed)
        tuner.run(args.iterations)
        doc = tune_report(tuner, args.budget, sweep_device_spec=None, seed=args.seed, full_grid=False).doc
        results[spec] = {
            "switch_latency_s": device.switch_latency_s,
            "sweep": {
                "ideal_per_kernel_saving": ideal.energy_saving,
                "slowdown": ideal.slowdown,
                "measurements": sweep.measurements,
                "explore_seconds": sweep.cost_s,
            },
            "pass_level": {
                "saving_switch_cost_ignored": pass_ideal.energy_saving,
                "slowdown_switch_cost_ignored": pass_ideal.slowdown,
                "saving_with_switches": pass_real[0],
                "slowdown_with_switches": pass_real[1],
            },
            "tuner": {
                "strategy": args.strategy,
                "ideal_per_kernel_saving": doc["ideal_per_kernel"]["energy_saving"],
                "share_of_sweep_ideal": doc["ideal_per_kernel"]["energy_saving"] / ideal.energy_saving,
                "grouped_saving": doc["grouped"]["energy_saving"],
                "grouped_slowdown": doc["grouped"]["slowdown"],
                "groups": doc["grouped"]["groups"],
                "max_cumulative_slowdown": doc["max_cumulative_slowdown"],
                "converged_at_iteration": doc["converged_at_iteration"],
                "converged_at_seconds": doc["converged_at_seconds"],
                "measurements": doc["measurements"],
                "exploration_seconds": tuner.state.obs.cost_s - tuner.reference.cost_s,
                "run_energy_saving": doc["run"]["energy_saving"],
                "run_slowdown": doc["run"]["slowdown"],
            },
            "source": device.source,
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
