"""Human descriptions of the params Structs: for `eurekamem call METHOD --help` and for error messages.

Rule kept here: everything said about a param (its type, bounds, allowed values, default) is read
from the params Struct in _methods.py, the one place the wire format is written; nothing is typed
twice. Pure functions of types, no I/O.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import msgspec.inspect as mi

__all__ = ["allowed_values_hint", "describe_type", "method_help", "param_rows"]


def _bounds(lo: Any, hi: Any, unit: str = "") -> str:
    if lo is not None and hi is not None:
        return f"{lo} to {hi}{unit}"
    if lo is not None:
        return f"at least {lo}{unit}"
    if hi is not None:
        return f"at most {hi}{unit}"
    return ""


def describe_type(t: mi.Type) -> str:
    """One line: `str, 1 to 1024 characters`, `one of "local", "global"`, `list of at most 256 str`, ..."""
    if isinstance(t, mi.StrType):
        bounds = _bounds(t.min_length, t.max_length, " characters")
        return f"str, {bounds}" if bounds else "str"
    if isinstance(t, mi.IntType):
        lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else None)
        bounds = _bounds(lo, t.le)
        return f"int, {bounds}" if bounds else "int"
    if isinstance(t, mi.FloatType):
        bounds = _bounds(t.ge, t.le)
        return f"float, {bounds}" if bounds else "float"
    if isinstance(t, mi.BoolType):
        return "bool"
    if isinstance(t, mi.NoneType):
        return "null"
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in t.values)
    if isinstance(t, mi.ListType):
        bounds = _bounds(t.min_length, t.max_length)
        return f"list ({bounds}) of {describe_type(t.item_type)}" if bounds else f"list of {describe_type(t.item_type)}"
    if isinstance(t, mi.DictType):
        return "object"
    if isinstance(t, mi.StructType):
        return f"object ({t.cls.__name__}: {', '.join(f.name for f in t.fields)})"
    if isinstance(t, mi.UnionType):
        parts = [describe_type(x) for x in t.types if not isinstance(x, mi.NoneType)]
        nullable = any(isinstance(x, mi.NoneType) for x in t.types)
        return " or ".join(parts) + (" or null" if nullable else "")
    if isinstance(t, mi.AnyType):
        return "any JSON value"
    return type(t).__name__.removesuffix("Type").lower()


def _default(field: mi.Field) -> str:
    if field.required:
        return "required"
    if field.default is not msgspec.NODEFAULT:
        return msgspec.json.encode(field.default).decode()
    if field.default_factory is not msgspec.NODEFAULT:
        return msgspec.json.encode(field.default_factory()).decode()
    return ""


def param_rows(params_type: type) -> list[tuple[str, str, str]]:
    """(name, type, default) for each param of a params Struct, in declaration order."""
    info = mi.type_info(params_type)
    assert isinstance(info, mi.StructType)
    return [(f.encode_name, describe_type(f.type), _default(f)) for f in info.fields]


def method_help(name: str, params_type: type, doc: str, writes: bool) -> str:
    """What `eurekamem call NAME --help` prints: the method, then one line per param."""
    rows = param_rows(params_type)
    lines = [f"{name}: {doc}" + (" (writes: journaled before it answers)" if writes else "")]
    if not rows:
        lines.append("  no params")
    else:
        lines.append("params (a JSON object; protocol/PROTOCOL.md has every rule):")
        width = max(len(r[0]) for r in rows)
        for pname, ptype, default in rows:
            lines.append(f"  {pname:<{width}}  {ptype}  [{default}]")
    return "\n".join(lines)


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.(?P<name>[A-Za-z_][A-Za-z0-9_]*)|\[(?P<index>[0-9]+)\]")


def _type_at(t: mi.Type, path: str) -> mi.Type | None:
    """The type at a msgspec error path such as `.items[3].category` (None if it cannot be followed)."""
    for step in _STEP.finditer(path):
        while isinstance(t, mi.UnionType):
            options = [x for x in t.types if not isinstance(x, mi.NoneType)]
            if len(options) != 1:
                return None
            t = options[0]
        if step.group("name") is not None:
            if not isinstance(t, mi.StructType):
                return None
            field = next((f for f in t.fields if f.encode_name == step.group("name")), None)
            if field is None:
                return None
            t = field.type
        else:
            if not isinstance(t, mi.ListType):
                return None
            t = t.item_type
    return t


def allowed_values_hint(message: str, params_type: type) -> str:
    """What to append to a decoding error so that it names what is allowed: the values of a
    Literal (`an unknown category` lists the nine), or the known fields for an unknown one."""
    match = _AT.search(message)
    path = match.group("path") if match is not None else ""  # no " - at" part: the top level
    try:
        t: mi.Type | None = _type_at(mi.type_info(params_type), path)
    except (TypeError, ValueError):  # a type msgspec.inspect cannot describe: no hint
        return ""
    if message.startswith("Object contains unknown field") and isinstance(t, mi.StructType):
        if not t.fields:
            return "; this method takes no params"
        return "; known fields: " + ", ".join(f.encode_name for f in t.fields)
    if message.startswith("Object missing required field") and isinstance(t, mi.StructType):
        return "; required: " + ", ".join(f.encode_name for f in t.fields if f.required)
    while isinstance(t, mi.UnionType):
        options = [x for x in t.types if not isinstance(x, mi.NoneType)]
        t = options[0] if len(options) == 1 else None
    if isinstance(t, mi.ListType) and message.startswith("Invalid enum value"):
        t = t.item_type
    if isinstance(t, mi.LiteralType):
        return "; allowed: " + ", ".join(str(v) for v in t.values)
    return ""
