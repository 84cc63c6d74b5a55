"""``orbit admin subscriptions``: the real CLI as a subprocess, acting as an operator through the
same domain changes as the API (audited with the operator and the reason)."""

from __future__ import annotations

import json
from typing import Any

from orbit_common.db.pool import Database, DatabaseUrl
from orbit_common.relay import deliveries
from tests.conftest import Tenant
from tests.integration.test_admin_cli import ACTOR, ok, orbit_admin
from tests.support import relay
from tests.support.lease_fixtures import make_queue


async def _audit(db: Database, resource_id: bytes) -> list[dict[str, Any]]:
    return await relay.rows(db, "SELECT action, actor_kind, actor_id, reason, application_id"
                            " FROM orbit_audit_events WHERE resource_id = %s", resource_id)


async def test_list_get_pause_resume_disable(db: Database, db_url: DatabaseUrl,
                                             tenant: Tenant) -> None:
    created = await relay.subscribe(db, tenant, "sub")
    await relay.subscribe(db, tenant, "sub-2")
    listed = await ok(db_url, "subscriptions", "list", "--namespace", tenant.namespace)
    lines = [json.loads(line) for line in listed.out.splitlines()]
    assert [(s["name"], s["state"], s["backlog"]) for s in lines] == [
        ("sub", "ACTIVE", 0), ("sub-2", "ACTIVE", 0)]
    got = (await ok(db_url, "subscriptions", "get", "sub", "--namespace",
                    tenant.namespace)).json()
    assert got["id"] == created.replay.body["id"]

    paused = (await ok(db_url, "subscriptions", "pause", "sub", "--namespace",
                       tenant.namespace, "--reason", "receiver down")).json()
    assert paused["state"] == "PAUSED"
    resumed = (await ok(db_url, "subscriptions", "resume", "sub", "--namespace",
                        tenant.namespace, "--reason", "receiver back")).json()
    assert resumed["state"] == "ACTIVE"
    disabled = (await ok(db_url, "subscriptions", "disable", "sub", "--namespace",
                         tenant.namespace, "--reason", "retired")).json()
    assert disabled["state"] == "DISABLED"
    refused = await orbit_admin(db_url, "subscriptions", "pause", "sub", "--namespace",
                                tenant.namespace, "--reason", "again")
    assert refused.code != 0
    assert "subscription_disabled" in refused.err

    found = [r for r in await _audit(db, bytes.fromhex(got["id"]))
             if r["actor_kind"] == "operator"]
    assert sorted((r["action"], r["reason"]) for r in found) == [
        ("subscription.disabled", "retired"), ("subscription.paused", "receiver down"),
        ("subscription.resumed", "receiver back")]
    assert {(r["actor_id"], r["application_id"]) for r in found} == {
        (ACTOR, tenant.application_id)}


async def test_add_budget_to_an_exhausted_delivery(db: Database, db_url: DatabaseUrl,
                                                   tenant: Tenant) -> None:
    queue = await make_queue(db, tenant, name="q1")
    await relay.subscribe(db, tenant, max_attempts=1)
    await relay.cancelled_results(db, tenant, queue, 1)
    await relay.fan_out_all(db, tenant)
    (leased,) = await relay.lease(db, tenant)
    who = await relay.principal_of(db, tenant.api_key)
    await deliveries.fail_delivery(db, who, namespace=tenant.namespace, name="sub",
                                   delivery_id=leased.delivery_id, token=leased.token,
                                   error=deliveries.AttemptError(body="down"))
    args = ("subscriptions", "add-budget", "sub", leased.delivery_id.hex(), "--namespace",
            tenant.namespace)
    missing_reason = await orbit_admin(db_url, *args)
    assert missing_reason.code != 0
    given = (await ok(db_url, *args, "--attempts", "2", "--reason", "fixed")).json()
    assert (given["state"], given["attempts_used"], given["max_attempts"]) == ("PENDING", 1, 3)
    assert (await relay.subscription_row(db, tenant))["backlog"] == 1
    again = await orbit_admin(db_url, *args, "--reason", "twice")
    assert again.code != 0
    assert "delivery_not_exhausted" in again.err
    (audit,) = await _audit(db, leased.delivery_id)
    assert (audit["action"], audit["actor_kind"], audit["actor_id"], audit["reason"]) == (
        "delivery.budget_added", "operator", ACTOR, "fixed")
    unknown = await orbit_admin(db_url, "subscriptions", "add-budget", "sub", "0" * 32,
                                "--namespace", tenant.namespace, "--reason", "x")
    assert "delivery_not_found" in unknown.err
    bad_id = await orbit_admin(db_url, "subscriptions", "add-budget", "sub", "xyz",
                               "--namespace", tenant.namespace, "--reason", "x")
    assert bad_id.code != 0
    nowhere = await orbit_admin(db_url, "subscriptions", "get", "sub", "--namespace",
                                "no-such-namespace")
    assert "namespace_not_found" in nowhere.err
