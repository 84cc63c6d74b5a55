"""CEL expressions of workflow definitions (docs/weave/expressions.md).

Two environments over one library (``cel-expr-python``, the CEL project's wrapper of cel-cpp):

* the **checking** environment of one definition declares ``input`` and ``steps`` as protobuf
  message types built from the definition's declared schemas (:mod:`orbit_common.weave.types`),
  so the CEL type checker refuses an unknown field, a wrong operand type or a non-boolean
  condition before a version is published;
* the **evaluating** environment declares both as ``dyn`` and is fed plain JSON values (numbers
  converted by the declared schema: ``integer`` → int, ``number`` → double), so evaluation needs
  no protobuf messages. An expression that type-checked against the schema evaluates the same
  over values that match it.

Nothing here calls ``eval`` or parses an expression itself.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from cel_expr_python import cel

MAX_EXPRESSION_CHARS = 4096
# Values a workflow expression sees (``round``: only a POLL step's ``until``, the round's
# ``{"result": …}``).
VARIABLES = ("input", "steps", "round")


class ExpressionError(Exception):
    """An expression did not compile, did not type-check, or failed while evaluating. ``message``
    is cel-cpp's own text, with the line and column of the offending token when it has them."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def first_error(text: str) -> str:
    """cel-cpp's compile error reduced to its first diagnostic (``<input>:1:3: …``), without the
    status prefix and the source excerpt it appends."""
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:
        start = line.find("<input>:")
        if start >= 0:
            return "expression" + line[start + len("<input>"):]
    return lines[0] if lines else text


def compile_checked(env: Any, source: str) -> str:
    """Type-check ``source`` in ``env``; return the CEL name of its result type
    (``BOOL``, ``MAP<STRING, DYN>``, ``orbit.weave.definition.S3``…)."""
    try:
        return str(env.compile(source).return_type().name())
    except RuntimeError as exc:
        raise ExpressionError(first_error(str(exc))) from exc


_EVAL_ENV = cel.NewEnv(variables=dict.fromkeys(VARIABLES, cel.Type.DYN))


@functools.lru_cache(maxsize=4096)
def _program(source: str) -> Any:
    try:
        return _EVAL_ENV.compile(source, disable_check=True)
    except RuntimeError as exc:
        raise ExpressionError(first_error(str(exc))) from exc


def evaluate(source: str, variables: dict[str, Any]) -> Any:
    """Evaluate ``source`` over ``variables`` (values from
    :func:`orbit_common.weave.types.cel_input`); return a JSON value (dict, list, str, int,
    float, bool or None) or raise :class:`ExpressionError`."""
    try:
        result = _program(source).eval(data=variables)
    except (RuntimeError, TypeError, ValueError) as exc:  # a value CEL cannot take
        raise ExpressionError(str(exc)) from exc
    if result.type().name() == "ERROR":
        raise ExpressionError(str(result.value()))
    return _json_value(result.plain_value())


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ExpressionError("the value is not JSON: NaN or an infinity")
        return value
    if isinstance(value, list):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ExpressionError("the value is not JSON: a map key is not a string")
            out[key] = _json_value(item)
        return out
    raise ExpressionError(f"the value is not JSON: {type(value).__name__}")
