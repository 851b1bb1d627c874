"""Error kinds of the public contract (protocol/PROTOCOL.md §4) and the exception that carries one.

Rule kept here: every error that leaves the daemon has exactly one kind from this table, and the
kind fixes the JSON-RPC code. Nothing else invents codes.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (a client command's start)
if TYPE_CHECKING:
    from typing import Any


ERROR_CODES: dict[str, int] = {
    "parse_error": -32700,
    "invalid_request": -32600,
    "method_not_found": -32601,
    "invalid_params": -32602,
    "internal": -32603,
    "not_found": -32004,
    "too_large": -32013,
    "unavailable": -32003,
    "overloaded": -32029,
    "read_only": -32030,
}

KIND_BY_CODE: dict[int, str] = {code: kind for kind, code in ERROR_CODES.items()}


class ProtocolError(Exception):
    """An error with a contract kind; `data` holds extra fields sent beside the kind."""

    def __init__(self, kind: str, message: str, **data: Any) -> None:
        if kind not in ERROR_CODES:
            raise ValueError(f"unknown error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.data = data

    @property
    def code(self) -> int:
        return ERROR_CODES[self.kind]

    def to_wire(self) -> dict[str, Any]:
        """The JSON-RPC `error` member for this error."""
        return {"code": self.code, "message": self.message, "data": {"kind": self.kind, **self.data}}

    def __repr__(self) -> str:
        return f"ProtocolError({self.kind!r}, {self.message!r})"
