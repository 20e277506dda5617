"""What the workers of one `serve --workers N` share when nothing shared is configured (no
Redis, no Postgres): a SQLite file beside the database holding the rate-limit windows,
the budget ledger and passive health, so that a key's limit is its limit and not N times
it.

Every read-decide-write happens under an exclusive ``flock`` on a lock file next to it:
the workers take turns at once, rather than in SQLite's busy-handler sleeps (a
millisecond or more, spent blocking the event loop), and the kernel drops a dead
worker's lock. Several rows change together in one transaction; a rate-limit decision,
one row, is a read and a write in autocommit under the lock (a third cheaper). Calls are
synchronous on the event loop: tens of microseconds, less than handing them to a thread
would cost. The file is in WAL mode without fsync (counters: an OS crash may cost them,
as a restart costs in-process counters), its small schema created on open; it is not
the database's (no migration). It outlives the workers, so a replaced worker counts on.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from llm_gateway.limits import (
    Granted,
    Guard,
    LimitDecision,
    LimiterUnavailable,
    bucket_decision,
    bucket_granted,
    bucket_name,
    count_in_window,
    guarded,
    lease_in_window,
    take_from_bucket,
    window_start,
)

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS rate_limit_windows (
        bucket TEXT PRIMARY KEY, window_start REAL NOT NULL, request_count INTEGER NOT NULL
    ) WITHOUT ROWID""",
    # Token buckets (limits.take_from_bucket): tokens and when they were written.
    """CREATE TABLE IF NOT EXISTS rate_limit_buckets (
        bucket TEXT PRIMARY KEY, tokens REAL NOT NULL, at REAL NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS quota_counters (
        name TEXT PRIMARY KEY, spent INTEGER NOT NULL, reserved INTEGER NOT NULL,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS quota_buckets (
        name TEXT PRIMARY KEY, level REAL NOT NULL, at REAL NOT NULL
    ) WITHOUT ROWID""",
    # The budget ledger's owners (llm_gateway.billing.ledger): a reservation's held row
    # (its holds as JSON), the tombstones of swept ones, and when each process was heard of.
    """CREATE TABLE IF NOT EXISTS quota_held (
        process TEXT NOT NULL, request TEXT NOT NULL, holds TEXT NOT NULL,
        PRIMARY KEY (process, request)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS quota_swept (
        process TEXT NOT NULL, request TEXT NOT NULL, at REAL NOT NULL,
        PRIMARY KEY (process, request)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS quota_swept_at ON quota_swept (at)",
    """CREATE TABLE IF NOT EXISTS quota_processes (
        process TEXT PRIMARY KEY, heard_at REAL NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS target_health (
        target TEXT PRIMARY KEY, failures INTEGER NOT NULL, successes INTEGER NOT NULL,
        degraded INTEGER NOT NULL, down_until REAL NOT NULL,
        limited_until REAL NOT NULL DEFAULT 0
    ) WITHOUT ROWID""",
)
# Columns added since a file was first made (the file outlives the version that made it).
ADDED_COLUMNS = (("target_health", "limited_until", "REAL NOT NULL DEFAULT 0"),)


class WorkersFile:
    """One connection to the workers' file, and the lock every transaction takes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        # Threads of one process share the flock (one open file): they take turns here.
        self._threads = threading.Lock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout=5000")  # only if someone else opens the file
        self._db.execute("PRAGMA synchronous=OFF")  # no fsync, at checkpoints either
        with self.transaction() as db:
            for statement in SCHEMA:
                db.execute(statement)
            for table, column, definition in ADDED_COLUMNS:
                if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        db.execute("PRAGMA journal_mode=WAL")  # outside a transaction; kept by the file

    def acquire(self) -> sqlite3.Connection:
        """The connection, its statements in autocommit, no other worker's in between
        until ``release``. (Methods, not a context manager: this is the hot path.)"""
        self._threads.acquire()
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        return self._db

    def release(self) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._threads.release()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection, inside one transaction no other worker interleaves with;
        committed when the block ends, rolled back when it raises."""
        db = self.acquire()
        try:
            db.execute("BEGIN")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            self.release()

    def close(self) -> None:
        self._db.close()
        os.close(self._lock_fd)


# The key's window and its guard's, in one statement.
_READ = "SELECT bucket, window_start, request_count FROM rate_limit_windows WHERE bucket IN (?, ?)"
_STORE = "INSERT OR REPLACE INTO rate_limit_windows VALUES (?, ?, ?)"
# A lease's unused room, back into the window it was counted in (none once that is over).
_GIVE_BACK = """UPDATE rate_limit_windows SET request_count = max(0, request_count - ?)
                WHERE bucket = ? AND window_start = ?"""
_READ_BUCKET = "SELECT tokens, at FROM rate_limit_buckets WHERE bucket = ?"
_STORE_BUCKET = "INSERT OR REPLACE INTO rate_limit_buckets VALUES (?, ?, ?)"


class SqliteRateLimiter:
    """The fixed window and the token bucket of ``llm_gateway.limits`` (the memory
    limiter's rules, applied to rows of the workers' file): exact across the workers of
    one node."""

    backend = "sqlite"

    def __init__(self, file: WorkersFile, clock: Callable[[], float] = time.time) -> None:
        self._file = file
        self._clock = clock

    async def take(self, key_id: str, limit: int, window_seconds: int, cost: int = 1,
                   guard: Guard | None = None, burst: int | None = None) -> LimitDecision:
        if burst is not None:
            need = max(1, cost)
            taken = self._bucket(key_id, limit, window_seconds, burst, cost, need, guard)
            if isinstance(taken, LimitDecision):
                return taken
            return bucket_decision(limit, window_seconds, burst, *taken, need)
        now = self._clock()
        bucket = bucket_name(key_id, limit, window_seconds)
        start = window_start(now, window_seconds)
        db = self._acquire()
        try:
            windows = self._read(db, bucket, guard)
            if guard is not None and (full := _guard_full(windows, guard, now)) is not None:
                return full
            before = _count(windows.get(bucket), start)
            count, decision = count_in_window(before, limit, cost, now, window_seconds)
            if count != before:
                db.execute(_STORE, (bucket, start, count))
            return decision
        except sqlite3.Error as exc:
            raise LimiterUnavailable(self.backend, exc) from exc
        finally:
            self._file.release()

    async def lease(self, key_id: str, limit: int, window_seconds: int, amount: int,
                    guard: Guard | None = None, burst: int | None = None) -> Granted:
        if burst is not None:
            taken = self._bucket(key_id, limit, window_seconds, burst, amount, amount, guard)
            if isinstance(taken, LimitDecision):  # the guard full
                return Granted(0, 0, taken.reset_after, 0.0)
            return bucket_granted(taken[1], amount, taken[0], burst)
        now = self._clock()
        bucket = bucket_name(key_id, limit, window_seconds)
        start = window_start(now, window_seconds)
        reset = start + window_seconds - now
        db = self._acquire()
        try:
            windows = self._read(db, bucket, guard)
            if guard is not None and _guard_full(windows, guard, now) is not None:
                return Granted(0, 0, reset, start)
            before = _count(windows.get(bucket), start)
            granted = lease_in_window(before, limit, amount)
            if granted:
                db.execute(_STORE, (bucket, start, before + granted))
            return Granted(granted, before + granted, reset, start)
        except sqlite3.Error as exc:
            raise LimiterUnavailable(self.backend, exc) from exc
        finally:
            self._file.release()

    async def give_back(self, key_id: str, limit: int, window_seconds: int, amount: int,
                        window: float, burst: int | None = None) -> None:
        if burst is not None:
            self._bucket(key_id, limit, window_seconds, burst, -amount, 0, None)
            return
        db = self._acquire()
        try:
            db.execute(_GIVE_BACK, (amount, bucket_name(key_id, limit, window_seconds), window))
        except sqlite3.Error as exc:
            raise LimiterUnavailable(self.backend, exc) from exc
        finally:
            self._file.release()

    def _bucket(self, key_id: str, limit: int, window_seconds: int, burst: int, cost: int,
                need: int, guard: Guard | None) -> tuple[float, bool] | LimitDecision:
        """``take_from_bucket`` on the key's bucket row: its level after and whether
        granted, or the guard's refusal (nothing taken)."""
        now = self._clock()
        bucket = bucket_name(key_id, limit, window_seconds, burst)
        db = self._acquire()
        try:
            if guard is not None:
                windows = self._read(db, "", guard)
                if (full := _guard_full(windows, guard, now)) is not None:
                    return full
            row = db.execute(_READ_BUCKET, (bucket,)).fetchone()
            state, level, granted = take_from_bucket(row, now, limit, window_seconds, burst,
                                                     cost, need)
            if state is not None:
                db.execute(_STORE_BUCKET, (bucket, *state))
            return level, granted
        except sqlite3.Error as exc:
            raise LimiterUnavailable(self.backend, exc) from exc
        finally:
            self._file.release()

    def _acquire(self) -> sqlite3.Connection:
        try:
            return self._file.acquire()
        except OSError as exc:
            raise LimiterUnavailable(self.backend, exc) from exc

    @staticmethod
    def _read(db: sqlite3.Connection, bucket: str,
              guard: Guard | None) -> dict[str, tuple[float, int]]:
        guard_bucket = (bucket_name(guard.key_id, guard.limit, guard.window_seconds)
                        if guard is not None else "")
        return {row[0]: row[1:] for row in db.execute(_READ, (bucket, guard_bucket))}

    async def ping(self) -> None:
        try:
            with self._file.transaction() as db:
                db.execute("SELECT 1").fetchone()
        except sqlite3.Error as exc:
            raise LimiterUnavailable(self.backend, exc) from exc

    async def close(self) -> None:
        self._file.close()


def _guard_full(windows: dict[str, tuple[float, int]], guard: Guard,
                now: float) -> LimitDecision | None:
    """The refusal when the guard's window is full (it is looked at, never counted)."""
    guard_start = window_start(now, guard.window_seconds)
    bucket = bucket_name(guard.key_id, guard.limit, guard.window_seconds)
    if _count(windows.get(bucket), guard_start) >= guard.limit:
        return guarded(guard, guard_start + guard.window_seconds - now)
    return None


def _count(window: tuple[float, int] | None, start: float) -> int:
    """What a bucket's current window has counted (0: a new window, or none yet)."""
    return window[1] if window is not None and window[0] == start else 0
