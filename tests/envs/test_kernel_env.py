"""KernelDVFS-v0: Gymnasium API, episode walk, seeding, vectorisation, reward, invalid pairs."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from kdvfs.envs import kernel_env
from kdvfs.envs.kernel_env import KernelDVFSEnv, observation_features
from kdvfs.envs.reward import compute_waste_reward
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel, Workload
from kdvfs.runtime.workloads import gpt3_xl_layer

DATA = Path(__file__).resolve().parents[2] / "data"
REAL_TABLE = DATA / "dvfs-real" / "gtx1080ti-dvfs-real-Performance-Power.csv"
SMALL = Workload("gpt3-slice", tuple(gpt3_xl_layer().kernel(n) for n in ("ln1_fwd", "qkv_fwd", "gelu_fwd")))
FAST = {"window_s": 0.2, "steps_per_kernel": 2}

# Not a full product: 1000/7000 is missing. The highest pair (the reference) is 2000/7000.
# copy at 1500/7000 saves 20 % for a 0.5 % slowdown; gemm at 1000/5000 runs 2x slower.
TOY_TABLE = """kernel,core_mhz,mem_mhz,time_s,energy_j,arith
gemm,2000,7000,0.002,0.6,40
gemm,1500,7000,0.0026,0.55,40
gemm,2000,5000,0.00205,0.56,40
gemm,1500,5000,0.0027,0.52,40
gemm,1000,5000,0.004,0.7,40
copy,2000,7000,0.001,0.25,0.5
copy,1500,7000,0.001005,0.2,0.5
copy,2000,5000,0.0014,0.22,0.5
copy,1500,5000,0.00141,0.19,0.5
copy,1000,5000,0.00145,0.17,0.5
"""


@pytest.fixture
def toy_csv(tmp_path: Path) -> Path:
    path = tmp_path / "toy.csv"
    path.write_text(TOY_TABLE)
    return path


def make(device: str, workload: str | Workload, **kwargs: object) -> gymnasium.Env:
    return gymnasium.make("kdvfs/KernelDVFS-v0", device=device, workload=workload, **{**FAST, **kwargs})


# --- Gymnasium API ----------------------------------------------------------------------
def test_check_env_on_a_simulated_device() -> None:
    check_env(make("sim:a100", SMALL).unwrapped, skip_render_check=True)


def test_check_env_on_a_synthetic_table(toy_csv: Path) -> None:
    check_env(make(f"replay:{toy_csv}", "table").unwrapped, skip_render_check=True)


def test_check_env_on_the_recorded_gtx1080ti_table() -> None:
    env = make(f"replay:{REAL_TABLE}", "table")
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert info["source"] == "replayed" and obs["features"].shape == (len(env.unwrapped.feature_names),)
    assert env.action_space.nvec.tolist() == [5, 4]


def test_registered_ids_make_with_a_time_limit() -> None:
    env = gymnasium.make("kdvfs/KernelDVFS-v0", device="sim:rtx3080ti", workload="gpt3-xl-layer", budget=0.01)
    assert env.spec is not None and env.spec.max_episode_steps == 1000
    assert isinstance(env.unwrapped, KernelDVFSEnv)
    assert env.action_space.nvec.tolist() == [10, 5]  # the 3080 Ti's search grid
    short = gymnasium.make(
        "kdvfs/KernelDVFS-v0", device="sim:a100", workload=SMALL, max_episode_steps=3, **FAST
    )
    short.reset(seed=0)
    ends = [short.step(short.action_space.sample())[2:4] for _ in range(3)]
    assert ends == [(False, False), (False, False), (False, True)]


def test_importing_the_envs_loads_no_heavy_library() -> None:
    code = (
        "import sys, gymnasium, kdvfs.envs; gymnasium.make('kdvfs/KernelDVFS-v0', device='sim:a100'); "
        "heavy = {'torch', 'botorch', 'mlflow'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_docstring_example_runs() -> None:
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(KernelDVFSEnv, "KernelDVFSEnv", globs={}):
        runner.run(test)
    assert runner.summarize(verbose=False).attempted > 0
    assert runner.summarize(verbose=False).failed == 0


# --- the episode ------------------------------------------------------------------------
def test_episode_walks_the_kernels_measuring_each_reference_once() -> None:
    env = KernelDVFSEnv("sim:a100", SMALL, **FAST)
    obs, info = env.reset(seed=0)
    assert obs["kernel"] == 0 and info["kernel"] == "ln1_fwd" and info["reference_measurements"] == 1
    assert info["device_s"] >= 0.2 and info["source"] == "simulated"
    assert obs["last"].tolist() == [1.0, 1.0, 1.0, 1.0]
    seen, terminated, total_s = [], False, info["device_s"]
    while not terminated:
        obs, _reward, terminated, _truncated, info = env.step(np.array([40, 0]))
        seen.append((info["kernel"], info["reference_measurements"], int(obs["kernel"])))
        total_s += info["device_s"]
    assert seen == [
        ("ln1_fwd", 1, 0),
        ("ln1_fwd", 2, 1),
        ("qkv_fwd", 2, 1),
        ("qkv_fwd", 3, 2),
        ("gelu_fwd", 3, 2),
        ("gelu_fwd", 3, 2),
    ]
    assert info["measurements"] == 6 and info["episode_device_s"] == pytest.approx(total_s)
    assert info["clocks"] == ClockPair(810, 1215)
    assert obs["last"][2] == pytest.approx(810 / 1410)


def test_start_kernel_by_name() -> None:
    env = KernelDVFSEnv("sim:a100", SMALL, **FAST)
    obs, info = env.reset(seed=0, options={"kernel": "qkv_fwd"})
    assert obs["kernel"] == 1 and info["kernel"] == "qkv_fwd"
    with pytest.raises(KdvfsError, match="no kernel 'nope'"):
        env.reset(options={"kernel": "nope"})


def test_features_are_the_union_zero_filled_with_log_flops_and_bytes() -> None:
    workload = Workload("w", (Kernel("a", features=(("x", 2.0),)), Kernel("b", flops=1e6, bytes_moved=1e3)))
    names, matrix = observation_features(workload)
    assert names == ("log10_bytes", "log10_flops", "x")
    assert matrix.tolist() == [[0.0, 0.0, 2.0], [3.0, 6.0, 0.0]]


# --- seeding and vectorisation ----------------------------------------------------------
def _rollout(seed: int, actions: list[list[int]]) -> list[tuple]:
    env = KernelDVFSEnv("sim:a100", SMALL, **FAST)
    obs, _ = env.reset(seed=seed)
    out = [tuple(np.concatenate([obs["last"], obs["temperature_c"]]).tolist())]
    for a in actions:
        obs, reward, *_ = env.step(np.array(a))
        out.append((reward, *np.concatenate([obs["last"], obs["temperature_c"]]).tolist()))
    return out


def test_same_seed_same_episode_different_seed_different() -> None:
    actions = [[80, 0], [50, 0], [60, 0], [70, 0]]
    assert _rollout(7, actions) == _rollout(7, actions)
    assert _rollout(7, actions)[1:] != _rollout(8, actions)[1:]


def test_a_spec_device_is_reopened_per_seed_an_object_is_kept() -> None:
    env = KernelDVFSEnv("sim:a100", SMALL, **FAST)
    env.reset(seed=3)
    opened = env.device
    env.reset()
    assert env.device is opened
    env.reset(seed=3)
    assert env.device is not opened and env.device.now_s() < opened.now_s()
    device = SimulatedDevice("a100", seed=1)
    env = KernelDVFSEnv(device, SMALL, **FAST)
    env.reset(seed=3)
    after_first_s = device.now_s()
    env.reset(seed=3)
    assert env.device is device and device.now_s() > after_first_s
    with pytest.raises(KdvfsError, match="noise applies to a device opened from a spec"):
        KernelDVFSEnv(SimulatedDevice("a100"), SMALL, noise=0.0)
    with pytest.raises(KdvfsError, match="cannot run kernels"):
        KernelDVFSEnv(object(), SMALL)  # type: ignore[arg-type]


def test_make_vec_sync_runs_steps() -> None:
    envs = gymnasium.make_vec(
        "kdvfs/KernelDVFS-v0",
        num_envs=2,
        vectorization_mode="sync",
        device="sim:a100",
        workload=SMALL,
        **FAST,
    )
    obs, info = envs.reset(seed=0)
    assert obs["last"].shape == (2, 4) and info["action_mask"].shape == (2, 81, 1)
    rewards = [envs.step(np.array([[60, 0], [60, 0]]))[1] for _ in range(3)]
    assert np.all(np.isfinite(rewards)) and rewards[0][0] != rewards[0][1]  # seeds 0 and 1
    envs.close()


# --- reward -----------------------------------------------------------------------------
def test_reward_formula() -> None:
    assert compute_waste_reward(1.0, 8.0, 1.0, 10.0, 0.01) == pytest.approx(0.2)
    assert compute_waste_reward(1.01, 8.0, 1.0, 10.0, 0.01) == pytest.approx(0.2)  # at the budget
    assert compute_waste_reward(1.03, 8.0, 1.0, 10.0, 0.01, 0.5) == pytest.approx(0.2 - 0.5 * 2.0)
    with pytest.raises(KdvfsError, match="budget must be positive"):
        compute_waste_reward(1.0, 1.0, 1.0, 1.0, 0.0)


def test_in_budget_saving_pays_and_over_budget_is_penalised(toy_csv: Path) -> None:
    env = KernelDVFSEnv(f"replay:{toy_csv}", "table", budget=0.01, window_s=0.2, steps_per_kernel=1)
    env.reset(seed=0)  # gemm first
    _, reward, _, _, info = env.step(env.action_for(ClockPair(1000, 5000)))
    assert info["kernel"] == "gemm" and info["time_s"] == pytest.approx(0.004)
    measured = (info["time_s"], info["energy_j"], info["ref_time_s"], info["ref_energy_j"])
    assert reward == pytest.approx(compute_waste_reward(*measured, budget=0.01))
    assert reward == pytest.approx((0.6 - 0.7) / 0.6 - 0.99 / 0.01, abs=0.1)
    _, reward, terminated, _, info = env.step(env.action_for(ClockPair(1500, 7000)))
    assert info["kernel"] == "copy" and terminated
    assert reward == pytest.approx(0.2, abs=0.02)


def test_a_simulated_in_budget_saving_gets_a_positive_reward() -> None:
    device = SimulatedDevice("a100", noise=0.0)
    kernel = SMALL.kernel("gelu_fwd")
    ref_t, ref_e = device.expected(kernel, None)
    in_budget = [
        (1 - e / ref_e, p)
        for p in device.grid.pairs
        for t, e in [device.expected(kernel, p)]
        if t <= ref_t * 1.02
    ]
    saving, pair = max(in_budget)
    assert saving > 0.05
    env = KernelDVFSEnv("sim:a100", SMALL, budget=0.05, noise=0.0, **FAST)
    env.reset(seed=0, options={"kernel": "gelu_fwd"})
    _, reward, _, _, info = env.step(env.action_for(pair))
    assert reward > 0.03 and not info["invalid_action"]


# --- invalid pairs ----------------------------------------------------------------------
def test_a_pair_the_grid_lacks_is_refused_unmeasured(toy_csv: Path) -> None:
    env = KernelDVFSEnv(f"replay:{toy_csv}", "table", invalid_reward=-3.0, **FAST)
    obs, info = env.reset(seed=0)
    assert env.core_levels_mhz == (1000, 1500, 2000) and env.mem_levels_mhz == (5000, 7000)
    assert info["action_mask"].tolist() == [[True, False], [True, True], [True, True]]
    assert env.action_masks().tolist() == info["action_mask"].tolist()
    before_s = env.device.now_s()
    obs2, reward, _, _, info = env.step(np.array([0, 1]))
    assert reward == -3.0 and info["invalid_action"] and "time_s" not in info
    assert info["clocks"] == ClockPair(1000, 7000) and info["device_s"] == 0.0
    assert env.device.now_s() == before_s and obs2["last"].tolist() == obs["last"].tolist()
    with pytest.raises(KdvfsError, match="not in the grid"):
        env.action_for(ClockPair(1000, 7000))
    with pytest.raises(KdvfsError, match="outside MultiDiscrete"):
        env.step(np.array([3, 0]))


def test_bad_arguments_are_one_line_errors() -> None:
    with pytest.raises(KdvfsError, match="budget must be positive, got 0"):
        KernelDVFSEnv("sim:a100", SMALL, budget=0.0)
    with pytest.raises(KdvfsError, match="unknown device"):
        KernelDVFSEnv("gpu:0", SMALL)
    assert kernel_env.KernelDVFSEnv.__doc__ and "## Episode End" in kernel_env.KernelDVFSEnv.__doc__
