"""Benchmark: the history file's size, its queries' speed, and what the
writer costs per poll.

Thirty (or `--days`) days of a twin cluster — two GB10 nodes, an engine on
each, a daily load curve, a restart, a night of low memory, a KV spike —
go through the real `NoticeDetector`, `ClusterState` and `HistoryWriter`
into a real SQLite file, time compressed (`--step` seconds between polls:
the rows are one per minute whatever the poll interval). Then, on that
file, each question `sparktop history` and the history screen ask over
the last 7 days is timed (median of `--repeat`), and ten more days are
written to show that retention holds the file at its size.

    python tests/benchmarks/history_store.py                 # 30 days, 2 nodes, 2 engines
    python tests/benchmarks/history_store.py --days 30 --step 5

The writer's own CPU per poll (observe + its share of the minute's
commit, measured with process time around the writer only) is printed as
% of a core at one poll a second of two nodes and two engines; the whole
monitor with and without history, side by side, is
`python tests/benchmarks/monitor_cost.py --history-ab`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sparktop.history.query import HistoryReader  # noqa: E402
from sparktop.history.store import HistoryStore  # noqa: E402
from sparktop.history.writer import HistoryWriter  # noqa: E402
from tests.helpers.history_sim import NODES, Scenario, run, url  # noqa: E402

DAY = 86400.0


def size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if not p.name.endswith(".lock")) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--step", type=float, default=10.0, help="seconds between simulated polls")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.sqlite"
        writer = HistoryWriter(HistoryStore.open(path), retention_days=30.0)
        spent = [0.0]
        polls = [0]

        def sink(event, state):
            t0 = time.process_time()
            writer.observe(event, state)
            spent[0] += time.process_time() - t0
            polls[0] += 1

        end = time.time()
        start = end - args.days * DAY
        sc = Scenario(start=start, days=args.days, step=args.step, restart_at=start + 3 * DAY,
                      memory_low=(end - 4 * DAY, end - 4 * DAY + 7200),
                      kv_spike=(end - 2 * DAY, end - 2 * DAY + 600))
        wall = time.perf_counter()
        run(sc, sink)
        writer.store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wall = time.perf_counter() - wall
        written = size_mb(path)
        per_poll_ms = 1000 * spent[0] / max(1, polls[0])
        # One poll a second of 2 nodes + 2 engines: 4 snapshots a second (notices are rare).
        print(f"{args.days:g} days of 2 nodes + 2 engines, a poll every {args.step:g} s simulated "
              f"({polls[0]:,} events in {wall:.1f} s)")
        print(f"  file: {written:.1f} MB ({writer.rows_written:,} minute rows)")
        print(f"  writer: {1000 * per_poll_ms:.1f} µs per event -> {100 * 4 * per_poll_ms / 1000:.3f} % of a core "
              "at 1 s polls of 2 nodes + 2 engines")
        writer.close()

        with HistoryStore.open(path, write=False) as store:
            reader = HistoryReader(store)
            since = end - 7 * DAY
            questions = {
                "sessions": lambda: reader.sessions(since, end),
                "daily totals": lambda: reader.daily(since, end, None, 0.3),
                "peaks": lambda: reader.peaks(since, end),
                "events": lambda: reader.events(since, end),
                "charts (4 figures x 4 subjects, 30 min steps)": lambda: [
                    reader.series(kind, key, fig, since, end, 30)
                    for kind, keys, figs in (("engine", (url(0), url(1)), ("gen_tps", "kv")),
                                             ("node", NODES, ("mem_used", "power_w")))
                    for key in keys for fig in figs],
            }
            total = []
            for name, ask in questions.items():
                times = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    ask()
                    times.append(1000 * (time.perf_counter() - t0))
                total.append(statistics.median(times))
                print(f"  7-day {name}: median {statistics.median(times):.1f} ms")
            print(f"  7-day `sparktop history` questions together: {sum(total[:4]):.1f} ms; with the charts "
                  f"{sum(total):.1f} ms")

        # Ten more days: retention (30 days) holds the file where it was.
        writer = HistoryWriter(HistoryStore.open(path), retention_days=30.0)
        run(Scenario(start=end, days=10.0, step=args.step * 3), writer.observe)
        writer.store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        writer.close()
        with HistoryStore.open(path, write=False) as store:
            first = store.db.execute("SELECT MIN(minute) FROM node_minutes").fetchone()[0] * 60
        print(f"  after 10 more days: {size_mb(path):.1f} MB, oldest row {(end + 10 * DAY - first) / DAY:.1f} days "
              "old (retention 30 days)")


if __name__ == "__main__":
    main()
