"""The `logId` of the work under way, and JSON log lines that carry it, so one document can
be followed through gateway and worker logs. This module is the logId's one owner: `begin`
mints it (or takes the caller's) when a request or a job's run starts, `adopt` takes the
one a request body names, and everything else reads `current_log_id`. The gateway sends it
to a worker once, in X-Log-Id."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from urllib.parse import urlsplit, urlunsplit

from .envelope import new_log_id, usable_log_id

current_log_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("log_id",
                                                                           default=None)

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def redact_url(url: str) -> str:
    """The URL as it may be logged: user and password (a Redis password, say) as ***, and
    the query too (redis-py takes `?password=`)."""
    try:
        parts = urlsplit(url)
        query = "***" if parts.query else ""
        if parts.username is None and parts.password is None and not query:
            return url
        host = parts.hostname or ""
        netloc = (f"***@{host}" if parts.username is not None or parts.password is not None
                  else host) + (f":{parts.port}" if parts.port else "")
        if not netloc:  # unix:///path: urlunsplit would drop the empty authority
            return f"{parts.scheme}://{parts.path}" + (f"?{query}" if query else "")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "(a URL that does not parse)"


def begin(candidate: str | None = None) -> str:
    """A new unit of work (a request, a job's run): the caller's logId when it is usable,
    else a new one, carried from here on."""
    log_id = usable_log_id(candidate) or new_log_id()
    current_log_id.set(log_id)
    return log_id


def adopt(candidate: object) -> str:
    """The logId a request's body names replaces the current one when usable; the current
    one (or a new one, outside any request) otherwise."""
    log_id = usable_log_id(candidate)
    if log_id:
        current_log_id.set(log_id)
        return log_id
    return current_log_id.get() or begin()


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                  + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        log_id = getattr(record, "logId", None) or current_log_id.get()
        if log_id:
            line["logId"] = log_id
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in line and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure_json_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("paddlex", "paddleocr", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
