"""Structured logging: human text or one JSON object per line, with the event's fields as keys.

Callers log through the standard `logging` module and pass fields in `extra={"fields": {...}}`, so the message stays
readable in text mode and every field is a key in JSON mode.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

LOGGER_NAME = "spec_advisor"


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


def fields(**values: Any) -> dict[str, Any]:
    """`extra=` for a structured log call: `log.info("msg", extra=fields(target="a"))`."""
    return {"fields": values}


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    values = getattr(record, "fields", None)
    return dict(values) if isinstance(values, dict) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (RFC 3339 UTC), level, logger, msg, the record's fields, exc_info if any."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds").replace(
                "+00:00", "Z"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        payload.update(_record_fields(record))
        if record.exc_info:
            payload["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`time level logger msg key=value ...` for people."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{key}={value}" for key, value in _record_fields(record).items())
        if not extra:
            return line
        head, sep, tail = line.partition("\n")  # keep a traceback below the fields
        return f"{head} {extra}{sep}{tail}"


def configure_logging(
    *, log_format: Literal["text", "json"], level: str, stream: TextIO | None = None
) -> logging.Handler:
    """Route the sidecar's loggers to `stream` (stderr by default) in the chosen format; returns the handler."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger(LOGGER_NAME)
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
    return handler
