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
    check_dir_output,
    check_file_output,
    pct,
    positive_float,
    positive_int,
    write_all,
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
    from kdvfs.policies.registry import POLICIES
    from kdvfs.runtime.types import KdvfsError

    if args.strategy not in POLICIES:
        raise KdvfsError(f"unknown strategy {args.strategy!r} (known: {', '.join(POLICIES)})")
    check_file_output(args.json, "--json")
    check_file_output(args.plan_out, "--plan-out")
    check_dir_output(args.plan_store, "--plan-store")
    return _Tune(args).run()


class _Tune:
    """One `kdvfs tune`: its phases (reference, tuning, final sweep), then every output."""

    def __init__(self, args: argparse.Namespace) -> None:
        from kdvfs.tuner.commands._common import open_from_args

        self.args = args
        self.device, self.workload = open_from_args(args)
        self.label = SOURCE_LABEL[self.device.source]
        self.status = "FINISHED"
        self.phase = "opening the MLflow run"
        self.tuner = self.store = self.run_handle = None

    def run(self) -> int:
        args = self.args
        try:
            self._start_mlflow()
            print(
                f"tuning {self.workload.name} on {self.device.name} ({args.device}) with {args.strategy}, "
                f"budget {pct(args.budget)}, {args.iterations} iterations [{self.label}]",
                file=sys.stderr,
            )
            self._tune()
        except KeyboardInterrupt:
            self.status = "KILLED"
            print(
                f"kdvfs tune: interrupted while {self.phase}: stock clocks restored, what was measured "
                "and planned so far is kept",
                file=sys.stderr,
            )
        finally:
            self.device.reset_clocks()
        report = self._report()
        failed = self._write_outputs(report)
        if self.status == "KILLED":
            return 130
        return 2 if failed else 0

    def _start_mlflow(self) -> None:
        args = self.args
        if args.no_mlflow:
            return
        from kdvfs import __version__
        from kdvfs.tuner.plan import describe_grid
        from kdvfs.tuner.tracking import Tracker

        tracker = Tracker(args.mlflow_uri, experiment="kdvfs-tune")
        self.run_handle = tracker.start_run(
            f"tune-{args.strategy}",
            {
                "device": args.device,
                "workload": args.workload,
                "strategy": args.strategy,
                "budget": args.budget,
                "seed": args.seed,
                "iterations": args.iterations,
                "window_s": args.window_s,
                "gpu": self.device.name,
                "clock_grid": describe_grid(self.device.grid),
                "source": self.device.source,
                "workload_signature": self.workload.signature,
                "kdvfs_version": __version__,
            },
            tags={
                "gpu": self.device.name,
                "source": self.device.source,
                "workload_signature": self.workload.signature,
                "kdvfs_version": __version__,
            },
        )

    def _tune(self) -> None:
        from kdvfs.tuner.online import OnlineTuner
        from kdvfs.tuner.progress import Progress

        args = self.args
        if args.plan_store is not None:
            from kdvfs.tuner.plan_store import PlanStore

            self.store = PlanStore(args.plan_store)
        self.phase = "measuring the stock reference"
        self.tuner = OnlineTuner(
            self.device,
            self.workload,
            strategy=args.strategy,
            budget=args.budget,
            seed=args.seed,
            window_s=args.window_s,
            plan_store=self.store,
        )
        if self.store is not None:
            self._say_store()
        self.phase = "tuning"
        with Progress("tuning", unit="iterations") as bar:
            self.tuner.run(args.iterations, self._on_point(bar))
        self.device.reset_clocks()
        if not args.no_sweep:
            self.phase = "running the final comparison sweep"
            self._sweep_report = self._report()
            with Progress("final comparison sweep", unit="measurements") as bar:
                self._sweep_report.add_sweep(
                    args.device, seed=args.seed, full_grid=args.full_grid, progress=bar.update
                )

    def _say_store(self) -> None:
        st = self.tuner.state
        found = {
            "store": "stored plan found: running it, checked against the stock reference in training",
            "transferred": f"{st.store_note}: on trial in training",
        }
        print(
            f"plan store {self.store.root}: " + found.get(st.plan_source, f"{st.store_note}; cold start"),
            file=sys.stderr,
        )

    def _on_point(self, bar):
        args, run_handle, n_kernels = self.args, self.run_handle, len(self.workload)
        every = max(1, args.iterations // METRIC_POINTS)
        next_log = [0]

        def on_point(p) -> None:
            bar.update(
                p.iteration,
                args.iterations,
                slowdown=pct(p.slowdown),
                saving=pct(p.energy_saving),
                converged=f"{p.kernels_converged}/{n_kernels}",
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

        return on_point

    def _report(self):
        """The run's report (None when interrupted before the reference was measured)."""
        from kdvfs.tuner.report import tune_report

        if self.tuner is None:
            return None
        existing = getattr(self, "_sweep_report", None)
        report = existing if existing is not None else tune_report(self.tuner, self.args.budget)
        st = self.tuner.state
        report.doc["plan_source"] = st.plan_source
        report.doc["plan_store_note"] = st.store_note
        report.doc["drift_alarms"] = [{"iteration": a.iteration, **a.summary()} for a in st.alarms]
        report.doc["reconverged_at_iterations"] = list(st.reconverged_at)
        report.doc["partial"] = self.status != "FINISHED"
        if report.doc["partial"]:
            report.doc["interrupted_while"] = self.phase
        return report

    def _write_outputs(self, report) -> int:
        """Print the report, then write each output whatever the others do; how many failed."""
        args, st = self.args, self.tuner and self.tuner.state
        doc = report.doc if report is not None else {"partial": True, "interrupted_while": self.phase}
        plan = report.plan(args.strategy) if report is not None else None
        if report is not None:
            report.print(self.label)
            if st.alarms:
                held = sum(a.held for a in st.alarms)
                print(
                    f"  drift: {len(st.alarms)} alarm(s)"
                    + (f" ({held} kept the plan while the card warmed)" if held else "")
                    + f", the first after {st.alarms[0].iteration} iterations; re-converged at "
                    + (", ".join(map(str, st.reconverged_at)) if st.reconverged_at else "none yet")
                )
            if self.store is not None:
                print(f"  plan source: {st.plan_source}" + (f" ({st.store_note})" if st.store_note else ""))
        outputs = []
        stored = (
            self.store is not None and st.converged_at_iteration is not None and st.plan_source == "tuned"
        )
        if plan is not None and stored:
            outputs.append(("plan store", lambda: print(f"  plan stored: {self.store.put(plan)}")))
        if plan is not None and args.plan_out is not None:
            outputs.append(("plan file", lambda: self._save_plan(plan)))
        if self.run_handle is not None:
            outputs.append(("MLflow run", lambda: self._log_run(report, plan, doc)))
        outputs.append(("JSON", lambda: write_json(args.json, doc)))
        return write_all(outputs)

    def _save_plan(self, plan) -> None:
        from kdvfs.tuner.plan import save_plan

        save_plan(plan, self.args.plan_out)
        print(f"  plan written to {self.args.plan_out}")

    def _log_run(self, report, plan, doc) -> None:
        run_handle = self.run_handle
        if report is not None:
            metrics = {
                "final_energy_saving": doc["energy_saving"],
                "final_slowdown": doc["slowdown"],
                "run_energy_saving": doc["run"]["energy_saving"],
                "run_slowdown": doc["run"]["slowdown"],
                "ideal_energy_saving": doc["ideal_per_kernel"]["energy_saving"],
                "measurements_total": doc["measurements"],
            }
            if doc["converged_at_iteration"] is not None:
                metrics["converged_at_iteration"] = doc["converged_at_iteration"]
            if "sweep" in doc:
                metrics["sweep_energy_saving"] = doc["sweep"]["energy_saving"]
                metrics["realisable_energy_saving"] = doc["sweep"]["realisable"]["energy_saving"]
            run_handle.log_metrics(self.tuner.account.iterations, metrics)
            run_handle.log_dict(plan.to_dict(), "plan.json")
            for name, fig in report.figures():
                run_handle.log_figure(fig, name)
        run_handle.log_dict(doc, "tune.json")
        run_handle.end(self.status)
        print(f"  MLflow: {run_handle.url_or_path}")
        doc["mlflow"] = run_handle.url_or_path
