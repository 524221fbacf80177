"""`kdvfs compare`: search strategies against the full sweep, over seeds; with --scenario, the
online tuner through a drift scenario (tuner/adaptation.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kdvfs.tuner.commands._common import (
    SOURCE_LABEL,
    add_budget,
    add_json,
    check_dir_output,
    check_file_output,
    noise_scale,
    nonnegative_int,
    pct,
    positive_float,
    positive_int,
    write_json,
)

SCENARIOS = ("ambient-step", "power-cap", "gpu-swap", "workload-change")
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
        help="ppo: a trained agent saved by model.save (default: train one through kdvfs/IterationDVFS-v1 first)",
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
        type=positive_float,
        default=1.0,
        help="seconds of repeats per measurement (default %(default)s)",
    )
    parser.add_argument(
        "--mlflow-uri",
        default=None,
        help="tracking URI (default: MLFLOW_TRACKING_URI, else MLflow's default ./mlflow.db)",
    )
    parser.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    scenario = parser.add_argument_group(
        "drift scenario (the online tuner through a change, against an oracle sweep)"
    )
    scenario.add_argument(
        "--scenario", choices=SCENARIOS, help="run this scenario instead of the strategy comparison"
    )
    scenario.add_argument(
        "--strategy", default="ucb", help="search strategy of the online tuner (default %(default)s)"
    )
    scenario.add_argument(
        "--seed", type=nonnegative_int, default=0, help="seed of the scenario run (default %(default)s)"
    )
    scenario.add_argument(
        "--at-iteration",
        type=nonnegative_int,
        default=None,
        metavar="N",
        help="apply the change after N iterations (default: once converged with the drift watch ready)",
    )
    scenario.add_argument(
        "--iterations",
        type=positive_int,
        default=None,
        metavar="M",
        help="iterations to run after the change (default: twice the first convergence's)",
    )
    scenario.add_argument(
        "--plan-store",
        type=Path,
        default=None,
        metavar="DIR",
        help="plan store of the scenario's jobs (default: a temporary directory)",
    )
    scenario.add_argument(
        "--fleet-store",
        action="store_true",
        help="gpu-swap: another job of the fleet has tuned the new card and left its plan in the store",
    )
    peers = parser.add_argument_group(
        "peers (issue 18): kdvfs against Zeus, EnvPipe and the paper's sweep, whole runs on one simulated card"
    )
    peers.add_argument(
        "--peers",
        default=None,
        metavar="NAMES",
        help="run these peers instead of the strategy comparison: comma-separated, of "
        "kdvfs,zeus-power-limit,envpipe-sm-stepdown,paper-sweep",
    )
    peers.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="training steps of every peer's run (default: 24 h of training at stock)",
    )
    peers.add_argument(
        "--plot", type=Path, default=None, metavar="PNG", help="also save the peers' plot here"
    )
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
    check_file_output(args.json, "--json")
    check_dir_output(args.plan_store, "--plan-store")
    if args.scenario is not None:
        return _run_scenario(args)
    if args.peers is not None:
        from kdvfs.tuner.peers import run_peers_command

        return run_peers_command(args)
    from kdvfs.tuner.compare import compare_strategies
    from kdvfs.tuner.progress import Progress

    tracker = None
    if not args.no_mlflow:
        from kdvfs.tuner.tracking import Tracker

        tracker = Tracker(args.mlflow_uri, experiment="kdvfs-compare")
    with Progress("compare", unit="kernels") as bar:
        doc = compare_strategies(
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
        )
    label = SOURCE_LABEL[doc["source"]]
    sweep = doc["sweep"]
    print(
        f"strategies against the full sweep: {doc['gpu']} ({args.device}), {doc['workload']}, budget {pct(args.budget)}, {args.seeds} seed(s) [{label}]"
    )
    print(
        f"  full sweep: {sweep['measurements']} measurements, plan saving {pct(sweep['energy_saving'])} (median over seeds)"
    )
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
            f"  ppo trained first: {a['trials']} trials through kdvfs/IterationDVFS-v1, {a['device_seconds']:.0f} s of "
            f"training on a card of seed {a['train_seed']} [{label}], {a['cpu_seconds']:.0f} s CPU (not in its measurements)"
        )
    if "mlflow" in doc:
        print(f"  MLflow: {doc['mlflow']}")
    write_json(args.json, doc)
    return 0


def _run_scenario(args: argparse.Namespace) -> int:
    import sys

    from kdvfs.tuner.adaptation import Session, run_scenario

    if args.strategy not in STRATEGIES[1:]:
        from kdvfs.runtime.types import KdvfsError

        raise KdvfsError(f"unknown strategy {args.strategy!r} (known: {','.join(STRATEGIES[1:])})")
    session = Session(args.device, args.workload, strategy=args.strategy, budget=args.budget, seed=args.seed)
    doc = run_scenario(
        session,
        args.scenario,
        at_iteration=args.at_iteration,
        after_iterations=args.iterations,
        store_dir=args.plan_store,
        fleet_store=args.fleet_store,
        progress=lambda msg: print(msg, file=sys.stderr),
    )
    label = SOURCE_LABEL[doc["source"]]
    detected, recovered, first = (
        "never" if doc[k] is None else doc[k]
        for k in ("detected_after_iterations", "recovered_after_iterations", "first_reached_after_iterations")
    )
    print(
        f"scenario {doc['scenario']} on {args.device} ({doc['gpu_after']} after), {args.strategy}, budget {pct(args.budget)} [{label}]"
    )
    print(
        f"  change after {doc['at_iteration']} iterations (converged at {doc['converged_at_iteration']}), then {doc['after_iterations']} more"
        + (f"; job restarted: {doc['plan_store_on_restart']}" if doc["restart"] else "")
    )
    print(
        f"  detected after {detected} iterations, within 95% of the oracle to the end after {recovered} "
        f"(first reached after {first}; "
        f"an iteration takes {doc['iteration_time_s_after'] * 1e3:.1f} ms)"
    )
    print(
        f"  max cumulative slowdown after the change {pct(doc['max_slowdown'])} ({doc['budget_violations']} points over budget)"
    )
    print(
        f"  saving at the end {pct(doc['energy_saving_after'])} (slowdown {pct(doc['schedule_slowdown_after'])}), oracle "
        f"{pct(doc['oracle_saving_after'])} [{label}, noiseless]"
    )
    print(
        f"  energy lost against the oracle since the change: {pct(doc['energy_lost_vs_oracle_share'])} of stock's "
        f"({doc['energy_lost_vs_oracle_j']:.0f} J) [{label}]"
    )
    print(
        f"  false alarms on a stable run of the same length: {doc['false_alarms_stable']} over {doc['stable_windows']} windows "
        f"({doc['unconfirmed_alarms_stable']} unconfirmed, nothing re-tuned; after the change: {doc['unconfirmed_alarms']})"
    )
    if not args.no_mlflow:
        doc["mlflow"] = _log_scenario(args, doc)
        print(f"  MLflow: {doc['mlflow']}")
    write_json(args.json, doc)
    return 0


def _log_scenario(args: argparse.Namespace, doc: dict) -> str:
    """One MLflow run per scenario: its settings as parameters, its figures as metrics (a
    figure that is None, never reached, is left out), the whole document as scenario.json."""
    from kdvfs.tuner.tracking import Tracker

    tracker = Tracker(args.mlflow_uri, experiment="kdvfs-scenarios")
    params = {
        k: doc[k]
        for k in (
            "scenario",
            "device",
            "strategy",
            "budget",
            "seed",
            "at_iteration",
            "after_iterations",
            "fleet_store",
            "source",
        )
    }
    with tracker.start_run(f"{doc['scenario']}-{args.strategy}", params) as run:
        run.log_metrics(
            doc["at_iteration"] + doc["after_iterations"],
            {
                k: float(v)
                for k, v in doc.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in params
            },
        )
        run.log_dict(doc, "scenario.json")
    return run.url_or_path
