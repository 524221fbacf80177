"""Clock decisions under torch.distributed.

Data-parallel ranks each tune their own GPU: every rank runs its own KdvfsTrainer on the
NvmlDevice of its CUDA device (nvml_index() maps one to the other). Ranks that must run in
step, a tensor-parallel group whose collectives wait for the slowest member, share one
decision: shared_decision() gives every rank of the group the value its first rank
proposed, so no member runs a slower schedule than the others. Data-parallel ranks may
instead pool their readings: TorchRankPool is runtime/ranks.py's RankPool over the process
group (each rank's step report, all_gather_object each step), for a TuningRun's pool (tuner/run.py).
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.distributed as dist

from kdvfs.runtime.nvml_device import list_gpu_uuids
from kdvfs.runtime.steps import StepReport
from kdvfs.runtime.types import KdvfsError

T = TypeVar("T")


def shared_decision(decision: T, group: dist.ProcessGroup | None = None) -> T:
    """The decision of the group's first rank, on every rank of the group (a collective:
    every rank of the group must call it). Any picklable value: a Schedule, a ClockPair, a
    plan. Outside an initialised process group it is the decision itself."""
    if not (dist.is_available() and dist.is_initialized()):
        return decision
    source = dist.get_global_rank(group, 0) if group is not None else 0
    box = [decision]
    dist.broadcast_object_list(box, src=source, group=group)
    return box[0]


class TorchRankPool:
    """Every data-parallel rank's step report through torch.distributed (a RankPool): one
    all_gather_object a step, so every rank of the group must gather each step. Under DDP,
    give it a group of its own (`dist.new_group(backend="gloo")`): kdvfs.tune gathers on its
    controller thread while DDP's collectives run on the training thread, and one group's
    collectives must come in the same order on every rank.

    Args:
        group: the data-parallel process group (None: the default group).
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise KdvfsError("TorchRankPool needs an initialised torch.distributed process group")
        self.group = group
        self.ranks = dist.get_world_size(group)

    def gather(self, report: StepReport) -> list[StepReport]:
        reports: list[StepReport | None] = [None] * self.ranks
        dist.all_gather_object(reports, report, group=self.group)
        return reports


def nvml_index(cuda_device: int | None = None) -> int:
    """NVML's index of a CUDA device (default: the current one). They differ when
    CUDA_VISIBLE_DEVICES reorders or hides GPUs; the GPU's UUID ties them."""
    if not torch.cuda.is_available():
        raise KdvfsError("nvml_index needs a CUDA device (torch.cuda.is_available() is False)")
    index = torch.cuda.current_device() if cuda_device is None else cuda_device
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    uuids = [u.removeprefix("GPU-") for u in list_gpu_uuids()]
    if uuid not in uuids:
        raise KdvfsError(f"CUDA device {index} (uuid {uuid}) is not among the GPUs NVML sees ({len(uuids)})")
    return uuids.index(uuid)
