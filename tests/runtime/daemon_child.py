"""Test helper run as a subprocess: lock GPU 0 through the clock daemon, then hold or fork.

Usage: daemon_child.py SOCKET hold|fork. `hold` prints "locked" and sleeps with the lease
held. `fork` forks a child that inherits the connection and sleeps, prints "locked CHILD_PID"
and exits at once: the connection stays open, but the lease's holder is dead.
"""

import os
import sys
import time

from kdvfs.runtime.daemon_client import DaemonClient
from kdvfs.runtime.types import ClockPair


def main() -> None:
    socket_path, mode = sys.argv[1], sys.argv[2]
    client = DaemonClient(socket_path)
    client.lock(0, ClockPair(1410, 3201))
    if mode == "hold":
        print("locked", flush=True)
        time.sleep(60)
        return
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(f"locked {child}", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
