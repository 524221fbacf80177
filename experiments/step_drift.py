"""Drift scenarios on the step-driven tuner, timed in seconds of training, over seeds.

    python -m kdvfs.experiments.step_drift --device sim:h200 --workload gpt3-xl-layer --scenario power-cap

Each seed runs tuner/scenarios.py's run_scenario (the same code as `kdvfs scenario`):
a simulated job trains under the tuner (--prior model: the card's own model; none: nothing)
until settled with its drift watch ready (or --at-s), the scenario changes the card or the
kernels in place, training goes on for --after-s. Reported per seed, in training seconds
after the change: detected_after_s, settled_after_s (the card's new stock settled: the tuner
left Retuning),
recovered_after_s (the plan >= 95% of the new conditions' realisable oracle, to the end),
against the targets of tuner/scenarios.py (DETECT_TARGET_S, DETECT_TARGET_TAUS,
RECOVER_EXTRA_S); a summary of the worst seed. Prints JSON.
"""

from __future__ import annotations

import argparse
import json

from kdvfs.tuner.scenarios import PRIORS, run_scenario


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="sim:h200")
    p.add_argument("--workload", default="gpt3-xl-layer")
    p.add_argument(
        "--scenario",
        default="power-cap",
        choices=("power-cap", "ambient-step", "workload-change", "gpu-swap"),
    )
    p.add_argument(
        "--at-s", type=float, default=None, help="training seconds before the change (default: settled)"
    )
    p.add_argument("--after-s", type=float, default=300.0, help="training seconds after the change")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--budget", type=float, default=0.01)
    p.add_argument("--prior", default="model", choices=PRIORS, help="what the job starts from")
    p.add_argument("--no-stable", action="store_true", help="skip the stable run that counts false alarms")
    args = p.parse_args()
    runs = [
        run_scenario(
            args.device,
            args.workload,
            args.scenario,
            budget=args.budget,
            seed=seed,
            at_s=args.at_s,
            after_s=args.after_s,
            stable=not args.no_stable,
            prior=args.prior,
        )
        for seed in range(args.seeds)
    ]

    def worst(key: str):
        values = [r[key] for r in runs]
        return None if None in values else max(values)

    summary = {
        "seeds": args.seeds,
        "worst_detected_after_s": worst("detected_after_s"),
        "detect_target_s": runs[0]["detect_target_s"],
        "worst_settled_after_s": worst("settled_after_s"),
        "worst_recovered_after_s": worst("recovered_after_s"),
        "recovery_targets_s": [r["recovery_target_s"] for r in runs],
        "recovered_in_target": int(
            sum(
                r["recovered_after_s"] is not None
                and r["recovery_target_s"] is not None
                and r["recovered_after_s"] <= r["recovery_target_s"]
                for r in runs
            )
        ),
        "largest_slowdown_after": max(r["max_slowdown_after"] for r in runs),
    }
    print(json.dumps({"summary": summary, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
