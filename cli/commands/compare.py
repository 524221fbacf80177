"""`kdvfs compare`: search strategies against the full sweep, over seeds (tuner/compare.py).
The tuner through a drift scenario is `kdvfs scenario`; kdvfs against its peers, `kdvfs peers`."""

from __future__ import annotations

import argparse
from pathlib import Path

from kdvfs.cli.commands._common import (
    Phases,
    add_budget,
    add_json,
    add_mlflow,
    check_outputs,
    deferred_interrupts,
    duration_s,
    noise_scale,
    positive_int,
    write_all,
    write_json,
)
from kdvfs.tuner.text import SOURCE_LABEL, pct

STRATEGIES = ("sweep", "random", "egreedy", "ucb", "thompson", "botorch", "crosskernel")
#: What --strategies takes: the strategies and the learning agent (ppo: compared only when named).
COMPARED = (*STRATEGIES, "ppo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", default="sim:rtx3080ti", help="sim:PRESET | replay:CSV (default %(default)s)"
    )
    parser.add_argument(
        "--workload", default="gpt3-xl-layer", help="gpt3-xl-layer | trace:CSV | table (default %(default)s)"
    )
    parser.add_argument("--full-grid", action="store_true", help="search every supported clock pair")
    parser.add_argument(
        "--strategies",
        type=_strategies,
        default=list(STRATEGIES[1:]),
        help=f"comma-separated, of {','.join(COMPARED)} (default: all but sweep, which runs as the "
        "target anyway, and ppo, the learning agent, which trains first)",
    )
    parser.add_argument(
        "--agent",
        type=Path,
        default=None,
        metavar="ZIP",
        help="ppo: a trained agent saved by model.save (default: train one through kdvfs/TrialDVFS-v0 first)",
    )
    parser.add_argument(
        "--agent-steps",
        type=positive_int,
        default=256,
        metavar="N",
        help="ppo without --agent: trials to train it (default %(default)s)",
    )
    add_budget(parser)
    parser.add_argument("--seeds", type=positive_int, default=1, help="seeds 0..N-1 (default %(default)s)")
    parser.add_argument("--max-measurements-per-kernel", type=positive_int, default=None, metavar="M")
    parser.add_argument(
        "--noise",
        type=noise_scale,
        default=None,
        help="measurement-noise scale, 0 to 20 (default: the device's)",
    )
    parser.add_argument(
        "--window-s",
        type=duration_s,
        default=1.0,
        help="seconds of repeats per measurement (default %(default)s)",
    )
    add_mlflow(parser)
    add_json(parser)


def _strategies(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in COMPARED]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown strategy {bad[0] if bad else text!r} (known: {','.join(COMPARED)})"
        )
    return names


def run(args: argparse.Namespace) -> int:
    check_outputs(args, {"--json": args.json})
    from kdvfs.tuner.compare import Comparison
    from kdvfs.tuner.progress import Progress

    tracker = None
    if not args.no_mlflow:
        from kdvfs.tuner.tracking import Tracker

        tracker = Tracker(args.mlflow_uri, experiment="kdvfs-compare")
    phases, bar = Phases("compare"), Progress("compare", unit="kernels")
    comparison = Comparison(
        args.device,
        args.workload,
        args.strategies,
        budget=args.budget,
        seeds=args.seeds,
        max_per_kernel=args.max_measurements_per_kernel,
        noise=args.noise,
        full_grid=args.full_grid,
        window_s=args.window_s,
        agent=args.agent,
        agent_steps=args.agent_steps,
        tracker=tracker,
        progress=lambda label, done, total, n: bar.update(done, total, run=label, measurements=n),
        on_phase=phases.enter,
    )
    with phases.interruptible(), bar:
        comparison.run()
    with deferred_interrupts():
        doc = phases.mark(comparison.end(phases.run_status))
        _print_comparison(args, doc)
    return phases.exit_status(write_all([("JSON", lambda: write_json(args.json, doc))]))


def _print_comparison(args: argparse.Namespace, doc: dict) -> None:
    label = SOURCE_LABEL[doc["source"]]
    sweep = doc["sweep"]
    print(
        f"strategies against the full sweep: {doc['gpu']} ({args.device}), {doc['workload']}, budget {pct(args.budget)}, {args.seeds} seed(s) [{label}]"
    )
    if doc["partial"]:
        runs = sum(len(r) for r in doc["strategies"].values())
        print(
            f"  partial: interrupted, {len(sweep['runs']) if sweep else 0} of {args.seeds} sweeps and "
            f"{runs} of {args.seeds * len(args.strategies)} searches done"
        )
    if sweep is not None:
        print(
            f"  full sweep: {sweep['measurements']} measurements, plan saving {pct(sweep['energy_saving'])} (median over seeds)"
        )
    if doc["summary"]:
        print(
            f"  {'strategy':12s} {'saving':>8s} {'of sweep':>9s} {'measurements':>13s} {'of sweep':>9s} {'max slowdown':>13s} {'ask ms':>7s}"
        )
        for name, s in doc["summary"].items():
            print(
                f"  {name:12s} {pct(s['energy_saving']):>8s} {100 * s['share_of_sweep_saving']:8.1f}% {s['measurements']:13.0f}"
                f" {100 * s['share_of_sweep_measurements']:8.1f}% {pct(s['max_slowdown']):>13s} {s['ask_cpu_ms_median']:7.1f}"
            )
        print(f"  (medians over seeds; savings and slowdowns: noiseless evaluation of each plan [{label}])")
    if doc.get("agent", {}).get("trained"):
        a = doc["agent"]
        print(
            f"  ppo trained first: {a['trials']} trials through kdvfs/TrialDVFS-v0, {a['device_seconds']:.0f} s of "
            f"training on a card of seed {a['train_seed']} [{label}], {a['cpu_seconds']:.0f} s CPU (not in its measurements)"
        )
    if "mlflow" in doc:
        print(f"  MLflow: {doc['mlflow']}")
