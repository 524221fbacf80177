"""Data-parallel ranks pooled in the step tuner: n ranks' windows are n energy samples and one
step-time sample (the ranks wait for one another), the pooled tuner measures shorter, and
every rank decides the same (in one process, and across real
gloo processes through torch.distributed)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kdvfs.runtime.distributed import TorchRankPool
from kdvfs.runtime.ranks import SimulatedDataParallel
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.runtime.trials import Trial, open_window
from kdvfs.runtime.types import KdvfsError
from kdvfs.tuner.run import Card, Prior, TuningRun
from kdvfs.tuner.step_priors import model_schedule
from kdvfs.tuner.step_tuner import StepTiming, StepTuner
from tests.tuner.conftest import free_port

BUDGET = 0.01
SPEC = "sim:rtx3080ti"


def cards(ranks: int, seed: int = 0):
    return [open_device(SPEC, seed=seed + 1000 * r) for r in range(ranks)]


def tuner_for(card, workload, pool=None, *, strategy="botorch", prior=None) -> StepTuner:
    run = TuningRun(
        Card.of(card),
        workload,
        budget=BUDGET,
        strategy=strategy,
        seed=7,
        prior=Prior(prior, "model") if prior is not None else Prior(None, "none"),
        pool=pool,
    )
    return run.tuner


def window_energies(ranks: int, windows: int = 30) -> list[float]:
    """Energy per step of consecutive 1-s stock windows over `ranks` cards."""
    devices = cards(ranks, seed=11)
    workload = open_workload("gpt3-xl-layer", devices[0])
    job = SimulatedDataParallel(devices, workload)
    stock = [Schedule.stock()] * ranks
    energies = []
    while len(energies) < windows:
        reports = job.step(stock)
        now = reports[0].end_s if ranks == 1 else [r.end_s for r in reports]
        window = open_window(Schedule.stock(), 1.0, 0.0, now)
        while not window.add(reports[0] if ranks == 1 else reports):
            reports = job.step(stock)
        energies.append(window.energy_per_step_j)
    return energies


def test_four_pooled_ranks_measure_a_window_about_half_as_noisy_as_one():
    one, four = np.std(window_energies(1), ddof=1), np.std(window_energies(4), ddof=1)
    assert four < 0.75 * one  # 1/sqrt(4) expected; 30 windows each


def test_data_parallel_ranks_end_every_step_together_the_faster_rank_idling():
    devices = cards(2)
    workload = open_workload("gpt3-xl-layer", devices[0])
    job = SimulatedDataParallel(devices, workload)
    low = devices[0].grid.pairs[0]  # the lowest pair: rank 0's kernels run slower
    for _ in range(5):
        slow, fast = job.step([Schedule(((0, low),)), Schedule.stock()])
        assert slow.step_time_s == fast.step_time_s and slow.end_s == pytest.approx(fast.end_s)
        assert sum(fast.group_times_s) == pytest.approx(fast.step_time_s)
    kernels_s = job.jobs[1].run_kernels(Schedule.stock()).step_s
    assert fast.step_time_s > 1.2 * kernels_s  # the stock rank waited at the all-reduce


def test_a_pooled_trial_counts_the_ranks_shared_step_time_once():
    # four lockstep ranks, stock against stock: their step times are one measurement, so the
    # pooled trial's time error is rank 0's own, not half of it (four copies taken as samples)
    devices = cards(4, seed=5)
    workload = open_workload("gpt3-xl-layer", devices[0])
    job = SimulatedDataParallel(devices, workload)
    trial = Trial(Schedule.stock(), Schedule.stock(), blocks=8, window_s=0.5, settle_s=0.0)
    reports = job.step([Schedule.stock()] * 4)
    while not trial.done:
        if trial.current is None:
            trial.open([r.end_s for r in reports])
        reports = job.step([trial.schedule()] * 4)
        trial.add(reports)
    rank0 = []
    for k in range(trial.blocks):
        a1, b1, b2, a2 = (w.rank_steps_s[0] for w in trial.closed[4 * k : 4 * k + 4])
        rank0.append((b1 + b2) / (a1 + a2) - 1.0)
    rank0_se = np.std(rank0, ddof=1) / np.sqrt(len(rank0))
    assert trial.outcome().time_se == pytest.approx(rank0_se, rel=0.05)


def test_pooled_timing_measures_a_trial_over_a_quarter_of_one_ranks_training():
    one, four = StepTiming.for_ranks(1), StepTiming.for_ranks(4)
    assert one == StepTiming()
    assert four.trial_blocks * four.trial_window_s == pytest.approx(one.trial_blocks * one.trial_window_s / 4)
    assert four.verify_blocks * four.verify_window_s == pytest.approx(
        one.verify_blocks * one.verify_window_s / 4
    )
    assert four.trial_blocks >= 2 and four.reference_s == pytest.approx(one.reference_s / 4)
    # the step time does not pool: an undecided verification may run as long as one rank's
    assert four.verify_max_blocks * four.verify_window_s == pytest.approx(
        one.verify_max_blocks * one.verify_window_s
    )


def test_a_tuner_on_each_in_process_rank_decides_the_same_schedule_every_step():
    devices = cards(3)
    workload = open_workload("gpt3-xl-layer", devices[0])
    job = SimulatedDataParallel(devices, workload)
    tuners = [tuner_for(d, workload, job.pool(r), strategy="ucb") for r, d in enumerate(devices)]
    differing = []

    def compare(_reports, schedules) -> None:
        if any(s != schedules[0] for s in schedules):
            differing.append(schedules)

    job.run(tuners, seconds=90.0, on_step=compare)
    assert differing == []
    assert tuners[0].trials >= 3  # it explored
    assert [a.schedule for a in tuners[1].adoptions] == [a.schedule for a in tuners[0].adoptions]


def test_four_pooled_ranks_adopt_the_verified_prior_in_under_half_one_ranks_training():
    noiseless = open_device(SPEC, noise=0.0)
    workload = open_workload("gpt3-xl-layer", noiseless)
    prior = model_schedule(noiseless, workload, BUDGET)
    adopted_s = {}
    for ranks in (1, 4):
        devices = cards(ranks, seed=3)
        job = SimulatedDataParallel(devices, workload)
        tuner = tuner_for(devices[0], workload, job.pool(0) if ranks > 1 else None, prior=prior)
        job.run([tuner], seconds=120.0)
        assert tuner.adoptions, f"{ranks} ranks adopted nothing"
        assert tuner.account.slowdown() <= BUDGET
        adopted_s[ranks] = tuner.adoptions[0].end_s
    assert adopted_s[4] <= 0.5 * adopted_s[1]


def test_a_rank_gathering_a_report_of_another_step_is_refused():
    devices = cards(2)
    workload = open_workload("gpt3-xl-layer", devices[0])
    job = SimulatedDataParallel(devices, workload)
    stale = job.step([Schedule.stock()] * 2)
    job.step([Schedule.stock()] * 2)
    with pytest.raises(KdvfsError, match="not this step's"):
        job.pool(1).gather(stale[1])


# --- torch.distributed (gloo processes on the CPU) ----------------------------------------------
STEPS = 900  # about 60 s of training of the layer


def _rank(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        card = open_device(SPEC, seed=1000 * rank)  # each rank its own card and noise
        workload = open_workload("gpt3-xl-layer", card)
        tuner = tuner_for(card, workload, TorchRankPool())
        job = SimulatedJob(card, workload)
        schedule, answers = Schedule.stock(), []
        for _ in range(STEPS):  # a fixed count: every rank gathers every step
            schedule = tuner.on_step_end(job.step(schedule))
            answers.append(repr(schedule))
        lines = [f"trials {tuner.trials}", f"energy {card.true_energy_j()!r}", *answers]
        Path(out_dir, f"rank{rank}.txt").write_text("\n".join(lines))
    finally:
        dist.destroy_process_group()


def test_gloo_ranks_pooling_through_torch_distributed_decide_the_same_schedule_every_step(tmp_path):
    world = 3
    mp.spawn(_rank, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
    out = [(tmp_path / f"rank{r}.txt").read_text().splitlines() for r in range(world)]
    assert out[0][0] == out[1][0] == out[2][0] and int(out[0][0].split()[1]) >= 2  # explored alike
    assert len({o[1] for o in out}) == world  # each rank measured its own card
    assert out[0][2:] == out[1][2:] == out[2][2:]
    assert len(set(out[0][2:])) >= 3  # the schedule changed: trials ran


def test_a_torch_rank_pool_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(KdvfsError, match="process group"):
        TorchRankPool()


# --- through the service (a real `kdvfs serve` on loopback) --------------------------------------
def _service_rank(
    url: str, rank: int, ranks: int, steps: int, kill_at: int | None, service, out: dict
) -> None:
    from kdvfs.service.client import ServiceClient, ServiceRankPool, service_strategy

    card = open_device(SPEC, seed=1000 * rank)
    workload = open_workload("gpt3-xl-layer", card)
    policy = service_strategy(
        ServiceClient(url),
        job="pooled-job",
        gpu_name=card.name,
        pairs=card.grid.pairs,
        workload=workload,
        budget=BUDGET,
        strategy="ucb",
        seed=7,
        ranks=ranks,
        rank=rank,
    )
    tuner = tuner_for(card, workload, ServiceRankPool(policy), strategy=policy)
    job = SimulatedJob(card, workload)
    schedule, answers = Schedule.stock(), []
    for step in range(steps):
        if step == kill_at and rank == 0:
            service.kill()
        schedule = tuner.on_step_end(job.step(schedule))
        answers.append(repr(schedule))
    out[rank] = (answers, tuner)


def run_service_ranks(url: str, ranks: int, steps: int, kill_at: int | None = None, service=None) -> dict:
    import threading

    out: dict = {}
    threads = [
        threading.Thread(target=_service_rank, args=(url, r, ranks, steps, kill_at, service, out))
        for r in range(ranks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out) == list(range(ranks)), "a rank failed"
    return out


def test_ranks_pooling_through_the_service_decide_the_same_schedule_every_step(tmp_path):
    from kdvfs.service.client import ServiceClient
    from tests.tuner.service_process import ServiceProcess

    # ranks are threads of one busy test process here: a generous wait, so that a rank the
    # interpreter schedules late is not taken for a lost one
    service = ServiceProcess(tmp_path, f"sqlite:///{tmp_path / 'service.db'}", "--pool-wait-s", "8").start()
    try:
        out = run_service_ranks(service.url, 3, 400)
        session = ServiceClient(service.url).call("GET", f"/v1/sessions/{out[0][1].strategy.session_id}")
    finally:
        service.stop()
    # the ranks tell one pooled figure alike: the fleet's model holds it once, not 3 times
    told = [out[r][1].strategy.told for r in range(3)]
    assert told[0] == told[1] == told[2] >= 1 and session["observations"] == told[0]
    answers = [out[r][0] for r in range(3)]
    assert answers[0] == answers[1] == answers[2]
    assert len(set(answers[0])) >= 3  # trials ran
    lost = [out[r][1].pool_lost for r in range(3)]
    assert lost == [None, None, None], lost
    assert out[0][1].strategy.answers["service"] >= 1


def test_ranks_whose_service_dies_mid_run_go_on_alone_from_a_new_reference(tmp_path):
    from tests.tuner.service_process import ServiceProcess

    service = ServiceProcess(tmp_path, f"sqlite:///{tmp_path / 'service.db'}").start()
    try:
        out = run_service_ranks(
            service.url, 2, 1200, kill_at=600, service=service
        )  # after the first reference
    finally:
        service.stop()
    for r in range(2):
        tuner = out[r][1]
        assert tuner.pool is None and tuner.pool_lost
        assert [a.reasons for a in tuner.alarms] == [("pool",)]
        assert tuner.timing == StepTiming()  # one rank's lengths from then on
        # a lost pool says nothing of the card: the new reference starts after RETUNE_MIN_S,
        # without waiting for the temperature of a card still warming to flatten
        assert tuner.retunes == 1
        assert tuner.phases[tuner.phases.index("Retuning") :][:2] == ["Retuning", "Reference"]
        assert tuner.account.slack_s() > 0.0  # the budget kept through it


class _SlowAsks(BaseHTTPRequestHandler):
    """A service whose every ask takes 1 s (a BoTorch fit on a loaded host), answering 7; the
    paths posted to it in `posted`."""

    posted: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.posted.append(self.path)
        if self.path == "/v1/sessions":
            body = {"session_id": "s1", "model_key": "k", "observations": 0, "joined": False}
        else:
            time.sleep(1.0)
            body = {"config": 7, "shared": False}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client stopped waiting
            self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def slow_service():
    """A _SlowAsks server on loopback: its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowAsks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _slow_strategy(url: str, card, workload):
    """A rank's ServiceStrategy on the slow service, whose client waits 0.3 s a call."""
    from kdvfs.service.client import ServiceClient, service_strategy

    return service_strategy(
        ServiceClient(url, timeout_s=0.3),
        job="slow",
        gpu_name=card.name,
        pairs=card.grid.pairs,
        workload=workload,
        budget=BUDGET,
    )


def test_a_pooled_rank_waits_for_a_slow_services_decision_where_a_lone_one_answers_locally(slow_service):
    # pooled ranks must run the same decision: one that answered from its local strategy
    # while the others got the service's would run another schedule
    from kdvfs.policies.base import Task
    from kdvfs.service.client import ServiceRankPool

    card = open_device(SPEC)
    workload = open_workload("gpt3-xl-layer", card)
    answers = {}
    for pooled in (False, True):
        policy = _slow_strategy(slow_service, card, workload)
        if pooled:
            ServiceRankPool(policy)
        policy.ask(Task("group0", 0.065, 20.0, BUDGET))
        answers[pooled] = dict(policy.answers)
    assert answers[False] == {"service": 0, "local": 1} and answers[True] == {"service": 1, "local": 0}


def test_a_pooled_rank_whose_ask_times_out_decides_alone_and_leaves_the_pool(monkeypatch, slow_service):
    # its local answer may differ from the service's, which the other ranks run: pooling its
    # readings with theirs would mix two schedules' figures
    from kdvfs.policies.base import Task
    from kdvfs.runtime.ranks import PoolLost
    from kdvfs.service import client as service_client
    from kdvfs.service.client import ServiceRankPool

    monkeypatch.setattr(service_client, "POOLED_ASK_TIMEOUT_S", 0.3)  # the service's asks take 1 s
    card = open_device(SPEC)
    workload = open_workload("gpt3-xl-layer", card)
    policy = _slow_strategy(slow_service, card, workload)
    pool = ServiceRankPool(policy)
    policy.ask(Task("group0", 0.065, 20.0, BUDGET))
    report = SimulatedJob(card, workload).step(Schedule.stock())
    _SlowAsks.posted.clear()
    with pytest.raises(PoolLost, match="ask was answered locally"):
        pool.gather(report)
    assert policy.answers == {"service": 0, "local": 1} and not policy.pooled
    assert not any(path.endswith("/pool") for path in _SlowAsks.posted)  # no report pooled


class _LostAt:
    """A pool of two ranks (this card's report twice) that is lost from lost_at_s on."""

    ranks = 2

    def __init__(self, lost_at_s: float) -> None:
        self.lost_at_s = lost_at_s

    def gather(self, report):
        from kdvfs.runtime.ranks import PoolLost

        if report.end_s >= self.lost_at_s:
            raise PoolLost("rank 1 left")
        return [report, report]


def test_a_pool_lost_while_the_card_still_warms_is_measured_again_after_five_seconds_of_stock():
    # a card from cold warms for minutes: an alarm that waited for a flat temperature would
    # hold stock up to RETUNE_SETTLE_MAX_S, but a lost pool says nothing of the card
    from kdvfs.tuner.step_tuner import RETUNE_MIN_S, RETUNE_SETTLE_MAX_S

    card = open_device(SPEC, seed=3)
    workload = open_workload("gpt3-xl-layer", card)
    run = TuningRun(
        Card.of(card), workload, budget=BUDGET, seed=7, prior=Prior(None, "none"), pool=_LostAt(10.0)
    )
    job, schedule = SimulatedJob(card, workload), Schedule.stock()
    while run.seconds < 60.0:
        schedule = run.on_step_end(job.step(schedule))
    phases = [name for _, name in run.phase_log]
    assert phases[:3] == ["Reference", "Retuning", "Reference"], run.phase_log
    (alarm_s, _), (again_s, _) = run.phase_log[1:3]
    assert RETUNE_MIN_S <= again_s - alarm_s < RETUNE_MIN_S + 1.0 < RETUNE_SETTLE_MAX_S
    assert [a.reasons for a in run.tuner.alarms] == [("pool",)]
