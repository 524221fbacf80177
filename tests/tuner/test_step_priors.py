"""Priors of the step-driven tuner: switch sites, the grouping planned from a prior, fill-ins."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kdvfs.runtime.measure import StepReference
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.step_feed import site_workload
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel, Workload
from kdvfs.tuner.observations import Observations
from kdvfs.tuner.step_priors import (
    Prior,
    model_schedule,
    observed_prior,
    prior_schedule,
    sweep_prior,
    switch_sites,
)

FAST = ClockPair(1800, 9000)
SLOW = ClockPair(1200, 9000)


def three_segments(slow_time_s: float) -> Prior:
    """Three one-kernel segments of 0.1 s at stock (last column): SLOW saves 20% of the first
    one's energy at the given time and costs the others more; FAST equals stock."""
    time_s = np.array([[0.1, slow_time_s, 0.1], [0.1, 0.1, 0.1], [0.1, 0.1, 0.1]])
    energy_j = np.array([[10.0, 8.0, 10.0], [10.0, 10.5, 10.0], [10.0, 10.5, 10.0]])
    return Prior((FAST, SLOW), time_s, energy_j)


def test_switch_sites_of_the_whole_step_are_its_passes_and_layers():
    workload = open_workload("gpt3-xl", open_device("sim:rtx3080ti"))
    sites = switch_sites(workload)
    kernels = workload.kernels
    passes = [i for i in range(1, len(kernels)) if kernels[i].pass_name != kernels[i - 1].pass_name]
    assert sites[0] == 0 and set(passes) <= set(sites)
    assert len(sites) > 2 * 24  # each of the 24 layers, forward and backward
    assert all(
        kernels[i].name.split(".")[0] != kernels[i - 1].name.split(".")[0] or i in passes for i in sites[1:]
    )


def test_the_prior_schedule_slows_only_the_segment_whose_saving_fits_the_budget():
    schedule = prior_schedule(three_segments(0.1), [0, 1, 2], switch_latency_s=0.0, budget=0.01)
    assert schedule.groups[0] == (0, SLOW)  # free of time: taken
    assert all(pair != SLOW for _, pair in schedule.groups[1:])


def test_the_prior_schedule_keeps_stock_when_the_saving_costs_more_than_the_budget():
    schedule = prior_schedule(three_segments(0.15), [0, 1, 2], switch_latency_s=0.0, budget=0.01)
    assert all(pair != SLOW for _, pair in schedule.groups)


def test_a_switch_lands_at_the_next_segment_so_the_schedule_requests_it_one_segment_early():
    schedule = prior_schedule(three_segments(0.1), [0, 1, 2], switch_latency_s=0.001, budget=0.01)
    assert schedule.groups[-1] == (2, SLOW)  # lands as the next step's first segment starts
    assert (0, SLOW) not in schedule.groups


def test_a_switch_latency_longer_than_the_step_leaves_one_group():
    schedule = prior_schedule(three_segments(0.1), [0, 1, 2], switch_latency_s=1.0, budget=0.01)
    assert len(schedule.groups) == 1


def test_switch_sites_must_start_at_the_first_kernel():
    with pytest.raises(KdvfsError, match="sites"):
        prior_schedule(three_segments(0.1), [1, 2], switch_latency_s=0.001, budget=0.01)


def test_unmeasured_cells_are_filled_in_pessimistically_and_never_planned():
    workload = Workload("w", (Kernel("a"), Kernel("b")))
    reference = StepReference(np.array([0.1, 0.1]), 0.2, 20.0, 0.0, 100, 100, 0.0)
    obs = Observations(workload, (FAST, SLOW), reference)
    obs.stock_energy_j[:] = 10.0
    obs.time_s[0, 1], obs.energy_j[0, 1], obs.counts[0, 1] = 0.1, 5.0, 1  # a: SLOW measured
    prior = observed_prior(obs)
    assert prior.time_s[1, 1] == pytest.approx(0.1 * 1800 / 1200)  # b at SLOW: stock time x ratio
    assert prior.energy_j[1, 1] == 10.0
    schedule = prior_schedule(prior, [0, 1], switch_latency_s=0.0, budget=0.01)
    assert schedule.groups[0] == (0, SLOW)
    assert all(pair in (FAST, None) for start, pair in schedule.groups if start == 1)


def test_the_model_schedule_of_the_3080ti_layer_is_one_pair_for_the_step():
    device = open_device("sim:rtx3080ti", noise=0.0)
    schedule = model_schedule(device, open_workload("gpt3-xl-layer", device), 0.01)
    assert isinstance(schedule, Schedule) and len(schedule.groups) == 1 and schedule.groups[0][1] is not None


H200_SWEEP = Path(__file__).resolve().parents[2] / "data" / "h200" / "sweep_nvml_dryrun.json"


def test_a_real_cards_sweep_becomes_a_prior_of_the_jobs_pass_sites():
    # the H200 dry run's pass-level plan (a plan of noise, made before the pass-level
    # plan fell back to stock; as a file it serves): forward 1440/2201, backward 885/3201,
    # the optimizer not swept (its ops were not rebuilt), so stock
    sites = site_workload(["step", "forward", "backward", "optimizer"])
    prior = sweep_prior(H200_SWEEP, sites)
    assert prior == Schedule(((0, ClockPair(1440, 2201)), (2, ClockPair(885, 3201)), (3, None)))


def test_a_sweep_planned_all_stock_gives_no_prior_and_a_bad_file_one_clear_error(tmp_path):
    doc = json.loads(H200_SWEEP.read_text())
    doc["pass_level"]["plan"] = {name: None for name in doc["pass_level"]["plan"]}
    stock = tmp_path / "stock.json"
    stock.write_text(json.dumps(doc))
    assert sweep_prior(stock, site_workload(["forward", "backward"])) is None
    simulated = tmp_path / "sim.json"
    simulated.write_text(json.dumps({"source": "simulated"}))
    with pytest.raises(KdvfsError, match="not the JSON of a real card's sweep"):
        sweep_prior(simulated, site_workload(["forward"]))
