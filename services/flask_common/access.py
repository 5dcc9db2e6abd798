"""Who may call a service, checked before any route runs (both services, each with its own
policy from its config):

- API keys, optional: with keys configured, every path except a short explicit list of open
  ones (the probes; on the gateway also its web page) needs `Authorization: Bearer <key>` or
  `X-API-Key: <key>`, else 401 with `WWW-Authenticate` and the JSON envelope. Several keys
  are accepted at once, so a key can be rotated without downtime. The presented key is
  compared with every configured one in constant time (SHA-256 digests, so neither the
  length nor the position of a match shows in the timing).
- /metrics on a port of its own, optional: gunicorn then binds both ports, the metrics port
  answers /metrics only (without a key: keep it off the public network) and the main port
  answers /metrics with 404. The port a request came in on is the socket's (gunicorn's
  SERVER_PORT), not the client's Host header."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from flask import Flask, request
from werkzeug.exceptions import NotFound

from services.ocr_api.errors import ApiError
from services.ocr_api.headers import API_KEY as API_KEY_HEADER

PROBE_PATHS = frozenset({"/healthz", "/readyz"})
_MAX_KEY_CHARS = 512


@dataclass(frozen=True)
class AccessPolicy:
    keys: tuple[str, ...] = ()  # accepted keys; none: no authentication
    open_paths: frozenset[str] = PROBE_PATHS  # exact paths served without a key
    open_prefixes: tuple[str, ...] = ()  # e.g. the web page's static files
    metrics_port: int | None = None  # /metrics only there (and only /metrics there)
    realm: str = "ocrfleet"

    def __repr__(self) -> str:  # never the keys themselves, e.g. in a log line
        return (f"AccessPolicy(keys={len(self.keys)}, open_paths={sorted(self.open_paths)}, "
                f"open_prefixes={self.open_prefixes}, metrics_port={self.metrics_port})")

    def is_open(self, path: str) -> bool:
        return path in self.open_paths or path.startswith(self.open_prefixes)


class KeyCheck:
    """Constant-time membership of a presented key among the configured ones."""

    def __init__(self, keys: tuple[str, ...]):
        self._digests = tuple(_digest(key) for key in keys)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def accepts(self, presented: str | None) -> bool:
        if presented is None or len(presented) > _MAX_KEY_CHARS:
            return False
        digest = _digest(presented)
        matched = False
        for expected in self._digests:  # every key, no early exit
            matched |= hmac.compare_digest(digest, expected)
        return matched


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def presented_key(headers) -> str | None:
    """The key from `Authorization: Bearer <key>` (scheme case-insensitive) or `X-API-Key`."""
    authorization = headers.get("Authorization", "")
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    key = headers.get(API_KEY_HEADER, "").strip()
    return key or None


def install_access_control(app: Flask, policy: AccessPolicy) -> None:
    """A before_request hook enforcing `policy` (register after the hook that sets logIds, so a
    401 carries one)."""
    check = KeyCheck(policy.keys)
    metrics_port = None if policy.metrics_port is None else str(policy.metrics_port)

    @app.before_request
    def _access():
        path = request.path
        if metrics_port is not None:
            on_metrics_port = request.environ.get("SERVER_PORT") == metrics_port
            if on_metrics_port != (path == "/metrics"):
                raise NotFound()
            if on_metrics_port:
                return None
        if not check or request.method == "OPTIONS" or policy.is_open(path):
            return None
        presented = presented_key(request.headers)
        if check.accepts(presented):
            return None
        if presented is None:
            raise ApiError(401, "This server requires an API key: send it as "
                                "`Authorization: Bearer <key>` or `X-API-Key: <key>`",
                           {"WWW-Authenticate": f'Bearer realm="{policy.realm}"'})
        raise ApiError(401, "The API key is not valid",
                       {"WWW-Authenticate":
                        f'Bearer realm="{policy.realm}", error="invalid_token"'})
