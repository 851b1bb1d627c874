"""The client's exceptions: one class per error kind of the contract, plus the client's own.

`error_from_wire` turns a JSON-RPC `error` object into the matching exception, by `data.kind`
first and by `code` when the kind is missing or unknown.
"""

from __future__ import annotations

from ..protocol import ERROR_CODES, KIND_BY_CODE

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (a client command's start)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "ConnectionLost",
    "EurekamemError",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "NotFound",
    "Overloaded",
    "ParseError",
    "ReadOnly",
    "Timeout",
    "TooLarge",
    "Unavailable",
    "error_from_wire",
]


class EurekamemError(Exception):
    """Base of every error the client raises.

    kind: the contract's kind ("not_found", ...), or the client's own ("connection_lost", "timeout")
    code: the JSON-RPC code, or None for the client's own errors
    message: the human words
    data: the error's `data` object as sent (kind included), {} for the client's own errors
    """

    kind: str = "unknown"
    code: int | None = None

    def __init__(
        self,
        message: str = "",
        *,
        kind: str | None = None,
        code: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind
        if code is not None:
            self.code = code
        elif self.code is None and self.kind in ERROR_CODES:
            self.code = ERROR_CODES[self.kind]
        self.data: dict[str, Any] = dict(data) if data else {}

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, kind={self.kind!r}, code={self.code!r})"

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self.message, self.kind, self.code, self.data))


def _rebuild(cls: type[EurekamemError], message: str, kind: str, code: int | None, data: dict[str, Any]) -> EurekamemError:
    if issubclass(cls, (ConnectionLost, Timeout)):
        return cls(message)
    return cls(message, kind=kind, code=code, data=data)


class ParseError(EurekamemError):
    kind = "parse_error"
    code = ERROR_CODES["parse_error"]


class InvalidRequest(EurekamemError):
    kind = "invalid_request"
    code = ERROR_CODES["invalid_request"]


class MethodNotFound(EurekamemError):
    kind = "method_not_found"
    code = ERROR_CODES["method_not_found"]


class InvalidParams(EurekamemError):
    kind = "invalid_params"
    code = ERROR_CODES["invalid_params"]


class InternalError(EurekamemError):
    kind = "internal"
    code = ERROR_CODES["internal"]


class NotFound(EurekamemError):
    kind = "not_found"
    code = ERROR_CODES["not_found"]


class TooLarge(EurekamemError):
    kind = "too_large"
    code = ERROR_CODES["too_large"]


class Unavailable(EurekamemError):
    kind = "unavailable"
    code = ERROR_CODES["unavailable"]


class Overloaded(EurekamemError):
    kind = "overloaded"
    code = ERROR_CODES["overloaded"]


class ReadOnly(EurekamemError):
    kind = "read_only"
    code = ERROR_CODES["read_only"]


class ConnectionLost(EurekamemError, ConnectionError):
    """The socket could not be reached, or broke. Requests in flight on it may or may not have run."""

    kind = "connection_lost"

    def __init__(self, message: str = "connection lost") -> None:
        EurekamemError.__init__(self, message)


class Timeout(EurekamemError, TimeoutError):
    """No answer within the client's timeout. The request may still run; the connection stays usable."""

    kind = "timeout"

    def __init__(self, message: str = "timed out") -> None:
        EurekamemError.__init__(self, message)


ERROR_CLASSES: dict[str, type[EurekamemError]] = {
    cls.kind: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        NotFound,
        TooLarge,
        Unavailable,
        Overloaded,
        ReadOnly,
    )
}
assert set(ERROR_CLASSES) == set(ERROR_CODES), "one exception class per contract kind"


def error_from_wire(error: Any) -> EurekamemError:
    """The exception for a JSON-RPC `error` object (by data.kind, falling back to code)."""
    if not isinstance(error, dict):
        return InternalError(f"malformed error object from server: {error!r}")
    message = error.get("message")
    if not isinstance(message, str):
        message = repr(message) if message is not None else ""
    data = error.get("data")
    if not isinstance(data, dict):
        data = {} if data is None else {"value": data}
    code = error.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        code = None
    kind = data.get("kind")
    cls = ERROR_CLASSES.get(kind) if isinstance(kind, str) else None
    if cls is None and code is not None and code in KIND_BY_CODE:
        cls = ERROR_CLASSES[KIND_BY_CODE[code]]
    if cls is None:
        return EurekamemError(message, kind=kind if isinstance(kind, str) else "unknown", code=code, data=data)
    return cls(message, code=code, data=data)
