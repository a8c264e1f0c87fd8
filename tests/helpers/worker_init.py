"""The first process of a test worker's own machine: `unshare --net --pid
--fork --mount-proc python worker_init.py PYTHON ARGS...` (tests/conftest.py
starts every pytest-xdist worker so).

In its namespaces the worker has its own loopback (the lab's and the demo's
fixed addresses and ports are its own) and its own process table (`/proc`
shows only what this worker started, so a monitor test sees no other
worker's engines). This process is their PID 1: it brings the loopback up,
starts the worker, passes on the signals it is sent (a terminal's Ctrl-C
reaches the whole process group anyway; `unshare --kill-child` SIGKILLs
this process when xdist kills the worker), reaps what is orphaned (daemons
the stand-ins start) so nothing lingers as a zombie, and exits with the
worker's status, which ends every process left in the namespace with it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers.netns import loopback_up  # noqa: E402


def main(argv: list[str]) -> int:
    loopback_up()
    os.environ["SPARKTOP_TEST_ISOLATED"] = "1"
    worker = os.fork()
    if worker == 0:
        os.execv(argv[0], argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, lambda signum, _frame: os.kill(worker, signum))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == worker:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code  # killed by signal N: 128+N, as a shell says


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
