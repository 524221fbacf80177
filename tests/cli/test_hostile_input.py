"""Hostile input to the command line: one-line errors and exit 2, interrupts that keep what was
measured (exit 130 with a partial JSON, MLflow run KILLED), signals while or after the outputs
are written (they are complete: exit 130/143 and one line), the plan store saying why it stored
nothing, and a hypothesis fuzz of every subcommand's options (exit 0, 2 or 130, never a
traceback, an error in one line)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdvfs.cli import build_parser, main
from kdvfs.cli.commands._common import InterruptedAfterOutputs, write_all


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 2
    return code, capsys.readouterr().err


@pytest.fixture
def binary_file(tmp_path) -> Path:
    path = tmp_path / "binary.tok"
    path.write_bytes(bytes(range(256)))
    return path


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["serve", "--db", ""], "not a database URL"),
        (["serve", "--db", "nonsense://x"], "unknown database kind 'nonsense'"),
        (["serve", "--db", "sqlite:///"], "in-memory"),
        (["serve", "--port-file", "{tmp}"], "is a directory"),
        (["serve", "--pool-wait-s", "0"], "--pool-wait-s must be a positive number of seconds"),
        (["serve", "--pool-wait-s", "nan"], "--pool-wait-s must be a positive number of seconds"),
        (["daemon", "status", "--json", "{tmp}"], "is a directory"),
        (["serve", "--token-file", "{binary}"], "cannot read the token file"),
        (["tune", "--seconds", "1", "--no-mlflow", "--service", "http://[::1"], "not a valid URL"),
        (["tune", "--seconds", "1", "--no-mlflow", "--service", "http://"], "with a host"),
        (
            [
                "tune",
                "--seconds",
                "1",
                "--no-mlflow",
                "--service",
                "http://127.0.0.1:9",
                "--token-file",
                "{binary}",
            ],
            "not a text file",
        ),
    ],
)
def test_a_bad_path_or_url_is_one_line_naming_the_problem_and_exit_2(
    argv, problem, tmp_path, binary_file, capsys
):
    argv = [a.format(tmp=tmp_path, binary=binary_file) for a in argv]
    code, err = run_main(argv, capsys)
    assert code == 2
    assert problem in err and "internal error" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_signal_while_the_outputs_are_written_is_delivered_once_every_one_is_written(tmp_path):
    written = []

    def first() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        written.append("first")

    with pytest.raises(InterruptedAfterOutputs) as caught:
        write_all([("first", first), ("second", lambda: written.append("second"))])
    assert written == ["first", "second"]
    assert caught.value.signum == signal.SIGTERM


def _silent_service() -> tuple[socket.socket, int]:
    """A service that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


def _tune_interrupted_after(line_start: str, extra: list[str], tmp_path: Path) -> tuple[int, str]:
    """Run `kdvfs tune` and send SIGINT as soon as a stderr line starts with line_start. The run
    is an hour of training, far more than the signal takes to arrive even on a loaded machine
    (20 s of simulated training once ended before it did)."""
    cmd = [sys.executable, "-m", "kdvfs.cli", "tune", "--seconds", "3600", "--json", "out.json"]
    cmd += ["--mlflow-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", *extra]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        # SIGINT as a terminal delivers it, whatever the suite was started under (a shell's
        # background job ignores SIGINT, and its children inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith(line_start):
            proc.send_signal(signal.SIGINT)
            break
    lines += proc.stderr.read().splitlines(keepends=True)
    return proc.wait(timeout=120), "".join(lines)


def _last_run_status(tmp_path: Path) -> str:
    from mlflow import MlflowClient

    # a client of its own: mlflow.set_tracking_uri would leak into the worker's later tests
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.status


def test_ctrl_c_while_a_silent_service_is_asked_keeps_a_partial_json_and_ends_the_run_killed(tmp_path):
    server, port = _silent_service()
    try:
        code, err = _tune_interrupted_after("service:", ["--service", f"http://127.0.0.1:{port}"], tmp_path)
    finally:
        server.close()
    assert code == 130, err
    assert "internal error" not in err and "Traceback" not in err
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["partial"] is True and doc["interrupted_while"]
    assert _last_run_status(tmp_path) == "KILLED"


def test_a_plan_store_run_that_stores_nothing_says_why_in_one_line_and_in_its_json(tmp_path, capsys):
    argv = ["tune", "--seconds", "10", "--no-mlflow", "--no-sweep", "--plan-store", str(tmp_path / "plans")]
    code, _ = run_main([*argv, "--json", str(tmp_path / "run.json")], capsys)
    doc = json.loads((tmp_path / "run.json").read_text())
    assert code == 0
    assert doc.get("plan_stored") or doc.get("plan_not_stored")  # never silent
    if doc.get("plan_not_stored"):
        assert not (tmp_path / "plans").exists() or not any((tmp_path / "plans").iterdir())


# --- a fuzz of every subcommand's options ----------------------------------------------------------
HOSTILE = st.sampled_from(
    [
        "",
        "0",
        "-1",
        "-0.0",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "1e308",
        "1e-320",
        "9" * 400,
        "x" * 300,
        "é\u202e",
        "{dir}",
        "{binary}",
        "/proc/x.json",
        "a/b/../../c",
    ]
)

#: Commands left out of the fuzz: `demo` runs the demo and takes no options worth fuzzing;
#: `doctor` reads the machine's GPUs.
LEFT_OUT = {"demo", "doctor"}
#: Each long-running command gets one option that its own checks refuse before any work, so a
#: valid draw of the others never starts a server, a daemon or a long job (the fuzz checks
#: the parsing and the checks before it, not the run).
STOPPER = {
    "serve": ["--db", ""],
    "tune": ["--seconds", "nan"],
    "probe": ["--seconds", "nan"],
    "sweep": ["--window-s", "nan"],
    "compare": ["--window-s", "nan"],
    "scenario": ["--at-s", "nan"],
}


def _options() -> dict[str, list[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    found = {}
    for name, subparser in sub.choices.items():
        found[name] = [
            a.option_strings[-1]
            for a in subparser._actions
            if a.option_strings and a.nargs != 0 and a.option_strings[-1] != "--help"
        ]
    return found


OPTIONS = _options()


@settings(
    max_examples=60, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
@given(
    command=st.sampled_from(sorted(set(OPTIONS) - LEFT_OUT)),
    picks=st.lists(st.tuples(st.integers(0, 200), HOSTILE), min_size=1, max_size=3),
)
def test_every_subcommands_options_with_hostile_values_exit_0_2_or_130_in_one_line(
    command, picks, tmp_path_factory
):
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "binary").write_bytes(bytes(range(256)))
    options = OPTIONS[command]
    argv = [command] + (["status", "--socket", str(tmp / "none.sock")] if command == "daemon" else [])
    for index, value in picks:
        if options:
            argv += [options[index % len(options)], value.format(dir=tmp, binary=tmp / "binary")]
    if "--no-mlflow" in options:
        argv.append("--no-mlflow")
    stopper = STOPPER.get(command, [])
    if stopper and stopper[0] not in argv:
        argv += stopper
    if command in STOPPER and stopper[0] in argv and argv[argv.index(stopper[0]) + 1] not in ("", "nan"):
        argv[argv.index(stopper[0]) + 1] = stopper[1]  # the drawn value might be a valid one
    code, err = subprocess_free_main(argv, tmp)
    assert code in (0, 2, 130), (argv, code, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    if code == 2:
        assert len([line for line in err.splitlines() if line.strip()]) == 1, (argv, err)


def subprocess_free_main(argv: list[str], cwd: Path) -> tuple[int, str]:
    """main(argv) in this process, stderr captured, in cwd; a command that would start a
    server or run for long is refused by its own checks first (NEVER_RUN gets bad values)."""
    import contextlib
    import io

    err = io.StringIO()
    old = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(old)
    return code, err.getvalue()


def test_the_fuzz_covers_every_subcommand_but_the_demo_and_the_doctor():
    assert set(OPTIONS) - LEFT_OUT >= {"tune", "sweep", "serve", "daemon", "plan", "probe", "calibrate"}
