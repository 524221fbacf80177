"""Strategies by name: make_policy("botorch", space, seed=0, max_per_task=20)."""

from __future__ import annotations

from typing import Any

from kdvfs.policies._common import BasePolicy
from kdvfs.policies.bandits import ThompsonPolicy, UcbPolicy
from kdvfs.policies.base import SearchSpace
from kdvfs.policies.botorch_bo import BotorchPolicy
from kdvfs.policies.crosskernel import CrossKernelPolicy
from kdvfs.policies.egreedy import EpsilonGreedyPolicy
from kdvfs.policies.random_search import RandomPolicy
from kdvfs.policies.sweep import SweepPolicy

POLICIES: dict[str, type[BasePolicy]] = {
    cls.name: cls
    for cls in (
        SweepPolicy,
        RandomPolicy,
        EpsilonGreedyPolicy,
        UcbPolicy,
        ThompsonPolicy,
        BotorchPolicy,
        CrossKernelPolicy,
    )
}
"""Every strategy, the full sweep (the baseline) first."""


def make_policy(name: str, space: SearchSpace, *, seed: int, **opts: Any) -> BasePolicy:
    """A new strategy instance; opts go to its constructor (e.g. max_per_task, tol, margin)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    return cls(space, seed, **opts)
