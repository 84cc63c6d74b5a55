"""The instance list's version filter and filter combinations against the real database (issue
16 part 4): ``version`` only with its definition, combined with state, business key and the
created range, its cursor bound to the whole filter; the SDK's ``version``. The index each
combination reads is tests/schema/test_explain_weave.py's."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from orbit_sdk import Client, ValidationError

from orbit_common.db.pool import Database
from tests.conftest import Tenant
from tests.integration.api.conftest import assert_problem
from tests.integration.api.test_workflows_api import QUEUE, doc, ns, ok, published, start
from tests.support import pulse


@pytest.fixture
async def queue(db: Database, tenant: Tenant) -> str:
    await pulse.create_queue(db, tenant.namespace_id, QUEUE)
    return QUEUE


async def two_versions(api: TestClient[Any, Any], tenant: Tenant
                       ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Three instances on version 1 and two on version 2 of ``orders`` (oldest first)."""
    await published(api, tenant)
    first = [await start(api, tenant, version=1, business_key=f"k{i}") for i in range(3)]
    await ok(api, "POST", ns(tenant, "/workflow-definitions/orders/versions"), tenant,
             {"revision": 2, "document": doc(handler="work.again")})
    second = [await start(api, tenant, business_key=f"k{i}") for i in range(2)]
    assert {w["version"] for w in first} == {1}
    assert {w["version"] for w in second} == {2}
    return first, second


def listed(page: dict[str, Any]) -> list[str]:
    return [w["id"] for w in page["items"]]


async def test_the_version_filter_and_its_combinations(api: TestClient[Any, Any],
                                                       db: Database, tenant: Tenant,
                                                       queue: str) -> None:
    first, second = await two_versions(api, tenant)
    url = ns(tenant, "/workflows")
    assert listed(await ok(api, "GET", url + "?definition=orders&version=1", tenant)) == [
        w["id"] for w in reversed(first)]
    assert listed(await ok(api, "GET", url + "?definition=orders&version=2", tenant)) == [
        w["id"] for w in reversed(second)]
    assert listed(await ok(api, "GET", url + "?definition=orders&version=3", tenant)) == []
    assert listed(await ok(api, "GET", url + "?definition=orders&version=1&business_key=k1",
                           tenant)) == [first[1]["id"]]
    assert listed(await ok(api, "GET", url + "?definition=orders&version=2&state=RUNNING",
                           tenant)) == [w["id"] for w in reversed(second)]
    assert listed(await ok(api, "GET", url + "?definition=orders&version=2&state=FAILED",
                           tenant)) == []
    since = first[1]["created_at"].replace("+00:00", "Z")
    assert listed(await ok(api, "GET", url + f"?definition=orders&version=1&created_from={since}",
                           tenant)) == [first[2]["id"], first[1]["id"]]
    assert listed(await ok(api, "GET", url + "?definition=orders&state=RUNNING&business_key=k0",
                           tenant)) == [second[0]["id"], first[0]["id"]]
    # Pages of one version; the cursor is bound to the version as to every other filter.
    page = await ok(api, "GET", url + "?definition=orders&version=1&limit=2", tenant)
    assert listed(page) == [first[2]["id"], first[1]["id"]]
    rest = await ok(api, "GET", url + "?definition=orders&version=1&limit=2&cursor="
                    + page["next_cursor"], tenant)
    assert listed(rest) == [first[0]["id"]]
    for other in ("&version=2", ""):
        await assert_problem(await api.get(url + f"?definition=orders{other}&limit=2&cursor="
                                           + page["next_cursor"], headers=tenant.auth),
                             400, "invalid_cursor")
    # A cursor issued without a version still fits its filter (the version is bound only when
    # given).
    plain = await ok(api, "GET", url + "?definition=orders&limit=2", tenant)
    more = await ok(api, "GET", url + "?definition=orders&limit=2&cursor="
                    + plain["next_cursor"], tenant)
    assert listed(plain) + listed(more) + listed(await ok(
        api, "GET", url + "?definition=orders&limit=2&cursor=" + more["next_cursor"],
        tenant)) == [w["id"] for w in reversed(first + second)]


async def test_version_refusals(api: TestClient[Any, Any], tenant: Tenant, queue: str) -> None:
    await published(api, tenant)
    url = ns(tenant, "/workflows")
    for query in ("version=1", "definition=orders&version=0",
                  "definition=orders&version=2147483648", "definition=orders&version=x",
                  "definition=orders&version=1&version=2"):
        await assert_problem(await api.get(f"{url}?{query}", headers=tenant.auth),
                             400, "validation_failed")


async def test_the_sdk_filters_by_version(api: TestClient[Any, Any], tenant: Tenant,
                                          queue: str) -> None:
    first, _ = await two_versions(api, tenant)
    async with Client(str(api.make_url("")), tenant.api_key, tenant.namespace) as orbit:
        got = [w.id async for w in orbit.list_workflows(definition="orders", version=1,
                                                        page_size=2)]
        assert got == [w["id"] for w in reversed(first)]
        with pytest.raises(ValidationError):
            [w async for w in orbit.list_workflows(version=1)]
