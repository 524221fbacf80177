"""Shared test setup."""

import signal

import pytest

from kdvfs.runtime import clock_lease


@pytest.fixture
def sigint_default():
    """SIGINT raises KeyboardInterrupt here and in the children started meanwhile, however the
    test run was started: a non-interactive shell starts a background job with SIGINT ignored,
    and an ignored signal stays ignored across exec (a Python handler does not)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def lease_registry():
    """A fresh registry of clock-lease holds (runtime/clock_lease.py) for the test: the holds
    taken in it and the signal handlers it installs end with the test."""
    handlers = {s: signal.getsignal(s) for s in clock_lease.RESTORE_SIGNALS}
    registry = clock_lease.LeaseRegistry()
    with clock_lease.use_registry(registry):
        yield registry
    registry.close()
    for signum, handler in handlers.items():  # whatever else the test installed, too
        signal.signal(signum, handler)
