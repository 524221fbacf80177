"""StepDVFS-v0: Gymnasium API, honest step measurement, switch physics, seeding, reward."""

from __future__ import annotations

import doctest
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from kdvfs.envs.reward import compute_waste_reward
from kdvfs.envs.step_env import StepDVFSEnv, measure_steps
from kdvfs.runtime.replay import ReplayDevice
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair, KdvfsError, Workload
from kdvfs.runtime.workloads import gpt3_xl_layer

DATA = Path(__file__).resolve().parents[2] / "data"
REAL_TABLE = DATA / "dvfs-real" / "gtx1080ti-dvfs-real-Performance-Power.csv"
SMALL = Workload(
    "gpt3-slice", tuple(gpt3_xl_layer().kernel(n) for n in ("ln1_fwd", "qkv_fwd", "gelu_fwd", "fc_fwd"))
)

# Not a full product (1000/7000 is missing); the reference is the highest pair, 2000/7000.
TOY_TABLE = """kernel,core_mhz,mem_mhz,time_s,energy_j
gemm,2000,7000,0.002,0.6
gemm,1500,7000,0.0026,0.55
gemm,2000,5000,0.00205,0.56
gemm,1000,5000,0.004,0.7
copy,2000,7000,0.001,0.25
copy,1500,7000,0.001005,0.2
copy,2000,5000,0.0014,0.22
copy,1000,5000,0.00145,0.17
"""


@pytest.fixture
def toy_csv(tmp_path: Path) -> Path:
    path = tmp_path / "toy.csv"
    path.write_text(TOY_TABLE)
    return path


def make(device: str, workload: str | Workload, **kwargs: object) -> gymnasium.Env:
    return gymnasium.make("kdvfs/StepDVFS-v0", device=device, workload=workload, **kwargs)


def uniform(env: StepDVFSEnv, pair: ClockPair) -> np.ndarray:
    return env.action_for({k.name: pair for k in env.workload.kernels})


# --- Gymnasium API ----------------------------------------------------------------------
def test_check_env_on_a_simulated_device() -> None:
    check_env(make("sim:a100", SMALL).unwrapped, skip_render_check=True)


def test_check_env_on_a_synthetic_table(toy_csv: Path) -> None:
    check_env(make(f"replay:{toy_csv}", "table").unwrapped, skip_render_check=True)


def test_check_env_on_the_recorded_gtx1080ti_table() -> None:
    env = make(f"replay:{REAL_TABLE}", "table", steps_per_action=3)
    check_env(env.unwrapped, skip_render_check=True)
    assert env.action_space.nvec.tolist() == [20] * 30


def test_registered_id_makes_with_a_time_limit() -> None:
    env = gymnasium.make("kdvfs/StepDVFS-v0", device="sim:rtx3080ti", workload="gpt3-xl-layer", budget=0.01)
    assert env.spec is not None and env.spec.max_episode_steps == 200
    assert isinstance(env.unwrapped, StepDVFSEnv)
    assert env.action_space.nvec.tolist() == [50] * 44


def test_docstring_example_runs() -> None:
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(StepDVFSEnv, "StepDVFSEnv", globs={}):
        runner.run(test)
    assert runner.summarize(verbose=False).attempted > 0
    assert runner.summarize(verbose=False).failed == 0


# --- measurement ------------------------------------------------------------------------
def test_measured_step_matches_the_table(toy_csv: Path) -> None:
    device = ReplayDevice.from_csv(toy_csv)
    kernels = device.table.workload().kernels
    plan = [ClockPair(1500, 7000), ClockPair(1000, 5000)]  # gemm, copy
    m = measure_steps(device, kernels, plan, steps=20)
    assert m.time_s == pytest.approx(0.0026 + 0.00145)
    assert m.energy_j == pytest.approx(0.55 + 0.17, rel=0.03)
    assert m.cost_s >= 21 * m.time_s and not m.throttled


def test_a_uniform_plan_asks_for_clocks_once_per_step() -> None:
    env = StepDVFSEnv("sim:a100-fastswitch", SMALL, noise=0.0)
    env.reset(seed=0)
    env.step(uniform(env, ClockPair(1110, 1215)))
    switches = env.device.switches
    env.step(uniform(env, ClockPair(1110, 1215)))
    assert env.device.switches == switches


@pytest.mark.parametrize("preset", ["a100-fastswitch", "a100"])
def test_per_kernel_switching_waits_out_the_switch_latency(preset: str) -> None:
    env = StepDVFSEnv(f"sim:{preset}", SMALL, noise=0.0)
    env.reset(seed=0)
    alternating = np.array([env.device.grid.index(ClockPair(c, 1215)) for c in (1410, 510, 1410, 510)])
    _, _, _, _, info = env.step(alternating)
    slowdown = info["time_s"] / info["ref_time_s"] - 1.0
    waits = 4 * env.device.switch_latency_s / info["ref_time_s"]  # 4 switches a step
    assert info["expected_slowdown"] > 0.5  # the 510 MHz kernels
    assert slowdown == pytest.approx(info["expected_slowdown"] + waits, rel=0.05)


# --- seeding ----------------------------------------------------------------------------
def _rollout(seed: int, actions: list[np.ndarray]) -> list[tuple]:
    env = StepDVFSEnv("sim:a100", SMALL)
    obs, _ = env.reset(seed=seed)
    out = [tuple(obs["temperature_c"].tolist())]
    for a in actions:
        obs, reward, *_ = env.step(a)
        out.append((reward, *obs["last"].tolist(), *obs["temperature_c"].tolist()))
    return out


def test_same_seed_same_episode_different_seed_different() -> None:
    rng = np.random.default_rng(0)
    actions = [rng.integers(60, 81, size=len(SMALL)) for _ in range(3)]
    assert _rollout(5, actions) == _rollout(5, actions)
    assert _rollout(5, actions)[1:] != _rollout(6, actions)[1:]


def test_make_vec_sync_runs_steps() -> None:
    envs = gymnasium.make_vec(
        "kdvfs/StepDVFS-v0", num_envs=2, vectorization_mode="sync", device="sim:a100", workload=SMALL
    )
    obs, _ = envs.reset(seed=0)
    assert obs["last"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    _, rewards, terminated, _truncated, info = envs.step(np.full((2, len(SMALL)), 70))
    assert np.all(np.isfinite(rewards)) and not terminated.any() and info["time_s"].shape == (2,)
    envs.close()


# --- reward -----------------------------------------------------------------------------
def test_in_budget_saving_pays_and_over_budget_is_penalised() -> None:
    device = SimulatedDevice("a100", noise=0.0)
    ref_t, ref_e = device.expected_step([(k, None, k.launches) for k in SMALL.kernels])
    figures = []
    for pair in device.grid.pairs:
        t, e = device.expected_step([(k, pair, k.launches) for k in SMALL.kernels])
        if t <= ref_t:
            figures.append((1.0 - e / ref_e, pair))
    saving, pair = max(figures)
    assert saving > 0.03
    env = StepDVFSEnv("sim:a100", SMALL, budget=0.01, noise=0.0)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(uniform(env, pair))
    assert reward == pytest.approx(saving, abs=0.02) and reward > 0.01
    assert info["expected_saving"] == pytest.approx(saving)
    _, reward, _, _, info = env.step(uniform(env, ClockPair(210, 1215)))
    measured = (info["time_s"], info["energy_j"], info["ref_time_s"], info["ref_energy_j"])
    assert reward == pytest.approx(compute_waste_reward(*measured, budget=0.01))
    assert reward < -100.0


def test_highest_pair_on_a_table_is_the_reference(toy_csv: Path) -> None:
    env = StepDVFSEnv(f"replay:{toy_csv}", "table")
    obs, info = env.reset(seed=0)
    assert obs["last"].tolist() == [1.0, 1.0] and info["source"] == "replayed"
    obs, reward, *_ = env.step(uniform(env, ClockPair(2000, 7000)))
    assert reward == pytest.approx(0.0, abs=0.02) and obs["last"].tolist() == pytest.approx(
        [1.0, 1.0], abs=0.02
    )
    with pytest.raises(KdvfsError, match="outside MultiDiscrete"):
        env.step(np.array([0, 9]))
    with pytest.raises(KdvfsError, match="not in the grid"):
        uniform(env, ClockPair(1000, 7000))
