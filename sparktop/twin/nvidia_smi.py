"""The twin's `nvidia-smi`, answering as a GB10 does.

GB10 memory is unified: memory fields are `[N/A]` in CSV queries and "Not
Supported" in the table; per-process memory is reported. Utilisation,
power, temperature and clocks follow the engines' busy fraction on this
host. Formats match the captures in reference/captures/. A host's SM clock
cap (`TwinHost.set_clock_cap`) holds the clock under it with no clock event
reason, and the power down with it: a Spark on bad USB-C power delivery.
"""

from __future__ import annotations

import sys
import time

from sparktop.twin import link
from sparktop.twin.host import TwinHost

DRIVER = "580.159.03"
CUDA = "13.0"
NAME = "NVIDIA GB10"
BUS_ID = "0000000F:01:00.0"
# GB10's highest SM clock as nvidia-smi reports it: `clocks.max.graphics` 3003 MHz on a real GB10 (the colonel-otto
# capture, tests/fixtures/nvidia-smi/gb10_csv_name-clocks-temp-power_with-header_colonel-otto.csv, and every row,
# idle, loaded and throttled, of hoesing/spark-gpu-throttle-check's README @ 1e8ccbdf). NVIDIA publishes no GB10
# clock; the graphics and SM clocks are one domain (`nvidia-smi -q` lists the same Max Clocks for both), so
# clocks.max.sm is the same.
MAX_SM_CLOCK = 3003
LOADED_CLOCK = 2405  # MHz under load: "~2400 MHz expected" (parallelArchitect/spark-gpu-throttle-check's README)


def _gpu_values(host: TwinHost) -> dict[str, str]:
    util = host.gpu_util()
    busy = bool(host.processes())
    clock = LOADED_CLOCK if util > 0.05 else (1200 if busy else 208)
    cap = host.config.get("sm_clock_cap")
    # A capped board draws what its clock lets it: the busy part of the power scales with the clock held.
    held = min(1.0, int(cap) / clock) if cap else 1.0
    clock = min(clock, int(cap)) if cap else clock
    power = 4.0 + util * 46.0 * held if busy else 2.0
    temp = 38 + int(util * 30) if busy else 34
    pstate = "P0" if busy else "P8"
    return {
        "name": NAME,
        "utilization.gpu": f"{round(util * 100)}",
        "temperature.gpu": f"{temp}",
        "power.draw": f"{power:.2f}",
        "power.limit": "[N/A]",
        "clocks.sm": f"{clock}",
        "clocks.current.sm": f"{clock}",
        "clocks.max.sm": f"{MAX_SM_CLOCK}",
        "clocks.max.graphics": f"{MAX_SM_CLOCK}",
        "clocks.mem": "[N/A]",
        "pstate": pstate,
        # Idle when nothing runs (the twin never holds its clocks down; a test writes a cap by hand).
        "clocks_event_reasons.active": host.config.get("clocks_event_reasons", "0x0000000000000000")
        if busy else "0x0000000000000001",
        "memory.used": "[N/A]",
        "memory.total": "[N/A]",
        "memory.free": "[N/A]",
        "utilization.memory": "[N/A]",
        "driver_version": DRIVER,
        "compute_cap": "12.1",
        "index": "0",
        "uuid": "GPU-6f1c2d3e-twin-0000-0000-000000000000",
        "pci.bus_id": BUS_ID,
        "fan.speed": "[N/A]",
        "persistence_mode": "Enabled",
    }


UNITS = {
    "utilization.gpu": " %", "temperature.gpu": "", "power.draw": " W", "clocks.sm": " MHz",
    "clocks.current.sm": " MHz", "clocks.max.sm": " MHz", "clocks.max.graphics": " MHz",
}
HEADERS = {
    "utilization.gpu": "utilization.gpu [%]", "power.draw": "power.draw [W]", "clocks.sm": "clocks.current.sm [MHz]",
    "clocks.current.sm": "clocks.current.sm [MHz]", "used_memory": "used_gpu_memory [MiB]",
    "used_gpu_memory": "used_gpu_memory [MiB]", "memory.used": "memory.used [MiB]",
    "memory.total": "memory.total [MiB]", "clocks.max.sm": "clocks.max.sm [MHz]",
    "clocks.max.graphics": "clocks.max.graphics [MHz]",
}


def _format(values: list[tuple[str, str]], fmt: set[str]) -> str:
    parts = []
    for field, value in values:
        if "nounits" not in fmt and not value.startswith("["):
            value += UNITS.get(field, "")
        parts.append(value)
    return ", ".join(parts)


def query_gpu(host: TwinHost, fields: list[str], fmt: set[str]) -> tuple[int, str]:
    values = _gpu_values(host)
    for field in fields:
        if field not in values:
            return 2, f'Field "{field}" is not a valid field to query.\n'
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(HEADERS.get(f, f) if "nounits" not in fmt else f for f in fields))
    lines.append(_format([(f, values[f]) for f in fields], fmt))
    return 0, "\n".join(lines) + "\n"


def query_apps(host: TwinHost, fields: list[str], fmt: set[str]) -> tuple[int, str]:
    known = {"pid", "process_name", "used_memory", "used_gpu_memory", "gpu_uuid", "gpu_name", "name"}
    for field in fields:
        if field not in known:
            return 2, f'Field "{field}" is not a valid field to query.\n'
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(HEADERS.get(f, f) for f in fields))
    for proc in host.processes():
        row = []
        for field in fields:
            if field == "pid":
                row.append(str(proc.pid))
            elif field in ("process_name", "name"):
                row.append(proc.name)
            elif field in ("used_memory", "used_gpu_memory"):
                row.append(f"{proc.used_mib}" + ("" if "nounits" in fmt else " MiB"))
            elif field == "gpu_uuid":
                row.append(_gpu_values(host)["uuid"])
            else:
                row.append(NAME)
        lines.append(", ".join(row))
    return 0, "\n".join(lines) + ("\n" if lines else "")


def table(host: TwinHost) -> str:
    v = _gpu_values(host)
    stamp = time.strftime("%a %b %e %H:%M:%S %Y")
    power = f"{float(v['power.draw']):.0f}W"
    lines = [
        stamp,
        "+-----------------------------------------------------------------------------------------+",
        f"| NVIDIA-SMI {DRIVER}             Driver Version: {DRIVER}     CUDA Version: {CUDA}     |",
        "+-----------------------------------------+------------------------+----------------------+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
        f"|   0  {NAME}                    On  |   {BUS_ID} Off |                  N/A |",
        f"| N/A   {v['temperature.gpu']:>2}C    {v['pstate']}{power:>16} /  N/A  | Not Supported          "
        f"|    {v['utilization.gpu']:>3}%      Default |",
        "|                                         |                        |                  N/A |",
        "+-----------------------------------------+------------------------+----------------------+",
        "",
        "+-----------------------------------------------------------------------------------------+",
        "| Processes:                                                                              |",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|=========================================================================================|",
    ]
    procs = host.processes()
    if not procs:
        lines.append("|  No running processes found                                                             |")
    for p in procs:
        name = p.name if len(p.name) <= 33 else "..." + p.name[-30:]
        lines.append(f"|    0   N/A  N/A  {p.pid:>15}      C   {name:<33}{p.used_mib:>9}MiB |")
    lines.append("+-----------------------------------------------------------------------------------------+")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    host = TwinHost.from_env()
    if host is None:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", file=sys.stderr)
        return 9
    # The monitor runs this every poll: the host's background network traffic (ssh, HTTP) moves with it.
    link.tick(host.home)
    query = apps = None
    fmt: set[str] = set()
    for arg in argv:
        if arg.startswith("--query-gpu="):
            query = [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
        elif arg.startswith("--query-compute-apps="):
            apps = [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
        elif arg.startswith("--format="):
            fmt = {f.strip() for f in arg.split("=", 1)[1].split(",")}
        elif arg in ("-L", "--list-gpus"):
            print(f"GPU 0: {NAME} (UUID: {_gpu_values(host)['uuid']})")
            return 0
    if (query or apps) and "csv" not in fmt:
        print('"--format" must be specified with "--query-*" options', file=sys.stderr)
        return 2
    if query:
        code, out = query_gpu(host, query, fmt)
    elif apps:
        code, out = query_apps(host, apps, fmt)
    else:
        code, out = 0, table(host)
    (sys.stdout if code == 0 else sys.stderr).write(out)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
