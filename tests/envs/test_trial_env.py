"""TrialDVFS-v0: the step-driven tuner's loop as an env, its reward the tuner's judgement,
and a PPO agent trained through it that serves as a strategy."""

from __future__ import annotations

import dataclasses
import doctest
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import kdvfs.envs  # noqa: F401  (registers the envs)
from kdvfs.envs.reward import trial_reward
from kdvfs.envs.trial_env import TrialDVFSEnv
from kdvfs.policies.agent import AgentStrategy, train_agent
from kdvfs.policies.base import SearchSpace
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.types import KdvfsError, Workload
from kdvfs.runtime.workloads import gpt3_xl_layer
from kdvfs.tuner.search import run_search, search_space
from kdvfs.tuner.session import TuneSession

DATA = Path(__file__).resolve().parents[2] / "data"
REAL_TABLE = DATA / "dvfs-real" / "gtx1080ti-dvfs-real-Performance-Power.csv"
#: Three kernels of the layer, 40 launches each, in two passes: a 0.5-s step, so that a trial
#: is a few steps and PPO's few hundred trials take seconds.
LONG = Workload(
    "gpt3-slice-long",
    tuple(
        dataclasses.replace(gpt3_xl_layer().kernel(n), launches=40)
        for n in ("qkv_fwd", "fc_fwd", "fc_dinp_bwd")
    ),
)
#: Short trials: the tests run in seconds (the defaults are the tuner's 2-s windows, 4 blocks).
QUICK = {"window_s": 0.3, "blocks": 2, "reference_s": 1.0, "trials_per_group": 4}
#: Shorter still for training: one block of 0.1-s windows.
TRAIN = {"window_s": 0.1, "blocks": 1, "reference_s": 0.5, "trials_per_group": 4}


def make(
    device: str = "sim:rtx3080ti", workload: str | Workload = "gpt3-xl-layer", **kwargs
) -> gymnasium.Env:
    return gymnasium.make("kdvfs/TrialDVFS-v0", device=device, workload=workload, **kwargs)


def test_check_env_passes_on_a_simulated_card() -> None:
    check_env(make(workload=LONG, **QUICK).unwrapped, skip_render_check=True)


def test_check_env_passes_on_the_recorded_gtx1080ti_table() -> None:
    env = make(f"replay:{REAL_TABLE}", "table", **QUICK)
    check_env(env.unwrapped, skip_render_check=True)
    assert env.action_space.n == 20


def test_the_docstring_example_runs() -> None:
    for test in doctest.DocTestFinder().find(TrialDVFSEnv, "TrialDVFSEnv", globs={}):
        assert doctest.DocTestRunner().run(test).failed == 0


def test_an_episode_explores_every_group_and_then_terminates() -> None:
    env = make(**QUICK)
    env.reset(seed=1)
    groups, steps, terminated = set(), 0, False
    while not terminated:
        action = int(np.flatnonzero(env.unwrapped.action_masks())[0])
        _, reward, terminated, truncated, info = env.step(action)
        groups.add(info["group"])
        steps += 1
        assert np.isfinite(reward) and not truncated
    assert groups == set(range(len(env.unwrapped.incumbent.groups)))
    assert steps <= QUICK["trials_per_group"] * len(groups)
    with pytest.raises(KdvfsError, match="ended"):
        env.step(0)


def test_a_tried_pair_is_masked_in_its_group() -> None:
    env = make(**QUICK).unwrapped
    env.reset(seed=0)
    action = int(np.flatnonzero(env.action_masks())[-1])
    env.step(action)
    assert not env.action_masks()[action] or env.trials_per_group == 1


def test_the_reward_is_the_compute_waste_reward_of_the_tuners_judgement_of_the_same_trial() -> None:
    """The env is a tuning run: its stock is what `kdvfs tune`'s run measures on an
    identically seeded job, and its reward is the tuner's judgement of the env's trial."""
    env = make(budget=0.01).unwrapped  # the tuner's own windows, blocks and reference
    env.reset(seed=3)
    top_core, top_mem = max(p.core_mhz for p in env.pairs), max(p.mem_mhz for p in env.pairs)
    pair = min((p for p in env.pairs if p.mem_mhz == top_mem), key=lambda p: abs(p.core_mhz - 0.8 * top_core))
    _, reward, _, _, info = env.step(env.pairs.index(pair))

    device = open_device("sim:rtx3080ti", seed=3)
    session = TuneSession(device, open_workload("gpt3-xl-layer", device), sites=None)
    while session.tuner.stock is None:
        session.run_until(session.seconds + 1.0)
    assert session.tuner.stock.step_s == env.stock.step_s
    assert session.tuner.stock.energy_per_step_j == env.stock.energy_per_step_j

    assert not env.tuner.adoptions  # nothing adopted since: the same judge
    judgement = env.tuner.judge(env.outcome, env.window_s)
    assert reward == trial_reward(judgement, 0.01)
    assert info["saving"] == judgement.saving and info["adopted"] == judgement.adopted
    assert -1.0 < reward < 1.0, pair  # 0.8 x the top core clock: neither free nor catastrophic


def test_ppo_trains_a_few_hundred_steps_and_the_agent_is_a_strategy() -> None:
    env = make(workload=LONG, **TRAIN)
    model = train_agent(env, 200, seed=0)
    assert model.num_timesteps >= 200

    # as a strategy: asks only unmeasured pairs, stops by itself, and its plan keeps the budget
    device = open_device("sim:rtx3080ti", seed=5)
    policy = AgentStrategy(search_space(device), 5, model=model)
    result = run_search(device, LONG, policy, budget=0.01, seed=5)
    assert result.measurements > 0
    assert result.slowdown <= 0.01
    assert result.energy_saving >= 0.0


def test_a_saved_agent_loads_on_its_grid_and_is_refused_on_another(tmp_path: Path, monkeypatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where SB3 would put a log folder
    model = train_agent(make(workload=LONG, **TRAIN), 8, seed=0)
    assert not list(tmp_path.glob("SB3-*"))  # training leaves no log folder behind
    model.save(tmp_path / "agent.zip")
    loaded = AgentStrategy(search_space(open_device("sim:rtx3080ti")), 0, model=tmp_path / "agent.zip")
    obs = np.zeros(model.observation_space.shape, dtype=np.float32)
    assert loaded.model.predict(obs, deterministic=True)[0] == model.predict(obs, deterministic=True)[0]
    space = SearchSpace(np.array([[1000.0, 5000.0], [2000.0, 7000.0]]))
    with pytest.raises(ValueError, match="trained on 50 clock pairs"):
        AgentStrategy(space, 0, model=model)
    with pytest.raises(ValueError, match="needs a trained agent"):
        AgentStrategy(space, 0)
