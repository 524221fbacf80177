"""The yardstick with the job's waits for its host charged (tuner/oracle.py's InStep wait_rel,
wait_fixed_s, wait_rel_strata): a locked card idles at the pair it holds where a stock one
idles at its lowest core clock, so a job that waits saves less with a locked pair than the
no-wait yardstick says. On the simulated RTX 3080 Ti and the GPT-3-XL layer (its per-launch
cap keeps the figures quick); the recorded `vision` job waits ~47% of its GPU step."""

from __future__ import annotations

import math

import pytest

from kdvfs.runtime.job_noise import job_noise
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.replay import ReplayDevice
from kdvfs.runtime.schedule import Schedule, schedule_figures
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel, Workload
from kdvfs.tuner.oracle import InStep, one_knob_oracle, oracles, realisable_oracle
from kdvfs.tuner.run import job_sites

BUDGET = 0.01
LOCKED = Schedule(((0, ClockPair(1680, 9501)),))  # the layer's one-knob optimum with no wait
#: The last group (2.7 ms) at the lowest pair: its 30-ms switch is still in flight at the end.
DROPS_AT_THE_END = Schedule(((0, ClockPair(1680, 9501)), (37, ClockPair(210, 405))))


@pytest.fixture(scope="module")
def card():
    device = open_device("sim:rtx3080ti", noise=0.0)
    return device, open_workload("gpt3-xl-layer", device)


@pytest.fixture(scope="module")
def vision():
    return job_noise("vision")


def in_step(card, noise=None) -> InStep:
    device, workload = card
    if noise is None:
        return InStep(device, workload, BUDGET)
    return InStep(
        device, workload, BUDGET, noise.mean_wait_rel, noise.mean_periodic_wait_s, noise.wait_rel_strata()
    )


def test_a_wait_lowers_what_a_locked_pair_saves_on_the_simulated_card(card, vision):
    quiet = in_step(card).figures(*in_step(card).schedule(LOCKED))[0]
    step = in_step(card, vision)
    waiting = step.figures(*step.schedule(LOCKED))[0]
    assert quiet == pytest.approx(0.0449, abs=5e-4)
    assert 0.005 < waiting < quiet - 0.02


def test_with_no_wait_the_figures_are_exactly_the_cards_own_in_step_figures(card):
    device, workload = card
    step = InStep(device, workload, BUDGET, wait_rel=0.0, wait_fixed_s=0.0)
    assert (step.stock_s, step.stock_j) == device.expected_step(
        [(k, None, k.launches) for k in workload.kernels]
    )
    for schedule in (LOCKED, DROPS_AT_THE_END):
        assert step.figures(*step.schedule(schedule)) == schedule_figures(device, workload, schedule)
    figures = one_knob_oracle(device, workload, BUDGET)
    assert figures.schedule == LOCKED and "job waits" not in figures.method


def test_on_a_replayed_card_the_wait_adds_its_seconds_at_the_tables_idle_power(tmp_path):
    table = tmp_path / "toy.csv"
    table.write_text(
        "kernel,core_mhz,mem_mhz,time_s,energy_j\n"
        "gemm,1000,5000,0.004,0.8\ngemm,2000,5000,0.002,0.6\n"
        "ln,1000,5000,0.003,0.3\nln,2000,5000,0.0025,0.4\n"
    )
    device = ReplayDevice.from_csv(table)  # stock: the highest pair; idle: 100 W (ln at 1000/5000)
    step = InStep(
        device, Workload("toy", (Kernel("gemm"), Kernel("ln"))), 0.5, wait_rel=0.5, wait_fixed_s=0.01
    )
    wait_s = 0.5 * 0.0045 + 0.01
    assert step.stock_s == pytest.approx(0.0045 + wait_s)
    assert step.stock_j == pytest.approx(1.0 + 100.0 * wait_s)


def test_a_switch_in_flight_at_the_steps_end_lands_in_a_long_wait_and_slows_the_next_step(card):
    # 30 ms after the last group's request: a 3-ms wait leaves it in flight (the next step's
    # first request replaces it), a wait as long as the step lets it land and the next step
    # starts at 210 MHz
    short, long_ = InStep(*card, BUDGET, wait_rel=0.05), InStep(*card, BUDGET, wait_rel=1.0)
    assert short.holds(short.schedule(DROPS_AT_THE_END)[0])
    assert long_.figures(*long_.schedule(DROPS_AT_THE_END))[1] > 0.2


def test_a_negative_or_non_finite_wait_is_refused_in_one_line(card):
    device, workload = card
    for waits in (
        {"wait_rel": -0.1},
        {"wait_rel": math.nan},
        {"wait_fixed_s": -1e-3},
        {"wait_fixed_s": math.inf},
        {"wait_rel": 0.2, "wait_rel_strata": (0.1, -0.1)},
        {"wait_rel": 0.2, "wait_rel_strata": (0.1, 0.2)},  # not their mean
    ):
        with pytest.raises(KdvfsError, match="wait") as refused:
            one_knob_oracle(device, workload, BUDGET, **waits)
        assert "\n" not in str(refused.value)


def test_the_oracles_say_the_wait_they_charged_in_their_method_and_json(vision):
    device = open_device("sim:rtx3080ti-fastswitch", noise=0.0)
    layer = open_workload("gpt3-xl-layer", device)
    forward = Workload("forward", tuple(k for k in layer.kernels if k.pass_name == "forward"))
    o = oracles(
        device, forward, BUDGET, wait_rel=vision.mean_wait_rel, wait_rel_strata=vision.wait_rel_strata()
    )
    doc = o.json()
    assert doc["job_wait_rel"] == vision.mean_wait_rel and doc["job_wait_fixed_s"] == 0.0
    assert len(doc["job_wait_rel_strata"]) == 10
    for name in ("one_knob", "realisable", "ideal_per_kernel"):
        assert "job waits charged: 47.2% of the step" in doc[name]["method"]
        assert doc[name]["slowdown"] <= BUDGET
    assert o.ideal.energy_saving >= o.realisable.energy_saving >= o.one_knob.energy_saving > 0.0


def measured_saving(spec: str, noise, schedule: Schedule, seconds: float = 40.0) -> float:
    """A simulated job's saving against stock (noiseless card, the job's waits drawn), after a
    warm-up of 20 s."""
    _, schedule_j = job_run(spec, noise, schedule, seconds, warmup_s=20.0)
    _, stock_j = job_run(spec, noise, Schedule.stock(), seconds, warmup_s=20.0)
    return 1.0 - schedule_j / stock_j


def test_the_waited_yardstick_is_what_the_simulated_job_saves_within_a_third_of_a_point(card, vision):
    device, workload = card
    step = in_step(card, vision)
    sites = job_sites(workload, device.switch_latency_s)
    one = one_knob_oracle(device, workload, BUDGET, step=step)
    best = realisable_oracle(device, workload, BUDGET, sites, step=step, one_knob=one)
    for figures in (one, best):
        assert measured_saving("sim:rtx3080ti", vision, figures.schedule) == pytest.approx(
            figures.energy_saving, abs=0.0033
        )
    # the no-wait yardstick's pair, 4.49% without waits, saves about a third of it here
    assert measured_saving("sim:rtx3080ti", vision, LOCKED) < 0.02


def test_a_given_in_step_truth_carries_its_own_waits(card):
    device, workload = card
    step = InStep(device, workload, BUDGET, wait_rel=0.2)
    assert one_knob_oracle(device, workload, BUDGET, step=step, wait_rel=0.2).energy_saving > 0.0
    with pytest.raises(KdvfsError, match="given InStep"):
        one_knob_oracle(device, workload, BUDGET, step=step, wait_rel=0.3)


def job_run(
    preset: str, noise, schedule: Schedule, seconds: float, warmup_s: float = 100.0
) -> tuple[float, float]:
    """A simulated job's mean step (time s, energy J) under a schedule on a noiseless card, the
    job's waits drawn (seed 1), after a warm-up of warmup_s (s; 100: the card's temperature
    settles)."""
    device = open_device(preset, noise=0.0)
    job = SimulatedJob(device, open_workload("gpt3-xl-layer", device), job_noise=noise, job_noise_seed=1)
    while device.now_s() < warmup_s:
        job.step_until_update(schedule)
    start_s, start_j, start_steps = device.now_s(), device.true_energy_j(), job.steps
    while device.now_s() < start_s + seconds:
        job.step_until_update(schedule)
    steps = job.steps - start_steps
    return (device.now_s() - start_s) / steps, (device.true_energy_j() - start_j) / steps


@pytest.mark.parametrize("noise_name", ["vision", "hf"])
def test_the_yardstick_gives_the_h200_layer_the_step_time_and_energy_of_the_simulated_job(noise_name):
    # the H200 holds its cap over 10-ms windows and the layer's kernels take ~7 ms: the job's
    # wait in the window lets stock run faster, and the job waits a share of that faster step
    noise = job_noise(noise_name)
    device = open_device("sim:h200", noise=0.0)
    step = InStep(device, open_workload("gpt3-xl-layer", device), BUDGET, **noise.yardstick_waits())
    for schedule in (Schedule.stock(), Schedule(((0, ClockPair(1410, 3201)),))):
        time_s, energy_j = job_run("sim:h200", noise, schedule, seconds=500.0)
        yard_s, yard_j = step.schedule(schedule)
        assert yard_s == pytest.approx(time_s, rel=0.005)
        assert yard_j == pytest.approx(energy_j, rel=0.005)


def test_the_steps_after_the_sync_jobs_checkpoints_start_at_the_pair_that_landed_in_them():
    # the last group's 345-MHz request lands in the checkpoints (0.4 s every 200 steps, 1.5 s
    # every 500), so the step after each runs at 345 MHz until the next request lands 10 ms in
    noise = job_noise("sync")
    device = open_device("sim:h200", noise=0.0)
    step = InStep(device, open_workload("gpt3-xl-layer", device), BUDGET, **noise.yardstick_waits())
    idles_low = Schedule(((0, ClockPair(1410, 3201)), (37, ClockPair(345, 2201))))
    time_s, energy_j = job_run("sim:h200", noise, idles_low, seconds=1000.0)
    yard_s, yard_j = step.schedule(idles_low)
    assert yard_s == pytest.approx(time_s, rel=0.002)
    assert yard_j == pytest.approx(energy_j, rel=0.002)
    assert noise.after_periodic_share == pytest.approx(1 / 200 + 1 / 500 - 1 / 1000)
    assert "0.60% of the steps starting after a periodic wait" in step.wait_note
