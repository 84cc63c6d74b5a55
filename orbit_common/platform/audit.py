"""Management audit events (``orbit_audit_events``), committed with the change they record."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from orbit_common.model import ids, jsondoc


class ActorKind(enum.StrEnum):
    CREDENTIAL = "credential"
    OPERATOR = "operator"
    CONSOLE = "console"
    SYSTEM = "system"


@attrs.frozen(kw_only=True)
class Actor:
    """Who did something: a credential (API), an operator (CLI), the console or the system."""

    kind: ActorKind
    id: str

    @classmethod
    def operator(cls, name: str) -> Actor:
        return cls(kind=ActorKind.OPERATOR, id=name)

    def describe(self) -> str:
        return f"{self.kind.value}:{self.id}"


@attrs.frozen(kw_only=True)
class AuditRecord:
    actor: Actor
    action: str
    resource_type: str
    resource_id: bytes | None
    resource_revision: int | None = None
    namespace_id: bytes | None = None
    application_id: bytes | None = None
    reason: str | None = None
    evidence_ref: str | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    request_id: str | None = None


INSERT_AUDIT_PREFIX = """
INSERT INTO orbit_audit_events (id, namespace_id, application_id, actor_kind, actor_id, action,
  resource_type, resource_id, resource_revision, reason, evidence_ref, before_doc, after_doc,
  request_id, occurred_at)"""
# One row (``multi_insert`` repeats it for many records written at once, e.g. a batch start).
INSERT_AUDIT_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))"
INSERT_AUDIT = INSERT_AUDIT_PREFIX + "\nVALUES " + INSERT_AUDIT_ROW


async def append_audit(cur: Any, record: AuditRecord) -> bytes:
    """Append one audit event inside the caller's transaction."""
    audit_id = ids.new_id()
    await cur.execute(
        INSERT_AUDIT,
        (
            audit_id,
            record.namespace_id,
            record.application_id,
            record.actor.kind.value,
            record.actor.id,
            record.action,
            record.resource_type,
            record.resource_id,
            record.resource_revision,
            record.reason,
            record.evidence_ref,
            None if record.before is None else jsondoc.dumps(record.before),
            None if record.after is None else jsondoc.dumps(record.after),
            record.request_id,
        ),
    )
    return audit_id
