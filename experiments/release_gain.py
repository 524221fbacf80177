"""What releasing the clocks at the step's last site gains, against holding the step's pair, by
how long the job waits for its host after each step.

A pair held through the job's waits idles at itself; released (stock requested at the step's
last site), the card idles at its own lowest clock, but runs the rest of that segment and the
next step's first switch latency at stock. The balance depends on the wait. This evaluates both
schedules noiselessly in the step (tuner/oracle.py's InStep, the wait charged after every step as
a share of its kernels' time, the card idle at the clocks in effect), for each wait share:

    python -m kdvfs.experiments.release_gain --device sim:h200 --workload gpt3-xl --pair 1380,3201

Map, top to bottom:
  Args      every knob, one line each, with its unit
  gain      per wait share: the held pair's and the released schedule's saving against stock
            (both waiting alike), and the difference, in points of the step's energy
  main      prints JSON
The step tuner forms a releasing wait group where the job waits at least RELEASE_MIN_WAIT_SHARE
of its busy step at stock (tuner/step_tuner.py). [simulated, no prior, noiseless]
"""

from __future__ import annotations

import dataclasses

from kdvfs.experiments._json_main import json_main, parse_floats
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.types import ClockPair, KdvfsError
from kdvfs.tuner.oracle import InStep
from kdvfs.tuner.run import job_sites


@dataclasses.dataclass
class Args:
    device: str = "sim:h200"  # a simulated card (sim:PRESET)
    workload: str = "gpt3-xl"  # a workload name
    pair: str = "1380,3201"  # the step's pair held: core MHz, memory MHz
    wait_shares: str = (
        "0,0.05,0.1,0.15,0.2,0.3,0.5"  # the job's mean wait per step, shares of the step's time
    )
    budget: float = 0.01  # allowed slowdown, a fraction (the in-step truth's; no plan is held to it here)


def parse_non_negative(text: str, name: str) -> list[float]:
    """Comma-separated finite numbers of 0 or more (option --NAME)."""
    values = parse_floats(text, name, "comma-separated numbers")
    if any(not (v >= 0.0) or v == float("inf") for v in values):
        raise KdvfsError(f"--{name} must be finite numbers of 0 or more, got {text!r}")
    return values


def gain(args: Args) -> dict:
    if not args.device.startswith("sim:"):
        raise KdvfsError(f"--device must be a simulated card (sim:PRESET), got {args.device!r}")
    values = parse_non_negative(args.pair, "pair")
    if len(values) != 2:
        raise KdvfsError(f"--pair must be two clocks, core MHz and memory MHz, got {args.pair!r}")
    core_mhz, mem_mhz = values
    card = open_device(args.device, noise=0.0)
    pair = ClockPair(int(core_mhz), int(mem_mhz))
    if pair not in card.grid.pairs:
        raise KdvfsError(f"--pair {args.pair} is not a supported pair of {args.device}")
    steps = open_workload(args.workload, card)
    last_site = job_sites(steps, card.switch_latency_s)[-1]  # the tuner's wait site
    held = Schedule(((0, pair),))
    released = Schedule(((0, pair), (last_site, None)))
    rows = []
    for share in parse_non_negative(args.wait_shares, "wait-shares"):
        truth = InStep(card, steps, args.budget, wait_rel=share)
        held_saving = truth.figures(*truth.schedule(held))[0]
        released_saving, released_slowdown = truth.figures(*truth.schedule(released))[:2]
        rows.append(
            {
                "wait_share": share,
                "held_saving": held_saving,
                "released_saving": released_saving,
                "released_slowdown": released_slowdown,
                "gain_points": 100.0 * (released_saving - held_saving),
            }
        )
    return {
        "what": "releasing the clocks at the step's last site against holding the step's pair, by the job's wait",
        "source": "simulated",
        "prior": "none (noiseless in-step figures)",
        "yardstick": "stock in the step, waiting alike (tuner/oracle.py InStep)",
        "device": args.device,
        "workload": args.workload,
        "pair": pair.as_list(),
        "last_site": last_site,
        "switch_latency_s": card.switch_latency_s,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    json_main(Args, argv, "release_gain", __doc__, gain)


if __name__ == "__main__":
    main()
