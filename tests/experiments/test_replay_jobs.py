"""The H200 job recordings replayed through the tuner of kdvfs.tune (experiments/replay_jobs.py):
on the real noise of a job recorded under kdvfs.tune, a dry run decides trials and adopts
nothing."""

from __future__ import annotations

import pytest

from kdvfs.experiments import replay_jobs


@pytest.mark.parametrize("job", ["hf_tuned", "sync_tuned"])
def test_a_recorded_job_replayed_as_a_dry_run_completes_five_trials_in_five_minutes_and_adopts_nothing(job):
    row = replay_jobs.replay(job, replay_jobs.Args(seconds=300.0))
    assert row["source"] == "replayed" and row["prior"] == "none"
    assert row["adopted"] == 0  # the clocks never changed: any adoption is a false one
    assert row["trials_completed"] >= 5
    assert all(t["energy_se"] > 0 and t["time_se"] > 0 for t in row["trial_se"])
    assert abs(row["run_energy_saving"]) <= 0.01
    assert 1 / 1.5 <= row["noise_ratio"] <= 1.5  # the tuner's noise against the series' own


def test_a_recording_whose_stalls_close_windows_reads_no_saving_in_a_dry_run():
    # the bare sync recording: evaluations and checkpoints inside single steps, taken for
    # stalls (their spans out of the windows' energy, their steps out of the count, also
    # where a stall holds a window's first or last reading)
    row = replay_jobs.replay("sync", replay_jobs.Args(seconds=300.0))
    assert row["adopted"] == 0
    assert abs(row["run_energy_saving"]) <= 0.003


def test_a_recording_that_is_not_there_is_refused_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        replay_jobs.main(["--jobs", "nosuchjob"])
    assert exit_info.value.code != 0
    assert "no recording 'nosuchjob'" in capsys.readouterr().err


def test_a_recording_of_another_card_replays_from_its_folder_on_that_cards_grid():
    folder = replay_jobs.JOBS_DIR.parent.parent / "h100" / "jobs"
    row = replay_jobs.replay("sync_tuned_20261206c", replay_jobs.Args(seconds=120.0, recordings=str(folder)))
    assert row["source"] == "replayed" and row["adopted"] == 0
    rec = replay_jobs.load("sync_tuned_20261206c", folder)
    assert "H100" in rec.gpu_name and replay_jobs.grid_device(rec) == "sim:h100"


def test_a_recordings_folder_that_is_not_there_is_refused_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        replay_jobs.main(["--recordings", "no/such/folder"])
    assert exit_info.value.code != 0
    assert "no folder 'no/such/folder'" in capsys.readouterr().err
