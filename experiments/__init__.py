"""kdvfs.experiments, runnable studies: each module runs with `python -m kdvfs.experiments.NAME`
and prints JSON (every figure labelled simulated, replayed or measured on a real GPU).

- `compare_strategies`: search strategies against the full sweep;
- `step_tuning`: the step-driven tuner's cold starts against the realisable oracle, and the
  dry-run null test;
- `step_drift`: the step-driven tuner through drift scenarios, timed in seconds of training;
- `cusum_delay`: detection delay of the drift watch (synthetic, no device);
- `h200_inputs`: the drift watch's inputs on a real GPU (read-only);
- `h200_validation`: the PyTorch integration on a real GPU (dry-run: no clock change);
- `record_step_trace`: a small GPT's whole training step under torch.profiler, as a trace;
- `daemon_bench`: the clock daemon's round trip and resets (fake NVML, or a real card in dry-run);
- `fit_kinds`: the simulator's per-kind constants fitted to a size ladder (prints JSON);
- `peers_figure`: rows of `kdvfs peers` in one figure (docs/peers.png, MLflow).

The modules are public by name (`kdvfs.experiments.step_tuning`, loaded on first use), each
with its `main()`. Their findings: docs/benchmarks.md and docs/gpu-validation.md.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = [
    "compare_strategies",
    "cusum_delay",
    "daemon_bench",
    "fit_kinds",
    "h200_inputs",
    "h200_validation",
    "op_replay_check",
    "peers_figure",
    "record_step_trace",
    "step_drift",
    "step_tuning",
]


def __getattr__(name: str) -> ModuleType:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.{name}")


def __dir__() -> list[str]:
    return sorted(__all__)
