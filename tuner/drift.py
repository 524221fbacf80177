"""Drift detection under a settled plan: has a group's time or the step's energy moved?

- CusumDetector: a self-starting two-sided CUSUM on one stream of relative residuals
  (cusum_arl0 and cusum_threshold design its threshold h for an in-control run length).
- DriftMonitor: one detector per named stream (the step's time, its energy, each
  group's time: group_stream / stream_group name them), with confirmation of alarms.
- ConditionWatch: the inputs a plan was made under, read not inferred: the enforced power
  limit (limit_moved) and the settled temperature; Condition names what moved.

Design and findings (choice of k and h, glitches, window length, the temperature margin
measured on a real H200): docs/design-tuner.md#drift-is-the-settled-plan-still-right
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import numpy as np
from scipy.special import ndtri, stdtr

from kdvfs.runtime.types import KdvfsError

#: Change of the enforced power limit that alarms; W.
POWER_LIMIT_TOLERANCE_W = 0.5
#: Span of temperature readings that must be flat before their mean is the centre; s.
TEMP_SETTLE_S = 20.0
#: Largest difference between the means of the two halves of that span for it to be flat; C.
TEMP_SETTLED_DRIFT_C = 0.1
#: Distance beyond half the settled readings' range from the centre that alarms; C.
TEMP_MARGIN_C = 1.5
#: Time constant with which the centre follows a settled card's readings; s.
TEMP_TRACK_S = 120.0
#: Span of the latest readings whose median must leave the band to alarm (a checkpoint's or an
#: evaluation's idle dip of a few seconds does not); s.
TEMP_CONFIRM_S = 10.0

#: CUSUM allowance k per window; standard deviations of the stream.
DEFAULT_K = 0.5
#: In-control average run length the threshold h is set for (both sides); windows.
DEFAULT_ARL0 = 1e7
#: Windows learned before a detector may alarm; windows.
DEFAULT_WARMUP = 20
#: Clip on a standardised residual in the sums (and beyond which it is not learned); s.d.
DEFAULT_CLIP = 8.0
#: Floor on a stream's sd, so that rounding on a noiseless stream does not alarm; relative residual.
DEFAULT_MIN_SCALE = 1e-3
#: Ratio of a Gaussian's sd to its median absolute deviation; no unit.
MAD_TO_SD = 1.4826
#: Siegmund's correction of the threshold for a Gaussian sum's overshoot (b = h + 1.166); s.d.
SIEGMUND_OFFSET = 1.166


def cusum_arl0(h: float, k: float = DEFAULT_K) -> float:
    """In-control ARL of a two-sided CUSUM on N(0, 1) values, Siegmund's approximation: each
    side (exp(2kb) - 2kb - 1) / (2k^2) with b = h + 1.166; two equal sides halve it."""
    b = h + SIEGMUND_OFFSET
    return (math.exp(2.0 * k * b) - 2.0 * k * b - 1.0) / (2.0 * k * k) / 2.0


def cusum_threshold(arl0: float, k: float = DEFAULT_K) -> float:
    """The threshold h whose two-sided in-control ARL is arl0 windows (bisection on cusum_arl0)."""
    if not (arl0 > 1.0 and k > 0.0):
        raise KdvfsError(f"CUSUM design needs arl0 > 1 and k > 0, got arl0={arl0}, k={k}")
    lo, hi = 0.0, 1.0
    while cusum_arl0(hi, k) < arl0:
        hi *= 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if cusum_arl0(mid, k) < arl0 else (lo, mid)
    return hi


#: CUSUM threshold h for DEFAULT_ARL0 (about 15); standard deviations.
DEFAULT_H = cusum_threshold(DEFAULT_ARL0)


class CusumDetector:
    """Self-starting two-sided CUSUM on one stream of residuals.

    update(x) feeds one window's residual and returns True on an alarm; the sums then restart
    from zero and the baseline keeps learning (a stream that stays shifted alarms again some
    windows later). reset() forgets the baseline too: call it once the stream's plan changed.

    Args:
        k: allowance per window, in standard deviations of the stream.
        h: alarm threshold of either sum, in standard deviations.
        warmup: windows learned before an alarm is possible (at least 3).
        clip: bound on a standardised residual in the sums, s.d.; a window beyond it is not
            learned.
        min_scale: floor on the stream's sd, in relative residual.
    """

    def __init__(
        self,
        k: float = DEFAULT_K,
        h: float = DEFAULT_H,
        warmup: int = DEFAULT_WARMUP,
        clip: float = DEFAULT_CLIP,
        min_scale: float = DEFAULT_MIN_SCALE,
    ) -> None:
        if not (k >= 0.0 and h > 0.0 and warmup >= 3 and clip > k and min_scale > 0.0):
            raise KdvfsError(
                f"bad CUSUM settings: k={k}, h={h}, warmup={warmup}, clip={clip}, min_scale={min_scale} "
                "(need k >= 0, h > 0, warmup >= 3, clip > k, min_scale > 0)"
            )
        self.k, self.h, self.warmup, self.clip, self.min_scale = k, h, warmup, clip, min_scale
        self.reset()

    def reset(self) -> None:
        """Forget the baseline and the sums."""
        self.n = 0  # windows learned
        self._warm: list[float] = []  # the warm-up's windows
        self.mean = 0.0
        self._m2 = 0.0  # Welford's sum of squared deviations
        self.upper = 0.0
        self.lower = 0.0
        self.alarms = 0

    @property
    def sd(self) -> float:
        """The baseline's sd (floored at min_scale); meaningful once two windows are learned."""
        return max(math.sqrt(self._m2 / (self.n - 1)), self.min_scale) if self.n > 1 else self.min_scale

    @property
    def ready(self) -> bool:
        """The warm-up is over: updates can alarm."""
        return self.n >= self.warmup

    def standardise(self, x: float) -> float:
        """U of x against the baseline learned so far: N(0, 1) in control (needs n >= 2)."""
        t = (x - self.mean) / self.sd * math.sqrt(self.n / (self.n + 1))
        df = self.n - 1
        # through the smaller tail, which keeps precision far out
        return -float(ndtri(stdtr(df, -t))) if t > 0 else float(ndtri(stdtr(df, t)))

    def update(self, x: float, learn: bool = True) -> bool:
        """Judge one window's residual (True: alarm); learn it into the baseline unless told
        not to or it is beyond the clip."""
        if not math.isfinite(x):
            raise KdvfsError(f"CUSUM input {x} is not a finite number")
        u = self.standardise(x) if self.n >= 2 else 0.0
        alarm = False
        if self.ready:
            z = min(max(u, -self.clip), self.clip)
            self.upper = max(0.0, self.upper + z - self.k)
            self.lower = max(0.0, self.lower - z - self.k)
            if self.upper > self.h or self.lower > self.h:
                self.upper = self.lower = 0.0
                self.alarms += 1
                alarm = True
        if learn and abs(u) <= self.clip:
            self._learn(x)
        return alarm

    def _learn(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self._m2 += delta * (x - self.mean)
        if self.n > self.warmup:
            return
        self._warm.append(x)
        if self.n == self.warmup:
            # The first windows could not be judged (no baseline yet): drop those a robust
            # screen (median +/- clip x 1.4826 MAD) calls glitches, e.g. a switch transient.
            warm = np.asarray(self._warm)
            centre = float(np.median(warm))
            scale = max(MAD_TO_SD * float(np.median(np.abs(warm - centre))), self.min_scale)
            keep = warm[np.abs(warm - centre) <= self.clip * scale]
            if len(keep) < len(warm):
                self._warm = list(keep)
                self.n, self.mean = len(keep), float(keep.mean())
                self._m2 = float(((keep - self.mean) ** 2).sum())


class DriftMonitor:
    """One CusumDetector per named stream, on relative residuals x / expected - 1.

    update(values, expected) takes one window: the measured value of each stream that has one
    this window (a stream may sit a window out) and what the plan expects of it; it returns the
    names of the streams that changed, in the order the monitor was given them. After re-tuning
    those, reset(names) re-learns their baselines (the others keep watching). With confirm > 0
    an alarm is reported only when its stream alarms again within `confirm` windows (the
    baseline learns nothing meanwhile); one that does not recur counts in `unconfirmed`. Why:
    docs/design-tuner.md (confirmation).

    Args:
        streams: the distinct stream names.
        k, h, warmup, clip, min_scale: each stream's CusumDetector settings (see there).
        confirm: windows within which an alarm must recur to be reported; 0: report at once.
    """

    def __init__(
        self,
        streams: Sequence[str],
        *,
        k: float = DEFAULT_K,
        h: float = DEFAULT_H,
        warmup: int = DEFAULT_WARMUP,
        clip: float = DEFAULT_CLIP,
        min_scale: float = DEFAULT_MIN_SCALE,
        confirm: int = 0,
    ) -> None:
        if not streams or len(set(streams)) != len(streams):
            raise KdvfsError(f"drift monitor needs distinct stream names, got {list(streams)}")
        if confirm < 0:
            raise KdvfsError(f"drift monitor: confirm={confirm} windows, must be >= 0")
        self.detectors = {name: CusumDetector(k, h, warmup, clip, min_scale) for name in streams}
        self.confirm = confirm
        self.unconfirmed = 0
        self._suspects: dict[str, int] = {}  # stream -> windows left to confirm its first alarm

    @property
    def ready(self) -> bool:
        """Every stream has its baseline."""
        return all(d.ready for d in self.detectors.values())

    def update(self, values: Mapping[str, float], expected: Mapping[str, float]) -> list[str]:
        for name in values:
            if not math.isfinite(values[name]):
                raise KdvfsError(
                    f"drift monitor: value of stream {name!r} is {values[name]}, not a finite number"
                )
            if name not in self.detectors:
                raise KdvfsError(
                    f"drift monitor: unknown stream {name!r} (known: {', '.join(self.detectors)})"
                )
            if name not in expected:
                raise KdvfsError(f"drift monitor: stream {name!r} has a value but no expected value")
            if not (math.isfinite(expected[name]) and expected[name] > 0.0):
                raise KdvfsError(
                    f"drift monitor: expected value of stream {name!r} is {expected[name]}, must be > 0"
                )
        moved = []
        for name, d in self.detectors.items():
            if name not in values:
                continue
            alarm = d.update(values[name] / expected[name] - 1.0, learn=name not in self._suspects)
            if name in self._suspects:
                self._suspects[name] -= 1
                if alarm:
                    del self._suspects[name]
                    moved.append(name)
                elif self._suspects[name] == 0:
                    del self._suspects[name]
                    self.unconfirmed += 1
            elif alarm and self.confirm:
                self._suspects[name] = self.confirm
            elif alarm:
                moved.append(name)
        return moved

    def reset(self, streams: Iterable[str] | None = None) -> None:
        """Re-learn the baselines of these streams (all when None)."""
        for name in self.detectors if streams is None else streams:
            if name not in self.detectors:
                raise KdvfsError(f"drift monitor: unknown stream {name!r}")
            self.detectors[name].reset()
            self._suspects.pop(name, None)


def group_stream(index: int) -> str:
    """The drift watch's stream name for the time of the schedule's group `index`."""
    return f"g{index}"


def stream_group(name: str) -> int | None:
    """The group index of a group's stream name (group_stream), None for any other stream."""
    return int(name[1:]) if name[:1] == "g" and name[1:].isdigit() else None


Condition = Literal["power_limit", "temperature"]
"""An input a plan was made under, as ConditionWatch reports it when it moved."""


def limit_moved(old_w: float | None, new_w: float, tolerance_w: float = POWER_LIMIT_TOLERANCE_W) -> bool:
    """The enforced power limit changed (None: not read before; math.inf on both sides, a
    card or table without one, never changes)."""
    return old_w is not None and abs(new_w - old_w) > tolerance_w


class ConditionWatch:
    """The inputs a plan was made under: the enforced power limit and the settled temperature.

    update(now_s, temp_c, power_limit_w) takes one reading and returns the inputs that moved
    ("power_limit": at once; "temperature": the median of the last confirm_s of readings left
    the settled band, so an idle dip of a few seconds does not count); after an alarm it
    learns the new conditions afresh (the limit at once, the temperature once the card has
    settled again).

    Args:
        settle_s: span of readings that must be flat before their mean is the centre, s.
        settled_drift_c: largest difference between the means of the span's halves, C.
        margin_c: distance beyond half the settled readings' range that alarms, C.
        track_s: time constant with which the centre follows the readings, s.
        limit_tolerance_w: change of the power limit that alarms, W.
        confirm_s: span of the latest readings whose median must leave the band to alarm, s.
    """

    def __init__(
        self,
        settle_s: float = TEMP_SETTLE_S,
        settled_drift_c: float = TEMP_SETTLED_DRIFT_C,
        margin_c: float = TEMP_MARGIN_C,
        track_s: float = TEMP_TRACK_S,
        limit_tolerance_w: float = POWER_LIMIT_TOLERANCE_W,
        confirm_s: float = TEMP_CONFIRM_S,
    ) -> None:
        if not (
            confirm_s > 0.0
            and settle_s > 0.0
            and settled_drift_c > 0.0
            and margin_c > 0.0
            and track_s > 0.0
            and limit_tolerance_w > 0.0
        ):
            raise KdvfsError(
                f"bad condition watch settings: settle_s={settle_s}, settled_drift_c={settled_drift_c}, "
                f"margin_c={margin_c}, track_s={track_s}, limit_tolerance_w={limit_tolerance_w}, "
                f"confirm_s={confirm_s} "
                "(all must be > 0)"
            )
        self.settle_s, self.settled_drift_c, self.margin_c, self.track_s = (
            settle_s,
            settled_drift_c,
            margin_c,
            track_s,
        )
        self.limit_tolerance_w = limit_tolerance_w
        self.confirm_s = confirm_s
        self.limit_w: float | None = None
        self.centre_c: float | None = None
        self.step_c = 0.0
        """The last temperature alarm's reading less the centre it left (> 0: the card warmed)."""
        self.half_width_c = 0.0
        self._last_s = 0.0
        self._readings: deque[tuple[float, float]] = deque()
        self._recent: deque[tuple[float, float]] = deque()  # the last confirm_s of readings

    def relearn_temperature(self) -> None:
        """The load changed (a new plan): learn the temperature it settles at."""
        self.centre_c = None
        self._readings.clear()
        self._recent.clear()

    def update(self, now_s: float, temp_c: float, power_limit_w: float) -> list[Condition]:
        if not math.isfinite(temp_c):
            raise KdvfsError(f"condition watch: temperature reading {temp_c} is not a finite number")
        moved: list[Condition] = []
        if limit_moved(self.limit_w, power_limit_w, self.limit_tolerance_w):
            moved.append("power_limit")
        self.limit_w = power_limit_w
        recent = self._recent
        recent.append((now_s, temp_c))
        while now_s - recent[0][0] > self.confirm_s:
            recent.popleft()
        if self.centre_c is not None:
            typical_c = float(statistics.median([t for _, t in recent]))  # numpy's: ~10x dearer a step
            if abs(typical_c - self.centre_c) > self.half_width_c:
                moved.append("temperature")
                self.step_c = typical_c - self.centre_c
            else:
                self.centre_c += (typical_c - self.centre_c) * min(1.0, (now_s - self._last_s) / self.track_s)
                self._last_s = now_s
        if moved:
            self.relearn_temperature()
        if self.centre_c is None:
            self._learn(now_s, temp_c)
        return moved

    def _learn(self, now_s: float, temp_c: float) -> None:
        """Set the centre once the last settle_s of readings are flat."""
        r = self._readings
        r.append((now_s, temp_c))
        while len(r) > 2 and now_s - r[1][0] >= self.settle_s:
            r.popleft()
        if now_s - r[0][0] < self.settle_s or len(r) < 4:
            return
        temps = [t for _, t in r]
        half = len(temps) // 2
        if abs(sum(temps[half:]) / (len(temps) - half) - sum(temps[:half]) / half) < self.settled_drift_c:
            self.centre_c = sum(temps) / len(temps)
            self.half_width_c = (max(temps) - min(temps)) / 2.0 + self.margin_c
            self._last_s = now_s
