"""Keep-alive HTTP/1.1 connections to the replicas: the gateway's hot request (a page to a
worker, a /readyz probe) on the standard library's `http.client`, a few idle connections kept
per replica URL.

Why not urllib3: every page is one request, and urllib3's layers (its pool manager's URL
parsing and keys, Retry and Timeout objects, header dictionaries) cost as much CPU again as
the request itself. A gateway core's pages per second are the fleet's routing cost
(docs/capacity.md has the figures). Nothing else changes: no retries here (gateway.flow.settle
decides), a timeout on connecting and on each read, and a connection is kept only after a
whole answer that did not say `Connection: close`.

Thread-safe: a connection is in one thread's hands from `request` until its answer is read;
the idle ones are shared under a lock. At most `per_replica` are kept idle per URL and
`replicas` URLs are remembered (the least recently used is closed: DNS moves pods)."""

from __future__ import annotations

import http.client
import select
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit


class TransportError(Exception):
    """The replica was not reached, or it broke the connection before a whole answer."""


class TransportTimeout(TransportError):
    """Connecting, sending or reading took longer than allowed."""


@dataclass(frozen=True)
class Answer:
    status: int
    data: bytes
    headers: Mapping[str, str]  # case-insensitive (http.client.HTTPMessage)


@dataclass(frozen=True)
class _Target:
    connection: type[http.client.HTTPConnection]
    host: str
    port: int | None
    prefix: str  # the URL's own path, before the request's

    @classmethod
    def of(cls, url: str) -> _Target:
        parts = urlsplit(url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else \
            http.client.HTTPConnection
        return cls(kind, parts.hostname or "", parts.port, parts.path.rstrip("/"))


class Connections:
    def __init__(self, per_replica: int, replicas: int = 256):
        self.per_replica = per_replica
        self.replicas = replicas
        self._lock = threading.Lock()
        self._idle: OrderedDict[str, tuple[_Target, list[http.client.HTTPConnection]]] = \
            OrderedDict()

    def request(self, method: str, url: str, path: str, *, headers: Mapping[str, str],
                body: bytes | None = None, connect_s: float, read_s: float) -> Answer:
        """One request to the replica at `url`; TransportTimeout or TransportError when no
        whole answer came back; ValueError without time left for either (a timeout of 0
        would make the socket non-blocking, and the replica look unreachable)."""
        if connect_s <= 0 or read_s <= 0:
            raise ValueError(f"no time left for {url}{path}")
        target, conn = self._take(url)
        try:
            if conn is None:
                conn = target.connection(target.host, target.port, timeout=connect_s)
                conn.connect()
            conn.sock.settimeout(read_s)
            try:
                conn.request(method, target.prefix + path, body=body, headers=dict(headers))
            except (BrokenPipeError, ConnectionResetError):
                pass  # it answered before it read the whole body: the answer may be there
            response = conn.getresponse()
            answer = Answer(response.status, response.read(), response.msg)
        except TimeoutError as exc:
            _close(conn)
            raise TransportTimeout(f"{type(exc).__name__}: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            _close(conn)
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        closing = response.will_close or headers.get("Connection", "").lower() == "close"
        self._put_back(url, conn, closing)
        return answer

    def close(self) -> None:
        with self._lock:
            idle = [conn for _, conns in self._idle.values() for conn in conns]
            self._idle.clear()
        for conn in idle:
            conn.close()

    def _take(self, url: str) -> tuple[_Target, http.client.HTTPConnection | None]:
        """This URL's target and an idle connection the replica has not closed, if any."""
        evicted: list[http.client.HTTPConnection] = []
        with self._lock:
            entry = self._idle.get(url)
            if entry is None:
                entry = self._idle[url] = (_Target.of(url), [])
                while len(self._idle) > self.replicas:
                    evicted += self._idle.popitem(last=False)[1][1]
            self._idle.move_to_end(url)
            target, idle = entry
            conn = None
            while idle and conn is None:
                conn = idle.pop()
                if _dropped(conn):
                    evicted.append(conn)
                    conn = None
        for old in evicted:
            old.close()
        return target, conn

    def _put_back(self, url: str, conn: http.client.HTTPConnection, closing: bool) -> None:
        with self._lock:
            entry = self._idle.get(url)
            if not closing and entry is not None and len(entry[1]) < self.per_replica:
                entry[1].append(conn)
                return
        conn.close()


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """An idle connection the replica closed (or sent something unasked on) reads at once."""
    sock = conn.sock
    if sock is None:
        return True
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _close(conn: http.client.HTTPConnection | None) -> None:
    if conn is not None:
        conn.close()
