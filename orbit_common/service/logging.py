"""JSON logs on stderr: one object per line with time, level, logger, message and extras.

No credential, cookie or lease token reaches a log line: every formatted line (message, extras
and traceback alike, whichever logger wrote it — aiohttp's included) passes through
:func:`redact`, which keeps an API key's public prefix and replaces its secret, and replaces the
value of a ``Bearer``/``Basic`` credential, an ``Authorization`` or ``Cookie`` header and a
``token`` field.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
from typing import Any

_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

REDACTED = "[redacted]"
_SECRETS = (
    # An API key (orb_<12 hex prefix>_<secret>): the prefix is public and names the credential.
    (re.compile(r"\borb_(?:([0-9a-f]{12})_)?[A-Za-z0-9_-]*"),
     lambda m: f"orb_{m.group(1) + '_' if m.group(1) else ''}{REDACTED}"),
    # A credential after its scheme, a header's value, a token field (lease tokens).
    # (a backslash escape, as in the repr of a header's bytes, does not end a value)
    (re.compile(r"(?i)\b(bearer|basic)(\s+)(?:[^\s\"'\\,;]|\\[^rn\s\"'])+"),
     lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}"),
    (re.compile(r"(?i)\b(authorization|proxy-authorization|cookie|set-cookie)"
                r"([\"']?\s*[:=]\s*[\"']?)(?:[^\"'\\\r\n]|\\[^rn\"'])+"),
     lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}"),
    (re.compile(r"(?i)\b(\w*token)([\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9_\-]{8,}"),
     lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}"),
)


def redact(line: str) -> str:
    """``line`` without the secrets it may hold (see the module docstring)."""
    for pattern, replace in _SECRETS:
        line = pattern.sub(replace, line)
    return line


class RedactingFormatter(logging.Formatter):
    """A text formatter whose lines pass through :func:`redact`."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="microseconds"
            ),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(doc, default=str, ensure_ascii=False))


def configure_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
