"""Gymnasium environments over a runtime device, registered on import:

- `kdvfs/KernelDVFS-v0` (kernel_env.KernelDVFSEnv): one step = one isolated measurement of
  the current kernel at the clock pair the action picks;
- `kdvfs/IterationDVFS-v0` (iteration_env.IterationDVFSEnv): one step = training iterations
  run with a clock pair per kernel.

Both pay the compute-waste reward of reward.py. Importing this package imports only
Gymnasium: the environments load when made.
"""

import gymnasium

gymnasium.register(
    id="kdvfs/KernelDVFS-v0",
    entry_point="kdvfs.envs.kernel_env:KernelDVFSEnv",
    max_episode_steps=1000,
)
gymnasium.register(
    id="kdvfs/IterationDVFS-v0",
    entry_point="kdvfs.envs.iteration_env:IterationDVFSEnv",
    max_episode_steps=200,
)
