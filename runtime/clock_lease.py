"""Leases on GPU clocks: who locked a GPU's clocks, and the promise to give them back.

- `Lease` / `new_lease`: the lease file's content (pid, process start time, GPU uuid and
  index, lock kinds, time), written before a lock and removed when the clocks are reset;
- `LeaseDir`: this machine's lease files, one per GPU uuid, where the next process that
  opens a GPU finds the locks of a dead owner and resets them;
- `LeaseRegistry` (`hold` / `let_go` / `release_all` on the process's registry): release
  callbacks run at normal exit (atexit) and on `RESTORE_SIGNALS`, before the signal's
  previous behaviour goes on.

How a crash is recovered from: docs/design-runtime.md.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from kdvfs.runtime.types import KdvfsError

log = logging.getLogger(__name__)

RESTORE_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals on which held clocks are given back before the signal's own behaviour."""


@dataclass(frozen=True)
class Lease:
    """One process's locks on one GPU's clocks, as written to the lease file."""

    pid: int
    pid_start_ticks: int | None
    gpu_uuid: str
    gpu_index: int
    locks: tuple[str, ...]
    time_s: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_file(cls, path: Path) -> Lease:
        try:
            raw = json.loads(path.read_text())
            return cls(
                pid=int(raw["pid"]),
                pid_start_ticks=None if raw.get("pid_start_ticks") is None else int(raw["pid_start_ticks"]),
                gpu_uuid=str(raw["gpu_uuid"]),
                gpu_index=int(raw["gpu_index"]),
                locks=tuple(str(k) for k in raw["locks"]),
                time_s=float(raw["time_s"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KdvfsError(f"{path}: unreadable clock lease ({exc})") from None

    def owner_alive(self) -> bool:
        """True while the process that wrote the lease still runs (a zombie or a reused pid
        does not count)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # another user's live process
        stat = _proc_stat(self.pid)
        if stat is None:
            return True
        if stat[0] == "Z":
            return False
        return self.pid_start_ticks is None or int(stat[19]) == self.pid_start_ticks


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (/proc/PID/stat field 22), or None."""
    stat = _proc_stat(pid)
    return None if stat is None else int(stat[19])


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces: the fields after it follow the last ")"
    return stat.rsplit(")", 1)[1].split()


def default_lease_dir() -> Path:
    """$XDG_RUNTIME_DIR/kdvfs, else /tmp/kdvfs-leases."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime_dir) / "kdvfs" if runtime_dir else Path("/tmp/kdvfs-leases")


class LeaseDir:
    """The lease files of this machine's GPUs, one per GPU uuid.

    Args:
        path: the directory of the lease files; None: default_lease_dir().
    """

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_lease_dir()

    def file_for(self, gpu_uuid: str) -> Path:
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in gpu_uuid)
        return self.path / f"{safe}.json"

    def read(self, gpu_uuid: str) -> Lease | None:
        path = self.file_for(gpu_uuid)
        return Lease.from_file(path) if path.exists() else None

    def write(self, lease: Lease) -> Path:
        """Write atomically (temp file + rename), so a reader never sees half a lease."""
        path = self.file_for(lease.gpu_uuid)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".lease-")
            with os.fdopen(fd, "w") as f:
                f.write(lease.to_json())
            os.replace(tmp, path)
        except OSError as exc:
            raise KdvfsError(
                f"cannot write clock lease in {self.path} ({exc}); pass another lease_dir"
            ) from None
        return path

    def remove(self, gpu_uuid: str) -> None:
        self.file_for(gpu_uuid).unlink(missing_ok=True)


def new_lease(gpu_uuid: str, gpu_index: int, locks: tuple[str, ...]) -> Lease:
    """A lease owned by this process, taken now."""
    pid = os.getpid()
    return Lease(pid, process_start_ticks(pid), gpu_uuid, gpu_index, locks, time.time())


# --- restore on exit and on signals ---------------------------------------------------------
class LeaseRegistry:
    """One process's release callbacks: run at normal exit (atexit) and on RESTORE_SIGNALS,
    before the signal's previous behaviour goes on, unless let go first.

    The atexit call and the signal handlers are installed at the first hold (signal handlers
    only from the main thread); a forked child starts with no holds of its own. `hold`,
    `let_go` and `release_all` use the process's registry (`default_registry()`;
    `use_registry` puts another in its place, as a test does).
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._held: dict[object, Callable[[], None]] = {}
        self._owner_pid: int | None = None
        self._atexit = False
        self._previous_handlers: dict[int, object] = {}

    @property
    def held(self) -> int:
        """How many holds of this process are not yet let go."""
        with self._lock:
            return len(self._held) if self._owner_pid == os.getpid() else 0

    def hold(self, key: object, release: Callable[[], None]) -> None:
        """Run `release` at exit or on SIGINT/SIGTERM unless `let_go(key)` comes first.

        Signal handlers can only be installed from the main thread; from another thread only
        atexit and the stale-lease recovery protect the clocks (logged once).
        """
        with self._lock:
            if self._owner_pid != os.getpid():  # first hold here, or a forked child: start afresh
                self._held.clear()
                self._owner_pid = os.getpid()
                if not self._atexit:
                    atexit.register(self.release_all)
                    self._atexit = True
                self._install_signal_handlers()
            self._held[key] = release

    def let_go(self, key: object) -> None:
        with self._lock:
            self._held.pop(key, None)

    def release_all(self) -> None:
        """Release every hold of this process; errors are logged, never raised."""
        with self._lock:
            if self._owner_pid != os.getpid():
                return
            releases = list(self._held.items())
            self._held.clear()
        for _, release in releases:
            try:
                release()
            except Exception as exc:
                log.warning("kdvfs: could not restore stock clocks: %s", exc)

    def close(self) -> None:
        """Forget the holds without running them, give back the signal handlers it replaced
        (where still its own) and drop its atexit call."""
        with self._lock:
            self._held.clear()
            self._owner_pid = None
            if self._atexit:
                atexit.unregister(self.release_all)
                self._atexit = False
            if threading.current_thread() is threading.main_thread():
                for signum, previous in self._previous_handlers.items():
                    if signal.getsignal(signum) == self._on_signal:
                        signal.signal(signum, previous)  # type: ignore[arg-type]
            self._previous_handlers.clear()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("kdvfs: clocks locked from a non-main thread: no SIGINT/SIGTERM restore, only atexit")
            return
        for signum in RESTORE_SIGNALS:
            previous = signal.getsignal(signum)
            if previous != self._on_signal:
                self._previous_handlers[signum] = previous
                signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        """Reset clocks, then carry on as the signal would have without us."""
        self.release_all()
        previous = self._previous_handlers.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)  # SIGINT's default raises KeyboardInterrupt here
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


_registry = LeaseRegistry()


def default_registry() -> LeaseRegistry:
    """The registry hold / let_go / release_all use now."""
    return _registry


@contextmanager
def use_registry(registry: LeaseRegistry) -> Iterator[LeaseRegistry]:
    """Use `registry` for hold / let_go / release_all inside the block (a test's fresh one),
    the previous one after it."""
    global _registry
    previous, _registry = _registry, registry
    try:
        yield registry
    finally:
        _registry = previous


def hold(key: object, release: Callable[[], None]) -> None:
    """`LeaseRegistry.hold` on the registry in use."""
    _registry.hold(key, release)


def let_go(key: object) -> None:
    """`LeaseRegistry.let_go` on the registry in use."""
    _registry.let_go(key)


def release_all() -> None:
    """`LeaseRegistry.release_all` on the registry in use."""
    _registry.release_all()
