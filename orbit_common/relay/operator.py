"""Operator commands on subscriptions (``orbit admin subscriptions``): list, get, pause, resume,
disable, add budget. An operator has the database, not a credential: no grant is checked; the
changes go through the same domain changes as the API's commands
(subscriptions.change_state, deliveries.give_budget), audited with the operator as actor, the
namespace's application and the reason."""

from __future__ import annotations

from typing import Any

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.platform import namespaces
from orbit_common.platform.audit import Actor
from orbit_common.relay import deliveries, model, subscriptions
from orbit_common.relay.model import SubscriptionState

LIST_MAX = 1000


async def _namespace(cur: Any, name: str) -> namespaces.Namespace:
    found = await namespaces.find_namespace(cur, name)
    if found is None:
        raise errors.NamespaceNotFound(f"no namespace {name!r}")
    return found


async def _view(cur: Any, row: dict[str, Any]) -> dict[str, Any]:
    named = await subscriptions.queue_names(cur, row["namespace_id"],
                                            subscriptions.filter_queue_ids(row))
    return model.subscription_view(row, named)


async def list_subscriptions(db: Database, *, namespace: str, after: str = "",
                             limit: int = 100) -> list[dict[str, Any]]:
    """A namespace's subscriptions by name (after ``after``), every scope."""
    if not 1 <= limit <= LIST_MAX:
        raise errors.ValidationFailed([{"path": "limit", "message": f"1 to {LIST_MAX}"}])

    async def body(cur: Any) -> list[dict[str, Any]]:
        ns = await _namespace(cur, namespace)
        await cur.execute(f"SELECT {subscriptions.COLUMNS} FROM orbit_subscriptions"
                          " WHERE namespace_id = %s AND name > %s ORDER BY name LIMIT %s",
                          (ns.id, after, limit))
        return [await _view(cur, dict(row)) for row in await cur.fetchall()]

    return await db.read("relay.operator.list", body)


async def get_subscription(db: Database, *, namespace: str, name: str) -> dict[str, Any]:
    async def body(cur: Any) -> dict[str, Any]:
        ns = await _namespace(cur, namespace)
        return await _view(cur, await subscriptions.find(cur, ns.id, name))

    return await db.read("relay.operator.get", body)


async def set_state(db: Database, *, namespace: str, name: str, target: SubscriptionState,
                    actor: Actor, reason: str) -> dict[str, Any]:
    """Pause, resume or disable (repeating one is a no-op); the reason is required."""
    reason_text = model.check_reason(reason, required=True)

    async def body(cur: Any) -> dict[str, Any]:
        ns = await _namespace(cur, namespace)
        who = subscriptions.Operator(actor=actor, application_id=ns.application_id)
        view, _ = await subscriptions.change_state(cur, who, ns.id, name, target,
                                                   reason=reason_text, request_id=None)
        return view

    return await db.transaction("relay.operator.state", body)


async def add_budget(db: Database, *, namespace: str, name: str, delivery_id: bytes,
                     attempts: int, actor: Actor, reason: str) -> dict[str, Any]:
    """Give an EXHAUSTED delivery ``attempts`` more attempts (deliveries.add_budget's rules)."""
    if isinstance(attempts, bool) or not 1 <= attempts <= model.BUDGET_ADD_MAX:
        raise errors.ValidationFailed([{"path": "attempts", "message":
                                        f"an integer from 1 to {model.BUDGET_ADD_MAX}"}])
    reason_text = model.check_reason(reason, required=True)

    async def body(cur: Any) -> dict[str, Any]:
        ns = await _namespace(cur, namespace)
        who = subscriptions.Operator(actor=actor, application_id=ns.application_id)
        return await deliveries.give_budget(cur, who, ns.id, name, delivery_id,
                                            attempts=attempts, reason=reason_text,
                                            request_id=None)

    return await db.transaction("relay.operator.budget", body)
