"""Cross-kernel transfer: later tasks of a known kind need fewer measurements, still find
near-optimal configs, a task of an unseen kind is tuned by BO, and a kind's prediction pools
what its members measured."""

import dataclasses

import numpy as np

from kdvfs.policies.crosskernel import CrossKernelStrategy
from tests.policies.synthetic import KINDS, run, table, task_for
from tests.policies.test_botorch import WIDE, jittered_kinds, regret


def tune_all(policy: CrossKernelStrategy, seed: int, per_kind: int, features: bool):
    kinds = jittered_kinds(seed=seed, per_kind=per_kind)
    counts, regrets, modes = [], [], []
    for i in np.random.default_rng(seed).permutation(len(kinds)):
        key, kind = kinds[i]
        time_s, energy_j = table(kind, WIDE)
        task = task_for(key, kind, WIDE, budget=0.05)
        if not features:
            task = dataclasses.replace(task, features=())
        counts.append(len(run(policy, task, time_s, energy_j, noise=0.003, seed=int(i))))
        regrets.append(regret(policy, task, time_s, energy_j, time_noise=0.003))
        modes.append(policy.mode(task))
    return counts, regrets, modes


def test_later_tasks_need_fewer_measurements_than_the_first():
    policy = CrossKernelStrategy(WIDE, seed=0)
    counts, regrets, modes = tune_all(policy, seed=1, per_kind=8, features=True)
    assert modes[0] == "bo" and modes[-8:].count("transfer") >= 7
    assert np.mean(counts[-8:]) <= min(counts[0] - 2, 3.0), counts
    assert np.mean(regrets[-8:]) < 0.025, regrets  # boundary configs flip under noise
    assert len(policy.kinds) == modes.count("bo")  # every BO task founded a kind


def test_without_features_the_measurements_decide_the_kind():
    """A task without features starts in the largest kind; its measurements move it to the
    kind that explains them, or to BO: transfer still saves measurements."""
    policy = CrossKernelStrategy(WIDE, seed=0)
    counts, regrets, modes = tune_all(policy, seed=2, per_kind=5, features=False)
    transfer = [c for c, m in zip(counts, modes) if m == "transfer"]
    bo = [c for c, m in zip(counts, modes) if m == "bo"]
    assert len(transfer) >= 8 and len(policy.kinds) == len(bo) <= 4
    assert np.mean(transfer) < np.mean(bo) - 2.0, (counts, modes)
    assert np.mean(regrets) < 0.01, regrets


def test_a_task_of_an_unseen_kind_is_tuned_by_bo():
    policy = CrossKernelStrategy(WIDE, seed=0)
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


def test_a_kind_pools_its_members_measurements():
    """What members measured at a config the founder never tried moves the kind's prediction
    there for the next member (here: 10 % more energy than the founder's curves say), and its
    uncertainty shrinks."""
    policy = CrossKernelStrategy(WIDE, seed=0)
    time_s, energy_j = table(KINDS["gemm"], WIDE)
    founder = task_for("g0", KINDS["gemm"], WIDE, budget=0.05)
    run(policy, founder, time_s, energy_j)
    untried = int(np.flatnonzero(~policy.log(founder).measured & (time_s < 1.2 * founder.ref_time_s))[0])
    newcomer = task_for("g9", KINDS["gemm"], WIDE, budget=0.05)
    policy.ask(newcomer)  # joins the kind
    before = policy.kind_model(0, newcomer)
    seen = before.log_e[untried] + np.log(1.1)
    for i in range(1, 4):
        member = task_for(f"g{i}", KINDS["gemm"], WIDE, budget=0.05)
        policy.ask(member)
        policy.tell(member, untried, float(time_s[untried]), float(np.exp(seen) * member.ref_energy_j))
    after = policy.kind_model(0, newcomer)
    assert after.log_e[untried] - before.log_e[untried] > 0.5 * np.log(1.1)
    assert after.cov_e[untried, untried] < 0.5 * before.cov_e[untried, untried]
