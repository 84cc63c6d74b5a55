"""Replies checked against the OpenAPI document: the documented response schema is the test.

``assert_documented(path, method, status, body)`` finds the operation's response for ``status``
in ``orbit_api.openapi.DOCUMENT`` and validates ``body`` against its JSON schema (OpenAPI 3.1
schemas are JSON Schema 2020-12; ``$ref`` resolves inside the document's components).
"""

from __future__ import annotations

from typing import Any

import jsonschema

from orbit_api import openapi


def response_schema(path: str, method: str, status: int) -> dict[str, Any]:
    """The documented schema of ``status`` (a path template such as ``…/{task_id}/cancel``)."""
    operation = openapi.DOCUMENT["paths"][path][method.lower()]
    response = operation["responses"][str(status)]
    (media,) = response["content"].values()
    return dict(media["schema"])


def assert_documented(path: str, method: str, status: int, body: Any) -> None:
    schema = {**response_schema(path, method, status),
              "components": openapi.DOCUMENT["components"]}
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    problems = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
    assert not problems, "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '$'}: {e.message}" for e in problems)
