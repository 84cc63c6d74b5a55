"""Subscription management (orbit_common/relay/subscriptions.py): commands, queries,
authorization, idempotency, sealed secrets and bad input that writes nothing."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.model import endpoints, jsondoc
from orbit_common.model.sealing import Sealer, new_key_text
from orbit_common.relay import model, subscriptions
from orbit_common.relay.model import RelaySettings, SubscriptionState
from tests.conftest import Tenant, make_key, make_tenant
from tests.support import relay
from tests.support.lease_fixtures import make_queue

HOOK = "https://hooks.example.com/orbit"


async def _who(db: Database, tenant: Tenant, api_key: str | None = None) -> Any:
    return await relay.principal_of(db, api_key or tenant.api_key)


async def _count(db: Database, tenant: Tenant) -> int:
    return len(await relay.rows(db, "SELECT id FROM orbit_subscriptions WHERE namespace_id = %s",
                                tenant.namespace_id))


async def test_create_get_list(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant, name="orders")
    await relay.cancelled_results(db, tenant, queue, 2)
    created = await relay.subscribe(db, tenant, "pull-a", filters={
        "queues": ["orders"], "states": ["FAILED", "SUCCEEDED"], "handlers": ["send"]},
        max_attempts=5, backoff_initial_ms=10, backoff_max_ms=100, lease_ms=5000)
    assert created.replay.status == 201
    assert created.secret is None
    view = created.replay.body
    assert view["filters"] == {"queues": ["orders"], "states": ["FAILED", "SUCCEEDED"],
                               "handlers": ["send"]}
    assert view["start_after_sequence"] == 2 == view["scan_after_sequence"]  # from now
    assert view["state"] == "ACTIVE"
    assert view["revision"] == 1
    assert view["backlog"] == 0
    assert view["owner_application_id"] == tenant.application_id.hex()
    assert (view["max_attempts"], view["backoff_initial_ms"], view["backoff_max_ms"],
            view["lease_ms"]) == (5, 10, 100, 5000)
    await relay.subscribe(db, tenant, "pull-b", start_after_sequence=0)
    hook = await relay.subscribe(db, tenant, "hook", kind="WEBHOOK", endpoint_url=HOOK)
    assert hook.secret is not None
    assert hook.secret.startswith("whsec_")
    assert len(base64.b64decode(hook.secret[6:])) == model.SECRET_NEW_BYTES
    assert "secret" not in jsondoc.dumps(hook.replay.body).replace(
        "previous_secret_valid_until", "")
    who = await _who(db, tenant)
    got = await subscriptions.get_subscription(db, who, namespace=tenant.namespace,
                                               name="pull-a")
    assert got == view
    page = await subscriptions.list_subscriptions(db, who, namespace=tenant.namespace, limit=2)
    assert [s["name"] for s in page.items] == ["hook", "pull-a"]
    assert page.next_cursor is not None
    rest = await subscriptions.list_subscriptions(db, who, namespace=tenant.namespace, limit=2,
                                                  cursor=page.next_cursor)
    assert [s["name"] for s in rest.items] == ["pull-b"]
    assert rest.next_cursor is None
    with pytest.raises(model.SubscriptionNotFound):
        await subscriptions.get_subscription(db, who, namespace=tenant.namespace, name="nope")
    audit = await relay.rows(db, "SELECT action FROM orbit_audit_events WHERE namespace_id = %s"
                             " AND resource_type = 'subscription'", tenant.namespace_id)
    assert [a["action"] for a in audit] == ["subscription.created"] * 3


async def test_the_secret_is_sealed_and_bound_to_its_row(db: Database, tenant: Tenant) -> None:
    created = await relay.subscribe(db, tenant, "hook", kind="WEBHOOK", endpoint_url=HOOK)
    assert created.secret is not None
    row = await relay.subscription_row(db, tenant, "hook")
    raw = created.secret.encode()
    assert raw not in row["secret_ciphertext"]
    for table in ("orbit_subscriptions", "orbit_audit_events", "orbit_events",
                  "orbit_idempotency_keys"):
        dump = jsondoc.dumps([{k: (v.hex() if isinstance(v, bytes) else str(v))
                               for k, v in r.items()}
                              for r in await relay.rows(db, f"SELECT * FROM {table}")])
        assert created.secret not in dump
    sealer = relay.SETTINGS.sealer
    assert sealer is not None
    now = row["created_at"]
    from orbit_common.db.clock import as_utc

    assert model.signing_secrets(sealer, row, as_utc(now)) == [created.secret]
    moved = dict(row, id=bytes(16))  # another row's binding does not open it
    with pytest.raises(ValueError, match="does not open"):
        model.signing_secrets(sealer, moved, as_utc(now))


async def test_a_supplied_secret_and_oversized_secrets(db: Database, tenant: Tenant) -> None:
    good = "whsec_" + base64.b64encode(b"k" * 24).decode()
    created = await relay.subscribe(db, tenant, "hook", kind="WEBHOOK", endpoint_url=HOOK,
                                    secret=good)
    assert created.secret == good
    for bad in ("whsec_" + base64.b64encode(b"k" * 65).decode(),
                "whsec_" + base64.b64encode(b"k" * 23).decode(), "nope", "whsec_***", 5):
        with pytest.raises(errors.ValidationFailed):
            await relay.subscribe(db, tenant, "hook2", kind="WEBHOOK", endpoint_url=HOOK,
                                  secret=bad)
    assert await _count(db, tenant) == 1
    # The same key with another supplied secret is another request.
    who = await _who(db, tenant)
    policy = endpoints.EndpointPolicy()
    first = model.parse_create({"name": "h3", "kind": "WEBHOOK", "endpoint_url": HOOK,
                                "secret": good}, policy)
    other = model.parse_create({"name": "h3", "kind": "WEBHOOK", "endpoint_url": HOOK,
                                "secret": "whsec_" + base64.b64encode(b"j" * 24).decode()},
                               policy)
    await subscriptions.create_subscription(db, who, relay.SETTINGS, namespace=tenant.namespace,
                                            spec=first, idempotency_key="s-1")
    with pytest.raises(errors.IdempotencyConflict):
        await subscriptions.create_subscription(db, who, relay.SETTINGS,
                                                namespace=tenant.namespace, spec=other,
                                                idempotency_key="s-1")


async def test_webhooks_need_the_operators_key(db: Database, tenant: Tenant) -> None:
    with pytest.raises(model.WebhooksUnavailable):
        await relay.subscribe(db, tenant, "hook", kind="WEBHOOK", endpoint_url=HOOK,
                              settings=RelaySettings())
    await relay.subscribe(db, tenant, "pull", settings=RelaySettings())  # pull needs none
    assert await _count(db, tenant) == 1
    # Without the key, rotating still answers for the subscription first: missing → 404, a
    # pull one (no secret to rotate) → 400; only a webhook one is 503.
    who = await _who(db, tenant)
    with pytest.raises(model.SubscriptionNotFound):
        await subscriptions.rotate_secret(db, who, RelaySettings(), namespace=tenant.namespace,
                                          name="nowhere")
    with pytest.raises(errors.ValidationFailed):
        await subscriptions.rotate_secret(db, who, RelaySettings(), namespace=tenant.namespace,
                                          name="pull")


BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"name": "Bad Name"}, "$.name"),
    ({"kind": "SMOKE"}, "$.kind"),
    ({"filters": {"queues": "q"}}, "$.filters.queues"),
    ({"filters": {"states": ["DONE"]}}, "$.filters.states[0]"),
    ({"filters": {"handlers": [""]}}, "$.filters.handlers[0]"),
    ({"filters": {"queues": ["a", "a"]}}, "$.filters.queues[1]"),
    ({"filters": {"colour": ["red"]}}, "$.filters.colour"),
    ({"filters": []}, "$.filters"),
    ({"max_attempts": 0}, "$.max_attempts"),
    ({"max_attempts": True}, "$.max_attempts"),
    ({"lease_ms": 10}, "$.lease_ms"),
    ({"backoff_initial_ms": 500, "backoff_max_ms": 100}, "$.backoff_max_ms"),
    ({"start_after_sequence": -1}, "$.start_after_sequence"),
    ({"endpoint_url": HOOK}, "$.endpoint_url"),
    ({"kind": "WEBHOOK"}, "$.endpoint_url"),
    ({"surprise": 1}, "$.surprise"),
]


@pytest.mark.parametrize(("fields", "path"), BAD_BODIES,
                         ids=[p for _, p in BAD_BODIES])
async def test_bad_bodies_write_nothing(db: Database, tenant: Tenant, fields: dict[str, Any],
                                        path: str) -> None:
    doc = {"name": "s", "kind": "PULL", **fields}
    with pytest.raises(errors.ValidationFailed) as caught:
        model.parse_create(doc, endpoints.EndpointPolicy())
    assert path in [e["path"] for e in caught.value.errors] or caught.value.detail.startswith(
        path)
    assert caught.value.code == "validation_failed"


@pytest.mark.parametrize("url", [
    "http://hooks.example.com/x", "ftp://hooks.example.com/x", "not a url", "https://",
    "https://user:pw@hooks.example.com/", "https://127.0.0.1/", "https://10.1.2.3/",
    "https://[::1]/", "https://169.254.169.254/latest", "https://[fd00::1]/",
    "https://localhost/", "https://hooks.example.com/#frag", "/relative",
    "https://" + "a" * 3000 + ".com/",
])
async def test_refused_endpoints_write_nothing(db: Database, tenant: Tenant, url: str) -> None:
    with pytest.raises(model.EndpointRefused) as caught:
        await relay.subscribe(db, tenant, "hook", kind="WEBHOOK", endpoint_url=url)
    assert caught.value.code == "endpoint_refused"
    assert caught.value.status == 400
    assert await _count(db, tenant) == 0


async def test_the_operator_may_allow_http_loopback_and_private(db: Database,
                                                               tenant: Tenant) -> None:
    loose = RelaySettings(sealer=relay.SETTINGS.sealer, policy=endpoints.EndpointPolicy(
        allow_http=True, allow_loopback=True, allow_private_networks=True))
    await relay.subscribe(db, tenant, "a", kind="WEBHOOK", endpoint_url="http://127.0.0.1:9/x",
                          settings=loose)
    await relay.subscribe(db, tenant, "b", kind="WEBHOOK", endpoint_url="https://10.0.0.5/x",
                          settings=loose)
    listed = RelaySettings(sealer=relay.SETTINGS.sealer, policy=endpoints.EndpointPolicy(
        allow_list=("*.example.com",)))
    await relay.subscribe(db, tenant, "c", kind="WEBHOOK", endpoint_url=HOOK, settings=listed)
    with pytest.raises(model.EndpointRefused):
        await relay.subscribe(db, tenant, "d", kind="WEBHOOK",
                              endpoint_url="https://example.org/x", settings=listed)
    assert await _count(db, tenant) == 3


async def test_queue_filters_must_exist_and_be_readable(db: Database, tenant: Tenant) -> None:
    await make_queue(db, tenant, name="mine")
    await make_queue(db, tenant, name="secret-q")
    with pytest.raises(errors.QueueNotFound):
        await relay.subscribe(db, tenant, filters={"queues": ["mine", "ghost"]})
    key = await make_key(db, tenant, [
        {"namespaces": ["*"], "actions": ["subscriptions.*", "tasks.read"],
         "queues": ["mine"]},
        {"namespaces": ["*"], "actions": ["subscriptions.manage"], "queues": ["secret-q"]}])
    with pytest.raises(errors.Forbidden, match="may not read"):
        await relay.subscribe(db, tenant, filters={"queues": ["secret-q"]}, api_key=key)
    with pytest.raises(errors.Forbidden):  # every queue needs a "*" grant
        await relay.subscribe(db, tenant, api_key=key)
    with pytest.raises(errors.Forbidden):  # a queue the key may not even see
        await relay.subscribe(db, tenant, filters={"queues": ["ghost"]}, api_key=key)
    assert await _count(db, tenant) == 0
    await relay.subscribe(db, tenant, filters={"queues": ["mine"]}, api_key=key)
    assert await _count(db, tenant) == 1


async def test_scoped_credentials_see_only_their_subscriptions(db: Database,
                                                               tenant: Tenant) -> None:
    await make_queue(db, tenant, name="mine")
    await make_queue(db, tenant, name="theirs")
    await relay.subscribe(db, tenant, "on-mine", filters={"queues": ["mine"]})
    await relay.subscribe(db, tenant, "on-theirs", filters={"queues": ["theirs"]})
    await relay.subscribe(db, tenant, "on-all")
    reader = await _who(db, tenant, await make_key(db, tenant, [
        {"namespaces": ["*"], "actions": ["subscriptions.read"], "queues": ["mine"]}]))
    page = await subscriptions.list_subscriptions(db, reader, namespace=tenant.namespace)
    assert [s["name"] for s in page.items] == ["on-mine"]
    for hidden in ("on-theirs", "on-all"):
        with pytest.raises(model.SubscriptionNotFound):
            await subscriptions.get_subscription(db, reader, namespace=tenant.namespace,
                                                 name=hidden)
    with pytest.raises(errors.Forbidden):  # visible, but not manageable
        await subscriptions.set_state(db, reader, namespace=tenant.namespace, name="on-mine",
                                      target=SubscriptionState.PAUSED)
    stranger = await _who(db, await make_tenant(db))
    with pytest.raises(errors.NamespaceNotFound):
        await subscriptions.get_subscription(db, stranger, namespace=tenant.namespace,
                                             name="on-all")


async def test_update_with_cas(db: Database, tenant: Tenant) -> None:
    await make_queue(db, tenant, name="q1")
    await relay.subscribe(db, tenant, kind="WEBHOOK", endpoint_url=HOOK)
    who = await _who(db, tenant)
    policy = endpoints.EndpointPolicy()
    spec = model.parse_update({"revision": 1, "filters": {"queues": ["q1"]},
                               "endpoint_url": "https://other.example.com/h",
                               "max_attempts": 3, "lease_ms": 2000}, policy)
    answer = await subscriptions.update_subscription(db, who, namespace=tenant.namespace,
                                                     name="sub", spec=spec)
    view = answer.body
    assert view["revision"] == 2
    assert view["filters"]["queues"] == ["q1"]
    assert view["endpoint_url"] == "https://other.example.com/h"
    assert view["max_attempts"] == 3
    assert view["lease_ms"] == 2000
    with pytest.raises(errors.StaleRevision):
        await subscriptions.update_subscription(db, who, namespace=tenant.namespace,
                                                name="sub", spec=spec)
    with pytest.raises(errors.ValidationFailed):
        model.parse_update({"max_attempts": 2}, policy)  # no revision
    with pytest.raises(model.EndpointRefused):
        model.parse_update({"revision": 2, "endpoint_url": "https://10.0.0.1/"}, policy)
    bad_backoff = model.parse_update({"revision": 2, "backoff_max_ms": 1}, policy)
    with pytest.raises(errors.ValidationFailed):  # below the stored initial backoff
        await subscriptions.update_subscription(db, who, namespace=tenant.namespace,
                                                name="sub", spec=bad_backoff)
    ghost = model.parse_update({"revision": 2, "filters": {"queues": ["ghost"]}}, policy)
    with pytest.raises(errors.QueueNotFound):
        await subscriptions.update_subscription(db, who, namespace=tenant.namespace,
                                                name="sub", spec=ghost)
    assert (await relay.subscription_row(db, tenant))["revision"] == 2


async def test_pause_resume_disable(db: Database, tenant: Tenant) -> None:
    await relay.subscribe(db, tenant)
    who = await _who(db, tenant)

    async def to(target: SubscriptionState, **kw: Any) -> dict[str, Any]:
        answer = await subscriptions.set_state(db, who, namespace=tenant.namespace, name="sub",
                                               target=target, **kw)
        return dict(answer.body)

    assert (await to(SubscriptionState.PAUSED, reason="maintenance"))["state"] == "PAUSED"
    assert (await to(SubscriptionState.PAUSED))["revision"] == 2  # a repeat is a no-op
    assert (await to(SubscriptionState.ACTIVE))["state"] == "ACTIVE"
    disabled = await to(SubscriptionState.DISABLED, reason="retired")
    assert disabled["state"] == "DISABLED"
    assert disabled["disabled_at"] is not None
    with pytest.raises(model.SubscriptionDisabled):
        await to(SubscriptionState.ACTIVE)
    with pytest.raises(model.SubscriptionDisabled):
        await subscriptions.update_subscription(
            db, who, namespace=tenant.namespace, name="sub",
            spec=model.parse_update({"revision": 4, "max_attempts": 2},
                                    endpoints.EndpointPolicy()))
    audit = await relay.rows(db, "SELECT action, reason FROM orbit_audit_events"
                             " WHERE namespace_id = %s AND resource_type = 'subscription'"
                             " ORDER BY occurred_at, id", tenant.namespace_id)
    assert {(a["action"], a["reason"]) for a in audit} == {
        ("subscription.created", None), ("subscription.paused", "maintenance"),
        ("subscription.resumed", None), ("subscription.disabled", "retired")}


async def test_rotation_keeps_the_old_secret_for_a_window(db: Database, tenant: Tenant) -> None:
    created = await relay.subscribe(db, tenant, kind="WEBHOOK", endpoint_url=HOOK)
    who = await _who(db, tenant)
    rotated = await subscriptions.rotate_secret(db, who, relay.SETTINGS,
                                                namespace=tenant.namespace, name="sub",
                                                window_s=3600, idempotency_key="rot-1")
    assert rotated.secret is not None
    assert rotated.secret != created.secret
    assert rotated.replay.body["previous_secret_valid_until"] is not None
    row = await relay.subscription_row(db, tenant)
    sealer = relay.SETTINGS.sealer
    assert sealer is not None
    from orbit_common.db.clock import as_utc

    now = as_utc(row["updated_at"])
    assert model.signing_secrets(sealer, row, now) == [rotated.secret, created.secret]
    later = as_utc(row["previous_secret_expires_at"])
    assert model.signing_secrets(sealer, row, later) == [rotated.secret]
    replay = await subscriptions.rotate_secret(db, who, relay.SETTINGS,
                                               namespace=tenant.namespace, name="sub",
                                               window_s=3600, idempotency_key="rot-1")
    assert replay.secret is None  # shown once: a replay does not show it again
    assert replay.replay.body == rotated.replay.body
    assert (await relay.subscription_row(db, tenant))["revision"] == 2
    with pytest.raises(errors.ValidationFailed):
        await subscriptions.rotate_secret(db, who, relay.SETTINGS, namespace=tenant.namespace,
                                          name="sub", window_s=-1)
    await relay.subscribe(db, tenant, "pull")
    with pytest.raises(errors.ValidationFailed):
        await subscriptions.rotate_secret(db, who, relay.SETTINGS, namespace=tenant.namespace,
                                          name="pull")
    other_key = RelaySettings(sealer=Sealer.from_config(new_key_text()))
    with pytest.raises(ValueError, match="does not open"):
        model.signing_secrets(other_key.sealer, row, now)  # type: ignore[arg-type]


async def test_idempotent_create(db: Database, tenant: Tenant) -> None:
    who = await _who(db, tenant)
    spec = model.parse_create({"name": "hook", "kind": "WEBHOOK", "endpoint_url": HOOK},
                              endpoints.EndpointPolicy())
    first = await subscriptions.create_subscription(db, who, relay.SETTINGS,
                                                    namespace=tenant.namespace, spec=spec,
                                                    idempotency_key="c-1")
    again = await subscriptions.create_subscription(db, who, relay.SETTINGS,
                                                    namespace=tenant.namespace, spec=spec,
                                                    idempotency_key="c-1")
    assert first.secret is not None
    assert again.secret is None
    records = await relay.rows(db, "SELECT response_body FROM orbit_idempotency_keys"
                               " WHERE namespace_id = %s", tenant.namespace_id)
    assert records
    assert all(first.secret not in r["response_body"] for r in records)
    assert again.replay.body == first.replay.body
    assert again.replay.status == 201
    other = model.parse_create({"name": "hook", "kind": "PULL"}, endpoints.EndpointPolicy())
    with pytest.raises(errors.IdempotencyConflict):
        await subscriptions.create_subscription(db, who, relay.SETTINGS,
                                                namespace=tenant.namespace, spec=other,
                                                idempotency_key="c-1")
    with pytest.raises(errors.AlreadyExists):
        await subscriptions.create_subscription(db, who, relay.SETTINGS,
                                                namespace=tenant.namespace, spec=spec)
    assert await _count(db, tenant) == 1


async def test_start_position_may_not_pass_the_stream(db: Database, tenant: Tenant) -> None:
    queue = await make_queue(db, tenant)
    await relay.cancelled_results(db, tenant, queue, 2)
    with pytest.raises(errors.ValidationFailed, match="start_after_sequence"):
        await relay.subscribe(db, tenant, start_after_sequence=3)
    created = await relay.subscribe(db, tenant, start_after_sequence=2)
    assert created.replay.body["scan_after_sequence"] == 2
