"""Value schemas of workflow definitions: a small JSON-Schema-like subset (docs/weave/language.md
§ 值的模式), the check of a value against one, and the protobuf message types that let the CEL
type checker see the declared shapes."""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from google.protobuf import descriptor_pb2, descriptor_pool, struct_pb2

SCALARS = ("string", "integer", "number", "boolean")
TYPES = (*SCALARS, "object", "array", "any")
MAX_SCHEMA_DEPTH = 8
MAX_PROPERTIES = 256
INT64 = (-(2**63), 2**63 - 1)
# A property or step name is a CEL identifier, so ``input.order_id`` and ``steps.reserve`` read
# it; CEL's reserved words cannot be field names.
IDENTIFIER = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
RESERVED_WORDS = frozenset({
    "as", "break", "const", "continue", "else", "false", "for", "function", "if", "import", "in",
    "let", "loop", "package", "namespace", "null", "return", "true", "var", "void", "while",
})
IDENTIFIER_RULE = ("1-64 characters: ASCII letters, digits or '_', not starting with a digit, "
                   "and not a CEL reserved word")

Problem = Callable[[str, str, str], None]


_PLAIN_KEY = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")


def member(path: str, key: str) -> str:
    """The JSON path of member ``key`` of the object at ``path``: ``$.a.b``, or ``$.a["b c"]``
    when the key is not a plain name."""
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def is_identifier(name: Any) -> bool:
    return isinstance(name, str) and bool(IDENTIFIER.match(name)) and name not in RESERVED_WORDS


@attrs.frozen(kw_only=True)
class Schema:
    """``type`` one of :data:`TYPES`; ``properties`` (objects) in document order, ``None`` for an
    object that accepts any members; ``items`` (arrays), ``None`` for any items."""

    type: str
    properties: tuple[tuple[str, Schema], ...] | None = None
    required: frozenset[str] = frozenset()
    items: Schema | None = None


ANY = Schema(type="any")
FREE_OBJECT = Schema(type="object")

_SCHEMA_FIELDS = {"type", "description", "properties", "required", "items"}


def parse_schema(raw: Any, path: str, problem: Problem, depth: int = 1) -> Schema:
    """The schema ``raw`` describes; each problem is reported with its path."""
    if not isinstance(raw, dict):
        problem(path, "invalid_value", "expected a JSON object (a schema)")
        return ANY
    if depth > MAX_SCHEMA_DEPTH:
        problem(path, "limit_exceeded", f"schemas nest at most {MAX_SCHEMA_DEPTH} levels")
        return ANY
    for key in raw:
        if key not in _SCHEMA_FIELDS:
            problem(member(path, key), "unknown_field", "unknown field")
    kind = raw.get("type")
    if kind not in TYPES:
        problem(f"{path}.type", "invalid_value", f"one of {', '.join(TYPES)}")
        return ANY
    if "description" in raw and not isinstance(raw["description"], str):
        problem(f"{path}.description", "invalid_value", "expected a string")
    for key, owner in (("properties", "object"), ("required", "object"), ("items", "array")):
        if key in raw and kind != owner:
            problem(f"{path}.{key}", "invalid_value", f"only a schema of type {owner} has {key}")
    if kind == "object":
        return _object_schema(raw, path, problem, depth)
    if kind == "array":
        items = (parse_schema(raw["items"], f"{path}.items", problem, depth + 1)
                 if "items" in raw else None)
        return Schema(type="array", items=items)
    return Schema(type=kind)


def _object_schema(raw: dict[str, Any], path: str, problem: Problem, depth: int) -> Schema:
    properties: tuple[tuple[str, Schema], ...] | None = None
    if "properties" in raw:
        found = raw["properties"]
        if not isinstance(found, dict):
            problem(f"{path}.properties", "invalid_value", "expected a JSON object")
            found = {}
        elif len(found) > MAX_PROPERTIES:
            problem(f"{path}.properties", "limit_exceeded", f"at most {MAX_PROPERTIES} properties")
        props = []
        for name, sub in found.items():
            where = member(f"{path}.properties", name)
            if not is_identifier(name):
                problem(where, "invalid_name", IDENTIFIER_RULE)
            props.append((name, parse_schema(sub, where, problem, depth + 1)))
        properties = tuple(props)
    required: frozenset[str] = frozenset()
    if "required" in raw:
        names = raw["required"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            problem(f"{path}.required", "invalid_value", "expected an array of property names")
        else:
            known = {name for name, _ in properties or ()}
            for index, name in enumerate(names):
                if name not in known:
                    problem(f"{path}.required[{index}]", "invalid_value",
                            f"{name!r} is not one of the declared properties")
            if len(set(names)) != len(names):
                problem(f"{path}.required", "invalid_value", "a property is named twice")
            required = frozenset(names)
    return Schema(type="object", properties=properties, required=required)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | decimal.Decimal) and not isinstance(value, bool)


_SIMPLE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "any": (lambda _value: True, ""),
    "string": (lambda value: isinstance(value, str), "expected a string"),
    "boolean": (lambda value: isinstance(value, bool), "expected true or false"),
    "number": (_is_number, "expected a number"),
}


def value_problems(schema: Schema, value: Any, path: str, found: list[dict[str, str]],
                   limit: int = 100) -> None:
    """Append to ``found`` where ``value`` (a JSON value, normal parse) does not match."""
    if len(found) >= limit:
        return
    kind = schema.type

    def wrong(message: str) -> None:
        found.append({"path": path, "message": message})

    simple = _SIMPLE.get(kind)
    if simple is not None:
        if not simple[0](value):
            wrong(simple[1])
    elif kind == "integer":
        if not _is_number(value) or value != int(value):
            wrong("expected an integer")
        elif not INT64[0] <= int(value) <= INT64[1]:
            wrong("an integer beyond 64 bits")
    elif kind == "array":
        if not isinstance(value, list):
            wrong("expected an array")
        elif schema.items is not None:
            for index, item in enumerate(value):
                value_problems(schema.items, item, f"{path}[{index}]", found, limit)
    elif not isinstance(value, dict):
        wrong("expected an object")
    else:
        _object_problems(schema, value, path, found, limit)


def _object_problems(schema: Schema, value: dict[str, Any], path: str,
                     found: list[dict[str, str]], limit: int) -> None:
    if schema.properties is None:
        return
    declared = dict(schema.properties)
    for name in value:
        if name not in declared:
            found.append({"path": f"{path}.{name}", "message": "not a declared property"})
    for name, sub in schema.properties:
        if name in value:
            value_problems(sub, value[name], f"{path}.{name}", found, limit)
        elif name in schema.required:
            found.append({"path": f"{path}.{name}", "message": "required"})


def cel_input(schema: Schema | None, value: Any) -> Any:
    """``value`` (matching ``schema``) as the evaluating environment takes it: ``number`` fields
    as doubles, ``integer`` fields as ints, any other number as the normal parse made it (an int,
    or a double for a Decimal)."""
    if schema is None or schema.type == "any":
        return _plain(value)
    if schema.type == "number":
        return float(value)
    if schema.type == "integer":
        return int(value)
    if schema.type == "array" and isinstance(value, list):
        return [cel_input(schema.items, item) for item in value]
    if schema.type == "object" and isinstance(value, dict):
        declared = dict(schema.properties or ())
        return {key: cel_input(declared.get(key), item) for key, item in value.items()}
    return _plain(value)


def _plain(value: Any) -> Any:
    """Where no schema says: an integer token stays an int, a token with a fraction or an
    exponent (a Decimal from the normal parse) is a double."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


# --- protobuf message types for the CEL type checker --------------------------------------------

PACKAGE = "orbit.weave.definition"
_F = descriptor_pb2.FieldDescriptorProto
_SCALAR_FIELDS = {"string": _F.TYPE_STRING, "integer": _F.TYPE_INT64,
                  "number": _F.TYPE_DOUBLE, "boolean": _F.TYPE_BOOL}
_VALUE, _STRUCT, _LIST = (".google.protobuf.Value", ".google.protobuf.Struct",
                          ".google.protobuf.ListValue")


class MessageTypes:
    """One proto2 file of message types for one definition: a message per object schema with
    declared properties, and whatever records :meth:`message` is asked for. Fields are optional
    (presence: ``has(input.x)``); objects without properties are ``google.protobuf.Struct``
    (``map(string, dyn)``), ``any`` is ``google.protobuf.Value`` (``dyn``)."""

    def __init__(self) -> None:
        self.file = descriptor_pb2.FileDescriptorProto(
            name="orbit_weave_definition.proto", package=PACKAGE, syntax="proto2",
            dependency=["google/protobuf/struct.proto"])
        self._count = 0

    def _new(self, prefix: str) -> descriptor_pb2.DescriptorProto:
        self._count += 1
        return self.file.message_type.add(name=f"{prefix}{self._count}")

    def message(self, prefix: str, fields: Mapping[str, Schema | str]) -> str:
        """A message with ``fields`` (a schema, or the full name of a message made before);
        returns its full name."""
        message = self._new(prefix)
        for number, (name, field) in enumerate(fields.items(), start=1):
            if isinstance(field, str):
                message.field.add(name=name, number=number, label=_F.LABEL_OPTIONAL,
                                  type=_F.TYPE_MESSAGE, type_name=f".{field}")
            else:
                self._field(message, name, number, field)
        return f"{PACKAGE}.{message.name}"

    def _field(self, message: descriptor_pb2.DescriptorProto, name: str, number: int,
               schema: Schema) -> None:
        label = _F.LABEL_OPTIONAL
        if schema.type == "array":
            items = schema.items
            label = _F.LABEL_REPEATED
            if items is None or items.type == "any":
                schema, label = Schema(type="any"), _F.LABEL_REPEATED
            elif items.type == "array":
                message.field.add(name=name, number=number, label=label, type=_F.TYPE_MESSAGE,
                                  type_name=_LIST)
                return
            else:
                schema = items
        if schema.type in _SCALAR_FIELDS:
            message.field.add(name=name, number=number, label=label,
                              type=_SCALAR_FIELDS[schema.type])
            return
        type_name = self.object_type(schema) if schema.type == "object" else _VALUE
        message.field.add(name=name, number=number, label=label, type=_F.TYPE_MESSAGE,
                          type_name=type_name if type_name.startswith(".") else f".{type_name}")

    def object_type(self, schema: Schema) -> str:
        """The message (full name, or ``.google.protobuf.Struct``) of an object schema."""
        if schema.properties is None:
            return _STRUCT
        return self.message("S", dict(schema.properties))

    def cel_type(self, schema: Schema) -> str:
        """The full type name to declare a variable of ``schema`` with (object schemas only are
        used for variables; anything else is wrapped by the caller in a record message)."""
        return self.object_type(schema).lstrip(".")

    def pool(self) -> descriptor_pool.DescriptorPool:
        pool = descriptor_pool.DescriptorPool()
        pool.AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
        pool.Add(self.file)
        return pool
