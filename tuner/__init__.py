"""kdvfs.tuner: the orchestration layer: the tuning run, plans, drift watch and MLflow.

The public names below load on first use (a lazy module __getattr__, as kdvfs/__init__ does),
so that `kdvfs --help` does not import numpy, scipy, torch or MLflow. The command line that
drives it is kdvfs.cli (cli/); the design is docs/design-tuner.md.
"""

from __future__ import annotations

from kdvfs._lazy import lazy_names

_PUBLIC: dict[str, str] = {
    # a real training job tunes itself
    "tune": "kdvfs.tuner.job_tuning",
    "JobTuning": "kdvfs.tuner.job_tuning",
    # one tuning run (every caller feeds one), its tuner and its events
    "TuningRun": "kdvfs.tuner.run",
    "Card": "kdvfs.tuner.run",
    "Point": "kdvfs.tuner.run",
    "METRICS": "kdvfs.tuner.run",
    "Prior": "kdvfs.tuner.run",
    "choose_prior": "kdvfs.tuner.run",
    "Oracle": "kdvfs.tuner.run",
    "oracle": "kdvfs.tuner.run",
    "reached_after": "kdvfs.tuner.run",
    "StepTuner": "kdvfs.tuner.step_tuner",
    "StepTiming": "kdvfs.tuner.step_tuner",
    "PhaseEntered": "kdvfs.tuner.step_tuner",
    "TrialFinished": "kdvfs.tuner.step_tuner",
    "Adoption": "kdvfs.tuner.step_tuner",
    "Alarm": "kdvfs.tuner.step_tuner",
    # a simulated or replayed training job fed to a tuning run
    "TuneSession": "kdvfs.tuner.session",
    "schedule_figures": "kdvfs.runtime.schedule",
    # search strategies against the sweep
    "run_search": "kdvfs.tuner.search",
    "SearchResult": "kdvfs.tuner.search",
    "run_sweep": "kdvfs.tuner.sweep",
    "compare_strategies": "kdvfs.tuner.compare",
    # plans
    "Plan": "kdvfs.tuner.plan",
    "PlanGroup": "kdvfs.tuner.plan",
    "load_plan": "kdvfs.tuner.plan",
    "save_plan": "kdvfs.tuner.plan",
    "PlanStore": "kdvfs.tuner.plan_store",
    "carry_schedule": "kdvfs.tuner.transfer",
    "solve_budget": "kdvfs.tuner.solver",
    "group_kernels": "kdvfs.tuner.grouping",
    "Grouping": "kdvfs.tuner.grouping",
    # drift
    "DriftMonitor": "kdvfs.tuner.drift",
    "ConditionWatch": "kdvfs.tuner.drift",
    "CusumDetector": "kdvfs.tuner.drift",
    "run_scenario": "kdvfs.tuner.scenarios",
    # MLflow
    "Tracker": "kdvfs.tuner.tracking",
    "RunHandle": "kdvfs.tuner.tracking",
}

__all__ = list(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
