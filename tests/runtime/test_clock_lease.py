"""The process's registry of clock releases (runtime/clock_lease.py LeaseRegistry): run at
exit or on SIGINT/SIGTERM unless let go, before the signal's own behaviour."""

from __future__ import annotations

import logging
import os
import signal

from kdvfs.runtime import clock_lease


def test_release_all_runs_the_holds_not_let_go_once_and_logs_a_failing_one(lease_registry, caplog):
    released = []

    def broken() -> None:
        raise OSError("the card is gone")

    clock_lease.hold("a", lambda: released.append("a"))
    clock_lease.hold("b", lambda: released.append("b"))
    clock_lease.hold("c", broken)
    clock_lease.let_go("b")
    assert lease_registry.held == 2
    with caplog.at_level(logging.WARNING, logger="kdvfs.runtime.clock_lease"):
        clock_lease.release_all()
    clock_lease.release_all()
    assert released == ["a"] and lease_registry.held == 0
    assert "could not restore stock clocks: the card is gone" in caplog.text


def test_a_signal_releases_the_holds_then_goes_on_to_the_previous_handler(lease_registry):
    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(("previous", signum)))
    lease_registry.hold("gpu0", lambda: seen.append(("released", "gpu0")))
    os.kill(os.getpid(), signal.SIGTERM)
    assert seen == [("released", "gpu0"), ("previous", signal.SIGTERM)]
    assert lease_registry.held == 0


def test_a_closed_registry_gives_back_the_signal_handlers_it_replaced(lease_registry):
    def previous(signum, frame) -> None:
        pass

    signal.signal(signal.SIGTERM, previous)
    registry = clock_lease.LeaseRegistry()
    registry.hold("gpu0", lambda: None)
    assert signal.getsignal(signal.SIGTERM) != previous  # its handler in place
    registry.close()
    assert signal.getsignal(signal.SIGTERM) == previous
    assert registry.held == 0


def test_the_module_functions_use_the_registry_in_use_and_the_previous_one_after(lease_registry):
    inner = clock_lease.LeaseRegistry()
    try:
        with clock_lease.use_registry(inner):
            clock_lease.hold("gpu0", lambda: None)
            assert clock_lease.default_registry() is inner
        clock_lease.hold("gpu1", lambda: None)
        assert clock_lease.default_registry() is lease_registry
        assert (inner.held, lease_registry.held) == (1, 1)
    finally:
        inner.close()
