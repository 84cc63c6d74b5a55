"""Webhook signatures, the Standard Webhooks way (https://www.standardwebhooks.com/).

A delivery carries three headers:

* ``webhook-id`` -- the delivery id (32 hex characters), the receiver's idempotency key;
* ``webhook-timestamp`` -- integer Unix seconds when this attempt was signed (each attempt is
  signed afresh, so a receiver's timestamp tolerance never refuses a late retry);
* ``webhook-signature`` -- ``v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>``.
  During a secret rotation window the subscription has a current and a previous secret and the
  header holds both signatures, space separated (current first): a receiver that still knows
  only the previous secret, or already only the current one, accepts the delivery.

Secrets are ``whsec_`` + base64 of the key bytes. The HMAC itself is the ``standardwebhooks``
package's, not ours.
"""

from __future__ import annotations

import datetime as dt
import functools

import attrs
from standardwebhooks import Webhook

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"


@attrs.frozen(kw_only=True)
class SigningSecrets:
    """A subscription's signing secrets: ``current``, and ``previous`` while a rotation
    window is open. ``repr`` never shows them."""

    current: str = attrs.field(repr=False)
    previous: str | None = attrs.field(default=None, repr=False)

    def signers(self) -> tuple[Webhook, ...]:
        """The ``standardwebhooks`` signers, current first (raises on a malformed secret)."""
        keys = (self.current,) if self.previous is None else (self.current, self.previous)
        return tuple(_signer(key) for key in keys)


@functools.lru_cache(maxsize=1024)
def _signer(key: str) -> Webhook:
    """One signer per secret, kept: building it decodes the secret (base64), which every
    attempt of a batch would otherwise repeat. The cache holds secrets the pump holds anyway."""
    return Webhook(key)


def signature(secrets: SigningSecrets, *, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one ``v1,…`` signature per secret, space separated."""
    when = dt.datetime.fromtimestamp(timestamp, tz=dt.UTC)
    text = body.decode("utf-8")  # the package signs text; the body is UTF-8 JSON
    return " ".join(signer.sign(msg_id, when, text) for signer in secrets.signers())


def headers(secrets: SigningSecrets, *, msg_id: str, timestamp: int,
            body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for one attempt of a delivery."""
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature(secrets, msg_id=msg_id, timestamp=timestamp, body=body),
    }
