"""The platform context: applications, namespaces, credentials, idempotency, events, audit."""

PLATFORM_NAMESPACE_ID = bytes(16)
"""The all-zero namespace id used for platform-level records (idempotency, events)."""
