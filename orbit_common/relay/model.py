"""The relay's values and pure rules: subscription specs and their validation, webhook secrets,
the backoff, the public views. No SQL here (subscriptions.py, fanout.py, deliveries.py)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import enum
import hashlib
import secrets
from typing import Any

import attrs

from orbit_common import errors
from orbit_common.db.clock import UTC, as_utc
from orbit_common.model import endpoints, jsondoc, names
from orbit_common.model.sealing import Sealer


class Kind(enum.StrEnum):
    PULL = "PULL"
    WEBHOOK = "WEBHOOK"


class SubscriptionState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    DISABLED = "DISABLED"


class DeliveryState(enum.StrEnum):
    PENDING = "PENDING"
    LEASED = "LEASED"
    ACKNOWLEDGED = "ACKNOWLEDGED"
    EXHAUSTED = "EXHAUSTED"


RESULT_STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "NEEDS_REVIEW")
MAX_FILTER_ITEMS = 64
HANDLER_MAX = 128
MAX_ATTEMPTS_CEILING = 1000
BACKOFF_CEILING_MS = 7 * 24 * 3600 * 1000
LEASE_MIN_MS = 1000
LEASE_MAX_MS = 3600 * 1000
DEFAULT_MAX_ATTEMPTS = 20
DEFAULT_BACKOFF_INITIAL_MS = 1000
DEFAULT_BACKOFF_MAX_MS = 3600 * 1000
DEFAULT_LEASE_MS = 30_000
ERROR_MAX = 1024  # characters kept of a failure's text (orbit_deliveries.last_error)
REASON_MAX = 1024
BUDGET_ADD_MAX = 1000
ROTATION_WINDOW_DEFAULT_S = 24 * 3600
ROTATION_WINDOW_MAX_S = 7 * 24 * 3600
SECRET_PREFIX = "whsec_"  # noqa: S105 - the Standard Webhooks prefix, not a secret
SECRET_MIN_BYTES = 24
SECRET_MAX_BYTES = 64
SECRET_NEW_BYTES = 32


# --- errors (stable codes, docs/api/errors.md) --------------------------------------------------


class SubscriptionNotFound(errors.NotFound):
    """No such subscription, one in another namespace, or one whose queues the credential may
    not see (not told apart)."""

    code = "subscription_not_found"
    title = "No such subscription for this credential"


class SubscriptionDisabled(errors.Conflict):
    code = "subscription_disabled"
    title = "Subscription disabled"


class SubscriptionNotActive(errors.Conflict):
    """Leasing from a PAUSED or DISABLED subscription."""

    code = "subscription_not_active"
    title = "The subscription is not active"


class DeliveryNotFound(errors.NotFound):
    code = "delivery_not_found"
    title = "No such delivery of this subscription"


class DeliveryLeaseLost(errors.Conflict):
    """The token is not the delivery's current lease token, or the lease lapsed: the delivery
    will be (or was) delivered again; the consumer must not treat it as acknowledged."""

    code = "delivery_lease_lost"
    title = "The delivery's lease is lost"


class NotPullSubscription(errors.Conflict):
    """Only a PULL subscription's deliveries are leased by consumers (the pump sends a
    WEBHOOK subscription's)."""

    code = "subscription_not_pull"
    title = "The subscription is not a pull subscription"


class DeliveryNotExhausted(errors.Conflict):
    code = "delivery_not_exhausted"
    title = "Only an exhausted delivery can be given more budget"


class EndpointRefused(errors.BadRequest):
    """The webhook endpoint breaks the operator's endpoint policy (SSRF protection)."""

    code = "endpoint_refused"
    title = "The endpoint is not allowed"


class WebhooksUnavailable(errors.ServiceUnavailable):
    """No ``[delivery] secret_key`` is configured: webhook secrets cannot be sealed."""

    code = "webhooks_unavailable"
    title = "Webhook subscriptions need the operator's [delivery] secret_key"


# --- settings -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class RelaySettings:
    """What management commands need from the operator's ``[delivery]`` section."""

    policy: endpoints.EndpointPolicy = attrs.Factory(endpoints.EndpointPolicy)
    sealer: Sealer | None = None

    def require_sealer(self) -> Sealer:
        if self.sealer is None:
            raise WebhooksUnavailable()
        return self.sealer


# --- secrets ------------------------------------------------------------------------------------


def new_secret() -> str:
    """A fresh signing secret in the Standard Webhooks format."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_NEW_BYTES)).decode()


def check_secret(text: Any, path: str) -> str:
    """A caller-supplied secret: ``whsec_`` + base64 of 24–64 bytes."""
    message = (f"{SECRET_PREFIX} followed by the base64 of {SECRET_MIN_BYTES}-"
               f"{SECRET_MAX_BYTES} random bytes")
    if not isinstance(text, str) or not text.startswith(SECRET_PREFIX) or len(text) > 200:
        raise errors.ValidationFailed([{"path": path, "message": message}])
    try:
        raw = base64.b64decode(text[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise errors.ValidationFailed([{"path": path, "message": message}]) from exc
    if not SECRET_MIN_BYTES <= len(raw) <= SECRET_MAX_BYTES:
        raise errors.ValidationFailed([{"path": path, "message": message}])
    return text


def secret_binding(namespace_id: bytes, subscription_id: bytes) -> bytes:
    """The associated data that ties a sealed secret to its subscription row."""
    return b"orbit.subscription.secret.v1:" + namespace_id + subscription_id


def seal_secret(sealer: Sealer, namespace_id: bytes, subscription_id: bytes, secret: str
                ) -> bytes:
    return sealer.seal(secret.encode("ascii"), secret_binding(namespace_id, subscription_id))


def signing_secrets(sealer: Sealer, row: dict[str, Any], now: dt.datetime) -> list[str]:
    """The secrets a webhook is signed with at ``now`` (database time): the current one, and
    the previous one while its rotation window lasts. For the pump; never for an API answer."""
    binding = secret_binding(row["namespace_id"], row["id"])
    found = []
    if row["secret_ciphertext"] is not None:
        found.append(sealer.open(row["secret_ciphertext"], binding).decode("ascii"))
    until = row["previous_secret_expires_at"]
    if row["previous_secret_ciphertext"] is not None and until is not None \
            and as_utc(until) > now:
        found.append(sealer.open(row["previous_secret_ciphertext"], binding).decode("ascii"))
    return found


# --- specs --------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Filters:
    queues: tuple[str, ...] = ()  # queue names (stored as ids); empty: every queue
    states: tuple[str, ...] = ()  # empty: every result state
    handlers: tuple[str, ...] = ()  # empty: every handler

    def canonical(self) -> dict[str, Any]:
        return {"queues": sorted(self.queues), "states": sorted(self.states),
                "handlers": sorted(self.handlers)}


@attrs.frozen(kw_only=True)
class Policy:
    """The delivery policy: budget, backoff and lease."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_initial_ms: int = DEFAULT_BACKOFF_INITIAL_MS
    backoff_max_ms: int = DEFAULT_BACKOFF_MAX_MS
    lease_ms: int = DEFAULT_LEASE_MS

    def canonical(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class SubscriptionSpec:
    """A validated create request."""

    name: str
    kind: Kind
    endpoint_url: str | None
    filters: Filters
    policy: Policy
    start_after_sequence: int | None  # None: from now
    secret: str | None  # a caller-supplied secret (webhook); None: generated

    def canonical(self) -> dict[str, Any]:
        """The request digest's input: a supplied secret only as its own SHA-256 (the digest
        of the whole request is all the idempotency record keeps)."""
        return {"name": self.name, "kind": self.kind.value, "endpoint_url": self.endpoint_url,
                "filters": self.filters.canonical(), "policy": self.policy.canonical(),
                "start_after_sequence": self.start_after_sequence,
                "secret_sha256": None if self.secret is None
                else hashlib.sha256(self.secret.encode()).hexdigest()}


@attrs.frozen(kw_only=True)
class UpdateSpec:
    """A validated update: None keeps the current value."""

    revision: int
    endpoint_url: str | None
    filters: Filters | None
    max_attempts: int | None
    backoff_initial_ms: int | None
    backoff_max_ms: int | None
    lease_ms: int | None

    def canonical(self) -> dict[str, Any]:
        return {"revision": self.revision, "endpoint_url": self.endpoint_url,
                "filters": None if self.filters is None else self.filters.canonical(),
                "max_attempts": self.max_attempts,
                "backoff_initial_ms": self.backoff_initial_ms,
                "backoff_max_ms": self.backoff_max_ms, "lease_ms": self.lease_ms}


def _int(doc: dict[str, Any], key: str, low: int, high: int,
         problems: list[dict[str, str]]) -> int | None:
    if key not in doc or doc[key] is None:
        return None
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        problems.append({"path": f"$.{key}", "message": f"an integer from {low} to {high}"})
        return None
    return value


def _strings(value: Any, path: str, valid: Any, rule: str,
             problems: list[dict[str, str]]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_FILTER_ITEMS:
        problems.append({"path": path, "message": f"a list of at most {MAX_FILTER_ITEMS} items"})
        return ()
    found: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not valid(item):
            problems.append({"path": f"{path}[{index}]", "message": rule})
        elif item in found:
            problems.append({"path": f"{path}[{index}]", "message": "listed twice"})
        else:
            found.append(item)
    return tuple(found)


def _handler_ok(text: str) -> bool:
    return 1 <= len(text) <= HANDLER_MAX and text.isprintable()


def parse_filters(doc: Any, problems: list[dict[str, str]], path: str = "$.filters") -> Filters:
    if doc is None:
        return Filters()
    if not isinstance(doc, dict):
        problems.append({"path": path, "message": "an object with queues, states, handlers"})
        return Filters()
    unknown = sorted(set(doc) - {"queues", "states", "handlers"})
    for key in unknown:
        problems.append({"path": f"{path}.{key}", "message": "unknown field"})
    return Filters(
        queues=_strings(doc.get("queues"), f"{path}.queues", names.is_valid_name,
                        names.NAME_RULE, problems),
        states=_strings(doc.get("states"), f"{path}.states", RESULT_STATES.__contains__,
                        f"one of {', '.join(RESULT_STATES)}", problems),
        handlers=_strings(doc.get("handlers"), f"{path}.handlers", _handler_ok,
                          f"a handler name of 1-{HANDLER_MAX} printable characters", problems),
    )


def _policy_fields(doc: dict[str, Any], problems: list[dict[str, str]]
                   ) -> tuple[int | None, int | None, int | None, int | None]:
    return (_int(doc, "max_attempts", 1, MAX_ATTEMPTS_CEILING, problems),
            _int(doc, "backoff_initial_ms", 0, BACKOFF_CEILING_MS, problems),
            _int(doc, "backoff_max_ms", 0, BACKOFF_CEILING_MS, problems),
            _int(doc, "lease_ms", LEASE_MIN_MS, LEASE_MAX_MS, problems))


def check_policy(policy: Policy) -> Policy:
    if policy.backoff_max_ms < policy.backoff_initial_ms:
        raise errors.ValidationFailed([{"path": "$.backoff_max_ms",
                                        "message": "at least backoff_initial_ms"}])
    return policy


def check_endpoint(url: Any, policy: endpoints.EndpointPolicy) -> str:
    try:
        return endpoints.check_url(url, policy)
    except endpoints.EndpointRefused as exc:
        raise EndpointRefused(f"$.endpoint_url: {exc}", path="$.endpoint_url") from exc


CREATE_FIELDS = frozenset({"name", "kind", "endpoint_url", "filters", "max_attempts",
                           "backoff_initial_ms", "backoff_max_ms", "lease_ms",
                           "start_after_sequence", "secret"})
UPDATE_FIELDS = frozenset({"revision", "endpoint_url", "filters", "max_attempts",
                           "backoff_initial_ms", "backoff_max_ms", "lease_ms"})


def _object(doc: Any, allowed: frozenset[str], problems: list[dict[str, str]]) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise errors.ValidationFailed([{"path": "$", "message": "an object"}])
    for key in sorted(set(doc) - allowed):
        problems.append({"path": f"$.{key}", "message": "unknown field"})
    return doc


def parse_create(doc: Any, policy: endpoints.EndpointPolicy) -> SubscriptionSpec:
    """Validate a create body (everything but what needs the database: queues, the stream's
    position, the name's uniqueness)."""
    problems: list[dict[str, str]] = []
    doc = _object(doc, CREATE_FIELDS, problems)
    name = doc.get("name")
    if not isinstance(name, str) or not names.is_valid_name(name):
        problems.append({"path": "$.name", "message": names.NAME_RULE})
    kind_text = doc.get("kind")
    kind = Kind(kind_text) if kind_text in (Kind.PULL, Kind.WEBHOOK) else None
    if kind is None:
        problems.append({"path": "$.kind", "message": "PULL or WEBHOOK"})
    filters = parse_filters(doc.get("filters"), problems)
    attempts, initial, ceiling, lease = _policy_fields(doc, problems)
    start = _int(doc, "start_after_sequence", 0, 2**62, problems)
    url = doc.get("endpoint_url")
    secret = doc.get("secret")
    if kind is Kind.PULL:
        if url is not None:
            problems.append({"path": "$.endpoint_url", "message": "only for WEBHOOK"})
        if secret is not None:
            problems.append({"path": "$.secret", "message": "only for WEBHOOK"})
    elif kind is Kind.WEBHOOK and url is None:
        problems.append({"path": "$.endpoint_url", "message": "required for WEBHOOK"})
    if problems or kind is None or not isinstance(name, str):
        raise errors.ValidationFailed(problems)
    if secret is not None:
        check_secret(secret, "$.secret")
    if kind is Kind.WEBHOOK:
        url = check_endpoint(url, policy)
    base = Policy()
    chosen = check_policy(Policy(
        max_attempts=base.max_attempts if attempts is None else attempts,
        backoff_initial_ms=base.backoff_initial_ms if initial is None else initial,
        backoff_max_ms=(max(base.backoff_max_ms, initial or 0) if ceiling is None
                        else ceiling),
        lease_ms=base.lease_ms if lease is None else lease))
    return SubscriptionSpec(name=name, kind=kind, endpoint_url=url, filters=filters,
                            policy=chosen, start_after_sequence=start, secret=secret)


def parse_update(doc: Any, policy: endpoints.EndpointPolicy) -> UpdateSpec:
    """Validate an update body (fields left out keep their value; ``revision`` is required)."""
    problems: list[dict[str, str]] = []
    doc = _object(doc, UPDATE_FIELDS, problems)
    revision = _int(doc, "revision", 1, 2**62, problems)
    if revision is None and not any(p["path"] == "$.revision" for p in problems):
        problems.append({"path": "$.revision", "message": "required"})
    filters = parse_filters(doc["filters"], problems) if "filters" in doc else None
    attempts, initial, ceiling, lease = _policy_fields(doc, problems)
    if problems or revision is None:
        raise errors.ValidationFailed(problems)
    url = doc.get("endpoint_url")
    if url is not None:
        url = check_endpoint(url, policy)
    return UpdateSpec(revision=revision, endpoint_url=url, filters=filters,
                      max_attempts=attempts, backoff_initial_ms=initial,
                      backoff_max_ms=ceiling, lease_ms=lease)


def check_reason(reason: Any, *, required: bool) -> str | None:
    if reason is None or reason == "":
        if required:
            raise errors.ValidationFailed([{"path": "$.reason", "message": "required"}])
        return None
    if not isinstance(reason, str) or len(reason) > REASON_MAX:
        raise errors.ValidationFailed([{"path": "$.reason",
                                        "message": f"at most {REASON_MAX} characters"}])
    return reason


# --- rules --------------------------------------------------------------------------------------


def backoff_ms(attempts_used: int, initial_ms: int, max_ms: int) -> int:
    """The wait after the ``attempts_used``-th failed attempt: initial × 2^(n-1), capped."""
    if attempts_used <= 0 or initial_ms <= 0:
        return 0
    exponent = min(attempts_used - 1, 40)
    return min(max_ms, initial_ms * (1 << exponent))


def truncate(text: str | None) -> str | None:
    return None if text is None else text[:ERROR_MAX]


def matches(filters: dict[str, Any], queue_id: bytes, state: str, handler: str | None) -> bool:
    """Whether a result event passes a stored filter document (queue ids in hex)."""
    queues = filters.get("queue_ids") or []
    if queues and queue_id.hex() not in queues:
        return False
    states = filters.get("states") or []
    if states and state not in states:
        return False
    handlers = filters.get("handlers") or []
    return not handlers or handler in handlers


def stored_filters(filters: Filters, queue_ids: dict[str, bytes]) -> str:
    """The filter document stored in ``orbit_subscriptions.filters``."""
    return jsondoc.dumps({"queue_ids": sorted(queue_ids[q].hex() for q in filters.queues),
                          "states": sorted(filters.states),
                          "handlers": sorted(filters.handlers)})


def iso(value: dt.datetime | None) -> str | None:
    """The API's spelling of a time: ISO 8601 in UTC with microseconds."""
    return None if value is None else as_utc(value).astimezone(UTC).isoformat(
        timespec="microseconds")


def subscription_view(row: dict[str, Any], queue_names: dict[bytes, str]) -> dict[str, Any]:
    """The public representation of a subscription; never a secret."""
    filters = jsondoc.loads_strict(row["filters"])
    return {
        "id": row["id"].hex(), "name": row["name"], "kind": row["kind"],
        "endpoint_url": row["endpoint_url"],
        "filters": {
            "queues": sorted(queue_names.get(bytes.fromhex(q), q)
                             for q in filters.get("queue_ids", [])),
            "states": filters.get("states", []), "handlers": filters.get("handlers", []),
        },
        "max_attempts": row["max_attempts"], "backoff_initial_ms": row["backoff_initial_ms"],
        "backoff_max_ms": row["backoff_max_ms"], "lease_ms": row["lease_ms"],
        "start_after_sequence": row["start_after_sequence"],
        "scan_after_sequence": row["scan_after_sequence"], "backlog": row["backlog"],
        "state": row["state"], "revision": row["revision"],
        "owner_application_id": row["owner_application_id"].hex(),
        "previous_secret_valid_until": iso(row["previous_secret_expires_at"]),
        "circuit": {"state": row["circuit_state"],
                    "open_until": iso(row["circuit_open_until"]),
                    "consecutive_failures": row["consecutive_failures"]},
        "created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"]),
        "disabled_at": iso(row["disabled_at"]),
    }


def delivery_view(row: dict[str, Any]) -> dict[str, Any]:
    """A delivery in a history list (no snapshot, no token)."""
    return {
        "id": row["id"].hex(), "subscription_id": row["subscription_id"].hex(),
        "event_id": row["event_id"].hex(), "sequence": row["sequence"],
        "task_id": row["task_id"].hex(), "task_revision": row["task_revision"],
        "state": row["state"], "attempts_used": row["attempts_used"],
        "max_attempts": row["max_attempts"], "available_at": iso(row["available_at"]),
        "lease_expires_at": iso(row["lease_expires_at"]),
        "last_error": None if row["last_error"] is None and row["last_status_code"] is None
        else {"status_code": row["last_status_code"], "body": row["last_error"],
              "duration_ms": row["last_duration_ms"]},
        "created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"]),
        "acknowledged_at": iso(row["acknowledged_at"]),
        "exhausted_at": iso(row["exhausted_at"]),
    }
