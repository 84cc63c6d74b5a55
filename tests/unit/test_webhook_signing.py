"""Webhook signatures (orbit_delivery/signing.py) and the body they cover
(orbit_common/relay/payload.py, the one body builder)."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import os
import time

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from orbit_common.relay import payload
from orbit_delivery import signing
from orbit_delivery.pushing import WebhookPusher


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


BODY = b'{"type":"task.result","id":"ab","snapshot":{"result":{"total":"3.10"}}}'


def test_the_signature_is_hmac_sha256_over_id_timestamp_body() -> None:
    key = bytes(range(32))
    secret = "whsec_" + base64.b64encode(key).decode()
    headers = signing.headers(signing.SigningSecrets(current=secret), msg_id="msg_1",
                              timestamp=1_700_000_000, body=BODY)
    expected = base64.b64encode(
        hmac.new(key, b"msg_1.1700000000." + BODY, hashlib.sha256).digest()).decode()
    assert headers == {"webhook-id": "msg_1", "webhook-timestamp": "1700000000",
                       "webhook-signature": f"v1,{expected}"}


def test_the_package_verifies_what_we_sign() -> None:
    secret = new_secret()
    now = int(time.time())
    headers = signing.headers(signing.SigningSecrets(current=secret), msg_id="d1",
                              timestamp=now, body=BODY)
    assert Webhook(secret).verify(BODY, headers) == json.loads(BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY + b" ", headers)


def test_a_rotation_window_signs_with_both_secrets() -> None:
    current, previous = new_secret(), new_secret()
    headers = signing.headers(signing.SigningSecrets(current=current, previous=previous),
                              msg_id="d2", timestamp=int(time.time()), body=BODY)
    signatures = headers["webhook-signature"].split(" ")
    assert len(signatures) == 2
    assert all(s.startswith("v1,") for s in signatures)
    # A receiver that knows either secret accepts; one that knows neither refuses.
    assert Webhook(current).verify(BODY, headers)
    assert Webhook(previous).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(BODY, headers)
    # Current first: the single-secret signature equals the first of the pair.
    alone = signing.signature(signing.SigningSecrets(current=current), msg_id="d2",
                              timestamp=int(headers["webhook-timestamp"]), body=BODY)
    assert signatures[0] == alone


def test_secrets_never_show_in_repr() -> None:
    secret = new_secret()
    assert secret not in repr(signing.SigningSecrets(current=secret, previous=secret))


def test_the_body_follows_the_contract_and_keeps_the_snapshot_verbatim() -> None:
    snapshot = '{"task_id":"t","result":{"amount":1.10,"big":12345678901234567890}}'
    document = payload.build(
        delivery_id=b"\xdd" * 16, subscription_id=b"\x55" * 16, subscription="billing",
        namespace="prod", sequence=42, event_id=b"\xee" * 16, task_id=b"\x77" * 16,
        queue="pay", task_revision=5, state="SUCCEEDED",
        committed_at=dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC), attempt=1,
        snapshot=snapshot)
    body = payload.body(document)
    assert body.endswith(b'"snapshot":' + snapshot.encode() + b"}")
    parsed = json.loads(body)
    assert list(parsed) == [
        "type", "id", "subscription_id", "subscription", "namespace", "sequence", "event_id",
        "task_id", "queue", "task_revision", "state", "committed_at", "attempt", "snapshot"]
    assert parsed["type"] == "task.result"
    assert parsed["id"] == "dd" * 16
    assert parsed["committed_at"].startswith("2026-01-02T03:04:05.678901")


def test_the_pusher_signs_exactly_the_payload_bytes() -> None:
    secret = new_secret()
    document = payload.build(
        delivery_id=b"\x01" * 16, subscription_id=b"\x02" * 16, subscription="s",
        namespace="n", sequence=1, event_id=b"\x03" * 16, task_id=b"\x04" * 16, queue="q",
        task_revision=1, state="FAILED", committed_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        attempt=3, snapshot='{"error":{"n":1.50}}')
    body, headers = WebhookPusher.signed(document, signing.SigningSecrets(current=secret),
                                         int(time.time()))
    assert body == payload.body(document)
    assert headers["webhook-id"] == "01" * 16
    Webhook(secret).verify(body, headers)  # raises unless the signature covers these bytes
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body + b" ", headers)
