"""kdvfs.envs, the Gymnasium environments over a runtime device; importing it registers them.

- `kdvfs/KernelDVFS-v0` (`KernelDVFSEnv`, kernel_env.py): one env step = one isolated measurement
  of the current kernel at the clock pair the action picks;
- `kdvfs/StepDVFS-v0` (`StepDVFSEnv`, step_env.py): one env step = training
  steps run with a clock pair per kernel (`measure_steps`, `StepMeasurement`);
- `kdvfs/TrialDVFS-v0` (`TrialDVFSEnv`, trial_env.py): the step-driven tuner's loop, one
  env step = one trial in training of a pair for one group, judged by the tuner's own judgement
  (runtime/trials.py); the view a learning agent strategy is trained through.

All pay `compute_waste_reward` (reward.py; TrialDVFS-v0 through `trial_reward`). Importing this package imports only Gymnasium:
the environments and the names above load when first made or used. Why they are built so:
docs/design-envs.md.
"""

from __future__ import annotations

import gymnasium

from kdvfs._lazy import lazy_names

gymnasium.register(
    id="kdvfs/KernelDVFS-v0",
    entry_point="kdvfs.envs.kernel_env:KernelDVFSEnv",
    max_episode_steps=1000,
)
gymnasium.register(
    id="kdvfs/StepDVFS-v0",
    entry_point="kdvfs.envs.step_env:StepDVFSEnv",
    max_episode_steps=200,
)
gymnasium.register(
    id="kdvfs/TrialDVFS-v0",
    entry_point="kdvfs.envs.trial_env:TrialDVFSEnv",
    max_episode_steps=200,
)

_PUBLIC: dict[str, str] = {
    "KernelDVFSEnv": "kernel_env",
    "StepDVFSEnv": "step_env",
    "StepMeasurement": "step_env",
    "measure_steps": "step_env",
    "TrialDVFSEnv": "trial_env",
    "compute_waste_reward": "reward",
    "trial_reward": "reward",
}

__all__ = list(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
