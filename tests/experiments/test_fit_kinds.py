"""fit_kinds finds its default ladder from the package, and says which option to pass where a
checkout's data/ folder is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdvfs.experiments import fit_kinds
from kdvfs.runtime import tables
from kdvfs.runtime.tables import repo_data_file

REPO = Path(__file__).resolve().parents[2]


def test_the_default_ladder_is_found_from_the_package_whatever_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = repo_data_file("h200/kernels_ladder.csv", "--ladder")
    assert path == REPO / "data" / "h200" / "kernels_ladder.csv"
    by_kind = fit_kinds.rows_by_kind(path)
    assert "gemm" in by_kind and all(rows for rows in by_kind.values())


def test_without_a_checkouts_data_folder_the_default_is_a_one_line_error_naming_the_option(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(tables, "REPO_DATA_DIR", tmp_path / "data")  # as in an installed wheel
    with pytest.raises(SystemExit) as exit_info:
        fit_kinds.main([])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(
        "data/h200/kernels_ladder.csv is not beside this kdvfs (only a source checkout has data/): pass --ladder FILE"
    )


def test_a_ladder_that_cannot_be_read_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        fit_kinds.main(["--ladder", str(tmp_path / "absent.csv")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "absent.csv: cannot read" in error
