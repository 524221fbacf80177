"""Drift scenarios run against the online tuner, and plan reuse on a restart (issue 6).

- run_scenario: the tuner settles (settle), the scenario lands (runtime/scenarios.py), the
  run continues; it reports detection, recovery, the budget kept and the saving against an
  oracle (oracle_saving), and the false alarms of a stable run (stable_run).
- measure_restart: a cold start that stores its plan against a restart that reuses it.
- Session: how to open the simulated job; SavingTrace: the running schedule's noiseless
  saving point by point; store_plan: a settled session's plan into a store.

The scenarios and the meaning of every figure reported:
docs/design-tuner.md#adaptation-drift-scenarios-and-restarts
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdvfs.runtime.iteration import Schedule, schedule_figures
from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.scenarios import get_scenario
from kdvfs.runtime.types import KdvfsError, Workload
from kdvfs.tuner.online import OnlineTuner, Point
from kdvfs.tuner.plan_store import PlanStore
from kdvfs.tuner.report import TuneReport
from kdvfs.tuner.sweep import realisable, run_sweep

#: Share of the oracle's saving a schedule must keep to count as recovered; a fraction.
RECOVERED_SHARE = 0.95
#: Training run at a time while waiting for convergence and a ready drift watch; s.
READY_STEP_S = 20.0
#: Training after which a session that has not settled is an error; s.
READY_LIMIT_S = 200_000.0


@dataclass(frozen=True)
class Session:
    """How to open the simulated job: device spec, workload spec, tuner settings.

    Args:
        device_spec: the device, as the CLI takes it (sim:PRESET, replay:CSV).
        workload_spec: the workload, as the CLI takes it (gpt3-xl-layer, trace:CSV, table).
        strategy: the search strategy's name.
        budget: the largest slowdown allowed against stock, a fraction.
        seed: seed of the device's noise and the strategy's draws.
        warmup_s: training at stock before the reference is measured, s.
        workload: a workload object used instead of workload_spec (tests use small slices).
    """

    device_spec: str
    workload_spec: str
    strategy: str = "ucb"
    budget: float = 0.01
    seed: int = 0
    warmup_s: float = 120.0
    workload: Workload | None = None

    def open(self, seed: int | None = None) -> tuple[ModelDevice, Workload]:
        device = open_device(self.device_spec, seed=self.seed if seed is None else seed)
        return device, self.workload or open_workload(self.workload_spec, device)

    def tuner(
        self, device: ModelDevice, workload: Workload, store: PlanStore | None, seed_offset: int = 0
    ) -> OnlineTuner:
        return OnlineTuner(
            device,
            workload,
            strategy=self.strategy,
            budget=self.budget,
            seed=self.seed + seed_offset,
            warmup_s=self.warmup_s,
            plan_store=store,
        )


class SavingTrace:
    """The running schedule's noiseless saving, point by point (evaluated when it changes).
    The tuner's runs at stock between two points (an alarm's settling and reference, a stored
    plan's reference: state.stock_spans) are recorded too, as saving nothing from their start.

    Args:
        tuner: the session whose running schedule is traced (called with each of its points).
        offset: added to the tuner's iteration counts (a restarted job's earlier iterations);
            iterations.
    """

    def __init__(self, tuner: OnlineTuner, offset: int = 0) -> None:
        self.tuner, self.offset = tuner, offset
        self._cache: dict[Schedule, tuple[float, float]] = {}
        self.points: list[tuple[int, float, float, bool]] = []  # (iteration, saving, slowdown, a trial's)
        self._spans_seen = 0

    def figures(self) -> tuple[float, float]:
        t = self.tuner
        schedule = t.state.schedule
        if schedule not in self._cache:
            self._cache[schedule] = schedule_figures(t.device, t.workload, schedule)
        return self._cache[schedule]

    def __call__(self, point: Point) -> None:
        spans = self.tuner.state.stock_spans
        self.points += [(start + self.offset, 0.0, 0.0, False) for start, _ in spans[self._spans_seen :]]
        self._spans_seen = len(spans)
        saving, slowdown = self.figures()
        self.points.append((point.iteration + self.offset, saving, slowdown, self.tuner.refinement_running))

    def from_stored_plan(self) -> None:
        """A kept stored (or carried) plan ran from state.plan_from_iteration, before the first
        reported point: record it there."""
        start = self.tuner.state.plan_from_iteration
        if start is not None:
            saving, slowdown = self.figures()
            self.points.append((start + self.offset, saving, slowdown, False))

    def holds_from(self, saving: float, budget: float, after: int = 0) -> int | None:
        """First recorded iteration (>= after) from which every recorded schedule, a
        refinement's trials excepted, saves at least `saving` within the budget."""
        start = None
        for it, s, d, trial in self.points:
            if it < after or trial:
                continue
            start = (it if start is None else start) if s >= saving and d <= budget else None
        return start

    def first_reaching(self, saving: float, budget: float, after: int = 0) -> int | None:
        """First recorded iteration (>= after) whose schedule saves at least `saving` within
        the budget (a trial schedule over it does not count)."""
        return next((it for it, s, d, _ in self.points if it >= after and s >= saving and d <= budget), None)


def settle(tuner: OnlineTuner, on_point: Callable[[Point], None] | None = None) -> int:
    """Run until the session converged and its drift watch can alarm; the iterations run."""
    step = max(1, int(READY_STEP_S / tuner.reference.iteration_time_s))
    limit = int(READY_LIMIT_S / tuner.reference.iteration_time_s)
    while not tuner.watch_ready:
        if tuner.account.iterations >= limit:
            raise KdvfsError(
                f"{tuner.workload.name} on {tuner.device.name}: not settled after {limit} iterations"
            )
        tuner.run(tuner.account.iterations + step, on_point)
    return tuner.account.iterations


def oracle_saving(session: Session, scenario_name: str) -> tuple[float, Schedule]:
    """Best grouped schedule under the changed conditions from a full sweep (see module doc)."""
    device, workload = session.open()
    device, workload = get_scenario(scenario_name).apply(device, workload, seed=session.seed + 1)
    best = realisable(device, run_sweep(device, workload), session.budget)
    return best.energy_saving, best.schedule


def store_plan(tuner: OnlineTuner, store: PlanStore) -> Path | None:
    """Store the session's plan when it has converged on a plan of its own; its file."""
    if tuner.state.converged_at_iteration is None or tuner.state.plan_source != "tuned":
        return None
    return store.put(TuneReport(tuner, {}).plan(tuner.strategy))


def run_scenario(
    session: Session,
    scenario_name: str,
    *,
    at_iteration: int | None = None,
    after_iterations: int | None = None,
    store_dir: Path | None = None,
    fleet_store: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The scenario's JSON document (its figures: docs/design-tuner.md, adaptation);
    after_iterations defaults to twice the iterations the first convergence took. fleet_store
    (gpu-swap only): another job of the fleet, started after this one, has tuned the new card
    meanwhile (a cold start of its own) and left its plan in the shared store."""
    say = progress or (lambda _msg: None)
    with tempfile.TemporaryDirectory(prefix="kdvfs-plans-") as tmp:
        store = PlanStore(store_dir or tmp)
        fleet_job = None
        if fleet_store:
            fleet_device, fleet_workload = session.open(seed=session.seed + 2)
            other, other_workload = get_scenario(scenario_name).apply(
                fleet_device, fleet_workload, seed=session.seed + 2
            )
            if other is fleet_device:
                raise KdvfsError(
                    f"scenario {scenario_name}: a fleet store only matters where the job restarts on another "
                    "card (gpu-swap)"
                )
            say(f"{scenario_name}: another job tunes {other.name} and stores its plan")
            fleet_job = session.tuner(other, other_workload, None, seed_offset=2)
            settle(fleet_job)
        device, workload = session.open()
        tuner = session.tuner(device, workload, store)
        if fleet_job is not None:
            store_plan(fleet_job, store)
        say(f"{scenario_name}: tuning to convergence")
        if at_iteration is None:
            at = settle(tuner)
        else:
            tuner.run(at_iteration)
            at = at_iteration
        conv = tuner.state.converged_at_iteration
        after = after_iterations if after_iterations is not None else 2 * (conv or at)
        stored = store_plan(tuner, store)
        before_saving = SavingTrace(tuner).figures()[0]
        scenario = get_scenario(scenario_name, at)
        new_device, new_workload = scenario.apply(device, workload, seed=session.seed + 1)
        say(f"{scenario_name}: change after {at} iterations, running {after} more")
        restart = new_device is not device
        counter_from_j, iterations_from = (new_device.energy_j(), 0) if restart else (device.energy_j(), at)
        if restart:
            device.reset_clocks()
            alarms_before = unconfirmed_before = 0
            tuner = session.tuner(new_device, new_workload, store, seed_offset=1)
            trace = SavingTrace(tuner, offset=at)
            trace.from_stored_plan()
            trace(tuner._point())
            tuner.run(after, trace)
            detected: int | None = 0
        else:
            alarms_before, unconfirmed_before = len(tuner.state.alarms), tuner.state.unconfirmed_alarms
            if new_workload is not workload:
                tuner.change_workload(new_workload)
            trace = SavingTrace(tuner)
            trace(tuner._point())
            tuner.run(at + after, trace)
            new_alarms = tuner.state.alarms[alarms_before:]
            detected = new_alarms[0].iteration - at if new_alarms else None
        points = [p for p in tuner.state.points if restart or p.iteration > at]
        say(f"{scenario_name}: oracle sweep under the new conditions")
        oracle, oracle_schedule = oracle_saving(session, scenario_name)
        first_at = trace.first_reaching(RECOVERED_SHARE * oracle, session.budget, after=at)
        recovered_at = trace.holds_from(RECOVERED_SHARE * oracle, session.budget, after=at)
        say(f"{scenario_name}: stable run of the same length")
        stable_alarms, stable_windows, stable_unconfirmed = stable_run(session, at + after)
        end_saving, end_slowdown = trace.figures()
        n_after = tuner.account.iterations - iterations_from
        stock_j = tuner.device.expected_iteration([(k, None, k.launches) for k in tuner.workload.kernels])[1]
        lost_j = (tuner.device.energy_j() - counter_from_j) - (1.0 - oracle) * stock_j * n_after
        return {
            "scenario": scenario_name,
            "device": session.device_spec,
            "gpu_after": tuner.device.name,
            "workload_after": tuner.workload.name,
            "signature_after": tuner.workload.signature,
            "strategy": session.strategy,
            "budget": session.budget,
            "seed": session.seed,
            "source": tuner.device.source,
            "converged_at_iteration": conv,
            "at_iteration": at,
            "after_iterations": after,
            "saving_before": before_saving,
            "plan_stored": stored is not None,
            "restart": restart,
            "fleet_store": fleet_store,
            "plan_store_on_restart": tuner.state.store_note if restart else None,
            "plan_source_after": tuner.state.plan_source,
            "stored_plan_from_iteration": tuner.state.plan_from_iteration if restart else None,
            "iteration_time_s_after": tuner.reference.iteration_time_s,
            "detected_after_iterations": detected,
            "alarms_after_change": [
                {"after_iterations": a.iteration - at, **a.summary()}
                for a in tuner.state.alarms[alarms_before:]
            ],
            "stock_spans_after": [
                [a - iterations_from, b - iterations_from]
                for a, b in tuner.state.stock_spans
                if a >= iterations_from
            ],
            "reconverged_after_iterations": [i - at for i in tuner.state.reconverged_at]
            if not restart
            else ([tuner.state.converged_at_iteration] if tuner.state.converged_at_iteration else []),
            "recovered_after_iterations": None if recovered_at is None else recovered_at - at,
            "first_reached_after_iterations": None if first_at is None else first_at - at,
            "max_slowdown": float(max((p.slowdown for p in points), default=0.0)),
            "budget_violations": int(sum(p.slowdown > session.budget for p in points)),
            "points_after": len(points),
            "energy_saving_after": end_saving,
            "schedule_slowdown_after": end_slowdown,
            "oracle_saving_after": oracle,
            "oracle_groups": len(oracle_schedule.groups),
            "energy_lost_vs_oracle_j": lost_j,
            "energy_lost_vs_oracle_share": lost_j / (stock_j * n_after),
            "unconfirmed_alarms": tuner.state.unconfirmed_alarms - unconfirmed_before,
            "false_alarms_stable": stable_alarms,
            "unconfirmed_alarms_stable": stable_unconfirmed,
            "stable_windows": stable_windows,
        }


def stable_run(session: Session, iterations: int) -> tuple[int, int, int]:
    """(alarms, time windows watched, unconfirmed alarms) of a run of `iterations` without any
    change."""
    device, workload = session.open()
    tuner = session.tuner(device, workload, None)
    tuner.run(iterations)
    return len(tuner.state.alarms), tuner.state.watch_windows, tuner.state.unconfirmed_alarms


def measure_restart(
    session: Session, *, iterations: int | None = None, store_dir: Path | None = None
) -> dict[str, Any]:
    """Cold start (storing its plan) vs a restart on a fresh card of the same kind that finds
    it: iterations until each one's schedule reaches the stored plan's saving."""
    with tempfile.TemporaryDirectory(prefix="kdvfs-plans-") as tmp:
        store = PlanStore(store_dir or tmp)
        device, workload = session.open()
        cold = session.tuner(device, workload, store)
        cold_trace = SavingTrace(cold)
        if iterations is None:
            settle(cold, cold_trace)
        else:
            cold.run(iterations, cold_trace)
        if store_plan(cold, store) is None:
            raise KdvfsError("restart measurement: the cold start did not converge; run more iterations")
        old_saving = cold_trace.figures()[0]
        device2, workload2 = session.open(seed=session.seed + 1)
        warm = session.tuner(device2, workload2, store, seed_offset=1)
        warm_trace = SavingTrace(warm)
        warm_trace.from_stored_plan()
        warm_trace(warm._point())
        warm.run(warm.account.iterations + 1000, warm_trace)
        tol = 1e-9
        cold_at = cold_trace.first_reaching(old_saving - tol, session.budget)
        warm_at = warm_trace.first_reaching(old_saving - tol, session.budget)
        return {
            "device": session.device_spec,
            "gpu": device.name,
            "workload": workload.name,
            "strategy": session.strategy,
            "budget": session.budget,
            "source": device.source,
            "old_saving": old_saving,
            "cold_converged_at_iteration": cold.state.converged_at_iteration,
            "cold_iterations_to_old_saving": cold_at,
            "cold_measurements": cold.state.obs.measurements,
            "restart_plan_source": warm.state.plan_source,
            "restart_store_note": warm.state.store_note,
            "restart_iterations_to_old_saving": warm_at,
            "restart_plan_from_iteration": warm.state.plan_from_iteration,
            "restart_verified_after_iterations": warm.state.converged_at_iteration,
            "restart_reference_iterations": warm.reference.all_iterations,
            "restart_measurements": warm.state.obs.measurements,
            "restart_share_of_cold": None if cold_at in (None, 0) or warm_at is None else warm_at / cold_at,
        }
