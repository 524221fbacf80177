"""Public names loaded on first use (PEP 562), so that importing a layer stays light.

A package lists its public names and the modules they live in, then takes its module-level
`__getattr__` and `__dir__` from `lazy_names`:

    __all__ = list(_PUBLIC)
    __getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of a package whose public names load on first use.

    Args:
        package: the package's `__name__`.
        names: public name -> the module it lives in, absolute (`kdvfs.tuner.plan`) or relative
            to the package (`plan`).
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        full = module if module.startswith("kdvfs.") else f"{package}.{module}"
        value = getattr(importlib.import_module(full), name)
        setattr(sys.modules[package], name, value)  # later look-ups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
