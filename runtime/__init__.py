"""kdvfs.runtime, the machine: devices, workloads, measurement and the PyTorch integration.

Public names (loaded on first use, so that importing this package stays quick):
- values: `ClockPair`, `ClockGrid`, `Kernel`, `Workload`, `Measurement`, `KdvfsError`;
- devices: `Device`, `RunnableDevice` (the interfaces), `SimulatedDevice`, `ReplayDevice`,
  `NvmlDevice`, and by name `open_device`, `open_workload`;
- workloads: `gpt3_xl_layer`, `load_trace`, `discover_workload`, `load_table`;
- measurement: `measure_isolated`, `measure_reference_steps`, `Schedule`, `StepRunner`;
- drift on the simulated card: `Scenario`, `get_scenario`;
- training integration: `KdvfsTrainer`, `lightning_callback`, `hf_callback`, `shared_decision`;
- the clock daemon (locks clocks for jobs that are not root): `ClockDaemon`, `DaemonClient`.

Where each part lives and why it is built so: docs/design-runtime.md.
"""

from __future__ import annotations

from kdvfs._lazy import lazy_names

_PUBLIC: dict[str, str] = {
    "ClockPair": "types",
    "ClockGrid": "types",
    "Kernel": "types",
    "Workload": "types",
    "Measurement": "types",
    "KdvfsError": "types",
    "Device": "device",
    "RunnableDevice": "device",
    "SimulatedDevice": "simulator",
    "ReplayDevice": "replay",
    "NvmlDevice": "nvml_device",
    "open_device": "registry",
    "open_workload": "registry",
    "gpt3_xl_layer": "workloads",
    "load_trace": "trace",
    "discover_workload": "torch_discovery",
    "load_table": "tables",
    "measure_isolated": "measure",
    "measure_reference_steps": "measure",
    "Schedule": "schedule",
    "StepRunner": "schedule",
    "Scenario": "scenarios",
    "get_scenario": "scenarios",
    "KdvfsTrainer": "torch_integration",
    "lightning_callback": "torch_integration",
    "hf_callback": "torch_integration",
    "shared_decision": "distributed",
    "ClockDaemon": "clock_daemon",
    "DaemonClient": "daemon_client",
}

__all__ = list(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
