"""Log set-up: every record carries the id of the request it was written for (`X-Request-Id`),
as text or as one JSON object per line for log shippers."""

from __future__ import annotations

import json
import logging
from typing import Any

from raygate.server.context import REQUEST_ID

_TEXT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
# Attributes every LogRecord has; anything else was passed in `extra=` and belongs in the JSON.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "request_id"}


class RequestIdFilter(logging.Filter):
    """Gives every record the id of the request the current task serves (`-` outside one), so both formats can
    print it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line for log shippers; fields passed with `extra=` (the access log's) become keys
    of their own."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
