"""SHA-256 digests (BINARY(32) columns) with domain separation."""

from __future__ import annotations

import hashlib


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def domain_digest(domain: str, *parts: bytes) -> bytes:
    """SHA-256 over a domain tag and length-prefixed parts, so no two inputs collide by framing."""
    h = hashlib.sha256()
    tag = domain.encode()
    h.update(len(tag).to_bytes(4, "big") + tag)
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)
    return h.digest()
