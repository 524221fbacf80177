"""The CLI under bad input, faults and interruptions: exit 0 or one error line, never a
traceback or a hang; Ctrl-C/SIGTERM in each phase of `tune` keeps what was done; bad output
paths are refused before any work; a tracking store that cannot work is spooled at once."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import os
import signal
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient

import kdvfs.tuner.calibration
import kdvfs.tuner.compare
import kdvfs.tuner.peers
import kdvfs.tuner.run
import kdvfs.tuner.scenarios
import kdvfs.tuner.step_tuner
import kdvfs.tuner.sweep
from kdvfs.cli import main
from kdvfs.tuner.plan import load_plan

ORACLES = importlib.import_module("kdvfs.tuner.oracle")  # the module (kdvfs.tuner.oracle is a function)

#: Wall-clock limit of one CLI case in these tests; s.
CASE_TIMEOUT_S = 60
TINY_TUNE = ["tune", "--device", "sim:rtx3080ti-fastswitch", "--strategy", "ucb", "--seconds", "30"]


class CaseTimeout(Exception):
    pass


def run_cli(*argv: str) -> tuple[int, str, str]:
    """main(argv) in this process with its stdout and stderr; fails a case that hangs."""

    def expire(signum, frame):
        raise CaseTimeout(f"kdvfs {' '.join(argv)} ran past {CASE_TIMEOUT_S} s")

    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse: usage errors, --help, --version
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue()


def assert_clean_ending(code: int, err: str) -> None:
    """Exit 0, or exit 2 whose last stderr line is the one error; never a traceback."""
    assert "Traceback" not in err and "internal error" not in err, err
    if code != 0:
        last = err.strip().splitlines()[-1]
        assert code == 2 and "error:" in last, err


# -- hostile input, property-based ---------------------------------------------------------

_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1e-12, 1e6, 1e9, 1e18, 1e300]),
    st.floats(min_value=1e-4, max_value=1e-2),
).map(lambda x: repr(x) if isinstance(x, float) else str(x))
_cells = st.one_of(_numbers, st.text(max_size=5), st.just(""))


@st.composite
def tables(draw) -> str:
    """A small canonical or NV-DVFS table with hostile cells among plausible ones."""
    nvdvfs = draw(st.booleans())
    header = (
        ["appName", "kernel", "coreF", "memF", "time/ms", "power/W"]
        if nvdvfs
        else ["kernel", "core_mhz", "mem_mhz", "time_s", draw(st.sampled_from(["energy_j", "power_w"]))]
    )
    if draw(st.booleans()):
        header.remove(draw(st.sampled_from(header)))
    rows = []
    for kernel in ("k1", "k2"):
        for core in (1000, 1500):
            plausible = (["app"] if nvdvfs else []) + [
                kernel,
                str(core),
                "5000",
                "0.5" if nvdvfs else "0.0005",
                "200",
            ]
            rows.append([draw(_cells) if draw(st.integers(0, 9)) == 0 else cell for cell in plausible])
    return "\n".join(",".join(r) for r in [header, *rows]) + "\n"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=tables())
def test_hostile_tables_end_in_a_result_or_one_error_line(tmp_path_factory, table):
    path = tmp_path_factory.mktemp("table") / "t.csv"
    path.write_text(table)
    code, _, err = run_cli("sweep", "--device", f"replay:{path}", "--workload", "table", "--window-s", "0.01")
    assert_clean_ending(code, err)


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_json_values, field=st.sampled_from(["groups", "gpu", "expected", "budget", "workload", None]))
def test_hostile_plans_end_in_a_result_or_one_error_line(tmp_path_factory, good_plan_doc, doc, field):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(json.dumps(doc if field is None else {**good_plan_doc, field: doc}))
    for action in (["show"], ["show", "--json"], ["diff", str(path)]):
        code, _, err = run_cli("plan", *action, str(path))
        assert_clean_ending(code, err)


_arg_values = st.one_of(_numbers, st.text(max_size=6), st.sampled_from(["ucb", "foo", "1", "0"]))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    option=st.sampled_from(["--budget", "--strategy", "--seed", "--noise", "--prior"]),
    value=_arg_values,
)
def test_hostile_tune_arguments_end_in_a_run_or_one_error_line(option, value):
    code, _, err = run_cli(*TINY_TUNE, "--no-sweep", "--no-mlflow", option, value)
    assert_clean_ending(code, err)


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "1e400", "ten"])
def test_training_seconds_that_are_not_a_positive_number_are_refused_in_one_line(value):
    # a large --seconds is a long run, as asked: not hostile, so not in the property test
    code, _, err = run_cli(*TINY_TUNE, "--no-mlflow", "--seconds", value)
    assert code == 2 and err.count("\n") == 1 and "--seconds" in err, err


@settings(max_examples=15, deadline=None)
@given(
    option=st.sampled_from(["--seeds", "--window-s", "--max-measurements-per-kernel", "--strategies"]),
    value=_arg_values,
)
def test_hostile_compare_arguments_are_refused_in_one_line_or_accepted(option, value):
    code, _, err = run_cli("compare", option, value, "--help")
    assert code in (0, 2) and "Traceback" not in err


@pytest.fixture(scope="module")
def good_plan_doc(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("good") / "plan.json"
    code, _, err = run_cli(*TINY_TUNE, "--no-sweep", "--no-mlflow", "--plan-out", str(path))
    assert code == 0, err
    return json.loads(path.read_text())


def test_an_absurd_kernel_time_is_refused_with_file_row_and_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("kernel,core_mhz,mem_mhz,time_s,energy_j\nk1,1000,5000,1e15,1\nk1,1500,5000,0.001,0.1\n")
    code, _, err = run_cli("sweep", "--device", f"replay:{path}", "--workload", "table")
    assert code == 2 and f"{path}: row 1 (line 2), column 'time_s'" in err and "not plausible" in err


def test_an_nvdvfs_table_without_power_is_reported_as_missing_power(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("appName,kernel,coreF,memF,time/ms\na,k,1000,5000,1.0\n")
    code, _, err = run_cli("sweep", "--device", f"replay:{path}", "--workload", "table")
    assert code == 2 and "missing required column 'power/W'" in err


# -- outputs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, make_bad",
    [
        ("--json", lambda d: d),  # a directory
        ("--plan-out", lambda d: d / "a-file" / "plan.json"),  # under a file
        ("--plan-store", lambda d: d / "a-file"),  # a file
    ],
)
def test_a_bad_output_path_is_refused_before_any_work(tmp_path, option, make_bad):
    (tmp_path / "a-file").write_text("")
    start_s = time.monotonic()
    code, out, err = run_cli(*TINY_TUNE, "--no-mlflow", option, str(make_bad(tmp_path)))
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"kdvfs tune: error: {option}")
    assert out == "" and time.monotonic() - start_s < 5


def test_plans_are_written_with_the_users_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        code, _, err = run_cli(
            *TINY_TUNE, "--no-sweep", "--no-mlflow", "--plan-out", str(tmp_path / "p.json")
        )
    finally:
        os.umask(previous)
    assert code == 0, err
    assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o644


def test_an_unwritable_tracking_store_is_spooled_at_once(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    start_s = time.monotonic()
    code, _, err = run_cli(
        *TINY_TUNE,
        "--no-sweep",
        "--mlflow-uri",
        f"sqlite:///{tmp_path / 'a-file' / 'm.db'}",
        "--json",
        "t.json",
    )
    assert code == 0, err
    assert time.monotonic() - start_s < 60  # MLflow alone would retry for minutes
    assert list((tmp_path / "kdvfs-spool").glob("*.jsonl")), "the run was not kept in the spool"
    failures = [r for r in caplog.records if "failed" in r.getMessage() and "spooled" in r.getMessage()]
    assert len(failures) == 1
    assert json.loads((tmp_path / "t.json").read_text())["partial"] is False


# -- interruptions -------------------------------------------------------------------------


def _terminate_on_call(monkeypatch, owner, name: str, call: int = 1) -> None:
    """Send this process SIGTERM when `owner.name` is called the `call`-th time: the phase it
    belongs to is interrupted by a real signal through the CLI's real handler (reaching inside
    only to pick the moment)."""
    original = getattr(owner, name)
    calls = [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)


@pytest.mark.parametrize(
    "owner, name, phase, plan_kept",
    [
        (kdvfs.tuner.run, "model_schedule", "choosing the prior", False),
        (kdvfs.tuner.step_tuner.StepTuner, "on_step_end", "training under the tuner", True),
        (ORACLES, "one_knob_oracle", "computing the oracles (the card's noiseless in-step evaluation)", True),
    ],
    ids=["prior", "training", "oracles"],
)
def test_sigterm_in_each_phase_of_tune_keeps_plan_json_and_a_killed_run(
    tmp_path, monkeypatch, owner, name, phase, plan_kept, sqlite_store_uri
):
    monkeypatch.chdir(tmp_path)
    _terminate_on_call(monkeypatch, owner, name)
    uri = sqlite_store_uri
    # MLflow only where an interrupt can lose the run (the last phase); Ctrl-C while tuning with
    # MLflow is test_tune_cli's subprocess test
    tracking = ["--mlflow-uri", uri] if phase.startswith("computing the oracles") else ["--no-mlflow"]
    code, _, err = run_cli(*TINY_TUNE, *tracking, "--json", "t.json", "--plan-out", "plan.json")
    assert code == 130 and f"interrupted while {phase}" in err and "Traceback" not in err
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["partial"] is True and doc["interrupted_while"] == phase
    assert (tmp_path / "plan.json").exists() == plan_kept
    if plan_kept:
        assert math.isclose(
            load_plan(tmp_path / "plan.json").energy_saving, doc["energy_saving"], abs_tol=1e-12
        )
        assert doc["realisable_oracle"] is None
    if "--mlflow-uri" in tracking:
        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("kdvfs-tune").experiment_id])
        assert run.info.status == "KILLED"


@pytest.fixture(scope="module")
def small_table(tmp_path_factory) -> str:
    """A replayed card: 3 kernels on a 2 x 2 grid, tens of ms each (few simulated steps
    fill a reference: a sweep takes well under a second)."""
    rows = ["kernel,core_mhz,mem_mhz,time_s,energy_j"]
    for k in range(3):
        for core in (1000, 1500):
            for mem in (5000, 6000):
                time_s = 0.03 * (1 + 0.2 * k) * (1500 / core) ** (0.5 + 0.2 * k) * (6000 / mem) ** 0.2
                rows.append(f"k{k},{core},{mem},{time_s:.6g},{time_s * (80 + 0.1 * core + 0.01 * mem):.6g}")
    path = tmp_path_factory.mktemp("table") / "t.csv"
    path.write_text("\n".join(rows) + "\n")
    return f"replay:{path}"


LADDER = Path(__file__).resolve().parents[2] / "data" / "h200" / "kernels_ladder.csv"


def _killed_runs(uri: str, experiment: str) -> dict[str, str]:
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return {run.info.run_name: run.info.status for run in runs}


@pytest.mark.parametrize(
    "command, owner, name, call, phase, kept",
    [
        ("sweep", kdvfs.tuner.sweep, "measure_reference_steps", 1, "measuring the stock reference", {}),
        ("sweep", kdvfs.tuner.sweep, "measure_cell", 6, "measuring every clock pair", {"measurements": 5}),
        ("compare", kdvfs.tuner.compare, "run_sweep", 2, "running the full sweep, seed 1", {"sweeps": 1}),
        ("compare", kdvfs.tuner.compare, "run_search", 2, "running ucb, seed 0", {"searches": ["random"]}),
        ("scenario", kdvfs.tuner.scenarios, "PlanStore", 1, "running scenario power-cap", {}),
        ("peers", kdvfs.tuner.peers, "run_peers", 1, "starting", {}),
        ("calibrate", kdvfs.tuner.calibration, "parse_probe_kernel", 4, "simulating the probe's kernels", {"rows": 3}),
    ],
    ids=["sweep-reference", "sweep-pairs", "compare-sweep", "compare-search", "scenario", "peers", "calibrate"],
)  # fmt: skip
def test_sigterm_in_any_phase_of_the_other_commands_keeps_partial_json_and_killed_runs(
    tmp_path, monkeypatch, small_table, sqlite_store_uri, command, owner, name, call, phase, kept
):
    monkeypatch.chdir(tmp_path)
    _terminate_on_call(monkeypatch, owner, name, call)
    uri = sqlite_store_uri
    argv = {
        "sweep": ["sweep", "--device", small_table, "--workload", "table", "--window-s", "0.1"],
        "compare": [
            "compare",
            "--device",
            small_table,
            "--workload",
            "table",
            "--strategies",
            "random,ucb",
            "--seeds",
            "2" if "sweeps" in kept else "1",
            "--window-s",
            "0.1",
            "--mlflow-uri",
            uri,
        ],
        "scenario": ["scenario", "power-cap", "--mlflow-uri", uri],
        "peers": ["peers", "envpipe-sm-stepdown", "--no-mlflow"],
        "calibrate": ["calibrate", "--against", str(LADDER)],
    }[command]
    code, _, err = run_cli(*argv, "--json", "out.json")
    assert code == 130 and f"interrupted while {phase}" in err and "Traceback" not in err, err
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["partial"] is True and doc["interrupted_while"] == phase
    if "measurements" in kept:  # what was measured is planned from: the rest stays at stock
        assert doc["measurements"] == kept["measurements"] and doc["kernels_swept"] == 1
        assert set(doc["kernel_level"]["plan"]) == {"k0", "k1", "k2"}
    if "sweeps" in kept:
        assert len(doc["sweep"]["runs"]) == kept["sweeps"] and doc["strategies"] == {}
        assert _killed_runs(uri, "kdvfs-compare") == {"compare": "KILLED"}
    if "searches" in kept:
        assert list(doc["strategies"]) == kept["searches"] and doc["summary"]["random"]["measurements"] > 0
        runs = _killed_runs(uri, "kdvfs-compare")
        assert runs == {"compare": "KILLED", "random-seed0": "FINISHED", "ucb-seed0": "KILLED"}
    if "rows" in kept:
        assert len(doc["rows"]) == kept["rows"]
    if command == "scenario":
        assert _killed_runs(uri, "kdvfs-scenarios") == {"power-cap-botorch": "KILLED"}


def test_the_headline_plan_show_and_mlflow_report_one_saving(tmp_path, monkeypatch, sqlite_store_uri):
    monkeypatch.chdir(tmp_path)
    uri = sqlite_store_uri
    code, out, err = run_cli(*TINY_TUNE, "--no-sweep", "--mlflow-uri", uri, "--plan-out", "plan.json")
    assert code == 0, err
    plan = load_plan(tmp_path / "plan.json")
    headline = out.splitlines()[0]
    assert (
        headline.startswith("This run ")
        and f"saves {max(100 * plan.energy_saving, 0):.2f}% energy" in headline
    )
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("kdvfs-tune").experiment_id])
    assert math.isclose(run.data.metrics["final_energy_saving"], plan.energy_saving, abs_tol=1e-12)
    assert run.data.params["gpu"] == plan.gpu_name and run.data.tags["source"] == "simulated"


def test_an_absurd_noise_scale_is_refused_before_any_work():
    # found by the hostile-argument test: --noise 4979 kept a tiny tune running past 60 s
    for command in (TINY_TUNE, ["compare", "--seeds", "1"]):
        code, _, err = run_cli(*command, "--noise", "4979")
        assert code == 2 and "--noise" in err and "at most 20" in err, err


def test_version_prints_the_package_version():
    from kdvfs import __version__

    code, out, _ = run_cli("--version")
    assert code == 0 and out.strip() == f"kdvfs {__version__}"
