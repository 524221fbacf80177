"""The tuner layer's public names: each resolves, and importing the layer (or the CLI) stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import kdvfs.tuner


@pytest.mark.parametrize("name", kdvfs.tuner.__all__)
def test_every_public_name_of_the_tuner_resolves(name):
    assert getattr(kdvfs.tuner, name) is not None


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        kdvfs.tuner.no_such_name  # noqa: B018


def test_importing_the_tuner_and_its_cli_loads_no_numerics_and_no_mlflow():
    code = (
        "import sys, kdvfs.tuner, kdvfs.cli; "
        "print(','.join(m for m in ('numpy', 'scipy', 'torch', 'mlflow') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == ""
