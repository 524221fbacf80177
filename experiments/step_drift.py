"""Drift scenarios on the step-driven tuner, timed in seconds of training (issue 14).

    python -m kdvfs.experiments.step_drift --device sim:h200 --workload gpt3-xl-layer --scenario power-cap

A SimulatedJob trains under a StepTuner (prior from the card's model); after --at-s seconds the
scenario (runtime/scenarios.py: power-cap, ambient-step, workload-change) changes the job's
card or kernels in place. Reported, in training seconds after the change:
- detected_after_s: the tuner's first alarm (a held plan's too);
- settled_after_s: when the card's new stock had settled (the tuner left Retuning);
- recovered_after_s: from when the tuner's plan is worth >= 95% of the new conditions'
  realisable oracle (sweep.py over a noiseless copy of the changed card) until the end;
against the issue's targets (5 s for a new power limit or workload; two thermal time
constants for an ambient step; recovery within the settling time plus 60 s). Prints JSON.
"""

from __future__ import annotations

import argparse
import json

from kdvfs.runtime.iteration import schedule_figures
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.scenarios import get_scenario
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.tuner.step_priors import model_plan
from kdvfs.tuner.step_tuner import StepTuner
from kdvfs.tuner.sweep import realisable, run_sweep

#: Share of the new conditions' realisable oracle that counts as recovered; a fraction.
RECOVERED_SHARE = 0.95
#: Detection target for a new power limit or workload; s of training.
DETECT_TARGET_S = 5.0
#: Recovery target beyond the card's settling time; s of training.
RECOVER_EXTRA_S = 60.0


def run_seed(args, seed: int) -> dict:
    scenario = get_scenario(args.scenario)
    device = open_device(args.device, seed=seed)
    workload = open_workload(args.workload, device)
    noiseless = open_device(args.device, noise=0.0)
    tuner = StepTuner(
        workload,
        device.grid.pairs,
        switch_latency_s=device.switch_latency_s,
        energy_update_period_s=device.energy_update_period_s,
        budget=args.budget,
        seed=seed,
        prior=model_plan(noiseless, workload, args.budget),
    )
    job = SimulatedJob(device, workload)
    plans: list[tuple[float, object]] = []  # (training s, the tuner's plan from then on)
    phases: list[tuple[float, str]] = []
    change_s = None
    schedule = tuner.incumbent
    try:
        while device.now_s() < args.seconds:
            if change_s is None and device.now_s() >= args.at_s:
                settled_before = tuner.phases[-1] == "Settled"
                device, new_workload = scenario.apply(device, job.workload, seed=seed)
                if new_workload is not job.workload:
                    job.change_workload(new_workload)
                change_s = device.now_s()
            report = job.step(schedule)
            schedule = tuner.on_step_end(report)
            if not plans or plans[-1][1] != tuner.incumbent:
                plans.append((report.end_s, tuner.incumbent))
            if not phases or phases[-1][1] != type(tuner.phase).__name__:
                phases.append((report.end_s, type(tuner.phase).__name__))
    finally:
        job.reset()
    noiseless, new_workload = scenario.apply(noiseless, workload, seed=seed)
    oracle = realisable(noiseless, run_sweep(noiseless, new_workload), args.budget)
    recovered = None
    for start_s, plan in plans:
        saving = schedule_figures(noiseless, new_workload, plan)[0]
        good = saving >= RECOVERED_SHARE * oracle.energy_saving
        if start_s >= change_s or good:
            recovered = (recovered if recovered is not None else max(start_s, change_s)) if good else None
    alarms = [a for a in tuner.alarms if a.end_s >= change_s]
    left_retuning = [
        t for (t, name), (_, before) in zip(phases[1:], phases) if before == "Retuning" and t >= change_s
    ]
    settled = left_retuning[0] - change_s if left_retuning else (0.0 if alarms and alarms[0].held else None)
    final = schedule_figures(noiseless, new_workload, tuner.incumbent)
    return {
        "seed": seed,
        "settled_before_change": settled_before,
        "detected_after_s": round(alarms[0].end_s - change_s, 1) if alarms else None,
        "alarm": list(alarms[0].reasons) if alarms else None,
        "plan_held": bool(alarms and alarms[0].held),
        "settled_after_s": None if settled is None else round(settled, 1),
        "recovered_after_s": None if recovered is None else round(recovered - change_s, 1),
        "recovery_target_s": None if settled is None else round(settled + RECOVER_EXTRA_S, 1),
        "new_oracle": {"energy_saving": round(oracle.energy_saving, 4), "groups": oracle.groups},
        "final": {"energy_saving": round(final[0], 4), "slowdown": round(final[1], 4)},
        "phases": [name for _, name in phases],
        "account_slowdown": round(tuner.account.slowdown(), 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="sim:h200")
    p.add_argument("--workload", default="gpt3-xl-layer")
    p.add_argument(
        "--scenario", default="power-cap", choices=("power-cap", "ambient-step", "workload-change")
    )
    p.add_argument("--at-s", type=float, default=300.0, help="training seconds before the change")
    p.add_argument("--seconds", type=float, default=600.0, help="simulated training per run, s")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--budget", type=float, default=0.01)
    args = p.parse_args()
    runs = [run_seed(args, s) for s in range(args.seeds)]
    tau_s = open_device(args.device).preset.tau_s
    detect_target_s = 2.0 * tau_s if args.scenario == "ambient-step" else DETECT_TARGET_S
    print(
        json.dumps(
            {
                "device": args.device,
                "workload": args.workload,
                "scenario": args.scenario,
                "change_at_s": args.at_s,
                "seconds": args.seconds,
                "detect_target_s": detect_target_s,
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
