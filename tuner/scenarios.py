"""Drift scenarios run against the step-driven tuner, timed in seconds of training.

- `run_scenario`: a TuneSession (tuner/session.py) trains until settled with its drift watch
  ready (or until --at-s), the scenario (runtime/scenarios.py) lands, training goes on; the
  document says when the change was detected, when the card's new stock had settled, when
  the plan was worth >= RECOVERED_SHARE of the new conditions' realisable oracle (and stayed),
  the budget kept, and the false alarms of a stable run of the same length.
- gpu-swap restarts the job on another card: the old job's plan is in the plan store, the new
  job starts from it carried to the new card's clocks ("transferred"), or, with fleet_store,
  from the plan another job of the fleet tuned on that card ("store").

What every figure means: docs/design-step-tuner.md (drift); figures: docs/benchmarks.md.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.scenarios import get_scenario
from kdvfs.runtime.schedule import schedule_figures
from kdvfs.runtime.types import KdvfsError
from kdvfs.tuner.oracle import realisable_oracle
from kdvfs.tuner.plan_store import PlanStore
from kdvfs.tuner.report import tune_report
from kdvfs.tuner.run import choose_prior, job_sites, reached_after
from kdvfs.tuner.session import TuneSession
from kdvfs.tuner.step_tuner import WATCH_CONFIRM_WINDOWS, WATCH_WARMUP, WATCH_WINDOW_S
from kdvfs.tuner.text import PRIORS

#: Share of the new conditions' realisable oracle that counts as recovered; a fraction.
RECOVERED_SHARE = 0.95
#: Detection target for a new power limit or workload; s of training.
DETECT_TARGET_S = 5.0
#: Detection target of an ambient step, in the card's thermal time constants.
DETECT_TARGET_TAUS = 2.0
#: Recovery target beyond the card's settling time; s of training.
RECOVER_EXTRA_S = 60.0
#: Training after settling before the change lands by default: the watch learns, then some; s.
READY_S = (WATCH_WARMUP + WATCH_CONFIRM_WINDOWS) * WATCH_WINDOW_S + 10.0
#: Training before a session that has not settled is an error; s.
READY_LIMIT_S = 7200.0
#: Training run at a time while waiting to settle; s.
CHUNK_S = 10.0


def run_scenario(
    device_spec: str,
    workload_spec: str,
    scenario_name: str,
    *,
    strategy: str = "botorch",
    budget: float = 0.01,
    seed: int = 0,
    at_s: float | None = None,
    after_s: float = 300.0,
    store_dir: Path | None = None,
    fleet_store: bool = False,
    stable: bool = True,
    prior: str = "model",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The scenario's JSON document. at_s: training before the change (None: once settled
    with the watch ready); after_s: training after it; stable: also count the alarms of a run
    without any change, of the same length; prior: "model" (the job starts from its card's
    noiseless model's plan, and re-plans with the model after an alarm) or "none" (as on a
    real card: no plan to start from, and after an alarm the plan before is verified and the
    search goes on)."""
    if prior not in PRIORS:
        raise KdvfsError(f"prior must be one of {', '.join(PRIORS)}, got {prior!r}")
    say = progress or (lambda _msg: None)
    scenario = get_scenario(scenario_name)
    with tempfile.TemporaryDirectory(prefix="kdvfs-plans-") as tmp:
        store = PlanStore(store_dir or tmp)

        def session(seed_: int) -> TuneSession:
            device = open_device(device_spec, seed=seed_)
            workload = open_workload(workload_spec, device)
            model = open_device(device_spec, noise=0.0) if prior == "model" else None
            return _model_session(device, workload, model, strategy=strategy, budget=budget, seed=seed_)

        job = session(seed)
        started_from = job.prior.source  # "model" or "none": what the job's first plan came from
        if fleet_store:
            _fleet_plan(job, scenario, store, seed + 2, say)
        say(f"{scenario_name}: tuning until settled")
        at = _settle(job) if at_s is None else _train(job, at_s)
        converged_s = job.converged_after_s
        if converged_s is not None:
            store.put(tune_report(job, None, strategy).plan(strategy))
        device, workload = job.device, job.workload
        new_device, new_workload = scenario.apply(device, workload, seed=seed + 1)
        restart = new_device is not device
        say(f"{scenario_name}: change after {at:.0f} s of training, {after_s:.0f} s more")
        if restart:
            device.reset_clocks()
            sites = job_sites(new_workload, new_device.switch_latency_s)
            prior = choose_prior(new_device, new_workload, budget, store=store, model=None, sites=sites)
            job.restart_on(new_device, prior, sites=sites)
        elif new_workload is not workload:
            job.change_workload(new_workload)
        alarms_before = len(job.tuner.alarms)
        job.run_until(at + after_s)
        say(f"{scenario_name}: the realisable oracle of the new conditions (in the step, noiseless)")
        noiseless = open_device(device_spec, noise=0.0)
        noiseless, _ = scenario.apply(noiseless, workload, seed=seed + 1)
        # searched in the step at the job's sites (tuner/oracle.py), from its usual starts and
        # from the tuner's own plan: the yardstick is at least anything the tuner ran
        sites = job.sites if job.sites is not None else job_sites(new_workload, noiseless.switch_latency_s)
        best = realisable_oracle(noiseless, new_workload, budget, sites, starts=[job.tuner.incumbent])
        stable_alarms = _stable_alarms(session(seed), at + after_s) if stable else None
        return _document(
            job,
            scenario_name,
            at,
            after_s,
            restart,
            alarms_before,
            best,
            noiseless,
            converged_s,
            stable_alarms,
            device=device_spec,
            strategy=strategy,
            seed=seed,
            fleet_store=fleet_store,
            prior=started_from,
        )


def _train(job: TuneSession, until_s: float) -> float:
    job.run_until(until_s)
    return job.seconds


def _settle(job: TuneSession) -> float:
    """Train until settled for READY_S; the training seconds then."""
    while job.seconds < READY_LIMIT_S:
        job.run_until(job.seconds + CHUNK_S)
        settled = [t for t, name in job.phase_log if name == "Settled"]
        if job.phase_log[-1][1] == "Settled" and job.seconds - settled[-1] >= READY_S:
            return job.seconds
    raise KdvfsError(f"the tuner did not settle within {READY_LIMIT_S:.0f} s of training")


def _fleet_plan(job: TuneSession, scenario, store: PlanStore, seed: int, say) -> None:
    """Another job of the fleet tunes the card the scenario swaps to, and stores its plan."""
    other_device, _ = scenario.apply(open_device(_spec(job), seed=seed), job.workload, seed=seed)
    if other_device.name == job.device.name:
        raise KdvfsError(
            f"scenario {scenario.name}: a fleet store only matters where the job restarts on another card (gpu-swap)"
        )
    say(f"{scenario.name}: another job tunes {other_device.name} and stores its plan")
    model, _ = scenario.apply(open_device(_spec(job), noise=0.0), job.workload, seed=seed)
    other = _model_session(
        other_device, job.workload, model, strategy=job.strategy, budget=job.budget, seed=seed
    )
    _settle(other)
    store.put(tune_report(other, None, job.strategy).plan(job.strategy))


def _model_session(device, workload, model, *, strategy: str, budget: float, seed: int) -> TuneSession:
    """A job on `device` starting from its model's plan (`model`: a noiseless copy of the card,
    also re-planned after an alarm; None: from no prior, nothing re-planned), switching at the
    sites its card allows."""
    sites = job_sites(workload, device.switch_latency_s)
    prior = choose_prior(device, workload, budget, store=None, model=model, sites=sites)
    return TuneSession(
        device, workload, strategy=strategy, budget=budget, seed=seed, prior=prior, model=model, sites=sites
    )


def _spec(job: TuneSession) -> str:
    return f"sim:{job.device.preset_name}"


def _stable_alarms(job: TuneSession, seconds: float) -> int:
    job.run_until(seconds)
    return len(job.tuner.alarms)


def _recovered_s(
    job: TuneSession, change_s: float, noiseless, workload, target: float, *, restart: bool
) -> float | None:
    """From when the plan was worth >= target to the end, in training seconds (None: not so at
    the end). A schedule run before the change counts from the change when it was good there;
    after a restart on another card, only the new card's schedules count (the old card's
    pairs are not in the new card's grid)."""

    def saving(schedule) -> float:
        return schedule_figures(noiseless, workload, schedule)[0]

    history = [
        (max(t, change_s), s)
        for t, s in job.schedule_log
        if t >= change_s or (not restart and saving(s) >= target)
    ]
    return reached_after(history, saving, target)


def _document(
    job: TuneSession,
    name: str,
    at: float,
    after_s: float,
    restart: bool,
    alarms_before: int,
    best,
    noiseless,
    converged_s: float | None,
    stable_alarms: int | None,
    **settings,
) -> dict[str, Any]:
    alarms = job.tuner.alarms[alarms_before:] if not restart else []
    detected = None if not alarms else job.training_s(alarms[0].end_s) - at
    phases_after = [(t, p) for t, p in job.phase_log if t >= at]
    left = [t for (t, _), (_, before) in zip(phases_after[1:], phases_after) if before == "Retuning"]
    settled = left[0] - at if left else (0.0 if alarms and alarms[0].held else None)
    if restart:
        settled = 0.0
    recovered = _recovered_s(
        job, at, noiseless, job.workload, RECOVERED_SHARE * best.energy_saving, restart=restart
    )
    final_saving, final_slowdown = schedule_figures(noiseless, job.workload, job.tuner.incumbent)
    after = [p for p in job.points if p.end_s > at and p.slowdown == p.slowdown]
    tau_s = getattr(getattr(noiseless, "preset", None), "tau_s", None)
    return {
        "scenario": name,
        **settings,
        "budget": job.budget,
        "gpu_after": job.device.name,
        "workload_after": job.workload.name,
        "source": job.device.source,
        "converged_after_s": converged_s,
        "change_at_s": at,
        "after_s": after_s,
        "restart": restart,
        "prior_after": {"source": job.prior.source, "note": job.prior.note} if restart else None,
        "detected_after_s": detected,
        "detect_target_s": DETECT_TARGET_TAUS * tau_s
        if name == "ambient-step" and tau_s
        else DETECT_TARGET_S,
        "alarms_after_change": [
            {"after_s": job.training_s(a.end_s) - at, "reasons": list(a.reasons), "held": a.held}
            for a in alarms
        ],
        "settled_after_s": settled,
        "recovered_after_s": None if recovered is None else recovered - at,
        "recovery_target_s": None if settled is None else settled + RECOVER_EXTRA_S,
        "max_slowdown_after": float(max((p.slowdown for p in after), default=0.0)),
        "budget_violations_after": int(sum(p.slowdown > job.budget for p in after)),
        "energy_saving_after": final_saving,
        "slowdown_after": final_slowdown,
        "oracle_saving_after": best.energy_saving,
        "oracle_groups": len(best.schedule.groups),
        "oracle_method": best.method + "; also searched from the tuner's plan at the end",
        "phases_after": [p for _, p in phases_after],
        "false_alarms_stable": stable_alarms,
    }
