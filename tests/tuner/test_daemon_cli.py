"""`kdvfs daemon status|lock` and `kdvfs doctor` against a real daemon process (fake NVML card)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from kdvfs.cli.commands import daemon as daemon_command
from kdvfs.cli.commands import doctor
from kdvfs.runtime import daemon_client, nvml_device
from kdvfs.runtime.types import ClockPair
from tests.runtime import fake_pynvml
from tests.runtime.daemon_process import DaemonProcess, fake_nvml_env


def kdvfs(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kdvfs.cli", *argv], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    process = DaemonProcess(tmp_path_factory.mktemp("daemon"), gpu_count=2)
    yield process
    process.stop()


def test_status_json_names_each_gpus_lease(daemon):
    with daemon.client() as client:
        client.lock(1, ClockPair(990, 2201))
        result = kdvfs("daemon", "status", "--socket", str(daemon.socket), "--json")
        text = kdvfs("daemon", "status", "--socket", str(daemon.socket))
        client.reset(1)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "gpus": [
            {"index": 0, "leased": False, "holder_pid": None, "core_mhz": None, "mem_mhz": None},
            {"index": 1, "leased": True, "holder_pid": os.getpid(), "core_mhz": 990, "mem_mhz": 2201},
        ],
        "resets": 0,
    }
    assert (
        f"GPU 1 (GPU-fa4e0000-0000-0000-0000-000000000001): leased by pid {os.getpid()} at 990/2201 MHz"
        in text.stdout
    )


def test_lock_without_clocks_or_without_a_daemon_is_one_line_and_exit_2(daemon, tmp_path):
    result = kdvfs("daemon", "lock", "--socket", str(daemon.socket), "--gpu", "0")
    assert (result.returncode, result.stderr) == (2, "kdvfs daemon: error: daemon lock needs --core, --mem\n")
    result = kdvfs("daemon", "status", "--socket", str(tmp_path / "none.sock"))
    assert result.returncode == 2
    assert result.stderr == (
        f"kdvfs daemon: error: no clock daemon answers on {tmp_path / 'none.sock'} (No such file or directory)\n"
    )


def test_the_command_module_imports_only_the_standard_library():
    code = "import sys, kdvfs.cli.commands.daemon; print('pydantic' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
    assert str(daemon_client.DEFAULT_SOCKET) == daemon_command.DEFAULT_SOCKET


def test_doctor_says_whether_a_daemon_answers_and_what_this_uid_may_lock(
    daemon, tmp_path, monkeypatch, capsys
):
    fake_pynvml.configure(gpu_count=2)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv(nvml_device.NVML_MODULE_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(nvml_device, "admin_privilege", lambda: (False, "not root and no CAP_SYS_ADMIN"))
    monkeypatch.setattr(doctor, "ENERGY_POLL_S", 0.05)
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)

    monkeypatch.setenv(daemon_client.DAEMON_SOCKET_ENV, str(tmp_path / "none.sock"))
    assert doctor.run(parser.parse_args(["--index", "0"])) == 0
    assert f"clock daemon: none at {tmp_path / 'none.sock'} (no socket there)" in capsys.readouterr().out

    monkeypatch.setenv(daemon_client.DAEMON_SOCKET_ENV, str(daemon.socket))
    calls_before = daemon.calls()
    report = tmp_path / "doctor.json"
    assert doctor.run(parser.parse_args(["--index", "1", "--json", str(report)])) == 0
    out = capsys.readouterr().out
    assert (
        f"clock daemon: {daemon.socket} answers; uid {os.getuid()} may lock GPU 0: core 345-1980 MHz" in out
    )
    payload = json.loads(report.read_text())
    assert payload["daemon"]["answers"] and payload["daemon"]["uid"] == os.getuid()
    assert [r["gpu"] for r in payload["daemon"]["may_lock"]] == [0, 1]
    assert payload["gpus"][0]["set_clocks"]["allowed"] is True
    assert payload["gpus"][0]["set_clocks"]["reason"].startswith(
        f"through the clock daemon at {daemon.socket}"
    )
    assert daemon.calls() == calls_before  # doctor changed nothing


def test_help_lists_the_daemon_command():
    result = kdvfs("--help", env=fake_nvml_env(os.devnull))
    assert result.returncode == 0 and "daemon" in result.stdout
