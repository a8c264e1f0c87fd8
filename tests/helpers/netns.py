"""Each test worker on a loopback of its own.

The lab's hosts, the demo's nodes and the engines they launch listen on
fixed addresses and ports (127.0.0.2:8000, a router on :4000, Ray on :6379),
as two Sparks do. Two pytest-xdist workers running such tests at once would
take each other's ports. So each worker moves into a network namespace of
its own as it starts (`unshare(CLONE_NEWNET)`, then its loopback is brought
up): its own 127.0.0.0/8, its own ports, nothing to rename in any test. A
new namespace has no route out: what the tests install from PyPI is made by
the controller beforehand (tests/helpers/prepare.py).

Where util-linux's `unshare` is there, a worker gets a process table of its
own too (`isolated_python`, tests/helpers/worker_init.py): a test that reads
`/proc` (the monitor's scan for engines started outside Docker) sees only its
own worker's engines. Without it, the worker moves only its network
(`enter_own_network`) and other workers' engines show in the process table,
unreachable.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def enter_own_network() -> str | None:
    """Move this process (its calling thread, and every process and thread
    it starts from now on) into a new network namespace with loopback up.
    None when done; else why not (not root, a kernel without namespaces)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return os.strerror(ctypes.get_errno())
    loopback_up()
    return None


def loopback_up() -> None:
    """`ip link set lo up`, without needing iproute2: a new namespace's loopback starts down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def isolated_python() -> list[str] | None:
    """The command that starts a Python as the first process of a machine
    of its own (network, process table), or None where this one cannot
    (no util-linux `unshare`, not root)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    # --kill-child: when xdist kills a worker (it kills this `unshare`), its PID 1 gets SIGKILL, and with it
    # everything the worker started; without it the namespace would outlive the run.
    argv = [unshare, "--net", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable,
            str(Path(__file__).with_name("worker_init.py")), sys.executable]
    probe = subprocess.run([*argv, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return argv if probe.returncode == 0 and probe.stdout.strip() == "2" else None


def can_unshare() -> bool:
    """Whether a child process could enter its own namespace (asked of a
    throwaway child, so this process stays where it is)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if enter_own_network() is None else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0
