"""Drift scenarios and plan reuse (issue 6), top to bottom.

    python -m kdvfs.experiments.drift_scenarios --device sim:rtx3080ti --out drift.json

For the device: each of the four scenarios (ambient-step, power-cap, gpu-swap,
workload-change) through tuner/adaptation.run_scenario (what `kdvfs compare --scenario NAME`
runs: the online tuner to convergence, the change, the run continued, the oracle sweep under
the new conditions, a stable run of the same length for false alarms), then the restart
measurement (adaptation.measure_restart: cold start vs a restart that finds its plan in the
store). gpu-swap runs twice: on a card new to the plan store (the old card's plan carried
over, tuner/transfer.py, or a cold start), and with a store shared by the fleet where another
job has already tuned the new card. Prints a table and the JSON; every figure is simulated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kdvfs.runtime.scenarios import SCENARIOS
from kdvfs.tuner.adaptation import Session, measure_restart, run_scenario


def _n(x) -> str:
    return "never" if x is None else str(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="sim:rtx3080ti")
    p.add_argument("--workload", default="gpt3-xl-layer")
    p.add_argument("--strategy", default="ucb")
    p.add_argument("--budget", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument(
        "--after-iterations",
        type=int,
        default=None,
        help="iterations run after the change (default: twice the first convergence's)",
    )
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args()

    session = Session(args.device, args.workload, strategy=args.strategy, budget=args.budget, seed=args.seed)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr)

    after = args.after_iterations
    results = {
        name: run_scenario(session, name, after_iterations=after, progress=say)
        for name in args.scenarios.split(",")
    }
    if "gpu-swap" in results:  # again, where the fleet's shared store has a plan for the new card
        results["gpu-swap+fleet-store"] = run_scenario(
            session, "gpu-swap", after_iterations=after, fleet_store=True, progress=say
        )
    restart = measure_restart(session)
    doc = {
        "device": args.device,
        "workload": args.workload,
        "strategy": args.strategy,
        "budget": args.budget,
        "seed": args.seed,
        "source": "simulated",
        "scenarios": results,
        "restart": restart,
    }
    print(
        f"{'scenario':22s} {'detect':>7s} {'recover':>8s} {'max slow':>9s} {'saving':>7s} {'oracle':>7s} {'lost':>7s} {'false al.':>9s}"
    )
    for name, r in results.items():
        print(
            f"{name:22s} {_n(r['detected_after_iterations']):>7s} {_n(r['recovered_after_iterations']):>8s} "
            f"{100 * r['max_slowdown']:8.2f}% {100 * r['energy_saving_after']:6.2f}% {100 * r['oracle_saving_after']:6.2f}% "
            f"{100 * r['energy_lost_vs_oracle_share']:6.2f}% "
            f"{r['false_alarms_stable']:9d}"
        )
    print(
        f"restart with a stored plan: old saving reached after {_n(restart['restart_iterations_to_old_saving'])} iterations "
        f"vs {_n(restart['cold_iterations_to_old_saving'])} for a cold start [simulated]"
    )
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
