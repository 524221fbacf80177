"""Shared clock decisions across torch.distributed ranks (gloo, two processes on the CPU)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from kdvfs.runtime.distributed import nvml_index, shared_decision
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.types import ClockPair, KdvfsError


def proposal(rank: int) -> Schedule:
    """Each rank proposes its own schedule."""
    return Schedule(((0, ClockPair(1980 - 15 * rank, 3201)), (7 + rank, None)))


def _rank(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        shared = shared_decision(proposal(rank))
        # a group whose first rank is not the world's first: ranks (1,) alone
        solo = dist.new_group([1])
        alone = shared_decision(proposal(rank), solo) if rank == 1 else None
        Path(out_dir, f"rank{rank}.txt").write_text(f"{shared!r}\n{alone!r}\n")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_share_the_first_ranks_decision(tmp_path):
    mp.spawn(_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    answers = [(tmp_path / f"rank{r}.txt").read_text().splitlines() for r in range(2)]
    assert proposal(0) != proposal(1)
    assert answers[0][0] == answers[1][0] == repr(proposal(0))
    assert answers[1][1] == repr(proposal(1))  # the group's own first rank decides


def test_without_a_process_group_the_decision_is_kept():
    assert not dist.is_initialized()
    assert shared_decision(proposal(3)) == proposal(3)


def test_nvml_index_needs_cuda(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(KdvfsError, match="needs a CUDA device"):
        nvml_index()
