"""Tuning simulated jobs that carry a recorded real job's noise, from no prior: how much of the
realisable oracle the tuner reaches within an hour of training, and the null test.

Each row opens a simulated card (sim:PRESET, its own measurement noise, one seed per run), a
workload (the GPT-3-XL layer, or the whole GPT-3-XL step), and a job noise (none, or one of the
H200 recordings shipped in runtime/job_noise.json: vision, hf, sync), and trains under the
tuner of `kdvfs tune` (TuneSession, strategy botorch, budget 1%, `--prior none`, the job's sites
as `kdvfs tune` picks them) for --seconds of training, stretches of steps simulated at once up
to each energy-counter update (TuneSession(aggregate_steps=True)). The tuner is told how long
the run is (expected_run_s).

The yardstick: the realisable oracle of a noiseless copy of the card at the job's sites,
evaluated in the step (tuner/oracle.py: realisable_oracle; the one-knob optimum beside it). A run "reached" 90% of it at the training second from which
every schedule it ran saves at least 90% of the oracle's saving (the card's noiseless figures
of each schedule), and stayed there to the end. Per row: the median over seeds of that time
(None when under half the seeds reached it), the final plan's share of the oracle, the
largest cumulative slowdown the tuner measured, the job's noise as the tuner measured it.

--null: the same runs in dry run (clock requests recorded, none applied): adoptions and the
run's measured saving must stay at zero.

Every figure is simulated, prior none, yardstick the realisable oracle.

    python -m kdvfs.experiments.noisy_jobs [--seconds 3600] [--seeds 5] [--rows h200:gpt3-xl-layer:hf ...]
    python -m kdvfs.experiments.noisy_jobs --null --seeds 10 --rows h200:gpt3-xl-layer:hf ...
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

DEFAULT_ROWS = [
    f"{preset}:{workload}:{noise}"
    for preset in ("rtx3080ti", "h200")
    for workload in ("gpt3-xl-layer", "gpt3-xl")
    for noise in ("none", "vision", "hf", "sync")
]
#: The share of the realisable oracle a run must reach and keep; a fraction.
LEVEL = 0.9


def run_one(spec: str, seed: int, seconds: float, null: bool, budget: float, oracle: dict | None) -> dict:
    """One tuned (or dry-run) job; its figures (against the oracle, when given and saving)."""
    from kdvfs.runtime.job_noise import job_noise
    from kdvfs.runtime.registry import open_device, open_workload
    from kdvfs.runtime.schedule import schedule_figures
    from kdvfs.tuner.run import NO_PRIOR, job_sites, reached_after
    from kdvfs.tuner.session import TuneSession

    preset, workload_name, noise_name = spec.split(":")
    device = open_device(f"sim:{preset}", seed=seed)
    workload = open_workload(workload_name, device)
    session = TuneSession(
        device,
        workload,
        budget=budget,
        seed=seed,
        prior=NO_PRIOR,
        dry_run=null,
        sites=job_sites(workload, device.switch_latency_s),
        job_noise=None if noise_name == "none" else job_noise(noise_name),
        aggregate_steps=True,
    )
    session.tuner.expected_run_s = seconds
    start = time.process_time()
    session.run_until(seconds)
    cpu_s = time.process_time() - start
    summary = session.run.summary()
    noiseless = open_device(f"sim:{preset}", seed=seed, noise=0.0)
    cache: dict = {}

    def saving_of(schedule) -> float:
        if schedule not in cache:
            cache[schedule] = schedule_figures(noiseless, workload, schedule)[0]
        return cache[schedule]

    figures = {
        "seed": seed,
        "cpu_s": round(cpu_s, 1),
        "trials": summary["trials"],
        "adopted": summary["adopted"],
        "plan_saving": saving_of(session.tuner.incumbent),
        "reached": None,
        "run_energy_saving": summary["run"]["energy_saving"],
        "run_slowdown": summary["run"]["slowdown"],
        "max_cumulative_slowdown": summary["max_cumulative_slowdown"],
        "job_noise": summary["job_noise"],
        "phases": summary["phases"],
    }
    if oracle is not None and oracle["energy_saving"] > 0:
        figures["reached"] = reached_after(session.schedule_log, saving_of, LEVEL * oracle["energy_saving"])
        figures["share_of_oracle"] = figures["plan_saving"] / oracle["energy_saving"]
    return figures


def oracle_of(card: str, budget: float) -> dict:
    """The in-step realisable oracle (tuner/oracle.py) of PRESET:WORKLOAD at the job's sites."""
    from kdvfs.runtime.registry import open_device, open_workload
    from kdvfs.tuner.oracle import one_knob_oracle, realisable_oracle
    from kdvfs.tuner.run import job_sites

    preset, workload_name = card.split(":")
    noiseless = open_device(f"sim:{preset}", noise=0.0)
    workload = open_workload(workload_name, noiseless)
    sites = job_sites(workload, noiseless.switch_latency_s)
    one_knob = one_knob_oracle(noiseless, workload, budget)
    best = realisable_oracle(noiseless, workload, budget, sites, one_knob=one_knob)
    return {
        "energy_saving": best.energy_saving,
        "slowdown": best.slowdown,
        "groups": len(best.schedule.groups),
        "method": best.method,
        "one_knob": {"energy_saving": one_knob.energy_saving, "slowdown": one_knob.slowdown},
    }


def row_figures(
    spec: str, seeds: int, seconds: float, null: bool, budget: float, oracle: dict | None
) -> dict:
    runs = [run_one(spec, seed, seconds, null, budget, oracle) for seed in range(seeds)]
    out = {"row": spec, "runs": runs}
    if null:
        out["adoptions"] = sum(r["adopted"] for r in runs)
        out["largest_abs_run_saving"] = max(abs(r["run_energy_saving"]) for r in runs)
        out["held"] = out["adoptions"] == 0 and out["largest_abs_run_saving"] <= 0.003
        return out
    reached = [r["reached"] for r in runs]
    hits = sorted(x for x in reached if x is not None)
    out["oracle"] = oracle
    out["reached_90pct_median_s"] = (
        statistics.median(x if x is not None else math.inf for x in reached)  # never: after any
        if len(hits) * 2 > len(runs)
        else None
    )
    out["runs_reaching_90pct"] = len(hits)
    out["median_share_of_oracle"] = statistics.median(r.get("share_of_oracle", 0.0) for r in runs)
    out["largest_cumulative_slowdown"] = max(r["max_cumulative_slowdown"] for r in runs)
    out["median_time_noise_per_root_s"] = statistics.median(
        r["job_noise"]["time_cv_per_root_s"] or 0.0 for r in runs
    )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3600.0, help="training per run, s")
    parser.add_argument("--seeds", type=int, default=5, help="runs per row (seeds 0..N-1)")
    parser.add_argument("--rows", nargs="*", default=DEFAULT_ROWS, help="PRESET:WORKLOAD:JOBNOISE")
    parser.add_argument("--null", action="store_true", help="dry run: the null test")
    parser.add_argument("--budget", type=float, default=0.01, help="allowed slowdown, a fraction")
    parser.add_argument("--workers", type=int, default=2, help="rows run in parallel (processes)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    start = time.time()
    with ProcessPoolExecutor(args.workers) as pool:
        cards = [] if args.null else sorted({row.rsplit(":", 1)[0] for row in args.rows})
        by_card = dict(zip(cards, pool.map(oracle_of, cards, [args.budget] * len(cards))))
        oracles = {row: by_card.get(row.rsplit(":", 1)[0]) for row in args.rows}
        rows = list(
            pool.map(
                row_figures,
                args.rows,
                [args.seeds] * len(args.rows),
                [args.seconds] * len(args.rows),
                [args.null] * len(args.rows),
                [args.budget] * len(args.rows),
                [oracles.get(r) for r in args.rows],
            )
        )
    doc = {
        "what": "null test (dry run)" if args.null else "share of the realisable oracle reached",
        "source": "simulated",
        "prior": "none",
        "yardstick": "the in-step realisable oracle of a noiseless copy of the card at the job's sites (tuner/oracle.py)",
        "level": LEVEL,
        "seconds": args.seconds,
        "seeds": args.seeds,
        "budget": args.budget,
        "commit": commit,
        "wall_s": round(time.time() - start, 1),
        "rows": rows,
    }
    text = json.dumps(doc, indent=1, default=str)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    sys.exit(0)
