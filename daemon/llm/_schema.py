"""JSON schemas for structured output, generated from the msgspec Struct the answer must convert to.

Rule kept here: the schema a provider sees and the check an answer passes come from the same
Struct, so they cannot drift apart. `msgspec.json.schema` writes `$ref`s into `$defs`; providers
want one self-contained object schema, so references are inlined (a recursive Struct cannot be,
and is refused). OpenAI's strict mode adds its own demands: every object closed
(`additionalProperties: false`) with every property required, and no `default` keyword; the
answer is still converted with the Struct's defaults and constraints.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

__all__ = ["ToolSpec", "strict_schema", "tool_spec"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolSpec(msgspec.Struct, frozen=True):
    """What a provider is asked to produce: a name, a description and an inlined object schema."""

    name: str
    description: str
    schema: dict[str, Any]


def tool_spec(output_type: type[msgspec.Struct], name: str, description: str = "") -> ToolSpec:
    """The ToolSpec for answers of type `output_type`, named `name` (letters, digits, _ and -)."""
    if not _NAME.match(name):
        raise ValueError(f"name must be 1-64 letters, digits, '_' or '-', got {name!r}")
    if not (isinstance(output_type, type) and issubclass(output_type, msgspec.Struct)):
        raise TypeError(f"output_type must be a msgspec.Struct subclass, got {output_type!r}")
    generated = msgspec.json.schema(output_type)
    schema = _inline(generated, generated.get("$defs", {}), ())
    if schema.get("type") != "object":
        raise TypeError(f"{output_type.__name__} does not give an object schema (array_like or tagged?)")
    text = description or (output_type.__doc__ or "").strip() or f"Record the {name}."
    return ToolSpec(name, " ".join(text.split()), schema)


def _inline(node: Any, defs: dict[str, Any], stack: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs, stack) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = ref.removeprefix("#/$defs/")
        if target in stack:
            raise TypeError(f"the output type is recursive through {target}; a provider schema cannot be")
        if target not in defs:
            raise TypeError(f"schema reference {ref!r} is not in $defs")
        return _inline(defs[target], defs, (*stack, target))
    return {key: _inline(value, defs, stack) for key, value in node.items() if key != "$defs"}


def strict_schema(schema: Any) -> Any:
    """`schema` as OpenAI's strict mode wants it: closed objects, all properties required, no defaults."""
    if isinstance(schema, list):
        return [strict_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "default":
            continue
        if key == "properties" and isinstance(value, dict):  # names of fields, not keywords
            out[key] = {field: strict_schema(sub) for field, sub in value.items()}
        else:
            out[key] = strict_schema(value)
    if out.get("type") == "object" and isinstance(out.get("properties"), dict):
        out["additionalProperties"] = False
        out["required"] = list(out["properties"])
    return out
