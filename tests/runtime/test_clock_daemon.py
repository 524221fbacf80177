"""The clock daemon: real daemon processes on a real Unix socket, the fake NVML card.

Leases, their end on close, SIGKILL and a dead holder pid, recovery after the daemon's own
SIGKILL, the rules, malformed and hostile requests (hypothesis), dry-run, the socket's
mode, and NvmlDevice going through the daemon as an unprivileged process would.
"""

from __future__ import annotations

import grp
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdvfs.runtime import daemon_client, nvml_device
from kdvfs.runtime.clock_daemon import HOLDER_CHECK_PERIOD_S
from kdvfs.runtime.daemon_protocol import MAX_LINE_BYTES, ClockRange
from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.runtime.types import ClockPair, KdvfsError
from tests.runtime import fake_pynvml
from tests.runtime.daemon_process import HERE, LOCK_CALLS, RESET_CALLS, DaemonProcess, fake_nvml_env

RESET_WITHIN_S = 0.1  # the target: clocks reset this soon after the holder dies


@pytest.fixture
def daemon(tmp_path):
    process = DaemonProcess(tmp_path)
    yield process
    process.stop()


def write_rules(path: Path, **rule: object) -> Path:
    path.write_text(json.dumps({"allow": [rule]}))
    return path


def start_child(daemon: DaemonProcess, mode: str) -> tuple[subprocess.Popen, str]:
    child = subprocess.Popen(
        [sys.executable, str(HERE / "daemon_child.py"), str(daemon.socket), mode],
        env=fake_nvml_env(daemon.calls_file), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = child.stdout.readline().strip()
    assert line.startswith("locked"), child.stderr.read()
    return child, line


def ask_raw(sock_file, line: bytes) -> dict:
    """Send one raw line, read one reply line (which must be JSON)."""
    sock, rfile = sock_file
    sock.sendall(line)
    reply = rfile.readline()
    assert reply.endswith(b"\n"), f"no reply to {line[:80]!r}"
    return json.loads(reply)


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory):
    """One daemon for the tests that never lock (starting one costs about 0.5 s)."""
    process = DaemonProcess(tmp_path_factory.mktemp("shared"))
    yield process
    process.stop()


@pytest.fixture
def raw(shared_daemon):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(shared_daemon.socket))
    rfile = sock.makefile("rb")
    yield sock, rfile
    rfile.close()
    sock.close()


# --- leases -------------------------------------------------------------------------------------
def test_a_lease_locks_through_nvml_and_reset_ends_it(daemon):
    with daemon.client() as client:
        client.lock(0, ClockPair(1410, 2201))
        status = client.status()
        (gpu,) = status.gpus
        assert (gpu.leased, gpu.holder_pid, gpu.core_mhz, gpu.mem_mhz) == (True, os.getpid(), 1410, 2201)
        (lease_path,) = daemon.lease_files()
        assert json.loads(lease_path.read_text())["pid"] == os.getpid()
        client.lock(0, ClockPair(990, 3201))  # a switch: same lease, new clocks
        client.reset(0)
        status = client.status()
    assert not status.gpus[0].leased and status.resets == 1
    assert [(c["fn"], c["args"]) for c in daemon.calls()] == [
        ("nvmlDeviceSetGpuLockedClocks", [1410, 1410]),
        ("nvmlDeviceSetMemoryLockedClocks", [2201, 2201]),
        ("nvmlDeviceSetGpuLockedClocks", [990, 990]),
        ("nvmlDeviceSetMemoryLockedClocks", [3201, 3201]),
        ("nvmlDeviceResetGpuLockedClocks", []),
        ("nvmlDeviceResetMemoryLockedClocks", []),
    ]
    assert daemon.lease_files() == []


def test_a_second_client_is_refused_naming_the_holders_pid(daemon, sigint_default):
    holder = subprocess.Popen(
        [sys.executable, "-m", "kdvfs.cli", "daemon", "lock", "--socket", str(daemon.socket),
         "--gpu", "0", "--core", "1755", "--mem", "3201"],
        env=fake_nvml_env(daemon.calls_file), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().startswith("GPU 0 locked at 1755/3201 MHz"), holder.stderr.read()
    with daemon.client() as client, pytest.raises(KdvfsError, match=rf"GPU 0 is leased by pid {holder.pid}$"):
        client.lock(0, ClockPair(1410, 3201))
    assert daemon.fns() == LOCK_CALLS
    holder.send_signal(signal.SIGINT)
    assert holder.wait(timeout=10) == 0 and "GPU 0 released" in holder.stdout.read()
    assert daemon.fns() == LOCK_CALLS + RESET_CALLS


def test_closing_the_connection_ends_the_lease(daemon):
    client = daemon.client()
    client.lock(0, ClockPair(1410, 3201))
    client.close()
    assert [c["fn"] for c in daemon.wait_for_calls(4)] == LOCK_CALLS + RESET_CALLS
    with daemon.client() as other:
        other.lock(0, ClockPair(990, 2201))  # free again


def test_client_sigkill_resets_clocks_within_100_ms(daemon):
    delays_s = []
    for trial in range(3):
        child, _ = start_child(daemon, "hold")
        killed_s = time.monotonic()
        child.kill()
        calls = daemon.wait_for_calls(4 * (trial + 1))
        child.wait(timeout=10)
        assert [c["fn"] for c in calls[-4:]] == LOCK_CALLS + RESET_CALLS
        delays_s.append(calls[-1]["monotonic_s"] - killed_s)
    assert max(delays_s) < RESET_WITHIN_S, delays_s


def test_a_dead_holder_is_found_by_its_pid_while_a_forked_child_keeps_the_connection(daemon):
    child, line = start_child(daemon, "fork")
    grandchild = int(line.split()[1])
    try:
        child.wait(timeout=10)
        exited_s = time.monotonic()
        calls = daemon.wait_for_calls(4)
        assert [c["fn"] for c in calls] == LOCK_CALLS + RESET_CALLS
        assert calls[-1]["monotonic_s"] - exited_s < HOLDER_CHECK_PERIOD_S + RESET_WITHIN_S
        with daemon.client() as client:
            assert not client.status().gpus[0].leased
    finally:
        os.kill(grandchild, signal.SIGKILL)


def test_a_daemon_killed_holding_a_lease_resets_it_when_it_starts_again(tmp_path):
    first = DaemonProcess(tmp_path)
    client = first.client()
    client.lock(0, ClockPair(1410, 3201))
    first.kill()
    client.close()
    assert first.fns() == LOCK_CALLS and len(first.lease_files()) == 1  # nothing reset: it died
    second = DaemonProcess(tmp_path)  # answers only once it has recovered
    try:
        assert second.fns() == LOCK_CALLS + RESET_CALLS
        assert second.lease_files() == []
        with second.client() as client:
            assert client.status().resets == 1
        assert "reset clocks a previous daemon left locked" in second.log_text()
    finally:
        second.stop()


def test_stopping_the_daemon_resets_held_clocks_and_removes_its_socket(daemon):
    client = daemon.client()
    client.lock(0, ClockPair(1410, 3201))
    assert daemon.stop() == 0
    client.close()
    assert daemon.fns() == LOCK_CALLS + RESET_CALLS
    assert not daemon.socket.exists() and daemon.lease_files() == []


def test_a_second_daemon_on_a_live_socket_is_one_line_and_exit_2(daemon, tmp_path):
    second = subprocess.run(
        [sys.executable, "-m", "kdvfs.cli", "daemon", "--socket", str(daemon.socket)],
        env=fake_nvml_env(tmp_path / "other-calls.jsonl"), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert second.returncode == 2
    assert second.stderr.splitlines()[-1] == (
        f"kdvfs daemon: error: another process already answers on {daemon.socket}: stop it first"
    )


def test_the_socket_is_0660_and_has_the_chosen_group(tmp_path):
    group = grp.getgrall()[-1]
    process = DaemonProcess(tmp_path, "--group", group.gr_name)
    try:
        stat = process.socket.stat()
        assert (stat.st_mode & 0o777, stat.st_gid) == (0o660, group.gr_gid)
    finally:
        process.stop()


def test_dry_run_keeps_leases_but_makes_no_nvml_call(tmp_path):
    process = DaemonProcess(tmp_path, "--dry-run")
    try:
        with process.client() as client:
            assert client.hello().dry_run
            client.lock(0, ClockPair(1410, 3201))
            status = client.status()
            assert status.gpus[0].holder_pid == os.getpid() and status.dry_run
            client.reset(0)
            assert client.status().recorded_calls == 4
        assert process.calls() == [] and not process.lease_dir.exists()
    finally:
        process.stop()


# --- the rules -------------------------------------------------------------------------------------
def test_a_user_outside_the_rules_may_lock_nothing_and_changes_nothing(tmp_path):
    rules = write_rules(tmp_path / "rules.json", users=[os.getuid() + 12345])
    process = DaemonProcess(tmp_path, "--rules", str(rules))
    try:
        with process.client() as client:
            hello = client.hello()
            assert (hello.uid, hello.pid, hello.may_lock) == (os.getuid(), os.getpid(), [])
            with pytest.raises(
                KdvfsError, match=rf"uid {os.getuid()} may not lease GPU 0 \(rules: {rules}\)"
            ):
                client.lock(0, ClockPair(1410, 3201))
            with pytest.raises(KdvfsError, match="not leased by this connection"):
                client.reset(0)
            assert not client.status().gpus[0].leased
        assert process.calls() == []
    finally:
        process.stop()


def test_the_rules_bound_gpus_and_clocks(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[[allow]]\nusers = [{os.getuid()}]\ngpus = [1]\ncore_mhz = [990, 1755]\n")
    process = DaemonProcess(tmp_path, "--rules", str(rules), gpu_count=2)
    try:
        with process.client() as client:
            assert client.hello().may_lock == [ClockRange(gpu=1, core_mhz=(990, 1755), mem_mhz=(2201, 3201))]
            with pytest.raises(KdvfsError, match="may not lease GPU 0"):
                client.lock(0, ClockPair(1410, 3201))
            with pytest.raises(KdvfsError, match=r"may not lock GPU 1 at 1980/3201 MHz"):
                client.lock(1, ClockPair(1980, 3201))
            with pytest.raises(KdvfsError, match=r"may not lock GPU 1 at 345/3201 MHz"):
                client.lock(1, ClockPair(345, 3201))
            client.lock(1, ClockPair(1755, 2201))
        calls = process.wait_for_calls(4)
        assert [(c["fn"], c["index"]) for c in calls] == [(fn, 1) for fn in LOCK_CALLS + RESET_CALLS]
    finally:
        process.stop()


def test_unsupported_pairs_unknown_gpus_and_wrong_uuids_are_refused(shared_daemon):
    with shared_daemon.client() as client:
        with pytest.raises(KdvfsError, match=r"GPU 0 does not support 1400/3201 MHz"):
            client.lock(0, ClockPair(1400, 3201))
        with pytest.raises(KdvfsError, match=r"no GPU with index 4 \(1 found\)"):
            client.lock(4, ClockPair(1410, 3201))
        with pytest.raises(KdvfsError, match=r"GPU 0 is GPU-fa4e.*, not GPU-other"):
            client.lock(0, ClockPair(1410, 3201), uuid="GPU-other")
    assert shared_daemon.calls() == []


def test_a_bad_rules_file_is_one_line_and_exit_2(tmp_path):
    rules = write_rules(tmp_path / "rules.json", users=["root"], core_mhz=[1980, 990])
    result = subprocess.run(
        [sys.executable, "-m", "kdvfs.cli", "daemon", "--socket", str(tmp_path / "s"), "--rules", str(rules)],
        env=fake_nvml_env(tmp_path / "calls.jsonl"), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        f"kdvfs daemon: error: rules file {rules}: allow.0: Value error, core_mhz: floor 1980 is above ceiling 990\n"
    )


# --- malformed and hostile requests --------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"not json\n", "bad_request"),
        (b"\xff\xfe\x00\n", "bad_request"),
        (b"[]\n", "bad_request"),
        (b"null\n", "bad_request"),
        (b"{}\n", "bad_request"),
        (b'{"op": "format_disk"}\n', "bad_request"),
        (b'{"op": "lock"}\n', "bad_request"),
        (b'{"op": "lock", "gpu": "0", "core_mhz": 1410, "mem_mhz": 3201}\n', "bad_request"),
        (b'{"op": "lock", "gpu": true, "core_mhz": 1410, "mem_mhz": 3201}\n', "bad_request"),
        (b'{"op": "lock", "gpu": 0, "core_mhz": 1410.0, "mem_mhz": 3201}\n', "bad_request"),
        (b'{"op": "lock", "gpu": -1, "core_mhz": 1410, "mem_mhz": 3201}\n', "bad_request"),
        (b'{"op": "lock", "gpu": 0, "core_mhz": 1e400, "mem_mhz": 3201}\n', "bad_request"),
        (b'{"op": "lock", "gpu": 0, "core_mhz": 99999999999999999999999, "mem_mhz": 3201}\n', "bad_request"),
        (b'{"op": "lock", "gpu": 0, "core_mhz": 1410, "mem_mhz": 3201, "pid": 1}\n', "bad_request"),
        (b'{"op": "status", "uid": 0}\n', "bad_request"),
        (b"[" * 1000 + b"\n", "bad_request"),  # deeper than the JSON parser's recursion limit
        (b'{"op": "status"' + b" " * 2000 + b"}\n", "line_too_long"),
        (b"x" * (1 << 20) + b"\n", "line_too_long"),
    ],
)  # fmt: skip
def test_a_malformed_request_gets_an_error_reply_and_the_daemon_keeps_serving(shared_daemon, raw, line, code):
    reply = ask_raw(raw, line)
    assert (reply["ok"], reply["error"]) == (False, code) and reply["message"]
    assert ask_raw(raw, b'{"op": "status"}\n')["ok"] is True  # same connection, still served
    assert shared_daemon.calls() == [] and shared_daemon.process.poll() is None


def test_a_line_at_the_limit_is_read_whole(raw):
    line = b'{"op": "status"' + b" " * (MAX_LINE_BYTES - 17) + b"}\n"
    assert len(line) == MAX_LINE_BYTES and ask_raw(raw, line)["ok"] is True


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
_fields = st.sampled_from(["op", "gpu", "core_mhz", "mem_mhz", "uuid", "pid", "uid", "holder"])
_near_requests = st.dictionaries(
    _fields,
    st.sampled_from(["lock", "reset", "status", "hello"]) | st.integers(-(2**70), 2**70) | _json_values,
    max_size=6,
)
_hostile_lines = st.one_of(
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ") + b"\n"),
    _json_values.map(lambda v: json.dumps(v).encode() + b"\n"),
    _near_requests.map(lambda d: json.dumps(d).encode() + b"\n"),
)


@pytest.fixture(scope="module")
def outsider_daemon(tmp_path_factory):
    """A daemon whose rules leave out this test's uid, and one raw connection to it."""
    tmp_path = tmp_path_factory.mktemp("outsider")
    rules = write_rules(tmp_path / "rules.json", users=[os.getuid() + 12345])
    process = DaemonProcess(tmp_path, "--rules", str(rules))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(process.socket))
    rfile = sock.makefile("rb")
    yield process, (sock, rfile)
    rfile.close()
    sock.close()
    process.stop()


FUZZ_LINES_SENT = [0]  # lines the outsider fuzz sent, for the test after it


@settings(max_examples=500, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_hostile_lines, min_size=4, max_size=12))
def test_fuzz_an_outsider_gets_an_answer_to_every_line_and_changes_nothing(outsider_daemon, lines):
    process, raw_conn = outsider_daemon
    FUZZ_LINES_SENT[0] += len(lines)
    for line in lines:
        reply = ask_raw(raw_conn, line)
        if reply["ok"]:  # only the read-only requests may succeed for an outsider
            assert json.loads(line)["op"] in ("status", "hello")
            assert reply.get("may_lock", []) == []
        else:
            assert isinstance(reply["error"], str) and isinstance(reply["message"], str)
    assert process.calls_file.exists() is False and process.process.poll() is None


def test_the_fuzz_sent_thousands_of_lines_and_the_daemon_still_serves(outsider_daemon):
    process, raw_conn = outsider_daemon
    assert FUZZ_LINES_SENT[0] >= 2000  # 500 examples of 4 to 12 lines
    assert ask_raw(raw_conn, b'{"op": "status"}\n')["ok"] is True
    with process.client() as client:
        assert client.status().resets == 0


@pytest.fixture(scope="module")
def bounded_daemon(tmp_path_factory):
    """A daemon that lets this uid lock GPU 0 and 1 within 990-1755 MHz core, 2201 MHz memory."""
    tmp_path = tmp_path_factory.mktemp("bounded")
    rules = write_rules(
        tmp_path / "rules.json", users=[os.getuid()], gpus=[0, 1], core_mhz=[990, 1755], mem_mhz=[2201, 2201]
    )
    process = DaemonProcess(tmp_path, "--rules", str(rules), gpu_count=3)
    yield process
    process.stop()


_clocks = st.sampled_from([*fake_pynvml.GRAPHICS_CLOCKS_MHZ, *fake_pynvml.MEM_CLOCKS_MHZ]) | st.integers(
    0, 5000
)
_lock_or_reset = st.one_of(
    st.builds(
        lambda g, c, m: {"op": "lock", "gpu": g, "core_mhz": c, "mem_mhz": m},
        st.integers(-1, 4),
        _clocks,
        _clocks,
    ),
    st.builds(lambda g: {"op": "reset", "gpu": g}, st.integers(-1, 4)),
)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_lock_or_reset, min_size=1, max_size=8))
def test_fuzz_no_request_locks_a_clock_outside_the_rules(bounded_daemon, requests):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(bounded_daemon.socket))
    with sock, sock.makefile("rb") as rfile:
        for request in requests:
            ask_raw((sock, rfile), json.dumps(request).encode() + b"\n")
    for call in bounded_daemon.calls():
        assert call["index"] in (0, 1)
        if call["fn"] == "nvmlDeviceSetGpuLockedClocks":
            assert call["args"][0] in (990, 1410, 1755)
        if call["fn"] == "nvmlDeviceSetMemoryLockedClocks":
            assert call["args"] == [2201, 2201]
    assert bounded_daemon.process.poll() is None


def test_after_the_fuzz_every_lease_was_given_back(bounded_daemon):
    deadline = time.monotonic() + 20.0  # its last connection's close is seen a moment later
    with bounded_daemon.client() as client:
        status = client.status()
        while any(gpu.leased for gpu in status.gpus) and time.monotonic() < deadline:
            time.sleep(0.01)
            status = client.status()
    assert not any(gpu.leased for gpu in status.gpus)
    fns = bounded_daemon.fns()
    assert fns.count("nvmlDeviceResetGpuLockedClocks") == status.resets


# --- NvmlDevice through the daemon ----------------------------------------------------------------
@pytest.fixture
def fake_here(monkeypatch, tmp_path, lease_registry):
    """The fake card in this process too, which is not root (as far as NvmlDevice knows)."""
    state = fake_pynvml.configure()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv(nvml_device.NVML_MODULE_ENV, raising=False)
    monkeypatch.delenv(daemon_client.DAEMON_SOCKET_ENV, raising=False)
    monkeypatch.setattr(nvml_device, "admin_privilege", lambda: (False, "not root and no CAP_SYS_ADMIN"))
    return state


def test_nvml_device_locks_through_the_daemon_when_not_root(daemon, fake_here, tmp_path):
    with NvmlDevice(0, lease_dir=tmp_path / "own-leases", daemon_socket=daemon.socket) as dev:
        allowed, why = dev.can_set_clocks()
        assert allowed and why == (
            f"through the clock daemon at {daemon.socket} (core 345-1980 MHz, memory 2201-3201 MHz)"
        )
        dev.set_clocks(ClockPair(1410, 3201))
        dev.set_clocks(ClockPair(1400, 2201), snap=True)
        with daemon.client() as client:
            assert client.status().gpus[0].holder_pid == os.getpid()
        dev.reset_clocks()
        dev.set_clocks(ClockPair(990, 2201))
    assert fake_here.calls == []  # nothing from this process itself
    assert daemon.fns() == LOCK_CALLS * 2 + RESET_CALLS + LOCK_CALLS + RESET_CALLS  # close() reset
    assert not (tmp_path / "own-leases").exists()


def test_nvml_device_finds_the_daemon_named_by_the_environment(daemon, fake_here, tmp_path, monkeypatch):
    monkeypatch.setenv(daemon_client.DAEMON_SOCKET_ENV, str(daemon.socket))
    holder = daemon.client()
    holder.lock(0, ClockPair(345, 2201))
    with NvmlDevice(0, lease_dir=tmp_path / "own") as dev:
        with pytest.raises(KdvfsError, match=rf"GPU 0 is leased by pid {os.getpid()}"):
            dev.set_clocks(ClockPair(1410, 3201))  # another connection of this process holds it
        holder.close()
        daemon.wait_for_calls(4)
        dev.set_clocks(ClockPair(1410, 3201))
    assert daemon.fns() == LOCK_CALLS + RESET_CALLS + LOCK_CALLS + RESET_CALLS


def test_nvml_device_dry_run_with_a_daemon_records_and_sends_nothing(daemon, fake_here, tmp_path):
    with NvmlDevice(0, dry_run=True, lease_dir=tmp_path / "own", daemon_socket=daemon.socket) as dev:
        dev.set_clocks(ClockPair(1410, 3201))
        dev.reset_clocks()
        assert [fn for _, fn, _ in dev.calls] == LOCK_CALLS + RESET_CALLS
    assert daemon.calls() == [] and fake_here.calls == []


def test_nvml_device_refused_by_the_rules_is_one_error(tmp_path, fake_here):
    rules = write_rules(tmp_path / "rules.json", users=[os.getuid() + 12345])
    process = DaemonProcess(tmp_path, "--rules", str(rules))
    try:
        with NvmlDevice(0, lease_dir=tmp_path / "own", daemon_socket=process.socket) as dev:
            assert dev.can_set_clocks() == (
                False, f"the clock daemon at {process.socket} lets uid {os.getuid()} lock no clocks on GPU 0",
            )  # fmt: skip
            with pytest.raises(KdvfsError, match="may not lease GPU 0") as err:
                dev.set_clocks(ClockPair(1410, 3201))
            assert "\n" not in str(err.value)
        assert process.calls() == []
    finally:
        process.stop()


def test_nvml_device_without_a_daemon_answering_says_so(fake_here, tmp_path):
    with NvmlDevice(0, lease_dir=tmp_path / "own", daemon_socket=tmp_path / "none.sock") as dev:
        allowed, why = dev.can_set_clocks()
        assert not allowed and why.startswith(f"no clock daemon answers on {tmp_path / 'none.sock'}")
        with pytest.raises(KdvfsError, match="no clock daemon answers"):
            dev.set_clocks(ClockPair(1410, 3201))


def test_the_default_socket_is_used_only_when_not_privileged(tmp_path, monkeypatch):
    monkeypatch.delenv(daemon_client.DAEMON_SOCKET_ENV, raising=False)
    default = tmp_path / "daemon.sock"
    monkeypatch.setattr(daemon_client, "DEFAULT_SOCKET", default)
    assert daemon_client.socket_for(None, lambda: False) is None  # no socket there
    default.touch()
    assert daemon_client.socket_for(None, lambda: False) == default
    assert daemon_client.socket_for(None, lambda: True) is None  # root locks itself
    assert daemon_client.socket_for("x.sock", lambda: True) == Path("x.sock")
    monkeypatch.setenv(daemon_client.DAEMON_SOCKET_ENV, "/elsewhere.sock")
    assert daemon_client.socket_for(None, lambda: True) == Path("/elsewhere.sock")


@pytest.mark.parametrize("ending", ["sigkill", "sigterm"])
def test_a_training_process_that_dies_through_the_daemon_gets_its_clocks_reset(daemon, ending):
    env = dict(fake_nvml_env(daemon.calls_file), KDVFS_DAEMON_SOCKET=str(daemon.socket))
    child = subprocess.Popen(
        [sys.executable, str(HERE / "nvml_child.py"), str(daemon.socket.parent / "own-leases"), "sleep"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout.readline().strip() == "locked", child.stderr.read()
    child.send_signal(signal.SIGKILL if ending == "sigkill" else signal.SIGTERM)
    child.wait(timeout=10)
    assert [c["fn"] for c in daemon.wait_for_calls(4)] == LOCK_CALLS + RESET_CALLS
    with daemon.client() as client:
        assert client.status().resets == 1


def test_a_socket_in_a_folder_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    result = subprocess.run(
        [sys.executable, "-m", "kdvfs.cli", "daemon", "--socket", str(shared / "daemon.sock")],
        env=fake_nvml_env(tmp_path / "calls.jsonl"), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"kdvfs daemon: error: the socket's folder {shared} may be written by others (mode 1777, owner uid "
        f"{os.getuid()}): use a folder only root may write, such as /run/kdvfs"
    )
    assert not (shared / "daemon.sock").exists()


def test_a_lease_that_cannot_be_written_locks_nothing(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    process = DaemonProcess(tmp_path, "--lease-dir", str(blocker / "leases"))
    try:
        with process.client() as client:
            with pytest.raises(KdvfsError, match=r"cannot write clock lease in .*a-file/leases"):
                client.lock(0, ClockPair(1410, 3201))
            assert not client.status().gpus[0].leased
        assert process.calls() == []
    finally:
        process.stop()
