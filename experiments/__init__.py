"""kdvfs.experiments, runnable studies: each module runs with `python -m kdvfs.experiments.NAME`
and prints JSON (every figure labelled simulated, replayed or measured on a real GPU).

- `compare_strategies`: search strategies against the full sweep;
- `online_tuning`: the online tuner against the full sweep and the pass-level plan;
- `drift_scenarios`: the tuner through drift scenarios, and plan reuse on restart;
- `cusum_delay`: detection delay of the drift watch (synthetic, no device);
- `h200_inputs`: the drift watch's inputs on a real GPU (read-only);
- `h200_validation`: the PyTorch integration on a real GPU (dry-run: no clock change);
- `record_step_trace`: a small GPT's whole training step under torch.profiler, as a trace;
- `agent_bench`: the clock agent's round trip and resets (fake NVML, or a real card in dry-run);
- `fit_kinds`: the simulator's per-kind constants fitted to a size ladder (prints JSON);
- `peers_figure`: rows of `kdvfs compare --peers` in one figure (docs/peers.png, MLflow).

The modules are public by name (`kdvfs.experiments.online_tuning`, loaded on first use), each
with its `main()`. Their findings: docs/benchmarks.md and docs/gpu-validation.md.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = [
    "agent_bench",
    "compare_strategies",
    "cusum_delay",
    "drift_scenarios",
    "fit_kinds",
    "h200_inputs",
    "h200_validation",
    "online_tuning",
    "peers_figure",
    "record_step_trace",
]


def __getattr__(name: str) -> ModuleType:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.{name}")


def __dir__() -> list[str]:
    return sorted(__all__)
