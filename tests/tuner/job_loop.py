"""A CPU training loop that kdvfs.tune tunes on the fake NVML card, for the tests and their child.

The card (tests/runtime/fake_pynvml.py) draws less power at lower locked clocks and its counter
advances every COUNTER_PERIOD_S; the loop is the tiny MLP's training step paced to STEP_S
(catch-up pacing: a step that overran is made up by the next ones, so a window's mean step time
stays the pace on a busy machine); the tuner's windows are shortened to fit a test
(FAST_TIMING). Run as a script, it tunes for good and prints "trial" once a candidate's clocks
are locked on the card (the SIGTERM test's child).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import torch

from kdvfs.runtime import nvml_device
from kdvfs.tuner.step_tuner import Exploring, StepTiming

#: Pace of one training step, s.
STEP_S = 0.015
#: The fake counter's update period, s.
COUNTER_PERIOD_S = 0.01
#: Pause between two counter reads, s (fewer wake-ups on a busy machine).
POLL_S = 0.004
#: Training before the tuner is fed, s (the first steps under kdvfs stall on a busy machine).
WARMUP_S = 0.3
#: The tuner's measuring lengths, shortened to a test's seconds.
FAST_TIMING = StepTiming(
    reference_s=0.45,
    trial_window_s=0.09,
    trial_blocks=2,
    trial_max_blocks=2,
    reference_max_s=0.45,
    verify_window_s=0.18,
    verify_blocks=3,
    verify_max_blocks=4,
    max_trials_per_group=2,
    watch_window_s=0.04,
)
#: The tests' slowdown budget: a shared CPU slows steps by tens of percent at times, and no
#: candidate may be abandoned for that (the budget arithmetic: test_step_tuner.py); a fraction.
BUDGET = 1.0


def card_power_mw(gpu: tuple[int, int] | None, mem: tuple[int, int] | None) -> int:
    """The fake card's power at its locked clocks: 100 W at stock (as at 1980/3201 MHz), half
    that at the lower memory clock (far beyond a shared CPU's timing noise)."""
    core_mhz = 1980 if gpu is None else gpu[0]
    mem_mhz = 3201 if mem is None else mem[0]
    return int(1000 * max(10.0, 0.045 * core_mhz + 0.05 * mem_mhz - 149.15))


def configure_card(fake, **changes) -> object:
    """A fresh fake card with the clock-dependent power and the fast counter."""
    return fake.configure(power_at=card_power_mw, energy_period_s=COUNTER_PERIOD_S, **changes)


def warmed(step: Callable[[], None], steps: int = 20) -> Callable[[], None]:
    """The step after a few unpaced runs (first-step work: AdamW's state, autograd's caches)."""
    torch.set_num_threads(1)  # a 2-core machine shared with others: threads only contend
    for _ in range(steps):
        step()
    return step


def paced(step: Callable[[], None], period_s: float = STEP_S) -> Callable[[], None]:
    """The step, each call ending on the next multiple of period_s after the first call
    (so make it once the tuning is open: a pause before would be caught up at once)."""
    deadline = [0.0]

    def run() -> None:
        step()
        deadline[0] = (deadline[0] or time.monotonic()) + period_s
        time.sleep(max(0.0, deadline[0] - time.monotonic()))

    return run


def in_trial(tuning) -> bool:
    """Whether a candidate's clocks are locked now: a trial's B window is open."""
    phase = tuning.tuner.phase
    trial = getattr(phase, "trial", None)
    return (
        isinstance(phase, Exploring) and trial is not None and trial.arm == "B" and trial.current is not None
    )


def main() -> None:
    """The SIGTERM test's child: argv: lease dir, out dir."""
    import fake_pynvml

    from kdvfs.tuner.job_tuning import tune
    from tests.runtime.test_torch_discovery import tiny_mlp

    lease_dir, out_dir = sys.argv[1], sys.argv[2]
    nvml_device.admin_privilege = lambda: (True, "the fake card needs no root")
    configure_card(fake_pynvml, calls_file=os.environ[fake_pynvml.CALLS_ENV])
    model, optimizer, step = tiny_mlp()
    step = warmed(step)
    device = nvml_device.NvmlDevice(0, lease_dir=lease_dir)
    told = False
    with tune(
        model,
        optimizer,
        budget=BUDGET,
        strategy="ucb",
        device=device,
        dry_run=False,
        out_dir=out_dir,
        plan_store=False,
        track=False,
        timing=FAST_TIMING,
        poll_s=POLL_S,
        warmup_s=WARMUP_S,
    ) as tuning:
        step = paced(step)
        while True:
            with tuning.step():
                step()
            if not told and in_trial(tuning) and fake_pynvml.STATE.locked_gpu_mhz:
                print("trial", flush=True)
                told = True


if __name__ == "__main__":
    main()
