"""Progress of long work, on stderr: a tqdm bar on a terminal, else one plain line every
LOG_EVERY_S (logs, CI, nohup), so that a long phase is never silent and output stays small."""

from __future__ import annotations

import sys
import time

#: Seconds between progress lines when stderr is not a terminal.
LOG_EVERY_S = 10.0
#: Least seconds between redraws of the terminal bar.
BAR_EVERY_S = 0.5


class Progress:
    """Context manager; update(done, total, **details) moves the bar.

    Args:
        desc: the phase, in plain words (the bar's label, the lines' prefix).
        unit: what is counted, plural (e.g. "steps").
    """

    def __init__(self, desc: str, unit: str = "steps") -> None:
        self._desc, self._unit, self._bar = desc, unit, None
        self._tty = sys.stderr.isatty()
        self._start_s = self._next_line_s = time.monotonic()
        self._next_line_s += LOG_EVERY_S

    def __enter__(self) -> Progress:
        return self

    def update(self, done: int, total: int, **details: object) -> None:
        if self._tty:
            self._draw(done, total, details)
            return
        now = time.monotonic()
        if now >= self._next_line_s:
            self._next_line_s = now + LOG_EVERY_S
            share = f"{100.0 * done / total:.0f}%, " if total else ""
            extra = "".join(f", {k.replace('_', ' ')} {v}" for k, v in details.items())
            print(
                f"{self._desc}: {share}{done}/{total} {self._unit}{extra} ({now - self._start_s:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    def _draw(self, done: int, total: int, details: dict[str, object]) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=self._desc,
                unit=f" {self._unit}",
                unit_scale=True,
                smoothing=0.0,  # the average rate since the start, not the last jump's
                mininterval=BAR_EVERY_S,
                leave=False,
                file=sys.stderr,
            )
        self._bar.total = total
        if details:
            self._bar.set_postfix({k.replace("_", " "): v for k, v in details.items()}, refresh=False)
        self._bar.update(done - self._bar.n)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
