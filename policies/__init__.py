"""kdvfs.policies, the search strategies: ask / tell / best over a finite clock grid, numbers only.

Public names (loaded on first use: the BoTorch strategies pull in torch; this package never
imports kdvfs.runtime):
- the interface: `Strategy`, `SearchSpace`, `Task`;
- the strategies: `SweepStrategy`, `RandomStrategy`, `EpsilonGreedyStrategy`, `UcbStrategy`,
  `ThompsonStrategy`, `BotorchStrategy`, `CrossKernelStrategy`, `AgentStrategy` (a trained PPO agent:
  `train_agent`, `load_agent`), and by name `make_strategy`, `STRATEGIES`;
- for writing a strategy: `BaseStrategy`, `SafeExplorer`, `TaskLog`, `GridFacts`, `BeliefModel`,
  `steps_since_improvement` (the convergence count the strategies share).

How each strategy searches and why: docs/design-policies.md.
"""

from __future__ import annotations

from kdvfs._lazy import lazy_names

_PUBLIC: dict[str, str] = {
    "Strategy": "base",
    "SearchSpace": "base",
    "Task": "base",
    "SweepStrategy": "sweep",
    "RandomStrategy": "random_search",
    "EpsilonGreedyStrategy": "egreedy",
    "UcbStrategy": "bandits",
    "ThompsonStrategy": "bandits",
    "BotorchStrategy": "botorch_bo",
    "CrossKernelStrategy": "crosskernel",
    "AgentStrategy": "agent",
    "train_agent": "agent",
    "load_agent": "agent",
    "make_strategy": "registry",
    "STRATEGIES": "registry",
    "BaseStrategy": "_common",
    "SafeExplorer": "_common",
    "TaskLog": "_common",
    "GridFacts": "_common",
    "steps_since_improvement": "_common",
    "BeliefModel": "beliefs",
}

__all__ = list(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
