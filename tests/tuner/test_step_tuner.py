"""StepTuner on the simulated job (seeded): phases in order, budget never exceeded, the null
test, an exception mid-trial; drift in seconds: a power-limit drop detected and re-tuned, an
exception mid-retune."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.scenarios import get_scenario
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.step_feed import site_workload
from kdvfs.runtime.steps import SimulatedJob, StepReport
from kdvfs.runtime.trials import MIN_GROUP_LATENCIES, MIN_PASS_LATENCIES, SHORT_PASS_SHARE
from kdvfs.runtime.types import ClockPair
from kdvfs.tuner import step_tuner
from kdvfs.tuner.oracle import InStep
from kdvfs.tuner.run import (
    DEFAULT_ENERGY_UPDATE_PERIOD_S,
    DEFAULT_SWITCH_LATENCY_S,
    Card,
    TuningRun,
    choose_prior,
    job_sites,
)
from kdvfs.tuner.session import TuneSession
from kdvfs.tuner.step_priors import model_schedule
from kdvfs.tuner.step_tuner import (
    PROVEN_VERIFY_BLOCKS,
    RETUNE_CLOCK_DROP,
    Exploring,
    Retuning,
    Settled,
    StepTuner,
    TrialFinished,
    Verifying,
    moved_with_stock,
    switchable_groups,
)
from tests.tuner.sim_jobs import job_session

BUDGET = 0.01
SECONDS = 340.0  # reference, exploration and verification of the one group on this card


class Recording:
    """Drives the tuner and records, after each answer, the tuner's slack and phase."""

    def __init__(self, tuner: StepTuner) -> None:
        self.tuner = tuner
        self.slack_s: list[float] = []

    def on_step_end(self, report):
        schedule = self.tuner.on_step_end(report)
        self.slack_s.append(self.tuner.account.slack_s())
        return schedule


def tuned(seed: int, *, dry_run: bool):
    device = open_device("sim:rtx3080ti", seed=seed)
    workload = open_workload("gpt3-xl-layer", device)
    tuner = StepTuner(
        workload,
        device.grid.pairs,
        switch_latency_s=device.switch_latency_s,
        energy_update_period_s=device.energy_update_period_s,
        budget=BUDGET,
        seed=seed,
    )
    stock_s, stock_j = device.expected_step([(k, None, k.launches) for k in workload.kernels])
    slowdowns: list[float] = []
    recording = Recording(tuner)
    job = SimulatedJob(device, workload, dry_run=dry_run)

    def watch(report):
        if report.end_s > 1.0:
            slowdowns.append(report.end_s / (stock_s * (report.step + 1)) - 1.0)

    job.run(recording, seconds=SECONDS, on_report=watch)
    return tuner, recording, slowdowns, 1.0 - device.true_energy_j() / (stock_j * job.steps)


@pytest.fixture(scope="module")
def tuning():
    return tuned(3, dry_run=False)


def test_phases_run_in_order_to_settled(tuning):
    tuner, *_ = tuning
    assert tuner.phases == ["Reference", "Exploring", "Verifying", "Settled"]


def test_the_budget_account_is_never_overdrawn_and_the_true_slowdown_stays_within_it(tuning):
    _, recording, slowdowns, _ = tuning
    assert min(recording.slack_s) >= 0.0
    assert max(slowdowns) <= BUDGET


def test_the_adopted_schedule_saves_energy_on_the_card(tuning):
    tuner, _, _, measured_saving = tuning
    assert tuner.adoptions and tuner.incumbent.one_pair() is not None
    # the card's true saving over the whole 340 s, the reference and the trials included
    # (adopted after about 4,600 of the run's steps), beyond the null test's 0.3%
    assert measured_saving > 0.005


def test_null_test_in_dry_run_adopts_nothing_and_saves_nothing():
    tuner, _recording, _, measured_saving = tuned(4, dry_run=True)
    assert tuner.trials >= 2  # candidates were tried: in dry run none differs from stock
    assert tuner.adoptions == []
    assert tuner.plan_energy_saving() == 0.0
    assert abs(measured_saving) <= 0.003


def test_an_exception_mid_trial_leaves_stock_clocks_requested_and_the_plan_readable():
    device = open_device("sim:rtx3080ti", seed=5)
    workload = open_workload("gpt3-xl-layer", device)
    tuner = StepTuner(
        workload,
        device.grid.pairs,
        switch_latency_s=device.switch_latency_s,
        energy_update_period_s=device.energy_update_period_s,
    )

    class Interrupted:
        def on_step_end(self, report):
            schedule = tuner.on_step_end(report)
            phase = tuner.phase
            if isinstance(phase, Exploring) and phase.trial is not None and phase.trial.arm == "B":
                raise KeyboardInterrupt
            return schedule

    job = SimulatedJob(device, workload)
    with pytest.raises(KeyboardInterrupt):
        job.run(Interrupted(), seconds=120.0)
    device.idle(1.0)
    assert device.clocks_in_effect() is None
    assert job.requests[-1][1] == Schedule.stock()
    assert tuner.incumbent.groups == ((0, None),)  # nothing adopted yet: the plan so far is stock


def test_groups_shorter_than_the_switch_allows_merge_into_one():
    assert switchable_groups([0, 13, 37], [0.02, 0.04, 0.006], 0.030) == [0]
    assert switchable_groups([0, 100, 500], [0.15, 0.3, 0.03], 0.030) == [0, 100]
    assert switchable_groups([0, 100, 500], [0.15, 0.3, 0.03], 0.0) == [0, 100, 500]


def test_a_pass_too_short_to_switch_takes_whole_segments_from_its_longer_neighbour():
    # 30-ms switches: groups of 120 ms (MIN_GROUP_LATENCIES), a short pass grown to 90 ms
    # (MIN_PASS_LATENCIES) or a fifth of the step (SHORT_PASS_SHARE), whichever is longer
    assert (MIN_GROUP_LATENCIES, MIN_PASS_LATENCIES, SHORT_PASS_SHARE) == (4.0, 3.0, 0.2)
    starts = [0, 10, 20, 30, 40, 50, 60]
    times_s = [0.07, 0.07, 0.04, 0.04, 0.04, 0.04, 0.06]  # forward 140 ms, backward 160, optimizer 60
    passes = ["forward"] * 2 + ["backward"] * 4 + ["optimizer"]
    # the optimizer takes the last backward segment (100 ms >= 90); the other backward segments
    # stay one group (120 ms), as does the forward pass (two 70-ms segments)
    assert switchable_groups(starts, times_s, 0.030, passes) == [0, 20, 50]
    # the same segments as one pass: the shortest group merges into its shorter neighbour
    assert switchable_groups(starts, times_s, 0.030) == [0, 40]


def test_a_short_pass_grows_to_a_fifth_of_a_long_step():
    starts = [0, 10, 20, 30, 40, 50, 60, 70, 80]
    times_s = [0.2, 0.2] + [0.04] * 6 + [0.065]  # forward 400 ms, backward 240, optimizer 65: 705 ms
    passes = ["forward"] * 2 + ["backward"] * 6 + ["optimizer"]
    # the optimizer takes two backward segments (145 ms, over a fifth of the step, 141 ms)
    assert switchable_groups(starts, times_s, 0.030, passes) == [0, 10, 20, 60]


def test_a_pass_whose_neighbour_cannot_spare_segments_merges_with_it():
    # forward 100 ms, backward 2 x 50 ms, optimizer 60 ms: the backward run would fall under
    # 120 ms by giving the optimizer a segment, so the optimizer joins it whole
    passes = ["forward", "backward", "backward", "optimizer"]
    assert switchable_groups([0, 10, 20, 30], [0.1, 0.05, 0.05, 0.06], 0.030, passes) == [0, 10]


# --- drift: the watch once Settled, Retuning, held plans --------------------------------------
def settled_with_prior(seed: int):
    """A tuner with the card's model prior run to Settled on the 3080 Ti layer, and its job."""
    device = open_device("sim:rtx3080ti", seed=seed)
    workload = open_workload("gpt3-xl-layer", device)
    tuner = StepTuner(
        workload,
        device.grid.pairs,
        switch_latency_s=device.switch_latency_s,
        energy_update_period_s=device.energy_update_period_s,
        seed=seed,
        prior=model_schedule(open_device("sim:rtx3080ti", noise=0.0), workload, BUDGET),
    )
    job = SimulatedJob(device, workload)
    schedule = Schedule.stock()
    while not isinstance(tuner.phase, Settled):
        assert device.now_s() < 600.0, "the tuner did not settle within 600 s"
        schedule = tuner.on_step_end(job.step(schedule))
    return tuner, job, schedule


def train(tuner, job, schedule, seconds: float, until=lambda tuner: False):
    """Steps for `seconds` (or until `until(tuner)`); the schedule and the least slack seen."""
    end_s, least_slack_s = job.seconds + seconds, math.inf
    while job.seconds < end_s and not until(tuner):
        schedule = tuner.on_step_end(job.step(schedule))
        least_slack_s = min(least_slack_s, tuner.account.slack_s())
    return schedule, least_slack_s


@pytest.fixture(scope="module")
def power_cap():
    """The settled tuner, 30 s of watching, then the power limit lowered (power-cap scenario)."""
    tuner, job, schedule = settled_with_prior(7)
    schedule, _ = train(tuner, job, schedule, 30.0)
    plan = tuner.incumbent
    get_scenario("power-cap").apply(job.device, job.workload)
    return tuner, job, schedule, plan, job.seconds


def test_a_power_limit_drop_is_detected_within_5_s_and_the_card_runs_stock(power_cap):
    tuner, job, schedule, plan, change_s = power_cap
    assert plan.groups[0][1] is not None  # the prior's pair was adopted
    schedule, _ = train(tuner, job, schedule, 5.0, until=lambda t: t.alarms)
    assert tuner.alarms and tuner.alarms[0].reasons == ("power_limit",)
    assert tuner.alarms[0].end_s - change_s <= 5.0
    assert isinstance(tuner.phase, Retuning) and tuner.phase.schedule_before == plan
    assert all(pair is None for _, pair in tuner.on_step_end(job.step(schedule)).groups)


def test_after_a_power_limit_drop_stock_is_measured_again_and_the_plan_before_verified_as_low_as_stock_fell(
    power_cap,
):
    tuner, job, schedule, plan, _ = power_cap
    clock_before_mhz = tuner.stock_clock_mhz
    schedule, least_slack_s = train(
        tuner, job, schedule, 400.0, until=lambda t: isinstance(t.phase, Exploring)
    )
    assert tuner.retunes == 1
    assert tuner.phases[-4:] == ["Retuning", "Reference", "Verifying", "Exploring"]
    assert least_slack_s >= 0.0
    # under the lower limit stock runs lower, and the plan before is verified lowered as much
    ratio = tuner.stock_clock_mhz / clock_before_mhz
    assert ratio < 1.0 - RETUNE_CLOCK_DROP
    lowered = moved_with_stock(plan, ratio, job.device.grid.pairs)
    assert lowered.groups[0][1].core_mhz < plan.groups[0][1].core_mhz
    after = [a for a in tuner.adoptions if a.end_s > tuner.alarms[0].end_s]
    assert tuner.incumbent == (after[-1].schedule if after else Schedule(((0, None),)))
    assert [a.schedule for a in after] == [lowered]  # verified and adopted


def test_a_plan_moves_with_stocks_clock_down_to_the_grid_at_its_memory_clock():
    pairs = [ClockPair(c, m) for c in (1050, 1260, 1470, 1680, 1890) for m in (5001, 9501)]
    plan = Schedule(((0, ClockPair(1680, 9501)), (5, None), (9, ClockPair(1050, 5001))))
    moved = moved_with_stock(plan, 1351.0 / 1656.0, pairs)  # the 3080 Ti layer's stock under 250 W
    assert moved == Schedule(((0, ClockPair(1260, 9501)), (5, None), (9, ClockPair(1050, 5001))))
    assert moved_with_stock(plan, 1.0, pairs) == plan


def test_an_exception_mid_retune_leaves_stock_clocks_requested():
    tuner, job, schedule = settled_with_prior(8)
    train(tuner, job, schedule, 25.0)
    get_scenario("power-cap").apply(job.device, job.workload)

    class FailsInReference:
        def on_step_end(self, report):
            schedule = tuner.on_step_end(report)
            if tuner.retunes and isinstance(tuner.phase, Verifying) and schedule != tuner.incumbent:
                raise RuntimeError("the training loop failed")
            return schedule

    with pytest.raises(RuntimeError):
        job.run(FailsInReference(), seconds=300.0)
    job.device.idle(1.0)
    assert job.device.clocks_in_effect() is None
    assert job.requests[-1][1] == Schedule.stock()


def test_after_a_power_limit_drop_a_plan_replanned_for_the_new_limit_is_verified_first():
    tuner, job, schedule = settled_with_prior(9)
    schedule, _ = train(tuner, job, schedule, 25.0)
    fresh = Schedule(((0, job.device.grid.pairs[len(job.device.grid.pairs) // 2]),))
    seen_limits_w: list[float] = []

    def replan(report):
        seen_limits_w.append(report.power_limit_w)
        return fresh

    tuner.replan = replan
    get_scenario("power-cap").apply(job.device, job.workload)
    train(
        tuner,
        job,
        schedule,
        400.0,
        until=lambda t: t.retunes and isinstance(t.phase, Verifying),
    )
    assert seen_limits_w == [job.device.power_cap_w]
    assert isinstance(tuner.phase, Verifying) and tuner.phase.group is None
    assert tuner.phase.trial.candidate == fresh


def test_a_dry_run_whose_stock_slows_after_the_reference_still_completes_most_of_its_trials():
    # A host that starves the GPU more as the job runs (the H200 vision and Lightning
    # recordings): every step, whatever its schedule, 3% slower after the first minute. The
    # candidates equal stock (a dry run), so neither the account nor the early time check may
    # take the drift for a slow candidate.
    card = Card(
        name="drifting",
        grid=open_device("sim:h200").grid,
        switch_latency_s=DEFAULT_SWITCH_LATENCY_S,
        energy_update_period_s=DEFAULT_ENERGY_UPDATE_PERIOD_S,
        source="replayed",
    )
    run = TuningRun(card, site_workload(("step",)), budget=0.01, strategy="botorch", seed=0, start_s=0.0)
    rng = np.random.default_rng(0)
    end_s, update_s = 0.0, 0.0
    for i in range(20_000):
        step_s = 0.030 * (1.03 if end_s > 60.0 else 1.0) * (1.0 + 0.002 * rng.standard_normal())
        end_s += step_s
        readings = []
        while update_s + 0.1 <= end_s:
            update_s += 0.1
            readings.append((update_s, 500.0 * update_s))  # 500 W throughout
        run.on_step_end(StepReport(i, end_s, step_s, (step_s,), tuple(readings), 50.0, frozenset(), 700.0))
        if end_s > 300.0:
            break
    trials = [o for o in run.summary()["outcomes"] if o["kind"] == "trial"]
    completed = sum(not o["abandoned"] and o["blocks"] > 0 for o in trials)
    assert completed >= 3 and completed > sum(o["abandoned"] for o in trials)
    assert run.summary()["adopted"] == 0


def test_after_an_adoption_that_made_the_step_faster_only_schedules_within_the_budget_are_verified():
    # on the simulated H200 a locked pair can run faster than stock (whose cap controller hunts):
    # the group's budget is what it may add to its time under that faster incumbent, not to
    # its stock time (seed 0 adopts 1605 MHz, 1.2% faster; it then verified 1380 MHz, +1.5%)
    session = job_session("h200", "gpt3-xl-layer", seed=0)
    workload = session.workload
    verified = []
    session.tuner.subscribe(
        lambda e: (
            verified.append(e.candidate) if isinstance(e, TrialFinished) and e.kind == "verify" else None
        )
    )
    session.run_until(1500.0)
    truth = InStep(open_device("sim:h200", noise=0.0), workload, BUDGET)
    slowdowns = [truth.figures(*truth.schedule(s))[1] for s in verified]
    # the run verifies within the budget whether or not it adopted a faster pair first (seed 10
    # did in a process of its own; after other tests, the strategy's draws differ and it verifies
    # 1425 MHz at once)
    assert verified
    assert max(slowdowns) <= BUDGET


def test_a_plan_that_has_run_is_read_at_its_own_steps_time_not_at_what_its_verification_read():
    # the simulated H200 layer with the Hugging Face job's noise, seed 2: the verification of
    # 1545/3201 read its time 0.4 points slower than the card runs it (+0.45% against +0.06%
    # in the in-step truth); read from that chain of ratios alone, every later candidate was
    # read as slow, and the plan held 1545/3201 for the hour. Its own steps (every window it
    # ran in) read it within a tenth of a point.
    from kdvfs.experiments.noisy_jobs import in_step, noise_of

    spec = "h200:gpt3-xl-layer:hf"
    session = job_session("h200", "gpt3-xl-layer", seed=2, budget=BUDGET, job_noise=noise_of(spec))
    session.tuner.expected_run_s = 3600.0
    session.run_until(1200.0)
    tuner = session.tuner
    assert tuner.adoptions and not tuner.incumbent.is_stock
    read = tuner.incumbent_step_s / tuner.stock_estimate_s - 1.0
    truth = in_step(spec, BUDGET)
    assert read == pytest.approx(truth.figures(*truth.schedule(tuner.incumbent))[1], abs=0.0015)


def test_a_verification_over_the_budget_on_time_alone_goes_on_to_a_faster_pair_of_the_same_group(monkeypatch):
    # the simulated H200's whole step (a quiet job), seed 1: the one-knob search's best is
    # 0.75% slower than stock in truth, at the budget's edge once the margins are counted; its
    # verification proves the saving and reads the time at +0.91% +- 0.08% after 12 blocks,
    # over the budget; the next is of a faster pair (+0.13% in truth), adopted (with
    # verifications going on, GO_ON_EXTENSIONS, a longer test proves its time instead: turned
    # off here; the hf job's seed 1 showed it before the account held back the noise of the
    # steps not run at stock)
    monkeypatch.setattr(step_tuner, "GO_ON_EXTENSIONS", 0)
    session = job_session("h200", "gpt3-xl", seed=1, budget=BUDGET)
    verifications = []
    session.tuner.subscribe(
        lambda e: verifications.append(e) if isinstance(e, TrialFinished) and e.kind == "verify" else None
    )
    session.run_until(900.0)
    truth = InStep(open_device("sim:h200", noise=0.0), session.workload, BUDGET)
    first, then = verifications[0], verifications[1]
    assert first.group == then.group
    assert not first.adopted and first.outcome.time_diff > BUDGET / 2
    # the next verification is of a pair that runs the step faster, truly within the budget
    first_slowdown = truth.figures(*truth.schedule(first.candidate))[1]
    then_slowdown = truth.figures(*truth.schedule(then.candidate))[1]
    assert then_slowdown < first_slowdown and then_slowdown <= BUDGET
    assert {p for _, p in then.candidate.groups} != {p for _, p in first.candidate.groups}


def test_a_trade_over_the_budget_on_time_is_verified_again_with_its_lowered_group_one_memory_clock_up():
    # the simulated RTX 3080 Ti's whole step under the hf noise, seed 0: the trades lower the
    # last group (from site 824) from 1470/9251 to 1260/9251, +0.85% slower than stock in the
    # row's in-step truth and read at +0.99% +- 0.05% (the stock margin, the verification's
    # time errors): over the budget on time. 1260/9501 there saves as much (7.19% against
    # 7.18%) at +0.45%; before, no trial tried it until 2,255 s, and seed 4 never did
    from kdvfs.experiments.noisy_jobs import in_step, noise_of

    spec = "rtx3080ti:gpt3-xl:hf"
    session = job_session("rtx3080ti", "gpt3-xl", seed=0, budget=BUDGET, job_noise=noise_of(spec))
    session.tuner.expected_run_s = 3600.0
    verified = []
    session.tuner.subscribe(
        lambda e: verified.append(e) if isinstance(e, TrialFinished) and e.kind == "verify" else None
    )
    session.run_until(1500.0)
    truth = in_step(spec, BUDGET)
    over = [
        i for i, e in enumerate(verified) if not e.adopted and e.judgement.slowdown + 0.1 * BUDGET > BUDGET
    ]
    assert over, "no verification read its candidate at the budget's edge"
    first = verified[over[0]]
    # the next candidate verified (a verification left open goes on once with its blocks kept)
    then = next((e for e in verified[over[0] + 1 :] if e.candidate != first.candidate), None)
    assert then is not None, "nothing verified after the candidate over the budget"
    moved = [(a, b) for (_, a), (_, b) in zip(first.candidate.groups, then.candidate.groups) if a != b]
    assert moved and all(a.core_mhz == b.core_mhz and b.mem_mhz > a.mem_mhz for a, b in moved)
    assert then.adopted and session.tuner.incumbent == then.candidate
    saving, slowdown = truth.figures(*truth.schedule(then.candidate))
    first_saving, first_slowdown = truth.figures(*truth.schedule(first.candidate))
    assert slowdown < first_slowdown - 0.002 and saving > first_saving - 0.002


def test_a_candidate_stopped_on_its_measured_time_is_told_that_time_and_its_measured_power():
    # the simulated H200 fast-switch layer, seed 0: the one-knob search's third pair, 1380/3201
    # MHz (2% slower than stock, 7% less energy), is stopped on its time just after its second
    # B window opened; told the incumbent's power (that open window had read none), the search
    # read lower clocks as dearer and converged at 1965 MHz, saving nothing in 2 h
    device = open_device("sim:h200-fastswitch", seed=0)
    workload = open_workload("gpt3-xl-layer", device)
    session = TuneSession(
        device, workload, budget=BUDGET, seed=0, sites=job_sites(workload, device.switch_latency_s)
    )
    session.tuner.expected_run_s = 7200.0  # a 2-h run, as the peers' comparison runs it
    told = []
    tell = session.tuner.strategy.tell

    def recording_tell(task, config, time_s, energy_j):
        told.append((session.tuner.pairs[config], time_s / task.ref_time_s, energy_j / task.ref_energy_j))
        tell(task, config, time_s, energy_j)

    session.tuner.strategy.tell = recording_tell
    session.run_until(150.0)  # 1380 MHz is told at ~103 s since the cap controller's integral term
    stopped = [(time_ratio, energy_ratio) for pair, time_ratio, energy_ratio in told if pair.core_mhz == 1380]
    assert stopped, "the search did not try 1380 MHz"
    time_ratio, energy_ratio = stopped[0]
    assert 1.0 + BUDGET < time_ratio < 1.1  # over the budget, as measured
    assert energy_ratio < 0.97  # B's own power: it saves energy


def test_after_the_inlet_air_warms_the_model_replans_at_the_reported_temperature_and_verifies_from_two_blocks():
    # the 3080 Ti layer settles on 1680/9501 MHz; 15 C warmer, its own model plans 1470 MHz
    # (the stock card throttles): the re-plan after the alarm must see the warmer card, and
    # while the job runs stock it is verified from PROVEN_VERIFY_BLOCKS blocks on
    device = open_device("sim:rtx3080ti", seed=0)
    workload = open_workload("gpt3-xl-layer", device)
    model = open_device("sim:rtx3080ti", noise=0.0)
    sites = job_sites(workload, device.switch_latency_s)
    prior = choose_prior(device, workload, BUDGET, store=None, model=model, sites=sites)
    session = TuneSession(device, workload, budget=BUDGET, seed=0, prior=prior, model=model, sites=sites)
    # settled, and not about to reopen a group within the next 100 s (its abandoned trials
    # reopen it in rounds, and the drift watch runs only while Settled)
    session.run_until(360.0)
    while not (
        isinstance(session.tuner.phase, Settled) and session.tuner.phase.reopen_at_s > session.seconds + 100.0
    ):
        assert session.seconds < 1200.0, "not settled within 1200 s"
        session.run_until(session.seconds + 5.0)
    warm = open_device("sim:rtx3080ti", noise=0.0)
    get_scenario("ambient-step").apply(warm, workload)
    expected = model_schedule(warm, workload, BUDGET, sites)
    assert expected != session.tuner.incumbent  # the warmer card's plan is another

    get_scenario("ambient-step").apply(device, workload)
    end_s = session.seconds + 300.0
    while not (session.tuner.retunes and isinstance(session.tuner.phase, Verifying)):
        assert session.seconds < end_s, "no verification after a retune within 300 s of the change"
        session.run_until(session.seconds + 1.0)
    assert session.tuner.phase.group is None
    assert session.tuner.phase.trial.candidate == expected
    assert session.tuner.phase.trial.min_blocks == PROVEN_VERIFY_BLOCKS


def test_a_finished_trial_carries_the_judgement_the_tuner_read_it_by_and_the_run_keeps_it():
    # the stated error is never below the blocks' own (judge takes the larger of it and the
    # job's predicted noise); the run's outcome record keeps the same figures for its JSON
    session = job_session("rtx3080ti", "gpt3-xl-layer", seed=0, budget=BUDGET, dry_run=True)
    finished = []
    session.tuner.subscribe(lambda e: finished.append(e) if isinstance(e, TrialFinished) else None)
    session.run_until(240.0)
    judged = [e for e in finished if e.kind in ("trial", "verify") and e.outcome.blocks > 0]
    assert judged, "no trial completed a block in 240 s"
    for e in judged:
        assert e.judgement is not None
        assert e.judgement.saving == pytest.approx(-e.outcome.energy_diff)
        assert e.judgement.saving_se >= e.outcome.energy_se or math.isinf(e.outcome.energy_se)
    kept = [o["judged"] for o in session.run.outcomes if o["blocks"] > 0 and o["kind"] in ("trial", "verify")]
    assert [k["saving_se"] for k in kept] == [e.judgement.saving_se for e in judged]
