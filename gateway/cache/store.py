"""The page cache's storage behind one small interface, and its embedded default: one SQLite
file on this machine (stdlib, no server; shared by the gateway's processes), bounded by bytes
with the least recently used entries evicted first, each entry living until it has not been
used for a TTL.

The interface (`CacheStore`) is what gateway.cache.pages needs and no more:
  get(key) -> bytes | None         an entry, refreshing its last use
  put(key, value)                  store it (evicting the least recently used past the budget)
  claim(key, token, ttl_s) -> bool this caller is the one reading the page now (in flight)
  release(key, token)              it no longer is (answered, failed or gone)
  claimed(key) -> bool             somebody is
  ping()                           raises unless the store answers (gateway.cache.guard)
A claim lapses by itself after its TTL (a gateway process that died holds nothing for long).
Every call may raise or be slow: gateway.cache.guard decides what that costs (nothing)."""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import sqlite3
import threading
import time
from typing import Callable, Protocol, TypeVar

log = logging.getLogger("gateway.cache")

T = TypeVar("T")


class CacheStore(Protocol):
    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...

    def claim(self, key: str, token: str, ttl_s: float) -> bool: ...

    def release(self, key: str, token: str) -> None: ...

    def claimed(self, key: str) -> bool: ...

    def size_bytes(self) -> int: ...

    def ping(self) -> None: ...

    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, value BLOB NOT NULL,
    size INTEGER NOT NULL, used REAL NOT NULL, expires REAL NOT NULL);
CREATE INDEX IF NOT EXISTS entries_used ON entries(used);
CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, token TEXT NOT NULL,
    expires REAL NOT NULL);
"""


def corrupt(exc: BaseException) -> bool:
    """`exc` says the file is damaged or not a database (not busy, full or unwritable)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or \
        any(words in str(exc) for words in ("malformed", "not a database"))


def _noting_damage(method: Callable[..., T]) -> Callable[..., T]:
    """A store call that remembers when the file turned out damaged (for `ping`)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            if corrupt(exc):
                self.damaged = True
            raise
    return call


class SqliteCacheStore:
    """One SQLite file (WAL), one connection per thread. `max_bytes` bounds the values'
    bytes: a put that passes it evicts the least recently used entries first; an entry larger
    than a quarter of the budget is not stored. Expired entries go in the same sweep.

    A call waits `timeout_s` at most for another process's lock. A file that is not a
    database, or is damaged, is moved aside (`{path}.corrupt-{time}`, with a log line) and a
    new one made in its place: when it is opened (the gateway starts whatever the file
    holds), and when a call finds damage, by the next `ping`. A file that cannot be opened at
    all (a directory not writable) leaves the store failing until it can: never the gateway."""

    def __init__(self, path: str, max_bytes: int, ttl_s: float, clock=time.time,
                 timeout_s: float = 0.5):
        self.path = os.path.expanduser(path)
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.timeout_s = timeout_s
        self.damaged = False
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._generation = 0  # connections of an older one are closed: open another
        self._lock = threading.Lock()
        try:
            self._db()
        except (OSError, sqlite3.Error) as exc:
            log.error("page cache file %s cannot be opened (%s: %s): pages are read through "
                      "until it can", self.path, type(exc).__name__, exc)

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None or self._local.generation != self._generation:
            generation = self._generation
            try:
                db = self._connect()
            except sqlite3.DatabaseError as exc:
                if not corrupt(exc):
                    raise
                self._set_aside(exc)
                db = self._connect()
            self._local.db, self._local.generation = db, generation
            with self._lock:
                self._connections.append(db)
        return db

    def _connect(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        db = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None,
                             check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
        except BaseException:
            db.close()
            raise
        return db

    def _set_aside(self, exc: BaseException) -> None:
        """Move the damaged file aside, unless another process already has (one at a time:
        a lock file beside it); the next connection makes a new one."""
        if self.path == ":memory:":
            raise exc
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._healthy():
                return  # another process made a new one meanwhile
            aside = f"{self.path}.corrupt-{int(time.time())}"
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(self.path + suffix):
                    os.replace(self.path + suffix, aside + suffix)
        log.error("page cache file %s is damaged (%s: %s): moved aside to %s, and a new one "
                  "made", self.path, type(exc).__name__, exc, aside)

    def _healthy(self) -> bool:
        """The file at `path` now opens and passes SQLite's quick check (missing: healthy)."""
        if not os.path.exists(self.path):
            return True
        try:
            check = sqlite3.connect(self.path, timeout=self.timeout_s)
        except sqlite3.Error:
            return False
        try:
            return check.execute("PRAGMA quick_check(1)").fetchone()[0] == "ok"
        except sqlite3.DatabaseError as exc:
            return not corrupt(exc)
        finally:
            check.close()

    def ping(self) -> None:
        """Raises unless the store answers; a file found damaged is first checked through,
        and moved aside and made again when it is (the store's other connections reopen)."""
        if self.damaged:
            self.damaged = False
            self._close_connections()
            if not self._healthy():
                self._set_aside(sqlite3.DatabaseError("found damaged"))
        self._db().execute("SELECT 1 FROM entries LIMIT 1").fetchall()

    def _close_connections(self) -> None:
        with self._lock:
            self._generation += 1
            for db in self._connections:
                db.close()
            self._connections.clear()

    @_noting_damage
    def get(self, key: str) -> bytes | None:
        now = self.clock()
        db = self._db()
        row = db.execute("SELECT value FROM entries WHERE key = ? AND expires > ?",
                         (key, now)).fetchone()
        if row is None:
            return None
        db.execute("UPDATE entries SET used = ?, expires = ? WHERE key = ?",
                   (now, now + self.ttl_s, key))
        return bytes(row[0])

    @_noting_damage
    def put(self, key: str, value: bytes) -> None:
        if len(value) > self.max_bytes // 4:
            return
        now = self.clock()
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?)",
                       (key, value, len(value), now, now + self.ttl_s))
            db.execute("DELETE FROM entries WHERE expires <= ?", (now,))
            total = db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
            if total > self.max_bytes:
                doomed, freed = [], 0
                for old, size in db.execute("SELECT key, size FROM entries ORDER BY used"):
                    if total - freed <= self.max_bytes:
                        break
                    doomed.append((old,))
                    freed += size
                db.executemany("DELETE FROM entries WHERE key = ?", doomed)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @_noting_damage
    def claim(self, key: str, token: str, ttl_s: float) -> bool:
        now = self.clock()
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM claims WHERE key = ? AND expires <= ?", (key, now))
            cursor = db.execute("INSERT OR IGNORE INTO claims VALUES (?, ?, ?)",
                                (key, token, now + ttl_s))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return cursor.rowcount == 1

    @_noting_damage
    def release(self, key: str, token: str) -> None:
        self._db().execute("DELETE FROM claims WHERE key = ? AND token = ?", (key, token))

    @_noting_damage
    def claimed(self, key: str) -> bool:
        return self._db().execute("SELECT 1 FROM claims WHERE key = ? AND expires > ?",
                                  (key, self.clock())).fetchone() is not None

    @_noting_damage
    def size_bytes(self) -> int:
        return self._db().execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]

    def close(self) -> None:
        self._close_connections()
        self._local = threading.local()
