"""A data-parallel job under kdvfs.tune (experiments/ddp_tune_check.py): two gloo ranks on the
CPU, launched by torch.distributed.run, each on its own fake NVML card, in dry run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORLD = 2
#: Longest a job may take before the test gives up on it; s.
PATIENCE_S = 150.0
#: A tiny block, the tuner's shortened windows, short loops: s and sizes.
SMALL = [
    "--device", "cpu", "--smoke", "--d-model", "32", "--heads", "2", "--batch", "2", "--seq", "16",
    "--block-steps", "10", "--noise-steps", "50", "--settle-s", "1", "--bare-s", "2",
]  # fmt: skip


def launch(out: Path, seconds: float, *options: str) -> subprocess.Popen:
    env = os.environ | {
        "KDVFS_NVML_MODULE": "fake_pynvml",
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'runtime'}",
        "KDVFS_FAKE_NVML_GPU_COUNT": str(WORLD),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}"]
    command += [
        "-m",
        "kdvfs.experiments.ddp_tune_check",
        "--out",
        str(out),
        "--seconds",
        str(seconds),
        *SMALL,
        *options,
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def lines_until(job: subprocess.Popen, done: Callable[[list[str]], bool]) -> list[str]:
    """The job's output lines up to the first after which done(lines) holds."""
    lines: list[str] = []
    deadline_s = time.monotonic() + PATIENCE_S
    for line in job.stdout:
        lines.append(line)
        if done(lines) or time.monotonic() > deadline_s:
            return lines
    return lines


def in_trial(lines: list[str]) -> bool:
    """Every rank has requested a candidate's clocks."""
    return all("nvmlDeviceSetGpuLockedClocks" in rank_calls(lines, r) for r in range(WORLD))


def rank_calls(lines: list[str], rank: int) -> list[str]:
    """The dry-run NVML calls a rank logged, in order."""
    return [
        m.group(1) for line in lines if (m := re.search(rf"rank {rank}: kdvfs: GPU \d+ dry run: (\w+)", line))
    ]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    job = launch(out, seconds=6.0)
    output, _ = job.communicate(timeout=PATIENCE_S)
    assert job.returncode == 0, output[-3000:]
    return json.loads((out / "ddp_tune_check.json").read_text())


def test_each_rank_opens_its_own_card(finished):
    assert [r["nvml_index"] for r in finished["ranks"]] == [0, 1]
    assert len({r["uuid"] for r in finished["ranks"]}) == WORLD
    assert finished["shared_cards"] is False


def test_pooled_ranks_make_identical_decisions_and_end_at_stock(finished):
    assert finished["identical_decisions"]
    assert finished["stock_at_end_on_every_rank"]
    assert all(r["tuner_error"] is None for r in finished["ranks"])
    assert all(r["phases"][:2] == ["Reference", "Exploring"] for r in finished["ranks"])


def test_no_rank_adopts_a_candidate_in_dry_run(finished):
    """Nothing is applied, so every candidate is stock: the null test on every rank."""
    for rank in finished["ranks"]:
        assert rank["null_test"]["adoptions_beyond_bound"] == []
        assert rank["null_test"]["within_0_3_pct_of_zero"]


def test_the_pooling_figure_compares_one_rank_with_the_ranks_mean(finished):
    pooling = finished["pooling"]
    assert pooling["windows"] >= 3
    assert len(pooling["single_rank_cv"]) == WORLD
    assert (
        pooling["pooled_cv"] <= max(pooling["single_rank_cv"]) + 1e-12
    )  # a mean is never noisier than its worst part


#: Jobs launched at most until one reaches a trial's lock on every rank.
ATTEMPTS = 3


def job_in_trial(tmp_path: Path) -> tuple[subprocess.Popen, list[str]]:
    """A running job whose ranks have all requested a candidate's clocks, and its output so
    far. The strategy's first candidate can be abandoned before any lock (its worst case
    over the guard, or a loaded CPU's step times): then the job settles at stock without a
    lock, and another job is launched."""
    for attempt in range(ATTEMPTS):
        # A budget of 10,000%: the account's slack covers a trial's worst case within a few
        # steps and the guard never abandons it, even when a loaded CPU runs the steps
        # slower than the reference measured. (At the default 1% a loaded CI machine can spend
        # the slack before the first trial starts.)
        job = launch(tmp_path / f"attempt{attempt}", 40.0, "--budget", "100")
        lines = lines_until(job, in_trial)
        if in_trial(lines):
            return job, lines
        job.kill()
        job.communicate()
    progress = [line for line in lines if "kdvfs.tune:" in line]
    pytest.fail(f"no job of {ATTEMPTS} reached a lock on every rank:\n" + "".join(progress[-30:]))


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm-to-the-job", "sigkill-to-one-rank"]
)
def test_every_surviving_rank_records_stock_after_a_signal(tmp_path, signum):
    job, lines = job_in_trial(tmp_path)
    try:
        pids = {
            int(m.group(1)): int(m.group(2))
            for line in lines
            if (m := re.search(r"rank (\d): pid (\d+)", line))
        }
        assert len(pids) == WORLD, "".join(lines[-40:])
        if signum == signal.SIGTERM:
            job.send_signal(signal.SIGTERM)  # torch.distributed.run passes it to every rank
            survivors = [0, 1]
        else:
            try:
                os.kill(pids[1], signal.SIGKILL)
            except ProcessLookupError:
                pytest.fail(
                    "rank 1 ended before it was killed:\n"
                    + "".join(lines[-40:])
                    + job.communicate()[0][-3000:]
                )
            survivors = [0]
        rest, _ = job.communicate(timeout=PATIENCE_S)
    finally:
        job.kill()
    lines += rest.splitlines()
    assert job.returncode != 0
    for rank in survivors:
        calls = rank_calls(lines, rank)
        assert "nvmlDeviceSetGpuLockedClocks" in calls, "".join(lines[-40:])
        assert calls[-1].startswith("nvmlDeviceReset"), calls[-6:]
