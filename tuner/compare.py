"""Search strategies against the full sweep, over seeds: what `kdvfs compare` runs.

The full sweep runs once per seed as the target; every strategy runs on a fresh device per
seed (same seed: same noise draws for every strategy). Each run is logged as a nested MLflow
run under one parent when a Tracker is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.tuner.commands._common import plan_json
from kdvfs.tuner.search import SearchResult, run_search
from kdvfs.tuner.sweep import evaluate, run_sweep


def result_json(r: SearchResult) -> dict[str, Any]:
    return {
        "seed": r.seed,
        "measurements": r.measurements,
        "explore_seconds": r.explore_seconds,
        "energy_saving": r.energy_saving,
        "slowdown": r.slowdown,
        "plan": plan_json(r.plan),
        "curve": [list(p) for p in r.curve],
        "tuner_cpu_s": r.tuner_cpu_s,
        "ask_cpu_ms_median": r.ask_cpu_ms_median,
    }


def compare_strategies(
    device_spec: str,
    workload_spec: str,
    strategies: list[str],
    *,
    budget: float,
    seeds: int,
    max_per_kernel: int | None = None,
    noise: float | None = None,
    full_grid: bool = False,
    window_s: float = 1.0,
    tracker=None,
    progress: Callable[[str, int, int, int], None] | None = None,
) -> dict[str, Any]:
    """The JSON document of a comparison (see the README for its fields)."""

    def fresh(seed: int):
        device = open_device(device_spec, seed=seed, noise=noise, full_grid=full_grid)
        return device, open_workload(workload_spec, device)

    parent = (
        tracker.start_run(
            "compare",
            {
                "device": device_spec,
                "workload": workload_spec,
                "budget": budget,
                "seeds": seeds,
                "strategies": ",".join(strategies),
            },
        )
        if tracker
        else None
    )
    sweeps = []
    for seed in range(seeds):
        device, workload = fresh(seed)
        obs = run_sweep(device, workload, window_s)
        figures = evaluate(device, workload, obs.kernel_level_choice(budget))
        sweeps.append(
            {
                "seed": seed,
                "measurements": obs.measurements,
                "explore_seconds": obs.cost_s,
                "energy_saving": figures.energy_saving,
                "slowdown": figures.slowdown,
            }
        )
    sweep = {
        "measurements": int(np.median([s["measurements"] for s in sweeps])),
        "energy_saving": float(np.median([s["energy_saving"] for s in sweeps])),
        "runs": sweeps,
    }
    results: dict[str, list[dict[str, Any]]] = {}
    for name in strategies:
        results[name] = []
        for seed in range(seeds):
            device, workload = fresh(seed)
            r = run_search(
                device,
                workload,
                name,
                budget=budget,
                seed=seed,
                max_per_kernel=max_per_kernel,
                window_s=window_s,
                progress=(
                    lambda done, total, n, name=name, seed=seed: progress(
                        f"{name} seed {seed}", done, total, n
                    )
                )
                if progress
                else None,
            )
            results[name].append(result_json(r))
            if parent is not None:
                _log_run(tracker, parent, name, seed, r)
    doc = {
        "device": device_spec,
        "gpu": device.name,
        "workload": workload.name,
        "signature": workload.signature,
        "budget": budget,
        "seeds": seeds,
        "source": device.source,
        "sweep": sweep,
        "strategies": results,
        "summary": summarize(results, sweep),
    }
    if parent is not None:
        from kdvfs.tuner.plots import convergence_figure

        parent.log_dict(doc, "compare.json")
        parent.log_figure(
            convergence_figure(results, sweep, f"{device.name}, {workload.name} [{device.source}]"),
            "convergence.png",
        )
        parent.end()
        doc["mlflow"] = parent.url_or_path
    return doc


def summarize(results: dict[str, list[dict[str, Any]]], sweep: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per strategy, medians over seeds, relative to the sweep."""
    out = {}
    for name, runs in results.items():
        saving = float(np.median([r["energy_saving"] for r in runs]))
        meas = float(np.median([r["measurements"] for r in runs]))
        out[name] = {
            "energy_saving": saving,
            "share_of_sweep_saving": saving / sweep["energy_saving"]
            if sweep["energy_saving"] > 0
            else float("nan"),
            "measurements": meas,
            "share_of_sweep_measurements": meas / sweep["measurements"],
            "measurements_per_kernel": meas / max(1, len(runs[0]["plan"])),
            "max_slowdown": float(max(r["slowdown"] for r in runs)),
            "ask_cpu_ms_median": float(np.median([r["ask_cpu_ms_median"] for r in runs])),
        }
    return out


def _log_run(tracker, parent, name: str, seed: int, r: SearchResult) -> None:
    run = tracker.start_run(f"{name}-seed{seed}", {"strategy": name, "seed": seed}, parent=parent)
    for n, saving in r.curve:
        run.log_metrics(n, {"energy_saving": saving})
    run.log_metrics(
        r.measurements,
        {
            "final_energy_saving": r.energy_saving,
            "slowdown": r.slowdown,
            "explore_seconds": r.explore_seconds,
            "tuner_cpu_s": r.tuner_cpu_s,
        },
    )
    run.log_dict(plan_json(r.plan), "plan.json")
    run.end()
