"""Running schemathesis cases against a real daemon (tests/e2e/test_schemathesis*.py).

``check(case, …)`` sends a generated case and runs every check of the pinned schemathesis on the
answer, after three adjustments that each test module states and justifies:

* ``real``: a generated *valid* path parameter is replaced by the name or id of an object the
  test created, so schema-valid requests reach real rows (a random name is only ever a 404);
  an invalid one is sent as generated.
* Integral floats (``5.0``) in a JSON body are written as integers (``5``): JSON Schema counts
  ``5.0`` as an integer, but Orbit's integer fields take JSON integers only (docs/api/README.md,
  "数值"), a rule about spelling no schema keyword states. To JSON Schema both spellings are the
  same value, so this never turns a valid case invalid or the reverse.
* ``Tolerance``: a 400 to a schema-valid request passes positive_data_acceptance only when every
  problem it lists matches one of the module's rules (a rule JSON Schema cannot state, which the
  document says in words), or its code is one the module names. Any other rejection of a valid
  request still fails.

And one correction of schemathesis itself: an omitted optional body in a case it drew as
"negative body" is a positive case (``omitted_optional_body_called_negative``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from schemathesis.core import NOT_SET
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?")
ID = re.compile(r"[0-9a-f]{32}")


@attrs.frozen(kw_only=True)
class Tolerance:
    """``rules``: (operationId or "*", problem path regex, message regex); ``codes``:
    (operationId or "*", problem code)."""

    rules: Sequence[tuple[str, str, str]] = ()
    codes: Sequence[tuple[str, str]] = ()

    def covers(self, case: Any, response: Any) -> bool:
        if response.status_code != 400:
            return False
        problem = response.json()
        operation = case.operation.definition.raw.get("operationId")
        if problem.get("code") == "invalid_cursor" and "cursor" not in (case.query or {}):
            return False
        if any(op in ("*", operation) and problem.get("code") == code
               for op, code in self.codes):
            return True
        found = problem.get("errors") or []
        return bool(found) and all(
            any(op in ("*", operation) and re.fullmatch(path, error["path"])
                and re.search(message, error["message"]) for op, path, message in self.rules)
            for error in found)


def integers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integers(v) for v in value]
    return value


def omitted_optional_body_called_negative(case: Any) -> bool:
    """schemathesis 4.32.5 may omit an optional body in a case it draws as "negative body"
    (``_maybe_set_optional_body`` adds "no body" to the negative strategy too) and still calls
    the body negative; an omitted optional body is valid, so the case is a positive one."""
    meta = case.meta
    if meta is None or case.body is not NOT_SET:
        return False
    negative = {location for location, info in meta.components.items()
                if info.mode is GenerationMode.NEGATIVE}
    body = case.operation.definition.raw.get("requestBody", {})
    return negative == {ParameterLocation.BODY} and not body.get("required", False)


def check(case: Any, *, url: str, auth: dict[str, str],
          real: Mapping[str, tuple[re.Pattern[str], str]], tolerance: Tolerance) -> None:
    """Send ``case`` to ``url`` with ``auth`` and run every check on the answer."""
    for key, value in (case.path_parameters or {}).items():
        if key in real and isinstance(value, str) and real[key][0].fullmatch(value):
            case.path_parameters[key] = real[key][1]
    if case.body is not None:
        case.body = integers(case.body)
    response = case.call(base_url=url, headers=auth)
    excluded = [positive_data_acceptance] if tolerance.covers(case, response) else []
    if omitted_optional_body_called_negative(case):
        excluded.append(negative_data_rejection)
    case.validate_response(response, headers=auth, excluded_checks=excluded,
                           transport_kwargs={"base_url": url, "headers": auth})
