"""kdvfs: online per-kernel GPU clock tuning for training jobs, within a slowdown budget.

The public names a user needs, importable from `kdvfs` itself (loaded on first use, so that
`import kdvfs` and `kdvfs --help` stay quick):

- training integration: `tune` (a job that tunes its own clocks, `JobTuning`), `KdvfsTrainer`,
  `lightning_callback`, `hf_callback`;
- the tuner: `TuningRun` (the one tuning run every caller feeds: it builds the `StepTuner`,
  which answers each training step with the clocks), `TuneSession` (a simulated or replayed
  job fed to one), and `Tracker` for MLflow;
- devices: `SimulatedDevice`, `ReplayDevice`, `NvmlDevice`, `open_device`, `open_workload`;
- strategies: `make_strategy`, `STRATEGIES`;
- plans: `Plan`, `load_plan`, `save_plan`, `PlanStore`;
- values: `ClockPair`, `ClockGrid`, `Kernel`, `Workload`, `KdvfsError`.

The layers themselves are `kdvfs.runtime` (the machine), `kdvfs.envs` (Gymnasium),
`kdvfs.policies` (search strategies), `kdvfs.tuner` (orchestration, plans), `kdvfs.service`
(the tuning service; the `service` extra), `kdvfs.cli` (the `kdvfs` command line) and
`kdvfs.experiments` (runnable studies); see docs/design.md. Optional parts and their extras:
`kdvfs.extras`.
"""

from __future__ import annotations

from kdvfs._lazy import lazy_names

__version__ = "0.1.0"

_PUBLIC: dict[str, str] = {
    "tune": "kdvfs.tuner.job_tuning",
    "JobTuning": "kdvfs.tuner.job_tuning",
    "KdvfsTrainer": "kdvfs.runtime.torch_integration",
    "lightning_callback": "kdvfs.runtime.torch_integration",
    "hf_callback": "kdvfs.runtime.torch_integration",
    "TuningRun": "kdvfs.tuner.run",
    "StepTuner": "kdvfs.tuner.step_tuner",
    "TuneSession": "kdvfs.tuner.session",
    "Tracker": "kdvfs.tuner.tracking",
    "SimulatedDevice": "kdvfs.runtime.simulator",
    "ReplayDevice": "kdvfs.runtime.replay",
    "NvmlDevice": "kdvfs.runtime.nvml_device",
    "open_device": "kdvfs.runtime.registry",
    "open_workload": "kdvfs.runtime.registry",
    "make_strategy": "kdvfs.policies.registry",
    "STRATEGIES": "kdvfs.policies.registry",
    "Plan": "kdvfs.tuner.plan",
    "load_plan": "kdvfs.tuner.plan",
    "save_plan": "kdvfs.tuner.plan",
    "PlanStore": "kdvfs.tuner.plan_store",
    "ClockPair": "kdvfs.runtime.types",
    "ClockGrid": "kdvfs.runtime.types",
    "Kernel": "kdvfs.runtime.types",
    "Workload": "kdvfs.runtime.types",
    "KdvfsError": "kdvfs.runtime.types",
}

__all__ = ["__version__", *_PUBLIC]


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
