"""Verify Orbit's webhook deliveries (Standard Webhooks, https://www.standardwebhooks.com/).

>>> from orbit_sdk import webhooks
>>> delivery = webhooks.verify(secret, request.headers, await request.read())

Orbit signs every delivery attempt with the subscription's secret(s):

* ``webhook-id``: the delivery id (use it, or the body's ``event_id``, to deduplicate);
* ``webhook-timestamp``: Unix seconds when the attempt was signed;
* ``webhook-signature``: space-separated ``v1,<base64>`` signatures, where each is
  ``HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>")`` and ``key`` is the base64
  decoding of the secret after its ``whsec_`` prefix. During a secret rotation Orbit signs with
  the new and the old secret, so either one verifies.

The receiver may also hold several secrets (its own rotation: pass a list). Verification checks
the signature over the raw body bytes -- verify *before* parsing, never a re-serialised body --
compares in constant time and refuses timestamps more than ``tolerance`` seconds away from now
(replays of old deliveries). No dependency beyond the standard library.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping, Sequence
from typing import Any

from orbit_sdk import jsonvalue

__all__ = ["SECRET_PREFIX", "WebhookVerificationError", "sign", "verify"]

SECRET_PREFIX = "whsec_"  # noqa: S105 -- the format marker, not a secret
DEFAULT_TOLERANCE_S = 300


class WebhookVerificationError(Exception):
    """The delivery is not authentic (or not fresh): answer 401 and do not process it."""


def _key(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        key = secret
    else:
        text = secret.removeprefix(SECRET_PREFIX)
        try:
            key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except binascii.Error:
            raise ValueError("a webhook secret is 'whsec_' followed by base64") from None
    if not key:
        raise ValueError("a webhook secret may not be empty")
    return key


def _mac(key: bytes, msg_id: str, timestamp: str, body: bytes) -> bytes:
    return hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()


def sign(secret: str | bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature (for tests of a receiver; Orbit signs deliveries itself)."""
    mac = _mac(_key(secret), msg_id, str(timestamp), body)
    return "v1," + base64.b64encode(mac).decode("ascii")


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:  # a plain dict may carry another spelling; HTTP names are case-free
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    if not value:
        raise WebhookVerificationError(f"missing {name} header")
    return value


def verify(secret: str | bytes | Sequence[str | bytes], headers: Mapping[str, str],
           body: bytes | str, *, tolerance: float = DEFAULT_TOLERANCE_S,
           exact_numbers: bool = False, now: float | None = None) -> dict[str, Any]:
    """Check a delivery's signature and freshness; return its JSON body as a dict.

    ``secret``: the subscription's ``whsec_…`` secret, or several (any one may match).
    ``headers``: the request headers (any mapping; names are matched case-insensitively).
    ``body``: the raw request body. ``exact_numbers``: fractional numbers of the result
    arrive as :class:`decimal.Decimal` (as with the client). ``now`` (Unix seconds) is for
    tests.
    Raises :class:`WebhookVerificationError` for a missing header, a bad or stale timestamp, no
    matching signature, or a body that is not a JSON object.
    """
    secrets = [secret] if isinstance(secret, str | bytes) else list(secret)
    if not secrets:
        raise ValueError("no webhook secret given")
    keys = [_key(s) for s in secrets]
    raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    msg_id = _header(headers, "webhook-id")
    timestamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    if not timestamp.isascii() or not timestamp.isdigit():
        raise WebhookVerificationError("webhook-timestamp is not integer Unix seconds")
    current = time.time() if now is None else now
    if abs(current - int(timestamp)) > tolerance:
        raise WebhookVerificationError("webhook-timestamp is outside the tolerance")
    expected = [_mac(key, msg_id, timestamp, raw) for key in keys]
    matched = False
    for versioned in signatures.split(" "):
        version, _, encoded = versioned.partition(",")
        if version != "v1" or not encoded:
            continue
        try:
            given = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            continue
        for mac in expected:  # no early exit: the work does not depend on which key matched
            matched |= hmac.compare_digest(mac, given)
    if not matched:
        raise WebhookVerificationError("no matching signature")
    try:
        document = jsonvalue.loads(raw, exact_numbers=exact_numbers)
    except ValueError:
        raise WebhookVerificationError("the body is not JSON") from None
    if not isinstance(document, dict):
        raise WebhookVerificationError("the body is not a JSON object")
    return document
