"""Wire format of the worker protocol (docs/api/worker.md): parsing requests, encoding replies.

Every item is validated before any transaction runs; a malformed item rejects the whole request
(a problem document or an ``error`` frame) and changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from orbit_common import errors
from orbit_common.model import ids, jsondoc
from orbit_common.pulse.leases import (
    MAX_BATCH,
    OUTCOMES,
    AttemptRef,
    FinishOutcome,
    FinishReport,
    Grant,
    RenewOutcome,
    StartOutcome,
)

TOKEN_MAX = 128
REPORT_ID_MAX = 128
ERROR_MAX_BYTES = 64 * 1024
# Arrays and objects in one worker message. Parsing is linear in them (and the parser holds the
# GIL), so this bounds a message's parsing cost whatever its content: 50,000 keep it to tens of
# milliseconds, while 1 MiB of records of a few fields each stays well inside.
MAX_CONTAINERS = jsondoc.MAX_CONTAINERS
REF_FIELDS = {"attempt_id", "token", "generation"}
FINISH_FIELDS = REF_FIELDS | {"report_id", "outcome", "result", "error", "retryable"}


def _problem(path: str, message: str) -> errors.ValidationFailed:
    return errors.ValidationFailed([{"path": path, "message": message}])


def _items(doc: Any) -> list[Any]:
    if not isinstance(doc, dict):
        raise _problem("$", "expected a JSON object")
    items = doc.get("items")
    if not isinstance(items, list) or not items:
        raise _problem("$.items", "a non-empty array")
    if len(items) > MAX_BATCH:
        raise _problem("$.items", f"at most {MAX_BATCH} items")
    return items


def _ref(item: Any, path: str, allowed: set[str]) -> AttemptRef:
    if not isinstance(item, dict):
        raise _problem(path, "expected an object")
    unknown = set(item) - allowed
    if unknown:
        raise _problem(path, f"unknown fields {sorted(unknown)}")
    try:
        attempt_id = ids.from_hex(item.get("attempt_id"))  # type: ignore[arg-type]
    except ValueError as exc:
        raise _problem(f"{path}.attempt_id", "32 lowercase hexadecimal characters") from exc
    token = item.get("token")
    if not isinstance(token, str) or not 1 <= len(token) <= TOKEN_MAX:
        raise _problem(f"{path}.token", f"a string of 1-{TOKEN_MAX} characters")
    generation = item.get("generation")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
        raise _problem(f"{path}.generation", "a positive integer")
    return AttemptRef(attempt_id=attempt_id, token=token, generation=generation)


def parse_refs(doc: Any) -> list[AttemptRef]:
    """``{"items": [{attempt_id, token, generation}, …]}`` for start and renew."""
    return [_ref(item, f"$.items[{i}]", REF_FIELDS) for i, item in enumerate(_items(doc))]


def parse_finish(doc: Any, max_result_bytes: int) -> list[FinishReport]:
    """``{"items": [FinishReport, …]}``. The stored results and errors of all items together
    are at most ``max_result_bytes`` (``[dispatcher].max_result_bytes``), so one finish never
    writes more than the database accepts in a statement; past it the whole request is refused
    with ``result_too_large`` and changes nothing (the lease goes on)."""
    reports = []
    stored = 0
    for i, item in enumerate(_items(doc)):
        path = f"$.items[{i}]"
        ref = _ref(item, path, FINISH_FIELDS)
        report_id = item.get("report_id")
        if not isinstance(report_id, str) or not 1 <= len(report_id.encode()) <= REPORT_ID_MAX:
            raise _problem(f"{path}.report_id", f"a string of 1-{REPORT_ID_MAX} bytes")
        outcome = item.get("outcome")
        if outcome not in OUTCOMES:
            raise _problem(f"{path}.outcome", f"one of {', '.join(OUTCOMES)}")
        retryable = item.get("retryable", False)
        if not isinstance(retryable, bool):
            raise _problem(f"{path}.retryable", "true or false")
        if retryable and outcome != "failed":
            raise _problem(f"{path}.retryable", "only a failed outcome can be retryable")
        result = None
        if outcome == "succeeded":
            result = jsondoc.dumps(item.get("result"))
            stored += len(result.encode())
            _check_stored(stored, max_result_bytes, f"{path}.result")
        elif "result" in item:
            raise _problem(f"{path}.result", "only a succeeded outcome has a result")
        error = item.get("error")
        if error is not None:
            if outcome == "succeeded":
                raise _problem(f"{path}.error", "a succeeded outcome has no error")
            if not isinstance(error, dict):
                raise _problem(f"{path}.error", "an object, e.g. {\"type\": …, \"message\": …}")
            size = len(jsondoc.dumps(error).encode())
            if size > ERROR_MAX_BYTES:
                raise _problem(f"{path}.error", f"at most {ERROR_MAX_BYTES} bytes")
            stored += size
            _check_stored(stored, max_result_bytes, f"{path}.error")
        reports.append(FinishReport(ref=ref, report_id=report_id.encode(), outcome=outcome,
                                    result=result, error=error, retryable=retryable))
    return reports


def _check_stored(stored: int, limit: int, path: str) -> None:
    if stored > limit:
        raise errors.ResultTooLarge(
            f"{path}: the results and errors of one finish may come to at most {limit} bytes"
            " (as stored: compact JSON, UTF-8); send a large result in a finish of its own, or"
            " report the attempt failed", path=path, max_result_bytes=limit)


def loads(data: bytes | str) -> Any:
    """A worker message as a document: strict JSON, at most :data:`MAX_CONTAINERS` arrays and
    objects (counted before parsing), nested at most 32 deep."""
    return jsondoc.loads_strict(data, max_containers=MAX_CONTAINERS)


def _time(value: Any) -> str | None:
    return value.isoformat(timespec="microseconds") if value is not None else None


def grant_json(grant: Grant) -> str:
    """One grant as JSON text; the task input is spliced in verbatim (byte-exact)."""
    meta = {
        "task_id": grant.task_id.hex(), "attempt_id": grant.attempt_id.hex(),
        "generation": grant.generation, "token": grant.token, "queue": grant.queue,
        "handler": grant.handler, "priority": grant.priority,
        "business_key": grant.business_key.decode("utf-8", "replace")
        if grant.business_key is not None else None,
        "rerun_safe": grant.rerun_safe, "offer_expires_at": _time(grant.offer_expires_at),
        "deadline_at": _time(grant.deadline_at), "attempt_timeout_ms": grant.attempt_timeout_ms,
        "max_attempts": grant.max_attempts,
        "concurrency_key": grant.concurrency_key.decode("utf-8", "replace")
        if grant.concurrency_key is not None else None,
        "concurrency_token": grant.concurrency_token,
    }
    return json.dumps(meta, ensure_ascii=False)[:-1] + ', "input": ' + grant.input + "}"


def grants_frame(grants: list[Grant]) -> str:
    return '{"type": "grants", "grants": [' + ", ".join(grant_json(g) for g in grants) + "]}"


def start_json(o: StartOutcome) -> dict[str, Any]:
    return {"attempt_id": o.attempt_id.hex(), "approved": o.approved, "reason": o.reason,
            "lease_expires_at": _time(o.lease_expires_at), "retry_after_ms": o.retry_after_ms}


def renew_json(o: RenewOutcome) -> dict[str, Any]:
    return {"attempt_id": o.attempt_id.hex(), "renewed": o.renewed, "reason": o.reason,
            "lease_expires_at": _time(o.lease_expires_at),
            "cancel_requested": o.cancel_requested}


def finish_json(o: FinishOutcome) -> dict[str, Any]:
    return {**o.to_json(), "replayed": o.replayed}
