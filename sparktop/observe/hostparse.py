"""Pure parsers for what a node prints: /proc/meminfo, /proc/stat,
`nvidia-smi` (CSV queries and the default table), `docker ps --format
'{{json .}}'`, and `free`.

GB10 quirks handled here: memory fields are `[N/A]`, `N/A` or "Not
Supported"; CSV values may carry units (`96 %`) unless `nounits` was given;
process names in the table can be truncated with a leading `...`.
"""

from __future__ import annotations

import json
import re

from sparktop.observe.snapshot import Container, Gpu, GpuProcess, Memory

NA = {"[n/a]", "n/a", "not supported", "[not supported]", "", "[unknown error]", "[insufficient permissions]"}


def na(value: str | None) -> bool:
    return value is None or value.strip().lower() in NA


def number(value: str | None) -> float | None:
    """A number from an nvidia-smi field, with or without units; None for N/A."""
    if value is None or na(value):
        return None
    match = re.match(r"\s*(-?\d+(?:\.\d+)?)", value)
    return float(match.group(1)) if match else None


# -- /proc ----------------------------------------------------------------------


def parse_meminfo(text: str) -> Memory:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            amount = int(parts[0])
        except ValueError:
            continue
        unit = parts[1].lower() if len(parts) > 1 else ""
        values[key.strip()] = amount * 1024 if unit == "kb" else amount
    if "MemTotal" not in values:
        raise ValueError("no MemTotal in meminfo")
    total = values["MemTotal"]
    free = values.get("MemFree", 0)
    # Kernels before 3.14 have no MemAvailable; estimate it as they did.
    available = values.get("MemAvailable", free + values.get("Buffers", 0) + values.get("Cached", 0))
    return Memory(
        total=total, available=available, free=free, buffers=values.get("Buffers", 0),
        cached=values.get("Cached", 0), swap_total=values.get("SwapTotal", 0), swap_free=values.get("SwapFree", 0),
    )


def parse_proc_stat_cpu(text: str) -> tuple[int, int] | None:
    """(busy, total) jiffies from the first `cpu` line of /proc/stat."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = [int(x) for x in line.split()[1:]]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
            total = sum(fields[:8])  # guest time is already counted in user
            return total - idle, total
    return None


def cpu_percent(prev: tuple[int, int] | None, cur: tuple[int, int] | None) -> float | None:
    if prev is None or cur is None:
        return None
    busy, total = cur[0] - prev[0], cur[1] - prev[1]
    if total <= 0 or busy < 0:
        return None
    return 100.0 * busy / total


# -- nvidia-smi -------------------------------------------------------------------

GPU_FIELDS = ("utilization.gpu", "temperature.gpu", "power.draw", "clocks.sm", "pstate")


_HEADER_CELL = re.compile(r"^[a-z][a-z0-9_.]*(\s*\[[^\]]*\])?$")
# What nvidia-smi writes in the header for a field queried by another name.
HEADER_ALIASES = {"clocks.sm": "clocks.current.sm", "clocks.gr": "clocks.current.graphics",
                  "clocks.mem": "clocks.current.memory", "used_memory": "used_gpu_memory"}


def is_header(parts: list[str], fields: list[str]) -> bool:
    """A header row: every cell a field name with an optional `[unit]`
    (`utilization.gpu [%]`, `clocks.current.sm [MHz]`), one of them a field
    that was asked for. No value looks like that: numbers, `[N/A]`, `P0`,
    names with spaces or `::`."""
    names = {f.lower() for f in fields} | {HEADER_ALIASES.get(f, f).lower() for f in fields}
    bare = [re.sub(r"\s*\[[^\]]*\]$", "", p).lower() for p in parts]
    return (all(_HEADER_CELL.match(p.lower()) for p in parts if p) and any(b in names for b in bare)
            and not any(p.lower() in NA for p in parts))


def parse_csv_query(text: str, fields: list[str]) -> list[dict[str, str | None]]:
    """Rows of a `--query-*=... --format=csv[,noheader][,nounits]` answer,
    keyed by the requested field names; N/A values become None. A header
    row is skipped wherever it appears (several answers may be joined)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if is_header(parts, fields):
            continue
        if len(parts) < len(fields):
            continue
        if len(parts) > len(fields):
            # A process name containing commas: keep the extra parts in the name column.
            extra = len(parts) - len(fields)
            idx = fields.index("process_name") if "process_name" in fields else 0
            parts = parts[:idx] + [", ".join(parts[idx:idx + extra + 1])] + parts[idx + extra + 1:]
        rows.append({f: (None if na(v) else v) for f, v in zip(fields, parts, strict=False)})
    return rows


def parse_gpu_query(text: str, fields: tuple[str, ...] = GPU_FIELDS) -> Gpu:
    rows = parse_csv_query(text, list(fields))
    if not rows:
        raise ValueError("nvidia-smi printed no GPU row")
    row = rows[0]
    return Gpu(
        name=row.get("name"),
        util=number(row.get("utilization.gpu")),
        temp=number(row.get("temperature.gpu")),
        power=number(row.get("power.draw")),
        sm_clock=number(row.get("clocks.sm") or row.get("clocks.current.sm")),
        pstate=row.get("pstate"),
    )


def parse_compute_apps(text: str) -> list[GpuProcess]:
    out = []
    for row in parse_csv_query(text, ["pid", "process_name", "used_memory"]):
        pid = number(row["pid"])
        if pid is None:
            continue
        used = number(row["used_memory"])
        out.append(GpuProcess(int(pid), row["process_name"] or "?", int(used) if used is not None else None))
    return out


# -- docker -----------------------------------------------------------------------


def parse_labels(text: str) -> dict[str, str]:
    labels = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            labels[key.strip()] = value
    return labels


def parse_docker_ps(text: str) -> list[Container]:
    """`docker ps --format '{{json .}}'`: one JSON object per line."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        command = row.get("Command", "")
        if command.startswith('"') and command.endswith('"'):
            try:
                command = json.loads(command)
            except ValueError:
                command = command.strip('"')
        state = row.get("State") or ("running" if str(row.get("Status", "")).startswith("Up") else "exited")
        out.append(Container(
            name=row.get("Names", ""), image=row.get("Image", ""), state=state, status=row.get("Status", ""),
            id=row.get("ID", ""), command=command, running_for=row.get("RunningFor", ""),
            labels=parse_labels(row.get("Labels", "") or ""),
        ))
    return out
