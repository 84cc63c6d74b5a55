"""orbit_sdk.webhooks.verify against signatures made by the ``standardwebhooks`` package."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks import Webhook

from orbit_sdk import WebhookVerificationError, webhooks

BODY = (b'{"type":"task.result","id":"0123456789abcdef0123456789abcdef",'
        b'"snapshot":{"result":{"amount":12345678901234567890.123456789}}}')


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def signed(secret: str, body: bytes = BODY, *, msg_id: str = "msg_1",
           at: int | None = None) -> dict[str, str]:
    """Headers as the reference implementation signs them."""
    timestamp = int(time.time()) if at is None else at
    signature = Webhook(secret).sign(msg_id, dt.datetime.fromtimestamp(timestamp, tz=dt.UTC),
                                     body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature}


def test_a_reference_signature_verifies() -> None:
    secret = new_secret()
    document = webhooks.verify(secret, signed(secret), BODY)
    assert document["type"] == "task.result"
    # Header names are case-free; the body may be given as text.
    upper = {k.upper(): v for k, v in signed(secret).items()}
    assert webhooks.verify(secret, upper, BODY.decode()) == document


def test_sign_matches_the_reference() -> None:
    secret = new_secret()
    headers = signed(secret, at=1_700_000_000)
    assert webhooks.sign(secret, "msg_1", 1_700_000_000, BODY) == headers["webhook-signature"]


def test_exact_numbers() -> None:
    secret = new_secret()
    document = webhooks.verify(secret, signed(secret), BODY, exact_numbers=True)
    assert document["snapshot"]["result"]["amount"] == decimal.Decimal(
        "12345678901234567890.123456789")


def test_any_of_several_signatures_and_secrets_matches() -> None:
    current, previous, unknown = new_secret(), new_secret(), new_secret()
    now = int(time.time())
    both = signed(current, at=now)
    both["webhook-signature"] += " " + signed(previous, at=now)["webhook-signature"]
    assert webhooks.verify(current, both, BODY)  # Orbit's rotation window: two signatures
    assert webhooks.verify(previous, both, BODY)
    assert webhooks.verify([unknown, previous], both, BODY)  # the receiver's own rotation
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        webhooks.verify(unknown, both, BODY)


def test_the_whsec_prefix_is_optional_and_bytes_are_accepted() -> None:
    key = os.urandom(32)
    secret = "whsec_" + base64.b64encode(key).decode()
    headers = signed(secret)
    assert webhooks.verify(secret.removeprefix("whsec_"), headers, BODY)
    assert webhooks.verify(key, headers, BODY)


@pytest.mark.parametrize("change", ["body", "id", "timestamp", "secret", "version"])
def test_tampering_is_refused(change: str) -> None:
    secret = new_secret()
    now = int(time.time())
    headers = signed(secret, at=now)
    body = BODY
    if change == "body":
        body = BODY.replace(b"123456789}", b"123456780}")
    elif change == "id":
        headers["webhook-id"] = "msg_2"
    elif change == "timestamp":
        headers["webhook-timestamp"] = str(now - 1)
    elif change == "secret":
        secret = new_secret()
    else:
        headers["webhook-signature"] = headers["webhook-signature"].replace("v1,", "v2,")
    with pytest.raises(WebhookVerificationError):
        webhooks.verify(secret, headers, body)


def test_stale_and_future_timestamps_are_refused() -> None:
    secret = new_secret()
    now = 1_700_000_000
    headers = signed(secret, at=now)
    assert webhooks.verify(secret, headers, BODY, now=now + 300)
    assert webhooks.verify(secret, headers, BODY, now=now - 300)
    with pytest.raises(WebhookVerificationError, match="tolerance"):
        webhooks.verify(secret, headers, BODY, now=now + 301)
    with pytest.raises(WebhookVerificationError, match="tolerance"):
        webhooks.verify(secret, headers, BODY, now=now - 301)
    assert webhooks.verify(secret, headers, BODY, now=now + 3600, tolerance=3600)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_headers_are_refused(missing: str) -> None:
    secret = new_secret()
    headers = signed(secret)
    del headers[missing]
    with pytest.raises(WebhookVerificationError, match=f"missing {missing}"):
        webhooks.verify(secret, headers, BODY)


def test_malformed_headers_and_bodies_are_refused() -> None:
    secret = new_secret()
    headers = signed(secret)
    for bad in ("v1,!!!", "v1", "garbage", "v1, "):
        with pytest.raises(WebhookVerificationError):
            webhooks.verify(secret, {**headers, "webhook-signature": bad}, BODY)
    with pytest.raises(WebhookVerificationError, match="Unix seconds"):
        webhooks.verify(secret, {**headers, "webhook-timestamp": "1.5e9"}, BODY)
    for body in (b"[1]", b"not json"):
        with pytest.raises(WebhookVerificationError, match="JSON"):
            webhooks.verify(secret, signed(secret, body), body)


def test_a_malformed_secret_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="base64"):
        webhooks.verify("whsec_***", signed(new_secret()), BODY)
    with pytest.raises(ValueError, match="empty"):
        webhooks.verify("whsec_", signed(new_secret()), BODY)
    with pytest.raises(ValueError, match="no webhook secret"):
        webhooks.verify([], signed(new_secret()), BODY)


@settings(max_examples=200, deadline=None)
@given(key=st.binary(min_size=1, max_size=64),
       msg_id=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1,
                      max_size=40).filter(lambda s: s.strip() == s and "\n" not in s),
       at=st.integers(min_value=0, max_value=4_000_000_000),
       document=st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=20),
                                max_size=5))
def test_verify_agrees_with_the_reference(key: bytes, msg_id: str, at: int,
                                          document: dict[str, object]) -> None:
    secret = "whsec_" + base64.b64encode(key).decode()
    body = json.dumps(document, ensure_ascii=False).encode()
    headers = signed(secret, body, msg_id=msg_id, at=at)
    assert webhooks.verify(secret, headers, body, now=at) == document
    assert webhooks.sign(key, msg_id, at, body) == headers["webhook-signature"]
    flipped = bytes([key[0] ^ 1]) + key[1:]
    with pytest.raises(WebhookVerificationError):
        webhooks.verify(flipped, headers, body, now=at)
