"""Bearer authentication: 401 problems, revocation and disabled applications take effect at once."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from orbit_common import errors
from orbit_common.db.pool import Database
from orbit_common.platform import applications, commands, credentials
from orbit_common.platform.audit import Actor
from tests.conftest import Tenant, make_key, make_tenant, unique
from tests.integration.api.conftest import WriteWatch, assert_problem

OPERATOR = Actor.operator("pytest")


def _prefix(api_key: str) -> str:
    return api_key.split("_")[1]


def _uppercase(prefix: str) -> str:
    """The prefix in uppercase hex; one of twelve digits-only prefixes (p = 0.4 %) has no letter
    to raise, so its first digit becomes an uppercase letter instead."""
    upper = prefix.upper()
    return upper if upper != prefix else "A" + prefix[1:]


def _wrong_secret(api_key: str) -> str:
    last = api_key[-1]
    return api_key[:-1] + ("A" if last != "A" else "B")


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer    ",
        "Basic dXNlcjpwYXNz",
        "Token orb_000000000000_" + "a" * 43,
        "orb_000000000000_" + "a" * 43,
    ],
)
async def test_a_missing_or_non_bearer_header_is_unauthenticated(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch, authorization: str | None
) -> None:
    writes.reset()
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in (("GET", "/v1/whoami"), ("GET", "/v1/namespaces")):
        response = await api.request(method, path, headers=headers)
        await assert_problem(response, 401, "unauthenticated")
    response = await api.post("/v1/namespaces", json={"name": unique("anon")}, headers=headers)
    await assert_problem(response, 401, "unauthenticated")
    writes.assert_unchanged()


async def test_bad_keys_are_invalid_credentials_and_all_look_the_same(
    api: TestClient[Any, Any], tenant: Tenant, writes: WriteWatch
) -> None:
    writes.reset()
    keys = {
        "malformed": "orb_nothex_secret",
        "short-secret": f"orb_{_prefix(tenant.api_key)}_short",
        "uppercase-prefix": tenant.api_key.replace(
            _prefix(tenant.api_key), _uppercase(_prefix(tenant.api_key)), 1
        ),
        "unknown-prefix": "orb_000000000000_" + "a" * 43,
        "wrong-secret": _wrong_secret(tenant.api_key),
        "key-with-suffix": tenant.api_key + "x",
        "non-ascii": tenant.api_key[:-1] + "é",
    }
    bodies = {}
    for label, key in keys.items():
        response = await api.get("/v1/whoami", headers={"Authorization": f"Bearer {key}"})
        body = await assert_problem(response, 401, "invalid_credential")
        bodies[label] = (body["title"], body["detail"])
        response = await api.post(
            "/v1/namespaces",
            json={"name": unique("bad-key")},
            headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "k"},
        )
        await assert_problem(response, 401, "invalid_credential")
    # The caller learns nothing about which part of the key was wrong.
    assert len(set(bodies.values())) == 1, bodies
    writes.assert_unchanged()


async def test_the_scheme_is_case_insensitive_and_spaces_around_the_key_are_ignored(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    for header in (f"bearer {tenant.api_key}", f"BEARER  {tenant.api_key} "):
        response = await api.get("/v1/whoami", headers={"Authorization": header})
        assert response.status == 200, await response.text()


async def test_a_revoked_credential_fails_on_the_very_next_request(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, writes: WriteWatch
) -> None:
    other_key = await make_key(db, tenant, [{"namespaces": ["*"], "actions": ["*"]}])
    response = await api.get("/v1/whoami", headers=tenant.auth)
    assert response.status == 200

    revoked = await db.transaction(
        "test.revoke",
        lambda cur: credentials.revoke_credential(
            cur, prefix=_prefix(tenant.api_key), actor=OPERATOR, reason="test"
        ),
    )
    assert revoked.state is credentials.CredentialState.REVOKED

    writes.reset()
    for method, path in (("GET", "/v1/whoami"), ("GET", "/v1/namespaces")):
        response = await api.request(method, path, headers=tenant.auth)
        await assert_problem(response, 401, "invalid_credential")
    response = await api.post("/v1/namespaces", json={"name": unique("rev")}, headers=tenant.auth)
    await assert_problem(response, 401, "invalid_credential")
    writes.assert_unchanged()

    # Only that credential: another key of the same application still works.
    response = await api.get("/v1/whoami", headers={"Authorization": f"Bearer {other_key}"})
    assert response.status == 200


async def test_revoking_twice_is_idempotent(db: Database, tenant: Tenant) -> None:
    async def revoke(reason: str) -> credentials.Credential:
        return await db.transaction(
            "test.revoke",
            lambda cur: credentials.revoke_credential(
                cur, prefix=_prefix(tenant.api_key), actor=OPERATOR, reason=reason
            ),
        )

    first = await revoke("first")
    second = await revoke("second")
    assert second == first
    assert second.revoked_reason == "first"


async def test_disabling_the_application_makes_all_its_keys_fail_at_once(
    api: TestClient[Any, Any], db: Database, tenant: Tenant, writes: WriteWatch
) -> None:
    keys = [tenant.api_key] + [
        await make_key(db, tenant, [{"namespaces": ["*"], "actions": [action]}])
        for action in ("namespaces.read", "namespaces.create")
    ]
    bystander = await make_tenant(db)
    for key in keys:
        response = await api.get("/v1/whoami", headers={"Authorization": f"Bearer {key}"})
        assert response.status == 200

    await db.transaction(
        "test.disable",
        lambda cur: applications.disable_application(
            cur, name=tenant.application, actor=OPERATOR, reason="test"
        ),
    )

    writes.reset()
    for key in keys:
        auth = {"Authorization": f"Bearer {key}"}
        response = await api.get("/v1/whoami", headers=auth)
        await assert_problem(response, 401, "invalid_credential")
        response = await api.get("/v1/namespaces", headers=auth)
        await assert_problem(response, 401, "invalid_credential")
        response = await api.post("/v1/namespaces", json={"name": unique("dis")}, headers=auth)
        await assert_problem(response, 401, "invalid_credential")
    writes.assert_unchanged()

    response = await api.get("/v1/whoami", headers=bystander.auth)
    assert response.status == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v1/openapi.json"])
@pytest.mark.parametrize("authorization", [None, "Bearer orb_000000000000_" + "a" * 43, "junk"])
async def test_public_paths_need_no_key(
    api: TestClient[Any, Any], path: str, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = await api.get(path, headers=headers)
    assert response.status == 200, await response.text()
    assert "WWW-Authenticate" not in response.headers


async def test_every_response_carries_a_request_id(
    api: TestClient[Any, Any], tenant: Tenant
) -> None:
    response = await api.get("/v1/whoami", headers={**tenant.auth, "X-Request-Id": "trace-123"})
    assert response.headers["X-Request-Id"] == "trace-123"
    response = await api.get("/v1/whoami")
    assert response.status == 401
    generated = response.headers["X-Request-Id"]
    assert len(generated) == 16
    response = await api.get("/v1/whoami", headers={**tenant.auth, "X-Request-Id": "x" * 65})
    assert response.headers["X-Request-Id"] != "x" * 65


async def test_a_401_body_never_echoes_the_key(api: TestClient[Any, Any], tenant: Tenant) -> None:
    wrong = _wrong_secret(tenant.api_key)
    response = await api.get("/v1/whoami", headers={"Authorization": f"Bearer {wrong}"})
    text = await response.text()
    assert response.status == 401
    assert wrong not in text
    assert _prefix(wrong) not in text
    assert json.loads(text)["code"] == "invalid_credential"


async def test_a_principal_authenticated_before_the_revocation_is_refused_in_its_transaction(
    db: Database, tenant: Tenant, writes: WriteWatch
) -> None:
    # What the middleware holds between authentication and the handler's transaction.
    principal = await db.read(
        "test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key)
    )
    assert (await commands.whoami(db, principal))["application"]["name"] == tenant.application
    await db.transaction(
        "test.revoke",
        lambda cur: credentials.revoke_credential(
            cur, prefix=principal.prefix, actor=OPERATOR, reason="test"
        ),
    )
    writes.reset()
    with pytest.raises(errors.InvalidCredential):
        await commands.whoami(db, principal)
    with pytest.raises(errors.InvalidCredential):
        await commands.list_namespaces(db, principal, after_name="", limit=10)
    with pytest.raises(errors.InvalidCredential):
        await commands.create_namespace(
            db, principal, name=unique("late"), description="", idempotency_key="late-key"
        )
    writes.assert_unchanged()


async def test_a_principal_authenticated_before_the_application_was_disabled_is_refused(
    db: Database, tenant: Tenant, writes: WriteWatch
) -> None:
    principal = await db.read(
        "test.auth", lambda cur: credentials.authenticate(cur, tenant.api_key)
    )
    await db.transaction(
        "test.disable",
        lambda cur: applications.disable_application(
            cur, name=tenant.application, actor=OPERATOR, reason="test"
        ),
    )
    writes.reset()
    with pytest.raises(errors.InvalidCredential):
        await commands.create_namespace(
            db, principal, name=unique("late"), description="", idempotency_key=None
        )
    with pytest.raises(errors.InvalidCredential):
        await commands.whoami(db, principal)
    writes.assert_unchanged()
