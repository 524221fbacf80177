"""`kdvfs tune`: tune clocks online during a (simulated) training run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kdvfs.tuner.commands._common import (
    SOURCE_LABEL,
    add_budget,
    add_device_workload,
    add_json,
    pct,
    positive_float,
    positive_int,
    write_json,
)

#: About how many points of a run are logged as MLflow metrics (one per iterations / this).
METRIC_POINTS = 500
"""At most this many points of a run go to MLflow (the run itself may report tens of thousands)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_device_workload(parser)
    parser.add_argument("--strategy", default="botorch", help="search strategy (default %(default)s)")
    add_budget(parser)
    parser.add_argument(
        "--iterations",
        type=positive_int,
        default=1_500_000,
        help="training iterations to run (default %(default)s)",
    )
    parser.add_argument(
        "--window-s",
        type=positive_float,
        default=0.5,
        help="seconds of one exploration measurement (default %(default)s)",
    )
    parser.add_argument("--plan-out", type=Path, help="write the final plan here")
    parser.add_argument(
        "--plan-store",
        type=Path,
        metavar="DIR",
        help="reuse the stored plan for this GPU, clock grid and workload (verified in training first) "
        "and store the final plan there",
    )
    parser.add_argument(
        "--mlflow-uri",
        default=None,
        help="tracking URI (default: MLFLOW_TRACKING_URI, else MLflow's default ./mlflow.db)",
    )
    parser.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    parser.add_argument(
        "--no-sweep", action="store_true", help="skip the full sweep run for comparison at the end"
    )
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    from kdvfs.tuner.commands._common import open_from_args
    from kdvfs.tuner.online import OnlineTuner
    from kdvfs.tuner.progress import Progress
    from kdvfs.tuner.report import tune_report

    device, workload = open_from_args(args)
    label = SOURCE_LABEL[device.source]
    tracker = run_handle = None
    if not args.no_mlflow:
        from kdvfs.tuner.tracking import Tracker

        tracker = Tracker(args.mlflow_uri, experiment="kdvfs-tune")
        run_handle = tracker.start_run(
            f"tune-{args.strategy}",
            {
                "device": args.device,
                "workload": args.workload,
                "strategy": args.strategy,
                "budget": args.budget,
                "seed": args.seed,
                "iterations": args.iterations,
                "window_s": args.window_s,
            },
        )
    print(
        f"tuning {workload.name} on {device.name} ({args.device}) with {args.strategy}, budget {pct(args.budget)}, "
        f"{args.iterations} iterations [{label}]",
        file=sys.stderr,
    )
    store = None
    if args.plan_store is not None:
        from kdvfs.tuner.plan_store import PlanStore

        store = PlanStore(args.plan_store)
    tuner = OnlineTuner(
        device,
        workload,
        strategy=args.strategy,
        budget=args.budget,
        seed=args.seed,
        window_s=args.window_s,
        plan_store=store,
    )
    if store is not None:
        found = {
            "store": "stored plan verified in training, running it",
            "transferred": f"{tuner.state.store_note}: on trial in training",
        }
        print(
            f"plan store {store.root}: "
            + found.get(tuner.state.plan_source, f"{tuner.state.store_note}; cold start"),
            file=sys.stderr,
        )
    every = max(1, args.iterations // METRIC_POINTS)
    next_log = [0]

    def on_point(p) -> None:
        bar.update(
            p.iteration,
            args.iterations,
            spent=f"{pct(p.slowdown)}",
            saving=f"{pct(p.energy_saving)}",
            converged=f"{p.kernels_converged}/{len(workload)}",
        )
        if run_handle is not None and p.iteration >= next_log[0]:
            next_log[0] = p.iteration + every
            run_handle.log_metrics(
                p.iteration,
                {
                    "energy_saving_so_far": p.energy_saving,
                    "slowdown_so_far": p.slowdown,
                    "budget_left_s": p.budget_left_s,
                    "measurements": p.measurements,
                    "kernels_converged": p.kernels_converged,
                    "groups": p.groups,
                },
            )

    status = "FINISHED"
    try:
        with Progress("tune", unit="it") as bar:
            tuner.run(args.iterations, on_point)
    except KeyboardInterrupt:
        status = "KILLED"
        print("kdvfs tune: interrupted: stock clocks restored, the plan so far is kept", file=sys.stderr)
    finally:
        device.reset_clocks()
    report = tune_report(
        tuner,
        args.budget,
        sweep_device_spec=args.device if status == "FINISHED" and not args.no_sweep else None,
        seed=args.seed,
        full_grid=args.full_grid,
    )
    st = tuner.state
    report.doc["plan_source"] = st.plan_source
    report.doc["plan_store_note"] = st.store_note
    report.doc["drift_alarms"] = [{"iteration": a.iteration, **a.summary()} for a in st.alarms]
    report.doc["reconverged_at_iterations"] = list(st.reconverged_at)
    report.print(label)
    if st.alarms:
        held = sum(a.held for a in st.alarms)
        print(
            f"  drift: {len(st.alarms)} alarm(s)"
            + (f" ({held} kept the plan while the card warmed)" if held else "")
            + f", first after {st.alarms[0].iteration} iterations; re-converged at {st.reconverged_at or 'not yet'}"
        )
    if store is not None:
        print(f"  plan source: {st.plan_source}" + (f" ({st.store_note})" if st.store_note else ""))
    if store is not None and st.converged_at_iteration is not None and st.plan_source == "tuned":
        print(f"  plan stored: {store.put(report.plan(args.strategy))}")
    if args.plan_out is not None:
        from kdvfs.tuner.plan import save_plan

        save_plan(report.plan(args.strategy), args.plan_out)
        print(f"  plan written to {args.plan_out}")
    if run_handle is not None:
        run_handle.log_metrics(
            tuner.account.iterations,
            {"final_energy_saving": report.doc["energy_saving"], "final_slowdown": report.doc["slowdown"]},
        )
        run_handle.log_dict(report.plan(args.strategy).to_dict(), "plan.json")
        run_handle.log_dict(report.doc, "tune.json")
        for name, fig in report.figures():
            run_handle.log_figure(fig, name)
        run_handle.end(status)
        print(f"  MLflow: {run_handle.url_or_path}")
        report.doc["mlflow"] = run_handle.url_or_path
    write_json(args.json, report.doc)
    return 130 if status == "KILLED" else 0
