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
- While it tunes, the heap alive at its start is frozen (gc.freeze; thawed at close), so the
  garbage collections its per-step objects set off do not walk the job's heap and stall steps.
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
from kdvfs.runtime.types import KdvfsError, Workload
from kdvfs.tuner.plan import Plan, save_plan
from kdvfs.tuner.plan_store import PlanStore
from kdvfs.tuner.run import Card, Point, TuningRun, choose_prior, point_metrics, schedule_pairs
from kdvfs.tuner.step_priors import sweep_prior
from kdvfs.tuner.step_tuner import DEFAULT_STRATEGY, Adoption, PhaseEntered, StepTiming, StepTuner

log = logging.getLogger(__name__)

#: Time between two progress lines in the log, s of training.
PROGRESS_S = 10.0
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
        poll_s: least time between the starts of two energy-counter reads, s (runtime/step_feed.py).
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
        source = getattr(device, "source", None)
        if source in ("simulated", "replayed"):
            raise KdvfsError(
                f"kdvfs.tune: device {getattr(device, 'name', source)!r} is {source} and runs no real "
                "kernels, so a training loop on it measures nothing: give a real card (an NVML index or "
                "NvmlDevice), or tune simulated training with `kdvfs tune --device sim:PRESET`"
            )
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
            prior = choose_prior(
                self.device,
                self.workload,
                budget,
                store=self.store,
                measured=None if prior_sweep is None else sweep_prior(Path(prior_sweep), self.workload),
            )
            if prior.note and prior.source != "store" and self.store is not None:
                (log.warning if "refused" in prior.note else log.info)("kdvfs.tune: %s", prior.note)
            self.run = TuningRun(
                Card.of(
                    self.device,
                    switch_latency_s=switch_latency_s,
                    energy_update_period_s=energy_update_period_s,
                ),
                self.workload,
                budget=budget,
                strategy=strategy,
                seed=seed,
                prior=prior,
                sites=_site_starts(self.workload),
                timing=timing,
                pool=pool,
            )
            self.run.subscribe(self._follow)
            self.mlflow_run = (
                _open_run(tracking_uri, run_name, self._params(seed, prior.source)) if track else None
            )
            self._metrics: queue.SimpleQueue[tuple[int, dict[str, float]] | None] = queue.SimpleQueue()
            self._tracking = threading.Thread(target=self._deliver_metrics, name="kdvfs-mlflow", daemon=True)
            if self.mlflow_run is not None:
                self._tracking.start()
            self._settled_stored = False
            self._next_progress_s = -math.inf
            self._closed = False
            # one full collection now: the strategy's imports leave many objects, and the first
            # full collection after them stalled one reference step by 160 ms on the H200
            # (docs/gpu-validation.md); then what is alive is frozen until close(), so the full
            # collections that the tuner's own per-step objects set off traverse only what was
            # made since, not the job's and the libraries' whole heap (each such collection
            # holds the interpreter: the training thread launches nothing meanwhile)
            gc.collect()
            self._froze = not gc.get_freeze_count()  # a job that froze its own heap keeps it so
            if self._froze:
                gc.freeze()
            self.trainer = KdvfsTrainer(
                self.device,
                self.workload,
                self.run.tuner.incumbent,
                model=model,
                optimizer=optimizer,
                out_dir=self.out_dir,
                dry_run=dry_run,
                tuner=self,
                poll_s=poll_s,
            )
        except BaseException:
            if getattr(self, "_froze", False):
                gc.unfreeze()
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
            {
                "store": ", the stored plan verified first",
                "transferred": ", another GPU's stored plan carried to this card verified first",
                "measured": ", the sweep's pass-level plan verified first",
            }.get(prior.source, ""),
            "" if self.mlflow_run is None else f", MLflow run at {self.mlflow_run.url_or_path}",
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
            if getattr(self, "_froze", False):
                gc.unfreeze()  # the job's objects collectable again, as before kdvfs.tune
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
            100 * summary["plan_energy_saving"],
            100 * (summary["slowdown"] or 0.0),
            100 * self.budget,
            ", dry run: no clock was applied" if self.dry_run else "",
        )

    # --- the controller's side (its thread) ----------------------------------------------------
    @property
    def tuner(self) -> StepTuner:
        """The run's tuner (read it; the controller feeds the run)."""
        return self.run.tuner

    @property
    def outcomes(self) -> list[dict[str, Any]]:
        """Each finished trial and verification: kind, step, candidate, figures, adopted."""
        return self.run.outcomes

    def on_step_end(self, report: StepReport) -> Schedule:
        """The tuner's answer to one step (StepController); what it changed is kept through
        the run's events (_follow)."""
        pool = self.run.tuner.pool  # pooled: every rank ends the warm-up at the same step
        clock = report if pool is None or self._warm_until_s == -math.inf else pool.gather(report)[0]
        if self._warm_until_s is None:
            self._warm_until_s = clock.end_s + self.warmup_s
        if clock.end_s < self._warm_until_s:
            return self.run.tuner.incumbent  # warming up: stock, unmeasured
        if self._warm_until_s != -math.inf:  # the first step tuned: training second 0 at its start
            self.run.offset_s = report.end_s - report.step_time_s
        self._warm_until_s = -math.inf  # warm: no more gathers here
        return self.run.on_step_end(report)

    def _follow(self, event: object) -> None:
        """The run's events: an adoption logged and the plan kept; once Settled the plan
        stored; each Point to MLflow and, every progress_s, to the log."""
        if isinstance(event, Adoption):
            log.info(
                "kdvfs.tune: adopted %s: saving %.2f%% +- %.2f%%",
                schedule_pairs(event.schedule),
                100 * event.saving,
                100 * event.saving_se,
            )
            self._keep_plan()
        elif isinstance(event, PhaseEntered) and event.phase == "Settled" and not self._settled_stored:
            self._settled_stored = True
            self._keep_plan(store=True)
        elif isinstance(event, Point):
            if self.mlflow_run is not None:
                self._metrics.put((event.step, point_metrics(event)))
            if event.end_s >= self._next_progress_s:
                self._next_progress_s = event.end_s + self.progress_s
                self._log_progress(event)

    def _log_progress(self, point: Point) -> None:
        log.info(
            "kdvfs.tune: %5.0f s, step %d, %s, budget spent %.2f%% of %.2f%%, saving so far %.2f%%",
            point.end_s,
            point.step,
            point.phase,
            100 * max(point.slowdown if math.isfinite(point.slowdown) else 0.0, 0.0),
            100 * self.budget,
            100 * point.plan_energy_saving,
        )

    # --- what is kept -----------------------------------------------------------------------
    def plan(self) -> Plan | None:
        """The schedule adopted so far as a Plan (None before stock is measured)."""
        return self.run.plan(
            f"kdvfs.tune {self.strategy}" + (" (dry run: no clock applied)" if self.dry_run else "")
        )

    def summary(self) -> dict[str, Any]:
        """What the tuning did and measured, JSON-ready: the run's summary and the controller's."""
        c = self.trainer.controller
        answers = sorted(c.answer_s)
        return self.run.summary() | {
            "dry_run": self.dry_run,
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

    # --- MLflow ------------------------------------------------------------------------------
    def _params(self, seed: int, prior: str) -> dict[str, Any]:
        return {
            "device": self.device.name,
            "dry_run": self.dry_run,
            "budget": self.budget,
            "strategy": self.strategy,
            "seed": seed,
            "workload": self.workload.name,
            "workload_signature": self.workload.signature,
            "sites": "|".join(workload_sites(self.workload)[0]),
            "prior": prior,
        }

    def _deliver_metrics(self) -> None:
        while (item := self._metrics.get()) is not None:
            self.mlflow_run.log_metrics(*item)

    def _finish_run(self, failed: bool) -> None:
        if self.mlflow_run is None:
            return
        self._metrics.put(None)
        self._tracking.join()
        plan = self.plan()
        if plan is not None:
            self.mlflow_run.log_dict(plan.to_dict(), "plan.json")
        self.mlflow_run.log_dict(self.summary(), "summary.json")
        self.mlflow_run.end("FAILED" if failed else "FINISHED")


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
