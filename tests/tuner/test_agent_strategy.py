"""`kdvfs compare --strategies ppo`: a saved agent is loaded or refused in one line before any work."""

from __future__ import annotations

from kdvfs.cli import main


def test_a_missing_agent_file_is_refused_in_one_line_before_any_work(tmp_path, capsys) -> None:
    code = main(
        [
            "compare",
            "--strategies",
            "ppo",
            "--agent",
            str(tmp_path / "none.zip"),
            "--no-mlflow",
            "--seeds",
            "1",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "none.zip: no such file" in err[0]


def test_a_file_that_is_not_an_agent_is_refused_in_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "agent.zip"
    path.write_text("not a model")
    code = main(["compare", "--strategies", "ppo", "--agent", str(path), "--no-mlflow", "--seeds", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not a saved MaskablePPO model" in err[0]
