"""Strategies by name: make_strategy("botorch", space, seed=0, max_per_task=20)."""

from __future__ import annotations

import inspect
from typing import Any

from kdvfs.policies._common import BaseStrategy
from kdvfs.policies.bandits import ThompsonStrategy, UcbStrategy
from kdvfs.policies.base import SearchSpace
from kdvfs.policies.botorch_bo import BotorchStrategy
from kdvfs.policies.crosskernel import CrossKernelStrategy
from kdvfs.policies.egreedy import EpsilonGreedyStrategy
from kdvfs.policies.random_search import RandomStrategy
from kdvfs.policies.sweep import SweepStrategy

STRATEGIES: dict[str, type[BaseStrategy]] = {
    cls.name: cls
    for cls in (
        SweepStrategy,
        RandomStrategy,
        EpsilonGreedyStrategy,
        UcbStrategy,
        ThompsonStrategy,
        BotorchStrategy,
        CrossKernelStrategy,
    )
}
"""Every strategy, the full sweep (the baseline) first."""


def make_strategy(name: str, space: SearchSpace, *, seed: int, **opts: Any) -> BaseStrategy:
    """A new strategy instance; opts go to its constructor (e.g. max_per_task, tol, margin)."""
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}") from None
    return cls(space, seed, **opts)


def takes_option(name: str, option: str) -> bool:
    """Whether the strategy `name`'s constructor takes `option` (e.g. tol: the random search
    and the sweep have no stopping tolerance). False for an unknown name."""
    cls = STRATEGIES.get(name)
    return cls is not None and option in inspect.signature(cls.__init__).parameters
