"""Bad input to the tuner's Python API and the CLI's durations: one KdvfsError line (exit 2 at
the CLI) naming the parameter, its value and the allowed range; valid values go through."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kdvfs
from kdvfs.cli.commands._common import MAX_DURATION_S
from kdvfs.runtime.registry import open_device
from kdvfs.runtime.types import KdvfsError
from kdvfs.runtime.workloads import gpt3_xl_layer
from kdvfs.tuner.step_tuner import MAX_BUDGET, StepTiming, StepTuner
from tests.tuner.test_cli_robustness import TINY_TUNE, run_cli

TABLE = (
    Path(__file__).resolve().parents[2] / "data" / "dvfs-real" / "gtx1080ti-dvfs-real-Performance-Power.csv"
)
CARD = {"switch_latency_s": 0.03, "energy_update_period_s": 0.1}


def step_tuner(**options) -> StepTuner:
    device = open_device("sim:rtx3080ti")
    return StepTuner(gpt3_xl_layer(), list(device.grid.pairs), strategy="random", **(CARD | options))


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("budget", math.inf, "budget must be a finite number >= 0 and <= 100, got inf"),
        ("budget", math.nan, "budget must be a finite number >= 0 and <= 100, got nan"),
        ("budget", -0.01, "budget must be a finite number >= 0 and <= 100, got -0.01"),
        ("budget", 101.0, "budget must be a finite number >= 0 and <= 100, got 101"),
        ("budget", "0.01", "budget must be a finite number >= 0 and <= 100, got '0.01'"),
        ("switch_latency_s", -1.0, "switch_latency_s must be a finite number >= 0 and <= 1e+07, got -1"),
        ("switch_latency_s", math.nan, "switch_latency_s must be a finite number >= 0 and <= 1e+07, got nan"),
        ("energy_update_period_s", 0.0, "energy_update_period_s must be a finite number > 0 and <= 1e+07, got 0"),
        ("energy_update_period_s", math.inf, "energy_update_period_s must be a finite number > 0 and <= 1e+07, got inf"),
    ],
)  # fmt: skip
def test_a_step_tuner_refuses_a_budget_latency_or_period_out_of_range_in_one_line(option, value, message):
    with pytest.raises(KdvfsError) as exc:
        step_tuner(**{option: value})
    assert str(exc.value) == message


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    budget=st.floats(min_value=0.0, max_value=MAX_BUDGET),
    latency_s=st.floats(min_value=0.0, max_value=1.0),
    period_s=st.floats(min_value=1e-6, max_value=1.0),
)
def test_a_step_tuner_takes_every_budget_up_to_the_maximum_and_every_finite_latency_and_period(
    budget, latency_s, period_s
):
    tuner = step_tuner(budget=budget, switch_latency_s=latency_s, energy_update_period_s=period_s)
    assert tuner.budget == budget and tuner.settle_s == pytest.approx(latency_s + period_s)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("reference_s", 0.0, "StepTiming.reference_s must be a finite number > 0"),
        ("trial_window_s", math.nan, "StepTiming.trial_window_s must be a finite number > 0"),
        ("watch_window_s", math.inf, "StepTiming.watch_window_s must be a finite number > 0"),
        ("trial_blocks", 0, "StepTiming.trial_blocks must be a whole number >= 1, got 0"),
        ("max_trials_per_group", 2.5, "StepTiming.max_trials_per_group must be a whole number >= 1, got 2.5"),
        ("verify_max_blocks", 1, "StepTiming.verify_max_blocks must be >= verify_blocks"),
    ],
)
def test_step_timing_refuses_a_length_or_count_out_of_range_in_one_line(field, value, message):
    with pytest.raises(KdvfsError, match=message.replace(".", r"\.")) as exc:
        StepTiming(**{field: value})
    assert "\n" not in str(exc.value)


def test_step_timing_for_any_rank_count_is_valid():
    assert [StepTiming.for_ranks(n).trial_blocks >= 1 for n in (1, 2, 8, 64)] == [True] * 4


@pytest.mark.parametrize("spec", ["sim:rtx3080ti", f"replay:{TABLE}"])
def test_tuning_a_real_training_loop_on_a_simulated_or_recorded_card_is_refused(spec):
    device = open_device(spec)
    with pytest.raises(KdvfsError) as exc:
        kdvfs.tune(device=device, track=False)
    message = str(exc.value)
    assert "\n" not in message and f"is {device.source} and runs no real kernels" in message
    assert "kdvfs tune --device sim:PRESET" in message


@pytest.mark.parametrize("value", ["1e308", "1e8", str(MAX_DURATION_S * 1.5)])
def test_training_seconds_beyond_the_maximum_are_refused_with_the_limit(value):
    code, out, err = run_cli(*TINY_TUNE, "--no-mlflow", "--seconds", value)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"--seconds: must be at most {MAX_DURATION_S:g} s" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--window-s", "1e300"],
        ["sweep", "--warmup-s", "1e300"],
        ["sweep", "--reference-s", "1e300"],
        ["compare", "--window-s", "1e300"],
        ["scenario", "--after-s", "1e300"],
        ["probe", "--out", "unused", "--seconds", "1e300"],
    ],
)
def test_every_duration_option_beyond_the_maximum_is_refused_in_one_line(argv):
    code, _, err = run_cli(*argv)
    assert code == 2 and err.count("\n") == 1 and f"must be at most {MAX_DURATION_S:g} s" in err, err


def test_a_sweep_on_a_gpu_index_that_is_not_a_whole_number_names_the_index():
    code, _, err = run_cli("sweep", "--device", "nvml:abc")
    assert code == 2 and err.count("\n") == 1, err
    assert "the GPU index must be a whole number, as nvml:0" in err and "ops:FILE" not in err
