"""Cross-kernel transfer: later tasks of a known kind need fewer measurements, still find
near-optimal configs, and a task of an unseen kind is tuned by BO."""

import dataclasses

import numpy as np

from kdvfs.policies.crosskernel import CrossKernelPolicy
from tests.policies.synthetic import run, table, task_for
from tests.policies.test_botorch import WIDE, jittered_kinds, regret


def tune_all(policy: CrossKernelPolicy, seed: int, per_kind: int, features: bool):
    kinds = jittered_kinds(seed=seed, per_kind=per_kind)
    counts, regrets, modes = [], [], []
    for i in np.random.default_rng(seed).permutation(len(kinds)):
        key, kind = kinds[i]
        time_s, energy_j = table(kind, WIDE)
        task = task_for(key, kind, WIDE, budget=0.05)
        if not features:
            task = dataclasses.replace(task, features=())
        counts.append(len(run(policy, task, time_s, energy_j, noise=0.003, seed=int(i))))
        regrets.append(regret(policy, task, time_s, energy_j))
        modes.append(policy.mode(task))
    return counts, regrets, modes


def test_later_tasks_need_fewer_measurements_than_the_first():
    policy = CrossKernelPolicy(WIDE, seed=0)
    counts, regrets, modes = tune_all(policy, seed=1, per_kind=8, features=True)
    assert modes[0] == "bo" and modes[-8:].count("transfer") >= 6
    assert np.mean(counts[-8:]) <= min(counts[0] - 2, 2.5), counts
    assert np.mean(regrets[-8:]) < 0.025, regrets  # boundary configs flip under noise
    assert len(policy.library) == modes.count("bo")


def test_without_features_the_first_measurements_decide_similarity():
    """Probes first; transfer still saves measurements, though less than with features."""
    policy = CrossKernelPolicy(WIDE, seed=0, probes=3)
    counts, regrets, modes = tune_all(policy, seed=2, per_kind=5, features=False)
    transfer = [c for c, m in zip(counts, modes) if m == "transfer"]
    bo = [c for c, m in zip(counts, modes) if m == "bo"]
    assert len(transfer) >= 5 and min(transfer) == 3  # two probes (reference given) + one pick
    assert np.mean(transfer) < np.mean(bo) - 0.5, (counts, modes)
    assert np.mean(regrets) < 0.01, regrets


def test_a_task_of_an_unseen_kind_is_tuned_by_bo():
    policy = CrossKernelPolicy(WIDE, seed=0)
    kinds = dict(jittered_kinds(seed=2, per_kind=2))
    for key in ("gemm0", "gemm1", "norm0", "norm1"):
        time_s, energy_j = table(kinds[key], WIDE)
        run(policy, task_for(key, kinds[key], WIDE, budget=0.05), time_s, energy_j)
    assert policy.mode(task_for("gemm1", kinds["gemm1"], WIDE, 0.05)) == "transfer"
    time_s, energy_j = table(kinds["mixed0"], WIDE)
    task = task_for("mixed0", kinds["mixed0"], WIDE, budget=0.05)
    run(policy, task, time_s, energy_j)
    assert policy.mode(task) == "bo"
    assert regret(policy, task, time_s, energy_j) < 0.01
