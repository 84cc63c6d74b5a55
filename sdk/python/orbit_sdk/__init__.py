"""Orbit's Python SDK: an async API client and an automatic task worker.

>>> from orbit_sdk import Client, Worker, RetryableError, OutcomeUnknown
>>> from orbit_sdk import webhooks  # webhooks.verify(secret, headers, body)
>>> from orbit_sdk import Subscriber  # consume a PULL result subscription

``orbit_sdk.outbox`` writes task submissions into the application's own transaction (the
transactional outbox) and sends them later with their original idempotency keys.

See ``docs/sdk.md`` in the Orbit repository for the how-to.
"""

from orbit_sdk.client import UNSET, Client, DeliveryReport, TaskRequest, new_idempotency_key
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
    QueueFull,
    QuotaExceeded,
    RetryableError,
    ServerError,
    ServiceUnavailable,
    SessionLost,
    StaleRevision,
    TooManyRequests,
    Unauthorized,
    ValidationError,
)
from orbit_sdk.jsonvalue import RawJson
from orbit_sdk.models import (
    ApplicationResources,
    Attempt,
    Delivery,
    DeliveryAttempt,
    Evidence,
    LeasedDelivery,
    Queue,
    QueueUsage,
    ResultDelivery,
    RetryPolicy,
    SecretRotation,
    Settlement,
    Subscription,
    SubscriptionFilters,
    Task,
    TaskEvent,
    TaskSource,
    Whoami,
)
from orbit_sdk.schedules import (
    BackfillResult,
    Schedule,
    ScheduleOccurrence,
    ScheduleRun,
    ScheduleVersion,
)
from orbit_sdk.subscriber import DeliveryHandler, Subscriber
from orbit_sdk.webhooks import WebhookVerificationError
from orbit_sdk.worker import Handler, Worker
from orbit_sdk.workflows import (
    WorkflowActivation,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
    WorkflowPollRound,
    WorkflowPollRounds,
    WorkflowPollState,
    WorkflowSignal,
    WorkflowStart,
    WorkflowStep,
    WorkflowTask,
    WorkflowValidation,
    WorkflowVersion,
    WorkflowWait,
)

__version__ = "0.1.0"

__all__ = [
    "UNSET",
    "ApplicationResources",
    "Attempt",
    "BackfillResult",
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Context",
    "Delivery",
    "DeliveryAttempt",
    "DeliveryHandler",
    "DeliveryReport",
    "Evidence",
    "Forbidden",
    "Grant",
    "Handler",
    "IdempotencyConflict",
    "LeasedDelivery",
    "NotFound",
    "OrbitError",
    "OutcomeUnknown",
    "ProtocolError",
    "Queue",
    "QueueFull",
    "QueueUsage",
    "QuotaExceeded",
    "RawJson",
    "ResultDelivery",
    "RetryPolicy",
    "RetryableError",
    "Schedule",
    "ScheduleOccurrence",
    "ScheduleRun",
    "ScheduleVersion",
    "SecretRotation",
    "ServerError",
    "ServiceUnavailable",
    "SessionLost",
    "Settlement",
    "StaleRevision",
    "Subscriber",
    "Subscription",
    "SubscriptionFilters",
    "Task",
    "TaskEvent",
    "TaskRequest",
    "TaskSource",
    "TooManyRequests",
    "Unauthorized",
    "ValidationError",
    "WebhookVerificationError",
    "Whoami",
    "Worker",
    "WorkflowActivation",
    "WorkflowDefinition",
    "WorkflowEvent",
    "WorkflowInstance",
    "WorkflowPollRound",
    "WorkflowPollRounds",
    "WorkflowPollState",
    "WorkflowSignal",
    "WorkflowStart",
    "WorkflowStep",
    "WorkflowTask",
    "WorkflowValidation",
    "WorkflowVersion",
    "WorkflowWait",
    "new_idempotency_key",
]
