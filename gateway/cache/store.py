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
A claim lapses by itself after its TTL (a gateway process that died holds nothing for long)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Protocol


class CacheStore(Protocol):
    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...

    def claim(self, key: str, token: str, ttl_s: float) -> bool: ...

    def release(self, key: str, token: str) -> None: ...

    def claimed(self, key: str) -> bool: ...

    def size_bytes(self) -> int: ...

    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, value BLOB NOT NULL,
    size INTEGER NOT NULL, used REAL NOT NULL, expires REAL NOT NULL);
CREATE INDEX IF NOT EXISTS entries_used ON entries(used);
CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, token TEXT NOT NULL,
    expires REAL NOT NULL);
"""


class SqliteCacheStore:
    """One SQLite file (WAL), one connection per thread. `max_bytes` bounds the values'
    bytes: a put that passes it evicts the least recently used entries first; an entry larger
    than a quarter of the budget is not stored. Expired entries go in the same sweep."""

    def __init__(self, path: str, max_bytes: int, ttl_s: float, clock=time.time):
        self.path = os.path.expanduser(path)
        if self.path != ":memory:":
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        with self._db() as db:
            db.executescript(_SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=10, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
            with self._lock:
                self._connections.append(db)
        return db

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

    def release(self, key: str, token: str) -> None:
        self._db().execute("DELETE FROM claims WHERE key = ? AND token = ?", (key, token))

    def claimed(self, key: str) -> bool:
        return self._db().execute("SELECT 1 FROM claims WHERE key = ? AND expires > ?",
                                  (key, self.clock())).fetchone() is not None

    def size_bytes(self) -> int:
        return self._db().execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()
