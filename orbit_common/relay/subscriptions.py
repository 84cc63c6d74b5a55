"""Subscription management: create, get, list, update (CAS), pause/resume, disable, rotate the
webhook secret. Every command is one transaction, audited, idempotent with an
``Idempotency-Key`` (platform/namespaced.py) and authorized inside the transaction.

Authorization: a subscription's scope is its queue filter (every queue: ``"*"``, which only a
grant with queues ``"*"`` covers). An action on a subscription needs the action on every queue
of its scope; a subscription whose scope the grants cover for no subscription action is not
found (no existence leak). Creating or re-filtering one also needs ``tasks.read`` on every
queue it will read: a subscription never delivers results its owner may not read.

Secrets (WEBHOOK): generated here (or supplied by the caller in the Standard Webhooks format),
sealed with the operator's key bound to the row, returned once in the create or rotate answer
and never stored in plaintext — not even in the idempotency record: a replay of a create or a
rotation answers without the secret (rotate again if it was lost).

Locks: the subscription row (commands on one), nothing else; the result stream is read
without a lock (platform/results.committed_next_sequence).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs

from orbit_common import errors
from orbit_common.db import errors as dberrors
from orbit_common.db.batch import placeholders
from orbit_common.db.clock import db_now, to_db
from orbit_common.db.pool import Database
from orbit_common.model import cursors, ids, jsondoc, names
from orbit_common.platform import authz, credentials, namespaced, results
from orbit_common.platform.audit import Actor, AuditRecord, append_audit
from orbit_common.platform.events import append_event
from orbit_common.platform.idempotency import Replay
from orbit_common.pulse import tasks
from orbit_common.relay import model
from orbit_common.relay.model import (
    Kind,
    RelaySettings,
    SubscriptionDisabled,
    SubscriptionNotFound,
    SubscriptionSpec,
    SubscriptionState,
    UpdateSpec,
)

READ = authz.Action.SUBSCRIPTIONS_READ
MANAGE = authz.Action.SUBSCRIPTIONS_MANAGE
CONSUME = authz.Action.SUBSCRIPTIONS_CONSUME
SUBSCRIPTION_ACTIONS = (READ, MANAGE, CONSUME)
EVERY_QUEUE = "*"
PAGE_MAX = 500

COLUMNS = (
    "namespace_id, id, name, owner_application_id, created_by_credential_id, kind,"
    " endpoint_url, filters, start_after_sequence, scan_after_sequence, backlog, max_attempts,"
    " backoff_initial_ms, backoff_max_ms, lease_ms, state, revision, secret_ciphertext,"
    " previous_secret_ciphertext, previous_secret_expires_at, circuit_state,"
    " circuit_open_until, consecutive_failures, created_at, updated_at, disabled_at"
)
BY_NAME = f"SELECT {COLUMNS} FROM orbit_subscriptions WHERE namespace_id = %s AND name = %s"
BY_ID = f"SELECT {COLUMNS} FROM orbit_subscriptions WHERE namespace_id = %s AND id = %s"
INSERT = """
INSERT INTO orbit_subscriptions (namespace_id, id, name, owner_application_id,
  created_by_credential_id, kind, endpoint_url, filters, start_after_sequence,
  scan_after_sequence, backlog, max_attempts, backoff_initial_ms, backoff_max_ms, lease_ms,
  state, revision, secret_ciphertext, created_at, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, %s, %s, %s, %s, 'ACTIVE', 1, %s, %s, %s)
"""
QUEUE_NAMES = "SELECT id, name FROM pulse_queues WHERE namespace_id = %s AND id IN ({})"


# --- scope --------------------------------------------------------------------------------------


def filter_queue_ids(row: dict[str, Any]) -> list[bytes]:
    return [bytes.fromhex(q) for q in jsondoc.loads_strict(row["filters"]).get("queue_ids", [])]


async def queue_names(cur: Any, namespace_id: bytes, queue_ids: Iterable[bytes]
                      ) -> dict[bytes, str]:
    wanted = sorted(set(queue_ids))
    if not wanted:
        return {}
    await cur.execute(QUEUE_NAMES.format(placeholders(len(wanted))), (namespace_id, *wanted))
    return {r["id"]: r["name"] for r in await cur.fetchall()}


def scope_of(queue_ids: Sequence[bytes], named: dict[bytes, str]) -> list[str]:
    """The queues a subscription's grants are checked on (``"*"``: every queue)."""
    if not queue_ids:
        return [EVERY_QUEUE]
    return [named.get(q, q.hex()) for q in queue_ids]


def allows(grants: Iterable[authz.Grant], action: authz.Action, namespace: str,
           scope: Sequence[str]) -> bool:
    grants = tuple(grants)
    return all(authz.allowed(grants, action.value, namespace, q) for q in scope)


async def in_scope(cur: Any, principal: credentials.Principal, action: authz.Action,
                   namespace: str, row: dict[str, Any]) -> dict[bytes, str]:
    """Check ``action`` on the subscription ``row`` (see the module docstring); returns the
    names of its filter's queues."""
    grants = await credentials.recheck_principal(cur, principal)
    queue_ids = filter_queue_ids(row)
    named = await queue_names(cur, row["namespace_id"], queue_ids)
    scope = scope_of(queue_ids, named)
    if allows(grants, action, namespace, scope):
        return named
    if not any(allows(grants, seen, namespace, scope) for seen in SUBSCRIPTION_ACTIONS):
        raise SubscriptionNotFound(f"no subscription named {row['name']!r} in this namespace")
    raise errors.Forbidden(f"the credential may not {action.value} subscription"
                           f" {row['name']!r}")


async def _filter_queues(cur: Any, principal: credentials.Principal, namespace: str,
                         namespace_id: bytes, filters: model.Filters) -> dict[str, bytes]:
    """A new filter's queues: the credential must manage subscriptions on, and read the tasks
    of, every queue it names (every queue: a ``"*"`` grant); each must exist."""
    grants = await credentials.recheck_principal(cur, principal)
    scope = list(filters.queues) or [EVERY_QUEUE]
    for queue in scope:
        if not authz.allowed(grants, MANAGE.value, namespace, queue):
            raise errors.Forbidden(f"the credential may not {MANAGE.value} on queue {queue!r}")
        if not authz.allowed(grants, authz.Action.TASKS_READ.value, namespace, queue):
            raise errors.Forbidden(
                f"the credential may not read the results of queue {queue!r}: a subscription"
                " can only filter on queues its owner may read")
    if not filters.queues:
        return {}
    found = await tasks.queues_by_name(cur, namespace_id, list(filters.queues))
    for index, queue in enumerate(filters.queues):
        if queue not in found:
            raise errors.QueueNotFound(f"$.filters.queues[{index}]: no queue {queue!r} in this"
                                       " namespace", path=f"$.filters.queues[{index}]")
    return {name: q.id for name, q in found.items()}


async def _locked(cur: Any, namespace_id: bytes, name: str) -> dict[str, Any]:
    await cur.execute(BY_NAME + " FOR UPDATE", (namespace_id, name))
    row = await cur.fetchone()
    if not names.found(row, "name", name):
        raise SubscriptionNotFound(f"no subscription named {name!r} in this namespace")
    return dict(row)


async def find(cur: Any, namespace_id: bytes, name: str) -> dict[str, Any]:
    """The subscription named ``name`` (plain read), or SubscriptionNotFound."""
    await cur.execute(BY_NAME, (namespace_id, name))
    row = await cur.fetchone()
    if not names.found(row, "name", name):
        raise SubscriptionNotFound(f"no subscription named {name!r} in this namespace")
    return dict(row)


def _locate(principal: credentials.Principal, action: authz.Action, namespace: str,
            name: str) -> namespaced.Locate:
    """The subscription's 404 or 403 before any idempotency replay (namespaced.run)."""

    async def locate(cur: Any, namespace_id: bytes) -> None:
        await in_scope(cur, principal, action, namespace, await find(cur, namespace_id, name))

    return locate


async def _view(cur: Any, namespace_id: bytes, subscription_id: bytes) -> dict[str, Any]:
    await cur.execute(BY_ID, (namespace_id, subscription_id))
    row = await cur.fetchone()
    return model.subscription_view(
        row, await queue_names(cur, namespace_id, filter_queue_ids(row)))


class Acting(Protocol):
    """Who runs a command: a credential's principal (API) or an :class:`Operator` (CLI)."""

    @property
    def actor(self) -> Actor: ...

    @property
    def application_id(self) -> bytes: ...


@attrs.frozen(kw_only=True)
class Operator:
    """An operator acting on a namespace's subscriptions (``orbit admin subscriptions``):
    audited as the operator, under the namespace's application; no credential to check."""

    actor: Actor
    application_id: bytes


async def _record(cur: Any, principal: Acting, namespace_id: bytes,  # noqa: PLR0917
                  subscription_id: bytes, revision: int, action: str,
                  before: dict[str, Any] | None, after: dict[str, Any],
                  reason: str | None, request_id: str | None) -> None:
    """The command's state event and audit record, committed with it."""
    await append_event(cur, namespace_id=namespace_id, aggregate_type="subscription",
                       aggregate_id=subscription_id, aggregate_revision=revision,
                       event_type=action, from_state=before["state"] if before else None,
                       to_state=after["state"], payload={"reason": reason} if reason else {})
    await append_audit(cur, AuditRecord(
        actor=principal.actor, action=action, resource_type="subscription",
        resource_id=subscription_id, resource_revision=revision, namespace_id=namespace_id,
        application_id=principal.application_id, reason=reason, before=before, after=after,
        request_id=request_id))


def _audit_doc(view: dict[str, Any]) -> dict[str, Any]:
    keep = ("name", "kind", "endpoint_url", "filters", "max_attempts", "backoff_initial_ms",
            "backoff_max_ms", "lease_ms", "state", "revision")
    return {k: view[k] for k in keep}


# --- commands -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Created:
    """A create or rotate answer. ``secret`` is set only for the request that made it (never
    for a replay); the routes add it to the body they send."""

    replay: Replay
    secret: str | None = attrs.field(default=None, repr=False)


async def create_subscription(db: Database, principal: credentials.Principal,
                              settings: RelaySettings, *, namespace: str,
                              spec: SubscriptionSpec, idempotency_key: str | None = None,
                              request_id: str | None = None) -> Created:
    """A new ACTIVE subscription owned by the caller's application, starting after the stream's
    last committed sequence (or ``spec.start_after_sequence``, which may not pass it). 201."""
    subscription_id = ids.new_id()
    secret = None
    if spec.kind is Kind.WEBHOOK:
        settings.require_sealer()  # 503 before anything else when no key is configured
        secret = spec.secret or model.new_secret()
    idem = namespaced.request("subscriptions.create", idempotency_key, spec.name.encode(),
                              spec.canonical(), principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        queue_ids = await _filter_queues(cur, principal, namespace, namespace_id, spec.filters)
        last = await results.committed_next_sequence(cur, namespace_id) - 1
        start = last if spec.start_after_sequence is None else spec.start_after_sequence
        if start > last:
            raise errors.ValidationFailed([{
                "path": "$.start_after_sequence",
                "message": f"at most the stream's last committed sequence ({last})"}])
        ciphertext = None
        if secret is not None:
            ciphertext = model.seal_secret(settings.require_sealer(), namespace_id,
                                           subscription_id, secret)
        now = await db_now(cur)
        try:
            await cur.execute(INSERT, (
                namespace_id, subscription_id, spec.name, principal.application_id,
                principal.credential_id, spec.kind.value, spec.endpoint_url,
                model.stored_filters(spec.filters, queue_ids), start, start,
                spec.policy.max_attempts, spec.policy.backoff_initial_ms,
                spec.policy.backoff_max_ms, spec.policy.lease_ms, ciphertext, to_db(now),
                to_db(now)))
        except Exception as exc:
            if dberrors.is_duplicate(exc, "uq_subscriptions_name"):
                raise errors.AlreadyExists(f"subscription {spec.name!r} already exists") from exc
            raise
        view = await _view(cur, namespace_id, subscription_id)
        await _record(cur, principal, namespace_id, subscription_id, 1,
                      "subscription.created", None, _audit_doc(view), None, request_id)
        return 201, view, subscription_id

    async def locate(cur: Any, namespace_id: bytes) -> None:
        await _filter_queues(cur, principal, namespace, namespace_id, spec.filters)

    replay = await namespaced.run(
        db, "subscriptions.create", principal=principal, action=MANAGE, namespace=namespace,
        idem=idem, act=act, locate=locate)
    fresh = replay.body.get("id") == subscription_id.hex()
    return Created(replay=replay, secret=secret if fresh else None)


async def update_subscription(db: Database, principal: credentials.Principal, *,
                              namespace: str, name: str, spec: UpdateSpec,
                              idempotency_key: str | None = None,
                              request_id: str | None = None) -> Replay:
    """Change the filters, the endpoint or the delivery policy; CAS on ``revision``. The
    policy applies to deliveries created from now on (an existing delivery keeps its budget);
    a new filter applies to events not yet scanned."""
    idem = namespaced.request("subscriptions.update", idempotency_key, name.encode(),
                              spec.canonical(), principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        row = await _locked(cur, namespace_id, name)
        await in_scope(cur, principal, MANAGE, namespace, row)
        if row["state"] == SubscriptionState.DISABLED:
            raise SubscriptionDisabled(f"subscription {name!r} is disabled")
        if row["revision"] != spec.revision:
            raise errors.StaleRevision(
                f"subscription {name!r} is at revision {row['revision']}, not {spec.revision}")
        if spec.endpoint_url is not None and row["kind"] != Kind.WEBHOOK:
            raise errors.ValidationFailed([{"path": "$.endpoint_url",
                                            "message": "only for WEBHOOK"}])
        filters = row["filters"]
        if spec.filters is not None:
            queue_ids = await _filter_queues(cur, principal, namespace, namespace_id,
                                             spec.filters)
            filters = model.stored_filters(spec.filters, queue_ids)

        def pick(new: int | None, column: str) -> int:
            return int(row[column]) if new is None else new

        policy = model.check_policy(model.Policy(
            max_attempts=pick(spec.max_attempts, "max_attempts"),
            backoff_initial_ms=pick(spec.backoff_initial_ms, "backoff_initial_ms"),
            backoff_max_ms=pick(spec.backoff_max_ms, "backoff_max_ms"),
            lease_ms=pick(spec.lease_ms, "lease_ms")))
        before = model.subscription_view(row, await queue_names(cur, namespace_id,
                                                                filter_queue_ids(row)))
        await cur.execute(
            "UPDATE orbit_subscriptions SET endpoint_url = %s, filters = %s, max_attempts = %s,"
            " backoff_initial_ms = %s, backoff_max_ms = %s, lease_ms = %s,"
            " revision = revision + 1, updated_at = UTC_TIMESTAMP(6)"
            " WHERE namespace_id = %s AND id = %s AND revision = %s",
            (spec.endpoint_url or row["endpoint_url"], filters, policy.max_attempts,
             policy.backoff_initial_ms, policy.backoff_max_ms, policy.lease_ms, namespace_id,
             row["id"], row["revision"]))
        view = await _view(cur, namespace_id, row["id"])
        await _record(cur, principal, namespace_id, row["id"], view["revision"],
                      "subscription.updated", _audit_doc(before), _audit_doc(view), None,
                      request_id)
        return 200, view, row["id"]

    return await namespaced.run(
        db, "subscriptions.update", principal=principal, action=MANAGE, namespace=namespace,
        idem=idem, act=act, locate=_locate(principal, MANAGE, namespace, name))


async def set_state(db: Database, principal: credentials.Principal, *, namespace: str,
                    name: str, target: SubscriptionState, reason: str | None = None,
                    idempotency_key: str | None = None,
                    request_id: str | None = None) -> Replay:
    """Pause (PAUSED: no scanning, no leasing; the backlog and leases in flight are kept),
    resume (ACTIVE) or disable (DISABLED, final: deliveries and history are kept). Repeating
    one is a no-op."""
    reason = model.check_reason(reason, required=False)
    idem = namespaced.request("subscriptions.state", idempotency_key, name.encode(),
                              {"state": target.value, "reason": reason}, principal)

    async def check(cur: Any, row: dict[str, Any]) -> None:
        await in_scope(cur, principal, MANAGE, namespace, row)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        view, subscription_id = await change_state(
            cur, principal, namespace_id, name, target, reason=reason, request_id=request_id,
            check=check)
        return 200, view, subscription_id

    return await namespaced.run(
        db, "subscriptions.state", principal=principal, action=MANAGE, namespace=namespace,
        idem=idem, act=act, locate=_locate(principal, MANAGE, namespace, name))


async def change_state(cur: Any, who: Acting, namespace_id: bytes, name: str,
                       target: SubscriptionState, *, reason: str | None,
                       request_id: str | None,
                       check: Callable[[Any, dict[str, Any]], Awaitable[None]] | None = None
                       ) -> tuple[dict[str, Any], bytes]:
    """:func:`set_state`'s change in the caller's transaction (also the operator's, in
    relay/operator.py): lock the row, ``check`` it (authorization), change and audit it.
    Returns the view and the subscription id."""
    row = await _locked(cur, namespace_id, name)
    if check is not None:
        await check(cur, row)
    if row["state"] == target:
        return await _view(cur, namespace_id, row["id"]), row["id"]
    if row["state"] == SubscriptionState.DISABLED:
        raise SubscriptionDisabled(f"subscription {name!r} is disabled; its history is"
                                   " kept")
    await cur.execute(
        "UPDATE orbit_subscriptions SET state = %s, revision = revision + 1,"
        " disabled_at = IF(%s = 'DISABLED', UTC_TIMESTAMP(6), NULL),"
        " updated_at = UTC_TIMESTAMP(6)"
        " WHERE namespace_id = %s AND id = %s AND revision = %s",
        (target.value, target.value, namespace_id, row["id"], row["revision"]))
    action = {SubscriptionState.ACTIVE: "subscription.resumed",
              SubscriptionState.PAUSED: "subscription.paused",
              SubscriptionState.DISABLED: "subscription.disabled"}[target]
    view = await _view(cur, namespace_id, row["id"])
    await _record(cur, who, namespace_id, row["id"], view["revision"], action,
                  {"state": row["state"]}, {"state": target.value}, reason, request_id)
    return view, row["id"]


async def rotate_secret(db: Database, principal: credentials.Principal,
                        settings: RelaySettings, *, namespace: str, name: str,
                        window_s: int = model.ROTATION_WINDOW_DEFAULT_S,
                        idempotency_key: str | None = None,
                        request_id: str | None = None) -> Created:
    """A new signing secret; the current one stays valid for ``window_s`` more seconds (the
    pump signs with both meanwhile, so receivers can switch without losing a delivery). 200
    with the subscription and ``previous_secret_valid_until``."""
    if isinstance(window_s, bool) or not isinstance(window_s, int) \
            or not 0 <= window_s <= model.ROTATION_WINDOW_MAX_S:
        raise errors.ValidationFailed([{
            "path": "$.window_s",
            "message": f"an integer from 0 to {model.ROTATION_WINDOW_MAX_S}"}])
    secret = model.new_secret()
    rotation_id = ids.new_id().hex()
    idem = namespaced.request("subscriptions.rotate", idempotency_key, name.encode(),
                              {"window_s": window_s}, principal)

    async def act(cur: Any, namespace_id: bytes) -> tuple[int, dict[str, Any], bytes]:
        row = await _locked(cur, namespace_id, name)
        await in_scope(cur, principal, MANAGE, namespace, row)
        if row["state"] == SubscriptionState.DISABLED:
            raise SubscriptionDisabled(f"subscription {name!r} is disabled")
        if row["kind"] != Kind.WEBHOOK:
            raise errors.ValidationFailed([{"path": "$",
                                            "message": "only a WEBHOOK subscription has a"
                                                       " secret"}])
        # After the lookups: a missing subscription is 404 and a pull one 400 whether or not
        # the operator configured the sealing key.
        sealer = settings.require_sealer()
        await cur.execute(
            "UPDATE orbit_subscriptions SET previous_secret_ciphertext = secret_ciphertext,"
            " previous_secret_expires_at = UTC_TIMESTAMP(6) + INTERVAL %s SECOND,"
            " secret_ciphertext = %s, revision = revision + 1, updated_at = UTC_TIMESTAMP(6)"
            " WHERE namespace_id = %s AND id = %s AND revision = %s",
            (window_s, model.seal_secret(sealer, namespace_id, row["id"], secret),
             namespace_id, row["id"], row["revision"]))
        view = await _view(cur, namespace_id, row["id"])
        await _record(cur, principal, namespace_id, row["id"], view["revision"],
                      "subscription.secret_rotated", {"state": row["state"]},
                      {"state": row["state"], "window_s": window_s}, None, request_id)
        return 200, {"subscription": view, "rotation_id": rotation_id,
                     "previous_secret_valid_until": view["previous_secret_valid_until"]}, \
            row["id"]

    replay = await namespaced.run(
        db, "subscriptions.rotate", principal=principal, action=MANAGE, namespace=namespace,
        idem=idem, act=act, locate=_locate(principal, MANAGE, namespace, name))
    fresh = replay.body.get("rotation_id") == rotation_id
    return Created(replay=replay, secret=secret if fresh else None)


# --- queries ------------------------------------------------------------------------------------


async def get_subscription(db: Database, principal: credentials.Principal, *, namespace: str,
                           name: str) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        ns = await credentials.authorize(cur, principal, READ, namespace)
        row = await find(cur, ns.id, name)
        named = await in_scope(cur, principal, READ, namespace, row)
        return model.subscription_view(row, named)

    return await db.read("subscriptions.get", body)


Page = cursors.Page


async def list_subscriptions(db: Database, principal: credentials.Principal, *,
                             namespace: str, limit: int = 100,
                             cursor: str | None = None) -> Page:
    """Subscriptions the credential may read, by name; ``cursor`` from the previous page."""
    if not 1 <= limit <= PAGE_MAX:
        raise errors.ValidationFailed([{"path": "limit", "message": f"1 to {PAGE_MAX}"}])
    position = ""
    if cursor is not None:
        (position,) = _name_position(cursors.decode(cursor, "subscriptions", {}))

    async def body(cur: Any) -> Page:
        ns = await credentials.authorize(cur, principal, READ, namespace)
        grants = await credentials.recheck_principal(cur, principal)
        items: list[dict[str, Any]] = []
        after = position
        for _ in range(10):  # rows of unreadable scopes are skipped: a bounded scan
            await cur.execute(f"SELECT {COLUMNS} FROM orbit_subscriptions WHERE namespace_id = %s"
                              " AND name > %s ORDER BY name LIMIT %s", (ns.id, after, limit))
            rows = list(await cur.fetchall())
            for row in rows:
                after = row["name"]
                queue_ids = filter_queue_ids(row)
                named = await queue_names(cur, ns.id, queue_ids)
                if allows(grants, READ, namespace, scope_of(queue_ids, named)):
                    items.append(model.subscription_view(row, named))
                    if len(items) == limit:
                        return Page(items=items,
                                    next_cursor=cursors.encode("subscriptions", {}, [after]))
            if len(rows) < limit:
                return Page(items=items, next_cursor=None)
        return Page(items=items, next_cursor=cursors.encode("subscriptions", {}, [after]))

    return await db.read("subscriptions.list", body)


def _name_position(position: list[Any]) -> tuple[str]:
    if len(position) != 1 or not isinstance(position[0], str) or len(position[0]) > 128:
        raise errors.InvalidCursor()
    return (position[0],)
