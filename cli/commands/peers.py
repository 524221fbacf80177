"""`kdvfs peers NAMES`: kdvfs against its peers (tuner/peers.py), whole training runs on
identically seeded simulated cards, scored against one stock run; the table, a plot (MLflow
and --plot), --json. Interrupted: the JSON marked partial and a KILLED MLflow run, exit 130."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kdvfs.cli.commands._common import (
    Phases,
    add_budget,
    add_json,
    add_mlflow,
    check_outputs,
    deferred_interrupts,
    noise_scale,
    nonnegative_int,
    positive_int,
    write_all,
    write_json,
)
from kdvfs.tuner.text import pct, run_identity


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "peers",
        type=_names,
        metavar="NAMES",
        help="comma-separated, of kdvfs,zeus-power-limit,envpipe-sm-stepdown,paper-sweep "
        "(zeus-power-limit needs the 'peers' extra)",
    )
    parser.add_argument(
        "--device", default="sim:rtx3080ti", help="sim:PRESET, a simulated card (default %(default)s)"
    )
    parser.add_argument(
        "--workload", default="gpt3-xl-layer", help="gpt3-xl-layer | trace:CSV | table (default %(default)s)"
    )
    add_budget(parser)
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        metavar="N",
        help="training steps of every peer's run (default: 24 h of training at stock)",
    )
    parser.add_argument(
        "--seed", type=nonnegative_int, default=0, help="seed of every card (default %(default)s)"
    )
    parser.add_argument(
        "--noise",
        type=noise_scale,
        default=None,
        help="measurement-noise scale, 0 to 20 (default: the device's)",
    )
    parser.add_argument(
        "--plot", type=Path, default=None, metavar="PNG", help="also save the peers' plot here"
    )
    add_mlflow(parser)
    add_json(parser)


def _names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def run(args: argparse.Namespace) -> int:
    check_outputs(args, {"--json": args.json, "--plot": args.plot})
    from kdvfs.runtime.registry import open_device, open_workload
    from kdvfs.tuner.peers import check_peers, run_peers

    check_peers(args.peers)  # unknown names and missing extras, before any work
    phases, doc = Phases("peers"), None

    def say(name: str) -> None:
        phases.enter(f"running {name}")
        print(f"running {name} ...", file=sys.stderr)

    with phases.interruptible():
        doc = run_peers(
            args.device,
            args.workload,
            args.peers,
            budget=args.budget,
            steps=args.steps,
            seed=args.seed,
            noise=args.noise,
            progress=say,
        )
    with deferred_interrupts():
        device = open_device(args.device)
        workload = open_workload(args.workload, device)
        if doc is None:  # the peers' figures exist only once every run is over
            doc = {
                "device": args.device,
                "gpu": device.name,
                "workload": workload.name,
                "budget": args.budget,
            }
            doc.update(steps=args.steps, seed=args.seed, source="simulated", peers={})
        phases.mark(doc)
        fig = None if doc["partial"] else _print_peers(args, doc)
        failed = 0
        if not args.no_mlflow:

            def log_run() -> None:
                doc["mlflow"] = _log_peers(
                    args.mlflow_uri, doc, fig, run_identity(device, workload), phases.run_status
                )
                print(f"  MLflow: {doc['mlflow']}")

            failed = write_all([("MLflow run", log_run)])
    outputs = [("JSON", lambda: write_json(args.json, doc))]
    if fig is not None and args.plot is not None:
        outputs.insert(0, ("plot", lambda: _save_plot(fig, args.plot)))
    return phases.exit_status(failed + write_all(outputs))


def _save_plot(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", file=sys.stderr)


def _print_peers(args: argparse.Namespace, doc: dict[str, Any]):
    """Print the peers' table; the figure."""
    from kdvfs.tuner.plots import peers_figure

    print(
        f"peers on {doc['gpu']} ({args.device}), {doc['workload']}, {doc['steps']:,} steps, budget {pct(args.budget)}, "
        f"seed {args.seed} [simulated]; stock trains {doc['stock']['training_s'] / 3600:.2f} h"
    )
    print(f"  {'peer':22s} {'saving':>8s} {'slowdown':>9s} {'training h':>11s}  source")
    for name, p in doc["peers"].items():
        over = "  OVER BUDGET" if p["slowdown"] > args.budget else ""
        print(
            f"  {name:22s} {pct(p['energy_saving']):>8s} {pct(p['slowdown']):>9s} {p['training_s'] / 3600:11.2f}  {p['source']}{over}"
        )
        if "as_paper_ran_it" in p:
            q = p["as_paper_ran_it"]
            print(f"  {'  (switches ignored)':22s} {pct(q['energy_saving']):>8s} {pct(q['slowdown']):>9s}")
    print("  (saving and slowdown against stock over the whole run, tuning included; the card's true energy)")
    return peers_figure([doc], "kdvfs against its peers")


def _log_peers(uri: str | None, doc: dict[str, Any], fig, identity: dict[str, str], status: str) -> str:
    """One MLflow run, ended with `status`: settings and run_identity as params, run_identity
    as tags, each peer's saving and slowdown as metrics, the plot and the document."""
    from kdvfs.tuner.tracking import Tracker

    tracker = Tracker(uri, experiment="kdvfs-peers")
    params = {k: doc[k] for k in ("device", "workload", "budget", "steps", "seed")}
    run = tracker.start_run(f"peers-{doc['workload']}", {**params, **identity}, tags=identity)
    if doc["peers"]:
        run.log_metrics(
            doc["steps"],
            {f"{n}.{k}": float(p[k]) for n, p in doc["peers"].items() for k in ("energy_saving", "slowdown")},
        )
    if fig is not None:
        run.log_figure(fig, "peers.png")
    run.log_dict(doc, "peers.json")
    run.end(status)
    if not run.written:
        from kdvfs.runtime.types import KdvfsError

        raise KdvfsError(run.url_or_path)
    return run.url_or_path
