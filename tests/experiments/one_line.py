"""The bad-input check of an experiment's main (experiments/_json_main.py): exit 2 and one line
on stderr."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def one_line_error(main: Callable[[list[str]], None], argv: list[str], capsys) -> str:
    """Run main(argv), which must exit 2 with exactly one line on stderr; that line."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and err.endswith("\n")
    return err.strip()
