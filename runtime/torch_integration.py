"""Clocks applied to a live PyTorch training loop: the controller thread and the user API.

```python
workload = discover_workload(train_step, model=model, optimizer=opt)
with KdvfsTrainer(device, workload, plan_or_schedule, model=model, optimizer=opt, out_dir="run") as tuner:
    for batch in data:
        with tuner.step():
            train_step(batch)
```

- where clocks change: `place_schedule` / `Placement`, `site_schedule`, `schedule_from_plan`;
- what is measured: `StepRecord`, `EnergyWindow`, `ClockRequest`;
- `ClockController`: the thread that follows the GPU through each step's sites;
- `KdvfsTrainer`: the user-facing wrapper; `lightning_callback` / `hf_callback` drive it (or a
  kdvfs.tune session, which tunes); given a StepController, the controller feeds it a
  StepReport each step (runtime/step_feed.py).
How it follows the GPU without slowing it, measures and stays safe: docs/design-runtime.md.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from kdvfs.runtime import clock_lease
from kdvfs.runtime.counter_process import open_poller
from kdvfs.runtime.device import Device, RunnableDevice
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.step_feed import COUNTER_POLL_S, site_groups
from kdvfs.runtime.steps import StepController, StepReport
from kdvfs.runtime.torch_discovery import STEP_SITE, StepSites, workload_sites
from kdvfs.runtime.types import ClockPair, KdvfsError, Workload

log = logging.getLogger(__name__)

DEFAULT_WINDOW_STEPS = 50
"""Training steps per energy-counter window (choose windows of a second or more)."""
RECORDS_FILE = "kdvfs_records.json"
"""File name of the step records a trainer writes into its out_dir."""
PLAN_FILE = "kdvfs_plan.json"
"""File name of the plan a trainer writes beside its records."""
ANSWERS_KEPT = 10_000
"""The tuner's answer times kept (the last ones; total and maximum cover all), answers."""


# --- where the clocks change -------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """A schedule placed on a step's sites.

    requests: (site index, pair or None for stock) for each site followed by kernels;
    moved: kernels that start a schedule group inside a site's segment (they run at the
    clocks of that segment's first kernel instead).
    """

    sites: tuple[str, ...]
    requests: tuple[tuple[int, ClockPair | None], ...]
    moved: tuple[str, ...]


def place_schedule(workload: Workload, schedule: Schedule) -> Placement:
    sites, kernel_sites = workload_sites(workload)
    pairs = schedule.pair_per_kernel(len(workload))
    starts = {start for start, _ in schedule.groups}
    requests: list[tuple[int, ClockPair | None]] = []
    moved: list[str] = []
    for k, site in enumerate(kernel_sites):
        if k == 0 or kernel_sites[k - 1] != site:
            requests.append((site, pairs[k]))
        elif k in starts and pairs[k] != pairs[k - 1]:
            moved.append(workload.kernels[k].name)
    return Placement(sites, tuple(requests), tuple(moved))


def site_schedule(workload: Workload, pairs: Mapping[str, ClockPair | None]) -> Schedule:
    """A schedule that changes clocks only at sites: the kernels after each named site run at
    its pair (None: stock); a site not named keeps the clocks before it (stock at first)."""
    sites, kernel_sites = workload_sites(workload)
    unknown = sorted(set(pairs) - set(sites))
    if unknown:
        raise KdvfsError(f"workload {workload.name!r} has no site {unknown[0]!r} (sites: {', '.join(sites)})")
    groups: list[tuple[int, ClockPair | None]] = []
    current: ClockPair | None = None
    for k, site in enumerate(kernel_sites):
        if k == 0 or kernel_sites[k - 1] != site:
            current = pairs.get(sites[site], current)
        if not groups or groups[-1][1] != current:
            groups.append((k, current))
    return Schedule(tuple(groups))


class PlanGroupLike(Protocol):
    kernels: tuple[str, ...]

    @property
    def pair(self) -> ClockPair | None: ...


class PlanLike(Protocol):
    """What the integration needs of a plan (tuner.plan.Plan; runtime/ does not import tuner/)."""

    workload_signature: str
    groups: Sequence[PlanGroupLike]

    def to_dict(self) -> dict[str, Any]: ...


def schedule_from_plan(plan: PlanLike, workload: Workload) -> Schedule:
    """The schedule of a plan made for this workload (check the GPU and grid with
    tuner.plan.check_compatible)."""
    if plan.workload_signature != workload.signature:
        raise KdvfsError(
            f"plan is for workload signature {plan.workload_signature}, not {workload.name!r} ({workload.signature})"
        )
    index = {k.name: i for i, k in enumerate(workload.kernels)}
    return Schedule(tuple((index[g.kernels[0]], g.pair) for g in plan.groups))


# --- what the controller measured --------------------------------------------------------
@dataclass(frozen=True)
class StepRecord:
    """One training step: GPU time from its start to the next step's start (the job's whole
    step; the last step: to its end), CPU: wall time; its share of its window's energy, and
    the clock requests made while the GPU ran it."""

    step: int
    time_s: float
    energy_j: float
    window: int
    requests: int


@dataclass(frozen=True)
class EnergyWindow:
    """Energy counter difference over consecutive steps, read as the GPU reached their ends.
    partial: the last window of a run, shorter than window_steps."""

    index: int
    first_step: int
    steps: int
    energy_j: float
    wall_s: float
    gpu_time_s: float
    partial: bool

    @property
    def energy_per_step_j(self) -> float:
        return self.energy_j / self.steps


@dataclass(frozen=True)
class ClockRequest:
    """A clock request the controller made: at which step and site, which pair (None:
    stock), when (time.time())."""

    step: int
    site: str
    pair: ClockPair | None
    time_s: float


class _CpuStamp:
    """A host time stamp: the CPU fallback of a CUDA event (reached when taken)."""

    __slots__ = ("t",)

    def __init__(self, timing: bool) -> None:
        self.t = time.monotonic()

    def wait(self) -> None:
        return None

    def reached_s(self, waited_s: float) -> float | None:
        """Host time (time.monotonic) at which it was reached: when it was taken."""
        return self.t

    def seconds_since(self, earlier: _CpuStamp) -> float:
        return self.t - earlier.t


class _CudaStamp:
    """A CUDA event recorded on the current stream; waiting on it sleeps (blocking sync)."""

    __slots__ = ("_pending", "event")

    def __init__(self, timing: bool) -> None:
        self.event = torch.cuda.Event(enable_timing=timing, blocking=True)
        self.event.record()
        self._pending = False

    def wait(self) -> None:
        # synchronize() gives up the GIL, which a host-bound training thread then has to hand
        # back; an event already reached needs no wait (query() keeps the GIL)
        if not self.event.query():
            self.event.synchronize()

    def reached_s(self, waited_s: float) -> float | None:
        """Host time at which the GPU reached it, where known: the end of a wait that began
        before it was reached (waited_s), else None."""
        return waited_s if self._pending else None

    def pending(self) -> None:
        """Note whether the GPU has yet to reach it (before a wait)."""
        self._pending = not self.event.query()

    def seconds_since(self, earlier: _CudaStamp) -> float:
        return earlier.event.elapsed_time(self.event) / 1e3


_UNSET = object()


class ClockController:
    """The thread that follows the GPU through each step's sites and applies the schedule.

    The training thread calls begin_step(), site(name) (from hooks) and end_step(); none of
    them waits for the GPU. The controller's own thread does the waiting, the clock
    requests and the energy reads. A step lasts from its start to the next step's start
    (what the job does between end_step() and the next begin_step() is its step's too); it
    is closed, recorded and reported when the GPU reaches the next start. A site fired again
    inside its step (micro-batches, an evaluation) is passed over. A step whose sites differ
    from the workload's (another code path) requests no clocks from the first difference on,
    nor does any step after it until one has matched again: the clocks in effect stay. It is
    listed in mismatched_steps, as is a step that ends before all the workload's sites fired.

    Each wake of this thread takes the GIL from a training thread that is busy on the host,
    which costs that thread more than the wake's own work (experiments/tune_overhead.py). So a
    step's start wakes it as it is marked, the step's other marks only where one of them may
    request clocks (the schedule changes clocks after the step's start) or the device runs
    kernels itself; otherwise they wait, in order, for the next wake.

    Args:
        device: where the clocks are requested.
        workload: the step's kernels and the sites they follow (discover_workload).
        schedule: the clock groups to apply; every pair must be in the device's grid.
        dry_run: refuse a device that would change a real card's clocks.
        window_steps: training steps per energy-counter window.
        tuner: answers each step's StepReport with the schedule of the next steps (a
            tuner.step_tuner.StepTuner); None: the schedule stays. With a tuner, every site
            is timed and the counter is polled aside (counter_process.open_poller: on a thread
            of its own, or with $KDVFS_COUNTER_POLLER=process in a process of its own).
        poll_s: least time between the starts of two counter reads of the poller, s.
    """

    def __init__(
        self,
        device: Device,
        workload: Workload,
        schedule: Schedule,
        *,
        dry_run: bool = True,
        window_steps: int = DEFAULT_WINDOW_STEPS,
        tuner: StepController | None = None,
        poll_s: float = COUNTER_POLL_S,
    ) -> None:
        if dry_run and device.source == "measured" and not getattr(device, "dry_run", False):
            raise KdvfsError(
                f"{device.name}: this device would change the card's clocks but the controller is in dry-run mode; "
                "open the device with dry_run=True, or pass dry_run=False to let kdvfs change clocks"
            )
        if window_steps < 1:
            raise KdvfsError(f"window_steps must be >= 1, got {window_steps}")
        off_grid = [p for _, p in schedule.groups if p is not None and p not in device.grid]
        if off_grid:
            raise KdvfsError(f"{device.name}: schedule pair {off_grid[0]} is not a supported clock pair")
        self.device = device
        self.workload = workload
        self.window_steps = window_steps
        self.placement = place_schedule(workload, schedule)
        _, kernel_sites = workload_sites(workload)
        self._segments = [
            [k for k, s in zip(workload.kernels, kernel_sites) if s == i]
            for i in range(len(self.placement.sites))
        ]
        self._site_pair = dict(self.placement.requests)
        self._kernel_sites = kernel_sites
        self.schedule = schedule
        self.tuner = tuner
        self.tuner_error: BaseException | None = None
        self.answer_s: deque[float] = deque(maxlen=ANSWERS_KEPT)
        """Seconds the tuner took to answer each of the last ANSWERS_KEPT reports (this thread)."""
        self.answer_total_s = 0.0
        self.answer_max_s = 0.0
        self._next: Schedule | None = None  # the tuner's answer, applied from the next step
        self.poller = open_poller(device, poll_s) if tuner is not None else None
        """The energy counter's poller (None without a tuner); its figures() say what polling cost."""
        self._site_groups = site_groups(schedule, kernel_sites, len(self.placement.sites))
        self._site_stamps: list[Any] = []
        self._anchor: tuple[Any, float] | None = None  # (stamp, host time the GPU reached it)
        self._shares: list[float] | None = None  # each group's share of the last matched step
        self._runnable = isinstance(device, RunnableDevice)
        self._stamp = _CudaStamp if torch.cuda.is_available() else _CpuStamp
        # the marks, in order (None: stop), and one token for each mark that wakes the thread
        self._marks: deque[tuple[str, int, str, Any] | None] = deque()
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._attentive = True  # site and end marks wake the thread (the step may request clocks)
        self._lock = threading.Lock()
        self._halted = False
        self._thread = threading.Thread(target=self._follow, name="kdvfs-clock-controller", daemon=True)
        # training-thread side
        self._step = -1
        self._open = False
        # controller-thread side
        self._requested: object = _UNSET
        self._site_index = 0
        self._mismatch = False
        self._begin: Any = None
        self._requests_in_step = 0
        self._fired: set[str] = set()  # the sites the current step has fired
        self._ended: tuple[int, Any] | None = None  # the step that ended, closed at the next start
        self._probation = False  # a step mismatched: no requests until a step matches again
        self.repeated_sites = 0
        """Sites that fired again inside their step (passed over: micro-batches, evaluation)."""
        self._pending: list[tuple[int, float, int]] = []
        # energy counter reads at window boundaries, on their own thread (an NVML read takes
        # ~4 ms on an H200: on this thread it would delay the clock requests behind it):
        # (reading, when asked, the steps of the window that ends there, partial)
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kdvfs-energy")
        self._reads: list[tuple[Future[float], float, list[tuple[int, float, int]], bool]] = []
        self.requests: list[ClockRequest] = []
        self.records: list[StepRecord] = []
        self.windows: list[EnergyWindow] = []
        self.mismatched_steps: list[int] = []
        self.error: BaseException | None = None

    # --- life cycle -----------------------------------------------------------------------
    def start(self) -> None:
        # registered before the device's own restore (taken at its first lock, which this
        # controller makes), so a signal halts the controller first, then resets the card
        clock_lease.hold(self, self.halt)
        if self.poller is not None:
            self.poller.start()
        self._thread.start()

    def halt(self) -> None:
        """Request no clocks from now on (returns once any request in flight is done)."""
        with self._lock:
            self._halted = True

    def stop(self) -> None:
        """Let the thread work through what is queued (waits for the GPU to get there), close
        the last energy window, end the thread."""
        if self._thread.is_alive():
            self._post(None, wake=True)
            self._thread.join()
        if self.poller is not None:
            self.poller.stop()
        clock_lease.let_go(self)

    @property
    def halted(self) -> bool:
        """Whether halt() came: no clocks are requested any more."""
        return self._halted

    @property
    def running(self) -> bool:
        """Whether the controller's thread is still following the steps."""
        return self._thread.is_alive()

    @property
    def requested_clocks(self) -> bool:
        """Whether any pair was requested (so stock clocks must be restored)."""
        return any(r.pair is not None for r in self.requests)

    # --- training thread ------------------------------------------------------------------
    def begin_step(self) -> int:
        """Open a step (a no-op while one is open); returns its number."""
        self.raise_error()
        if not self._open:
            self._step += 1
            self._open = True
            self._post(("begin", self._step, STEP_SITE, self._stamp(True)), wake=True)
        return self._step

    def site(self, name: str) -> None:
        if self._open:
            self._post(("site", self._step, name, self._stamp(self.tuner is not None)), wake=False)

    def end_step(self) -> None:
        if self._open:
            self._open = False
            self._post(("end", self._step, "", self._stamp(True)), wake=False)
        self.raise_error()

    def _post(self, mark: tuple[str, int, str, Any] | None, *, wake: bool) -> None:
        """Queue a mark; wake the controller for it when asked to or while it is attentive.
        (The mark is queued before the flag is read, and the controller sets the flag before
        it looks for marks: no mark that should wake it is left waiting.)"""
        self._marks.append(mark)
        if wake or self._attentive:
            self._wake.put(None)

    def raise_error(self) -> None:
        if self.error is not None:
            raise KdvfsError(
                f"kdvfs clock controller failed: {type(self.error).__name__}: {self.error}"
            ) from self.error

    # --- controller thread ----------------------------------------------------------------
    def _next_mark(self) -> tuple[str, int, str, Any] | None:
        """The next mark, in order; asleep until a wake while there is none."""
        while not self._marks:
            self._wake.get()
        return self._marks.popleft()

    def _follow(self) -> None:
        while (mark := self._next_mark()) is not None:
            if self.error is not None:
                continue  # drain: the training thread raises at its next step
            kind, step, name, stamp = mark
            try:
                if kind == "begin" and self.tuner is not None:
                    self._anchor_at(stamp)
                else:
                    stamp.wait()
                self._on_mark(kind, step, name, stamp)
            except Exception as exc:
                self.error = exc
                self.halt()
        try:
            if self.error is None:
                self._finish(None)  # the last step ends at its end mark: no next step starts
                if self._pending:
                    self._boundary(partial=True)
                self._settle(block=True)
        except Exception as exc:
            self.error = exc
        finally:
            self._reader.shutdown()

    def _on_mark(self, kind: str, step: int, name: str, stamp: Any) -> None:
        if kind == "begin":
            if not self._reads:
                self._boundary(partial=False)  # the first window opens
            self._finish(stamp)  # the step before ends where this one starts
            if self._next is not None:
                self._apply(self._next)
            self._site_index, self._mismatch, self._begin, self._requests_in_step = 0, False, stamp, 0
            self._site_stamps, self._fired, self._ended = [stamp], {name}, None
            if not self.placement.sites or self.placement.sites[0] != name:
                self._mismatched(step)
            elif 0 in self._site_pair:
                self._request(step, name, self._site_pair[0])
            self._attentive = self._runnable or self._requests_ahead()
        elif kind == "site":
            self._at_site(step, name, stamp)
        else:
            self._run_segment(self._site_index)
            if not self._mismatch and self._site_index != len(self.placement.sites) - 1:
                self._mismatched(step)  # a site the workload has did not fire
            elif not self._mismatch:
                self._probation = False  # a step matched: the next one requests its clocks again
            self._ended = (step, stamp)

    def _at_site(self, step: int, name: str, stamp: Any) -> None:
        """A site fired: the next one the workload expects moves the step on (and requests its
        pair); one already fired in this step (a second micro-batch, an evaluation inside the
        step) is passed over, its time staying with the segment it ran in; any other site
        mismatches the step."""
        if self._mismatch:
            return
        sites, following = self.placement.sites, self._site_index + 1
        if following < len(sites) and sites[following] == name:
            self._run_segment(self._site_index)
            self._site_index = following
            self._site_stamps.append(stamp)
            self._fired.add(name)
            if following in self._site_pair:
                self._request(step, name, self._site_pair[following])
        elif name in self._fired:
            self.repeated_sites += 1
        else:
            self._mismatched(step)

    def _requests_ahead(self) -> bool:
        """Whether a site after the step's start may request clocks: one whose pair differs
        from the pair in effect (none can while on probation or halted)."""
        if self._probation or self._halted:
            return False
        return any(pair != self._requested for site, pair in self._site_pair.items() if site > 0)

    def _mismatched(self, step: int) -> None:
        """The step's sites are not the workload's (another code path): from here on nothing
        is requested, and the clocks in effect stay, until a whole step has matched again (a
        job whose steps always mismatch makes no clock request after its first such step)."""
        self._mismatch = True
        self._probation = True
        self.mismatched_steps.append(step)

    def _finish(self, boundary: Any) -> None:
        """Close the step that ended last: it lasts from its start to boundary, the next
        step's start (the job's whole step: the time between its end and the next start,
        input and logging, is the job's too); None: to its own end mark (the last step)."""
        if self._ended is None:
            return
        step, end = self._ended
        self._ended = None
        boundary = end if boundary is None else boundary
        step_s = boundary.seconds_since(self._begin)
        self._pending.append((step, step_s, self._requests_in_step))
        if len(self._pending) >= self.window_steps:
            self._boundary(partial=False)
        if self.tuner is not None:
            # the GPU between the step's end mark and the next start: waiting for the host (a
            # late batch, logging, an evaluation), the job's time which the clocks do not set
            wait_s = max(0.0, boundary.seconds_since(end)) if boundary is not end else 0.0
            self._report(step, boundary, step_s, min(wait_s, step_s))

    def _anchor_at(self, mark: Any) -> None:
        """Wait for a step's start; where the host time the GPU reached it is known, it becomes
        the anchor that maps GPU event times to host times (the counter's clock)."""
        if hasattr(mark, "pending"):
            mark.pending()
        mark.wait()
        reached_s = mark.reached_s(time.monotonic())
        if reached_s is not None or self._anchor is None:
            self._anchor = (mark, time.monotonic() if reached_s is None else reached_s)

    def _report(self, step: int, end: Any, step_s: float, wait_s: float = 0.0) -> None:
        """The step's StepReport to the tuner; its answer runs from the next step on. A tuner
        that fails is logged and dropped: training goes on at stock clocks."""
        anchor, anchor_s = self._anchor
        end_s = anchor_s + end.seconds_since(anchor)
        sensors = self.poller.sensors()
        report = StepReport(
            step=step,
            end_s=end_s,
            step_time_s=step_s,
            group_times_s=self._group_times(end, step_s),
            counter_readings=self.poller.take(end_s),
            temperature_c=sensors.temperature_c,
            throttle_reasons=sensors.throttle_reasons,
            power_limit_w=sensors.power_limit_w,
            wait_s=wait_s,
            sm_clock_mhz=sensors.sm_clock_mhz,
        )
        started = time.perf_counter()
        try:
            answer = self.tuner.on_step_end(report)
        except Exception as exc:
            log.error("kdvfs: the tuner failed (%s: %s); stock clocks from now on", type(exc).__name__, exc)
            self.tuner, self.tuner_error = None, exc
            answer = self.schedule.at_stock()
        answer_s = time.perf_counter() - started
        self.answer_s.append(answer_s)
        self.answer_total_s += answer_s
        self.answer_max_s = max(self.answer_max_s, answer_s)
        if answer != self.schedule:
            self._next = answer

    def _group_times(self, end: Any, step_s: float) -> tuple[float, ...]:
        """Each group's time in this step, from its sites' events; a step whose sites did not
        match the workload's, split as the last matched step was."""
        groups = len(self.schedule.groups)
        if groups == 1:  # the whole step, whatever its sites' times (no GPU timings read)
            return (step_s,)
        if not self._mismatch:
            stamps = [*self._site_stamps, end]
            times = [0.0] * groups
            for site, (a, b) in enumerate(itertools.pairwise(stamps)):
                times[self._site_groups[site]] += b.seconds_since(a)
            total = sum(times)
            self._shares = [t / total for t in times] if total > 0 else None
        shares = self._shares or [1.0 / groups] * groups
        return tuple(share * step_s for share in shares)

    def _apply(self, schedule: Schedule) -> None:
        """The tuner's schedule from this step on (its pairs are the device's)."""
        off_grid = [p for _, p in schedule.groups if p is not None and p not in self.device.grid]
        if off_grid:
            raise KdvfsError(
                f"{self.device.name}: the tuner asked for {off_grid[0]}, not a supported clock pair"
            )
        self._next = None
        self.schedule = schedule
        self.placement = place_schedule(self.workload, schedule)
        self._site_pair = dict(self.placement.requests)
        self._site_groups = site_groups(schedule, self._kernel_sites, len(self.placement.sites))
        self._shares = None

    def _run_segment(self, index: int) -> None:
        """A device that runs kernels itself runs the segment the GPU just passed."""
        if self._runnable and not self._mismatch:
            for kernel in self._segments[index]:
                self.device.run(kernel, kernel.launches)

    def _request(self, step: int, site: str, pair: ClockPair | None) -> None:
        if pair == self._requested or self._probation:
            return
        with self._lock:
            if self._halted:
                return
            if pair is None:
                self.device.reset_clocks()
            else:
                self.device.set_clocks(pair)
            self._requested = pair
            self._requests_in_step += 1
            self.requests.append(ClockRequest(step, site, pair, time.time()))

    def _boundary(self, *, partial: bool) -> None:
        """A window boundary, as the GPU reaches it: ask for a counter reading, close the
        windows whose readings have come."""
        self._reads.append(
            (self._reader.submit(self.device.energy_j), time.monotonic(), self._pending, partial)
        )
        self._pending = []
        self._settle(block=False)

    def _settle(self, *, block: bool) -> None:
        while len(self._reads) >= 2 and (block or self._reads[1][0].done()):
            (start_j, start_t, _, _), (end_j, end_t, steps, partial) = self._reads[0], self._reads[1]
            window = EnergyWindow(
                index=len(self.windows),
                first_step=steps[0][0],
                steps=len(steps),
                energy_j=float(end_j.result() - start_j.result()),
                wall_s=end_t - start_t,
                gpu_time_s=sum(t for _, t, _ in steps),
                partial=partial,
            )
            self.windows.append(window)
            self.records.extend(
                StepRecord(s, t, window.energy_per_step_j, window.index, n) for s, t, n in steps
            )
            self._reads.pop(0)


# --- the user-facing wrapper ---------------------------------------------------------------
class KdvfsTrainer:
    """A training loop under a clock schedule: `with tuner.step(): ...` around each step.

    Use as a context manager or call close().

    Args:
        device: where the clocks are requested.
        workload: the step's kernels and sites (discover_workload).
        schedule: a Schedule, or a plan (tuner.plan.Plan) whose schedule is used and which is
            saved with the records.
        model, optimizer: what the workload's sites hook (as given to discover_workload);
            they may come later through attach() (the callbacks do).
        window_steps: training steps per energy-counter window.
        out_dir: where close() writes kdvfs_records.json (and kdvfs_plan.json); None: nowhere.
        dry_run: refuse a device that would change a real card's clocks (the default).
        tuner: answers each step's report with the next steps' schedule (ClockController);
            kdvfs.tune builds one.
        poll_s: least time between the starts of two energy-counter reads while a tuner is fed, s.
    """

    def __init__(
        self,
        device: Device,
        workload: Workload,
        schedule: Schedule | PlanLike,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        window_steps: int = DEFAULT_WINDOW_STEPS,
        out_dir: Path | str | None = None,
        dry_run: bool = True,
        tuner: StepController | None = None,
        poll_s: float = COUNTER_POLL_S,
    ) -> None:
        self.plan = None if isinstance(schedule, Schedule) else schedule
        plan_schedule = schedule if isinstance(schedule, Schedule) else schedule_from_plan(schedule, workload)
        self.controller = ClockController(
            device,
            workload,
            plan_schedule,
            dry_run=dry_run,
            window_steps=window_steps,
            tuner=tuner,
            poll_s=poll_s,
        )
        self.device = device
        self.workload = workload
        self.model = model
        self.optimizer = optimizer
        self.out_dir = None if out_dir is None else Path(out_dir)
        self._hooks: StepSites | None = None
        self._closed = False
        self.controller.start()

    def __enter__(self) -> KdvfsTrainer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.close(failed=exc_type is not None)

    def attach(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        caller_sites: Sequence[str] = (),
    ) -> None:
        """Hook the workload's sites into this model and optimizer (those given replace the
        ones given before); caller_sites: sites the caller fires itself with site()."""
        self.model = model if model is not None else self.model
        self.optimizer = optimizer if optimizer is not None else self.optimizer
        if self._hooks is not None:
            self._hooks.detach()
        hooked = [s for s in self.controller.placement.sites if s not in caller_sites]
        # hook only what fires a hooked site (a model whose sites the caller fires stays unhooked)
        model_sites = any(s in ("forward", "backward") or s.startswith("module:") for s in hooked)
        self._hooks = StepSites.for_sites(
            hooked,
            self.model if model_sites else None,
            self.optimizer if "optimizer" in hooked else None,
        )
        self._hooks.attach(self.controller.site)

    def site(self, name: str) -> None:
        """Fire a site from the caller's own code (one given as caller_sites to attach())."""
        self.controller.site(name)

    @contextmanager
    def step(self) -> Iterator[int]:
        """One training step; yields its number. An exception inside stops the controller and
        restores stock clocks (close(failed=True)) before it propagates."""
        number = self.begin_step()
        try:
            yield number
        except BaseException:
            self.close(failed=True)
            raise
        self.end_step()

    def begin_step(self) -> int:
        if self._closed:
            raise KdvfsError("KdvfsTrainer is closed")
        if self._hooks is None:
            self.attach()
        return self.controller.begin_step()

    def end_step(self) -> None:
        self.controller.end_step()

    @property
    def records(self) -> list[StepRecord]:
        """Steps whose energy window has closed (all of them after close())."""
        return list(self.controller.records)

    @property
    def windows(self) -> list[EnergyWindow]:
        return list(self.controller.windows)

    def energy_per_step_j(self) -> float | None:
        """Mean energy per step over the full windows (all windows if none is full)."""
        windows = [w for w in self.windows if not w.partial] or self.windows
        steps = sum(w.steps for w in windows)
        return sum(w.energy_j for w in windows) / steps if steps else None

    def close(self, *, failed: bool = False) -> None:
        """Stop the controller, restore stock clocks, save records (and the plan). failed:
        halt first, so nothing queued changes clocks any more. Raises the controller's error
        after a normal run."""
        if self._closed:
            return
        self._closed = True
        if self._hooks is not None:
            self._hooks.detach()
        if failed:
            self.controller.halt()
        try:
            self.controller.stop()
        finally:
            if self.controller.requested_clocks:
                self.device.reset_clocks()
        if self.out_dir is not None:
            self.save(self.out_dir)
        if not failed:
            self.controller.raise_error()

    def save(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        c = self.controller
        doc = {
            "device": {"name": self.device.name, "source": self.device.source},
            "workload": {
                "name": self.workload.name,
                "signature": self.workload.signature,
                "kernels": len(self.workload),
            },
            "sites": list(c.placement.sites),
            "site_requests": [[c.placement.sites[i], _pair(p)] for i, p in c.placement.requests],
            "moved_group_starts": list(c.placement.moved),
            "window_steps": c.window_steps,
            "energy_per_step_j": self.energy_per_step_j(),
            "steps": [asdict(r) for r in c.records],
            "windows": [asdict(w) for w in c.windows],
            "requests": [[r.step, r.site, _pair(r.pair), r.time_s] for r in c.requests],
            "mismatched_steps": c.mismatched_steps,
            "error": None if c.error is None else f"{type(c.error).__name__}: {c.error}",
        }
        (out_dir / RECORDS_FILE).write_text(json.dumps(doc, indent=1) + "\n")
        if self.plan is not None:
            (out_dir / PLAN_FILE).write_text(json.dumps(self.plan.to_dict(), indent=2) + "\n")


def _pair(pair: ClockPair | None) -> list[int] | None:
    return None if pair is None else pair.as_list()


# --- framework callbacks ----------------------------------------------------------------------
#: The sites a Lightning step fires from Lightning's own hooks, whatever the module calls.
LIGHTNING_SITES = ("forward", "backward", "optimizer")


class LightningHooks:
    """PyTorch Lightning Callback hooks (documented names and signatures) that drive a
    KdvfsTrainer: a step from on_train_batch_start to the on_train_batch_end of the batch
    whose optimizer step ran (with gradient accumulation, all its micro-batches).

    Every site fires from a Lightning hook, none from the module: "forward" as the batch
    starts (Lightning calls training_step next; a LightningModule's training_step often
    calls an inner model, never its own forward, so a forward hook on it would not fire),
    "backward" from on_before_backward, "optimizer" from on_before_optimizer_step (Lightning
    runs forward and backward inside optimizer.step(closure), so the optimizer's own step
    hook would fire before the forward). This gives the site order of a plain loop (step,
    forward, backward, optimizer) with automatic and manual optimisation, and any precision.

    Args:
        tuner: the trainer the hooks drive: a KdvfsTrainer, or a kdvfs.tune() session
            (tuner/job_tuning.py), which tunes while it drives.
    """

    def __init__(self, tuner: KdvfsTrainer) -> None:
        self.tuner = tuner
        self._stepped = False  # the open step's optimizer step ran

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.tuner.attach(_first(self.tuner.model, pl_module), caller_sites=LIGHTNING_SITES)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.tuner.begin_step()
        self.tuner.site("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.tuner.site("backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.tuner.site("optimizer")
        self._stepped = True

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # accumulating: the step goes on to the batch whose optimizer step runs
        if self._stepped or getattr(trainer, "accumulate_grad_batches", 1) <= 1:
            self._stepped = False
            self.tuner.end_step()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.tuner.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.tuner.close(failed=True)


class HFTrainerHooks:
    """Hugging Face TrainerCallback hooks (documented names and signatures) that drive a
    KdvfsTrainer: a step from on_step_begin to on_step_end (with gradient accumulation, all
    micro-batches of one optimizer step). hf_callback() mixes them into TrainerCallback.

    Args:
        tuner: the trainer the hooks drive: a KdvfsTrainer, or a kdvfs.tune() session
            (tuner/job_tuning.py), which tunes while it drives.
    """

    def __init__(self, tuner: KdvfsTrainer) -> None:
        self.tuner = tuner

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        optimizer = kwargs.get("optimizer")
        # accelerate wraps the optimizer (AcceleratedOptimizer.optimizer): hook the torch one
        while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
            optimizer = optimizer.optimizer
        self.tuner.attach(
            _first(self.tuner.model, kwargs.get("model")), _first(self.tuner.optimizer, optimizer)
        )

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tuner.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tuner.end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tuner.close()


def _first(given: Any, found: Any) -> Any:
    """What the user gave the trainer, else what the framework has (a module may be falsy)."""
    return given if given is not None else found


def lightning_callback(tuner: KdvfsTrainer) -> Any:
    """A Lightning Callback (lightning.pytorch, else pytorch_lightning) running LightningHooks."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            raise KdvfsError("lightning_callback needs PyTorch Lightning (pip install lightning)") from None
    return type("KdvfsLightningCallback", (LightningHooks, Callback), {})(tuner)


def hf_callback(tuner: KdvfsTrainer) -> Any:
    """A transformers TrainerCallback running HFTrainerHooks."""
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise KdvfsError("hf_callback needs Hugging Face transformers (pip install transformers)") from None
    return type("KdvfsHFCallback", (HFTrainerHooks, TrainerCallback), {})(tuner)
