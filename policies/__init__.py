"""kdvfs.policies, the search strategies: ask / tell / best over a finite clock grid, numbers only.

Public names (loaded on first use: the BoTorch strategies pull in torch; this package never
imports kdvfs.runtime):
- the interface: `Policy`, `SearchSpace`, `Task`;
- the strategies: `SweepPolicy`, `RandomPolicy`, `EpsilonGreedyPolicy`, `UcbPolicy`,
  `ThompsonPolicy`, `BotorchPolicy`, `CrossKernelPolicy`, `AgentPolicy` (a trained PPO agent:
  `train_agent`, `load_agent`), and by name `make_policy`, `POLICIES`;
- for writing a strategy: `BasePolicy`, `SafeExplorer`, `TaskLog`, `GridFacts`, `BeliefModel`.

How each strategy searches and why: docs/design-policies.md.
"""

from __future__ import annotations

from kdvfs._lazy import lazy_names

_PUBLIC: dict[str, str] = {
    "Policy": "base",
    "SearchSpace": "base",
    "Task": "base",
    "SweepPolicy": "sweep",
    "RandomPolicy": "random_search",
    "EpsilonGreedyPolicy": "egreedy",
    "UcbPolicy": "bandits",
    "ThompsonPolicy": "bandits",
    "BotorchPolicy": "botorch_bo",
    "CrossKernelPolicy": "crosskernel",
    "AgentPolicy": "agent",
    "train_agent": "agent",
    "load_agent": "agent",
    "make_policy": "registry",
    "POLICIES": "registry",
    "BasePolicy": "_common",
    "SafeExplorer": "_common",
    "TaskLog": "_common",
    "GridFacts": "_common",
    "BeliefModel": "beliefs",
}

__all__ = list(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
