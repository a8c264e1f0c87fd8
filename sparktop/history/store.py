"""The history file: one SQLite database under `$XDG_DATA_HOME/sparktop/`.

A row per minute per node and per engine (`node_minutes`, `engine_minutes`),
the serving sessions (`sessions`), the event log (`events`), and the names
the rows refer to (`subjects`: a node's name or an engine's URL, stored once).
The schema carries its version in `meta`; opening a file migrates it to this
sparktop's version in one transaction, or refuses a file a newer sparktop
wrote. WAL mode, so readers never wait for the writer.

One process writes: the writer holds an advisory lock on a file beside the
database (`history.sqlite.lock`); a second sparktop (the app while the
collector runs, or the other way round) opens it read-only and reads what
the first one writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from sparktop.errors import SparktopError
from sparktop.settings import data_dir

FILE_NAME = "history.sqlite"

NODE_FIGURES = (
    "mem_used", "mem_available_min", "mem_total", "gpu_util", "gpu_util_max", "power_w", "power_max_w",
    "temp_c", "temp_max_c", "cpu_pct", "rdma_rx_gbps", "rdma_tx_gbps", "kernel_rx_gbps", "kernel_tx_gbps",
    "link_max_gbps", "energy_j",
)
ENGINE_FIGURES = (
    "kv", "kv_max", "running", "running_max", "waiting", "waiting_max", "gen_tps", "gen_tps_max", "prompt_tps",
    "gen_tokens", "prompt_tokens", "requests", "preemptions", "rejections", "ttft_p50", "ttft_p95", "itl_p50",
    "itl_p95", "e2e_p95", "queue_p95", "energy_j",
)
SESSION_COLUMNS = (
    "id", "subject", "model", "engine", "node", "topology", "started", "last_seen", "ended", "end_reason",
    "gen_tokens", "prompt_tokens", "requests", "energy_j", "peak_kv", "peak_running", "peak_waiting",
    "peak_gen_tps", "engine_started", "gen_counter", "prompt_counter", "requests_counter",
)


def _v1(db: sqlite3.Connection) -> None:
    node = ", ".join(f"{c} REAL" for c in NODE_FIGURES)
    engine = ", ".join(f"{c} REAL" for c in ENGINE_FIGURES)
    _run(db, f"""
        CREATE TABLE subjects (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, key TEXT NOT NULL, UNIQUE (kind, key));
        -- minute: unix seconds // 60 on the data's own clock
        CREATE TABLE node_minutes (subject INTEGER NOT NULL, minute INTEGER NOT NULL, samples INTEGER NOT NULL,
            {node}, PRIMARY KEY (minute, subject)) WITHOUT ROWID;
        CREATE TABLE engine_minutes (subject INTEGER NOT NULL, minute INTEGER NOT NULL, samples INTEGER NOT NULL,
            session INTEGER, {engine}, PRIMARY KEY (minute, subject)) WITHOUT ROWID;
        CREATE TABLE sessions (id INTEGER PRIMARY KEY, subject INTEGER NOT NULL, model TEXT, engine TEXT,
            node TEXT, topology TEXT, started REAL NOT NULL, last_seen REAL NOT NULL, ended REAL, end_reason TEXT,
            gen_tokens REAL NOT NULL DEFAULT 0, prompt_tokens REAL NOT NULL DEFAULT 0,
            requests REAL NOT NULL DEFAULT 0, energy_j REAL NOT NULL DEFAULT 0, peak_kv REAL, peak_running REAL,
            peak_waiting REAL, peak_gen_tps REAL, engine_started REAL,
            -- the engine's own counters when last seen: a session resumed after sparktop was closed counts
            -- what was served meanwhile
            gen_counter REAL, prompt_counter REAL, requests_counter REAL);
        CREATE INDEX sessions_by_time ON sessions (last_seen);
        CREATE TABLE events (t REAL NOT NULL, subject INTEGER NOT NULL, kind TEXT NOT NULL, level TEXT NOT NULL,
            text TEXT NOT NULL);
        CREATE INDEX events_by_time ON events (t);
    """)


def _run(db: sqlite3.Connection, script: str) -> None:
    """Each statement on its own (executescript would commit the migration's transaction half-way)."""
    for statement in script.split(";"):
        lines = [line for line in statement.splitlines() if not line.strip().startswith("--")]
        if "".join(lines).strip():
            db.execute("\n".join(lines))


# MIGRATIONS[i] takes a file from schema version i to i + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1]


def schema_version() -> int:
    return len(MIGRATIONS)


def default_path() -> Path:
    return data_dir() / FILE_NAME


class HistoryError(SparktopError):
    pass


class HistoryStore:
    """An open history file. `writer` is True for the one process that holds
    the lock; the others read (and may ask again with `try_take_writer`)."""

    def __init__(self, path: Path, db: sqlite3.Connection, writer: bool, lock_fd: int | None):
        self.path = path
        self.db = db
        self.writer = writer
        self._lock_fd = lock_fd
        self._subjects: dict[tuple[str, str], int] = {}

    @classmethod
    def open(cls, path: str | Path | None = None, *, write: bool = True) -> HistoryStore:
        """Open (and create, and migrate) the history file. With `write`, try
        to become its one writer; if another process is, open it to read."""
        path = Path(path).expanduser() if path else default_path()
        lock_fd = _take_lock(path) if write else None
        if lock_fd is None and not write and not path.exists():
            from sparktop.settings import demo_history_path

            demo = " (the demo keeps its own: `sparktop history --inventory demo`)" \
                if demo_history_path().exists() and path != demo_history_path() else ""
            raise HistoryError(f"{path}: no history yet (the app writes it while open; `sparktop collect` "
                               f"writes it without a screen){demo}")
        try:
            if lock_fd is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA busy_timeout = 5000")
            if lock_fd is not None:
                db.execute("PRAGMA journal_mode = WAL")
                # NORMAL in WAL: a commit survives the process being killed; only a power cut may lose the
                # last transactions (a minute of samples), never corrupt the file.
                db.execute("PRAGMA synchronous = NORMAL")
                _migrate(db, path)
            else:
                _check_version(db, path)
        except sqlite3.DatabaseError as exc:
            if lock_fd is not None:
                os.close(lock_fd)
            raise HistoryError(f"{path}: not a readable history file ({exc})") from None
        return cls(path, db, lock_fd is not None, lock_fd)

    def try_take_writer(self) -> bool:
        """Become the writer if the one before has gone (the collector stopped while the app is open)."""
        if self.writer:
            return True
        fd = _take_lock(self.path)
        if fd is None:
            return False
        self._lock_fd, self.writer = fd, True
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = NORMAL")
        _migrate(self.db, self.path)
        return True

    def subject(self, kind: str, key: str) -> int:
        """The id of a node ("node", name) or an engine ("engine", URL), added on first use."""
        found = self._subjects.get((kind, key))
        if found is not None:
            return found
        row = self.db.execute("SELECT id FROM subjects WHERE kind = ? AND key = ?", (kind, key)).fetchone()
        if row is None:
            if not self.writer:
                return -1  # a reader asking for a subject never written: no rows match -1
            row = (self.db.execute("INSERT INTO subjects (kind, key) VALUES (?, ?)", (kind, key)).lastrowid,)
        self._subjects[(kind, key)] = row[0]
        return row[0]

    def forget_subjects(self) -> None:
        """Ids cached from a transaction that was rolled back may not exist: look them up again."""
        self._subjects.clear()

    def subjects(self, kind: str) -> dict[int, str]:
        return dict(self.db.execute("SELECT id, key FROM subjects WHERE kind = ?", (kind,)).fetchall())

    @contextlib.contextmanager
    def transaction(self):
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            if self.writer:
                self.db.execute("PRAGMA optimize")
            self.db.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.writer = False

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _take_lock(path: Path) -> int | None:
    """The writer's lock (flock: released by the kernel when the process dies, however it dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def writer_pid(path: Path) -> int | None:
    """The pid of the process writing the history (None: nobody, or unknown)."""
    try:
        text = Path(f"{path}.lock").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _version(db: sqlite3.Connection) -> int:
    has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
    if not has_meta:
        return 0
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def _check_version(db: sqlite3.Connection, path: Path) -> int:
    version = _version(db)
    if version > schema_version():
        raise HistoryError(f"{path}: written by a newer sparktop (history schema {version}; this one reads up "
                           f"to {schema_version()}): upgrade sparktop, or move the file away to start afresh")
    return version


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the file to this sparktop's schema, all steps in one transaction
    (a failed step leaves the file as it was)."""
    version = _check_version(db, path)
    if version == schema_version():
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        for step in MIGRATIONS[version:]:
            step(db)
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(schema_version()),))
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
