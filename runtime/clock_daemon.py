"""The clock daemon: a root service that locks GPU clocks for unprivileged clients.

Clients connect to a Unix socket (mode 0660, a chosen group) and speak daemon_protocol.py.
The kernel names each client (daemon_rules.peer_of); the rules say what it may lock. A
client's first lock on a GPU takes that GPU's lease for its connection; the lease ends, and
the daemon resets the clocks, when the client asks, when its connection closes (its process
died: the read sees it at once), or when the holder's pid is found dead (a forked child may
keep the connection open). Leases are also written to a lease directory (clock_lease.py) so
that a daemon killed with leases held resets those GPUs when it starts again. With
dry_run=True every Set/Reset is recorded in `calls` and none is made. docs/clock-daemon.md has the
design and the measured figures.

Parts: `GpuSlot` (one GPU and its holder), `ClockDaemon` (requests to replies, leases,
recovery at start, the holder check), `DaemonServer` (the socket, a thread per connection,
the watch thread), `serve` (what `kdvfs daemon` runs).
"""

from __future__ import annotations

import collections
import contextlib
import grp
import itertools
import logging
import os
import signal
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kdvfs.runtime import clock_lease, daemon_client
from kdvfs.runtime import daemon_protocol as proto
from kdvfs.runtime.daemon_rules import DaemonRules, Peer, default_rules, peer_of
from kdvfs.runtime.nvml_device import load_nvml
from kdvfs.runtime.types import ClockGrid, ClockPair, KdvfsError

log = logging.getLogger(__name__)

DEFAULT_SOCKET = daemon_client.DEFAULT_SOCKET
SOCKET_MODE = 0o660  # the socket's permission bits: owner and group may connect
HOLDER_CHECK_PERIOD_S = 0.05  # how often the holders' pids are checked for life, s
MAX_CONNECTIONS = 64  # connections served at once; more are answered an error and closed
DRY_RUN_CALLS_KEPT = 100_000  # recorded dry-run calls kept in memory (oldest dropped)
SHUTDOWN_POLL_S = 0.05  # how often the accept loop looks for a shutdown request, s


class DaemonError(Exception):
    """A request the daemon refuses: `code` for programs, the message for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Holder:
    """The connection that holds a GPU's lease, its peer, its lease record and its clocks."""

    conn_id: int
    peer: Peer
    lease: clock_lease.Lease
    pair: ClockPair


class GpuSlot:
    """One GPU: its NVML handle, grid and lock kinds, and (under `lock`) its holder."""

    def __init__(self, index: int, handle: object, uuid: str, grid: ClockGrid) -> None:
        self.index = index
        self.handle = handle
        self.uuid = uuid
        self.grid = grid
        self.lock_kinds: tuple[str, ...] = ("gpu", "mem") if len(grid.mem_levels_mhz) > 1 else ("gpu",)
        self.lock = threading.Lock()
        self.holder: Holder | None = None


class ClockDaemon:
    """Answers requests for the GPUs NVML sees; owns their leases."""

    def __init__(self, rules: DaemonRules, *, lease_dir: Path | str, dry_run: bool = False) -> None:
        """Open every GPU and reset the locks a killed daemon left (see `recover`).

        Args:
            rules: who may lock which GPU within which clocks.
            lease_dir: where leases are written while held (survives the daemon's crash).
            dry_run: record every NVML Set/Reset in `calls` instead of making it.
        """
        self.rules = rules
        self.dry_run = dry_run
        self.calls: collections.deque[tuple[float, int, str, tuple[int, ...]]] = collections.deque(
            maxlen=DRY_RUN_CALLS_KEPT
        )
        self.resets = 0
        self._count_lock = threading.Lock()
        self._leases = clock_lease.LeaseDir(lease_dir)
        self._nvml = load_nvml()
        try:
            self.slots = [self._open(i) for i in range(self._nvml.nvmlDeviceGetCount())]
        except self._nvml.NVMLError as exc:
            self._nvml.nvmlShutdown()
            raise KdvfsError(f"clock daemon: NVML could not open the GPUs ({type(exc).__name__})") from None
        self.recover()

    def _open(self, index: int) -> GpuSlot:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        pairs = [
            ClockPair(int(core), int(mem))
            for mem in nvml.nvmlDeviceGetSupportedMemoryClocks(handle)
            for core in nvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem)
        ]
        return GpuSlot(index, handle, uuid, ClockGrid(tuple(pairs)))

    # --- requests ---------------------------------------------------------------------------
    def answer(self, conn_id: int, peer: Peer, line: bytes | None) -> proto.Reply:
        """The reply to one request line (None: a line over the size limit). Never raises."""
        try:
            if line is None:
                raise proto.ProtocolError(
                    "line_too_long", f"a request line is at most {proto.MAX_LINE_BYTES} bytes"
                )
            return self.handle(conn_id, peer, proto.parse_request(line))
        except (proto.ProtocolError, DaemonError) as exc:
            return proto.error_reply(exc.code, str(exc))
        except Exception as exc:  # a bug must cost one request, not the daemon
            log.exception("kdvfs daemon: request from pid %d failed", peer.pid)
            return proto.error_reply("internal", f"{type(exc).__name__}: {exc}")

    def handle(self, conn_id: int, peer: Peer, request: proto.Request) -> proto.Reply:
        if isinstance(request, proto.LockRequest):
            return self._lock(conn_id, peer, request)
        if isinstance(request, proto.ResetRequest):
            return self._reset(conn_id, peer, request)
        if isinstance(request, proto.StatusRequest):
            return self.status()
        return self.hello(peer)

    def hello(self, peer: Peer) -> proto.HelloReply:
        grids = {slot.index: slot.grid for slot in self.slots}
        may_lock = [
            proto.ClockRange(gpu=gpu, core_mhz=core, mem_mhz=mem)
            for gpu, core, mem in self.rules.may_lock(peer, grids)
        ]
        return proto.HelloReply(
            uid=peer.uid, gid=peer.gid, pid=peer.pid, dry_run=self.dry_run, may_lock=may_lock
        )

    def status(self) -> proto.StatusReply:
        gpus = []
        for slot in self.slots:
            with slot.lock:
                holder = slot.holder
                gpus.append(
                    proto.GpuStatus(
                        index=slot.index,
                        uuid=slot.uuid,
                        leased=holder is not None,
                        holder_pid=holder.peer.pid if holder else None,
                        core_mhz=holder.pair.core_mhz if holder else None,
                        mem_mhz=holder.pair.mem_mhz if holder else None,
                    )
                )
        return proto.StatusReply(
            gpus=gpus, resets=self.resets, dry_run=self.dry_run, recorded_calls=len(self.calls)
        )

    def _lock(self, conn_id: int, peer: Peer, req: proto.LockRequest) -> proto.LockReply:
        slot = self._slot(req.gpu)
        if req.uuid is not None and req.uuid != slot.uuid:
            raise DaemonError("wrong_gpu", f"GPU {slot.index} is {slot.uuid}, not {req.uuid}")
        if not self.rules.may_lease(peer, slot.index):
            raise DaemonError(
                "denied", f"uid {peer.uid} may not lease GPU {slot.index} (rules: {self.rules.source})"
            )
        pair = ClockPair(req.core_mhz, req.mem_mhz)
        if pair not in slot.grid:
            raise DaemonError("unsupported_pair", f"GPU {slot.index} does not support {pair}")
        if not self.rules.allows(peer, slot.index, pair):
            raise DaemonError(
                "outside_rules",
                f"uid {peer.uid} may not lock GPU {slot.index} at {pair} (rules: {self.rules.source})",
            )
        with slot.lock:
            holder = slot.holder
            if holder is not None and holder.conn_id != conn_id:
                raise DaemonError("busy", f"GPU {slot.index} is leased by pid {holder.peer.pid}")
            if holder is None:
                self._start_lease(slot, conn_id, peer, pair)
            else:
                self._set_clocks(slot, pair)
                holder.pair = pair
        return proto.LockReply(gpu=slot.index, core_mhz=pair.core_mhz, mem_mhz=pair.mem_mhz)

    def _reset(self, conn_id: int, peer: Peer, req: proto.ResetRequest) -> proto.ResetReply:
        slot = self._slot(req.gpu)
        with slot.lock:
            if slot.holder is None or slot.holder.conn_id != conn_id:
                raise DaemonError("not_holder", f"GPU {slot.index} is not leased by this connection")
            self._end_lease(slot, "the client asked")
        return proto.ResetReply(gpu=slot.index)

    def _slot(self, index: int) -> GpuSlot:
        if not 0 <= index < len(self.slots):
            raise DaemonError("no_such_gpu", f"no GPU with index {index} ({len(self.slots)} found)")
        return self.slots[index]

    # --- leases (the slot's lock held) -------------------------------------------------------
    def _start_lease(self, slot: GpuSlot, conn_id: int, peer: Peer, pair: ClockPair) -> None:
        """Write the lease, then lock; a failed lock resets what it set and drops the lease."""
        lease = clock_lease.Lease(
            peer.pid,
            clock_lease.process_start_ticks(peer.pid),
            slot.uuid,
            slot.index,
            slot.lock_kinds,
            time.time(),
        )
        if not self.dry_run:
            try:
                self._leases.write(lease)
            except KdvfsError as exc:  # no lease on disk, no lock: a crash could not reset it
                raise DaemonError("lease_file", str(exc)) from None
        try:
            self._set_clocks(slot, pair)
        except DaemonError:
            self._reset_clocks(slot, slot.lock_kinds)
            self._leases.remove(slot.uuid)
            raise
        slot.holder = Holder(conn_id, peer, lease, pair)
        log.info("kdvfs daemon: GPU %d leased by pid %d (uid %d) at %s", slot.index, peer.pid, peer.uid, pair)

    def _end_lease(self, slot: GpuSlot, why: str) -> None:
        holder = slot.holder
        assert holder is not None
        slot.holder = None
        try:
            self._reset_clocks(slot, holder.lease.locks)
        finally:
            self._count_reset()
        self._leases.remove(slot.uuid)
        log.info(
            "kdvfs daemon: GPU %d: lease of pid %d ended (%s); clocks reset", slot.index, holder.peer.pid, why
        )

    def release_connection(self, conn_id: int, why: str = "connection closed") -> None:
        """End every lease the connection holds (its clocks reset); errors are logged."""
        for slot in self.slots:
            with slot.lock:
                if slot.holder is not None and slot.holder.conn_id == conn_id:
                    self._end_lease_logged(slot, why)

    def release_dead_holders(self) -> list[int]:
        """End the leases whose holder process is gone; the ids of their connections."""
        ended = []
        for slot in self.slots:
            with slot.lock:
                holder = slot.holder
                if holder is not None and not holder.lease.owner_alive():
                    self._end_lease_logged(slot, f"holder pid {holder.peer.pid} exited")
                    ended.append(holder.conn_id)
        return ended

    def release_all(self) -> None:
        for slot in self.slots:
            with slot.lock:
                if slot.holder is not None:
                    self._end_lease_logged(slot, "the daemon stops")

    def _end_lease_logged(self, slot: GpuSlot, why: str) -> None:
        try:
            self._end_lease(slot, why)
        except DaemonError as exc:  # the lease file stays: the next start tries again
            log.error("kdvfs daemon: GPU %d: could not reset clocks (%s): %s", slot.index, why, exc)

    def recover(self) -> None:
        """Reset the GPUs whose lease a killed daemon left, and remove those leases
        (dry-run: record the resets, leave the leases, warn)."""
        for slot in self.slots:
            try:
                lease = self._leases.read(slot.uuid)
                locks = None if lease is None else lease.locks
            except KdvfsError as exc:  # half a file: reset everything it could have locked
                log.warning("kdvfs daemon: %s", exc)
                locks = slot.lock_kinds
            if locks is None:
                continue
            try:
                self._reset_clocks(slot, locks)
            except DaemonError as exc:
                log.error(
                    "kdvfs daemon: GPU %d: left locked by a previous daemon, reset failed: %s",
                    slot.index,
                    exc,
                )
                continue
            self._count_reset()
            if self.dry_run:
                log.warning(
                    "kdvfs daemon: GPU %d: a previous daemon's lease is left as it is (dry-run)", slot.index
                )
                continue
            self._leases.remove(slot.uuid)
            log.warning("kdvfs daemon: GPU %d: reset clocks a previous daemon left locked", slot.index)

    def close(self) -> None:
        """End every lease (clocks reset) and shut NVML down."""
        self.release_all()
        self._nvml.nvmlShutdown()

    # --- NVML ---------------------------------------------------------------------------------
    def _set_clocks(self, slot: GpuSlot, pair: ClockPair) -> None:
        self._call(slot, "nvmlDeviceSetGpuLockedClocks", (pair.core_mhz, pair.core_mhz))
        if "mem" in slot.lock_kinds:
            self._call(slot, "nvmlDeviceSetMemoryLockedClocks", (pair.mem_mhz, pair.mem_mhz))

    def _reset_clocks(self, slot: GpuSlot, kinds: tuple[str, ...]) -> None:
        """Reset every lock kind, even when one reset fails (the first failure is raised)."""
        failure: DaemonError | None = None
        for kind, fn_name in (
            ("gpu", "nvmlDeviceResetGpuLockedClocks"),
            ("mem", "nvmlDeviceResetMemoryLockedClocks"),
        ):
            if kind in kinds:
                try:
                    self._call(slot, fn_name, ())
                except DaemonError as exc:
                    failure = failure or exc
        if failure is not None:
            raise failure

    def _call(self, slot: GpuSlot, fn_name: str, args: tuple[int, ...]) -> None:
        """One NVML Set/Reset, or (dry-run) its record in `calls`."""
        if self.dry_run:
            self.calls.append((time.time(), slot.index, fn_name, args))
            return
        nvml = self._nvml
        try:
            getattr(nvml, fn_name)(slot.handle, *args)
        except nvml.NVMLError as exc:
            raise DaemonError("nvml_error", f"GPU {slot.index}: {fn_name}{args} failed: {exc}") from None

    def _count_reset(self) -> None:
        with self._count_lock:
            self.resets += 1


# --- the socket --------------------------------------------------------------------------------
class _Connection(socketserver.BaseRequestHandler):
    """One client: request lines in, replies out, until it closes; then its leases end."""

    server: DaemonServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        daemon = self.server.daemon
        peer = peer_of(sock)
        conn_id = self.server.register(sock)
        try:
            with sock.makefile("rb") as rfile:
                for line in _request_lines(rfile):
                    sock.sendall(proto.encode(daemon.answer(conn_id, peer, line)))
        except OSError:
            pass  # the client went away mid-reply: same as a close
        finally:
            daemon.release_connection(conn_id)
            self.server.unregister(conn_id)


def _request_lines(rfile):
    """Lines of at most MAX_LINE_BYTES (newline included); None for a longer one, whose rest
    is skipped up to its newline. Ends at end of file."""
    while True:
        line = rfile.readline(proto.MAX_LINE_BYTES)
        if not line:
            return
        if len(line) == proto.MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := rfile.readline(proto.MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


class DaemonServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The daemon's listening socket: a thread per connection, and a thread that ends the
    leases of holders whose process is gone."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, daemon: ClockDaemon, socket_path: Path | str, *, gid: int | None = None) -> None:
        """Bind `socket_path` (mode SOCKET_MODE, group `gid`) and start the holder watch.

        Args:
            daemon: the daemon whose requests this socket serves.
            socket_path: the Unix socket's path; a stale socket there is replaced, a live one
                (another daemon answers) is a KdvfsError.
            gid: the socket's group (None: the daemon's own group).
        """
        self.daemon = daemon
        self.socket_path = Path(socket_path)
        self._gid = os.getegid() if gid is None else gid
        self._conns: dict[int, socket.socket] = {}
        self._conns_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._serving = False
        _refuse_live_socket(self.socket_path)
        super().__init__(str(self.socket_path), _Connection)
        self._watch = threading.Thread(target=self._watch_holders, name="kdvfs-daemon-watch", daemon=True)
        self._watch.start()

    def server_bind(self) -> None:
        """Create the socket owner-only, then give it its group and mode: no moment in which
        anyone else may connect."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        _refuse_shared_folder(self.socket_path.parent)
        old_umask = os.umask(0o177)
        try:
            super().server_bind()
        finally:
            os.umask(old_umask)
        os.chown(self.socket_path, -1, self._gid, follow_symlinks=False)
        os.chmod(self.socket_path, SOCKET_MODE)

    def serve_forever(self, poll_interval: float = SHUTDOWN_POLL_S) -> None:
        self._serving = True
        super().serve_forever(poll_interval)

    def verify_request(self, request, client_address) -> bool:
        with self._conns_lock:
            if len(self._conns) < MAX_CONNECTIONS:
                return True
        message = proto.error_reply(
            "too_many_connections", f"the daemon serves {MAX_CONNECTIONS} connections at most"
        )
        with contextlib.suppress(OSError):
            request.sendall(proto.encode(message))
        return False

    def register(self, sock: socket.socket) -> int:
        with self._conns_lock:
            conn_id = next(self._ids)
            self._conns[conn_id] = sock
        return conn_id

    def unregister(self, conn_id: int) -> None:
        with self._conns_lock:
            self._conns.pop(conn_id, None)

    def _watch_holders(self) -> None:
        while not self._stop.wait(HOLDER_CHECK_PERIOD_S):
            for conn_id in self.daemon.release_dead_holders():
                with self._conns_lock:
                    sock = self._conns.get(conn_id)
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)  # the connection's thread then ends

    def close(self) -> None:
        """Stop serving, end every lease, remove the socket."""
        self._stop.set()
        if self._serving:
            self.shutdown()
        self.server_close()
        self.daemon.close()
        self.socket_path.unlink(missing_ok=True)


def _refuse_shared_folder(folder: Path) -> None:
    """The socket's folder must be writable by its owner (root, or this daemon's user) only:
    where others may write, they could swap the socket for a link before its chown/chmod."""
    stat = folder.stat()
    if stat.st_uid not in (0, os.geteuid()) or stat.st_mode & 0o022:
        raise KdvfsError(
            f"the socket's folder {folder} may be written by others (mode {stat.st_mode & 0o7777:o}, "
            f"owner uid {stat.st_uid}): use a folder only root may write, such as /run/kdvfs"
        )


def _refuse_live_socket(path: Path) -> None:
    """Remove a stale socket at `path`; a KdvfsError when a daemon answers there."""
    if not path.exists() and not path.is_symlink():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
        return
    finally:
        probe.close()
    raise KdvfsError(f"another process already answers on {path}: stop it first")


def group_id(group: str | int | None) -> int | None:
    """A group name or number as a gid (None stays None)."""
    if group is None or isinstance(group, int) or str(group).isdigit():
        return None if group is None else int(group)
    try:
        return grp.getgrnam(str(group)).gr_gid
    except KeyError:
        raise KdvfsError(f"no group named {group!r} on this machine") from None


def serve(
    socket_path: Path | str = DEFAULT_SOCKET,
    *,
    rules_path: Path | str | None = None,
    group: str | int | None = None,
    lease_dir: Path | str | None = None,
    dry_run: bool = False,
) -> None:
    """Run the daemon until SIGTERM or SIGINT; then end every lease and remove the socket."""
    socket_path = Path(socket_path)
    gid = group_id(group)
    rules = (
        DaemonRules.load(rules_path) if rules_path else default_rules(os.getegid() if gid is None else gid)
    )
    daemon = ClockDaemon(rules, lease_dir=lease_dir or socket_path.parent / "leases", dry_run=dry_run)
    try:
        server = DaemonServer(daemon, socket_path, gid=gid)
    except BaseException:
        daemon.close()
        raise
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    thread = threading.Thread(
        target=server.serve_forever, args=(SHUTDOWN_POLL_S,), name="kdvfs-daemon", daemon=True
    )
    thread.start()
    log.warning(
        "kdvfs daemon: serving %d GPU(s) on %s (rules: %s%s)",
        len(daemon.slots),
        socket_path,
        rules.source,
        "; dry-run: NVML calls are recorded, not made" if dry_run else "",
    )
    try:
        stop.wait()
    finally:
        server.close()
        thread.join()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
