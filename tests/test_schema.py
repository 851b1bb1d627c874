"""protocol/schema.json is exactly what protocol/_schema.py generates now, and covers every method."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from eurekamem.protocol import ERROR_CODES, METHODS, PROTOCOL_VERSION, _schema
from eurekamem.protocol import methods as m

SCHEMA_PATH = Path(_schema.__file__).with_name("schema.json")
REGENERATE = "python -m eurekamem.protocol._schema > protocol/schema.json"


def committed() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def test_committed_schema_is_up_to_date():
    assert SCHEMA_PATH.read_text(encoding="utf-8") == _schema.render(), f"schema.json is stale: run `{REGENERATE}`"


def test_module_main_prints_the_schema():
    out = subprocess.run(
        [sys.executable, "-m", "eurekamem.protocol._schema"], capture_output=True, check=True, timeout=60
    ).stdout
    assert out.decode("utf-8") == SCHEMA_PATH.read_text(encoding="utf-8")


def test_every_method_is_listed_in_order():
    schema = committed()
    assert list(schema["methods"]) == list(METHODS)
    defs = schema["$defs"]
    for name, spec in METHODS.items():
        entry = schema["methods"][name]
        assert entry["params"] == {"$ref": f"#/$defs/{spec.params.__name__}"}
        assert entry["writes"] is spec.writes
        assert defs[spec.params.__name__]["additionalProperties"] is False  # unknown fields are errors


def test_every_ref_resolves():
    schema = committed()
    refs: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert refs
    for ref in refs:
        assert ref.startswith("#/$defs/") and ref.removeprefix("#/$defs/") in schema["$defs"], ref


def test_records_envelope_and_errors_are_present():
    schema = committed()
    assert schema["protocol"] == PROTOCOL_VERSION
    assert schema["errors"] == ERROR_CODES
    assert {"EpisodicEntry", "CrossRunRecord", "KnowledgeNode"} <= set(schema["records"])
    assert set(schema["envelope"]) == {"request", "reply", "error"}
    defs = schema["$defs"]
    assert defs["Request"]["required"] == ["method"]
    assert set(defs["ErrorData"]["properties"]["kind"]["enum"]) == set(ERROR_CODES)
    assert set(defs["KnowledgeNode"]["required"]) >= {"node_id", "theorem_name", "formal_statement", "created_at"}


def test_limits_match_the_structs():
    defs = committed()["$defs"]
    assert defs["PersistentKey"]["properties"]["key"]["maxLength"] == m.MAX_KEY
    assert defs["EpisodicLog"]["properties"]["session_id"]["maxLength"] == m.MAX_ID
    assert defs["EpisodicLog"]["properties"]["content"]["maxLength"] == m.MAX_TEXT
    assert defs["PersistentRemember"]["properties"]["tags"]["maxItems"] == m.MAX_TAGS
    assert defs["EpisodicRecent"]["properties"]["n"]["maximum"] == m.MAX_RECENT
    assert sorted(defs["GraphLink"]["properties"]["relation"]["enum"]) == sorted(m.RELATIONS)
