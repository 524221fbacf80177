"""`kdvfs calibrate --against-steps DIR`: each recorded whole training step (data/h200/steps/)
simulated at stock against its measured time and energy; the acceptance test of the simulated
H200's calibration on whole steps (every recorded step within 5%, the steps the in-step busy
shares were fitted to and those held out alike)."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from kdvfs.cli import main
from kdvfs.cli.commands.calibrate import STEP_TARGET
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.trace import load_trace, trace_workload
from kdvfs.tuner.calibration import PROFILER_OVERHEAD_S, fit_role, host_pace_s, recorded_steps, simulate_step

STEPS = Path(__file__).resolve().parents[2] / "data" / "h200" / "steps"


def _one_step(folder: Path, shape: str) -> Path:
    """A folder of recorded steps holding only `shape` (the recording's own rows)."""
    folder.mkdir()
    summary = json.loads((STEPS / "steps_summary.json").read_text())
    summary["shapes"] = [s for s in summary["shapes"] if s["shape"] == shape]
    (folder / "steps_summary.json").write_text(json.dumps(summary))
    with gzip.open(STEPS / "steps_kernels.csv.gz", "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["shape"] == shape]
    with gzip.open(folder / "steps_kernels.csv.gz", "wt", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    return folder


def test_a_recorded_step_is_printed_and_written_with_its_simulated_and_measured_time_and_energy(
    tmp_path, capsys
):
    folder = _one_step(tmp_path / "steps", "mlp_fp32_sgd")
    code = main(["calibrate", "--against-steps", str(folder), "--json", str(tmp_path / "c.json")])
    assert code == 0
    out = capsys.readouterr().out
    assert "simulated, stock clocks" in out and "measured on a real GPU" in out and "mlp_fp32_sgd" in out
    (row,) = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert row["measured_step_s"] == pytest.approx(0.12464, rel=1e-3)  # the recording's own figure
    assert row["time_error"] == pytest.approx(row["simulated_time_s"] / row["measured_step_s"] - 1.0)
    assert abs(row["time_error"]) <= 0.05  # the simulated H200 holds this step's time to 5%
    assert row["energy_error"] == pytest.approx(row["simulated_energy_j"] / row["measured_energy_j"] - 1.0)
    assert row["fit"] == "fitted" and out.splitlines()[-1].endswith("fitted")  # the shares were fitted to it


def test_a_step_the_in_step_shares_were_not_fitted_to_is_marked_held_out(tmp_path, capsys):
    folder = _one_step(tmp_path / "steps", "resnet50_bf16_b128")
    assert main(["calibrate", "--against-steps", str(folder), "--json", str(tmp_path / "c.json")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("held out")
    (row,) = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert row["fit"] == "held out" == fit_role("resnet50_bf16_b128")


RECORDED = {step.shape: step for step in recorded_steps(STEPS)}


@pytest.fixture(scope="module")
def simulated() -> dict:
    """Each recorded step simulated at stock once (StepRow by shape)."""
    return {}


def _row(simulated: dict, shape: str):
    if shape not in simulated:
        simulated[shape] = simulate_step(SimulatedDevice("h200", noise=0.0), RECORDED[shape])
    return simulated[shape]


@pytest.mark.parametrize("shape", sorted(RECORDED))
def test_every_recorded_step_is_simulated_within_5_percent_of_its_measured_time(shape, simulated):
    row = _row(simulated, shape)
    assert abs(row.time_error) <= STEP_TARGET, f"{shape}: time {row.time_error:+.2%}"


@pytest.mark.parametrize("shape", sorted(RECORDED))
def test_every_recorded_step_is_simulated_within_5_percent_of_its_measured_energy(shape, simulated):
    row = _row(simulated, shape)
    assert abs(row.energy_error) <= STEP_TARGET, f"{shape}: energy {row.energy_error:+.2%}"


def test_the_probes_gpt3xl_block_runs_within_5_percent_of_the_real_cards_time_and_energy_a_step():
    # the real H200: 6.7-7.04 ms and 4.7-4.86 J a step (data/h200-probe, data/h200-window-noise)
    workload = load_trace(STEPS.parents[1] / "h200-probe" / "gpt3xl_block_kernels.csv")
    time_s, energy_j = SimulatedDevice("h200", noise=0.0).expected_step(
        [(k, None, 1) for k in workload.kernels]
    )
    assert 6.7e-3 * (1 - STEP_TARGET) <= time_s <= 7.04e-3 * (1 + STEP_TARGET)
    assert 4.7 * (1 - STEP_TARGET) <= energy_j <= 4.86 * (1 + STEP_TARGET)


def test_a_folder_without_its_kernel_trace_is_refused_in_one_line(tmp_path, capsys):
    folder = _one_step(tmp_path / "steps", "mlp_fp32_sgd")
    (folder / "steps_kernels.csv.gz").unlink()
    assert main(["calibrate", "--against-steps", str(folder)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no steps_kernels.csv.gz" in err[0]


def test_a_launch_bound_step_takes_its_hosts_pace_and_a_gpu_bound_one_its_kernels_time(simulated):
    launch_bound, gpu_bound = RECORDED["resnet18_bf16_b32_sgd"], RECORDED["mlp_fp32_sgd"]
    workload = trace_workload(launch_bound.source, launch_bound.shape, launch_bound.rows)
    pace_s = host_pace_s(workload)  # the profiled trace's time a step, less the profiler's overhead
    span_s = float(dict(workload.meta)["span_us_per_step"]) * 1e-6
    assert pace_s == pytest.approx(span_s - len(workload.kernels) * PROFILER_OVERHEAD_S)
    assert pace_s > 3.0 * sum(k.ref_time_s for k in workload.kernels)  # the GPU waits on its host
    assert _row(simulated, launch_bound.shape).simulated_time_s == pytest.approx(pace_s, rel=1e-3)
    workload = trace_workload(gpu_bound.source, gpu_bound.shape, gpu_bound.rows)
    assert host_pace_s(workload) < _row(simulated, gpu_bound.shape).simulated_time_s


def _with_grids(folder: Path, shape: str, blocks_per_sm: str, reverse: bool = False) -> None:
    """The folder's steps_grids.csv.gz: each of the step's kernels at blocks_per_sm, named in the
    recording's order (reverse: in the opposite order, a profile of another code path)."""
    with gzip.open(folder / "steps_kernels.csv.gz", "rt", newline="") as f:
        names = [r["name"] for r in csv.DictReader(f)]
    names = names[::-1] if reverse else names
    with gzip.open(folder / "steps_grids.csv.gz", "wt", newline="") as f:
        out = csv.writer(f)
        out.writerow(
            (
                "shape",
                "index",
                "name",
                "start_us",
                "duration_us",
                "grid_blocks",
                "block_threads",
                "blocks_per_sm",
            )
        )
        out.writerows((shape, i, n, i, 1.0, 33, 256, blocks_per_sm) for i, n in enumerate(names))


def test_kernels_whose_recorded_grids_fill_a_quarter_of_the_sms_draw_less_and_take_as_long(tmp_path):
    plain = recorded_steps(_one_step(tmp_path / "plain", "mlp_fp32_sgd"))[0]
    quarter_folder = _one_step(tmp_path / "quarter", "mlp_fp32_sgd")
    _with_grids(quarter_folder, "mlp_fp32_sgd", "0.25")
    quarter = recorded_steps(quarter_folder)[0]
    assert all(r.cells["blocks_per_sm"] == "0.25" for r in quarter.rows)
    device = SimulatedDevice("h200", noise=0.0)
    a, b = simulate_step(device, plain), simulate_step(device, quarter)
    assert b.simulated_time_s == pytest.approx(a.simulated_time_s, rel=0.01)
    assert b.simulated_energy_j < 0.8 * a.simulated_energy_j


def test_launch_shapes_of_another_kernel_sequence_are_not_matched(tmp_path):
    folder = _one_step(tmp_path / "steps", "mlp_fp32_sgd")
    _with_grids(folder, "mlp_fp32_sgd", "0.25", reverse=True)
    (step,) = recorded_steps(folder)
    assert all("blocks_per_sm" not in r.cells for r in step.rows)
