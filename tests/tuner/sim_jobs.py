"""A simulated training job tuned as `kdvfs tune` tunes it, for tests: the preset's card (seeded),
the job's switch sites (job_sites), no prior, and stretches of steps simulated at once
(TuneSession's aggregate_steps)."""

from __future__ import annotations

from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.tuner.run import NO_PRIOR, job_sites
from kdvfs.tuner.session import TuneSession


def job_session(preset: str, workload: str, seed: int = 0, **session_args) -> TuneSession:
    """The session, not yet run. `preset`: a simulated card (sim:PRESET); `workload`: a
    workload name; `session_args`: TuneSession's other arguments (budget, dry_run, job_noise)."""
    device = open_device(f"sim:{preset}", seed=seed)
    steps = open_workload(workload, device)
    return TuneSession(
        device,
        steps,
        seed=seed,
        prior=NO_PRIOR,
        sites=job_sites(steps, device.switch_latency_s),
        aggregate_steps=True,
        **session_args,
    )
