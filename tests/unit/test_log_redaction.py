"""Log lines never hold a credential, cookie or lease token (issue 11 §9): whatever a logger
writes — message, extras, traceback — passes through the redaction of the formatter."""

from __future__ import annotations

import logging

import pytest

from orbit_common.service.logging import JsonFormatter, RedactingFormatter, redact

# A fixed value shaped like a secret: the parameter ids must be the same in every xdist worker.
SECRET = "Kci-oAtq7LXlVYvkIFdMPeXZdUwmSUtC9ju48S5qbAM"


def _record(msg: str, *args: object, exc: BaseException | None = None,
            **extra: object) -> logging.LogRecord:
    record = logging.makeLogRecord({"name": "aiohttp.server", "levelno": logging.ERROR,
                                    "levelname": "ERROR", "msg": msg, "args": args, **extra})
    if exc is not None:
        record.exc_info = (type(exc), exc, None)
    return record


@pytest.mark.parametrize("formatter", [JsonFormatter("api"), RedactingFormatter("%(message)s")])
def test_every_part_of_a_line_is_redacted(formatter: logging.Formatter) -> None:
    header = f"Authorization: Bearer orb_0123456789ab_{SECRET}\x01tail".encode()
    record = _record("Error handling request %r", header,
                     exc=ValueError(f"Invalid header value char: {header!r}"),
                     token=SECRET, cookie=f"session={SECRET}")
    line = formatter.format(record)
    assert SECRET not in line
    assert SECRET[:12] not in line
    assert "Error handling request" in line


@pytest.mark.parametrize(("text", "kept"), [
    (f"Authorization: Bearer orb_0123456789ab_{SECRET}", "Authorization: [redacted]"),
    (f"key orb_0123456789ab_{SECRET} refused", "key orb_0123456789ab_[redacted] refused"),
    (f"orb_malformed_{SECRET}", "orb_[redacted]"),
    (f"bearer {SECRET}", "bearer [redacted]"),
    (f"Cookie: a={SECRET}; b=1", "Cookie: [redacted]"),
    (f'{{"lease_token": "{SECRET}"}}', '{"lease_token": "[redacted]"}'),
    (f"Bearer abc\\x01{SECRET} tail", "Bearer [redacted] tail"),
])
def test_what_is_redacted_and_what_stays(text: str, kept: str) -> None:
    assert redact(text) == kept


def test_ordinary_lines_are_untouched() -> None:
    for line in ("api started", "orbit_common.service.runner", "tokens: 5",
                 "request refused by the HTTP parser: malformed_http_request (BadHttpMessage)"):
        assert redact(line) == line
