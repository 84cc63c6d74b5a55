"""Grants and the authorization decision.

A credential carries a list of grants; each grant is namespaces × actions × queues. A pattern is
``*`` (anything), ``prefix*`` (anything starting with ``prefix``) or an exact name; an action
pattern may also be ``family.*``. A request is allowed when one grant matches all three parts.

Grants are a *static* description; whether the credential, its application and the namespace
are still active is decided inside the transaction that uses them (:mod:`.credentials`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from typing import Any

import attrs

from orbit_common.model import jsondoc, names


class Action(enum.StrEnum):
    """Every action a credential can be granted. Later capabilities add theirs here."""

    NAMESPACES_READ = "namespaces.read"
    NAMESPACES_CREATE = "namespaces.create"
    NAMESPACES_MANAGE = "namespaces.manage"  # disable and enable (an operator's action)
    QUEUES_READ = "queues.read"
    QUEUES_MANAGE = "queues.manage"  # create, update, pause, resume
    TASKS_SUBMIT = "tasks.submit"
    TASKS_READ = "tasks.read"  # tasks, their attempts, events and late evidence
    TASKS_CANCEL = "tasks.cancel"
    TASKS_REVIEW = "tasks.review"  # resolve NEEDS_REVIEW
    TASKS_RETRY = "tasks.retry"  # manual retry of a finished task
    WORKERS_WORK = "workers.work"  # register worker sessions, claim and report attempts
    # Application-wide (the shared quotas of orbit_common/pulse/quotas.py): allowed only by a
    # grant whose namespaces and queues are both "*".
    APPLICATIONS_READ = "applications.read"  # limits and usage of the application
    APPLICATIONS_MANAGE = "applications.manage"  # change the limits (also allows reading)
    SCHEDULES_READ = "schedules.read"  # schedules, their versions and occurrence ledgers
    SCHEDULES_MANAGE = "schedules.manage"  # create, publish, pause/resume, disable, trigger,
    # backfill (scoped by the schedule's queue)
    # Result subscriptions (orbit_common/relay), scoped by the subscription's queue filter: a
    # subscription on some queues needs the action on each of them; one on every queue needs
    # a grant whose queues are "*".
    SUBSCRIPTIONS_READ = "subscriptions.read"  # subscriptions, delivery history and details
    SUBSCRIPTIONS_MANAGE = "subscriptions.manage"  # create, update, pause/resume, disable,
    # rotate the secret, add budget to an exhausted delivery
    SUBSCRIPTIONS_CONSUME = "subscriptions.consume"  # lease, acknowledge and fail deliveries
    # Workflows (orbit_common/weave), namespace-wide: a version's tasks go to several queues,
    # so publishing and starting also need ``tasks.submit`` on every queue the version uses.
    WORKFLOWS_READ = "workflows.read"  # definitions, versions, instances with steps
    WORKFLOWS_MANAGE = "workflows.manage"  # create definitions, publish versions
    WORKFLOWS_START = "workflows.start"  # start instances
    WORKFLOWS_SIGNAL = "workflows.signal"  # send signals to instances (namespace-wide: a
    # signal steers an instance whose steps span queues)
    WORKFLOWS_CONTROL = "workflows.control"  # pause and resume instances, recover their steps
    # (namespace-wide: an instance's gate holds back its tasks on every queue)


ACTIONS = frozenset(a.value for a in Action)
# Actions on a whole namespace: disabling it stops every queue in it, and a workflow's
# definitions and instances span queues (their inputs, results and task links included), so only
# a grant that covers every queue (``"*"``) allows them — a key scoped to some queues may not.
# Starting an instance is checked per queue instead (``tasks.submit`` on each queue it uses).
NAMESPACE_WIDE = frozenset({Action.NAMESPACES_MANAGE.value, Action.WORKFLOWS_READ.value,
                            Action.WORKFLOWS_MANAGE.value, Action.WORKFLOWS_SIGNAL.value,
                            Action.WORKFLOWS_CONTROL.value})
MAX_GRANTS = 64
MAX_PATTERNS = 64
_NAME_PREFIX = re.compile(r"\A[a-z0-9][a-z0-9._-]{0,62}\Z")


def _valid_pattern(pattern: str, *, action: bool) -> bool:
    if pattern == "*":
        return True
    if action:
        if pattern.endswith(".*"):
            family = pattern[:-2]
            return any(a.startswith(family + ".") for a in ACTIONS)
        return pattern in ACTIONS
    if pattern.endswith("*"):
        return bool(_NAME_PREFIX.match(pattern[:-1]))
    return names.is_valid_name(pattern)


def matches(pattern: str, value: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return pattern == value


@attrs.frozen(kw_only=True)
class Grant:
    namespaces: tuple[str, ...]
    actions: tuple[str, ...]
    queues: tuple[str, ...] = ("*",)

    def allows(self, action: str, namespace: str, queue: str | None) -> bool:
        if action in NAMESPACE_WIDE and "*" not in self.queues:
            return False
        return (
            any(matches(p, namespace) for p in self.namespaces)
            and any(matches(p, action) for p in self.actions)
            and (queue is None or any(matches(p, queue) for p in self.queues))
        )

    def covers_namespace(self, namespace: str) -> bool:
        return any(matches(p, namespace) for p in self.namespaces)

    def to_json(self) -> dict[str, Any]:
        return {
            "namespaces": list(self.namespaces),
            "actions": list(self.actions),
            "queues": list(self.queues),
        }


ALL_ACCESS = (Grant(namespaces=("*",), actions=("*",), queues=("*",)),)


class GrantError(ValueError):
    """A grant list that cannot be stored; the message names the offending part."""


def parse_grants(raw: Any) -> tuple[Grant, ...]:
    """Validate a JSON grant list (from the API, the CLI or the database)."""
    if not isinstance(raw, list) or not raw:
        raise GrantError("grants must be a non-empty list")
    if len(raw) > MAX_GRANTS:
        raise GrantError(f"at most {MAX_GRANTS} grants")
    grants = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise GrantError(f"grants[{index}] must be an object")
        unknown = set(item) - {"namespaces", "actions", "queues"}
        if unknown:
            raise GrantError(f"grants[{index}] has unknown fields {sorted(unknown)}")
        parts: dict[str, tuple[str, ...]] = {}
        for field in ("namespaces", "actions", "queues"):
            value = item.get(field, ["*"] if field == "queues" else None)
            if (
                not isinstance(value, list)
                or not value
                or len(value) > MAX_PATTERNS
                or not all(isinstance(v, str) for v in value)
            ):
                raise GrantError(f"grants[{index}].{field} must be a non-empty list of strings")
            for pattern in value:
                if not _valid_pattern(pattern, action=field == "actions"):
                    raise GrantError(f"grants[{index}].{field}: invalid pattern {pattern!r}")
            parts[field] = tuple(value)
        grants.append(Grant(**parts))
    return tuple(grants)


def grants_from_db(text: str) -> tuple[Grant, ...]:
    return parse_grants(jsondoc.loads_strict(text))


def grants_to_db(grants: Iterable[Grant]) -> str:
    return jsondoc.dumps([g.to_json() for g in grants])


def allowed(grants: Iterable[Grant], action: str, namespace: str, queue: str | None = None) -> bool:
    return any(g.allows(action, namespace, queue) for g in grants)


def sees_namespace(grants: Iterable[Grant], namespace: str) -> bool:
    return any(g.covers_namespace(namespace) for g in grants)
