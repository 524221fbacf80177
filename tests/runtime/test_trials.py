"""Measuring in training (runtime/trials.py): the stock reference, sequential trials, robust
estimates and the job's noise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import StepReport
from kdvfs.runtime.trials import (
    RECENT_PAIRS,
    NoiseMeter,
    Outcome,
    ScheduleLevel,
    StallFilter,
    StepAccount,
    StockFigures,
    StockReference,
    Trial,
    judge,
    open_window,
    resolvable,
    robust_mean_se,
    sequential_z,
    trial_s_to_resolve,
)
from kdvfs.runtime.types import ClockPair

STEP_S = 0.010
POWER_W = 300.0
UPDATE_S = 0.1


def _reports(step_times_s: list[float], wait_s: float = 0.0):
    """Steps back to back at constant power, the counter advancing every UPDATE_S; each step
    ends with the job's wait of wait_s (s) inside its time."""
    end_s, last_update_s = 0.0, 0.0
    for i, step_s in enumerate(step_times_s):
        end_s += step_s
        readings = []
        while last_update_s + UPDATE_S <= end_s:
            last_update_s += UPDATE_S
            readings.append((last_update_s, POWER_W * last_update_s))
        yield StepReport(
            i, end_s, step_s, (step_s,), tuple(readings), 40.0, frozenset(), 700.0, wait_s=wait_s
        )


def _reference(step_times_s: list[float]) -> StockReference:
    ref = StockReference(Schedule.stock(), window_s=0.5, min_s=5.0)
    for report in _reports(step_times_s):
        if ref.add(report):
            return ref
    raise AssertionError("the reference did not complete")


def test_one_stalled_step_leaves_the_stock_step_and_energy_where_the_other_windows_put_them():
    steps = [STEP_S] * 1000
    steps[150] = 0.160  # the host paused once, as in a kdvfs.tune run on the H200
    figures = _reference(steps).figures()
    assert figures.step_s == pytest.approx(STEP_S, rel=1e-3)
    assert figures.energy_per_step_j == pytest.approx(POWER_W * STEP_S, rel=5e-3)
    assert figures.segment_times_s[0] == pytest.approx(STEP_S, rel=1e-3)


def test_a_stalled_step_makes_the_reference_noise_larger_not_smaller():
    steady = _reference([STEP_S * (1 + 0.001 * (i % 3)) for i in range(1000)]).figures()
    steps = [STEP_S * (1 + 0.001 * (i % 3)) for i in range(1000)]
    steps[150] = 0.160
    stalled = _reference(steps).figures()
    assert stalled.time_sd_per_root_s > steady.time_sd_per_root_s


# --- sequential trials, robust estimates, the job's noise ------------------------------------
def _trial_reports(candidate_factor: float, seed: int, noise: float, trial: Trial):
    """Feed a trial steps whose time is stock x (1 + noise x N(0,1)), B's steps
    candidate_factor x that, at constant power; until it is done or 40,000 steps ran."""
    rng = np.random.default_rng(seed)
    end_s, last_update_s = 0.0, 0.0
    for i in range(40_000):
        if trial.done:
            return
        if trial.current is None:
            trial.open(end_s)
        factor = candidate_factor if trial.arm == "B" else 1.0
        step_s = STEP_S * factor * (1.0 + noise * rng.standard_normal())
        end_s += step_s
        readings = []
        while last_update_s + UPDATE_S <= end_s:
            last_update_s += UPDATE_S
            readings.append((last_update_s, POWER_W * last_update_s))
        trial.add(StepReport(i, end_s, step_s, (step_s,), tuple(readings), 40.0, frozenset(), 700.0))


def _decided_at(z: float, resolve: float):
    def decide(outcome: Outcome) -> bool:
        return abs(outcome.energy_diff) > z * outcome.energy_se or z * outcome.energy_se <= resolve

    return decide


def test_a_sequential_trial_ends_at_its_first_decided_block_when_the_difference_is_clear():
    trial = Trial(
        Schedule.stock(), Schedule.stock(), 12, 0.5, 0.0, min_blocks=2, decide=_decided_at(2.0, 0.001)
    )
    _trial_reports(1.10, seed=1, noise=0.01, trial=trial)  # B's steps 10% longer: 10% more energy
    assert trial.decided and trial.outcome().blocks == 2
    assert trial.outcome().energy_diff == pytest.approx(0.10, abs=0.01)


def test_a_sequential_trial_runs_to_its_longest_length_while_undecided_and_says_so():
    trial = Trial(
        Schedule.stock(), Schedule.stock(), 6, 0.5, 0.0, min_blocks=2, decide=_decided_at(2.0, 1e-6)
    )
    _trial_reports(1.0, seed=2, noise=0.05, trial=trial)
    outcome = trial.outcome()
    assert not trial.decided and outcome.blocks == 6 and outcome.undecided


def test_a_fixed_length_trial_is_never_called_undecided():
    trial = Trial(Schedule.stock(), Schedule.stock(), 3, 0.5, 0.0)
    _trial_reports(1.0, seed=3, noise=0.05, trial=trial)
    assert trial.outcome().blocks == 3 and not trial.outcome().undecided


def test_one_wrecked_block_moves_the_robust_mean_by_at_most_a_clipped_amount():
    blocks = [0.01, 0.012, 0.009, 0.011, 0.010, 0.5]  # a sync gap in the last block
    mean, se = robust_mean_se(blocks)
    assert mean < 0.02 and se < 0.01
    assert np.mean(blocks) > 0.09  # the plain mean is wrecked


def test_robust_mean_se_of_few_values_is_the_plain_mean_and_of_none_is_nan():
    assert robust_mean_se([0.1, 0.3]) == pytest.approx((0.2, 0.1))
    mean, se = robust_mean_se([])
    assert np.isnan(mean) and se == np.inf


def test_the_noise_meter_reads_the_same_noise_per_root_second_from_windows_of_any_length():
    rng = np.random.default_rng(4)
    sigma = 0.02  # per root second
    figures = []
    for window_s in (0.5, 2.0, 8.0):
        meter = NoiseMeter(recent=2000)  # every pair: the scaling is what is tested
        for _ in range(2000):
            a, b = 1.0 + sigma / np.sqrt(window_s) * rng.standard_normal(2)
            meter.add(b / a - 1.0, b / a - 1.0, window_s)
        figures.append(meter.time_sd_per_root_s)
    assert figures == pytest.approx([sigma] * 3, rel=0.08)


def test_the_noise_meter_reads_the_jobs_noise_now_after_a_quiet_start():
    # a host that feeds the job late from some minute on: its recent pairs, not its first ones
    # (the MAD of 64 pairs is within 45% of the s.d. at 3 of its standard errors)
    rng = np.random.default_rng(7)
    meter, every_pair = NoiseMeter(), NoiseMeter(recent=10**6)
    for sigma in (0.005,) * 2 * RECENT_PAIRS + (0.04,) * RECENT_PAIRS + (0.005,) * RECENT_PAIRS:
        diff = sigma * rng.standard_normal()
        for m in (meter, every_pair):
            m.add(diff, diff, 2.0)
        if len(meter.time) == 3 * RECENT_PAIRS:  # the late feeding's pairs fill the recent ones
            assert 0.55 * 0.04 < meter.time_sd_per_root_s < 1.45 * 0.04
            assert every_pair.time_sd_per_root_s < 0.5 * meter.time_sd_per_root_s
    assert 0.55 * 0.005 < meter.time_sd_per_root_s < 1.45 * 0.005  # and quiet again


def test_the_noise_meter_is_not_set_by_a_few_stalled_windows():
    rng = np.random.default_rng(5)
    meter = NoiseMeter()
    for i in range(200):
        diff = 0.01 * rng.standard_normal() + (3.0 if i % 50 == 0 else 0.0)
        meter.add(diff, diff, 2.0)
    assert meter.time_sd_per_root_s < 0.015


def test_a_trial_twice_as_long_resolves_a_difference_sqrt_2_smaller():
    meter = NoiseMeter()
    for d in (-0.01, 0.01, -0.02, 0.02, 0.0):
        meter.add(d, d, 2.0)
    one, two = meter.resolvable(60.0), meter.resolvable(120.0)
    assert one[0] / two[0] == pytest.approx(np.sqrt(2.0))


def test_a_trial_as_long_as_trial_s_to_resolve_resolves_exactly_that_difference():
    for sd, difference in ((0.004, 0.01), (0.116, 0.01), (0.026, 0.005)):
        trial_s = trial_s_to_resolve(sd, difference)
        assert resolvable(sd, trial_s) == pytest.approx(difference)
    assert trial_s_to_resolve(0.116, 0.01) > 4000.0  # a job at 11.6% per root s: over an hour a trial
    assert trial_s_to_resolve(0.01, 0.0) == np.inf
    assert trial_s_to_resolve(0.01, 1e-300) == np.inf  # a budget of 1e-300: no overflow


def test_the_reference_of_a_noisy_job_runs_until_its_stock_margin_is_small_enough():
    rng = np.random.default_rng(6)
    quiet = [STEP_S * (1 + 0.001 * rng.standard_normal()) for _ in range(40_000)]
    noisy = [STEP_S * (1 + 0.3 * abs(rng.standard_normal())) for _ in range(40_000)]
    lengths = []
    for steps in (quiet, noisy):
        ref = StockReference(Schedule.stock(), window_s=0.5, min_s=5.0, max_margin=0.005, max_s=200.0)
        for report in _reports(steps):
            if ref.add(report):
                break
        lengths.append(ref.seconds)
        assert ref.margin() <= 0.005 or ref.seconds >= 200.0
    assert lengths[0] < 6.0 < lengths[1]


def test_the_reference_goes_on_to_the_finer_margin_for_its_longest_fine_length_at_most():
    rng = np.random.default_rng(8)
    ends = {}
    for name, step_sd in (("quiet", 0.02), ("noisy", 0.05)):  # 0.2% and 0.5% per root s
        steps = [STEP_S * (1 + step_sd * rng.standard_normal()) for _ in range(40_000)]
        ref = StockReference(
            Schedule.stock(),
            window_s=0.5,
            min_s=5.0,
            max_margin=0.005,
            max_s=200.0,
            fine_margin=0.001,
            fine_max_s=30.0,
        )
        for report in _reports(steps):
            if ref.add(report):
                break
        ends[name] = (ref.seconds, ref.margin())
    quiet_s, quiet_margin = ends["quiet"]
    noisy_s, noisy_margin = ends["noisy"]
    assert 5.5 < quiet_s < 30.0 and quiet_margin <= 0.001  # went on, to the finer margin
    assert 30.0 <= noisy_s < 31.0 and 0.001 < noisy_margin <= 0.005  # would take ~70 s: stopped at 30 s


def test_a_trial_measures_time_on_the_gpus_busy_time_so_the_jobs_waits_do_not_blur_it():
    rng = np.random.default_rng(7)
    trial = Trial(Schedule.stock(), Schedule.stock(), 4, 0.5, 0.0)
    end_s, last_update_s, i = 0.0, 0.0, 0
    while not trial.done:
        if trial.current is None:
            trial.open(end_s)
        busy_s = STEP_S * (1.02 if trial.arm == "B" else 1.0)  # B's kernels 2% slower
        wait_s = STEP_S * 3.0 * rng.exponential()  # a host that feeds the GPU late, at random
        step_s = busy_s + wait_s
        end_s += step_s
        readings = []
        while last_update_s + UPDATE_S <= end_s:
            last_update_s += UPDATE_S
            readings.append((last_update_s, POWER_W * last_update_s))
        report = StepReport(
            i, end_s, step_s, (step_s,), tuple(readings), 40.0, frozenset(), 700.0, wait_s=wait_s
        )
        trial.add(report)
        i += 1
    outcome = trial.outcome()
    assert outcome.time_diff == pytest.approx(0.02, abs=0.001) and outcome.time_se < 0.001
    assert trial.closed[0].group_times_s[0] == pytest.approx(STEP_S, rel=1e-9)  # the wait left out


def test_a_window_takes_a_long_steps_last_counter_update_alone_so_its_wait_is_never_cut_by_time():
    # a 1.2-s checkpoint step (kernels 0.05 s at 700 W, then idle at 100 W) with updates every
    # 0.1 s inside it, then steps of 50 ms at 700 W: the window opens inside the checkpoint,
    # whose updates after the opening would start the span with its idle energy and none of
    # its steps; its last update starts it, and the energy per step is the regular steps'
    period_s, busy_w, idle_w, step_s = 0.1, 700.0, 100.0, 0.05
    window = open_window(Schedule.stock(), 1.0, 0.0, 0.5)  # counts from 0.5 s

    def energy(t: float) -> float:  # the counter at host time t, J
        return busy_w * min(t, step_s) + idle_w * max(0.0, min(t, 1.2) - step_s) + busy_w * max(0.0, t - 1.2)

    updates = [(k * period_s, energy(k * period_s)) for k in range(1, 13)]
    window.add(StepReport(0, 1.2, 1.2, (1.2,), tuple(updates), 40.0, frozenset(), 700.0, wait_s=1.15))
    assert window.first == updates[-1]  # not the first update after the opening (0.5 s)
    end_s, k = 1.2, 13
    for i in range(1, 40):
        end_s += step_s
        readings = []
        while k * period_s <= end_s + 1e-12:
            readings.append((k * period_s, energy(k * period_s)))
            k += 1
        if window.add(StepReport(i, end_s, step_s, (step_s,), tuple(readings), 40.0, frozenset(), 700.0)):
            break
    assert window.energy_per_step_j == pytest.approx(busy_w * step_s, rel=1e-6)


def test_an_evaluation_inside_a_step_counts_as_the_jobs_wait_and_regular_steps_pass_unchanged():
    stalls, stock = StallFilter(), Schedule.stock()
    reports = list(_reports([STEP_S] * 40 + [8 * STEP_S] + [1.2 * STEP_S] * 5))
    out = [stalls.apply(r, stock) for r in reports]
    assert [o.wait_s for o in out[:40]] == [0.0] * 40
    assert out[40].step_time_s == reports[40].step_time_s  # the step's time is what it was
    assert out[40].step_time_s - out[40].wait_s == pytest.approx(STEP_S)  # busy: the typical step
    assert stalls.stalls == 1 and stalls.stall_s == pytest.approx(7 * STEP_S)
    assert all(o.wait_s == 0.0 for o in out[41:])  # 1.2x: a slower pair's step, not a stall


def test_a_new_schedules_first_steps_and_a_stretch_of_steps_are_never_stalls():
    stalls = StallFilter()
    slow = Schedule.stock()
    first = list(_reports([3 * STEP_S] * 3 + [30 * STEP_S]))
    assert all(stalls.apply(r, slow).wait_s == 0.0 for r in first)  # under min_steps seen
    stretch = StepReport(9, 1.0, 0.5, (0.5,), (), 40.0, frozenset(), 700.0, steps=5)
    assert stalls.apply(stretch, slow) is stretch and stalls.stalls == 0


def test_a_candidates_first_steps_are_judged_against_the_step_before_times_its_worst_slowdown():
    stalls, stock, candidate = StallFilter(), Schedule.stock(), Schedule(((0, (1000, 5000)),))
    for r in _reports([STEP_S] * 40):
        stalls.apply(r, stock)
    assert stalls.is_fresh(candidate) and not stalls.is_fresh(stock)
    evaluation, slower = list(_reports([8 * STEP_S, 1.3 * STEP_S]))
    out = stalls.apply(evaluation, candidate, worst_ratio=1.1)
    assert out.step_time_s - out.wait_s == pytest.approx(1.1 * STEP_S)  # busy: the bound, not 8x
    assert stalls.stalls == 1 and out.stall_s == pytest.approx(6.9 * STEP_S)
    assert stalls.apply(slower, candidate, worst_ratio=1.1).wait_s == 0.0  # under 3x the bound


def test_the_spread_of_single_steps_is_each_schedules_own_and_unknown_before_enough_steps():
    stalls, stock = StallFilter(), Schedule.stock()
    for r in _reports([STEP_S, 1.2 * STEP_S] * 3):
        stalls.apply(r, stock)
    assert np.isnan(stalls.step_cv(stock))  # 6 steps seen: under min_steps
    for r in _reports([STEP_S, 1.2 * STEP_S] * 10):
        stalls.apply(r, stock)
    assert stalls.step_cv(stock) == pytest.approx(0.1 / 1.1, rel=0.05)
    assert np.isnan(stalls.step_cv(Schedule(((0, (1000, 5000)),))))  # another schedule: none seen


def test_steps_run_at_stock_are_allowed_their_own_time_so_a_drifting_stock_never_overdraws_the_account():
    account = StepAccount(budget=0.01, stock_step_s=0.030)  # stock as the reference measured it
    for _ in range(1000):
        account.charge(0.040, at_stock=True)  # later, the host starves the GPU: stock is slower
    assert account.slack_s() == pytest.approx(0.01 * 40.0)  # the budget on what stock took
    assert account.slowdown() == pytest.approx(0.0)
    account.charge(0.0303, steps=100)  # a candidate's steps count against the stock estimate
    assert account.slack_s() == pytest.approx(0.01 * 40.0 + 100 * (1.01 * 0.030 - 0.0303))
    account.rebase()  # stock to be measured again: the steps so far keep their allowance
    account.stock_step_s = 0.040
    account.charge(0.0404, steps=10)
    assert account.slack_s() == pytest.approx(0.01 * 40.0 + 100 * (1.01 * 0.030 - 0.0303), abs=1e-9)


def test_a_schedules_level_is_its_busy_step_time_with_each_window_counted_once():
    plan = Schedule(((0, (1000, 5000)),))
    windows = []
    for busy_s, wait_s in ((0.0101, 0.004), (0.0103, 0.020)):
        window = open_window(plan, 0.5, 0.0, 0.0)
        for report in _reports([busy_s + wait_s] * 1000, wait_s=wait_s):
            if window.add(report):
                break
        else:
            raise AssertionError("the window did not close")
        windows.append(window)
    level = ScheduleLevel()
    level.add(windows)
    level.add(windows[:1])  # a verification that goes on hands its kept windows in again
    steps = [w.steps for w in windows]
    assert level.steps == sum(steps)
    # the job's waits are not the clocks': the level is the busy time, weighted by steps
    assert level.busy_s == pytest.approx((0.0101 * steps[0] + 0.0103 * steps[1]) / sum(steps), rel=1e-9)
    assert level.seconds == pytest.approx(sum(w.settled_s for w in windows))
    assert math.isnan(ScheduleLevel().busy_s)


def test_the_account_holds_back_the_95pct_margin_of_the_steps_not_run_at_stock_at_the_jobs_noise():
    # a host that starves the GPU inside its steps: a candidate's 100 s would have varied by the
    # job's noise at stock too, so what they would have taken there is known to 1.645 x 5% x 10 s
    quiet, noisy = (StepAccount(budget=0.01, noise_per_root_s=n, stock_step_s=0.030) for n in (0.0, 0.05))
    for account in (quiet, noisy):
        account.charge(0.030, steps=2000, at_stock=True)  # 60 s at stock: no margin on them
    assert noisy.slack_s() == pytest.approx(quiet.slack_s()) and noisy.noise_margin_s() == 0.0
    for account in (quiet, noisy):
        account.charge(0.0303, steps=3300)  # 100 s of a candidate's steps
    assert noisy.noise_margin_s() == pytest.approx(1.645 * 0.05 * math.sqrt(0.0303 * 3300), rel=1e-3)
    assert noisy.slack_s() == pytest.approx(quiet.slack_s() - noisy.noise_margin_s())
    assert noisy.slowdown() == pytest.approx(quiet.slowdown() + noisy.noise_margin_s() / (0.030 * 5300))


def test_a_block_whose_window_has_no_energy_is_left_out_of_the_trials_energy_not_made_nan():
    trial = Trial(Schedule.stock(), Schedule.stock(), 2, 0.5, 0.0)
    _trial_reports(1.10, seed=3, noise=0.01, trial=trial)
    whole = trial.outcome()
    b1 = trial.closed[5]  # the second block's first B window: its counter span all a stall
    b1.gap_j, b1.gap_s = b1.last[1] - b1.first[1], b1.span_s
    assert np.isnan(b1.energy_per_step_j)
    part = trial.outcome()
    assert part.blocks == 2 and part.time_diff == whole.time_diff
    assert part.energy_diff == pytest.approx(0.10, abs=0.02) and np.isinf(part.energy_se)  # one block left


# --- a job that waits for its host: the card's idle draw follows the waits -------------------
IDLE_W = 60.0


def _waiting_trial(wait_power_w: float, seed: int) -> tuple[Trial, NoiseMeter]:
    """A trial of a job whose GPU is busy STEP_S a step, then idle at IDLE_W while the host
    feeds it late (a wait of about STEP_S, its level drawn anew every 20 steps: a host slow
    for a while); B's kernels draw 3% less at the same time.
    Each step is busy then idle, the counter read every UPDATE_S. Returns the trial judged with
    `wait_power_w` (W) and a NoiseMeter fed its pairs."""
    rng = np.random.default_rng(seed)
    trial = Trial(Schedule.stock(), Schedule.stock(), 12, 0.5, 0.0, wait_power_w=wait_power_w)
    end_s, energy_j, next_update_s, i = 0.0, 0.0, UPDATE_S, 0
    while not trial.done:
        if trial.current is None:
            trial.open(end_s)
        busy_w = POWER_W * (0.97 if trial.arm == "B" else 1.0)
        if i % 20 == 0:
            level = rng.uniform(0.5, 1.5)
        wait_s = STEP_S * level
        readings = []
        for span_s, power_w in ((STEP_S, busy_w), (wait_s, IDLE_W)):
            while next_update_s <= end_s + span_s:
                readings.append((next_update_s, energy_j + power_w * (next_update_s - end_s)))
                next_update_s += UPDATE_S
            end_s += span_s
            energy_j += power_w * span_s
        step_s = STEP_S + wait_s
        trial.add(
            StepReport(i, end_s, step_s, (step_s,), tuple(readings), 40.0, frozenset(), 700.0, wait_s=wait_s)
        )
        i += 1
    meter = NoiseMeter()
    meter.add_pairs(trial.outcome().pairs)
    return trial, meter


def test_the_noise_meter_reads_the_power_the_card_draws_while_the_job_waits():
    powers_w, ratios = [], []
    for seed in range(6):
        trial, meter = _waiting_trial(0.0, seed=seed)
        waits_ignored = NoiseMeter()
        waits_ignored.add_pairs([(e, t, s) for e, t, s, _, _ in trial.outcome().pairs])
        assert waits_ignored.wait_power_w == 0.0
        powers_w.append(meter.wait_power_w)
        ratios.append(meter.energy_sd_per_root_s / waits_ignored.energy_sd_per_root_s)
    assert np.mean(powers_w) == pytest.approx(IDLE_W, rel=0.15)
    assert np.mean(ratios) < 0.6


def test_the_wait_power_is_read_only_where_the_waits_tell_it_and_never_above_the_windows_power():
    rng = np.random.default_rng(0)
    tiny = NoiseMeter()  # waits that differ by ~1 us a step: noise alone sets any slope
    for _ in range(64):
        tiny.add(0.01 * rng.standard_normal(), 0.0, 2.0, 1e-6 * rng.standard_normal() / 30.0, 500.0)
    assert tiny.wait_power_w == 0.0
    steep = NoiseMeter()  # energy that moves 2 kW a second of wait, windows at 500 W
    for _ in range(64):
        wait_diff_s_per_j = 1e-3 * rng.standard_normal() / 30.0
        steep.add(2000.0 * wait_diff_s_per_j, 0.0, 2.0, wait_diff_s_per_j, 500.0)
    assert steep.wait_power_w == 500.0


def test_a_trial_judged_at_its_blocks_mean_wait_reads_the_same_saving_with_a_smaller_error():
    saving = 0.03 * POWER_W / (POWER_W + IDLE_W)  # B's 3% of the busy energy, of the whole step's
    errors, z = [], []
    for seed in range(6):
        _, meter = _waiting_trial(0.0, seed=seed)
        plain, _ = _waiting_trial(0.0, seed=seed + 10)
        adjusted, _ = _waiting_trial(meter.wait_power_w, seed=seed + 10)  # the same steps
        errors.append(adjusted.outcome().energy_se / plain.outcome().energy_se)
        z.append((adjusted.outcome().energy_diff + saving) / adjusted.outcome().energy_se)
    assert np.mean(errors) < 0.7
    assert abs(np.mean(z)) < 1.5  # unbiased: the mean of six z-scores has s.d. 0.41


def _false_rate(boundary: float, first: int, last: int, walks: int = 400_000) -> float:
    """Random walks of null blocks judged after each block from first to last: the share that
    crosses boundary standard errors at any look."""
    sums = np.random.default_rng(0).standard_normal((walks, last)).cumsum(axis=1)
    blocks = np.arange(1, last + 1)
    z = (sums / np.sqrt(blocks))[:, first - 1 : last]
    return float((z.max(axis=1) > boundary).mean())


def test_a_trial_judged_after_every_block_keeps_the_false_rate_of_one_look_at_its_sequential_boundary():
    one_look = 0.00135  # one-sided tail beyond 3 normal sds
    assert sequential_z(4, 4) == 3.0
    boundary = sequential_z(4, 12)
    assert 3.3 < boundary < 3.6
    assert _false_rate(3.0, 4, 12) > 3.0 * one_look  # nine looks at 3 sds: far too many false adoptions
    assert _false_rate(boundary, 4, 12) == pytest.approx(one_look, rel=0.2)


def test_sequential_z_refuses_looks_out_of_order():
    with pytest.raises(ValueError, match="first_block <= last_block"):
        sequential_z(5, 4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_windows_read_a_jobs_energy_per_step_when_its_checkpoint_waits_hold_their_readings(seed):
    # the H200 layer under the recorded sync job's waits (0.5-s evaluations, 1-2-s
    # checkpoints at the card's idle power), stretches of steps up to each counter update,
    # read in back-to-back 2-s windows that count from their opening (a Settled watch): a
    # wait that closes a window holds its last reading, and the wait after that reading is
    # not counted at the span's power. Counting whole stretches read 2.2-3.5% high here.
    from kdvfs.runtime.job_noise import job_noise
    from kdvfs.runtime.registry import open_device, open_workload
    from kdvfs.runtime.steps import SimulatedJob
    from kdvfs.runtime.trials import open_window

    device = open_device("sim:h200", seed=seed)
    job = SimulatedJob(
        device,
        open_workload("gpt3-xl-layer", device),
        dry_run=True,
        job_noise=job_noise("sync"),
        job_noise_seed=seed,
    )
    stock = Schedule.stock()
    window = open_window(stock, 2.0, 0.0, device.now_s())
    read_j = steps = 0.0
    start_j, start_steps = device.true_energy_j(), job.steps
    while device.now_s() < 600.0:
        report = job.step_until_update(stock)
        if window.add(report):
            read_j += window.energy_per_step_j * window.steps
            steps += window.steps
            window = open_window(stock, 2.0, 0.0, device.now_s())
    true_j = (device.true_energy_j() - start_j) / (job.steps - start_steps)
    assert read_j / steps == pytest.approx(true_j, rel=0.005)


def _sync_job(seed: int, dry_run: bool = False):
    from kdvfs.runtime.job_noise import job_noise
    from kdvfs.runtime.registry import open_device, open_workload
    from kdvfs.runtime.steps import SimulatedJob

    device = open_device("sim:h200", seed=seed)
    workload = open_workload("gpt3-xl-layer", device)
    return device, SimulatedJob(
        device, workload, dry_run=dry_run, job_noise=job_noise("sync"), job_noise_seed=seed
    )


def _energy_per_step_j(schedule: Schedule, seed: int, seconds: float) -> float:
    """The simulated job's own energy per step under one schedule, waits included, J."""
    device, job = _sync_job(seed)
    job.step_until_update(schedule)
    start_j, start_steps = device.true_energy_j(), job.steps
    while device.now_s() < seconds:
        job.step_until_update(schedule)
    return (device.true_energy_j() - start_j) / (job.steps - start_steps)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_trial_reads_what_a_held_pair_draws_in_the_jobs_waits_where_the_syncs_fall_in_one_arm(seed):
    # The H200 layer under the recorded sync job's waits (5 ms a step on average: 0.5-s
    # evaluations, 1-2-s checkpoints every N steps). A held pair idles at its clocks through
    # them (1770/3201: about 124 W) where stock drops its clocks (about 83 W), and the syncs
    # come every few windows, so they fall in one arm more than the other. Judged at each
    # block's mean wait with the job's one wait power, the trial read 1770/3201 as costing
    # 8.6% where it costs 3.7%; at the trial's mean wait per step, each arm at its own wait
    # power, it reads the cost within a point.
    stock, held = Schedule.stock(), Schedule(((0, ClockPair(1770, 3201)),))
    true_saving = 1.0 - _energy_per_step_j(held, seed, 300.0) / _energy_per_step_j(stock, seed, 300.0)
    device, job = _sync_job(seed)
    meter = NoiseMeter()

    def trial(blocks: int) -> Trial:
        t = Trial(stock, held, blocks, 2.0, 0.01, wait_power_w=meter.wait_power_w)
        while not t.done:
            if t.current is None:
                t.open(device.now_s())
            t.add(job.step_until_update(t.schedule()))
        return t

    for _ in range(3):  # the job's wait power, from its pairs of windows, as the tuner learns it
        meter.add_pairs(trial(4).outcome().pairs)
    assert meter.wait_power_w > 0.0
    outcome = trial(24).outcome()
    assert -outcome.energy_diff == pytest.approx(true_saving, abs=0.01)
    assert outcome.energy_se < 0.005


def _judged_se(noise: NoiseMeter) -> float:
    """The energy error a 4-block trial of 2-s windows is judged at, against a reference whose
    2-s windows varied 20% (a long wait in one of them)."""
    stock = StockFigures(
        step_s=0.01,
        account_step_s=0.01,
        busy_s=0.01,
        energy_per_step_j=5.0,
        window_sd=0.20,
        time_sd_per_root_s=0.005,
        segment_times_s=np.array([0.01]),
        window_s=2.0,
    )
    outcome = Outcome(-0.03, 0.001, 0.0, 0.0005, 0.01, np.array([0.01]), blocks=4, abandoned=False)
    judgement = judge(
        outcome, stock, incumbent_step_s=0.01, incumbent_energy_j=5.0, budget=0.01, window_s=2.0, noise=noise
    )
    return judgement.saving_se


def test_the_meters_noise_replaces_the_references_once_the_jobs_wait_power_is_fitted():
    rng = np.random.default_rng(0)
    quiet = NoiseMeter()
    for _ in range(40):  # pairs whose waits do not differ: no wait power
        quiet.add(rng.normal(0.0, 0.01), rng.normal(0.0, 0.001), 2.0)
    assert quiet.wait_power_w == 0.0
    assert _judged_se(quiet) == pytest.approx(0.20 / math.sqrt(4))  # the reference's floor stands
    waiting = NoiseMeter()
    for _ in range(40):  # energy differences that follow the waits' at 300 W, a little noise on top
        wait = rng.normal(0.0, 2e-4)
        waiting.add(300.0 * wait + rng.normal(0.0, 0.01), rng.normal(0.0, 0.001), 2.0, wait, 500.0)
    assert waiting.wait_power_w > 0.0
    se = _judged_se(waiting)
    assert se == pytest.approx(waiting.energy_sd_per_root_s / math.sqrt(2.0 * 4))
    assert se < 0.05  # the meter's, not the reference's 10%


def test_the_noise_meters_time_figure_follows_every_new_pair_though_it_is_read_once_per_pair():
    meter = NoiseMeter(floor=0.0)
    assert math.isnan(meter.time_sd_per_root_s)
    rng = np.random.default_rng(3)
    for _ in range(20):
        meter.add(0.0, float(rng.normal(0.0, 0.01)), 2.0)
    quiet = meter.time_sd_per_root_s
    assert quiet == meter.time_sd_per_root_s  # read again: the same figure
    for _ in range(40):
        meter.add(0.0, float(rng.normal(0.0, 0.05)), 2.0)
    assert meter.time_sd_per_root_s > 2.0 * quiet
