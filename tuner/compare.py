"""Search strategies against the full sweep, over seeds: what `kdvfs compare` runs.

The full sweep runs once per seed as the target; every strategy runs on a fresh device per
seed (same seed: same noise draws for every strategy). Comparison holds what is done so far
(an interrupted comparison keeps it); compare_strategies runs one to the end. Each search is
logged as a nested MLflow run under one parent when a Tracker is given. The learning agent
("ppo") is trained once, before the seeds, through kdvfs/TrialDVFS-v0 on a card of its own
seed (`train_agent_on`), or loaded; it then serves every seed (docs/agent-strategy.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kdvfs.extras import require_extra
from kdvfs.policies.agent import AgentStrategy, load_agent, train_agent
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.types import KdvfsError
from kdvfs.tuner.search import SearchResult, run_search, search_space
from kdvfs.tuner.sweep import evaluate, run_sweep
from kdvfs.tuner.text import plan_json, run_identity

#: Trials the ppo strategy is trained through kdvfs/TrialDVFS-v0 when no agent is given; trials.
AGENT_STEPS = 256
#: Seed of the card the agent trains on: none of the compared seeds (0 .. seeds - 1).
AGENT_TRAIN_SEED = 1000
#: A training trial's window, s, and A-B-B-A blocks: shorter than the tuner's (2 s, 4 blocks)
#: so that training takes minutes of CPU; the judgement scales its noise to them.
AGENT_WINDOW_S = 0.5
AGENT_BLOCKS = 2
#: Training at stock measured as each training episode's reference, s.
AGENT_REFERENCE_S = 5.0


def require_agent() -> None:
    """KdvfsError naming the `agent` extra unless the learning agent's libraries can be imported."""
    require_extra("agent", ["stable_baselines3", "sb3_contrib"], "the learning agent (ppo)")


def train_agent_on(
    device_spec: str,
    workload_spec: str,
    *,
    budget: float,
    steps: int = AGENT_STEPS,
    noise: float | None = None,
    full_grid: bool = False,
):
    """A MaskablePPO agent trained `steps` trials through kdvfs/TrialDVFS-v0 on a fresh card
    of AGENT_TRAIN_SEED; (model, what the training cost: trials, device s, CPU s)."""
    import time

    import gymnasium

    import kdvfs.envs  # noqa: F401  (registers the envs)

    start = time.process_time()
    device = open_device(device_spec, seed=AGENT_TRAIN_SEED, noise=noise, full_grid=full_grid)
    env = gymnasium.make(
        "kdvfs/TrialDVFS-v0",
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
    """The JSON document of a comparison (see the README for its fields); Comparison's
    arguments."""
    comparison = Comparison(
        device_spec,
        workload_spec,
        strategies,
        budget=budget,
        seeds=seeds,
        max_per_kernel=max_per_kernel,
        noise=noise,
        full_grid=full_grid,
        window_s=window_s,
        agent=agent,
        agent_steps=agent_steps,
        tracker=tracker,
        progress=progress,
    )
    try:
        comparison.run()
    except KeyboardInterrupt:
        comparison.end("KILLED")
        raise
    return comparison.end()


class Comparison:
    """A comparison under way: the full sweep per seed, then every strategy per seed, each
    result kept as soon as it is done (an interrupted comparison keeps them: end() reports
    what is done). With a Tracker, one MLflow parent run and a nested run per search, both
    carrying run_identity's params and tags; the parent gets the headline figures as metrics.

    Args:
        device_spec: the device (`sim:PRESET`, `replay:CSV`), opened fresh for every run.
        workload_spec: the workload (`gpt3-xl-layer`, `trace:CSV`, `table`).
        strategies: names of the search strategies (policies.registry).
        budget: allowed slowdown of the step, e.g. 0.01.
        seeds: runs per strategy, seeds 0..seeds-1 (the sweep runs once per seed).
        max_per_kernel: most measurements a search makes per kernel; None: the strategy's own.
        noise: measurement-noise scale; None: the device's.
        full_grid: search every supported clock pair, not the preset's grid.
        window_s: seconds of repeats per measurement.
        agent: the "ppo" strategy's model, or the path of a saved one; None: trained here.
        agent_steps: trials the agent is trained when none is given; trials.
        tracker: a tuner.tracking.Tracker, or None for no MLflow.
        progress: called (run label, kernels done, kernels, measurements) as a sweep or search goes.
        on_phase: called with each phase, in plain words, as it starts.
    """

    def __init__(
        self,
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
        on_phase: Callable[[str], None] | None = None,
    ) -> None:
        self.device_spec, self.workload_spec, self.strategies = device_spec, workload_spec, strategies
        self.budget, self.seeds, self.max_per_kernel = budget, seeds, max_per_kernel
        self.noise, self.full_grid, self.window_s = noise, full_grid, window_s
        self.tracker, self._progress, self._on_phase = tracker, progress, on_phase
        self.agent, self.agent_steps = agent, agent_steps
        if "ppo" in strategies:
            require_agent()
        self.agent_doc: dict[str, Any] | None = None
        self.device, self.workload = self._fresh(0)
        self.sweeps: list[dict[str, Any]] = []
        self.results: dict[str, list[dict[str, Any]]] = {}
        self._parent = self._child = None
        self._ended = False

    def _fresh(self, seed: int):
        device = open_device(self.device_spec, seed=seed, noise=self.noise, full_grid=self.full_grid)
        return device, open_workload(self.workload_spec, device)

    def _phase(self, text: str) -> None:
        if self._on_phase is not None:
            self._on_phase(text)

    def _params(self) -> dict[str, Any]:
        return {
            "device": self.device_spec,
            "workload": self.workload_spec,
            "budget": self.budget,
            "window_s": self.window_s,
            "max_measurements_per_kernel": self.max_per_kernel,
            **run_identity(self.device, self.workload),
        }

    def run(self) -> None:
        """The sweeps, then the searches; a failure ends the MLflow runs FAILED and is raised."""
        try:
            self._run()
        except Exception:
            self._end_runs("FAILED")
            raise

    def _run(self) -> None:
        if self.tracker is not None:
            self._phase("opening the MLflow run")
            params = {**self._params(), "seeds": self.seeds, "strategies": ",".join(self.strategies)}
            self._parent = self.tracker.start_run(
                "compare", params, tags=run_identity(self.device, self.workload)
            )
        if "ppo" in self.strategies:
            self._prepare_agent()
        for seed in range(self.seeds):
            self._phase(f"running the full sweep, seed {seed}")
            device, workload = self._fresh(seed)
            obs = run_sweep(
                device, workload, self.window_s, self._sweep_progress(seed, len(device.grid.pairs))
            )
            figures = evaluate(device, workload, obs.kernel_level_choice(self.budget))
            self.sweeps.append(
                {
                    "seed": seed,
                    "measurements": obs.measurements,
                    "explore_seconds": obs.cost_s,
                    "energy_saving": figures.energy_saving,
                    "slowdown": figures.slowdown,
                }
            )
        for name in self.strategies:
            self.results[name] = []
            for seed in range(self.seeds):
                self._phase(f"running {name}, seed {seed}")
                self._search(name, seed)

    def _prepare_agent(self) -> None:
        """The ppo strategy's agent: loaded from its file, or trained through the env first."""
        if self.agent is None:
            self._phase(f"training the ppo agent ({self.agent_steps} trials)")
            self.agent, cost = train_agent_on(
                self.device_spec,
                self.workload_spec,
                budget=self.budget,
                steps=self.agent_steps,
                noise=self.noise,
                full_grid=self.full_grid,
            )
            self.agent_doc = {"trained": True, **cost}
        elif not hasattr(self.agent, "predict"):
            self.agent_doc = {"trained": False, "loaded": str(self.agent)}
            self.agent = _load(self.agent)
        else:
            self.agent_doc = {"trained": False, "loaded": "object"}

    def _sweep_progress(self, seed: int, pairs: int) -> Callable[[int, int], None] | None:
        """The sweep's progress (measurements) as the searches' (kernels done, kernels, measurements)."""
        progress = self._progress
        if progress is None:
            return None
        return lambda done, total: progress(f"full sweep seed {seed}", done // pairs, total // pairs, done)

    def _search(self, name: str, seed: int) -> None:
        device, workload = self._fresh(seed)
        if self._parent is not None:
            self._child = self.tracker.start_run(
                f"{name}-seed{seed}",
                {**self._params(), "strategy": name, "seed": seed},
                tags=run_identity(device, workload),
                parent=self._parent,
            )
        progress = self._progress
        strategy = _agent_strategy(device, seed, self.agent) if name == "ppo" else name
        r = run_search(
            device,
            workload,
            strategy,
            budget=self.budget,
            seed=seed,
            max_per_kernel=self.max_per_kernel,
            window_s=self.window_s,
            progress=(lambda done, total, n: progress(f"{name} seed {seed}", done, total, n))
            if progress
            else None,
        )
        self.results[name].append(result_json(r))
        if self._child is not None:
            _log_search(self._child, r, self.sweeps[seed]["energy_saving"])
            self._child = None

    def doc(self) -> dict[str, Any]:
        """The comparison's JSON document, of what is done so far."""
        results = {name: runs for name, runs in self.results.items() if runs}
        doc: dict[str, Any] = {
            "device": self.device_spec,
            "gpu": self.device.name,
            "workload": self.workload.name,
            "signature": self.workload.signature,
            "budget": self.budget,
            "seeds": self.seeds,
            "source": self.device.source,
            "sweep": None,
            "strategies": results,
            "summary": {},
        }
        if self.sweeps:
            doc["sweep"] = {
                "measurements": int(np.median([s["measurements"] for s in self.sweeps])),
                "energy_saving": float(np.median([s["energy_saving"] for s in self.sweeps])),
                "runs": self.sweeps,
            }
            doc["summary"] = summarize(results, doc["sweep"])
        if self.agent_doc is not None:
            doc["agent"] = self.agent_doc
        return doc

    def end(self, status: str = "FINISHED") -> dict[str, Any]:
        """The document of what is done; the MLflow runs get it, the headline figures and the
        convergence plot, and end with `status` (KILLED when interrupted)."""
        doc = self.doc()
        parent = self._parent
        if parent is not None and not self._ended:
            parent.log_metrics(sum(len(runs) for runs in doc["strategies"].values()), _headline(doc))
            parent.log_dict(doc, "compare.json")
            if doc["sweep"] is not None and doc["strategies"]:
                from kdvfs.tuner.plots import convergence_figure

                title = f"{self.device.name}, {self.workload.name} [{self.device.source}]"
                parent.log_figure(
                    convergence_figure(doc["strategies"], doc["sweep"], title), "convergence.png"
                )
            self._end_runs(status)
        if parent is not None:
            doc["mlflow"] = parent.url_or_path
        return doc

    def _end_runs(self, status: str) -> None:
        for run in (self._child, self._parent):
            if run is not None:
                run.end(status)
        self._child, self._ended = None, True


def _headline(doc: dict[str, Any]) -> dict[str, float]:
    """The figures the MLflow runs table sorts by: the sweep's, and each strategy's medians."""
    metrics: dict[str, float] = {}
    if doc["sweep"] is not None:
        metrics["sweep_energy_saving"] = doc["sweep"]["energy_saving"]
        metrics["sweep_measurements"] = doc["sweep"]["measurements"]
    for name, s in doc["summary"].items():
        for key in ("energy_saving", "share_of_sweep_saving", "measurements", "max_slowdown"):
            metrics[f"{name}.{key}"] = s[key]
    return {k: float(v) for k, v in metrics.items() if np.isfinite(v)}


def _load(path):
    """A saved agent, or a KdvfsError naming the file."""
    from pathlib import Path

    if not Path(path).exists() and not Path(f"{path}.zip").exists():
        raise KdvfsError(f"agent {path}: no such file")
    try:
        return load_agent(path)
    except Exception as e:  # a zip that is not a saved MaskablePPO model
        raise KdvfsError(f"agent {path}: not a saved MaskablePPO model ({e})") from None


def _agent_strategy(device, seed: int, agent) -> AgentStrategy:
    try:
        return AgentStrategy(search_space(device), seed, model=agent)
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


def _log_search(run, r: SearchResult, sweep_saving: float) -> None:
    """A search's curve and final figures into its nested run, which then ends."""
    for n, saving in r.curve:
        run.log_metrics(n, {"energy_saving": saving})
    final = {
        "final_energy_saving": r.energy_saving,
        "slowdown": r.slowdown,
        "measurements": r.measurements,
        "explore_seconds": r.explore_seconds,
        "tuner_cpu_s": r.tuner_cpu_s,
        "sweep_energy_saving": sweep_saving,
    }
    if sweep_saving > 0:
        final["share_of_sweep_saving"] = r.energy_saving / sweep_saving
    run.log_metrics(r.measurements, final)
    run.log_dict(plan_json(r.plan), "plan.json")
    run.end()
