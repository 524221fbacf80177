"""Search strategies against the full sweep: the comparison, top to bottom.

    python -m kdvfs.experiments.compare_strategies --device sim:rtx3080ti --seeds 5 --out results/compare-rtx3080ti

1. Run the full sweep (every clock pair of every kernel) once per seed: the target.
2. Run each strategy once per seed on a fresh device with that seed (tuner/search.py): it
   measures the training reference, then tunes kernel after kernel until the strategy has
   converged, and the plan is solved against the step-level budget.
3. Write the JSON (per strategy, per seed: measurements, exploration seconds, noiseless
   saving and slowdown of the plan, the plan, the convergence curve, tuner CPU time) and a
   convergence plot: plan saving against measurements, the sweep as the target.
Every figure is what the device says it is: simulated, or replayed from recorded data.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kdvfs.tuner.compare import compare_strategies
from kdvfs.tuner.plots import convergence_figure


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="sim:rtx3080ti")
    p.add_argument("--workload", default="gpt3-xl-layer")
    p.add_argument("--strategies", default="random,egreedy,ucb,thompson,botorch,crosskernel")
    p.add_argument("--budget", type=float, default=0.01)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("results/compare"))
    args = p.parse_args()

    doc = compare_strategies(
        args.device, args.workload, args.strategies.split(","), budget=args.budget, seeds=args.seeds
    )

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.json").write_text(json.dumps(doc, indent=2) + "\n")
    fig = convergence_figure(
        doc["strategies"],
        doc["sweep"],
        f"{doc['gpu']}, {doc['workload']}, budget {args.budget:.0%} [{doc['source']}]",
    )
    fig.savefig(args.out / "convergence.png", dpi=120)
    print(
        json.dumps(
            {"sweep": {k: v for k, v in doc["sweep"].items() if k != "runs"}, "summary": doc["summary"]},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
