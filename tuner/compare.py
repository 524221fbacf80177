"""Search strategies against the full sweep, over seeds: what `kdvfs compare` runs.

The full sweep runs once per seed as the target; every strategy runs on a fresh device per
seed (same seed: same noise draws for every strategy). Each run is logged as a nested MLflow
run under one parent when a Tracker is given. The learning agent ("ppo") is trained once,
before the seeds, through kdvfs/IterationDVFS-v1 on a card of its own seed (`train_agent_on`),
or loaded; it then serves every seed (docs/agent-strategy.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kdvfs.policies.agent import AgentPolicy, load_agent, train_agent
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.types import KdvfsError
from kdvfs.tuner.commands._common import plan_json
from kdvfs.tuner.search import SearchResult, run_search, search_space
from kdvfs.tuner.sweep import evaluate, run_sweep

#: Trials the ppo strategy is trained through kdvfs/IterationDVFS-v1 when no agent is given; trials.
AGENT_STEPS = 256
#: Seed of the card the agent trains on: none of the compared seeds (0 .. seeds - 1).
AGENT_TRAIN_SEED = 1000
#: A training trial's window, s, and A-B-B-A blocks: shorter than the tuner's (2 s, 4 blocks)
#: so that training takes minutes of CPU; the judgement scales its noise to them.
AGENT_WINDOW_S = 0.5
AGENT_BLOCKS = 2
#: Training at stock measured as each training episode's reference, s.
AGENT_REFERENCE_S = 5.0


def train_agent_on(
    device_spec: str,
    workload_spec: str,
    *,
    budget: float,
    steps: int = AGENT_STEPS,
    noise: float | None = None,
    full_grid: bool = False,
):
    """A MaskablePPO agent trained `steps` trials through kdvfs/IterationDVFS-v1 on a fresh card
    of AGENT_TRAIN_SEED; (model, what the training cost: trials, device s, CPU s)."""
    import time

    import gymnasium

    import kdvfs.envs  # noqa: F401  (registers the envs)

    start = time.process_time()
    device = open_device(device_spec, seed=AGENT_TRAIN_SEED, noise=noise, full_grid=full_grid)
    env = gymnasium.make(
        "kdvfs/IterationDVFS-v1",
        device=device,
        workload=open_workload(workload_spec, device),
        budget=budget,
        window_s=AGENT_WINDOW_S,
        blocks=AGENT_BLOCKS,
        reference_s=AGENT_REFERENCE_S,
    )
    model = train_agent(env, steps, seed=AGENT_TRAIN_SEED)
    cost = {
        "trials": steps,
        "device_seconds": float(device.now_s()),
        "cpu_seconds": time.process_time() - start,
        "train_seed": AGENT_TRAIN_SEED,
    }
    return model, cost


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
    agent=None,
    agent_steps: int = AGENT_STEPS,
    tracker=None,
    progress: Callable[[str, int, int, int], None] | None = None,
) -> dict[str, Any]:
    """The JSON document of a comparison (see the README for its fields). agent: the "ppo"
    strategy's model or the path of a saved one (None: trained here, agent_steps trials)."""

    def fresh(seed: int):
        device = open_device(device_spec, seed=seed, noise=noise, full_grid=full_grid)
        return device, open_workload(workload_spec, device)

    agent_doc = None
    if "ppo" in strategies:
        if agent is None:
            agent, cost = train_agent_on(
                device_spec, workload_spec, budget=budget, steps=agent_steps, noise=noise, full_grid=full_grid
            )
            agent_doc = {"trained": True, **cost}
        else:
            agent_doc = {
                "trained": False,
                "loaded": str(agent) if not hasattr(agent, "predict") else "object",
            }
            agent = agent if hasattr(agent, "predict") else _load(agent)
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
            strategy = _agent_policy(device, seed, agent) if name == "ppo" else name
            r = run_search(
                device,
                workload,
                strategy,
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
    if agent_doc is not None:
        doc["agent"] = agent_doc
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


def _load(path):
    """A saved agent, or a KdvfsError naming the file."""
    from pathlib import Path

    if not Path(path).exists() and not Path(f"{path}.zip").exists():
        raise KdvfsError(f"agent {path}: no such file")
    try:
        return load_agent(path)
    except Exception as e:  # a zip that is not a saved MaskablePPO model
        raise KdvfsError(f"agent {path}: not a saved MaskablePPO model ({e})") from None


def _agent_policy(device, seed: int, agent) -> AgentPolicy:
    try:
        return AgentPolicy(search_space(device), seed, model=agent)
    except ValueError as e:  # trained on another grid
        raise KdvfsError(str(e)) from None


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
