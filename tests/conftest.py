"""Shared test setup."""

import signal

import pytest


@pytest.fixture
def sigint_default():
    """SIGINT raises KeyboardInterrupt here and in the children started meanwhile, however the
    test run was started: a non-interactive shell starts a background job with SIGINT ignored,
    and an ignored signal stays ignored across exec (a Python handler does not)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
