"""A progress bar for long work, on stderr (tqdm), silent when stderr is not a terminal."""

from __future__ import annotations

import sys


class Progress:
    """Context manager; update(done, total, **postfix) moves the bar.

    Args:
        desc: the bar's label.
        unit: the name of what is counted (tqdm's unit).
    """

    def __init__(self, desc: str, unit: str = "it") -> None:
        self._desc, self._unit, self._bar = desc, unit, None

    def __enter__(self) -> Progress:
        return self

    def update(self, done: int, total: int, **postfix: object) -> None:
        if not sys.stderr.isatty():
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=self._desc, unit=self._unit, leave=False, file=sys.stderr)
        self._bar.total = total
        self._bar.n = done
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.refresh()

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
