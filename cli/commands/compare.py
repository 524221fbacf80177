"""`kdvfs compare`: search strategies against the full sweep, over seeds; with --scenario, the
step-driven tuner through a drift scenario (tuner/scenarios.py); with --peers, kdvfs against
its peers (tuner/peers.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kdvfs.cli.commands._common import (
    SOURCE_LABEL,
    Phases,
    add_budget,
    add_json,
    check_dir_output,
    check_file_output,
    deferred_interrupts,
    noise_scale,
    nonnegative_int,
    pct,
    positive_float,
    positive_int,
    run_identity,
    write_all,
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
        "drift scenario (the step-driven tuner through a change, timed in training seconds, against an oracle sweep)"
    )
    scenario.add_argument(
        "--scenario", choices=SCENARIOS, help="run this scenario instead of the strategy comparison"
    )
    scenario.add_argument(
        "--strategy", default="botorch", help="search strategy of the tuner (default %(default)s)"
    )
    scenario.add_argument(
        "--seed", type=nonnegative_int, default=0, help="seed of the scenario run (default %(default)s)"
    )
    scenario.add_argument(
        "--at-s",
        type=positive_float,
        default=None,
        metavar="S",
        help="apply the change after S seconds of training (default: once settled with the drift watch ready)",
    )
    scenario.add_argument(
        "--after-s",
        type=positive_float,
        default=300.0,
        metavar="S",
        help="seconds of training after the change (default %(default)s)",
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
        "peers: kdvfs against Zeus, EnvPipe and the paper's sweep, whole runs on one simulated card"
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
    check_file_output(args.plot, "--plot")
    if args.scenario is not None:
        return _run_scenario(args)
    if args.peers is not None:
        from kdvfs.tuner.peers import run_peers_command

        return run_peers_command(args)
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
            f"  ppo trained first: {a['trials']} trials through kdvfs/IterationDVFS-v1, {a['device_seconds']:.0f} s of "
            f"training on a card of seed {a['train_seed']} [{label}], {a['cpu_seconds']:.0f} s CPU (not in its measurements)"
        )
    if "mlflow" in doc:
        print(f"  MLflow: {doc['mlflow']}")


def _run_scenario(args: argparse.Namespace) -> int:
    import sys

    from kdvfs.policies.registry import POLICIES
    from kdvfs.runtime.types import KdvfsError
    from kdvfs.tuner.scenarios import run_scenario

    if args.strategy not in POLICIES:
        raise KdvfsError(f"unknown strategy {args.strategy!r} (known: {','.join(POLICIES)})")
    phases, doc = Phases("compare"), None
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
            progress=lambda msg: print(msg, file=sys.stderr),
        )
    with deferred_interrupts():
        device, workload = _identity_of(args)
        if doc is None:  # the scenario's figures exist only once it is over
            doc = {"scenario": args.scenario, "device": args.device, "source": device.source}
            doc.update(
                strategy=args.strategy, budget=args.budget, seed=args.seed, fleet_store=args.fleet_store
            )
        else:
            _print_scenario(args, doc)
        phases.mark(doc)
        if not args.no_mlflow:
            doc["mlflow"] = _log_scenario(args, doc, run_identity(device, workload), phases.run_status)
            print(f"  MLflow: {doc['mlflow']}")
    return phases.exit_status(write_all([("JSON", lambda: write_json(args.json, doc))]))


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
        f"budget {pct(args.budget)} [{label}]"
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
        f"oracle {pct(doc['oracle_saving_after'])} [{label}, noiseless]"
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
    return run.url_or_path
