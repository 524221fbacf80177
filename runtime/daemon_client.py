"""The clock daemon's client: what NvmlDevice and `kdvfs daemon status|lock` speak to it with.

`DaemonClient` keeps one connection to the daemon (daemon.py) for as long as it holds leases:
closing it, or the process dying, ends them and the daemon resets those clocks. Requests
and replies are daemon_protocol.py's JSON lines; an error reply is a KdvfsError carrying the
daemon's message. `socket_for` decides whether NvmlDevice goes through a daemon at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kdvfs.runtime import daemon_protocol as proto
from kdvfs.runtime.types import ClockPair, KdvfsError

DAEMON_SOCKET_ENV = "KDVFS_DAEMON_SOCKET"
DEFAULT_SOCKET = Path("/run/kdvfs/daemon.sock")  # where the daemon listens unless told otherwise
REPLY_TIMEOUT_S = 10.0  # longest wait for a connection or a reply, s


def socket_for(explicit: Path | str | None, privileged: Callable[[], bool]) -> Path | None:
    """The daemon socket a device should lock clocks through, or None for NVML directly.

    `explicit` (a constructor argument) first, then $KDVFS_DAEMON_SOCKET; else DEFAULT_SOCKET
    when this process may not lock clocks itself (`privileged()` is False) and it exists.
    """
    if explicit is not None:
        return Path(explicit)
    if os.environ.get(DAEMON_SOCKET_ENV):
        return Path(os.environ[DAEMON_SOCKET_ENV])
    if DEFAULT_SOCKET.exists() and not privileged():
        return DEFAULT_SOCKET
    return None


class DaemonClient:
    """One connection to the clock daemon. Use as a context manager, or call close()."""

    def __init__(self, socket_path: Path | str, *, timeout_s: float = REPLY_TIMEOUT_S) -> None:
        """Connect (a KdvfsError when nothing answers).

        Args:
            socket_path: the daemon's Unix socket.
            timeout_s: longest wait for the connection and for each reply, s.
        """
        self.socket_path = Path(socket_path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(str(self.socket_path))
        except OSError as exc:
            self._sock.close()
            raise KdvfsError(
                f"no clock daemon answers on {self.socket_path} ({exc.strerror or type(exc).__name__})"
            ) from None
        self._rfile = self._sock.makefile("rb")
        self._lock = threading.Lock()
        self._asking_thread: int | None = None

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def hello(self) -> proto.HelloReply:
        """Who the daemon sees (uid, gid, pid) and which clocks it may lock where."""
        return self._ask({"op": "hello"}, proto.HelloReply)

    def status(self) -> proto.StatusReply:
        return self._ask({"op": "status"}, proto.StatusReply)

    def lock(self, gpu: int, pair: ClockPair, *, uuid: str | None = None) -> None:
        """Lock GPU `gpu` at `pair`, taking its lease for this connection if free."""
        request: dict[str, Any] = {
            "op": "lock",
            "gpu": gpu,
            "core_mhz": pair.core_mhz,
            "mem_mhz": pair.mem_mhz,
        }
        if uuid is not None:
            request["uuid"] = uuid
        self._ask(request, proto.LockReply)

    def reset(self, gpu: int) -> None:
        """Reset GPU `gpu` to stock clocks and end this connection's lease on it.

        From a signal handler that interrupted a request of this same thread, the connection
        is closed instead: that ends all its leases, and the daemon resets their clocks.
        """
        if self._asking_thread == threading.get_ident():
            self.close()
            return
        self._ask({"op": "reset", "gpu": gpu}, proto.ResetReply)

    def close(self) -> None:
        """Close the connection: the daemon ends every lease it held and resets their clocks."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._rfile.close()
        self._sock.close()

    def _ask(self, request: dict[str, Any], model: type) -> Any:
        with self._lock:
            self._asking_thread = threading.get_ident()
            try:
                self._sock.sendall(json.dumps(request).encode() + b"\n")
                line = self._rfile.readline(proto.MAX_REPLY_BYTES)
            except OSError as exc:
                raise KdvfsError(f"clock daemon at {self.socket_path}: connection lost ({exc})") from None
            finally:
                self._asking_thread = None
        if not line.endswith(b"\n"):
            raise KdvfsError(f"clock daemon at {self.socket_path}: the connection closed without a reply")
        try:
            reply = proto.decode_reply(line, model)
        except ValueError as exc:  # json and pydantic errors: not a daemon we speak with
            raise KdvfsError(f"clock daemon at {self.socket_path}: unreadable reply ({exc})") from None
        if isinstance(reply, proto.ErrorReply):
            raise KdvfsError(f"clock daemon at {self.socket_path}: {reply.message}")
        return reply
