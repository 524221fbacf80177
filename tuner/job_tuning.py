"""`kdvfs.tune`: a real PyTorch training job tunes its own clocks while it trains.

```python
with kdvfs.tune(model, optimizer, budget=0.01, strategy="botorch") as tuning:
    for batch in data:
        with tuning.step():
            train_step(batch)
print(tuning.summary())
```

- `tune(...)` -> `JobTuning`: opens the card (an `NvmlDevice`, dry run unless told), the step's
  sites as a workload (runtime/step_feed.py: `site_workload`, or a discovered workload), a
  `StepTuner` (tuner/step_tuner.py) and a `KdvfsTrainer` whose controller hands the tuner a
  StepReport each step and applies its answers at the sites; runtime/ never imports tuner/,
  so the wiring is here. `JobTuning` is the controller's StepController.
- What it keeps: each finished trial and verification (`outcomes`), live progress in the log
  (phase, budget spent, saving so far), an MLflow run (step metrics from a thread of its own,
  the plan and summary as artifacts), the plan file (out_dir) after each adoption and at the
  end, the plan in the plan store once Settled (not in dry run).
- Stock clocks come back on exit, an exception, Ctrl-C and SIGTERM (the controller halts,
  the device resets); the plan so far is written then too (a clock_lease hold).
- The Lightning and Hugging Face callbacks (runtime/torch_integration.py) take a JobTuning
  as they take a KdvfsTrainer: `lightning_callback(kdvfs.tune(...))`.
Design and figures: docs/design-step-tuner.md, docs/gpu-validation.md.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from kdvfs.runtime import clock_lease
from kdvfs.runtime.device import Device
from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.runtime.ranks import RankPool
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.step_feed import COUNTER_POLL_S, site_workload
from kdvfs.runtime.steps import StepReport
from kdvfs.runtime.torch_discovery import STEP_SITE, workload_sites
from kdvfs.runtime.torch_integration import KdvfsTrainer
from kdvfs.runtime.trials import REFERENCE_MARGIN
from kdvfs.runtime.types import KdvfsError, Workload
from kdvfs.tuner.plan import Plan, plan_schedule, save_plan
from kdvfs.tuner.plan_store import PlanStore
from kdvfs.tuner.step_priors import sweep_prior
from kdvfs.tuner.step_tuner import (
    DEFAULT_STRATEGY,
    Settled,
    StepTiming,
    StepTuner,
    Verifying,
)

log = logging.getLogger(__name__)

#: Time between two progress lines in the log, s of training.
PROGRESS_S = 10.0
#: Time between two rows of step metrics in the MLflow run, s of training.
METRICS_S = 1.0
#: Clock-switch latency assumed for a card that does not state its own, s (tens of ms on current cards).
DEFAULT_SWITCH_LATENCY_S = 0.030
#: Update period of the energy counter assumed for a card that does not state its own, s.
DEFAULT_ENERGY_UPDATE_PERIOD_S = 0.1
#: The job's first seconds under kdvfs.tune, at stock and not reported to the tuner (lazy
#: initialisation, first garbage collections: docs/gpu-validation.md); s.
WARMUP_S = 5.0
#: File name of the tuning summary written into out_dir.
SUMMARY_FILE = "kdvfs_tuning.json"
#: File name of the plan written into out_dir.
PLAN_FILE = "kdvfs_plan.json"


def tune(
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    budget: float = 0.01,
    strategy: str = DEFAULT_STRATEGY,
    device: Device | int | None = None,
    dry_run: bool = True,
    **options: Any,
) -> JobTuning:
    """A training job that tunes its clocks: `with tune(model, opt) as t: ... with t.step(): ...`.
    The arguments are JobTuning's."""
    return JobTuning(
        model, optimizer, budget=budget, strategy=strategy, device=device, dry_run=dry_run, **options
    )


class JobTuning:
    """The step-driven tuner on a live PyTorch training loop (module docstring).

    Args:
        model, optimizer: what the step's sites hook (forward, backward, optimizer step); they
            may come later through attach() (the callbacks do).
        budget: the largest cumulative slowdown against stock, a fraction (0.01: 1%).
        strategy: the search strategy (kdvfs.policies.registry.STRATEGIES).
        device: the card: a Device, or an NVML index (opened as NvmlDevice, dry run unless
            dry_run=False, closed at the end); None: NVML index 0.
        dry_run: record the clock requests and apply none (the default; the only mode on
            shared GPUs). A device that would change clocks is refused in dry run.
        workload: the step's kernels with their sites (discover_workload); None: one segment
            per site, the sites given by what is hooked (step, forward, backward, optimizer).
        sites: the site names of a step in order, where no workload is given; None: from
            model and optimizer (all four when neither is given yet: the callbacks).
        out_dir: where the plan, the summary and the step records go; None: nowhere.
        plan_store: where a settled plan is kept and a stored one found (PlanStore, a
            directory, or None for the default store; False: none).
        tracking_uri: the MLflow tracking URI (None: MLflow's default); track: whether to
            open an MLflow run at all.
        seed: seeds the strategy.
        timing: how long the tuner measures (StepTiming; its defaults suit real jobs).
        switch_latency_s: the card's clock-switch latency, s (None: the device's, else
            DEFAULT_SWITCH_LATENCY_S).
        energy_update_period_s: the counter's update period, s (None: the device's, else
            DEFAULT_ENERGY_UPDATE_PERIOD_S).
        prior_sweep: a real card's sweep (the JSON of kdvfs sweep --device nvml:N --workload
            ops:FILE): where no plan is stored, its pass-level plan is verified first
            (step_priors.sweep_prior).
        progress_s: time between two progress lines in the log, s.
        poll_s: pause between two energy-counter reads, s (runtime/step_feed.py).
        warmup_s: the first seconds of training, at stock and not reported to the tuner, s.
        run_name: the MLflow run's name.
        pool: the job's data-parallel ranks (runtime/ranks.py: RankPool, e.g.
            runtime/distributed.py's TorchRankPool), every rank tuning with the same
            arguments: readings pooled, decisions identical, the warm-up ended on rank 0's clock.
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        budget: float = 0.01,
        strategy: str = DEFAULT_STRATEGY,
        device: Device | int | None = None,
        dry_run: bool = True,
        workload: Workload | None = None,
        sites: Sequence[str] | None = None,
        out_dir: Path | str | None = None,
        plan_store: PlanStore | Path | str | bool | None = None,
        tracking_uri: str | None = None,
        track: bool = True,
        seed: int = 0,
        timing: StepTiming | None = None,
        switch_latency_s: float | None = None,
        energy_update_period_s: float | None = None,
        prior_sweep: Path | str | None = None,
        progress_s: float = PROGRESS_S,
        poll_s: float = COUNTER_POLL_S,
        warmup_s: float = WARMUP_S,
        run_name: str = "kdvfs.tune",
        pool: RankPool | None = None,
    ) -> None:
        self._owns_device = not hasattr(device, "set_clocks")
        self.device: Device = NvmlDevice(device or 0, dry_run=dry_run) if self._owns_device else device
        self.dry_run = dry_run
        self.budget = budget
        self.strategy = strategy
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.progress_s = progress_s
        self.warmup_s = warmup_s
        self._warm_until_s: float | None = None
        try:
            self.workload = workload or site_workload(sites or _default_sites(model, optimizer))
            self.store = _plan_store(plan_store)
            stored = self._stored_plan()
            prior = plan_schedule(stored) if stored is not None else None
            if prior is None and prior_sweep is not None:
                prior = sweep_prior(Path(prior_sweep), self.workload)
            self.tuner = StepTuner(
                self.workload,
                list(self.device.grid.pairs),
                switch_latency_s=_stated(
                    switch_latency_s, self.device, "switch_latency_s", DEFAULT_SWITCH_LATENCY_S
                ),
                energy_update_period_s=_stated(
                    energy_update_period_s,
                    self.device,
                    "energy_update_period_s",
                    DEFAULT_ENERGY_UPDATE_PERIOD_S,
                ),
                budget=budget,
                strategy=strategy,
                seed=seed,
                boundaries=_site_starts(self.workload),
                prior=prior,
                timing=timing,
                pool=pool,
            )
            self.outcomes: list[dict[str, Any]] = []
            """Each finished trial and verification: kind, step, candidate, figures, adopted."""
            self.run = _open_run(tracking_uri, run_name, self._params(seed, stored)) if track else None
            self._metrics: queue.SimpleQueue[tuple[int, dict[str, float]] | None] = queue.SimpleQueue()
            self._tracking = threading.Thread(target=self._deliver_metrics, name="kdvfs-mlflow", daemon=True)
            if self.run is not None:
                self._tracking.start()
            self._watched: Any = None  # the trial object being watched for its outcome
            self._watched_kind = ""
            self._adoptions = 0
            self._settled_stored = False
            self._next_metrics_s = -math.inf
            self._next_progress_s = -math.inf
            self._closed = False
            # one full collection now: the strategy's imports leave many objects, and the first
            # full collection after them stalled one reference step by 160 ms on the H200
            # (docs/gpu-validation.md)
            gc.collect()
            self.trainer = KdvfsTrainer(
                self.device,
                self.workload,
                self.tuner.incumbent,
                model=model,
                optimizer=optimizer,
                out_dir=self.out_dir,
                dry_run=dry_run,
                tuner=self,
                poll_s=poll_s,
            )
        except BaseException:
            if self._owns_device:
                self.device.close()
            raise
        clock_lease.hold(self, self._keep_plan)  # after the controller's halt: a signal halts it first
        log.info(
            "kdvfs.tune: %s on %s, budget %.2f%%, strategy %s, %d sites%s%s",
            "dry run" if dry_run else "tuning",
            self.device.name,
            100 * budget,
            strategy,
            len(workload_sites(self.workload)[0]),
            ", the stored plan verified first"
            if stored is not None
            else ", the sweep's pass-level plan verified first"
            if prior is not None
            else "",
            "" if self.run is None else f", MLflow run at {self.run.url_or_path}",
        )

    # --- the training loop's side ---------------------------------------------------------
    def __enter__(self) -> JobTuning:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.close(failed=exc_type is not None)

    @contextmanager
    def step(self) -> Iterator[int]:
        """One training step; yields its number. An exception inside restores stock clocks
        and keeps the plan so far (close(failed=True)) before it propagates."""
        try:
            with self.trainer.step() as number:
                yield number
        except BaseException:
            self.close(failed=True)
            raise

    @property
    def model(self) -> torch.nn.Module | None:
        return self.trainer.model

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self.trainer.optimizer

    def attach(self, model: Any = None, optimizer: Any = None, *, caller_sites: Sequence[str] = ()) -> None:
        """Hook the sites into this model and optimizer (KdvfsTrainer.attach)."""
        self.trainer.attach(model, optimizer, caller_sites=caller_sites)

    def site(self, name: str) -> None:
        self.trainer.site(name)

    def begin_step(self) -> int:
        return self.trainer.begin_step()

    def end_step(self) -> None:
        self.trainer.end_step()

    def close(self, *, failed: bool = False) -> None:
        """Stock clocks back, then the plan, the summary and the MLflow run written (once)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.trainer.close(failed=failed)
        finally:
            clock_lease.let_go(self)
            self._keep_plan()
            self._finish_run(failed)
            if self._owns_device:
                self.device.close()
        summary = self.summary()
        log.info(
            "kdvfs.tune: ended in %s after %d steps: %d adopted, saving %.2f%%, slowdown %.2f%% (budget %.2f%%)%s",
            summary["phase"],
            summary["steps"],
            summary["adopted"],
            100 * summary["running_saving"],
            100 * (summary["slowdown"] or 0.0),
            100 * self.budget,
            ", dry run: no clock was applied" if self.dry_run else "",
        )

    # --- the controller's side (its thread) ----------------------------------------------------
    def on_step_end(self, report: StepReport) -> Schedule:
        """The tuner's answer to one step (StepController), and what it changed kept."""
        pool = self.tuner.pool  # pooled: every rank ends the warm-up at the same step
        clock = report if pool is None or self._warm_until_s == -math.inf else pool.gather(report)[0]
        if self._warm_until_s is None:
            self._warm_until_s = clock.end_s + self.warmup_s
        if clock.end_s < self._warm_until_s:
            return self.tuner.incumbent  # warming up: stock, unmeasured
        self._warm_until_s = -math.inf  # warm: no more gathers here
        answer = self.tuner.on_step_end(report)
        self._watch_outcomes(report.step)
        if len(self.tuner.adoptions) > self._adoptions:
            self._adoptions = len(self.tuner.adoptions)
            a = self.tuner.adoptions[-1]
            log.info(
                "kdvfs.tune: adopted %s: saving %.2f%% +- %.2f%%",
                _pairs(a.schedule),
                100 * a.saving,
                100 * a.saving_se,
            )
            self._keep_plan()
        if isinstance(self.tuner.phase, Settled) and not self._settled_stored:
            self._settled_stored = True
            self._keep_plan(store=True)
        if report.end_s >= self._next_metrics_s and self.run is not None:
            self._next_metrics_s = report.end_s + METRICS_S
            self._metrics.put((report.step, self._step_metrics(report)))
        if report.end_s >= self._next_progress_s:
            self._next_progress_s = report.end_s + self.progress_s
            self._log_progress(report)
        return answer

    def _watch_outcomes(self, step: int) -> None:
        """Record a trial or verification once it is done (the tuner drops it after)."""
        phase = self.tuner.phase
        watched = self._watched
        if watched is not None and watched.done and getattr(phase, "trial", None) is not watched:
            o = watched.outcome()
            self.outcomes.append(
                {
                    "kind": self._watched_kind,
                    "step": step,
                    "candidate": _pairs(watched.candidate),
                    "energy_diff": o.energy_diff,
                    "energy_se": o.energy_se,
                    "time_diff": o.time_diff,
                    "time_se": o.time_se,
                    "blocks": o.blocks,
                    "abandoned": o.abandoned,
                    "adopted": self._watched_adopted(),
                }
            )
            self._watched = None
        trial = getattr(phase, "trial", None)
        if trial is not None and trial is not self._watched:
            self._watched, self._watched_kind = trial, "verify" if isinstance(phase, Verifying) else "trial"
            self._watched_phase = phase

    def _watched_adopted(self) -> bool | None:
        phase = getattr(self, "_watched_phase", None)
        return phase.adopted if isinstance(phase, Verifying) else None

    def _step_metrics(self, report: StepReport) -> dict[str, float]:
        t = self.tuner
        return {
            "step_time_s": report.step_time_s,
            "slowdown": t.account.slowdown() if math.isfinite(t.stock_step_s) else 0.0,
            "running_saving": t.running_saving(),
            "phase": float(_PHASES.index(type(t.phase).__name__)),
            "adopted": float(len(t.adoptions)),
            "temperature_c": report.temperature_c,
        }

    def _log_progress(self, report: StepReport) -> None:
        t = self.tuner
        spent = t.account.slowdown() if math.isfinite(t.stock_step_s) else 0.0
        log.info(
            "kdvfs.tune: %5.0f s, step %d, %s, budget spent %.2f%% of %.2f%%, saving so far %.2f%%",
            report.end_s - (self._start_s if hasattr(self, "_start_s") else report.end_s),
            report.step,
            type(t.phase).__name__,
            100 * max(spent, 0.0),
            100 * self.budget,
            100 * t.running_saving(),
        )
        if not hasattr(self, "_start_s"):
            self._start_s = report.end_s

    # --- what is kept -----------------------------------------------------------------------
    def plan(self) -> Plan | None:
        """The schedule adopted so far as a Plan (None before stock is measured)."""
        t = self.tuner
        if not (math.isfinite(t.stock_step_s) and math.isfinite(t.stock_energy_j)):
            return None
        stock_s = t.stock_step_s / (1.0 - REFERENCE_MARGIN)
        starts = [s for s, _ in t.incumbent.groups]
        ends = [*starts[1:], len(self.workload)]
        shares = t.group_times_s if len(t.group_times_s) == len(starts) else [1.0] * len(starts)
        total = sum(shares) or 1.0
        spans = [
            (s, e, p, t.incumbent_step_s * w / total, t.incumbent_energy_j * w / total)
            for (s, p), e, w in zip(t.incumbent.groups, ends, shares)
        ]
        return Plan.from_groups(
            gpu_name=self.device.name,
            grid=self.device.grid,
            workload=self.workload,
            budget=self.budget,
            groups=spans,
            reference_time_s=stock_s,
            reference_energy_j=t.stock_energy_j,
            source=self.device.source,
            strategy=f"kdvfs.tune {self.strategy}" + (" (dry run: no clock applied)" if self.dry_run else ""),
            measurements=len(self.outcomes),
        )

    def summary(self) -> dict[str, Any]:
        """What the tuning did and measured, JSON-ready."""
        t, c = self.tuner, self.trainer.controller
        answers = sorted(c.answer_s)
        return {
            "device": self.device.name,
            "dry_run": self.dry_run,
            "budget": self.budget,
            "strategy": self.strategy,
            "steps": t.account.steps,
            "phase": type(t.phase).__name__,
            "phases": list(t.phases),
            "stock_step_s": t.stock_step_s / (1.0 - REFERENCE_MARGIN)
            if math.isfinite(t.stock_step_s)
            else None,
            "stock_energy_per_step_j": t.stock_energy_j if math.isfinite(t.stock_energy_j) else None,
            "window_energy_cv": t.window_sd if math.isfinite(t.window_sd) else None,
            "trial_window_s": t.timing.trial_window_s,
            "step_time_cv_per_root_s": t.time_sd_per_root_s,
            "running_saving": t.running_saving(),
            "slowdown": t.account.slowdown() if math.isfinite(t.stock_step_s) else None,
            "adopted": len(t.adoptions),
            "adoptions": [
                {"step": a.step, "schedule": _pairs(a.schedule), "saving": a.saving, "saving_se": a.saving_se}
                for a in t.adoptions
            ],
            "plan": _pairs(t.incumbent),
            "outcomes": list(self.outcomes),
            "alarms": [{"step": a.step, "reasons": list(a.reasons), "held": a.held} for a in t.alarms],
            "mismatched_steps": len(c.mismatched_steps),
            "clock_requests": len(c.requests),
            "counter_polling": None if c.poller is None else c.poller.figures(),
            "tuner_answer_s": {  # the median of the last ANSWERS_KEPT; max and total of all
                "median": answers[len(answers) // 2] if answers else None,
                "max": c.answer_max_s,
                "total": c.answer_total_s,
            },
            "tuner_error": None
            if c.tuner_error is None
            else f"{type(c.tuner_error).__name__}: {c.tuner_error}",
        }

    def _keep_plan(self, *, store: bool = False) -> None:
        """The plan so far into out_dir (and, once Settled and not in dry run, the plan store)."""
        try:
            plan = self.plan()
            if plan is None:
                return
            if self.out_dir is not None:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                save_plan(plan, self.out_dir / PLAN_FILE)
                (self.out_dir / SUMMARY_FILE).write_text(json.dumps(self.summary(), indent=1) + "\n")
            if store and self.store is not None and not self.dry_run:
                path = self.store.put(plan)
                log.info("kdvfs.tune: settled; plan stored at %s", path)
        except Exception as exc:  # keeping the plan never stops training
            log.warning("kdvfs.tune: the plan could not be kept: %s", exc)

    def _stored_plan(self) -> Plan | None:
        if self.store is None:
            return None
        try:
            return self.store.get(self.device.name, self.device.grid, self.workload.signature)
        except KdvfsError as exc:
            log.warning("kdvfs.tune: stored plan not used: %s", exc)
            return None

    # --- MLflow ------------------------------------------------------------------------------
    def _params(self, seed: int, stored: Plan | None) -> dict[str, Any]:
        return {
            "device": self.device.name,
            "dry_run": self.dry_run,
            "budget": self.budget,
            "strategy": self.strategy,
            "seed": seed,
            "workload": self.workload.name,
            "workload_signature": self.workload.signature,
            "sites": "|".join(workload_sites(self.workload)[0]),
            "stored_plan": stored is not None,
        }

    def _deliver_metrics(self) -> None:
        while (item := self._metrics.get()) is not None:
            self.run.log_metrics(*item)

    def _finish_run(self, failed: bool) -> None:
        if self.run is None:
            return
        self._metrics.put(None)
        self._tracking.join()
        plan = self.plan()
        if plan is not None:
            self.run.log_dict(plan.to_dict(), "plan.json")
        self.run.log_dict(self.summary(), "summary.json")
        self.run.end("FAILED" if failed else "FINISHED")


_PHASES = ("Reference", "Exploring", "Verifying", "Settled", "Retuning")


def _default_sites(model: Any, optimizer: Any) -> list[str]:
    if model is None and optimizer is None:
        return [STEP_SITE, "forward", "backward", "optimizer"]
    return [
        STEP_SITE,
        *(["forward", "backward"] if model is not None else []),
        *(["optimizer"] if optimizer else []),
    ]


def _site_starts(workload: Workload) -> list[int]:
    """Each site's first kernel: where the job can switch clocks."""
    _, kernel_sites = workload_sites(workload)
    return sorted({kernel_sites.index(s) for s in set(kernel_sites)})


def _stated(given: float | None, device: Device, name: str, default: float) -> float:
    if given is not None:
        return given
    value = getattr(device, name, None)
    return float(value) if isinstance(value, int | float) else default


def _plan_store(store: PlanStore | Path | str | bool | None) -> PlanStore | None:
    if store is False:
        return None
    if isinstance(store, PlanStore):
        return store
    return PlanStore(None if store is None or store is True else store)


def _open_run(uri: str | None, name: str, params: dict[str, Any]) -> Any:
    try:
        from kdvfs.tuner.tracking import Tracker
    except ImportError as exc:
        log.warning("kdvfs.tune: no MLflow run (%s)", exc)
        return None
    return Tracker(uri).start_run(name, params, tags={"kdvfs.kind": "tune"})


def _pairs(schedule: Schedule) -> list[list[Any]]:
    return [[s, None if p is None else p.as_list()] for s, p in schedule.groups]
