"""Fixtures of the console tests: the administrator bound to the test tenant's credential."""

from __future__ import annotations

import attrs
import pytest

from orbit_common.db.pool import Database
from orbit_common.platform import console, credentials
from orbit_common.platform.audit import Actor
from tests.conftest import Tenant

PASSWORD = "console password for tests"


@attrs.frozen(kw_only=True)
class Admin:
    name: str
    password: str = attrs.field(repr=False)
    credential_id: bytes
    tenant: Tenant

    @property
    def actor_id(self) -> str:
        return f"{self.name}/{self.credential_id.hex()}"


async def make_admin(db: Database, tenant: Tenant, *, name: str = "admin") -> Admin:
    """Set the worker database's one administrator (revoking earlier tests' sessions), bound to
    ``tenant``'s all-access credential."""
    principal = await db.read("t", lambda cur: credentials.authenticate(cur, tenant.api_key))
    await console.set_password(db, name=name, password=PASSWORD,
                               credential_prefix=principal.prefix,
                               actor=Actor.operator("pytest"))
    return Admin(name=name, password=PASSWORD, credential_id=principal.credential_id,
                 tenant=tenant)


@pytest.fixture
async def admin(db: Database, tenant: Tenant) -> Admin:
    return await make_admin(db, tenant)
