"""The embedded job store: one SQLite file (WAL mode), shared by every gunicorn process of
the gateways on one machine and surviving their restarts. Each thread has its own
connection; every change that must be atomic runs in one `BEGIN IMMEDIATE` transaction."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from .model import (ACTIVE_STATES, CANCELLED, CB_PENDING, FINAL_STATES, FLOAT_FIELDS,
                    INT_FIELDS, QUEUED, RUNNING, STR_FIELDS, Job, StoredPage)
from .store import Claim, Limits, Usage, check_limits

COLUMNS = STR_FIELDS + INT_FIELDS + FLOAT_FIELDS
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS jobs (
    {", ".join(f"{name} {'TEXT' if name in STR_FIELDS else 'REAL'}" for name in COLUMNS)},
    next_at REAL,
    PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_client ON jobs (client);
CREATE INDEX IF NOT EXISTS jobs_expiry ON jobs (expires_at) WHERE expires_at > 0;
CREATE TABLE IF NOT EXISTS documents (job_id TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS pages (
    job_id TEXT NOT NULL, page_index INTEGER NOT NULL, failed INTEGER NOT NULL,
    data TEXT NOT NULL, PRIMARY KEY (job_id, page_index)
);
"""
PAGE_BATCH = 32


class SqliteJobStore:
    def __init__(self, path: str):
        self.path = os.path.expanduser(path)
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._local = threading.local()
        db = self._db()
        db.executescript(SCHEMA)
        have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
        for name in COLUMNS:  # a database made by an older gateway: the fields added since
            if name not in have:
                kind = "TEXT DEFAULT ''" if name in STR_FIELDS else "REAL DEFAULT 0"
                db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")

    # ---- connections -------------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None,
                                 check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # ---- jobs --------------------------------------------------------------------------------
    def create(self, job: Job, document: bytes, limits: Limits) -> None:
        job.stored_bytes = len(document)
        row = job.to_row()
        row["next_at"] = job.created
        with self._write() as db:
            usage = self._usage(db, job.client)
            check_limits(usage, len(document), limits)
            db.execute(f"INSERT INTO jobs ({', '.join(row)}) VALUES "
                       f"({', '.join('?' * len(row))})", list(row.values()))
            db.execute("INSERT INTO documents VALUES (?, ?)", (job.id, document))

    def get(self, job_id: str, now: float | None = None) -> Job | None:
        row = self._db().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            return None
        job = Job.from_row(dict(row))
        return None if _expired(job, now) else job

    def document(self, job_id: str) -> bytes | None:
        row = self._db().execute("SELECT data FROM documents WHERE job_id = ?",
                                 (job_id,)).fetchone()
        return bytes(row[0]) if row else None

    def usage(self, client: str) -> Usage:
        return self._usage(self._db(), client)

    def ping(self) -> None:
        self._db().execute("SELECT 1")

    @staticmethod
    def _usage(db: sqlite3.Connection, client: str) -> Usage:
        active, stored = db.execute(
            "SELECT COUNT(*) FILTER (WHERE state IN (?, ?)), COALESCE(SUM(stored_bytes), 0) "
            "FROM jobs WHERE client = ?", (*ACTIVE_STATES, client)).fetchone()
        return Usage(int(active), int(stored))

    # ---- leases ------------------------------------------------------------------------------
    def claim(self, owner: str, lease_s: float, now: float | None = None) -> Claim | None:
        now = time.time() if now is None else now
        token = secrets.token_hex(16)
        with self._write() as db:
            row = db.execute("SELECT id, state FROM jobs WHERE next_at <= ? ORDER BY next_at "
                             "LIMIT 1", (now,)).fetchone()
            if row is None:
                return None
            started = "CASE WHEN state = ? THEN ? ELSE started END"
            db.execute(f"UPDATE jobs SET lease_owner = ?, lease_token = ?, lease_until = ?, "
                       f"next_at = ?, started = {started}, "
                       f"state = CASE WHEN state = ? THEN ? ELSE state END WHERE id = ?",
                       (owner, token, now + lease_s, now + lease_s, QUEUED, now, QUEUED,
                        RUNNING, row["id"]))
            job = Job.from_row(dict(db.execute("SELECT * FROM jobs WHERE id = ?",
                                               (row["id"],)).fetchone()))
        return Claim(job, token)

    def renew(self, job_id: str, token: str, lease_s: float, now: float | None = None) -> bool:
        until = (time.time() if now is None else now) + lease_s
        with self._write() as db:
            cursor = db.execute("UPDATE jobs SET lease_until = ?, next_at = ? WHERE id = ? AND "
                                "lease_token = ?", (until, until, job_id, token))
        return cursor.rowcount == 1

    def release(self, job_id: str, token: str, retry_at: float) -> bool:
        with self._write() as db:
            cursor = db.execute("UPDATE jobs SET lease_token = '', lease_until = 0, next_at = ? "
                                "WHERE id = ? AND lease_token = ?", (retry_at, job_id, token))
        return cursor.rowcount == 1

    # ---- pages -------------------------------------------------------------------------------
    def put_page(self, job_id: str, token: str, page: StoredPage, client: str) -> bool:
        with self._write() as db:
            if not _holds(db, job_id, token):
                return False
            cursor = db.execute("INSERT OR IGNORE INTO pages VALUES (?, ?, ?, ?)",
                                (job_id, page.index, int(page.failed), page.data))
            if cursor.rowcount == 1:
                db.execute("UPDATE jobs SET pages_done = pages_done + 1, "
                           "pages_failed = pages_failed + ?, pages_cached = pages_cached + ?, "
                           "stored_bytes = stored_bytes + ? WHERE id = ?",
                           (int(page.failed), int(page.cached), page.size, job_id))
        return True

    def done_indices(self, job_id: str) -> set[int]:
        rows = self._db().execute("SELECT page_index FROM pages WHERE job_id = ?", (job_id,))
        return {row[0] for row in rows}

    def pages(self, job_id: str) -> Iterator[StoredPage]:
        after = -1
        while True:
            rows = self._db().execute(
                "SELECT page_index, data FROM pages WHERE job_id = ? AND page_index > ? "
                "ORDER BY page_index LIMIT ?", (job_id, after, PAGE_BATCH)).fetchall()
            for row in rows:
                yield StoredPage(row[0], row[1])
            if len(rows) < PAGE_BATCH:
                return
            after = rows[-1][0]

    def failed_pages(self, job_id: str) -> list[dict]:
        rows = self._db().execute("SELECT data FROM pages WHERE job_id = ? AND failed = 1 "
                                  "ORDER BY page_index", (job_id,))
        return [json.loads(StoredPage(0, row[0]).failure()) for row in rows]

    # ---- ends --------------------------------------------------------------------------------
    def finish(self, job_id: str, token: str, state: str, error_code: int, error_msg: str,
               expires_at: float, callback_due: bool, client: str,
               now: float | None = None) -> bool:
        now = time.time() if now is None else now
        with self._write() as db:
            cursor = db.execute(
                "UPDATE jobs SET state = ?, error_code = ?, error_msg = ?, finished = ?, "
                "expires_at = ?, lease_token = '', lease_until = 0, callback_state = ?, "
                "next_at = ? WHERE id = ? AND lease_token = ? AND state IN (?, ?)",
                (state, error_code, error_msg, now, expires_at,
                 CB_PENDING if callback_due else "", now if callback_due else None,
                 job_id, token, *ACTIVE_STATES))
        return cursor.rowcount == 1

    def callback_done(self, job_id: str, token: str, state: str, attempts: int,
                      next_at: float) -> bool:
        with self._write() as db:
            cursor = db.execute(
                "UPDATE jobs SET callback_state = ?, callback_attempts = ?, lease_token = '', "
                "lease_until = 0, next_at = ? WHERE id = ? AND lease_token = ?",
                (state, attempts, next_at if state == CB_PENDING else None, job_id, token))
        return cursor.rowcount == 1

    def cancel(self, job_id: str, expires_at: float, now: float | None = None) -> Job | None:
        now = time.time() if now is None else now
        with self._write() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return None
            job = Job.from_row(dict(row))
            if job.state in FINAL_STATES:
                return job
            db.execute("UPDATE jobs SET state = ?, finished = ?, expires_at = ?, "
                       "lease_token = '', lease_until = 0, next_at = NULL, stored_bytes = 0 "
                       "WHERE id = ?", (CANCELLED, now, expires_at, job_id))
            _delete_data(db, job_id)
        return job

    def delete(self, job_id: str) -> bool:
        with self._write() as db:
            cursor = db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            _delete_data(db, job_id)
        return cursor.rowcount == 1

    def purge_expired(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        with self._write() as db:
            ids = [row[0] for row in db.execute(
                "SELECT id FROM jobs WHERE expires_at > 0 AND expires_at <= ?", (now,))]
            for job_id in ids:
                db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
                _delete_data(db, job_id)
        return len(ids)


def _holds(db: sqlite3.Connection, job_id: str, token: str) -> bool:
    return db.execute("SELECT 1 FROM jobs WHERE id = ? AND lease_token = ? AND state IN (?, ?)",
                      (job_id, token, *ACTIVE_STATES)).fetchone() is not None


def _delete_data(db: sqlite3.Connection, job_id: str) -> None:
    db.execute("DELETE FROM documents WHERE job_id = ?", (job_id,))
    db.execute("DELETE FROM pages WHERE job_id = ?", (job_id,))


def _expired(job: Job, now: float | None) -> bool:
    return bool(job.expires_at) and job.expires_at <= (time.time() if now is None else now)
