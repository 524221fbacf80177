"""The tuning run: the one place a StepTuner is built, and the events every caller follows."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from kdvfs.policies.registry import STRATEGIES
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.tuner.run import (
    METRICS,
    PHASES,
    Card,
    Point,
    TuningRun,
    choose_prior,
    largest_cumulative_slowdown,
    point_metrics,
    reached_after,
)
from kdvfs.tuner.step_tuner import (
    Adoption,
    Exploring,
    Phase,
    PhaseEntered,
    StepTiming,
    TrialFinished,
    Verifying,
)
from tests.tuner.sim_jobs import job_session

ROOT = Path(__file__).resolve().parents[2]
#: Short measuring lengths: a run of a few simulated minutes goes through every phase.
QUICK = StepTiming(
    reference_s=2.0,
    trial_window_s=0.5,
    trial_blocks=2,
    verify_window_s=0.5,
    verify_blocks=2,
    verify_max_blocks=4,
    max_trials_per_group=4,
)


def test_no_layer_but_the_tuning_run_builds_a_step_tuner() -> None:
    builders = []
    for layer in ("runtime", "envs", "policies", "tuner", "experiments", "cli", "service"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "StepTuner":
                    builders.append(str(path.relative_to(ROOT)))
    assert builders == ["tuner/run.py"]


def quick_run(seconds: float) -> tuple[TuningRun, list[object]]:
    device = open_device("sim:rtx3080ti", seed=2)
    workload = open_workload("gpt3-xl-layer", device)
    noiseless = open_device("sim:rtx3080ti", noise=0.0)
    run = TuningRun(
        Card.of(device),
        workload,
        strategy="ucb",
        seed=2,
        prior=choose_prior(device, workload, 0.01, store=None, model=noiseless),
        timing=QUICK,
        start_s=device.now_s(),
    )
    events: list[object] = []
    run.subscribe(events.append)
    SimulatedJob(device, workload).run(run, seconds=seconds)
    return run, events


def test_the_runs_events_are_the_tuners_phases_trials_adoptions_and_points_in_order() -> None:
    run, events = quick_run(150.0)
    entered = [e.phase for e in events if isinstance(e, PhaseEntered)]
    names = ["Reference"]
    for name in entered:
        if name != names[-1]:
            names.append(name)
    assert names == run.tuner.phases and "Settled" in names
    assert [e for e in events if isinstance(e, Adoption)] == run.tuner.adoptions
    finished = [e for e in events if isinstance(e, TrialFinished)]
    assert len(finished) == len(run.outcomes)
    # every trial started has ended, but one a reopened search may have running at the end
    in_progress = 1 if isinstance(run.tuner.phase, Exploring | Verifying) else 0
    assert run.tuner.trials - len(finished) in {0, in_progress}
    assert [e.kind for e in finished].count("verify") >= 1
    assert all((e.adopted is None) == (e.kind == "trial") for e in finished)
    points = [e for e in events if isinstance(e, Point)]
    assert points == run.points and 140 <= len(points) <= 151  # about one a training second
    assert [p.end_s for p in points] == sorted(p.end_s for p in points)
    assert run.phase_log[0] == (0.0, "Reference") and run.converged_after_s is not None


def test_a_points_metrics_are_the_runs_metric_names_and_finite() -> None:
    run, _ = quick_run(20.0)
    first, last = point_metrics(run.points[0]), point_metrics(run.points[-1])
    assert set(last) <= set(METRICS) and {"slowdown", "energy_saving", "phase"} <= set(last)
    assert "slowdown" not in first or run.tuner.account.before_steps > 0  # nothing before stock
    assert all(v == v for v in last.values())


def test_reached_and_stayed_is_the_time_from_which_every_later_schedule_saves_the_level() -> None:
    savings = {"a": 0.05, "b": 0.01, "c": 0.06}
    history = [(1.0, "a"), (2.0, "b"), (3.0, "c")]
    assert reached_after(history, savings.get, 0.05) == 3.0  # b fell below: counted from c
    assert reached_after(history[:1], savings.get, 0.05) == 1.0
    assert reached_after(history[:2], savings.get, 0.05) is None


def test_the_largest_cumulative_slowdown_is_read_at_the_end_of_each_schedule_over_the_steps_so_far() -> None:
    slowdowns = {"stock": 0.0, "trial": 0.10, "plan": 0.005}
    # 10 s at stock, then a 1-s trial arm 10% slower, then a plan 0.5% slower to 100 s
    history = [(0.0, "stock"), (10.0, "trial"), (11.0, "plan")]
    largest = largest_cumulative_slowdown(history, 100.0, slowdowns.get)
    after_trial = 11.0 / (10.0 + 1.0 / 1.10) - 1.0  # the worst point: the trial's end
    assert largest == pytest.approx(after_trial)
    assert largest_cumulative_slowdown(history, 100.0, slowdowns.get, from_s=50.0) == pytest.approx(
        100.0 / (10.0 + 1.0 / 1.10 + 89.0 / 1.005) - 1.0
    )
    assert largest_cumulative_slowdown([(0.0, "stock")], 5.0, slowdowns.get) == 0.0


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_by_name_builds_a_run_and_answers_steps(name: str) -> None:
    device = open_device("sim:rtx3080ti", seed=0)
    workload = open_workload("gpt3-xl-layer", device)
    run = TuningRun(Card.of(device), workload, strategy=name, timing=QUICK, start_s=device.now_s())
    SimulatedJob(device, workload).run(run, seconds=4.0)
    assert run.tuner.stock is not None and run.strategy == name


def test_every_phase_of_the_tuner_has_an_index_in_the_logged_phase_metric() -> None:
    names = {phase.__name__ for phase in typing.get_args(Phase)}
    assert names <= set(PHASES)
    assert PHASES[:5] == (
        "Reference",
        "Exploring",
        "Verifying",
        "Settled",
        "Retuning",
    )  # earlier runs' indices


def test_a_run_from_no_prior_logs_its_phase_metric_through_the_trades_and_the_screening() -> None:
    # the simulated H200's whole step (5 groups) reaches Trading and Screening within 600 s at
    # QUICK lengths; every point's metrics are what an MLflow run logs (kdvfs tune, kdvfs.tune)
    session = job_session("h200", "gpt3-xl", seed=0, budget=0.01)
    session.tuner.timing = QUICK
    logged: list[float] = []
    session.run_until(600.0, on_point=lambda point: logged.append(point_metrics(point)["phase"]))
    assert {PHASES.index("Trading"), PHASES.index("Screening")} <= set(logged)
