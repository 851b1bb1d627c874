"""The machine-readable JSON Schema of the protocol, generated from the Structs themselves.

Rule kept here: schema.json beside this file is exactly what `main()` prints, so it is never edited
by hand and never goes stale (tests/test_schema.py compares the two). Regenerate it with

    python -m eurekamem.protocol._schema > protocol/schema.json

It holds one params schema per method in METHODS, the records, and the envelope (request, batch,
success, failure, error object). All shared definitions live under "$defs".
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from . import PROTOCOL_VERSION  # the package is fully imported before any of its submodules run
from ._errors import ERROR_CODES
from ._framing import DEFAULT_MAX_FRAME_BYTES
from ._records import CrossRunRecord, Edge, EpisodicEntry, Job, KnowledgeNode, MemoryVersion, Skill
from .methods import METHODS, TheoryState

RequestId = int | str | None
ErrorKind: Any = Literal[tuple(ERROR_CODES)]  # built from the table at run time: Any to mypy


# The envelope as it looks on the wire. _envelope.Request keeps `params` as msgspec.Raw (decoded
# later against the method's Struct), which has no schema; these Structs describe the same shape.


class Request(msgspec.Struct, kw_only=True):
    """A request; without `id` it is a notification and gets no answer."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId | UnsetType = UNSET
    method: str
    params: dict[str, Any] = {}


class ErrorData(msgspec.Struct, kw_only=True):
    """`error.data`: always the kind; some errors add fields (method_not_found adds `method`)."""

    kind: ErrorKind


class ErrorObject(msgspec.Struct, kw_only=True):
    code: int
    message: str
    data: ErrorData


class Success(msgspec.Struct, kw_only=True):
    jsonrpc: Literal["2.0"]
    id: RequestId
    result: Any


class Failure(msgspec.Struct, kw_only=True):
    jsonrpc: Literal["2.0"]
    id: RequestId
    error: ErrorObject


Batch = Annotated[list[Request], Meta(min_length=1)]

RECORDS: tuple[type, ...] = (EpisodicEntry, CrossRunRecord, KnowledgeNode, Edge, TheoryState, Skill, MemoryVersion, Job)

_REF = "#/$defs/{name}"


def build_schema() -> dict[str, Any]:
    """The whole schema document as a JSON-ready dict (deterministic order)."""
    params_types = [spec.params for spec in METHODS.values()]
    envelope_types: list[Any] = [Request | Batch, Success, Failure, ErrorObject]
    types: list[Any] = params_types + list(RECORDS) + envelope_types
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    n = len(params_types)
    method_schemas = schemas[:n]
    record_schemas = schemas[n : n + len(RECORDS)]
    request_schema, success_schema, failure_schema, error_schema = schemas[n + len(RECORDS) :]
    # msgspec cannot put two untagged Structs in one union, so the reply union is spelled out here.
    one_reply = {"anyOf": [success_schema, failure_schema]}
    reply_schema = {"anyOf": [success_schema, failure_schema, {"type": "array", "items": one_reply, "minItems": 1}]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "eurekamem socket protocol",
        "description": (
            "JSON-RPC 2.0 envelope, the params of every method, and the records. "
            "See PROTOCOL.md beside this file for framing, semantics and results."
        ),
        "protocol": PROTOCOL_VERSION,
        "limits": {"max_frame_bytes": DEFAULT_MAX_FRAME_BYTES},
        "errors": dict(ERROR_CODES),
        "envelope": {
            "request": request_schema,
            "reply": reply_schema,
            "error": error_schema,
        },
        "methods": {
            name: {
                "description": spec.doc,
                "writes": spec.writes,
                "params": schema,
            }
            for (name, spec), schema in zip(METHODS.items(), method_schemas)
        },
        "records": {cls.__name__: schema for cls, schema in zip(RECORDS, record_schemas)},
        "$defs": dict(sorted(components.items())),
    }


def render() -> str:
    """schema.json's exact text."""
    return json.dumps(build_schema(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
