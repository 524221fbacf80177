"""Do pooled data-parallel ranks tune sooner? One rank against n pooled ranks.

    python -m kdvfs.experiments.rank_pooling --device sim:rtx3080ti --workload gpt3-xl-layer

For each seed: the job once on one simulated card, once as n data-parallel ranks (runtime/
ranks.py: SimulatedDataParallel, n cards of the preset with independent noise seeds stepped
in lockstep (every step ends with the slowest rank's), rank 0's card the one-rank job's) whose
tuning run pools every rank's report (pool=, StepTiming.for_ranks).
Rank 0's tuner answers for every rank (the ranks' decisions are identical on the same pooled
data: tests/tuner/test_rank_pooling.py checks it with a tuner on each rank). Reported, in
training seconds: when the adopted schedule first reached 95% of the realisable oracle and
stayed (run.reached_after_s), and when it reached the saving the one-rank job of the seed
ends at; the final schedule's noiseless saving and slowdown; the largest cumulative slowdown
of rank 0 against its true stock step. --prior model (the default, as `kdvfs tune`): the
tuner starts from the card's model plan, verified first; none: groups from segment times.
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics

from kdvfs.runtime.ranks import SimulatedDataParallel
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import schedule_figures
from kdvfs.tuner.run import (
    NO_PRIOR,
    ORACLE_SHARE,
    Card,
    Prior,
    TuningRun,
    choose_prior,
    oracle,
    reached_after_s,
)

#: Seeds of a seed's ranks: rank r of seed s runs a card of seed s + RANK_SEED_STRIDE * r.
RANK_SEED_STRIDE = 1000
#: Training before the cumulative slowdown is watched (as experiments/step_tuning.py); s.
SLOWDOWN_FROM_S = 1.0


def run_job(args, seed: int, ranks: int, noiseless, workload, prior: Prior):
    devices = [open_device(args.device, seed=seed + RANK_SEED_STRIDE * r) for r in range(ranks)]
    job = SimulatedDataParallel(devices, workload)
    card = devices[0]
    run = TuningRun(
        Card.of(card),
        workload,
        budget=args.budget,
        strategy=args.strategy,
        seed=seed,
        prior=prior,
        pool=job.pool(0) if ranks > 1 else None,
        start_s=card.now_s(),
    )
    tuner = run.tuner
    stock_s, _ = card.expected_step([(k, None, k.launches) for k in workload.kernels])
    worst = [0.0]

    def watch(reports, _schedules) -> None:
        r = reports[0]
        if r.end_s >= SLOWDOWN_FROM_S:
            worst[0] = max(worst[0], r.end_s / (stock_s * (r.step + 1)) - 1.0)

    job.run([run], seconds=args.seconds, on_step=watch)
    final, slowdown = schedule_figures(noiseless, workload, tuner.incumbent)
    return tuner, {
        "ranks": ranks,
        "final_saving": round(final, 4),
        "final_slowdown": round(slowdown, 4),
        "adoptions": [
            [round(a.end_s, 1), round(schedule_figures(noiseless, workload, a.schedule)[0], 4)]
            for a in tuner.adoptions
        ],
        "phases": tuner.phases,
        "trials": tuner.trials,
        "largest_cumulative_slowdown": round(worst[0], 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="sim:rtx3080ti")
    p.add_argument("--workload", default="gpt3-xl-layer")
    p.add_argument("--ranks", type=int, default=4, help="pooled data-parallel ranks against one")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--seconds", type=float, default=600.0, help="simulated training per job, s")
    p.add_argument("--budget", type=float, default=0.01)
    p.add_argument("--strategy", default="botorch")
    p.add_argument("--prior", choices=("model", "none"), default="model")
    args = p.parse_args()
    noiseless = open_device(args.device, noise=0.0)
    workload = open_workload(args.workload, noiseless)
    oracle_saving = oracle(noiseless, workload, args.budget).energy_saving  # held to the budget in the step
    prior = (
        choose_prior(noiseless, workload, args.budget, store=None, model=noiseless)
        if args.prior == "model"
        else NO_PRIOR
    )

    def saving(schedule) -> float:
        return schedule_figures(noiseless, workload, schedule)[0]

    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        one_tuner, one = run_job(args, seed, 1, noiseless, workload, prior)
        pooled_tuner, pooled = run_job(args, seed, args.ranks, noiseless, workload, prior)
        level = saving(one_tuner.incumbent)  # what the one-rank job ends at
        for tuner, doc in ((one_tuner, one), (pooled_tuner, pooled)):
            oracle_s = reached_after_s(tuner.adoptions, saving, ORACLE_SHARE * oracle_saving)
            level_s = reached_after_s(tuner.adoptions, saving, level) if level > 0 else None
            doc["reached_95pct_oracle_after_s"] = None if oracle_s is None else round(oracle_s, 1)
            doc["reached_one_ranks_final_after_s"] = None if level_s is None else round(level_s, 1)
        rows.append({"seed": seed, "one_rank": one, "pooled": pooled})

    def ratios(key: str) -> list[float | None]:
        return [
            None
            if r["one_rank"][key] is None or r["pooled"][key] is None
            else round(r["pooled"][key] / r["one_rank"][key], 3)
            for r in rows
        ]

    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return round(statistics.median(known), 3) if known else None

    to_oracle, to_level = ratios("reached_95pct_oracle_after_s"), ratios("reached_one_ranks_final_after_s")
    doc = {
        "device": args.device,
        "workload": args.workload,
        "strategy": args.strategy,
        "budget": args.budget,
        "seconds": args.seconds,
        "prior": args.prior,
        "ranks": args.ranks,
        "oracle_saving": round(oracle_saving, 4),
        "seeds": rows,
        "pooled_time_as_share_of_one_rank": {
            "to_95pct_oracle": to_oracle,
            "to_one_ranks_final": to_level,
            "median_to_95pct_oracle": median(to_oracle),
            "median_to_one_ranks_final": median(to_level),
        },
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
