"""Optional parts of kdvfs and the extras that install them (pyproject's optional-dependencies).

The core install tunes clocks (`kdvfs.tune`, `kdvfs tune`, sweep, compare, the simulator). The
extras add what only some uses need:

- `service`: the tuning service and its job client (FastAPI, uvicorn, SQLAlchemy, httpx);
- `agent`: the learning-agent strategy `ppo` (stable-baselines3, sb3-contrib);
- `peers`: Zeus's power-limit optimizer as a peer (`kdvfs peers`);
- `postgres`: the service on PostgreSQL (psycopg).

`require_extra` is the one check: a part whose extra is missing is refused in one line that
names the extra, before any work.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable


def require_extra(extra: str, modules: Iterable[str], what: str) -> None:
    """Import `modules`; if one is missing, KdvfsError naming the extra that installs it.

    Args:
        extra: the extra's name in pyproject ("service", "agent", "peers", "postgres").
        modules: the top-level modules the part imports.
        what: the part, as the error names it ("the tuning service").
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            from kdvfs.runtime.types import KdvfsError

            raise KdvfsError(f"{what} needs the {extra!r} extra: pip install 'kdvfs[{extra}]'") from None
