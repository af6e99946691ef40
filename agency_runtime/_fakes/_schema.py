"""JSON documents from a JSON schema: what a fake model answers a structured request with.

:func:`schema_of` finds the schema a request's ``response_format`` asks for (a pydantic
class, ``{"type": "json_schema", "json_schema": {"schema": {...}}}`` or ``{"schema": ...}``);
:func:`sample_document` makes a JSON value that validates against it, with simple,
deterministic choices (like pydantic-ai's ``TestModel``): the first ``enum`` value or
non-null branch, ``"text"`` (or a sample of the string's ``format``), ``1``, ``True``, one
item per array, every property of an object; ``$ref`` is followed and a recursive schema
stops growing past a fixed depth.
"""

from __future__ import annotations

from typing import Any

__all__ = ["sample_document", "schema_of"]

_MAX_SCHEMA_DEPTH = 12


def sample_document(schema: dict[str, Any]) -> Any:
    """A JSON value that validates against ``schema`` (its ``$ref`` resolved within it)."""
    return _sample(schema, schema, 0)


def schema_of(response_format: object) -> dict[str, Any] | None:
    """The JSON schema a ``response_format`` asks for, or ``None``."""
    if response_format is None:
        return None
    if isinstance(response_format, type):
        model_json_schema = getattr(response_format, "model_json_schema", None)
        if callable(model_json_schema):
            schema = model_json_schema()
            return schema if isinstance(schema, dict) else None
        return None
    if not isinstance(response_format, dict):
        return None
    json_schema = response_format.get("json_schema")
    if isinstance(json_schema, dict):
        schema = json_schema.get("schema")
        if isinstance(schema, dict):
            return schema
    schema = response_format.get("schema")
    if isinstance(schema, dict):
        return schema
    return None


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#"):
        return {}
    node: Any = root
    for token in ref.lstrip("#").strip("/").split("/"):
        if not token:
            continue
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or token not in node:
            return {}
        node = node[token]
    return node if isinstance(node, dict) else {}


def _is_null(schema: object) -> bool:
    return isinstance(schema, dict) and (schema.get("type") == "null" or schema == {"const": None})


_STRING_FORMATS: dict[str, str] = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00",
    "duration": "PT1S",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
}


def _sample(schema: dict[str, Any], root: dict[str, Any], depth: int) -> Any:
    """A JSON value that validates against ``schema`` (simple, deterministic choices)."""
    if depth > _MAX_SCHEMA_DEPTH:
        return None
    if isinstance(schema.get("$ref"), str):
        merged = {
            **_resolve(schema["$ref"], root),
            **{k: v for k, v in schema.items() if k != "$ref"},
        }
        return _sample(merged, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            chosen = next((b for b in branches if not _is_null(b)), None)
            if chosen is None:
                return None
            return _sample(chosen, root, depth + 1)
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        values = [
            _sample(part, root, depth + 1) for part in schema["allOf"] if isinstance(part, dict)
        ]
        if values and all(isinstance(v, dict) for v in values):
            combined: dict[str, Any] = {}
            for value in values:
                combined.update(value)
            return combined
        return values[0] if values else None
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        if "properties" in schema:
            kind = "object"
        elif "items" in schema or "prefixItems" in schema:
            kind = "array"
        else:
            kind = "string"
    if kind == "string":
        return _sample_string(schema)
    if kind == "integer":
        return int(_sample_number(schema, 1))
    if kind == "number":
        return float(_sample_number(schema, 1.0))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        return _sample_array(schema, root, depth)
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {
            name: _sample(sub if isinstance(sub, dict) else {}, root, depth + 1)
            for name, sub in properties.items()
        }
    return "text"


def _sample_string(schema: dict[str, Any]) -> str:
    fmt = schema.get("format")
    text = _STRING_FORMATS.get(fmt, "text") if isinstance(fmt, str) else "text"
    min_length = schema.get("minLength")
    if isinstance(min_length, int) and len(text) < min_length:
        text = (text * (min_length // len(text) + 1))[:min_length]
    max_length = schema.get("maxLength")
    if isinstance(max_length, int) and len(text) > max_length:
        text = text[:max_length]
    return text


def _sample_number(schema: dict[str, Any], default: float) -> float:
    value = default
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    ex_min, ex_max = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(minimum, int | float) and value < minimum:
        value = minimum
    if isinstance(ex_min, int | float) and value <= ex_min:
        value = ex_min + 1
    if isinstance(maximum, int | float) and value > maximum:
        value = maximum
    if isinstance(ex_max, int | float) and value >= ex_max:
        value = ex_max - 1
    return value


def _sample_array(schema: dict[str, Any], root: dict[str, Any], depth: int) -> list[Any]:
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list):
        return [_sample(p if isinstance(p, dict) else {}, root, depth + 1) for p in prefix]
    items = schema.get("items")
    if not isinstance(items, dict):
        return []
    max_items = schema.get("maxItems")
    min_items = schema.get("minItems")
    count = 1
    if isinstance(min_items, int):
        count = max(count, min_items)
    if isinstance(max_items, int):
        count = min(count, max_items)
    if depth >= _MAX_SCHEMA_DEPTH // 2 and not (isinstance(min_items, int) and min_items > 0):
        count = 0  # a recursive schema: stop growing the document
    return [_sample(items, root, depth + 1) for _ in range(count)]
