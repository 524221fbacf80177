"""`kdvfs tune`: the step-driven tuner on a simulated or replayed training job (tuner/session.py).

Phases of the command: the MLflow run opened, the prior chosen (plan store -- the service's
with --service, then --plan-store --, another card's plan carried, the card's model, or none), training under the tuner with live progress, the
oracles evaluated in the step on a noiseless copy of the card (tuner/oracle.py: one-knob,
realisable, ideal per-kernel; --no-sweep skips them), then every output; Ctrl-C in
any of them restores stock clocks and keeps what was measured and planned (partial JSON, the
plan so far, the MLflow run KILLED). With --service URL the strategy runs in `kdvfs serve`
(service/client.py: ServiceStrategy; the job's own strategy answers while the service does
not, and its tells wait in an outbox) and the converged plan is stored there.
The plan store (--plan-store, --service) gets the converged plan; when it gets nothing the
run says why in one line (and the JSON's plan_not_stored): a dry run, no convergence, or a
plan that is the stored plan the run started from. An interrupt after every output was
written cuts nothing: the JSON's partial: false stands, and the exit is 130 (143 for
SIGTERM) with one line saying the outputs are complete (cli/__init__.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from kdvfs.cli.commands._common import (
    add_budget,
    add_device_workload,
    add_json,
    add_mlflow,
    check_outputs,
    check_strategy,
    duration_s,
    printing,
    write_all,
    write_json,
)
from kdvfs.tuner.text import PRIORS, SOURCE_LABEL, pct

#: At most this many points of a run go to MLflow as step metrics (a point is a training second).
METRIC_POINTS = 500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_device_workload(parser)
    parser.add_argument("--strategy", default="botorch", help="search strategy (default %(default)s)")
    add_budget(parser)
    parser.add_argument(
        "--seconds",
        type=duration_s,
        default=600.0,
        help="seconds of (simulated) training to run (default %(default)s)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="record the clock requests but apply none, as on a real card in dry run (the null test)",
    )
    parser.add_argument(
        "--prior",
        choices=PRIORS,
        default="model",
        help="start from the card's own per-kernel model (model) or from nothing (none); a plan "
        "found in --plan-store comes first (default %(default)s)",
    )
    parser.add_argument(
        "--sites",
        choices=("auto", "modules", "kernels"),
        default="auto",
        help="where the job switches clocks: the step, passes and submodules (modules), every kernel "
        "(kernels), or kernels on a card that switches within 1 ms, else modules (auto, the default)",
    )
    parser.add_argument(
        "--job-noise",
        metavar="NAME|FILE",
        default=None,
        help="add a recorded training job's waits to every step: vision, hf or sync (H200 recordings, "
        "runtime/job_noise.py) or a JSON file of a fitted job noise (default: none, the kernels alone)",
    )
    parser.add_argument("--plan-out", type=Path, help="write the final plan here")
    parser.add_argument(
        "--plan-store",
        type=Path,
        metavar="DIR",
        help="start from the stored plan for this GPU, clock grid and workload (verified in training "
        "first) and store the converged plan there",
    )
    parser.add_argument(
        "--service",
        metavar="URL",
        help="a tuning service (kdvfs serve), e.g. http://127.0.0.1:8470: ask and tell through it, "
        "start from its stored plan, store the converged plan there; the job tunes on alone "
        "whenever it does not answer",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="F",
        help="the job's token for --service (the first word of the file's first line)",
    )
    parser.add_argument(
        "--job",
        default=None,
        help="the job's name in the service (default: tune- and a random suffix)",
    )
    add_mlflow(parser)
    parser.add_argument(
        "--no-sweep",
        action="store_true",
        help="skip the oracles (one-knob, realisable, ideal per-kernel: the card's noiseless in-step "
        "evaluation; seconds on a layer, minutes on the whole GPT-3-XL step)",
    )
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    from kdvfs.runtime.types import KdvfsError

    check_strategy(args.strategy)
    check_outputs(args, {"--json": args.json, "--plan-out": args.plan_out}, {"--plan-store": args.plan_store})
    if args.service is None and (args.token_file is not None or args.job is not None):
        raise KdvfsError("--token-file and --job need --service URL")
    if args.service is not None and not args.service.startswith(("http://", "https://")):
        raise KdvfsError(f"--service: {args.service!r} is not an http:// or https:// URL")
    if args.service is not None:
        from kdvfs.extras import require_extra

        require_extra("service", ["httpx"], "the tuning service's client (--service)")
        from kdvfs.service.client import check_service_url, read_token

        check_service_url(args.service)
        if args.token_file is not None:
            read_token(args.token_file)  # a token file that cannot be read fails before any work
    try:
        tune = _Tune(args)
    except KeyboardInterrupt:  # opening the card and the workload: nothing measured yet
        print("kdvfs tune: interrupted while starting: nothing was measured", file=sys.stderr)
        write_all(
            [("JSON", lambda: write_json(args.json, {"partial": True, "interrupted_while": "starting"}))]
        )
        return 130
    return tune.run()


class _Tune:
    """One `kdvfs tune`: its phases (prior, training, oracle), then every output."""

    def __init__(self, args: argparse.Namespace) -> None:
        from kdvfs.cli.commands._common import open_from_args
        from kdvfs.runtime.job_noise import job_noise

        self.args = args
        self.job_noise = job_noise(args.job_noise) if args.job_noise is not None else None
        # the job's waits for its host, charged by the yardstick and the plan's figures alike
        self.waits = None if self.job_noise is None else self.job_noise.yardstick_waits()
        self.device, self.workload = open_from_args(args)
        self.label = SOURCE_LABEL[self.device.source]
        # the steps' label: the noiseless figures (prior, oracle, plan) carry no job noise
        self.steps_label = self.label + (f", job noise: {self.job_noise.name}" if self.job_noise else "")
        self.status = "FINISHED"
        self.phase = "opening the MLflow run"
        self.session = self.store = self.run_handle = self.oracle = None
        self.service_strategy = None  # the service's strategy (--service)
        self.plan_stored: str | None = None

    def run(self) -> int:
        args = self.args
        try:
            self._start_mlflow()
            print(
                f"tuning {self.workload.name} on {self.device.name} ({args.device}) with {args.strategy}, "
                f"budget {pct(args.budget)}, {args.seconds:g} s of training"
                + (", dry run (no clock applied)" if args.dry_run else "")
                + f" [{self.steps_label}]",
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
        self.args.outputs_written = True  # an interrupt from here cuts nothing (cli/__init__.py)
        if self.status == "KILLED":
            return 130
        return 2 if failed else 0

    def _start_mlflow(self) -> None:
        args = self.args
        if args.no_mlflow:
            return
        from kdvfs.tuner.text import run_identity
        from kdvfs.tuner.tracking import Tracker

        identity = run_identity(self.device, self.workload)
        params = {
            "device": args.device,
            "workload": args.workload,
            "strategy": args.strategy,
            "budget": args.budget,
            "seed": args.seed,
            "seconds": args.seconds,
            "dry_run": args.dry_run,
            "prior": args.prior,
            "sites": args.sites,
            "job_noise": self.job_noise.name if self.job_noise is not None else "none",
        }
        tracker = Tracker(args.mlflow_uri, experiment="kdvfs-tune")
        self.run_handle = tracker.start_run(f"tune-{args.strategy}", params | identity, tags=identity)

    def _tune(self) -> None:
        from kdvfs.runtime.registry import open_device
        from kdvfs.tuner.oracle import oracles
        from kdvfs.tuner.progress import Progress
        from kdvfs.tuner.run import choose_prior, job_sites
        from kdvfs.tuner.session import TuneSession

        args = self.args
        noiseless = open_device(args.device, noise=0.0, full_grid=args.full_grid)
        if args.plan_store is not None:
            from kdvfs.tuner.plan_store import PlanStore

            self.store = PlanStore(args.plan_store)
        if args.service is not None:
            self.phase = "opening the service's session"
            self._open_service()
        self.phase = "choosing the prior"
        sites = job_sites(self.workload, self.device.switch_latency_s, args.sites)
        prior = choose_prior(
            self.device,
            self.workload,
            args.budget,
            store=self.store,
            model=noiseless if args.prior == "model" else None,
            sites=sites,
        )
        self._say_prior(prior)
        self.session = TuneSession(
            self.device,
            self.workload,
            strategy=self.service_strategy if self.service_strategy is not None else args.strategy,
            budget=args.budget,
            seed=args.seed,
            prior=prior,
            dry_run=args.dry_run,
            # a copy of its own: re-planning after an alarm sets its power cap, the oracle's must not move
            model=open_device(args.device, noise=0.0, full_grid=args.full_grid)
            if args.prior == "model"
            else None,
            sites=sites,
            job_noise=self.job_noise,
        )
        self.phase = "training under the tuner"
        with Progress("tuning", unit="s of training") as bar:
            try:
                self.session.run_until(args.seconds, self._on_point(bar))
            finally:
                if self.service_strategy is not None:
                    self.service_strategy.end()  # what waits in the outbox goes now, if the service answers
        if not args.no_sweep:
            self.phase = "computing the oracles (the card's noiseless in-step evaluation)"
            self.oracle = oracles(noiseless, self.workload, args.budget, sites=sites, **(self.waits or {}))

    def _open_service(self) -> None:
        """The service's strategy for this job and its plan store (the local one behind it)."""
        import uuid

        from kdvfs.service.client import ServiceClient, ServicePlanStore, read_token, service_strategy

        args = self.args
        token = read_token(args.token_file) if args.token_file is not None else None
        client = ServiceClient(args.service, token)
        self.store = ServicePlanStore(client, self.store)
        self.service_strategy = service_strategy(
            client,
            job=args.job or f"tune-{uuid.uuid4().hex[:12]}",
            gpu_name=self.device.name,
            pairs=self.device.grid.pairs,
            workload=self.workload,
            budget=args.budget,
            strategy=args.strategy,
            seed=args.seed,
        )
        print(
            f"service: {client.url} (its strategy; this job's own while it does not answer)", file=sys.stderr
        )

    def _say_prior(self, prior) -> None:
        what = {
            "store": "the stored plan, verified against stock in training first",
            "transferred": "another card's plan carried to this card's clocks, verified in training first",
            "measured": "the pass-level plan of this card's measured sweep, verified in training first",
            "model": f"the card's own per-kernel model [{self.label}, noiseless], verified in training first",
            "none": "nothing (groups from the measured segment times)",
        }[prior.source]
        print(f"prior: {what}" + (f" ({prior.note})" if prior.note else ""), file=sys.stderr)

    def _on_point(self, bar):
        from kdvfs.tuner.run import point_metrics

        args, run_handle = self.args, self.run_handle
        every_s = max(1.0, args.seconds / METRIC_POINTS)
        next_log = [0.0]

        def on_point(p) -> None:
            bar.update(
                int(p.end_s),
                int(args.seconds),
                phase=p.phase,
                slowdown=pct(p.slowdown) if p.slowdown == p.slowdown else "-",
                saving=pct(p.energy_saving) if p.energy_saving == p.energy_saving else "-",
                adopted=p.adoptions,
            )
            stock_known = math.isfinite(p.slowdown)  # nothing to log before the reference
            if run_handle is not None and stock_known and p.end_s >= next_log[0]:
                next_log[0] = p.end_s + every_s
                run_handle.log_metrics(p.step, point_metrics(p))

        return on_point

    def _report(self):
        """The run's report (None when interrupted before training began)."""
        from kdvfs.tuner.report import tune_report

        if self.session is None:
            return None
        report = tune_report(self.session, self.oracle, self.args.strategy, waits=self.waits)
        report.doc["partial"] = self.status != "FINISHED"
        report.doc["job_noise"] = self.job_noise.name if self.job_noise is not None else "none"
        if self.job_noise is not None:
            report.doc["job_noise_fit"] = self.job_noise.to_dict()
        if self.service_strategy is not None:
            report.doc["service"] = {
                "url": self.args.service,
                "job": self.service_strategy.session.job,
                "session_id": self.service_strategy.session_id,
                "answers": dict(self.service_strategy.answers),
                "told": self.service_strategy.told,
                "tells_waiting": len(self.service_strategy.outbox),
                "refused": self.service_strategy.refused,
            }
        if report.doc["partial"]:
            report.doc["interrupted_while"] = self.phase
        return report

    def _write_outputs(self, report) -> int:
        """Print the report, then write each output whatever the others do; how many failed."""
        args = self.args
        doc = report.doc if report is not None else {"partial": True, "interrupted_while": self.phase}
        plan = report.plan(args.strategy) if report is not None else None
        if report is not None:
            with printing():  # a closed stdout pipe loses the printed report, not the outputs
                report.print(self.label)
                if self.job_noise is not None:
                    print(f"  every step carried the job noise {self.job_noise.name!r} [{self.steps_label}]")
        outputs = []
        if plan is not None and self.store is not None:
            why_not = self._why_not_stored()
            if why_not is None:
                outputs.append(("plan store", lambda: self._store_plan(plan, doc)))
            else:
                doc["plan_not_stored"] = why_not
                with printing():
                    print(f"  plan not stored: {why_not}")
        if plan is not None and args.plan_out is not None:
            outputs.append(("plan file", lambda: self._save_plan(plan)))
        if self.run_handle is not None:
            outputs.append(("MLflow run", lambda: self._log_run(report, plan, doc)))
        outputs.append(("JSON", lambda: write_json(args.json, doc)))
        return write_all(outputs)

    def _why_not_stored(self) -> str | None:
        """Why the plan store gets nothing from this run (None: the plan is stored). A plan
        equal to its prior is stored unless the prior came from the store itself: a plan from
        the card's model or another card, now verified in training, is worth keeping."""
        session = self.session
        if self.args.dry_run:
            return "a dry run applies no clock, so its plan is not measured"
        if session.converged_after_s is None:
            return "the tuner did not converge in the time given (--seconds)"
        if session.tuner.incumbent == session.prior.schedule and session.prior.source == "store":
            return "it is the stored plan this run started from (verified again, unchanged)"
        return None

    def _store_plan(self, plan, doc) -> None:
        where = self.store.put(plan)
        doc["plan_stored"] = str(where)
        print(f"  plan stored: {where}")

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
                "max_cumulative_slowdown": doc["max_cumulative_slowdown"],
                "trials": doc["trials"],
            }
            if doc["converged_after_s"] is not None:
                metrics["converged_after_s"] = doc["converged_after_s"]
            if doc["realisable_oracle"] is not None:
                metrics["realisable_energy_saving"] = doc["realisable_oracle"]["energy_saving"]
                metrics["ideal_energy_saving"] = doc["ideal_per_kernel"]["energy_saving"]
            run_handle.log_metrics(doc["steps"], metrics)
            run_handle.log_dict(plan.to_dict(), "plan.json")
            for name, fig in report.figures():
                run_handle.log_figure(fig, name)
        run_handle.log_dict(doc, "tune.json")
        run_handle.end(self.status)
        if not run_handle.written:
            from kdvfs.runtime.types import KdvfsError

            raise KdvfsError(run_handle.url_or_path)
        doc["mlflow"] = run_handle.url_or_path
        print(f"  MLflow: {run_handle.url_or_path}")
