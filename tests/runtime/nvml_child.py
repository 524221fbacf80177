"""Test helper run as a subprocess: lock clocks on the fake NVML card, then exit or sleep.

Usage: nvml_child.py LEASE_DIR exit|sleep, with KDVFS_NVML_MODULE=fake_pynvml and
KDVFS_FAKE_NVML_CALLS set. Prints "locked" once the clocks are locked, so the test knows
when to send its signal.
"""

import sys
import time

from kdvfs.runtime import nvml_device
from kdvfs.runtime.types import ClockPair


def main() -> None:
    lease_dir, mode = sys.argv[1], sys.argv[2]
    nvml_device.admin_privilege = lambda: (True, "test child")  # the fake card needs no root
    dev = nvml_device.NvmlDevice(0, lease_dir=lease_dir)
    dev.set_clocks(ClockPair(1410, 3201))
    print("locked", flush=True)
    if mode == "sleep":
        time.sleep(60)


if __name__ == "__main__":
    main()
