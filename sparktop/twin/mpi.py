"""The twin's `mpirun`, enough for TensorRT-LLM over several nodes:
`mpirun [-np N] [-H a,b | --hostfile F] [-x VAR]... CMD ARGS`. On a real
cluster it starts CMD on every host (over SSH into the other containers);
rank 0 (`trtllm-llmapi-launch`) runs the server and the other ranks serve it
as MPI workers. The twin runs rank 0 here and times the engine over the
tensor-parallel size the server is given (`--tp_size`), so the other nodes
need only be up: what it does not imitate is the workers' own processes.
"""

from __future__ import annotations

import os
import sys

# mpirun options that take a value (Open MPI's), so that the command starts after them.
WITH_VALUE = {"-np", "-n", "-c", "-H", "--host", "-hostfile", "--hostfile", "-x", "--mca", "-mca", "--map-by",
              "--bind-to", "--rank-by", "-N", "--npernode", "--prefix", "-wdir", "--wdir"}


def main(argv: list[str]) -> int:
    i = 0
    env: dict[str, str] = {}
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        if flag == "-x" and i + 1 < len(argv):
            name, sep, value = argv[i + 1].partition("=")
            if sep:
                env[name] = value
        if flag in ("--mca", "-mca"):
            i += 3
            continue
        i += 2 if flag in WITH_VALUE else 1
    command = argv[i:]
    if not command:
        print("mpirun: no executable given", file=sys.stderr)
        return 1
    os.environ.update(env)
    os.environ.setdefault("OMPI_COMM_WORLD_RANK", "0")
    os.execvp(command[0], command)
