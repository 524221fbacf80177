"""`kdvfs compare`: search strategies against the full sweep, over seeds."""

from __future__ import annotations

import argparse

from kdvfs.tuner.commands._common import SOURCE_LABEL, add_budget, add_json, pct, write_json

STRATEGIES = ("sweep", "random", "egreedy", "ucb", "thompson", "botorch", "crosskernel")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="sim:rtx3080ti", help="sim:PRESET | replay:CSV (default %(default)s)")
    parser.add_argument("--workload", default="gpt3-xl-layer", help="gpt3-xl-layer | trace:CSV | table (default %(default)s)")
    parser.add_argument("--full-grid", action="store_true", help="search every supported clock pair")
    parser.add_argument("--strategies", type=_strategies, default=list(STRATEGIES[1:]),
                        help=f"comma-separated, of {','.join(STRATEGIES)} (default: all but sweep, which runs as the target anyway)")
    add_budget(parser)
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 (default %(default)s)")
    parser.add_argument("--max-measurements-per-kernel", type=int, default=None, metavar="M")
    parser.add_argument("--noise", type=float, default=None, help="measurement-noise scale (default: the device's)")
    parser.add_argument("--window-s", type=float, default=1.0, help="seconds of repeats per measurement (default %(default)s)")
    parser.add_argument("--mlflow-uri", default=None, help="tracking URI (default: MLFLOW_TRACKING_URI, else MLflow's default ./mlflow.db)")
    parser.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    add_json(parser)


def _strategies(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in STRATEGIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown strategy {bad[0] if bad else text!r} (known: {','.join(STRATEGIES)})")
    return names


def run(args: argparse.Namespace) -> int:
    from kdvfs.tuner.compare import compare_strategies
    from kdvfs.tuner.progress import Progress

    tracker = None
    if not args.no_mlflow:
        from kdvfs.tuner.tracking import Tracker

        tracker = Tracker(args.mlflow_uri, experiment="kdvfs-compare")
    with Progress("compare", unit="kernels") as bar:
        doc = compare_strategies(
            args.device, args.workload, args.strategies, budget=args.budget, seeds=args.seeds,
            max_per_kernel=args.max_measurements_per_kernel, noise=args.noise, full_grid=args.full_grid,
            window_s=args.window_s, tracker=tracker,
            progress=lambda label, done, total, n: bar.update(done, total, run=label, measurements=n),
        )
    label = SOURCE_LABEL[doc["source"]]
    sweep = doc["sweep"]
    print(f"strategies against the full sweep: {doc['gpu']} ({args.device}), {doc['workload']}, budget {pct(args.budget)}, {args.seeds} seed(s) [{label}]")
    print(f"  full sweep: {sweep['measurements']} measurements, plan saving {pct(sweep['energy_saving'])} (median over seeds)")
    print(f"  {'strategy':12s} {'saving':>8s} {'of sweep':>9s} {'measurements':>13s} {'of sweep':>9s} {'max slowdown':>13s} {'ask ms':>7s}")
    for name, s in doc["summary"].items():
        print(f"  {name:12s} {pct(s['energy_saving']):>8s} {100 * s['share_of_sweep_saving']:8.1f}% {s['measurements']:13.0f}"
              f" {100 * s['share_of_sweep_measurements']:8.1f}% {pct(s['max_slowdown']):>13s} {s['ask_cpu_ms_median']:7.1f}")
    print(f"  (medians over seeds; savings and slowdowns: noiseless evaluation of each plan [{label}])")
    if "mlflow" in doc:
        print(f"  MLflow: {doc['mlflow']}")
    write_json(args.json, doc)
    return 0
