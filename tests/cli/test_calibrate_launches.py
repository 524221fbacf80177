"""Whole steps recorded with their host's launches (data/h100/steps/: launch_us and host_issue_s):
the simulated GPU waits for each launch of a host that issues a step in its measured issue
time, and a trace recorded on another card is sized for that card's simulated twin."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import pytest

from kdvfs.cli import main
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.tables import CsvRow
from kdvfs.tuner.calibration import (
    RecordedStep,
    graph_launch_gap_s,
    launch_paced_gaps_s,
    launch_paced_wait_s,
    recorded_steps,
    simulate_step,
)

H100_STEPS = Path(__file__).resolve().parents[2] / "data" / "h100" / "steps"
RECORDED = {step.shape: step for step in recorded_steps(H100_STEPS)}
LATENCY_S = 1e-6


def _step(launches_us: list[float], durations_us: list[float], host_issue_s: float) -> RecordedStep:
    """A recorded step of kernels a, b, a, b, ... launched at `launches_us`."""
    rows = tuple(
        CsvRow(
            i + 1,
            i + 2,
            {
                "seq": str(i),
                "name": "ab"[i % 2],
                "start_us": str(launch),
                "duration_us": str(d),
                "launch_us": str(launch),
            },
        )
        for i, (launch, d) in enumerate(zip(launches_us, durations_us, strict=True))
    )
    return RecordedStep("s", Path("s.csv"), rows, step_s=1.0, energy_j=1.0, host_issue_s=host_issue_s)


def test_a_host_slower_than_the_kernels_leaves_the_gpu_idle_for_the_rest_of_its_issue_time():
    # two kernels of 100 us launched 1 ms apart; the host issues a step in 2 ms unprofiled
    step = _step([0.0, 1000.0, 3000.0, 4000.0, 6000.0, 7000.0], [100.0] * 6, host_issue_s=2e-3)
    wait_s = launch_paced_wait_s(step, LATENCY_S)
    assert wait_s == pytest.approx(2e-3 - 2 * (100e-6 + LATENCY_S))


def test_a_host_that_issues_ahead_of_the_kernels_leaves_no_wait():
    step = _step([0.0, 10.0, 30.0, 40.0, 60.0, 70.0], [500.0] * 6, host_issue_s=50e-6)
    assert launch_paced_wait_s(step, LATENCY_S) == 0.0


def test_a_host_slow_in_one_part_of_the_step_delays_only_what_the_queue_cannot_cover():
    # the host issues kernel a late (at 900 of its 1000 us); the GPU runs b (300 us) then a (300 us):
    # the steps follow every 1000 us, so b waits until its launch and a for the host's late issue
    step = _step([0.0, 900.0, 1000.0, 1900.0], [300.0, 300.0, 300.0, 300.0], host_issue_s=1e-3)
    wait_s = launch_paced_wait_s(step, LATENCY_S)
    assert wait_s == pytest.approx(1e-3 - 2 * (300e-6 + LATENCY_S))
    # with kernels longer than the step's issue time the queue covers the host's late part
    step = _step([0.0, 900.0, 1000.0, 1900.0], [600.0, 600.0, 600.0, 600.0], host_issue_s=1e-3)
    assert launch_paced_wait_s(step, LATENCY_S) == 0.0


def test_the_gpu_idles_before_the_kernels_the_host_launches_late_and_the_gaps_sum_to_the_wait():
    # b (launched at 900 of the host's 1000 us) waits for its launch; a, launched before b's end,
    # follows it at once
    step = _step([0.0, 900.0, 1000.0, 1900.0], [300.0, 300.0, 300.0, 300.0], host_issue_s=1e-3)
    gaps_s = launch_paced_gaps_s(step, LATENCY_S)
    assert gaps_s == pytest.approx([0.0, 1e-3 - 2 * (300e-6 + LATENCY_S)], abs=1e-12)
    assert sum(gaps_s) == pytest.approx(launch_paced_wait_s(step, LATENCY_S))


def test_a_recording_without_launches_or_without_the_hosts_issue_time_has_no_launch_pace():
    step = _step([0.0, 10.0, 30.0, 40.0], [5.0] * 4, host_issue_s=1e-3)
    assert launch_paced_wait_s(dataclasses.replace(step, host_issue_s=0.0), LATENCY_S) is None
    bare = tuple(
        CsvRow(r.row, r.line, {k: v for k, v in r.cells.items() if k != "launch_us"}) for r in step.rows
    )
    assert launch_paced_wait_s(dataclasses.replace(step, rows=bare), LATENCY_S) is None


def test_the_h100_recordings_kernels_are_sized_for_the_simulated_h100_and_keep_their_recorded_time():
    step = RECORDED["mlp_fp32_sgd"]  # GPU-bound: its time is its kernels'
    assert step.card == "h100"
    row = simulate_step(SimulatedDevice("h100", noise=0.0), step)
    assert row.wait_source == "launches"
    assert row.time_error == pytest.approx(0.0, abs=0.01)
    as_h200 = simulate_step(SimulatedDevice("h100", noise=0.0), dataclasses.replace(step, card="h200"))
    assert as_h200.simulated_time_s > row.simulated_time_s  # the H200's memory: more bytes a kernel


def test_a_launch_bound_step_takes_its_hosts_issue_time_and_a_gpu_bound_one_its_kernels_time():
    device = SimulatedDevice("h100", noise=0.0)
    launch_bound = RECORDED["resnet50_bf16_b16_sgd"]
    row = simulate_step(device, launch_bound)
    assert row.simulated_time_s == pytest.approx(launch_bound.host_issue_s, rel=0.02)
    gpu_bound = RECORDED["gpt2_medium_sdpa_bf16_b8x1024"]  # host issues in 97 of its 142 ms
    row = simulate_step(device, gpu_bound)
    assert row.simulated_time_s > 1.4 * gpu_bound.host_issue_s
    assert abs(row.time_error) <= 0.01


def test_calibrate_prints_what_paced_the_host_and_the_energy_at_the_measured_time(tmp_path, capsys):
    code = main(
        [
            "calibrate",
            "--device",
            "sim:h100",
            "--against-steps",
            str(H100_STEPS),
            "--json",
            str(tmp_path / "c.json"),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "at meas. time" in out and "launches" in out
    assert "every step held out of it" in out.splitlines()[0]  # the drop after idle gaps: no step fitted
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["after_gap_fitted_on"] == "data/h100/gap_power"
    rows = {r["shape"]: r for r in doc["rows"]}
    assert set(rows) == set(RECORDED)
    for r in rows.values():
        assert r["host_paced_by"] == "launches"
        assert r["energy_error_at_measured_time"] == pytest.approx(
            r["energy_at_measured_time_j"] / r["measured_energy_j"] - 1.0
        )


def test_a_shape_the_recorder_could_not_run_is_left_out_and_the_others_are_calibrated(tmp_path):
    folder = H100_STEPS.parent / "graph-steps"  # two GPT-2 shapes failed their CUDA graph capture
    failed = [
        s["shape"] for s in json.loads((folder / "steps_summary.json").read_text())["shapes"] if "error" in s
    ]
    assert failed and not set(failed) & {step.shape for step in recorded_steps(folder)}
    assert len(recorded_steps(folder)) == 5
    assert (
        main(
            [
                "calibrate",
                "--device",
                "sim:h100",
                "--against-steps",
                str(folder),
                "--json",
                str(tmp_path / "c.json"),
            ]
        )
        == 0
    )
    assert len(json.loads((tmp_path / "c.json").read_text())["rows"]) == 5


def _copy(folder: Path) -> Path:
    """A copy of the H100 recording to spoil."""
    shutil.copytree(H100_STEPS, folder)
    return folder


def test_a_negative_host_issue_time_is_refused_in_one_line(tmp_path, capsys):
    folder = _copy(tmp_path / "steps")
    summary = json.loads((folder / "steps_summary.json").read_text())
    summary["shapes"][0]["host_issue_s"] = -0.01
    (folder / "steps_summary.json").write_text(json.dumps(summary))
    assert main(["calibrate", "--device", "sim:h100", "--against-steps", str(folder)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "host_issue_s of -0.01" in err[0]


def test_a_launch_time_that_is_not_a_number_is_refused_in_one_line(tmp_path, capsys):
    folder = _copy(tmp_path / "steps")
    with gzip.open(folder / "steps_kernels.csv.gz", "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    rows[5]["launch_us"] = "soon"
    with gzip.open(folder / "steps_kernels.csv.gz", "wt", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    assert main(["calibrate", "--device", "sim:h100", "--against-steps", str(folder)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unreadable recording" in err[0] and "soon" in err[0]


def test_the_gpu_bound_h100_steps_repeat_within_two_percent_on_another_machine_and_simulate_within_five():
    """data/h100/steps-repeat/: the same shapes three hours later on another H100."""
    repeat = {step.shape: step for step in recorded_steps(H100_STEPS.parent / "steps-repeat")}
    assert set(repeat) == set(RECORDED)
    device = SimulatedDevice("h100", noise=0.0)
    gpu_bound = [shape for shape, step in RECORDED.items() if step.host_issue_s < 0.8 * step.step_s]
    assert len(gpu_bound) >= 6
    for shape in gpu_bound:
        first, again = RECORDED[shape], repeat[shape]
        assert again.step_s == pytest.approx(first.step_s, rel=0.02), shape
        assert again.energy_j == pytest.approx(first.energy_j, rel=0.02), shape
        assert abs(simulate_step(device, again).time_error) <= 0.05, shape


#: Launch-bound steps (GPU busy under a third of the step) whose energy at their measured time misses
#: 5% (and 7%), and why (docs/benchmarks.md, "The ramp on the H100's recordings, held out")
AT_MEASURED_TIME_MISSES = {
    "resnet50_bf16_b16_sgd": "its short kernels of small grids lose both to the grid's fill and to the ramp "
    "(-9.5%; +0.2% before the ramp); its CUDA graph reads -14.2% (+10.1% before): its kernels' own power",
    "gpt2_small_sdpa_bf16_b2x128": "likewise short kernels of small grids (-8.5%; -4.9% before the ramp)",
}
LAUNCH_BOUND = sorted(
    s for s, step in RECORDED.items() if step.busy_share < 0.35
)  # the five, GPU busy 10-31%
#: LAUNCH_BOUND, each known miss marked a strict xfail with its reason
LAUNCH_BOUND_WITH_MISSES = [
    pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=AT_MEASURED_TIME_MISSES[s]))
    if s in AT_MEASURED_TIME_MISSES
    else s
    for s in LAUNCH_BOUND
]


@pytest.mark.parametrize("shape", LAUNCH_BOUND_WITH_MISSES)
def test_a_launch_bound_step_held_out_of_the_gap_fit_is_within_5_percent_of_its_energy_at_its_measured_time(
    shape,
):
    row = simulate_step(SimulatedDevice("h100", noise=0.0), RECORDED[shape])
    assert abs(row.energy_error_at_measured_time) <= 0.05, (
        f"{shape}: {row.energy_error_at_measured_time:+.2%}"
    )


@pytest.mark.parametrize("shape", LAUNCH_BOUND_WITH_MISSES)
def test_every_launch_bound_step_held_out_of_the_gap_fit_is_within_7_percent_of_its_energy_at_its_measured_time(
    shape,
):
    # without the drop after idle gaps: +5.3% to +12.4% (ResNets), -2.2% (GPT-2 small, 2 x 128),
    # before the ramp of a short kernel's share
    row = simulate_step(SimulatedDevice("h100", noise=0.0), RECORDED[shape])
    assert abs(row.energy_error_at_measured_time) <= 0.07, (
        f"{shape}: {row.energy_error_at_measured_time:+.2%}"
    )


def test_a_launch_bound_steps_kernels_draw_less_between_their_hosts_launches_than_back_to_back():
    step = RECORDED["resnet18_bf16_b16_sgd"]
    row = simulate_step(SimulatedDevice("h100", noise=0.0), step)
    no_drop = dataclasses.replace(SimulatedDevice("h100", noise=0.0).preset, after_gap_drop_share=0.0)
    without = simulate_step(SimulatedDevice(no_drop, noise=0.0), step)
    assert row.simulated_time_s == pytest.approx(without.simulated_time_s)
    assert 0.02 <= 1.0 - row.energy_at_measured_time_j / without.energy_at_measured_time_j <= 0.10


def test_a_step_replayed_as_one_cuda_graph_runs_its_kernels_after_the_graphs_gap_not_the_launch_latency():
    graphs = {step.shape: step for step in recorded_steps(H100_STEPS.parent / "graph-steps")}
    step = graphs["resnet18_bf16_b16_sgd"]  # 352 kernels in 2.57 ms: the gaps are a fifth of it at 1 us
    gap_s = graph_launch_gap_s(step)
    assert gap_s is not None and 0.0 <= gap_s < 1e-6  # what the replays left between their kernels
    assert all(graph_launch_gap_s(s) is None for s in RECORDED.values())  # eager: one launch a kernel
    device = SimulatedDevice("h100", noise=0.0)
    replayed = simulate_step(device, step)
    eager_gaps = simulate_step(
        device,
        dataclasses.replace(
            step,
            rows=tuple(
                CsvRow(r.row, r.line, {k: v for k, v in r.cells.items() if k != "launch_us"})
                for r in step.rows
            ),
        ),
    )
    assert replayed.simulated_time_s < eager_gaps.simulated_time_s  # the card's 1-us latency took longer
    assert abs(replayed.time_error) <= 0.06, f"{replayed.time_error:+.2%}"


def test_events_of_one_step_launched_by_several_host_calls_are_not_a_graph_replay():
    step = _step([0.0, 5.0, 100.0, 105.0], [3.0, 3.0, 3.0, 3.0], host_issue_s=1e-4)
    assert graph_launch_gap_s(step) is None
    one_launch = _step([0.0, 0.0, 100.0, 100.0], [3.0, 3.0, 3.0, 3.0], host_issue_s=1e-4)
    rows = tuple(
        CsvRow(r.row, r.line, {**r.cells, "start_us": str(start)})
        for r, start in zip(one_launch.rows, [0.0, 3.5, 100.0, 103.5], strict=True)
    )
    assert graph_launch_gap_s(dataclasses.replace(one_launch, rows=rows)) == pytest.approx(0.5e-6)
