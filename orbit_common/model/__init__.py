"""Shared primitives: ids, digests and JSON documents."""
