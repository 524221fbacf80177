"""Values that cross layers: clock pairs and grids, a job's wait for its host, kernels, workloads,
measurements.

Frozen dataclasses with units in every name, so that a plan, a measurement or a kernel
means the same thing in runtime/, envs/, policies/ and tuner/.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Source = Literal["simulated", "replayed", "measured"]
"""Where a figure came from: the simulated GPU, a recorded table, or a real GPU."""

PASSES = ("forward", "backward", "communication", "optimizer")
"""The passes of a training step, in order, as kernels are tagged with them (communication:
a data-parallel all-reduce the GPU waits on)."""


class KdvfsError(ValueError):
    """Bad input a user can fix: the message is one line naming the problem."""


def check_file_size(path: str | Path, limit_bytes: int, what: str) -> None:
    """Refuse a file larger than `limit_bytes` before reading it (a file read whole costs about
    twice its size in memory once parsed), in one line naming the file, its size and the limit.

    Args:
        path: the file about to be read.
        limit_bytes: the largest size accepted; bytes.
        what: what the file should be, as the message names it (e.g. "plan").

    Raises:
        KdvfsError: the file is larger than the limit. A file that cannot be examined passes
            (its reader reports why it cannot read it).
    """
    try:
        size_bytes = os.stat(path).st_size
    except (OSError, ValueError):
        return
    if size_bytes > limit_bytes:
        raise KdvfsError(
            f"{path}: {_size_text(size_bytes)} is too large for a {what} (the limit is {_size_text(limit_bytes)})"
        )


def _shown(value: object) -> str:
    """A value as a one-line error message shows it: its repr, cut at 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _size_text(size_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.1f} {unit}"
    return f"{size_bytes} bytes"


def finite_number(
    name: str,
    value: object,
    low: float,
    high: float = math.inf,
    *,
    open_low: bool = False,
    open_high: bool = False,
) -> float:
    """`value` as a float, or a one-line KdvfsError naming `name`, the value and the range.

    Args:
        name: the parameter, as the message names it (e.g. "switch_latency_s").
        value: what was given: a real number (not a bool) within the range.
        low: the smallest value allowed (excluded where open_low).
        high: the largest value allowed (included unless open_high); inf: none.
        open_low: whether `low` itself is refused (a value must be > low).
        open_high: whether `high` itself is refused (a value must be < high).

    Raises:
        KdvfsError: not a real number, not finite, or outside the range.
    """
    bound = (f"> {low:g}" if open_low else f">= {low:g}") + (
        f" and {'<' if open_high else '<='} {high:g}" if high < math.inf else ""
    )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise KdvfsError(f"{name} must be a finite number {bound}, got {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        number = math.inf
    outside = number < low or number > high or (open_low and number == low) or (open_high and number == high)
    if not math.isfinite(number) or outside:
        raise KdvfsError(f"{name} must be a finite number {bound}, got {number:g}")
    return number


@dataclass(frozen=True, order=True)
class ClockPair:
    """A locked (core, memory) clock pair in MHz.

    Args:
        core_mhz: the core (graphics) clock, a whole number of MHz > 0 (numpy integers are
            taken as ints).
        mem_mhz: the memory clock, a whole number of MHz > 0.

    Raises:
        KdvfsError: a clock that is not a positive whole number (a bool, a float, a string).
    """

    core_mhz: int
    mem_mhz: int

    def __post_init__(self) -> None:
        for name in ("core_mhz", "mem_mhz"):
            value = getattr(self, name)
            if type(value) is not int:  # the common case costs one comparison
                if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                    raise KdvfsError(
                        f"clock pair: {name} must be a whole number of MHz > 0, got {_shown(value)}"
                    )
                value = int(value)
                object.__setattr__(self, name, value)
            if value <= 0:
                raise KdvfsError(f"clock pair: {name} must be a whole number of MHz > 0, got {value}")

    def as_list(self) -> list[int]:
        return [self.core_mhz, self.mem_mhz]

    def __str__(self) -> str:
        return f"{self.core_mhz}/{self.mem_mhz} MHz"


@dataclass(frozen=True)
class HostWait:
    """A job's wait for its host after a step's kernels as a simulated job (runtime/steps.py's
    SimulatedJob) waits it: a share of the kernels' own time as they run with the wait after
    them, the card idle at the clocks it ended the kernels at until a switch still in flight
    lands, at the landed clocks after.

    Args:
        rel: the wait over the kernels' time, a fraction (>= 0).
        pair: the clocks the card idles at from the kernels' end (None: stock).
        landing: a switch in flight at the kernels' end, as (s after their end, the pair it
            lands), or None.
    """

    rel: float
    pair: ClockPair | None = None
    landing: tuple[float, ClockPair | None] | None = None

    def parts(self, kernels_s: float) -> list[tuple[float, ClockPair | None]]:
        """(s, clocks held) of the wait after kernels that took kernels_s s, in order."""
        wait_s = self.rel * kernels_s
        if self.landing is None:
            return [(wait_s, self.pair)]
        first_s = min(max(self.landing[0], 0.0), wait_s)
        return [(first_s, self.pair), (wait_s - first_s, self.landing[1])]

    @property
    def pairs(self) -> set[ClockPair | None]:
        """The clocks the card may idle at in the wait."""
        return {self.pair} if self.landing is None else {self.pair, self.landing[1]}


@dataclass(frozen=True)
class ClockGrid:
    """The clock pairs a device supports (or a search is restricted to), sorted ascending.

    Not always a full Cartesian product: a recorded table may lack pairs, a card may tie
    graphics clocks to a memory clock.
    """

    pairs: tuple[ClockPair, ...]

    def __post_init__(self) -> None:
        if not self.pairs:
            raise KdvfsError("clock grid is empty")
        object.__setattr__(self, "pairs", tuple(sorted(set(self.pairs))))

    @classmethod
    def product(
        cls, core_mhz: list[int] | tuple[int, ...], mem_mhz: list[int] | tuple[int, ...]
    ) -> ClockGrid:
        return cls(tuple(ClockPair(int(c), int(m)) for c in core_mhz for m in mem_mhz))

    def __len__(self) -> int:
        return len(self.pairs)

    def __contains__(self, pair: object) -> bool:
        return pair in self._index

    @property
    def _index(self) -> dict[ClockPair, int]:
        cached = self.__dict__.get("_index_cache")
        if cached is None:
            cached = {p: i for i, p in enumerate(self.pairs)}
            object.__setattr__(self, "_index_cache", cached)
        return cached

    def index(self, pair: ClockPair) -> int:
        try:
            return self._index[pair]
        except KeyError:
            raise KdvfsError(f"clock pair {pair} is not in the grid") from None

    @property
    def core_levels_mhz(self) -> tuple[int, ...]:
        return tuple(sorted({p.core_mhz for p in self.pairs}))

    @property
    def mem_levels_mhz(self) -> tuple[int, ...]:
        return tuple(sorted({p.mem_mhz for p in self.pairs}))

    def highest(self) -> ClockPair:
        """The highest pair: highest memory clock, then highest core clock at it."""
        return max(self.pairs, key=lambda p: (p.mem_mhz, p.core_mhz))

    def as_lists(self) -> list[list[int]]:
        return [p.as_list() for p in self.pairs]


KERNEL_KINDS = (
    "gemm", "attention", "norm", "elementwise", "reduce", "memory_op", "optimizer", "communication", "other",
)  # fmt: skip
"""Kinds of kernel, as trace.py classifies CUDA kernel names and the simulator costs them."""


@dataclass(frozen=True)
class Kernel:
    """One kernel of a training step.

    flops / bytes_moved drive the simulator; features are what a search strategy may use as
    context (recorded counters, pass, size). ref_time_s is a recorded duration, if any.
    """

    name: str
    pass_name: str = "forward"
    flops: float = 0.0
    bytes_moved: float = 0.0
    tensor_core: bool = False
    launches: int = 1
    ref_time_s: float | None = None
    features: tuple[tuple[str, float], ...] = ()
    kind: str = ""  # one of KERNEL_KINDS, or "" (unknown): how the simulator costs small sizes
    wait_s: float = 0.0  # s a launch waits on something outside the GPU (a link), at any clock
    busy_share: float = 1.0  # share of the chip its work keeps busy: 1, or a recorded kernel's in-step share
    idle_before_s: float = 0.0  # s the GPU idled before this launch beyond the launch gap back to back

    def feature_dict(self) -> dict[str, float]:
        return dict(self.features)


@dataclass(frozen=True)
class Workload:
    """The ordered kernels of one training step."""

    name: str
    kernels: tuple[Kernel, ...]
    meta: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.kernels:
            raise KdvfsError(f"workload {self.name!r} has no kernels")
        names = [k.name for k in self.kernels]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise KdvfsError(f"workload {self.name!r}: kernel name {dup!r} appears twice")

    @property
    def signature(self) -> str:
        """Stable hash of the kernel sequence (names, passes, launches, sizes to 4 significant
        digits), 16 hex digits: a plan made for one batch size does not pass for another."""
        h = hashlib.sha256()
        for k in self.kernels:
            wait = f"\x1f{k.wait_s:.4g}" if k.wait_s else ""  # absent where zero: older signatures stand
            busy = f"\x1fb{k.busy_share:.4g}" if k.busy_share != 1.0 else ""  # likewise where 1
            h.update(
                f"{k.name}\x1f{k.pass_name}\x1f{k.launches}\x1f{k.flops:.4g}\x1f{k.bytes_moved:.4g}{wait}{busy}\x1e".encode()
            )
        return h.hexdigest()[:16]

    def kernel(self, name: str) -> Kernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KdvfsError(f"workload {self.name!r} has no kernel {name!r}")

    def __len__(self) -> int:
        return len(self.kernels)


@dataclass(frozen=True)
class Measurement:
    """Time and energy of one launch of a kernel (or one pass of a group) at a clock setting.

    throttled: the card reported a power-cap or thermal throttle during the measurement, so
    it did not hold the asked clocks and its speed depends on temperature.
    """

    time_s: float
    energy_j: float
    source: Source
    throttled: bool = False

    @property
    def power_w(self) -> float:
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0
