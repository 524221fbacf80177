"""StepTuner on the simulated job (seeded): phases in order, budget never exceeded, the null
test, an exception mid-trial."""

from __future__ import annotations

import pytest

from kdvfs.runtime.iteration import Schedule
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.tuner.step_tuner import Exploring, StepTuner, switchable_groups

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
    stock_s, stock_j = device.expected_iteration([(k, None, k.launches) for k in workload.kernels])
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
    assert measured_saving > 0.01


def test_null_test_in_dry_run_adopts_nothing_and_saves_nothing():
    tuner, _recording, _, measured_saving = tuned(4, dry_run=True)
    assert "Verifying" in tuner.phases or "Settled" in tuner.phases
    assert tuner.adoptions == []
    assert tuner.running_saving() == 0.0
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
