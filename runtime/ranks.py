"""Data-parallel ranks pooled: each rank's step report is a sample of the same schedule.

Data-parallel ranks run the same schedule in lockstep, each on its own card, so each rank's
window energy per step is an independent sample: n ranks give n samples a window. Their step
times are not: every step's gradient all-reduce waits for the slowest rank, so the ranks'
steps end together and their time is one sample (runtime/trials.py's Trial counts it once). The step tuner (tuner/step_tuner.py, `pool=`) gathers every rank's report of each
step and every rank decides on the same pooled figures, so the decisions are identical.

- `RankPool`: the Protocol: `ranks`, `gather(report) -> every rank's report of this step`
  (in rank order; a collective: every rank calls it each step). `PoolLost`: a pool that can
  no longer gather (the service gone); the tuner then goes on alone.
- `SimulatedDataParallel`: a simulated job of n ranks (n simulated cards with independent
  noise seeds, one workload), stepped in lockstep in this process: each step ends on every
  rank when the slowest rank's kernels end, the others idling meanwhile (at the all-reduce,
  counted in their step's last group); its `pool(rank)` is each
  rank's RankPool. For the benchmark (experiments/rank_pooling.py) and the tests.
- Elsewhere: `TorchRankPool` (runtime/distributed.py, torch.distributed's all_gather_object)
  and `ServiceRankPool` (service/client.py, through `kdvfs serve`).

Design and figures: docs/service.md ("Ranks pooled").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import SimulatedJob, StepController, StepReport
from kdvfs.runtime.types import KdvfsError, Workload


class PoolLost(Exception):
    """The pool cannot gather this step's reports (its channel is gone): this rank tunes alone
    from now on."""


class RankPool(Protocol):
    """Every data-parallel rank's report of one step."""

    ranks: int

    def gather(self, report: StepReport) -> list[StepReport]:
        """This rank's report in, every rank's report of the same step out (in rank order)."""
        ...


class _PublishedPool:
    """One rank's view of the reports SimulatedDataParallel published for the step."""

    def __init__(self, job: SimulatedDataParallel, rank: int) -> None:
        self.job, self.rank, self.ranks = job, rank, job.ranks

    def gather(self, report: StepReport) -> list[StepReport]:
        reports = self.job.published
        if reports is None or reports[self.rank] is not report:
            raise KdvfsError(f"rank {self.rank} gathered a report that is not this step's")
        return list(reports)


class SimulatedDataParallel:
    """n data-parallel ranks on simulated cards, stepped in lockstep in this process.

    Args:
        devices: one card per rank (the same preset, independent noise seeds).
        workload: the kernels of one training step (every rank's).
        dry_run: record the clock requests but apply none (SimulatedJob's).
    """

    def __init__(self, devices: Sequence[ModelDevice], workload: Workload, *, dry_run: bool = False) -> None:
        if not devices:
            raise KdvfsError("a data-parallel job needs at least one rank")
        self.jobs = [SimulatedJob(d, workload, dry_run=dry_run) for d in devices]
        self.ranks = len(self.jobs)
        self.published: list[StepReport] | None = None

    def pool(self, rank: int) -> RankPool:
        """Rank `rank`'s RankPool (for its StepTuner's pool=)."""
        return _PublishedPool(self, rank)

    @property
    def seconds(self) -> float:
        """Training seconds so far (rank 0's card)."""
        return self.jobs[0].seconds

    def step(self, schedules: Sequence[Schedule]) -> list[StepReport]:
        """One step on every rank, each under its schedule, ending together: a rank whose
        kernels end before the slowest's idles until then. Every rank's report (published for
        the ranks' pools)."""
        ran = [job.run_kernels(s) for job, s in zip(self.jobs, schedules, strict=True)]
        slowest_s = max(r.step_s for r in ran)
        self.published = [job.end_step(r, slowest_s - r.step_s) for job, r in zip(self.jobs, ran)]
        return self.published

    def run(
        self,
        controllers: Sequence[StepController],
        *,
        seconds: float,
        on_step: Callable[[list[StepReport], list[Schedule]], None] | None = None,
    ) -> None:
        """Train for `seconds` (rank 0's card). One controller per rank, each answering its
        rank's report (a pooled tuner gathers the others'); or one controller only, rank 0's,
        whose answer every rank runs (the ranks' decisions are identical: a benchmark saves
        the other ranks' CPU so). on_step sees each step's reports and the answers. The clocks
        go back to stock when it ends."""
        if len(controllers) not in (1, self.ranks):
            raise KdvfsError(
                f"{len(controllers)} controllers for {self.ranks} ranks: give one, or one a rank"
            )
        if not seconds > 0.0:
            raise KdvfsError(f"seconds of training must be > 0, got {seconds}")
        end_s = self.seconds + seconds
        schedules = [Schedule.stock()] * self.ranks
        try:
            while self.seconds < end_s:
                reports = self.step(schedules)
                answers = [c.on_step_end(r) for c, r in zip(controllers, reports)]
                schedules = answers * self.ranks if len(answers) == 1 else answers
                if on_step is not None:
                    on_step(reports, schedules)
        finally:
            for job in self.jobs:
                job.reset()
