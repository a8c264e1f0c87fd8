"""The history file: one SQLite database under `$XDG_DATA_HOME/sparktop/`.

A row per minute per node and per engine (`node_minutes`, `engine_minutes`),
the serving sessions (`sessions`), the event log (`events`), and the names
the rows refer to (`subjects`: a node's name or an engine's URL, stored once).
The schema carries its version in `meta`; opening a file migrates it to this
sparktop's version in one transaction, or refuses a file a newer sparktop
wrote. WAL mode, so readers never wait for the writer.

One process writes: the writer holds an advisory lock on a file beside the
database (`history.sqlite.lock`, beside the real file when the path given is
a symlink); a second sparktop (the app while the collector runs, or the
other way round) opens it read-only and reads what the first one writes.

A minute row written twice (a restart or a handover within the minute, the
minute in progress written early, a clock set back) is merged, never
replaced: counts add, extremes keep the extreme, means are weighted by
their samples (`MERGE`, `minute_upsert`).

What cannot be opened is a `HistoryError` of one line that says what to do,
its `reason` one of `REASONS` (a full disk, a damaged file, a newer
sparktop's file); no engine URL keeps its credentials in the file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shlex
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

from sparktop.errors import SparktopError
from sparktop.masking import strip_url_credentials
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
# How two rows of one minute merge (a figure's kind in the writer's minute: a mean, an extreme, the last
# value, a sum).
MERGE = {
    "mem_used": "mean", "mem_available_min": "min", "mem_total": "last", "gpu_util": "mean", "gpu_util_max": "max",
    "power_w": "mean", "power_max_w": "max", "temp_c": "mean", "temp_max_c": "max", "cpu_pct": "mean",
    "rdma_rx_gbps": "mean", "rdma_tx_gbps": "mean", "kernel_rx_gbps": "mean", "kernel_tx_gbps": "mean",
    "link_max_gbps": "max", "energy_j": "sum",
    "kv": "mean", "kv_max": "max", "running": "mean", "running_max": "max", "waiting": "mean", "waiting_max": "max",
    "gen_tps": "mean", "gen_tps_max": "max", "prompt_tps": "mean", "gen_tokens": "sum", "prompt_tokens": "sum",
    "requests": "sum", "preemptions": "sum", "rejections": "sum", "ttft_p50": "last", "ttft_p95": "last",
    "itl_p50": "last", "itl_p95": "last", "e2e_p95": "last", "queue_p95": "last",
}
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


def resolve_path(path: str | Path | None) -> Path:
    """The history file's real path: `~` expanded, symlinks followed (the writer's lock is beside the real
    file, so two paths to one file are one writer)."""
    return (Path(path).expanduser() if path else default_path()).resolve()


REASONS = ("disk full", "damaged file", "newer sparktop's file", "cannot write")


class HistoryError(SparktopError):
    """`reason`: one of `REASONS`, for a status line and a metric; the message says what to do."""

    exit_code = 1

    def __init__(self, message: str, reason: str = "cannot write"):
        super().__init__(message)
        self.reason = reason


def damaged_text(path: Path, detail: str) -> str:
    detail = " ".join(detail.split())  # one line, whatever SQLite's check said
    detail = detail if len(detail) <= 160 else detail[:157] + "..."
    p = shlex.quote(str(path))
    return (f"{path} is damaged ({detail}): move it aside: mv {p} {shlex.quote(str(path) + '.damaged')}; "
            "sparktop starts a new one")


def full_text(path: Path) -> str:
    return f"{path}: the disk is full ({_free_text(path)}): free space there; history is written when there is room"


def _free_text(path: Path) -> str:
    where = path.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return f"{shutil.disk_usage(where).free / 1024:.0f} KiB free on {where}"
    except OSError:
        return f"no room on {where}"


def is_full(exc: BaseException, path: Path | None = None) -> bool:
    """A full disk, as the OS or SQLite says it (SQLite says "disk I/O error" when it cannot create its
    journal on a full disk: the free space decides)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    if name.startswith("SQLITE_FULL") or "full" in text:
        return True
    if (name.startswith("SQLITE_IOERR") or "I/O error" in text) and path is not None:
        with contextlib.suppress(OSError):
            where = path.parent if path.parent.exists() else Path("/")
            return shutil.disk_usage(where).free < 1024 * 1024
    return False


def is_damaged(exc: BaseException) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text or "not a database" in text


def history_error(exc: BaseException, path: Path) -> HistoryError:
    """What went wrong with the history file, in one line that says what to do."""
    if isinstance(exc, HistoryError):
        return exc
    if is_full(exc, path):
        return HistoryError(full_text(path), "disk full")
    if is_damaged(exc):
        return HistoryError(damaged_text(path, str(exc)), "damaged file")
    if isinstance(exc, OSError):
        return HistoryError(f"{path}: cannot write it ({exc.strerror or exc}): check the directory's permissions "
                            "and space")
    if type(exc) is sqlite3.DatabaseError:  # none of SQLite's operational errors: what the file holds
        return HistoryError(damaged_text(path, f"not a readable history file: {exc}"), "damaged file")
    return HistoryError(f"{path}: cannot open the history file ({exc})")


class HistoryStore:
    """An open history file. `writer` is True for the one process that holds
    the lock; the others read (and may ask again with `try_take_writer`)."""

    def __init__(self, path: Path, db: sqlite3.Connection, writer: bool, lock_fd: int | None):
        self.path = path
        self.db = db
        self.writer = writer
        self._lock_fd = lock_fd
        self._subjects: dict[tuple[str, str], int] = {}
        try:
            st = os.stat(path)
            self._inode: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            self._inode = None

    @classmethod
    def open(cls, path: str | Path | None = None, *, write: bool = True, check: bool = False) -> HistoryStore:
        """Open (and create, and migrate) the history file. With `write`, try
        to become its one writer; if another process is, open it to read.
        `check`: read the whole file once (`PRAGMA quick_check`, a fraction of a second for a month) so
        a damaged file is found now, not at the first row written into it. Every failure is a
        `HistoryError` (its `reason` says which)."""
        path = resolve_path(path)
        try:
            lock_fd = _take_lock(path) if write else None
        except OSError as exc:
            raise history_error(exc, path) from None
        if lock_fd is None and not write and not path.exists():
            from sparktop.settings import demo_history_path

            demo = " (the demo keeps its own: `sparktop history --inventory demo`)" \
                if demo_history_path().exists() and path != demo_history_path().resolve() else ""
            raise HistoryError(f"{path}: no history yet (the app writes it while open; `sparktop collect` "
                               f"writes it without a screen){demo}")
        if lock_fd is not None:
            set_aside_journal(path)  # a journal without its file (moved aside) is not this new file's
        db = None
        try:
            db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA busy_timeout = 5000")
            if lock_fd is not None:
                db.execute("PRAGMA journal_mode = WAL")
                # NORMAL in WAL: a commit survives the process being killed; only a power cut may lose the
                # last transactions (a minute of samples), never corrupt the file.
                db.execute("PRAGMA synchronous = NORMAL")
                if check:
                    _check_sound(db, path)
                _migrate(db, path)
                _scrub_credentials(db)
            else:
                _check_version(db, path)
        except (sqlite3.Error, OSError, HistoryError) as exc:
            if db is not None:
                with contextlib.suppress(sqlite3.Error):
                    db.close()
            if lock_fd is not None:
                os.close(lock_fd)
            raise history_error(exc, path) from None
        return cls(path, db, lock_fd is not None, lock_fd)

    def try_take_writer(self) -> bool:
        """Become the writer if the one before has gone (the collector stopped while the app is open)."""
        if self.writer:
            return True
        try:
            fd = _take_lock(self.path)
        except OSError as exc:
            raise history_error(exc, self.path) from None
        if fd is None:
            return False
        self._lock_fd, self.writer = fd, True
        try:
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA synchronous = NORMAL")
            _migrate(self.db, self.path)
            _scrub_credentials(self.db)
        except (sqlite3.Error, HistoryError) as exc:
            os.close(fd)
            self._lock_fd, self.writer = None, False
            raise history_error(exc, self.path) from None
        return True

    def subject(self, kind: str, key: str) -> int:
        """The id of a node ("node", name) or an engine ("engine", URL: kept without its credentials),
        added on first use."""
        key = strip_url_credentials(key)
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

    def newest(self) -> float | None:
        """The time of the newest thing written (a minute row's start, an event, a session last seen):
        what a writer's clock is checked against when it starts."""
        found = [self.db.execute("SELECT MAX(minute) * 60.0 FROM node_minutes").fetchone()[0],
                 self.db.execute("SELECT MAX(minute) * 60.0 FROM engine_minutes").fetchone()[0],
                 self.db.execute("SELECT MAX(t) FROM events").fetchone()[0],
                 self.db.execute("SELECT MAX(last_seen) FROM sessions").fetchone()[0]]
        known = [float(x) for x in found if x is not None]
        return max(known) if known else None

    def same_file(self) -> bool:
        """Whether the path still names the file this store has open (not moved aside, nor replaced)."""
        try:
            now = os.stat(self.path)
        except OSError:
            return False
        return self._inode is None or (now.st_dev, now.st_ino) == self._inode

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
    with contextlib.suppress(OSError):  # the pid is for messages; a full disk must not cost the lock
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def set_aside_journal(path: Path) -> None:
    """A damaged file moved aside leaves its journal (`-wal`, `-shm`) at the old name: it goes with it (to
    FILE.damaged-wal, beside FILE.damaged as the line says), so a new file there never reads the old one's
    pages."""
    if path.exists():
        return
    for suffix in ("-wal", "-shm"):
        journal = Path(f"{path}{suffix}")
        if journal.exists():
            with contextlib.suppress(OSError):
                journal.rename(f"{path}.damaged{suffix}")


def minute_upsert(kind: str, columns: list[str]) -> str:
    """INSERT of a minute row that merges into the row already there for that minute and subject."""
    figures = NODE_FIGURES if kind == "node" else ENGINE_FIGURES
    sets = ["samples = samples + excluded.samples"]
    if "session" in columns:
        sets.append("session = coalesce(excluded.session, session)")
    for f in figures:
        how = MERGE[f]
        if how == "mean":
            expr = (f"CASE WHEN excluded.{f} IS NULL THEN {f} WHEN {f} IS NULL THEN excluded.{f} ELSE "
                    f"({f} * samples + excluded.{f} * excluded.samples) / (samples + excluded.samples) END")
        elif how in ("max", "min"):
            expr = f"coalesce({how}({f}, excluded.{f}), {f}, excluded.{f})"
        elif how == "sum":
            expr = f"coalesce({f} + excluded.{f}, {f}, excluded.{f})"
        else:
            expr = f"coalesce(excluded.{f}, {f})"
        sets.append(f"{f} = {expr}")
    return (f"INSERT INTO {kind}_minutes ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            f"ON CONFLICT (minute, subject) DO UPDATE SET {', '.join(sets)}")


def _check_sound(db: sqlite3.Connection, path: Path) -> None:
    found = [row[0] for row in db.execute("PRAGMA quick_check(3)")]
    if found != ["ok"]:
        raise HistoryError(damaged_text(path, "; ".join(found)), "damaged file")


def _scrub_credentials(db: sqlite3.Connection) -> None:
    """Credentials an older sparktop kept in the file (an engine given as http://user:pw@host) go: the
    URLs lose them, and so does what was said about them (events, how sessions ended); deleted text is
    overwritten, not left in free pages."""
    found = db.execute("SELECT id, kind, key FROM subjects WHERE key LIKE '%://%@%'").fetchall()
    texts = db.execute("SELECT count(*) FROM events WHERE text LIKE '%://%@%'").fetchone()[0] + \
        db.execute("SELECT count(*) FROM sessions WHERE end_reason LIKE '%://%@%'").fetchone()[0]
    if not found and not texts:
        return
    db.execute("PRAGMA secure_delete = ON")
    db.execute("BEGIN IMMEDIATE")
    try:
        for old, kind, key in found:
            clean = strip_url_credentials(key)
            if clean == key:
                continue
            row = db.execute("SELECT id FROM subjects WHERE kind = ? AND key = ?", (kind, clean)).fetchone()
            if row is None:
                db.execute("UPDATE subjects SET key = ? WHERE id = ?", (clean, old))
                continue
            new = row[0]  # the same engine also written without credentials: one subject
            for table in ("sessions", "events"):
                db.execute(f"UPDATE {table} SET subject = ? WHERE subject = ?", (new, old))
            for table, figures in (("node", NODE_FIGURES), ("engine", ENGINE_FIGURES)):
                columns = ["subject", "minute", "samples", *(["session"] if table == "engine" else []), *figures]
                rows = db.execute(f"SELECT {', '.join(columns)} FROM {table}_minutes WHERE subject = ?",
                                  (old,)).fetchall()
                db.executemany(minute_upsert(table, columns), [(new, *r[1:]) for r in rows])
                db.execute(f"DELETE FROM {table}_minutes WHERE subject = ?", (old,))
            db.execute("DELETE FROM subjects WHERE id = ?", (old,))
        for table, column in (("events", "text"), ("sessions", "end_reason")):
            rows = db.execute(f"SELECT rowid, {column} FROM {table} WHERE {column} LIKE '%://%@%'").fetchall()
            db.executemany(f"UPDATE {table} SET {column} = ? WHERE rowid = ?",
                           [(strip_url_credentials(text), rowid) for rowid, text in rows])
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the old pages out of the file too
    db.execute("PRAGMA secure_delete = OFF")


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
                           f"to {schema_version()}): upgrade sparktop, or move the file away to start afresh",
                           "newer sparktop's file")
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
