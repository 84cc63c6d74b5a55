"""The views of an instance's waits (docs/api/workflows.md § 等待): the ``weave_waits`` rows of
its TIMER and SIGNAL steps, with their deadlines, state and outcome (read through
``instances.list_waits`` and the instance detail).

A correlation key is exact bytes: it is shown as its UTF-8 text (``correlation_key_encoding``
``"utf8"``) when it is valid UTF-8, else base64 (``"base64"``).
"""

from __future__ import annotations

import base64
from typing import Any

from orbit_common.db.clock import as_utc
from orbit_common.model import jsondoc

WAITS = ("SELECT w.*, st.name AS step_name, a.sequence AS activation_sequence"
         " FROM weave_waits w"
         " LEFT JOIN weave_steps st ON st.namespace_id = w.namespace_id"
         " AND st.instance_id = w.instance_id AND st.id = w.step_id"
         " LEFT JOIN weave_activations a ON a.namespace_id = w.namespace_id"
         " AND a.id = w.activation_id"
         " WHERE w.namespace_id = %s AND w.instance_id = %s ORDER BY w.created_at, w.id")


def _iso(value: Any) -> str | None:
    return None if value is None else as_utc(value).isoformat(timespec="microseconds")


def correlation(value: bytes | None) -> tuple[str | None, str | None]:
    """A correlation key's text and its encoding (``utf8`` or ``base64``); None for none."""
    if value is None:
        return None, None
    try:
        return bytes(value).decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(bytes(value)).decode("ascii"), "base64"


def wait_view(row: dict[str, Any]) -> dict[str, Any]:
    key, encoding = correlation(row["correlation_key"])
    versions = row["payload_versions"]
    return {
        "id": row["id"].hex(), "step": row["step_name"], "step_id": row["step_id"].hex(),
        "activation_id": row["activation_id"].hex(),
        "activation_sequence": row["activation_sequence"], "kind": row["kind"],
        "state": row["state"], "generation": row["generation"],
        "first_deadline_at": _iso(row["first_deadline_at"]),
        "deadline_at": _iso(row["deadline_at"]),
        "signal_name": row["signal_name"], "correlation_key": key,
        "correlation_key_encoding": encoding,
        "payload_versions": jsondoc.loads_strict(versions) if versions is not None else None,
        "winner_signal_id": row["winner_signal_id"].hex() if row["winner_signal_id"] else None,
        "fired_at": _iso(row["fired_at"]), "late_ms": row["late_ms"],
        "created_at": _iso(row["created_at"]), "updated_at": _iso(row["updated_at"]),
    }


async def waits_of(cur: Any, namespace_id: bytes, instance_id: bytes) -> list[dict[str, Any]]:
    """The views of an instance's waits, oldest first (at most one per activation)."""
    await cur.execute(WAITS, (namespace_id, instance_id))
    return [wait_view(dict(r)) for r in await cur.fetchall()]
