"""The learning agent against BoTorch and the bandits, in `kdvfs compare`'s table.

    python -m kdvfs.experiments.agent_strategy --device sim:rtx3080ti --seeds 5

The agent (MaskablePPO, policies/agent.py) is trained once through kdvfs/TrialDVFS-v0 on
a card of its own seed (tuner/compare.py: train_agent_on, --agent-steps trials), then searches
each seed's kernels as the other strategies do: isolated replay, the plan solved and verified,
evaluated noiselessly against the full sweep. Printed (JSON): each strategy's median saving,
share of the sweep's, measurements; every seed's slowdown and whether it is within the budget;
the agent's training cost; and the agent's saving and measurements against BoTorch's.
Figures of record: docs/benchmarks.md ("A learning agent as a strategy").
"""

from __future__ import annotations

import argparse
import json

from kdvfs.tuner.compare import AGENT_STEPS, compare_strategies

STRATEGIES = ["ppo", "botorch", "ucb", "thompson"]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="sim:rtx3080ti")
parser.add_argument("--workload", default="gpt3-xl-layer")
parser.add_argument("--seeds", type=int, default=5)
parser.add_argument("--budget", type=float, default=0.01)
parser.add_argument("--agent-steps", type=int, default=AGENT_STEPS)


def main() -> None:
    args = parser.parse_args()
    doc = compare_strategies(
        args.device,
        args.workload,
        STRATEGIES,
        budget=args.budget,
        seeds=args.seeds,
        agent_steps=args.agent_steps,
    )
    summary = doc["summary"]
    out = {
        "device": args.device,
        "workload": doc["workload"],
        "source": doc["source"],
        "budget": args.budget,
        "seeds": args.seeds,
        "sweep": {
            "energy_saving": doc["sweep"]["energy_saving"],
            "measurements": doc["sweep"]["measurements"],
        },
        "agent_training": doc["agent"],
        "strategies": {
            name: {
                "energy_saving": round(s["energy_saving"], 4),
                "share_of_sweep_saving": round(s["share_of_sweep_saving"], 3),
                "measurements": s["measurements"],
                "slowdowns": [round(r["slowdown"], 4) for r in doc["strategies"][name]],
                "within_budget_every_seed": all(
                    r["slowdown"] <= args.budget for r in doc["strategies"][name]
                ),
            }
            for name, s in summary.items()
        },
        "ppo_minus_botorch": {
            "energy_saving_points": round(
                100 * (summary["ppo"]["energy_saving"] - summary["botorch"]["energy_saving"]), 2
            ),
            "measurements": summary["ppo"]["measurements"] - summary["botorch"]["measurements"],
        },
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
