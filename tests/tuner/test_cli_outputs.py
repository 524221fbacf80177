"""The CLI's outputs: no output overwrites an input or another output, every output is proved
writable where it will be written before any work, and nothing is claimed written that was
not (a closed stdout pipe, a spool that cannot be written) nor claimed lost that was written."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from kdvfs.tuner.plan import load_plan
from kdvfs.tuner.tracking import Tracker
from tests.tuner.test_cli_robustness import TINY_TUNE, run_cli

QUICK_TUNE = [*TINY_TUNE, "--no-sweep", "--no-mlflow"]


def assert_refused_before_any_work(code: int, out: str, err: str, *words: str) -> None:
    """Exit 2, one error line naming each of `words`, nothing printed on stdout."""
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("kdvfs ") and " error: " in err, err
    for word in words:
        assert word in err, err


@pytest.fixture
def table_csv(tmp_path: Path) -> Path:
    """A replayed card: 2 kernels on a 2 x 2 grid."""
    rows = ["kernel,core_mhz,mem_mhz,time_s,energy_j"]
    for k in range(2):
        for core in (1000, 1500):
            for mem in (5000, 6000):
                time_s = 0.02 * (1 + k) * (1500 / core) ** 0.6
                rows.append(f"k{k},{core},{mem},{time_s:.6g},{time_s * (80 + 0.1 * core):.6g}")
    path = tmp_path / "t.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


# -- clashes -------------------------------------------------------------------------------


def test_a_report_and_a_plan_written_to_one_file_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(*QUICK_TUNE, "--json", "s.json", "--plan-out", "s.json")
    assert_refused_before_any_work(code, out, err, "--json", "--plan-out")
    assert not (tmp_path / "s.json").exists()


def test_two_spellings_of_one_output_file_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    code, out, err = run_cli(*QUICK_TUNE, "--json", "sub/../s.json", "--plan-out", str(tmp_path / "s.json"))
    assert_refused_before_any_work(code, out, err, "--json", "--plan-out")


def test_an_output_linked_to_another_output_is_refused(tmp_path):
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "plan.json")
    code, out, err = run_cli(
        *QUICK_TUNE, "--json", str(tmp_path / "link.json"), "--plan-out", str(tmp_path / "plan.json")
    )
    assert_refused_before_any_work(code, out, err, "--json", "--plan-out")
    assert (tmp_path / "plan.json").read_text() == "{}"


def test_a_sweep_report_over_its_own_replay_table_is_refused_and_the_table_kept(table_csv):
    before = table_csv.read_text()
    code, out, err = run_cli(
        "sweep", "--device", f"replay:{table_csv}", "--workload", "table", "--json", str(table_csv)
    )
    assert_refused_before_any_work(code, out, err, "--json", "--device")
    assert table_csv.read_text() == before


def test_a_tune_report_over_its_trace_workload_is_refused(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("kernel,count\nk0,1\n")
    code, out, err = run_cli(*QUICK_TUNE, "--workload", f"trace:{trace}", "--plan-out", str(trace))
    assert_refused_before_any_work(code, out, err, "--plan-out", "--workload")
    assert trace.read_text() == "kernel,count\nk0,1\n"


def test_a_calibration_report_over_the_probe_it_reads_is_refused(tmp_path):
    probe = tmp_path / "kernels_stock.csv"
    probe.write_text("kernel\n")
    code, out, err = run_cli("calibrate", "--against", str(probe), "--json", str(probe))
    assert_refused_before_any_work(code, out, err, "--json", "--against")
    assert probe.read_text() == "kernel\n"


def test_a_report_inside_the_plan_store_is_refused(tmp_path):
    store = tmp_path / "plans"
    code, out, err = run_cli(*QUICK_TUNE, "--plan-store", str(store), "--json", str(store / "r.json"))
    assert_refused_before_any_work(code, out, err, "--json", "--plan-store")


def test_distinct_outputs_are_all_written(tmp_path):
    code, _, err = run_cli(
        *QUICK_TUNE, "--json", str(tmp_path / "r.json"), "--plan-out", str(tmp_path / "p.json")
    )
    assert code == 0, err
    assert json.loads((tmp_path / "r.json").read_text())["partial"] is False
    assert load_plan(tmp_path / "p.json").groups


# -- places an output cannot be written ----------------------------------------------------


@pytest.mark.parametrize("path", ["/proc/x.json", "/sys/x.json", "/proc/self/x.json"])
def test_an_output_under_a_kernel_interface_is_refused_before_any_work(path):
    start_s = time.monotonic()
    code, out, err = run_cli(*QUICK_TUNE, "--json", path)
    assert_refused_before_any_work(code, out, err, "--json", path)
    assert time.monotonic() - start_s < 5


@pytest.mark.parametrize("option", ["--json", "--plan-out", "--plan-store"])
def test_a_name_too_long_for_the_filesystem_is_refused_before_any_work(tmp_path, option):
    code, out, err = run_cli(*QUICK_TUNE, option, str(tmp_path / ("a" * 300 + ".json")))
    assert_refused_before_any_work(code, out, err, option, "bytes")


def test_a_name_too_long_for_its_temporary_file_is_refused_before_any_work(tmp_path):
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    code, out, err = run_cli(*QUICK_TUNE, "--plan-out", str(tmp_path / ("p" * (name_max - 10))))
    assert_refused_before_any_work(code, out, err, "--plan-out", "temporary file")


def test_a_long_name_that_fits_is_written(tmp_path):
    name = "p" * 200 + ".json"
    code, _, err = run_cli(*QUICK_TUNE, "--json", str(tmp_path / name))
    assert code == 0, err
    assert json.loads((tmp_path / name).read_text())["partial"] is False


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_an_output_in_a_read_only_folder_is_refused_before_any_work(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code, out, err = run_cli(*QUICK_TUNE, "--json", str(folder / "r.json"))
    finally:
        folder.chmod(0o755)
    assert_refused_before_any_work(code, out, err, "--json", "permission denied")


# -- a closed stdout pipe ------------------------------------------------------------------


class ClosedAfterFirstLine(io.StringIO):
    """A stdout whose reader left after the first line (`| head -1`)."""

    def write(self, text: str) -> int:
        if "\n" in self.getvalue():
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


def test_a_closed_stdout_pipe_loses_only_the_printed_lines(tmp_path, monkeypatch, sqlite_store_uri):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdout", ClosedAfterFirstLine())
    from kdvfs.cli import main

    code = main(
        [
            *TINY_TUNE,
            "--no-sweep",
            "--mlflow-uri",
            sqlite_store_uri,
            "--plan-out",
            "p.json",
            "--json",
            "r.json",
        ]
    )
    assert code == 0
    assert load_plan(tmp_path / "p.json").groups
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["partial"] is False and "mlflow" in doc
    client = MlflowClient(sqlite_store_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("kdvfs-tune").experiment_id])
    assert run.info.status == "FINISHED" and "final_energy_saving" in run.data.metrics


def test_a_tune_whose_stdout_reader_left_writes_every_output_and_claims_no_loss(tmp_path, sqlite_store_uri):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kdvfs", *TINY_TUNE, "--no-sweep", "--mlflow-uri", sqlite_store_uri,
             "--plan-out", "p.json", "--json", "r.json"],
            cwd=tmp_path, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert "not written" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0 and "Exception ignored" not in done.stderr, done.stderr
    assert load_plan(tmp_path / "p.json").groups
    assert json.loads((tmp_path / "r.json").read_text())["partial"] is False
    client = MlflowClient(sqlite_store_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("kdvfs-tune").experiment_id])
    assert run.info.status == "FINISHED"


# -- a spool that cannot be written --------------------------------------------------------


def test_a_run_neither_stored_nor_spooled_is_said_not_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    (tmp_path / "kdvfs-spool").write_text("")  # the spool folder cannot be made
    code, out, err = run_cli(
        *TINY_TUNE,
        "--no-sweep",
        "--mlflow-uri",
        f"sqlite:///{tmp_path / 'a-file' / 'm.db'}",
        "--json",
        "r.json",
    )
    assert "spooled at" not in out + err
    assert code == 2 and "MLflow run not written" in err, err
    assert json.loads((tmp_path / "r.json").read_text())["partial"] is False


def test_a_spool_in_a_folder_that_cannot_be_written_is_not_claimed(tmp_path):
    (tmp_path / "a-file").write_text("")
    tracker = Tracker(
        f"sqlite:///{tmp_path / 'a-file' / 'm.db'}", experiment="e", spool_dir=tmp_path / "a-file" / "spool"
    )
    run = tracker.start_run("r", params={"a": 1})
    run.log_metrics(0, {"x": 1.0})
    run.end()
    assert not run.written and "spooled at" not in run.url_or_path
    assert "nor the spool" in run.url_or_path


def test_a_spooled_run_is_claimed_where_its_spool_file_is(tmp_path):
    (tmp_path / "a-file").write_text("")
    tracker = Tracker(
        f"sqlite:///{tmp_path / 'a-file' / 'm.db'}", experiment="e", spool_dir=tmp_path / "spool"
    )
    run = tracker.start_run("r", params={"a": 1})
    run.end()
    assert run.written and run.spool_path.exists()
    assert run.url_or_path == f"not uploaded yet: spooled at {run.spool_path}"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_tune_in_a_read_only_folder_does_not_claim_a_spool(tmp_path, monkeypatch):
    (tmp_path / "ro").mkdir()
    monkeypatch.chdir(tmp_path / "ro")
    (tmp_path / "ro").chmod(0o555)
    try:
        code, out, err = run_cli(*TINY_TUNE, "--no-sweep", "--json", str(tmp_path / "r.json"))
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert "spooled at" not in out + err
    assert code == 2 and "MLflow run not written" in err, err


@pytest.mark.parametrize(
    "command", [["peers", "envpipe-sm-stepdown", "--steps", "200"], ["scenario", "power-cap"]]
)
def test_a_peers_or_scenario_run_neither_stored_nor_spooled_is_said_not_written(
    tmp_path, monkeypatch, command
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    (tmp_path / "kdvfs-spool").write_text("")  # the spool folder cannot be made
    code, out, err = run_cli(
        *command, "--mlflow-uri", f"sqlite:///{tmp_path / 'a-file' / 'm.db'}", "--json", "r.json"
    )
    assert "spooled at" not in out + err
    assert code == 2 and "MLflow run not written" in err, err
    assert json.loads((tmp_path / "r.json").read_text())["partial"] is False


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--json"],
        ["compare", "--json"],
        ["calibrate", "--against", "probe.csv", "--json"],
        ["peers", "envpipe-sm-stepdown", "--plot"],
        ["scenario", "power-cap", "--plan-store"],
        ["doctor", "--json"],
        ["probe", "--out"],
        ["serve", "--port-file"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_command_refuses_an_output_under_proc_before_any_work(argv):
    code, out, err = run_cli(*argv, "/proc/kdvfs-out")
    assert_refused_before_any_work(code, out, err, argv[-1], "/proc")


def test_a_service_port_file_over_its_token_file_is_refused_and_the_tokens_kept(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("t0 fleet job\n")
    code, out, err = run_cli("serve", "--token-file", str(tokens), "--port-file", str(tokens))
    assert_refused_before_any_work(code, out, err, "--port-file", "--token-file")
    assert tokens.read_text() == "t0 fleet job\n"
