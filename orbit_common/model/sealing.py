"""Secrets sealed at rest: AES-256-GCM with a key from the operator's configuration.

A sealed value is ``nonce (12 bytes) || ciphertext || tag (16 bytes)``. The associated data
binds it to the row that holds it (e.g. namespace id + subscription id), so a ciphertext copied
into another row does not open. The key is ``[delivery] secret_key``: base64 of exactly 32
bytes (docs/configuration.md). Nothing here ever logs or returns a key.
"""

from __future__ import annotations

import base64
import binascii
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12


class SealingError(ValueError):
    """A key that is not base64 of 32 bytes, or a sealed value that does not open."""


class Sealer:
    """Seals and opens small secrets with one AES-256-GCM key."""

    __slots__ = ("_aead",)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise SealingError(f"the sealing key must be exactly {KEY_BYTES} bytes")
        self._aead = AESGCM(key)

    @classmethod
    def from_config(cls, text: str) -> Sealer:
        """The sealer of a configured key (base64 or base64url of 32 bytes)."""
        cleaned = text.strip()
        try:
            key = base64.b64decode(cleaned.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise SealingError("the sealing key is not valid base64") from exc
        return cls(key)

    def __repr__(self) -> str:
        return "Sealer(<key hidden>)"

    def seal(self, plaintext: bytes, associated: bytes) -> bytes:
        nonce = secrets.token_bytes(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plaintext, associated)

    def open(self, sealed: bytes, associated: bytes) -> bytes:
        if len(sealed) < NONCE_BYTES + 16:
            raise SealingError("the sealed value is too short")
        try:
            return self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated)
        except InvalidTag as exc:
            raise SealingError(
                "the sealed value does not open with this key (another key, or another row)"
            ) from exc


def new_key_text() -> str:
    """A fresh key in the configuration's format (for docs and ``orbit dev up``)."""
    return base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")
