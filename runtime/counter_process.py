"""The energy counter read in a process of its own, so that its reads never take the GIL of
the training process.

- `ProcessCounterPoller`: a CounterPoller (step_feed.py) run in a child process (this
  module's main, on this process's import path) on the same card, opened read-only
  (nvml_device.NvmlCounter); it hands the controller the same updates, sensors and figures,
  read from the child's output at each take(); a child that fails before its first update is
  replaced by the fallback (kdvfs.tune's: a CounterPoller thread).
- `open_poller(device, poll_s)`: the poller kdvfs.tune uses: a thread of the training process
  (CounterPoller) unless $KDVFS_COUNTER_POLLER is `process` and the card's counter can be read
  from another process (a real card: `NvmlDevice.counter_source()`).
- `main`: the child. It writes one line per event to its stdout: `u TIME_S ENERGY_J` (an
  update, on the host's monotonic clock, which both processes share), `s TEMP_C LIMIT_W
  SM_MHZ REASONS` (sensors), `e MESSAGE` (the counter stopped), and `f FIGURES_JSON` once its
  stdin closes (the parent stopped or died); SIGINT is the parent's to handle.

Why: a thread that reads the counter ~50 times a second takes the GIL as often, and each time
costs a host-bound training thread more than the read itself. Measured on an H100 (GPT-2
under a Hugging Face Trainer, 7 alternated rounds, docs/benchmarks.md), the process did not
run the job measurably faster than the thread: opt-in until it does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from kdvfs.runtime.device import Device
from kdvfs.runtime.nvml_device import NVML_MODULE_ENV, CounterSource, NvmlCounter
from kdvfs.runtime.step_feed import (
    COUNTER_POLL_S,
    SENSOR_PERIOD_S,
    UPDATE_GUARD_S,
    CounterPoller,
    CounterReader,
    Sensors,
)
from kdvfs.runtime.types import KdvfsError

log = logging.getLogger(__name__)

COUNTER_POLLER_ENV = "KDVFS_COUNTER_POLLER"
"""Environment variable: where kdvfs.tune reads the counter: thread (the default) or process."""
POLLER_KINDS = ("thread", "process")
#: How long stop() waits for the child to hand over its figures and exit; s.
STOP_TIMEOUT_S = 5.0
#: The child's program: this process's import path (argv[1], JSON) first, then the child's own
#: ($PYTHONPATH and site; not its working directory), so that `kdvfs` is the package this
#: process imported (`python -m` would put the working directory first: in a clone of kdvfs,
#: its bare kdvfs/ folder), then main() on the rest.
CHILD_CODE = (
    "import json, sys; first = json.loads(sys.argv[1]); "
    "sys.path[:] = first + [p for p in sys.path if p and p not in first]; "
    "from kdvfs.runtime.counter_process import main; sys.exit(main(sys.argv[2:]))"
)


class ProcessCounterPoller:
    """The card's counter and sensors, polled by a CounterPoller in a child process.

    Args:
        source: the card the child opens (NVML index and module).
        poll_s: least time from one counter read's start to the next's while the child reads
            back to back, s.
        sensor_period_s: time between two sensor reads, s.
        guard_s: how long before an expected update the child wakes at least, s; None: it
            reads back to back throughout (it costs the training process nothing either way).
        fallback: builds the poller to read the counter with instead if the child fails before
            its first update (it cannot start, import kdvfs, or open the card); None: none.
    """

    def __init__(
        self,
        source: CounterSource,
        *,
        poll_s: float = COUNTER_POLL_S,
        sensor_period_s: float = SENSOR_PERIOD_S,
        guard_s: float | None = UPDATE_GUARD_S,
        fallback: Callable[[], CounterReader] | None = None,
    ) -> None:
        self.source = source
        self.fallback = fallback
        self.replaced_by: CounterReader | None = None
        """The fallback poller once the child failed before its first update (None: not needed)."""
        self.poll_s = poll_s
        self.sensor_period_s = sensor_period_s
        self.guard_s = guard_s
        self.error: BaseException | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buffer = b""
        self._eof = False
        self._updates: list[tuple[float, float]] = []
        self._sensors = Sensors()
        self._figures: dict[str, Any] | None = None
        self._received = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the child (it opens the card and polls until stop())."""
        cmd = [
            sys.executable,
            "-c",
            CHILD_CODE,
            json.dumps(sys.path),  # the child imports kdvfs from where this process did
            "--index",
            str(self.source.index),
            "--poll-s",
            repr(self.poll_s),
            "--sensor-period-s",
            repr(self.sensor_period_s),
            "--guard-s",
            "none" if self.guard_s is None else repr(self.guard_s),
        ]
        env = dict(os.environ, **{NVML_MODULE_ENV: self.source.module})
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop(): it outlives this call)
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env
            )
        except OSError as exc:
            self._fail(f"the counter's process could not start: {exc}")
            return
        assert self._proc.stdout is not None
        os.set_blocking(self._proc.stdout.fileno(), False)

    def stop(self) -> None:
        """Close the child's stdin, take its last updates and figures, wait for it to exit."""
        if self.replaced_by is not None:
            self.replaced_by.stop()
        proc = self._proc
        if proc is not None and proc.returncode is None:
            try:
                assert proc.stdin is not None
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            with self._lock:
                self._drain()
        if self._stderr is not None:  # also where the child had exited already
            self._stderr.close()
            self._stderr = None

    def take(self, until_s: float) -> tuple[tuple[float, float], ...]:
        """The updates the child saw at or before until_s (host time), oldest first; handed out once."""
        with self._lock:
            self._drain()
            if self.replaced_by is not None:
                return self.replaced_by.take(until_s)
            n = next((i for i, (t, _) in enumerate(self._updates) if t > until_s), len(self._updates))
            taken, self._updates = self._updates[:n], self._updates[n:]
        return tuple(taken)

    def sensors(self) -> Sensors:
        """The sensors as the child last read them (NaN and none until its first read arrives)."""
        with self._lock:
            self._drain()
            return self._sensors if self.replaced_by is None else self.replaced_by.sensors()

    def figures(self) -> dict[str, Any]:
        """The child's polling figures (CounterPoller.figures: reads, reads a second, period,
        ...; None until it stopped), with `process`: True and the updates received."""
        with self._lock:
            self._drain()
            if self.replaced_by is not None:
                return self.replaced_by.figures() | {"process": False, "process_error": str(self.error)}
            figures = dict(self._figures) if self._figures is not None else {
                "reads": None, "reads_per_s": None, "period_s": None,
                "early_updates": None, "guard_s": self.guard_s, "wake_guard_s": None,
            }  # fmt: skip
            return figures | {"process": True, "updates_received": self._received}

    # --- internals ------------------------------------------------------------------------
    def _drain(self) -> None:
        """Read what the child wrote so far (under the lock), without waiting."""
        proc = self._proc
        if proc is None or proc.stdout is None or self._eof:
            return
        fd = proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                self._eof = True
                break
            self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._parse(line.decode("utf-8", "replace"))
        if self._eof and self.error is None:
            code = proc.wait()
            if code != 0:
                self._fail(f"the counter's process exited with code {code}{self._stderr_tail()}")

    def _parse(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "u":
            t, j = rest.split()
            self._updates.append((float(t), float(j)))
            self._received += 1
        elif kind == "s":
            temp, limit, sm, reasons = rest.split(" ", 3)
            names = frozenset() if reasons == "-" else frozenset(reasons.split(","))
            self._sensors = Sensors(float(temp), names, float(limit), float(sm))
        elif kind == "f":
            self._figures = json.loads(rest)
        elif kind == "e":
            self._fail(rest)

    def _fail(self, message: str) -> None:
        self.error = KdvfsError(message)
        if self.fallback is not None and self._received == 0 and self.replaced_by is None:
            log.warning("kdvfs: %s; reading the energy counter on a thread instead", message)
            self.replaced_by = self.fallback()
            self.replaced_by.start()
        else:
            log.warning("kdvfs: energy counter poller stopped: %s", message)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        lines = [ln for ln in self._stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        return f": {lines[-1].strip()}" if lines else ""


def open_poller(device: Device, poll_s: float = COUNTER_POLL_S) -> CounterReader:
    """The counter's poller for kdvfs.tune on `device`: a CounterPoller thread, or with
    $KDVFS_COUNTER_POLLER=process a ProcessCounterPoller (a card whose counter another process
    can read: `counter_source()`)."""
    how = os.environ.get(COUNTER_POLLER_ENV, "thread").strip().lower() or "thread"
    if how not in POLLER_KINDS:
        raise KdvfsError(f"{COUNTER_POLLER_ENV} must be one of {', '.join(POLLER_KINDS)}, got {how!r}")
    if how == "thread":
        return CounterPoller(device, poll_s=poll_s)
    counter_source = getattr(device, "counter_source", None)
    source = counter_source() if callable(counter_source) else None
    if source is None:
        raise KdvfsError(
            f"{COUNTER_POLLER_ENV}=process, but {getattr(device, 'name', device)}'s counter cannot be read "
            "from another process (a simulated or replayed card, a fake NVML, or no energy counter)"
        )
    return ProcessCounterPoller(source, poll_s=poll_s, fallback=lambda: CounterPoller(device, poll_s=poll_s))


# --- the child ---------------------------------------------------------------------------------
def _sensor_line(sensors: Sensors) -> str:
    reasons = ",".join(sorted(sensors.throttle_reasons)) or "-"
    return f"s {sensors.temperature_c!r} {sensors.power_limit_w!r} {sensors.sm_clock_mhz!r} {reasons}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kdvfs.runtime.counter_process", description=__doc__.splitlines()[0])
    p.add_argument("--index", type=int, default=0, help="the GPU's NVML index")
    p.add_argument(
        "--poll-s", type=float, default=COUNTER_POLL_S, help="least time between two reads' starts, s"
    )
    p.add_argument(
        "--sensor-period-s", type=float, default=SENSOR_PERIOD_S, help="time between sensor reads, s"
    )
    p.add_argument("--guard-s", default=repr(UPDATE_GUARD_S), help="wake this long before an update, s; none: never sleep")  # fmt: skip
    ns = p.parse_args(argv)
    guard_s = None if ns.guard_s == "none" else float(ns.guard_s)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the training process decides when to stop
    out_lock = threading.Lock()

    def emit(line: str) -> None:
        with out_lock:
            try:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):  # the parent is gone
                pass

    try:
        card = NvmlCounter(ns.index)
    except KdvfsError as exc:
        emit(f"e {' '.join(str(exc).split())}")
        return 1
    poller = CounterPoller(
        card,
        poll_s=ns.poll_s,
        sensor_period_s=ns.sensor_period_s,
        guard_s=guard_s,
        on_update=lambda t_s, j: emit(f"u {t_s!r} {j!r}"),
        on_sensors=lambda sensors: emit(_sensor_line(sensors)),
    )
    emit(_sensor_line(poller.sensors()))

    def until_stdin_closes() -> None:
        sys.stdin.buffer.read()  # until the parent closes it, or exits
        poller.stop()

    threading.Thread(target=until_stdin_closes, name="kdvfs-counter-stdin", daemon=True).start()
    try:
        poller.run()  # until stop(), or the card stops answering
    finally:
        if poller.error is not None:
            emit(f"e {' '.join(str(poller.error).split())}")
        emit("f " + json.dumps(poller.figures()))
        card.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
