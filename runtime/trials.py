"""Measurement in training: the core a step-driven controller measures candidates with, fed
by the job's StepReports (runtime/steps.py). The tuner (tuner/step_tuner.py) and the
Gymnasium environment (envs/step_env.py) both measure through it.

- `pass_boundaries`, `switchable_groups`: where a job can switch clocks, and the groups a card
  can switch between from segment times and its switch latency.
- `Window`: whole steps under one schedule, figures from the steps that began after its
  switch settled, energy between two observed counter updates. `PooledWindow`: the same
  window on every data-parallel rank (n ranks: n energy samples a window, one step time:
  the ranks wait for one another); `open_window` opens
  either, `pooled_report` merges the ranks' reports of one step (runtime/ranks.py pools them).
- `Trial`: a candidate against the incumbent in A-B-B-A blocks of windows, sequential (it
  ends at its first decided block, or at its most blocks undecided); `Outcome`, its means
  robust to a wrecked block (`robust_mean_se`), its windows' energies moved to the trial's
  mean wait for the host, each arm at its own wait power (`arm_wait_power_w`); `NoiseMeter`:
  the job's noise per root second, from pairs of windows of one schedule, kept up to date
  over the run, and how a window's energy follows the job's waits.
- `StallFilter`: a step far longer than its schedule's typical step (an evaluation pass or a
  checkpoint inside the job's step) counts its excess as the job's wait, not the clocks'.
- `StepAccount`: the cumulative budget against stock measured in training; `ScheduleLevel`:
  one schedule's busy step time over every window it ran in (unpaired, as the account is).
- `StockReference` -> `StockFigures`: stock measured in training (longer while its 95%
  margin is wide); `judge` -> `Judgement`: a
  trial's outcome against stock and the budget, the one judgement the tuner adopts by and
  the environment's reward is paid from (envs/reward.py: `trial_reward`).

Design and findings: docs/design-step-tuner.md.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import StepReport
from kdvfs.runtime.types import Workload

#: Training at stock measured as the reference; s.
REFERENCE_S = 20.0
#: A reference window whose step time lies beyond this many scaled MADs of the windows'
#: median is left out of the stock figures (a stalled step); no unit.
OUTLIER_MADS = 5.0
#: ... and beyond this fraction of the median: windows this close to it always count; no unit.
OUTLIER_FLOOR = 0.005
#: Least share of the measured stock step time taken off it in the account (the reference's
#: noise; the account takes its 95% margin where that is larger); a fraction. 0.2% until
#: 2026-12-05: it kept the simulated H200's one-knob optimum (+0.75-0.80%) out of reach.
REFERENCE_MARGIN = 0.0005
#: Length of one trial window before it closes at the next observed counter update; s.
TRIAL_WINDOW_S = 2.0
#: A-B-B-A blocks of one trial before it may end decided (a sequential trial); blocks.
TRIAL_BLOCKS = 2
#: Standard errors the verified saving (and the time margin) must exceed to be adopted; sds.
ADOPT_Z = 3.0
#: A sample further than this many scaled MADs from the median is clipped there (robust_mean_se); sds.
WINSOR_MADS = 3.0
#: The smallest noise figure NoiseMeter reports, per root second; a fraction.
NOISE_FLOOR = 1e-4
#: Pairs of windows NoiseMeter fits the energy's dependence on the job's waits from; pairs.
MIN_SLOPE_PAIRS = 8
#: Windows of one arm of a trial its own wait power is fitted from (arm_wait_power_w); windows.
MIN_ARM_WAIT_WINDOWS = 6
#: An arm's own wait power is at most this many times the job's (a fit beyond it is a few
#: windows' noise, not a card idling at held clocks); a ratio.
MAX_ARM_WAIT_POWER_RATIO = 4.0
#: Standard errors the fitted wait power must lie above 0 before windows are moved by it; sds.
WAIT_FIT_Z = 3.0
#: Pairs of windows the job's noise is read from: the most recent ones (a job whose host
#: starts feeding it late after a quiet first minute is read at its noise now); pairs.
RECENT_PAIRS = 64
#: A step whose busy time exceeds this many times its schedule's typical busy step is a stall
#: (StallFilter); a ratio (well above any clock pair's slowdown of the same schedule's steps).
STALL_RATIO = 3.0
#: Latest steps of a schedule whose median is its typical busy step; steps.
STALL_HISTORY_STEPS = 31
#: Steps of a schedule seen before one of its steps may count as a stall; steps.
STALL_MIN_STEPS = 8
#: Longest steps a window keeps to leave out of a candidate's early time check; steps.
LONGEST_KEPT = 8
#: One-sided 95% quantile of the normal: the budget is held at 95% confidence; sds.
CONFIDENCE_Z = 1.645
#: The reference goes on until the 95% margin of its stock step time is at most this share of
#: the budget (or REFERENCE_MAX_S); a fraction.
REFERENCE_MARGIN_SHARE = 0.5
#: ... and on to this share, for REFERENCE_FINE_MAX_S at most: the account keeps the margin off
#: stock for the whole run, and at half the budget a quiet job's 20-s reference kept the
#: simulated H200's one-knob optimum (+0.75%) out of reach (docs/design-step-tuner.md,
#: "Statistics that scale with the job"); a fraction.
REFERENCE_FINE_MARGIN_SHARE = 0.1
#: The longest reference that goes on for the finer margin (a job noisier than about 2.4% per
#: root second needs longer for half the budget's margin); s.
REFERENCE_FINE_MAX_S = 60.0
#: The longest reference, however noisy the job; s.
REFERENCE_MAX_S = 300.0
#: A group must last this many switch latencies (its lag at the old clocks is then <= 1/this); count.
MIN_GROUP_LATENCIES = 4.0
#: A pass too short to be a group (an optimizer step) takes the kernels before or after it until
#: the group lasts this share of the step (the share of the step a group needs for its saving to
#: show in trials: docs/design-step-tuner.md, "Groups without a prior"); a fraction.
SHORT_PASS_SHARE = 0.2
#: ... and at least this many switch latencies; count.
MIN_PASS_LATENCIES = 3.0


# --- groups ----------------------------------------------------------------------------------
def pass_boundaries(workload: Workload) -> list[int]:
    """Where a job can switch clocks: the step's start and each pass's first kernel."""
    kernels = workload.kernels
    return [0] + [i for i in range(1, len(kernels)) if kernels[i].pass_name != kernels[i - 1].pass_name]


def switchable_groups(
    starts: list[int], segment_times_s: list[float], latency_s: float, passes: Sequence[str] | None = None
) -> list[int]:
    """The group starts kept from segment starts. A pass (`passes`: each segment's pass, forward,
    backward or optimizer; None: all one pass) shorter than MIN_GROUP_LATENCIES switch latencies
    takes whole segments from the near end of its longer neighbour until it lasts
    SHORT_PASS_SHARE of the step and MIN_PASS_LATENCIES latencies, and is a group (where the
    neighbour would be left shorter than MIN_GROUP_LATENCIES latencies, the two merge instead).
    Between such groups, the shortest group shorter than MIN_GROUP_LATENCIES latencies merges
    into its shorter neighbour until none is (a group that short runs mostly at the clocks
    before it). One group never switches."""
    min_s = MIN_GROUP_LATENCIES * latency_s
    short_pass_s = max(SHORT_PASS_SHARE * float(sum(segment_times_s)), MIN_PASS_LATENCIES * latency_s)
    pass_of = list(passes) if passes is not None else [""] * len(starts)
    runs: list[list[int]] = []  # segment indices, each run of one pass
    for i in range(len(starts)):
        if runs and pass_of[i] == pass_of[runs[-1][-1]]:
            runs[-1].append(i)
        else:
            runs.append([i])

    def time_s(run: list[int]) -> float:
        return float(sum(segment_times_s[i] for i in run))

    grown: set[int] = set()  # the runs' first segments that grew to a short pass's length
    while len(runs) > 1:
        short = [r for r in range(len(runs)) if time_s(runs[r]) < min_s and runs[r][0] not in grown]
        if not short:
            break
        r = min(short, key=lambda r: time_s(runs[r]))
        q = max((q for q in (r - 1, r + 1) if 0 <= q < len(runs)), key=lambda q: time_s(runs[q]))
        near = runs[q] if q > r else runs[q][::-1]  # the neighbour's segments, nearest first
        taken, need_s = 0, short_pass_s - time_s(runs[r])
        while taken < len(near) and need_s > 0.0:
            need_s -= segment_times_s[near[taken]]
            taken += 1
        if need_s <= 0.0 and time_s(near[taken:]) >= min_s:
            runs[r] = runs[r] + near[:taken] if q > r else near[:taken][::-1] + runs[r]
            runs[q] = near[taken:] if q > r else near[taken:][::-1]
            grown.add(runs[r][0])
        else:
            a, b = min(r, q), max(r, q)
            runs[a] += runs[b]
            del runs[b]
    kept, rest = [], []  # rest: the segments between grown passes, merged as one pass
    for run in [*runs, None]:
        if run is not None and run[0] not in grown:
            rest += run
            continue
        kept += [rest[i] for i in _merged_starts([segment_times_s[i] for i in rest], min_s)] if rest else []
        rest = []
        if run is not None:  # a grown pass stays one group
            kept.append(run[0])
    return [starts[i] for i in kept]


def _merged_starts(segment_times_s: list[float], min_s: float) -> list[int]:
    """The segments (indices) that start groups once the shortest group shorter than `min_s`
    has merged into its shorter neighbour until none is."""
    starts, times = list(range(len(segment_times_s))), list(segment_times_s)
    while len(starts) > 1:
        i = int(np.argmin(times))
        if times[i] >= min_s:
            break
        if i == 0:
            j = 1
        elif i == len(times) - 1:
            j = i - 1
        else:
            j = i - 1 if times[i - 1] <= times[i + 1] else i + 1
        a, b = min(i, j), max(i, j)
        times[a] += times[b]
        del times[b], starts[b]
    return starts


# --- measuring ------------------------------------------------------------------------------
@dataclass
class StallFilter:
    """The job's stalls inside its steps: a single step whose busy time (step time less the
    job's wait) exceeds `ratio` x the median of its schedule's latest busy steps (an evaluation
    pass, a checkpoint, run inside the step the job wraps) keeps that median as its busy time;
    the excess joins the step's wait (StepReport.wait_s), the job's own, as a late batch is.
    The clocks' effect on the stall itself is left out of the comparison; A and B are treated
    alike, so the comparison stays unbiased on the regular steps.

    Args:
        ratio: the busy time over the typical step that makes a stall; a ratio.
        min_steps: steps of a schedule seen before one may count as a stall; steps.
    """

    ratio: float = STALL_RATIO
    min_steps: int = STALL_MIN_STEPS
    stalls: int = 0
    stall_s: float = 0.0
    _recent: dict[Schedule, deque[float]] = field(default_factory=dict)
    _last_typical_s: float = 0.0  # the typical busy step of the schedule judged last, s

    def apply(self, report: StepReport, schedule: Schedule, worst_ratio: float = math.inf) -> StepReport:
        """The report of one step run under `schedule`, its stall's excess moved into its
        wait (a report standing for several steps passes unchanged). A schedule with fewer
        than min_steps seen (a candidate's first steps) is judged against the typical busy
        step of the schedule judged before it, times `worst_ratio` (the most the new
        schedule can slow a step; infinite: no judgement), and a stall keeps that bound."""
        if report.steps != 1:
            return report
        busy_s = report.step_time_s - report.wait_s
        recent = self._recent.setdefault(schedule, deque(maxlen=STALL_HISTORY_STEPS))
        if len(recent) >= self.min_steps:
            typical_s = self._last_typical_s = statistics.median(recent)
        else:
            typical_s = self._last_typical_s * worst_ratio if self._last_typical_s > 0.0 else 0.0
        if math.isfinite(typical_s) and typical_s > 0.0 and busy_s > self.ratio * typical_s:
            excess_s = busy_s - typical_s
            self.stalls += 1
            self.stall_s += excess_s
            return dataclasses.replace(report, wait_s=report.wait_s + excess_s, stall_s=excess_s)
        recent.append(busy_s)
        return report

    def is_fresh(self, schedule: Schedule) -> bool:
        """True while `schedule` has fewer than min_steps busy steps seen."""
        recent = self._recent.get(schedule)
        return recent is None or len(recent) < self.min_steps

    def step_cv(self, schedule: Schedule) -> float:
        """The relative s.d. of single busy steps of `schedule` among its latest (stalls left
        out; NaN under min_steps seen): the spread a few steps' mean carries at short spans."""
        recent = self._recent.get(schedule)
        if recent is None or len(recent) < self.min_steps:
            return math.nan
        # in floats (statistics.stdev sums exact fractions: ~0.2 ms a call, on the training
        # host's GIL, at every step of a candidate's arm)
        mean_s = math.fsum(recent) / len(recent)
        var_s2 = math.fsum((s - mean_s) ** 2 for s in recent) / (len(recent) - 1)
        return math.sqrt(var_s2) / mean_s if mean_s > 0.0 else math.nan


@dataclass
class Window:
    """Whole steps under one schedule. Steps that began before settle_s (the switch and one
    counter period after the window opened) are not counted; energy is taken between the
    first and last counter updates observed after settle_s, each report's latest alone (a long
    step's updates inside it would cut it by time, where its energy is its kernels' and then its
    wait's at idle power). A report may stand for several steps (`StepReport.steps`: a
    simulated stretch at once); it counts as that many."""

    schedule: Schedule
    length_s: float
    settle_s: float
    steps: int = 0
    time_sum_s: float = 0.0
    wait_sum_s: float = 0.0
    longest_busy_s: list[float] = field(default_factory=list)  # a min-heap of the longest steps, s
    group_sums_s: list[float] | None = None  # each group's busy time summed over the steps, s
    first: tuple[float, float] | None = None
    last: tuple[float, float] | None = None
    gap_j: float = 0.0  # the counter's advance over the stalls' spans, J
    gap_s: float = 0.0  # the stalls' spans between counter readings, s
    gap_from: tuple[float, float] | None = None  # the reading before a stall whose span is open
    span_steps: float = 0.0  # counted steps inside the counter span so far, pro rata by time
    span_time_s: float = 0.0  # their time, s
    tail_steps: float = 0.0  # counted steps after the last reading (outside the span until one comes)
    tail_time_s: float = 0.0  # their time, s
    span_wait_s: float = 0.0  # the job's waits in the span's steps, pro rata like them, s
    tail_wait_s: float = 0.0  # the job's waits in the tail's steps, s
    in_level: bool = False  # counted in its schedule's ScheduleLevel already

    def add(self, report: StepReport) -> bool:
        """Count a report's steps; True when the window is closed (long enough, at an observed
        update). A stall (StepReport.stall_s) leaves its span out of the energy: from the last
        reading before it to the first one after."""
        n = report.steps
        # a report's last reading alone: a long step's inner readings would cut it by time, and
        # its energy is not spread evenly in time (its kernels, then its wait at idle power)
        readings = [r for r in report.counter_readings if r[0] >= self.settle_s][-1:]
        if self.gap_from is not None and readings:  # the stall before ended: its span closes
            self.gap_j += readings[0][1] - self.gap_from[1]
            self.gap_s += readings[0][0] - self.gap_from[0]
            self.gap_from = None
        before = self.last
        counted = report.end_s - n * report.step_time_s >= self.settle_s
        stalled = False
        if counted and report.stall_s > 0.0 and n == 1:
            start = before if before is not None else (readings[0] if readings else None)
            if start is not None:
                stalled = True
                self.gap_from = start
        if counted:
            self._count_in_span(report, readings, stalled)
            self.steps += n
            self.time_sum_s += n * report.step_time_s
            self.wait_sum_s += n * report.wait_s
            busy_s = report.step_time_s - report.wait_s
            if len(self.longest_busy_s) < LONGEST_KEPT:
                heapq.heappush(self.longest_busy_s, busy_s)
            elif busy_s > self.longest_busy_s[0]:
                heapq.heapreplace(self.longest_busy_s, busy_s)
            # plain floats, not numpy: each step's few numbers cost numpy ~4x more once the
            # training step between two reports has left the caches cold
            g = [t * n for t in report.group_times_s]
            g[-1] = max(g[-1] - n * report.wait_s, 0.0)  # busy: the job's wait is not the last group's
            sums = self.group_sums_s
            self.group_sums_s = g if sums is None else [a + b for a, b in zip(sums, g, strict=True)]
        for reading in readings:
            self.first = self.first or reading
            self.last = reading
        return bool(report.counter_readings) and self.span_s >= self.length_s and self.steps > 0

    def _count_in_span(self, report: StepReport, readings: list[tuple[float, float]], stalled: bool) -> None:
        """The report's steps and time between the counter readings, pro rata by time (a
        report stands for steps that ran back to back up to its end): what lies before the
        window's first reading is left out, what lies after its latest reading waits in the
        tail until a later reading takes it in. A wait that closes a step (a checkpoint, an
        evaluation) holds a reading at the card's idle power; taking in the whole step's time
        would charge the wait after that reading at the span's power. A stalled step counts
        none of its own: its span is out of the energy (the gap), its steps out of the count."""
        end_s = report.end_s
        time_s = report.steps * report.step_time_s
        wait_s = report.steps * report.wait_s
        if stalled:
            if readings and self.first is not None:  # the steps before it, up to its reading
                self._take_tail()
            if readings or self.first is None:
                self.tail_steps = self.tail_time_s = self.tail_wait_s = 0.0
            return
        if not readings:
            self.tail_steps += report.steps
            self.tail_time_s += time_s
            self.tail_wait_s += wait_s
            return

        def after(at_s: float) -> float:  # the report's share after a reading, a fraction
            return min(max((end_s - at_s) / time_s, 0.0), 1.0) if time_s > 0.0 else 0.0

        head = after(readings[0][0]) if self.first is None else 1.0
        tail = after(readings[-1][0])
        if self.first is not None:  # the steps waiting since the last reading are in the span now
            self._take_tail()
        self.span_steps += report.steps * (head - tail)
        self.span_time_s += time_s * (head - tail)
        self.span_wait_s += wait_s * (head - tail)
        self.tail_steps, self.tail_time_s, self.tail_wait_s = (
            report.steps * tail,
            time_s * tail,
            wait_s * tail,
        )

    def _take_tail(self) -> None:
        """The steps after the last reading into the span: a later reading came."""
        self.span_steps += self.tail_steps
        self.span_time_s += self.tail_time_s
        self.span_wait_s += self.tail_wait_s

    @property
    def span_s(self) -> float:
        return 0.0 if self.first is None or self.last is None else self.last[0] - self.first[0]

    @property
    def settled_s(self) -> float:
        return float(self.time_sum_s)

    @property
    def step_s(self) -> float:
        return self.time_sum_s / self.steps if self.steps else math.nan

    @property
    def busy_sum_s(self) -> float:
        """The steps' time less the job's waits for its host (StepReport.wait_s), s."""
        return self.time_sum_s - self.wait_sum_s

    @property
    def busy_s(self) -> float:
        """The mean busy step time: what the clocks set, s."""
        return self.busy_sum_s / self.steps if self.steps else math.nan

    @property
    def longest_busy_s_left_out(self) -> tuple[float, int]:
        """The busy time and the steps counted less the longest eighth of the steps (at most
        LONGEST_KEPT, at least one from two steps on: stalls and sync gaps that single reports
        carry), s and count."""
        k = min(len(self.longest_busy_s), max(1, self.steps // 8)) if self.steps >= 2 else 0
        left_out = sorted(self.longest_busy_s)[len(self.longest_busy_s) - k :] if k else []
        return self.busy_sum_s - sum(left_out), self.steps - k

    @property
    def group_times_s(self) -> np.ndarray:
        """Each group's mean busy time per step (the job's waits left out), s."""
        return np.asarray(self.group_sums_s, dtype=float) / self.steps

    @property
    def power_w(self) -> float:
        """Mean power over the counter span, the stalls' spans left out (NaN: none left), W."""
        if self.span_s <= 0:
            return math.nan
        gap_j, gap_s = self.gap_j, self.gap_s
        if self.gap_from is not None:  # a stall still running at the window's last reading
            gap_j += self.last[1] - self.gap_from[1]
            gap_s += self.last[0] - self.gap_from[0]
        clean_s = self.span_s - gap_s
        return (self.last[1] - self.first[1] - gap_j) / clean_s if clean_s > 0 else math.nan

    @property
    def energy_per_step_j(self) -> float:
        """Mean power over the counter span x mean time of the steps in that span, pro rata
        at its two readings (in-training-trials.md), both without the stalls (their steps
        and the counter's advance over them)."""
        if self.span_steps <= 0.0 or self.span_time_s <= 0.0:
            return self.power_w * self.step_s
        return self.power_w * self.span_time_s / self.span_steps

    @property
    def regular_step_s(self) -> float:
        """The mean step time of the steps energy_per_step_j counts (in the counter span, pro
        rata; the stalls left out), s."""
        if self.span_steps <= 0.0 or self.span_time_s <= 0.0:
            return self.step_s
        return self.span_time_s / self.span_steps

    @property
    def regular_wait_s(self) -> float:
        """The job's mean wait for its host in those steps (StepReport.wait_s), s: the wait
        a window's energy is moved by (a common wait) is the wait of the steps it counts."""
        if self.span_steps <= 0.0 or self.span_time_s <= 0.0:
            return self.wait_sum_s / self.steps if self.steps else math.nan
        return self.span_wait_s / self.span_steps

    @property
    def rank_energies_j(self) -> list[float]:
        """Energy per step of each rank's window (one rank: this window's)."""
        return [self.energy_per_step_j]

    @property
    def rank_waits(self) -> list[tuple[float, float]]:
        """(regular_wait_s, regular_step_s) of each rank's window (one rank: this window's), s."""
        return [(self.regular_wait_s, self.regular_step_s)]

    @property
    def rank_steps_s(self) -> list[float]:
        """Mean busy step time of each rank's window (one rank: this window's), s."""
        return [self.busy_s]

    @property
    def rank_settled_s(self) -> list[float]:
        """Settled seconds of each rank's window, s."""
        return [self.settled_s]


def window_pairs(
    x: Window | PooledWindow, y: Window | PooledWindow
) -> list[tuple[float, float, float, float, float]]:
    """Two windows of one schedule as NoiseMeter pairs, each rank's: (relative energy
    difference, relative busy-time difference, their mean settled seconds, the difference of
    the job's mean wait for its host per step over the first window's energy per step (s/J),
    the first window's mean power (W)). The fourth is what makes the first linear in the wait:
    ey / ex - 1 = P (wy - wx) / ex for a card that draws P while the job waits, however long
    the waits (a checkpoint's too)."""
    return [
        (ey / ex - 1.0, ty / tx - 1.0, 0.5 * (sx + sy), (wy - wx) / ex, ex / stx if stx > 0.0 else math.nan)
        for ex, ey, tx, ty, sx, sy, (wx, stx), (wy, _) in zip(
            x.rank_energies_j,
            y.rank_energies_j,
            x.rank_steps_s,
            y.rank_steps_s,
            x.rank_settled_s,
            y.rank_settled_s,
            x.rank_waits,
            y.rank_waits,
        )
    ]


@dataclass
class PooledWindow:
    """One window on every data-parallel rank, each rank's own Window on its own clock (the
    ranks run the same schedule in lockstep). Closed at a step where some rank observed a
    counter update and every rank's counter span reached length_s. Its figures are the
    ranks' means; its step times are every rank's (n ranks: n energy samples a window; the
    ranks' step times end together, one sample: Trial.outcome counts them once)."""

    windows: list[Window]
    in_level: bool = False  # counted in its schedule's ScheduleLevel already

    @property
    def schedule(self) -> Schedule:
        return self.windows[0].schedule

    @property
    def length_s(self) -> float:
        return self.windows[0].length_s

    def add(self, reports: Sequence[StepReport]) -> bool:
        """Count every rank's report of one step (in rank order); True when closed."""
        for window, report in zip(self.windows, reports, strict=True):
            window.add(report)
        return any(r.counter_readings for r in reports) and all(
            w.span_s >= w.length_s and w.steps for w in self.windows
        )

    @property
    def steps(self) -> int:
        """Steps counted, every rank's (n ranks: n a step)."""
        return sum(w.steps for w in self.windows)

    @property
    def busy_sum_s(self) -> float:
        return float(sum(w.busy_sum_s for w in self.windows))

    @property
    def busy_s(self) -> float:
        return self.busy_sum_s / self.steps if self.steps else math.nan

    @property
    def longest_busy_s_left_out(self) -> tuple[float, int]:
        """Every rank's busy time and steps, each less its longest steps (Window's)."""
        parts = [w.longest_busy_s_left_out for w in self.windows]
        return float(sum(b for b, _ in parts)), sum(n for _, n in parts)

    @property
    def span_s(self) -> float:
        return min(w.span_s for w in self.windows)

    @property
    def settled_s(self) -> float:
        return float(sum(w.settled_s for w in self.windows))

    @property
    def step_s(self) -> float:
        return self.settled_s / self.steps if self.steps else math.nan

    @property
    def group_times_s(self) -> np.ndarray:
        return sum(np.asarray(w.group_sums_s, dtype=float) for w in self.windows) / self.steps

    @property
    def power_w(self) -> float:
        """The mean power of the ranks whose counter span began (NaN: none's did), W."""
        powers = [w.power_w for w in self.windows if not math.isnan(w.power_w)]
        return float(np.mean(powers)) if powers else math.nan

    @property
    def energy_per_step_j(self) -> float:
        return float(np.mean(self.rank_energies_j))

    @property
    def rank_energies_j(self) -> list[float]:
        return [w.energy_per_step_j for w in self.windows]

    @property
    def rank_steps_s(self) -> list[float]:
        return [w.busy_s for w in self.windows]

    @property
    def rank_waits(self) -> list[tuple[float, float]]:
        return [(w.regular_wait_s, w.regular_step_s) for w in self.windows]

    @property
    def rank_settled_s(self) -> list[float]:
        return [w.settled_s for w in self.windows]


#: What a window is fed one step at a time: one rank's report, or every rank's (in rank order).
Feed = StepReport | Sequence[StepReport]


def open_window(
    schedule: Schedule, length_s: float, settle_s: float, now_s: float | Sequence[float]
) -> Window | PooledWindow:
    """A Window opened at now_s (s) whose steps count settle_s after it; a PooledWindow when
    now_s is every rank's clock (a sequence)."""
    if isinstance(now_s, int | float):
        return Window(schedule, length_s, now_s + settle_s)
    return PooledWindow([Window(schedule, length_s, t + settle_s) for t in now_s])


def pooled_report(reports: Sequence[StepReport]) -> StepReport:
    """One step of every data-parallel rank as one report: rank 0's step index, clock and
    counter; the ranks' mean step and group times and temperature; their throttle reasons
    together; the lowest power limit and SM clock."""
    first = reports[0]
    if len(reports) == 1:
        return first
    temperatures = [r.temperature_c for r in reports if math.isfinite(r.temperature_c)]
    return StepReport(
        step=first.step,
        end_s=first.end_s,
        step_time_s=float(np.mean([r.step_time_s for r in reports])),
        group_times_s=tuple(float(t) for t in np.mean([r.group_times_s for r in reports], axis=0)),
        counter_readings=first.counter_readings,
        temperature_c=float(np.mean(temperatures)) if temperatures else math.nan,
        throttle_reasons=frozenset().union(*(r.throttle_reasons for r in reports)),
        power_limit_w=min(r.power_limit_w for r in reports),
        wait_s=float(np.mean([r.wait_s for r in reports])),
        sm_clock_mhz=min(
            (r.sm_clock_mhz for r in reports if math.isfinite(r.sm_clock_mhz)), default=math.nan
        ),
    )


def feed_step_s(feed: Feed) -> float:
    """The training time a feed stands for: one rank's report's steps, or the ranks' mean; s."""
    if isinstance(feed, StepReport):
        return feed.step_time_s * feed.steps
    return float(np.mean([r.step_time_s * r.steps for r in feed]))


@dataclass(frozen=True)
class Outcome:
    """A trial's result: B against A as relative differences (fractions of A), their standard
    errors over the blocks (robust: `robust_mean_se`), B's figures.

    Attributes:
        energy_diff: B's step energy against A's, a fraction (NaN: no block completed).
        energy_se: its standard error over the blocks (inf under two samples).
        time_diff: B's step time against A's, a fraction.
        time_se: its standard error over the blocks.
        b_step_s: B's mean step time, s.
        b_group_times_s: B's mean time of each group per step, s.
        blocks: completed A-B-B-A blocks.
        abandoned: the candidate was stopped before its blocks completed.
        pairs: two windows of one schedule in a block (A1 and A2, B1 and B2) as (energy
            difference, time difference, seconds of the windows, wait difference;
            `window_pairs`): what the job's noise is measured from (`NoiseMeter`).
        undecided: the trial reached its longest length (or was stopped for the budget's
            slack) with its decision still open.
    """

    energy_diff: float
    energy_se: float
    time_diff: float
    time_se: float
    b_step_s: float
    b_group_times_s: np.ndarray
    blocks: int
    abandoned: bool
    pairs: tuple[tuple[float, float, float, float, float], ...] = ()
    undecided: bool = False


@dataclass
class Trial:
    """A candidate (B) against the incumbent (A) in A-B-B-A blocks of windows: a sequential
    trial. It ends after `blocks` blocks, or, from `min_blocks` on, at the first block whose
    outcome `decide` calls decided; or when abandoned.

    Args:
        incumbent: A's schedule.
        candidate: B's schedule.
        blocks: the most A-B-B-A blocks; blocks.
        window_s: length of one window, s.
        settle_s: steps that began within this long of a window's opening are not counted, s.
        min_blocks: blocks before `decide` is asked (None: `blocks`, a trial of fixed length).
        decide: the outcome so far -> whether the trial is decided (None: never early).
        wait_power_w: the power the card draws while the job waits for its host
            (NoiseMeter.wait_power_w): each window's energy per step is moved to the trial's
            mean wait by it, or by its arm's own where the arm's windows tell it (0: as
            measured); W.

    Attributes:
        first_look: the Judgement its decider stated at its first look, where the decider
            records it (the step tuner does); None before. One fixed look's reading, unlike
            the reading at the look a sequential trial stopped on, is a standard normal draw
            about the truth in units of its stated error where that error is honest.
        last_look: the Judgement its decider stated at its latest look (recorded alike): for a
            trial that ended decided, the judgement it stopped on.
    """

    incumbent: Schedule
    candidate: Schedule
    blocks: int
    window_s: float
    settle_s: float
    min_blocks: int | None = None
    decide: Callable[[Outcome], bool] | None = None
    wait_power_w: float = 0.0
    closed: list[Window | PooledWindow] = field(default_factory=list)
    current: Window | PooledWindow | None = None
    abandoned: bool = False
    undecided_stop: bool = False  # abandoned for the budget's slack, not for its measured time
    decided: bool = False
    first_look: Judgement | None = None
    last_look: Judgement | None = None

    @property
    def arm(self) -> str:
        """'A' or 'B': whose window is open (or opens next)."""
        return "ABBA"[len(self.closed) % 4]

    @property
    def done(self) -> bool:
        return self.abandoned or self.decided or len(self.closed) >= 4 * self.blocks

    def schedule(self) -> Schedule:
        return self.candidate if self.arm == "B" else self.incumbent

    def open(self, now_s: float | Sequence[float]) -> None:
        """Open the next window at now_s (every rank's clock, for pooled ranks), s."""
        self.current = open_window(self.schedule(), self.window_s, self.settle_s, now_s)

    def add(self, report: Feed) -> None:
        if self.current.add(report):
            self.closed.append(self.current)
            self.current = None
            blocks = len(self.closed) // 4
            if (
                len(self.closed) % 4 == 0
                and self.decide is not None
                and blocks >= (self.min_blocks or self.blocks)
                and blocks < self.blocks
            ):
                self.decided = bool(self.decide(self.outcome()))

    def a_windows(self) -> list[Window | PooledWindow]:
        """The incumbent's closed windows, in order."""
        return [w for i, w in enumerate(self.closed) if "ABBA"[i % 4] == "A"]

    def b_closed_windows(self) -> list[Window | PooledWindow]:
        """The candidate's closed windows, in order."""
        return [w for i, w in enumerate(self.closed) if "ABBA"[i % 4] == "B"]

    def b_windows(self) -> list[Window | PooledWindow]:
        """The candidate's windows, closed and the one open."""
        return self.b_closed_windows() + ([self.current] if self.current and self.arm == "B" else [])

    def _energies_at_trial_wait(self, blocks: int) -> list[list[tuple[float, float, float, float]]]:
        """Each block's (A1, B1, B2, A2) energies per step, each rank's, moved to the trial's
        mean wait for the host (per step, over the steps its closed windows count on that rank:
        a checkpoint's window counts few steps): e - P x (wait - mean wait), P each arm's own
        (`arm_wait_power_w`: a schedule that holds its clocks through the waits draws more in
        them than stock, which drops them), the job's (wait_power_w) where the arm's windows do
        not tell it. As measured while wait_power_w is 0 (the job's waits do not move its
        energy)."""
        windows = self.closed[: 4 * blocks]
        energies = [w.rank_energies_j for w in windows]
        if self.wait_power_w <= 0.0 or not windows:
            return [list(zip(*energies[4 * k : 4 * k + 4])) for k in range(blocks)]
        waits = [[wait for wait, _ in w.rank_waits] for w in windows]
        counts = [_rank_span_steps(w) for w in windows]
        is_b = np.array(["ABBA"[i % 4] == "B" for i in range(len(windows))])
        moved: list[list[float]] = [[] for _ in windows]
        for r in range(len(energies[0])):
            e = np.array([x[r] for x in energies])
            w = np.array([x[r] for x in waits])
            at = e  # a window whose wait is unknown: every window of this rank as measured
            if np.all(np.isfinite(w)):
                power = np.where(
                    is_b,
                    arm_wait_power_w(e[is_b], w[is_b], self.wait_power_w),
                    arm_wait_power_w(e[~is_b], w[~is_b], self.wait_power_w),
                )
                n = np.array([x[r] for x in counts])
                mean_wait_s = float(n @ w / n.sum()) if n.sum() > 0 else float(np.mean(w))
                at = e - power * (w - mean_wait_s)
            for i, x in enumerate(at):
                moved[i].append(float(x))
        return [list(zip(*moved[4 * k : 4 * k + 4])) for k in range(blocks)]

    def outcome(self) -> Outcome:
        blocks = len(self.closed) // 4
        e_diff, t_diff, pairs = [], [], []
        moved = self._energies_at_trial_wait(blocks)
        for k in range(blocks):
            a1, b1, b2, a2 = self.closed[4 * k : 4 * k + 4]
            # energy: each rank's block is a sample (pooled ranks: n a block, each card its own),
            # each window's energy at the trial's mean wait for the host (_energies_at_trial_wait)
            for ea1, eb1, eb2, ea2 in moved[k]:
                diff = 0.5 * (eb1 + eb2) / (0.5 * (ea1 + ea2)) - 1.0
                if math.isfinite(diff):  # a window whose counter span was all stall has no energy
                    e_diff.append(diff)
            # time: one sample a block, the ranks' mean (their steps end together at every
            # all-reduce, so n ranks' times are one measurement, not n)
            rank_t_diff = [
                0.5 * (tb1 + tb2) / (0.5 * (ta1 + ta2)) - 1.0
                for ta1, tb1, tb2, ta2 in zip(
                    a1.rank_steps_s, b1.rank_steps_s, b2.rank_steps_s, a2.rank_steps_s
                )
            ]
            t_diff.append(float(np.mean(rank_t_diff)))
            pairs += window_pairs(a1, a2) + window_pairs(b1, b2)  # two windows of one schedule
        b = [w for w in self.b_windows() if w.steps]
        b_step = float(np.mean([w.step_s for w in b])) if b else math.nan
        b_groups = np.mean([w.group_times_s for w in b], axis=0) if b else np.array([])
        energy_diff, energy_se = robust_mean_se(e_diff)
        time_diff, time_se = robust_mean_se(t_diff)
        return Outcome(
            energy_diff=energy_diff,
            energy_se=energy_se,
            time_diff=time_diff,
            time_se=time_se,
            b_step_s=b_step,
            b_group_times_s=b_groups,
            blocks=blocks,
            abandoned=self.abandoned,
            pairs=tuple(pairs),
            undecided=self.undecided_stop
            or (not self.abandoned and not self.decided and self.decide is not None),
        )


def energy_at_wait_j(energy_j: float, wait_s: float, to_wait_s: float, wait_power_w: float) -> float:
    """A window's energy per step (J) measured at a mean wait for the host of wait_s per step,
    moved to a mean wait of to_wait_s: e - P x (wait - to wait), the card drawing P =
    wait_power_w while the job waits (NoiseMeter.wait_power_w), J."""
    return energy_j - wait_power_w * (wait_s - to_wait_s)


def _rank_span_steps(window: Window | PooledWindow) -> list[float]:
    """The steps each rank's window counts its energy over (pro rata in its counter span)."""
    ranks = window.windows if isinstance(window, PooledWindow) else [window]
    return [w.span_steps if w.span_steps > 0.0 else float(w.steps) for w in ranks]


def arm_wait_power_w(energies_j: np.ndarray, waits_s: np.ndarray, fallback_w: float) -> float:
    """The power one schedule's windows draw while the job waits for its host, W: the slope of
    their energy per step on their wait per step (least squares with an intercept), where it
    lies WAIT_FIT_Z standard errors above 0 over MIN_ARM_WAIT_WINDOWS windows or more and
    below MAX_ARM_WAIT_POWER_RATIO x fallback_w; else fallback_w (the job's,
    NoiseMeter.wait_power_w)."""
    finite = np.isfinite(energies_j) & np.isfinite(waits_s)
    e, w = energies_j[finite], waits_s[finite]
    if e.size < MIN_ARM_WAIT_WINDOWS:
        return fallback_w
    dw = w - w.mean()
    sxx = float(dw @ dw)
    if sxx <= 0.0:
        return fallback_w
    slope = float(dw @ (e - e.mean())) / sxx
    resid = e - e.mean() - slope * dw
    se = math.sqrt(float(resid @ resid) / max(e.size - 2, 1) / sxx)
    return slope if WAIT_FIT_Z * se < slope < fallback_w * MAX_ARM_WAIT_POWER_RATIO else fallback_w


def _at_mean_wait(energies_j: Sequence[float], waits_s: Sequence[float], wait_power_w: float) -> list[float]:
    """A block's windows' energies per step, each moved to the block's mean wait for the host
    (waits_s: each window's wait per step, s): e - P x (wait - mean wait), the card drawing P
    while the job waits. The waits are the host's, not the clocks': this removes their chance
    differences between A and B, not what a schedule draws while the job waits."""
    if wait_power_w <= 0.0 or not all(math.isfinite(w) for w in waits_s):
        return list(energies_j)
    mean_wait_s = sum(waits_s) / len(waits_s)
    return [energy_at_wait_j(e, w, mean_wait_s, wait_power_w) for e, w in zip(energies_j, waits_s)]


def _se(values: list[float]) -> float:
    return float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.inf


def robust_mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean of values and its standard error, robust to a wrecked sample: from four values
    on, each is first clipped to WINSOR_MADS scaled median absolute deviations of the median
    (a block with a stalled step or a sync gap counts, but no more than a bad block's worth).
    (NaN, inf) for no values; the SE is inf for one."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return math.nan, math.inf
    if v.size >= 4:
        v = _winsorised(v)
    return float(np.mean(v)), _se(list(v))


def _winsorised(v: np.ndarray) -> np.ndarray:
    """v with each value clipped to WINSOR_MADS scaled median absolute deviations of the median."""
    median = float(np.median(v))
    mad = 1.4826 * float(np.median(np.abs(v - median)))
    return np.clip(v, median - WINSOR_MADS * mad, median + WINSOR_MADS * mad) if mad > 0.0 else v


# --- the job's noise -------------------------------------------------------------------------
@dataclass
class NoiseMeter:
    """The job's noise, kept up to date as the run goes: from pairs of windows of one schedule
    (consecutive reference windows, a block's two A windows and its two B windows), the
    relative s.d. of a window's energy per step and of its mean step time, each scaled to a
    window of 1 s (a figure per root second). Robust: the scaled median absolute deviation of
    the pairs' differences, so a stalled step or a sync gap in a few windows does not set it.
    A job that waits for its host moves a window's energy per step with its waits (the card
    draws while idle): `wait_power_w` is what it draws then, fitted over the pairs, and the
    energy noise is what is left once it is taken out (what a trial's blocks see, their
    windows moved to a common wait: Trial's wait_power_w).

    Args:
        floor: the smallest figure it reports, per root s (a perfectly quiet job still has a
            counter's resolution); a fraction.
        recent: the pairs its figures are read from, the most recent ones; pairs.
    """

    floor: float = NOISE_FLOOR
    recent: int = RECENT_PAIRS
    energy: list[float] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)  # wait differences over energies per step, s/J
    power: list[float] = field(default_factory=list)  # the pairs' first windows' mean power, W
    _fit: tuple[int, float] = (0, 0.0)  # (pairs it was fitted on, wait_power_w)
    _time_sd: tuple[int, float] = (0, math.nan)  # (pairs it was read from, time_sd_per_root_s)

    def add(
        self,
        energy_diff: float,
        time_diff: float,
        window_s: float,
        wait_diff: float = 0.0,
        power_w: float = math.nan,
    ) -> None:
        """Two windows of one schedule, window_s long each: their relative differences (the
        wait's: its difference per step over the first window's energy per step, s/J), and the
        first window's mean power (W; what a second of waiting may cost at most)."""
        if not (math.isfinite(energy_diff) and math.isfinite(time_diff) and window_s > 0):
            return
        scale = math.sqrt(window_s / 2.0)  # a difference of two windows has sqrt(2) x one's s.d.
        self.energy.append(energy_diff * scale)
        self.time.append(time_diff * scale)
        self.wait.append(wait_diff * scale if math.isfinite(wait_diff) else 0.0)
        if math.isfinite(power_w) and power_w > 0.0:
            self.power.append(power_w)

    def add_pairs(self, pairs: Sequence[tuple[float, ...]]) -> None:
        for pair in pairs:
            self.add(*pair)

    @property
    def wait_power_w(self) -> float:
        """The power the card draws while the job waits for its host, W: the slope of the
        pairs' relative energy differences on their wait differences over energy (s/J), least
        squares through 0, refitted once with each residual clipped to WINSOR_MADS scaled MADs
        (a pair with a stalled step counts, but no more than a bad pair's worth). Linear however
        long a wait is, so the pairs that hold a checkpoint are fitted, not clipped. 0 unless it
        lies WAIT_FIT_Z standard errors above 0 (waits that barely differ tell nothing: on the
        real sync job, 20 us a step, the bare slope read 11 kW), and no more than the windows'
        median power; 0 under MIN_SLOPE_PAIRS pairs or where the waits never differ."""
        n = len(self.wait)
        if self._fit[0] == n:
            return self._fit[1]
        power_w = 0.0
        if n >= MIN_SLOPE_PAIRS:
            x, y = np.asarray(self.wait), np.asarray(self.energy)
            sxx = float(x @ x)
            if sxx > 0.0:
                slope = float(x @ y) / sxx
                clipped = slope * x + _winsorised(y - slope * x)
                slope = float(x @ clipped) / sxx
                se = math.sqrt(float(np.sum((clipped - slope * x) ** 2)) / (n - 1) / sxx)
                if slope > WAIT_FIT_Z * se:
                    power_w = min(slope, float(np.median(self.power))) if self.power else slope
        self._fit = (n, power_w)
        return power_w

    @property
    def samples(self) -> int:
        return len(self.time)

    def _sd(self, values: list[float], floor: float) -> float:
        if len(values) < 2:
            return math.nan
        v = np.asarray(values[-self.recent :])
        mad = 1.4826 * float(np.median(np.abs(v - np.median(v))))
        return max(mad, floor)

    @property
    def energy_sd_per_root_s(self) -> float:
        """Relative s.d. of a 1-s window's energy per step, the job's waits taken out
        (wait_power_w; NaN under two pairs)."""
        power_w = self.wait_power_w
        if power_w == 0.0:
            return self._sd(self.energy, self.floor)
        recent = slice(-self.recent, None)  # only the recent pairs are read: only they are taken out
        return self._sd([e - power_w * w for e, w in zip(self.energy[recent], self.wait[recent])], self.floor)

    @property
    def time_sd_per_root_s(self) -> float:
        """Relative s.d. of a step time mean over 1 s (NaN under two pairs)."""
        # read at every step of a candidate's arm (the account's time check): computed once per pair
        n = len(self.time)
        if self._time_sd[0] != n or n < 2:
            self._time_sd = (n, self._sd(self.time, self.floor))
        return self._time_sd[1]

    def resolvable(self, trial_s: float, z: float = 3.0) -> tuple[float, float]:
        """The smallest energy and time differences (fractions) that a trial of trial_s seconds
        resolves at z standard errors (`resolvable`)."""
        return (
            resolvable(self.energy_sd_per_root_s, trial_s, z),
            resolvable(self.time_sd_per_root_s, trial_s, z),
        )


def resolvable(sd_per_root_s: float, trial_s: float, z: float = ADOPT_Z) -> float:
    """The smallest difference (a fraction) an A-B-B-A trial of trial_s seconds resolves at z
    standard errors, the noise sd_per_root_s per root second: a block's difference of the means
    of two windows each has s.d. sigma_1 / sqrt(window s); over n blocks of 4 windows (trial_s =
    4 n window s) that is 2 sigma_1 / sqrt(trial_s). inf for a trial of no length."""
    return z * 2.0 * sd_per_root_s / math.sqrt(trial_s) if trial_s > 0 else math.inf


def trial_s_to_resolve(sd_per_root_s: float, difference: float, z: float = ADOPT_Z) -> float:
    """How long an A-B-B-A trial must run to resolve `difference` (a fraction) at z standard
    errors, the noise sd_per_root_s per root second (`resolvable` turned round), s; inf for no
    difference (or one so small that the time overflows a float)."""
    ratio = z * 2.0 * sd_per_root_s / difference if difference > 0 else math.inf
    return ratio * ratio if ratio < 1e150 else math.inf


@functools.lru_cache(maxsize=64)
def sequential_z(first_block: int, last_block: int, z: float = ADOPT_Z) -> float:
    """The boundary, in standard errors, that a sequential trial judged after each block from
    first_block to last_block must cross to keep the one-sided false rate of a single look at
    z: the same boundary at every look (Pocock's), z itself for one look, 3.42 for blocks 4 to
    12 at z = 3 (judged there at 3, a trial of 9 looks adopts a null candidate 3.7 times as
    often). The blocks' differences are taken as independent and normal with a known spread;
    computed by the recursive numerical integration of Armitage, McPherson and Rowe (1969).

    Args:
        first_block: the first block after which the trial is judged; blocks (>= 1).
        last_block: the last; blocks (>= first_block).
        z: the single look's boundary; sds.
    """
    if not 1 <= first_block <= last_block:
        raise ValueError(
            f"sequential_z: needs 1 <= first_block <= last_block, got {first_block}, {last_block}"
        )
    if first_block == last_block:
        return z
    from scipy import optimize, stats

    looks = range(first_block, last_block + 1)
    step = 0.02  # grid of the blocks' summed differences, in single-block sds
    half = math.ceil(8.0 * math.sqrt(last_block) / step)
    x = step * np.arange(-half, half + 1)
    kernel = stats.norm.pdf(step * np.arange(-math.ceil(8.0 / step), math.ceil(8.0 / step) + 1))

    def false_rate(c: float) -> float:
        rate = float(stats.norm.sf(c))
        density = stats.norm.pdf(x / math.sqrt(first_block)) / math.sqrt(first_block)
        density[x > c * math.sqrt(first_block)] = 0.0  # crossed at the first look
        for k in looks[1:]:
            bound = c * math.sqrt(k)
            rate += step * float(density @ stats.norm.sf(bound - x))  # crosses at look k
            density = step * np.convolve(density, kernel, mode="same")
            density[x > bound] = 0.0
        return rate

    alpha = float(stats.norm.sf(z))
    return float(optimize.brentq(lambda c: false_rate(c) - alpha, z, z + 2.0, xtol=1e-4))


# --- budget -----------------------------------------------------------------------------------
@dataclass
class ScheduleLevel:
    """One schedule's busy step time (the job's waits left out), pooled over every window it
    ran in, each window counted once (a verification that goes on keeps its windows): read
    against the stock estimate, a level unpaired like the account's, which no chain of paired
    time ratios bends (docs/design-step-tuner.md, "The incumbent's own level").

    Attributes:
        busy_sum_s: the windows' busy time, every rank's, s.
        steps: their steps, every rank's; count.
        seconds: their settled seconds, one rank's, s.
    """

    busy_sum_s: float = 0.0
    steps: int = 0
    seconds: float = 0.0

    def add(self, windows: Sequence[Window | PooledWindow], ranks: int = 1) -> None:
        """Count the windows not counted in a level before (`Window.in_level`; `ranks` pooled
        ranks in a pooled window). A window runs one schedule: one level counts it."""
        for w in windows:
            if w.steps and not w.in_level:
                w.in_level = True
                self.busy_sum_s += w.busy_sum_s
                self.steps += w.steps
                self.seconds += w.settled_s / ranks

    @property
    def busy_s(self) -> float:
        """The mean busy step time, s (NaN: no step counted)."""
        return self.busy_sum_s / self.steps if self.steps else math.nan


@dataclass
class StepAccount:
    """Time allowed against the steps' measured time: a step run at stock clocks is allowed
    (1 + budget) x its own time (it is stock); any other step (1 + budget) x the stock
    estimate (`stock_step_s`, refined as stock is measured). A job whose stock steps drift
    (a host that starves the GPU more as it runs) then cannot overdraw the account by
    running stock.

    The other steps' own time varies with the job (a host that starves the GPU inside its
    steps: those steps would have varied alike at stock), so what they would have taken at
    stock is known only to the job's noise over their time: the account holds CONFIDENCE_Z x
    `noise_per_root_s` x sqrt(their seconds) back from the slack and adds it to the slowdown
    it reports (`noise_margin_s`), as the stock estimate's own noise is held back in
    `stock_step_s`.

    Args:
        budget: the largest cumulative slowdown against stock, a fraction (0.01: 1%).
        noise_per_root_s: the job's busy-time noise, the relative s.d. of a 1-s mean (the
            tuner's NoiseMeter; 0 until measured); a fraction.
    """

    budget: float
    noise_per_root_s: float = 0.0
    stock_step_s: float = math.nan
    steps: int = 0
    spent_s: float = 0.0
    at_stock_s: float = 0.0  # the measured time of the steps run at stock, s

    before_allowed_s: float = 0.0  # allowed time of the other steps before the last rebase, s
    before_steps: int = 0
    other_steps: int = 0  # steps not run at stock

    def charge(self, step_s: float, steps: int = 1, *, at_stock: bool = False) -> None:
        """Count `steps` steps of step_s each (a report may stand for several), s; `at_stock`:
        they ran at stock clocks."""
        self.steps += steps
        self.spent_s += step_s * steps
        if at_stock:
            self.at_stock_s += step_s * steps
        else:
            self.other_steps += steps

    def slack_s(self) -> float:
        """Seconds the run may still overspend; infinite before stock is known (it runs stock)."""
        if math.isnan(self.stock_step_s):
            return math.inf
        return (1.0 + self.budget) * self._stock_equivalent_s() - self.spent_s - self.noise_margin_s()

    def noise_margin_s(self) -> float:
        """The one-sided 95% margin of the time the steps not run at stock would have taken at
        stock, given the job's noise: CONFIDENCE_Z x noise_per_root_s x sqrt(their seconds), s."""
        other_s = self.spent_s - self.at_stock_s
        if other_s <= 0.0 or not self.noise_per_root_s > 0.0:
            return 0.0
        return CONFIDENCE_Z * self.noise_per_root_s * math.sqrt(other_s)

    def rebase(self) -> None:
        """Stock is to be measured again (after an alarm): the steps so far keep the allowance
        of the stock they ran against; the next ones are allowed against the new stock."""
        if not math.isnan(self.stock_step_s):
            self.before_allowed_s += (
                (1.0 + self.budget) * self.stock_step_s * (self.other_steps - self.before_steps)
            )
        self.before_steps = self.other_steps
        self.stock_step_s = math.nan

    def slowdown(self) -> float:
        """The run's slowdown against the stock steps it was allowed against, at 95%
        confidence (noise_margin_s added to the time spent)."""
        return (self.spent_s + self.noise_margin_s()) / self._stock_equivalent_s() - 1.0

    def _stock_equivalent_s(self) -> float:
        """What the steps so far would have taken at stock, s."""
        since = self.other_steps - self.before_steps
        stock_s = self.stock_step_s * since if since else 0.0
        return self.before_allowed_s / (1.0 + self.budget) + self.at_stock_s + stock_s


# --- the reference and the judgement -------------------------------------------------------
@dataclass(frozen=True)
class StockFigures:
    """Stock as measured in training by `StockReference`.

    Attributes:
        step_s: the mean stock step time (windows weighted by their steps; a window far off the
            others left out: `_typical`), s.
        busy_s: the same of the busy step time (the job's waits for its host left out), s.
        account_step_s: the stock the budget is counted against: step_s less
            REFERENCE_MARGIN (the reference's noise), s.
        energy_per_step_j: the mean stock energy per step over the same windows, J.
        window_sd: relative s.d. of one window's energy per step (no unit).
        time_sd_per_root_s: relative s.d. of a step time mean over 1 s (no unit).
        segment_times_s: each segment's mean time per step at stock, same windows, s (in its order).
        window_s: the length of the reference's windows, s.
    """

    step_s: float
    account_step_s: float
    busy_s: float
    energy_per_step_j: float
    window_sd: float
    time_sd_per_root_s: float
    segment_times_s: np.ndarray
    window_s: float


@dataclass
class StockReference:
    """Windows of whole steps at stock until at least min_s of steps and three windows, and
    on (up to max_s) while the 95% margin of the stock step time (CONFIDENCE_Z x the windows'
    time noise / sqrt(seconds)) exceeds max_margin: a noisy job measures stock longer. Up to
    fine_max_s, on while it exceeds fine_margin: a quieter job measures stock to a finer
    margin.

    Args:
        schedule: the stock schedule (every segment its own group, no pair).
        window_s: length of one window, s.
        min_s: training at stock measured at least, s.
        max_margin: the largest 95% margin of the stock step time the reference ends with, a
            fraction (inf: end at min_s).
        max_s: training at stock measured at most, s.
        fine_margin: the margin the reference goes on to within fine_max_s, a fraction (inf:
            none).
        fine_max_s: the longest reference that goes on for fine_margin, s.
    """

    schedule: Schedule
    window_s: float = TRIAL_WINDOW_S
    min_s: float = REFERENCE_S
    max_margin: float = math.inf
    max_s: float = REFERENCE_MAX_S
    fine_margin: float = math.inf
    fine_max_s: float = REFERENCE_FINE_MAX_S
    windows: list[Window | PooledWindow] = field(default_factory=list)
    current: Window | PooledWindow | None = None
    seconds: float = 0.0

    def add(self, report: Feed) -> bool:
        """Count a step run at stock (one rank's report, or every rank's); True once the
        reference is complete."""
        if self.current is None:
            now_s = report.end_s if isinstance(report, StepReport) else [r.end_s for r in report]
            self.current = open_window(self.schedule, self.window_s, 0.0, now_s)
        self.seconds += feed_step_s(report)
        closed = self.current.add(report)
        if closed:
            self.windows.append(self.current)
            self.current = None
        if self.seconds < self.min_s or len(self.windows) < 3:
            return False
        if self.seconds >= max(self.max_s, self.min_s) or math.isinf(self.max_margin):
            return True
        if not closed:
            return False
        margin = self.margin()
        return margin <= self.max_margin and (margin <= self.fine_margin or self.seconds >= self.fine_max_s)

    def margin(self) -> float:
        """The 95% margin of the mean stock step time so far, a fraction of it: the job's
        time noise as NoiseMeter reads it from consecutive windows (robust: a few stalled
        steps do not set it) over the seconds measured."""
        meter = NoiseMeter()
        meter.add_pairs(self.pairs())
        settled_s = sum(float(np.mean(w.rank_settled_s)) for w in self.windows)
        return CONFIDENCE_Z * meter.time_sd_per_root_s / math.sqrt(max(settled_s, 1e-9))

    def figures(self) -> StockFigures:
        windows = self.windows
        steps = np.array([w.step_s for w in windows])
        weights = np.array([w.steps for w in windows], dtype=float)
        # a window far off the others (a stalled step: a 160-ms pause of the host) is left out
        # of the stock figures; the spreads keep it, so it makes the tuner more cautious, never
        # bolder. Not the median: a window's figures are skewed, and the median's bias broke
        # the simulated dry-run null tests (tests/tuner/test_tune_cli.py).
        kept = _typical(steps)
        stock_s = float(np.average(steps[kept], weights=weights[kept]))
        # the spread of one rank's windows about its own mean; a pooled window's mean is
        # sqrt(ranks) tighter (ranks may differ a little in level: it cancels in a trial)
        measured_j = rank_energy = np.array([w.rank_energies_j for w in windows])  # windows x ranks
        # the spread at the windows' mean wait for the host (NoiseMeter.wait_power_w): a
        # trial's blocks are judged so (Trial's wait_power_w)
        meter = NoiseMeter()
        meter.add_pairs(self.pairs())
        wait_power_w = meter.wait_power_w
        if wait_power_w > 0.0:
            waits = [w.rank_waits for w in windows]  # windows x ranks x (wait, step)
            rank_energy = np.array(
                [
                    _at_mean_wait(rank_energy[:, r], [w[r][0] for w in waits], wait_power_w)
                    for r in range(rank_energy.shape[1])
                ]
            ).T
        rank_steps = np.array([w.rank_steps_s for w in windows])
        mean_window_s = float(np.mean([w.rank_settled_s for w in windows]))
        busy = np.array([w.busy_s for w in windows])
        return StockFigures(
            step_s=stock_s,
            account_step_s=stock_s * (1.0 - REFERENCE_MARGIN),
            busy_s=float(np.average(busy[kept], weights=weights[kept])),
            energy_per_step_j=float(np.mean(measured_j[kept])),
            window_sd=_rank_sd(rank_energy) / math.sqrt(rank_energy.shape[1]),
            time_sd_per_root_s=max(_rank_sd(rank_steps) * math.sqrt(mean_window_s), 1e-4),
            segment_times_s=np.average(
                [w.group_times_s for w, k in zip(windows, kept) if k], axis=0, weights=weights[kept]
            ),
            window_s=self.window_s,
        )

    def pairs(self) -> list[tuple[float, float, float, float, float]]:
        """Consecutive windows as pairs of one schedule (NoiseMeter.add_pairs), each rank's."""
        return [p for x, y in itertools.pairwise(self.windows) for p in window_pairs(x, y)]


def _rank_sd(values: np.ndarray) -> float:
    """The relative s.d. of one rank's windows (windows x ranks), each rank about its own mean."""
    return float(np.sqrt(np.mean(np.var(values / values.mean(axis=0), axis=0, ddof=1))))


def _typical(values: np.ndarray) -> np.ndarray:
    """Which values lie within max(OUTLIER_MADS scaled median absolute deviations,
    OUTLIER_FLOOR x the median) of their median: near-equal values all stay."""
    median = float(np.median(values))
    mad = 1.4826 * float(np.median(np.abs(values - median)))
    return np.abs(values - median) <= max(OUTLIER_MADS * mad, OUTLIER_FLOOR * abs(median))


@dataclass(frozen=True)
class Judgement:
    """A trial's candidate (B) judged against stock and the budget.

    Attributes:
        saving: B's step energy below the incumbent's, a fraction of the incumbent's (NaN
            when no block completed).
        saving_se: its standard error: the blocks' own, no less than the reference's window
            noise predicts (no unit).
        slowdown: B's step time against the account's stock, a fraction (from the blocks'
            time difference; from B's own steps when no block completed; NaN when none ran).
        time_se: the standard error of the blocks' time difference (no unit).
        energy_ratio: B's step energy / stock's (NaN when no block completed).
        adopted: the saving exceeds ADOPT_Z standard errors and the slowdown, ADOPT_Z time
            errors added, is within the budget (never for an abandoned trial or under two blocks).
        time_diff: B's step time against the incumbent's beside it, the blocks' own ratio less
            one, a fraction (what time_se is the error of; NaN when no block completed).
    """

    saving: float
    saving_se: float
    slowdown: float
    time_se: float
    energy_ratio: float
    adopted: bool
    time_diff: float


def judge(
    outcome: Outcome,
    stock: StockFigures,
    *,
    incumbent_step_s: float,
    incumbent_energy_j: float,
    budget: float,
    window_s: float,
    noise: NoiseMeter | None = None,
    account_step_s: float | None = None,
    ranks: int = 1,
    z: float = ADOPT_Z,
    time_z: float | None = None,
) -> Judgement:
    """The judgement of a trial whose windows were window_s long, against the incumbent it ran
    beside (its measured step time, s, and energy per step, J) and the measured stock. Its
    standard errors are no smaller than the job's noise predicts (the reference's window
    noise; the NoiseMeter's, when given, kept up to date over the run; `ranks` pooled ranks
    give ranks energy samples a block); the slowdown is against account_step_s (the account's
    stock at 95% confidence; default the reference's); adopted at z standard errors of saving
    and with the slowdown, time_z time errors added (None: z), within the budget."""
    blocks = max(outcome.blocks, 1)
    predicted_se = stock.window_sd * math.sqrt(stock.window_s / window_s) / math.sqrt(blocks)
    predicted_tse = 0.0
    if noise is not None and noise.samples >= 2:
        meter_se = noise.energy_sd_per_root_s / math.sqrt(window_s * blocks * ranks)
        # once the job's wait power is fitted, the meter's noise (windows moved to a common
        # wait) replaces the reference's, which a long wait in one window may have set
        predicted_se = meter_se if noise.wait_power_w > 0.0 else max(predicted_se, meter_se)
        predicted_tse = noise.time_sd_per_root_s / math.sqrt(window_s * blocks)
    se = max(outcome.energy_se, predicted_se)
    time_se = max(outcome.time_se, predicted_tse)
    saving = -outcome.energy_diff
    stock_s = stock.account_step_s if account_step_s is None else account_step_s
    if outcome.blocks > 0:
        slowdown = (incumbent_step_s * (1.0 + outcome.time_diff)) / stock_s - 1.0
    else:
        slowdown = outcome.b_step_s / stock_s - 1.0
    adopted = (
        not outcome.abandoned
        and outcome.blocks >= 2
        and saving > z * se
        and slowdown + (z if time_z is None else time_z) * time_se <= budget
    )
    energy_ratio = incumbent_energy_j * (1.0 - saving) / stock.energy_per_step_j
    time_diff = outcome.time_diff if outcome.blocks > 0 else math.nan
    return Judgement(saving, se, slowdown, time_se, energy_ratio, bool(adopted), time_diff)
