"""JSON Schema -> the OpenAPI-subset ``Schema`` Gemini accepts (pure).

Gemini's ``parameters`` / ``responseSchema`` reject JSON-Schema keywords outside its subset
(``additionalProperties``, ``$schema``, ``strict`` ...) with a 400, so they are dropped, at every
depth. Local ``$ref``s into ``$defs`` / ``definitions`` (what Pydantic emits for nested models)
are inlined, because Gemini's subset has no references. Everything else is kept as it is.
"""

from __future__ import annotations

from typing import Any

from core.errors import InvalidRequestError

UNSUPPORTED_KEYS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "$defs",
        "definitions",
        "additionalProperties",
        "unevaluatedProperties",
        "patternProperties",
        "dependentRequired",
        "dependentSchemas",
        "strict",
        "examples",
        "readOnly",
        "writeOnly",
        "contentEncoding",
        "contentMediaType",
    }
)
"""Keywords removed wherever a schema appears."""

_LITERAL_KEYS = frozenset({"enum", "default", "example", "const"})
"""Keywords whose values are data, not schemas: copied without looking inside."""

_MAX_REF_DEPTH = 32


def _definitions(root: dict[str, Any]) -> dict[str, Any]:
    defs: dict[str, Any] = {}
    for key in ("definitions", "$defs"):
        found = root.get(key)
        if isinstance(found, dict):
            defs.update({f"#/{key}/{name}": value for name, value in found.items()})
    return defs


def _resolve(ref: Any, defs: dict[str, Any], param: str) -> dict[str, Any]:
    target = defs.get(ref) if isinstance(ref, str) else None
    if not isinstance(target, dict):
        raise InvalidRequestError(f"schema reference {ref!r} cannot be resolved", param=param)
    return target


def _clean(node: Any, defs: dict[str, Any], depth: int, param: str) -> Any:
    """Clean one value found where a schema (or a list/map of schemas) may stand."""
    if isinstance(node, list):
        return [_clean(item, defs, depth, param) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        if depth >= _MAX_REF_DEPTH:
            raise InvalidRequestError("recursive schemas are not supported by Gemini", param=param)
        # Siblings of $ref (e.g. a description) refine the referenced schema.
        merged = {**_resolve(node["$ref"], defs, param), **node}
        del merged["$ref"]
        return _clean(merged, defs, depth + 1, param)
    cleaned: dict[str, Any] = {}
    for key, value in node.items():
        if key in UNSUPPORTED_KEYS:
            continue
        if key in _LITERAL_KEYS:
            cleaned[key] = value
        elif key == "properties" and isinstance(value, dict):
            # Property names are data: a property called "strict" stays.
            cleaned[key] = {name: _clean(sub, defs, depth, param) for name, sub in value.items()}
        else:
            cleaned[key] = _clean(value, defs, depth, param)
    return cleaned


def to_gemini_schema(schema: dict[str, Any], param: str) -> dict[str, Any]:
    """``schema`` without the keywords Gemini rejects and with local references inlined.

    Raises ``InvalidRequestError`` (naming ``param``) for unresolvable or recursive refs.
    """
    result: dict[str, Any] = _clean(schema, _definitions(schema), 0, param)
    return result
