"""JSON log lines, one object per line, carrying the current request's `logId` so one
document can be followed through gateway and worker logs."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time

current_log_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("log_id",
                                                                           default=None)

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


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
