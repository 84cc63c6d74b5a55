"""Orbit's Python SDK: an async API client and an automatic task worker.

>>> from orbit_sdk import Client, Worker, RetryableError, OutcomeUnknown

See ``docs/sdk.md`` in the Orbit repository for the how-to.
"""

from orbit_sdk.client import UNSET, Client, TaskRequest, new_idempotency_key
from orbit_sdk.context import Context, Grant
from orbit_sdk.errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    Forbidden,
    IdempotencyConflict,
    NotFound,
    OrbitError,
    OutcomeUnknown,
    ProtocolError,
    RetryableError,
    ServerError,
    ServiceUnavailable,
    SessionLost,
    StaleRevision,
    Unauthorized,
    ValidationError,
)
from orbit_sdk.jsonvalue import RawJson
from orbit_sdk.models import Attempt, Evidence, Queue, RetryPolicy, Task, TaskEvent, Whoami
from orbit_sdk.worker import Handler, Worker

__version__ = "0.1.0"

__all__ = [
    "UNSET",
    "Attempt",
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Context",
    "Evidence",
    "Forbidden",
    "Grant",
    "Handler",
    "IdempotencyConflict",
    "NotFound",
    "OrbitError",
    "OutcomeUnknown",
    "ProtocolError",
    "Queue",
    "RawJson",
    "RetryPolicy",
    "RetryableError",
    "ServerError",
    "ServiceUnavailable",
    "SessionLost",
    "StaleRevision",
    "Task",
    "TaskEvent",
    "TaskRequest",
    "Unauthorized",
    "ValidationError",
    "Whoami",
    "Worker",
    "new_idempotency_key",
]
