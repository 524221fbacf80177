"""`kdvfs scenario NAME`: the step-driven tuner through a drift scenario (tuner/scenarios.py),
timed in training seconds, against the new conditions' realisable oracle; the summary, one
MLflow run (experiment kdvfs-scenarios), --json. Interrupted: the JSON marked partial and a
KILLED MLflow run, exit 130."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kdvfs.cli.commands._common import (
    Phases,
    add_budget,
    add_json,
    add_mlflow,
    check_outputs,
    check_strategy,
    deferred_interrupts,
    duration_s,
    nonnegative_int,
    write_all,
    write_json,
)
from kdvfs.tuner.text import PRIORS, SOURCE_LABEL, pct, run_identity

SCENARIOS = ("ambient-step", "power-cap", "gpu-swap", "workload-change")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", choices=SCENARIOS, metavar="NAME", help=f"one of {', '.join(SCENARIOS)}")
    parser.add_argument(
        "--device", default="sim:rtx3080ti", help="sim:PRESET | replay:CSV (default %(default)s)"
    )
    parser.add_argument(
        "--workload", default="gpt3-xl-layer", help="gpt3-xl-layer | trace:CSV | table (default %(default)s)"
    )
    parser.add_argument(
        "--strategy", default="botorch", help="search strategy of the tuner (default %(default)s)"
    )
    add_budget(parser)
    parser.add_argument(
        "--seed", type=nonnegative_int, default=0, help="seed of the scenario run (default %(default)s)"
    )
    parser.add_argument(
        "--at-s",
        type=duration_s,
        default=None,
        metavar="S",
        help="apply the change after S seconds of training (default: once settled with the drift watch ready)",
    )
    parser.add_argument(
        "--after-s",
        type=duration_s,
        default=300.0,
        metavar="S",
        help="seconds of training after the change (default %(default)s)",
    )
    parser.add_argument(
        "--plan-store",
        type=Path,
        default=None,
        metavar="DIR",
        help="plan store of the scenario's jobs (default: a temporary directory)",
    )
    parser.add_argument(
        "--fleet-store",
        action="store_true",
        help="gpu-swap: another job of the fleet has tuned the new card and left its plan in the store",
    )
    parser.add_argument(
        "--prior",
        choices=PRIORS,
        default="model",
        help="model: start from the simulated card's own noiseless model and re-plan with it after an alarm; "
        "none: no plan to start from and none re-planned, as on a real card (default %(default)s)",
    )
    add_mlflow(parser)
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    check_outputs(args, {"--json": args.json}, {"--plan-store": args.plan_store})
    from kdvfs.tuner.scenarios import run_scenario

    check_strategy(args.strategy)
    phases, doc = Phases("scenario"), None
    with phases.interruptible():
        phases.enter(f"running scenario {args.scenario}")
        doc = run_scenario(
            args.device,
            args.workload,
            args.scenario,
            strategy=args.strategy,
            budget=args.budget,
            seed=args.seed,
            at_s=args.at_s,
            after_s=args.after_s,
            store_dir=args.plan_store,
            fleet_store=args.fleet_store,
            prior=args.prior,
            progress=lambda msg: print(msg, file=sys.stderr),
        )
    with deferred_interrupts():
        device, workload = _identity_of(args)
        if doc is None:  # the scenario's figures exist only once it is over
            doc = {"scenario": args.scenario, "device": args.device, "source": device.source}
            doc.update(
                strategy=args.strategy,
                budget=args.budget,
                seed=args.seed,
                fleet_store=args.fleet_store,
                prior=args.prior,
            )
        else:
            _print_scenario(args, doc)
        phases.mark(doc)
        failed = 0
        if not args.no_mlflow:

            def log_run() -> None:
                doc["mlflow"] = _log_scenario(args, doc, run_identity(device, workload), phases.run_status)
                print(f"  MLflow: {doc['mlflow']}")

            failed = write_all([("MLflow run", log_run)])
    return phases.exit_status(failed + write_all([("JSON", lambda: write_json(args.json, doc))]))


def _identity_of(args: argparse.Namespace):
    """(device, workload) the scenario starts on, for its run's identity."""
    from kdvfs.runtime.registry import open_device, open_workload

    device = open_device(args.device, seed=args.seed)
    return device, open_workload(args.workload, device)


def _print_scenario(args: argparse.Namespace, doc: dict) -> None:
    label = SOURCE_LABEL[doc["source"]]

    def secs(key: str) -> str:
        return "never" if doc[key] is None else f"{doc[key]:.1f} s"

    print(
        f"scenario {doc['scenario']} on {args.device} ({doc['gpu_after']} after), {args.strategy}, "
        f"budget {pct(args.budget)}, prior {args.prior} [{label}]"
    )
    converged = (
        "not settled"
        if doc["converged_after_s"] is None
        else f"settled after {doc['converged_after_s']:.0f} s"
    )
    print(
        f"  change after {doc['change_at_s']:.0f} s of training ({converged}), then {doc['after_s']:.0f} s more"
        + (f"; job restarted from its prior: {doc['prior_after']['source']}" if doc["restart"] else "")
    )
    print(
        f"  detected after {secs('detected_after_s')} (target {doc['detect_target_s']:.0f} s); the card's new stock "
        f"settled after {secs('settled_after_s')}; within 95% of the oracle to the end after "
        f"{secs('recovered_after_s')}"
        + ("" if doc["recovery_target_s"] is None else f" (target {doc['recovery_target_s']:.0f} s)")
    )
    print(
        f"  max cumulative slowdown after the change {pct(doc['max_slowdown_after'])} "
        f"({doc['budget_violations_after']} points over budget) [{label}, measured by the tuner]"
    )
    print(
        f"  saving at the end {pct(doc['energy_saving_after'])} (slowdown {pct(doc['slowdown_after'])}), "
        f"in-step realisable oracle {pct(doc['oracle_saving_after'])} ({doc['oracle_groups']} groups) "
        f"[{label}, noiseless]"
    )
    if doc["false_alarms_stable"] is not None:
        print(f"  alarms on a stable run of the same length: {doc['false_alarms_stable']}")


def _log_scenario(args: argparse.Namespace, doc: dict, identity: dict[str, str], status: str) -> str:
    """One MLflow run per scenario, ended with `status`: its settings and run_identity as
    parameters, run_identity as tags, its figures as metrics (a figure that is None, never
    reached, is left out), the whole document as scenario.json."""
    from kdvfs.tuner.tracking import Tracker

    tracker = Tracker(args.mlflow_uri, experiment="kdvfs-scenarios")
    params = {
        "scenario": args.scenario,
        "device": args.device,
        "strategy": args.strategy,
        "budget": args.budget,
        "seed": args.seed,
        "change_at_s": doc.get("change_at_s", args.at_s),
        "after_s": doc.get("after_s", args.after_s),
        "fleet_store": args.fleet_store,
        "prior": args.prior,
        **identity,
    }
    run = tracker.start_run(f"{doc['scenario']}-{args.strategy}", params, tags=identity)
    if not doc["partial"]:
        run.log_metrics(
            int(doc["change_at_s"] + doc["after_s"]),
            {
                k: float(v)
                for k, v in doc.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in params
            },
        )
    run.log_dict(doc, "scenario.json")
    run.end(status)
    if not run.written:
        from kdvfs.runtime.types import KdvfsError

        raise KdvfsError(run.url_or_path)
    return run.url_or_path
