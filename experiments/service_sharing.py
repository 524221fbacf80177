"""Does sharing through the service pay? Two jobs of one workload, one after the other.

    python -m kdvfs.experiments.service_sharing --device sim:rtx3080ti --workload gpt3-xl-layer

Starts a real `kdvfs serve` on loopback (SQLite in a temporary folder) and runs, on the
simulated card, job 1 (seed s) and then job 2 (seed s + 100) of the same workload through
it: each a TuneSession (the tuner of `kdvfs tune`) whose strategy is the service's
(ServiceStrategy), so job 2 asks the model job 1 fed. --second-prior fleet: job 2 also starts
from the plan job 1 stored in the service (run.choose_prior through the service's plan
store: verified first, over PROVEN_VERIFY_BLOCKS blocks, then refined). For each job: when
its adopted schedule first reached (and kept) 95% of the realisable oracle's saving
(run.reached_after_s), when it first reached job 1's final saving, its final saving,
and how its asks were answered. A control runs job 2's seed alone (its own strategy, no
service). The client's timeout is raised (--timeout-s): on this loaded 2-core machine a
BoTorch ask in the service can take over the default 1 s, and the question here is what
sharing buys, not the fallback. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import uuid
from pathlib import Path

from kdvfs.experiments.service_load import Service, _free_port
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import schedule_figures
from kdvfs.service.client import ServiceClient, ServicePlanStore, service_strategy, store_plan
from kdvfs.tuner.report import tune_report
from kdvfs.tuner.run import NO_PRIOR, ORACLE_SHARE, Prior, choose_prior, oracle, reached_after_s
from kdvfs.tuner.session import TuneSession


def run_job(
    args, seed: int, oracle_saving: float, prior: Prior, url: str | None, token: str, job: str, target
):
    """One job through the service (url None: alone); its figures, and its session."""
    device = open_device(args.device, seed=seed)
    workload = open_workload(args.workload, device)
    policy = None
    if url is not None:
        client = ServiceClient(url, token, timeout_s=args.timeout_s)
        policy = service_strategy(
            client,
            job=job,
            gpu_name=device.name,
            pairs=device.grid.pairs,
            workload=workload,
            budget=args.budget,
            strategy=args.strategy,
            seed=seed,
        )
    session = TuneSession(
        device,
        workload,
        strategy=policy if policy is not None else args.strategy,
        budget=args.budget,
        seed=seed,
        prior=prior,
    )
    session.run_until(args.seconds)
    if policy is not None:
        policy.end()
    tuner = session.tuner
    savings = [(a.end_s, schedule_figures(device, workload, a.schedule)[0]) for a in tuner.adoptions]

    def first_kept(level: float | None):
        if level is None:
            return None
        reached = reached_after_s(tuner.adoptions, lambda x: schedule_figures(device, workload, x)[0], level)
        return None if reached is None else round(reached, 1)

    final = schedule_figures(device, workload, tuner.incumbent)[0]
    return session, {
        "final_saving_exact": final,
        "job": job,
        "seed": seed,
        "prior": prior.source,
        "reached_95pct_oracle_after_s": first_kept(ORACLE_SHARE * oracle_saving),
        "reached_first_jobs_final_after_s": first_kept(target),
        "final_saving": round(final, 4),
        "adoptions": [[round(t, 1), round(s, 4)] for t, s in savings],
        "phases": tuner.phases,
        "answers": None if policy is None else policy.answers,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="sim:rtx3080ti")
    p.add_argument("--workload", default="gpt3-xl-layer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seconds", type=float, default=600.0, help="simulated training per job, s")
    p.add_argument("--budget", type=float, default=0.01)
    p.add_argument("--strategy", default="botorch")
    p.add_argument("--prior", choices=("model", "none"), default="model")
    p.add_argument("--timeout-s", type=float, default=60.0, help="the client's timeout per call, s")
    p.add_argument(
        "--second-prior",
        choices=("same", "fleet"),
        default="same",
        help="job 2 starts from --prior as job 1 did (same), or from the plan job 1 stored in the "
        "service (fleet: run.choose_prior through the service's plan store, verified first)",
    )
    args = p.parse_args()
    noiseless = open_device(args.device, noise=0.0)
    workload = open_workload(args.workload, noiseless)
    oracle_saving = oracle(noiseless, workload, args.budget).energy_saving  # held to the budget in the step
    prior = (
        choose_prior(noiseless, workload, args.budget, store=None, model=noiseless)
        if args.prior == "model"
        else NO_PRIOR
    )
    folder = Path(tempfile.mkdtemp(prefix="kdvfs-sharing-"))
    token = f"sharing-{uuid.uuid4().hex}"
    (folder / "tokens").write_text(f"{token} sharing experiment\n")
    service = Service(folder, _free_port(), folder / "tokens")
    service.start()
    try:
        session, first = run_job(args, args.seed, oracle_saving, prior, service.url, token, "job-1", None)
        target = first.pop("final_saving_exact")
        second_prior = prior
        if args.second_prior == "fleet":
            client = ServiceClient(service.url, token, timeout_s=args.timeout_s)
            first["plan_stored_version"] = store_plan(
                client, tune_report(session, None, args.strategy).plan(args.strategy)
            )
            card = open_device(args.device, seed=args.seed + 100)
            second_prior = choose_prior(
                card, workload, args.budget, store=ServicePlanStore(client), model=None
            )
        _, second = run_job(
            args, args.seed + 100, oracle_saving, second_prior, service.url, token, "job-2", target
        )
    finally:
        service.stop()
        shutil.rmtree(folder, ignore_errors=True)
    _, alone = run_job(args, args.seed + 100, oracle_saving, prior, None, token, "job-2-alone", target)
    for job in (second, alone):
        job.pop("final_saving_exact")
    first["reached_first_jobs_final_after_s"] = first["adoptions"][-1][0] if first["adoptions"] else None

    def share(a, b):
        return None if a is None or b is None else round(a / b, 3)

    doc = {
        "device": args.device,
        "workload": args.workload,
        "strategy": args.strategy,
        "seconds": args.seconds,
        "budget": args.budget,
        "prior": args.prior,
        "second_prior": args.second_prior,
        "oracle_saving": round(oracle_saving, 4),
        "jobs": [first, second, alone],
        "second_job_time_as_share_of_first": {
            "to_95pct_oracle": share(
                second["reached_95pct_oracle_after_s"], first["reached_95pct_oracle_after_s"]
            ),
            "to_first_jobs_final": share(
                second["reached_first_jobs_final_after_s"], first["reached_first_jobs_final_after_s"]
            ),
        },
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
