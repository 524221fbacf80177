"""A whole training step recorded on a real card as a workload (`step:DIR:SHAPE`,
runtime/recorded_steps.py): its kernels as the calibration runs them, a tuner run on it, and bad
specs refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdvfs.cli import main
from kdvfs.runtime.recorded_steps import recorded_step_workload, recorded_steps
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.trace import trace_workload
from kdvfs.runtime.types import KdvfsError

STEPS = Path(__file__).resolve().parents[2] / "data" / "h200" / "steps"
SHAPE = "gpt2_small_sdpa_bf16"


def test_a_recorded_step_opens_as_the_workload_of_its_own_kernels_run_as_the_calibration_runs_them():
    workload = open_workload(f"step:{STEPS}:{SHAPE}", open_device("sim:h200"))
    (step,) = [s for s in recorded_steps(STEPS) if s.shape == SHAPE]
    assert workload.name == SHAPE and len(workload.kernels) == 1225  # one step of the profiled three
    assert workload.signature == trace_workload(step.source, step.shape, step.rows, card=step.card).signature
    time_s, energy_j = SimulatedDevice("h200", noise=0.0).expected_step(
        [(k, None, 1) for k in workload.kernels]
    )
    assert time_s == pytest.approx(step.step_s, rel=0.05)  # GPU-bound: its kernels are its step
    assert energy_j == pytest.approx(step.energy_j, rel=0.05)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (f"step:{STEPS}", "needs its folder and name: step:DIR:SHAPE"),
        (f"step:{STEPS}:nope", "no such recorded step (the folder has resnet50_bf16_b128, "),
        ("step:/no/such/folder:x", "no steps_summary.json there"),
    ],
)
def test_a_recorded_step_that_is_not_there_is_refused_in_one_line(spec, says):
    with pytest.raises(KdvfsError, match=None) as e:
        open_workload(spec, open_device("sim:h200"))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_kdvfs_tune_runs_on_a_recorded_step_from_no_prior(capsys):
    code = main(
        [
            "tune",
            "--device",
            "sim:h200",
            "--workload",
            f"step:{STEPS}:{SHAPE}",
            "--prior",
            "none",
            "--seconds",
            "10",
            "--no-sweep",
            "--no-mlflow",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert f"tuning {SHAPE} on NVIDIA H200 (sim:h200)" in captured.err  # progress on stderr
    assert f"tuned {SHAPE} on NVIDIA H200" in captured.out and "[simulated]" in captured.out
    assert "prior: none" in captured.out


def test_the_workload_is_the_folders_named_step():
    with pytest.raises(KdvfsError, match="no such recorded step"):
        recorded_step_workload(STEPS, "gpt3xl_block")  # the probe's block is not a step of this folder
