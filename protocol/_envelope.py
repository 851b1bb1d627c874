"""The JSON-RPC 2.0 envelope in both encodings: frames in, validated calls out; replies to bytes.

Rule kept here: a frame becomes either a Call (method known, params decoded into the method's
Struct) or a Rejected (the contract's error, with the request's id when one could be read). Nothing
here does I/O or touches state, so a bad request can never change anything.

Two ways to one result: a frame is first decoded in one pass as a request of any method (a tagged
union of one Struct per method, its tag the method: envelope and params at once). Only a frame that
this pass refuses is decoded the general way (the envelope, then the method, then its params), which
is also what says what is wrong with it. The one-pass types accept only what the general way turns
into a Call, and make the same Call of it (tests/test_envelope.py compares the two on fuzzed frames).

A JSON string escape of a lone UTF-16 surrogate (`"\\ud800"`, no pair) is JSON's grammar but not
Unicode text: msgspec refuses the frame, often as "Input data was truncated". Such a frame is read
again (by the standard library's parser, only then) to answer what is wrong and where: the field is
`invalid_params` (or `invalid_request` outside the params), answered with the request's id, and a
batch's other requests run. Bytes that are not UTF-8 stay a `parse_error`: that is not JSON text.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Union

import msgspec
from msgspec import UNSET, UnsetType

from ._describe import allowed_values_hint
from ._errors import ProtocolError
from ._framing import frame_binary, frame_ndjson
from .methods import METHODS, MethodSpec, free_form_problem, value_ok

RequestId = int | str | None


class Request(msgspec.Struct, kw_only=True):
    method: str
    params: msgspec.Raw = msgspec.Raw(b"")
    id: int | str | None | UnsetType = UNSET
    jsonrpc: str = "2.0"


class Success(msgspec.Struct):
    jsonrpc: str
    id: Any
    result: Any


class Failure(msgspec.Struct):
    jsonrpc: str
    id: Any
    error: dict[str, Any]


class Call(msgspec.Struct):
    """A request that is ready to run. `id` is UNSET for a notification (no answer)."""

    id: int | str | None | UnsetType
    spec: MethodSpec
    params: Any

    @property
    def wants_reply(self) -> bool:
        return self.id is not UNSET


class Rejected(msgspec.Struct):
    """A request that cannot run; `error` is what to answer (unless it was a notification)."""

    id: int | str | None | UnsetType
    error: ProtocolError

    @property
    def wants_reply(self) -> bool:
        return self.id is not UNSET


Incoming = Call | Rejected


def success(request_id: RequestId, result: Any) -> Success:
    return Success("2.0", request_id, result)


def failure(request_id: RequestId, error: ProtocolError) -> Failure:
    return Failure("2.0", request_id, error.to_wire())


# msgspec's wording for a max_length bound, and _methods.value_problem's for a value nested too deep;
# anchored so that a client's own text (an unknown field name, a bad enum value) can never make an
# error look like too_large.
_TOO_LONG = re.compile(r"Expected `[a-z]+` of length <= [0-9]+|Nesting deeper than [0-9]+ levels")

_TOO_DEEP = "nesting too deep"

# a \\uD800-\\uDFFF escape (preceded by an even number of backslashes: an escape, not escaped text)
_SURROGATE_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    number = float(text)
    if number - number != 0.0:
        raise ValueError(f"{text} is out of range")  # msgspec's "Number out of range"
    return number


def _surrogate_path(obj: Any, path: str) -> str | None:
    """The path of the first string (a value or a key) in `obj` that holds a lone surrogate."""
    if isinstance(obj, str):
        return path if _SURROGATE.search(obj) else None
    if isinstance(obj, list):
        for index, item in enumerate(obj):
            found = _surrogate_path(item, f"{path}[{index}]")
            if found is not None:
                return found
    elif isinstance(obj, dict):
        for key, item in obj.items():
            if _SURROGATE.search(key):
                return path
            found = _surrogate_path(item, f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]")
            if found is not None:
                return found
    return None


def _params_error(exc: Exception, params_type: type) -> ProtocolError:
    """invalid_params (or too_large for a length bound), naming what is allowed where it can
    (the nine categories for an unknown one, the known fields for an unknown field)."""
    text = str(exc)
    kind = "too_large" if _TOO_LONG.match(text) else "invalid_params"
    return ProtocolError(kind, f"invalid params: {text}{allowed_values_hint(text, params_type)}")


def _one_pass_type(spec: MethodSpec) -> type:
    """A request of this method as one Struct, tagged by its method (the module docstring). Its
    params may be left out only when the general way would decode `{}` (no field is required)."""
    params: tuple[Any, ...] = ("params", spec.params)
    if not any(field.required for field in msgspec.structs.fields(spec.params)):
        params = ("params", spec.params, msgspec.field(default_factory=spec.params))
    fields = [params, ("id", int | str | None | UnsetType, UNSET), ("jsonrpc", Literal["2.0"], "2.0")]
    return msgspec.defstruct(f"{spec.params.__name__}Request", fields, kw_only=True, tag_field="method", tag=spec.name)


_ONE_PASS_SPECS: dict[type, MethodSpec] = {_one_pass_type(spec): spec for spec in METHODS.values()}
_ONE_PASS_REQUEST: Any = Union[tuple(_ONE_PASS_SPECS)]  # noqa: UP007  (a union built at run time)


class Codec:
    """One framing's envelope codec: JSON for NDJSON, MessagePack for binary frames."""

    def __init__(self, framing: str) -> None:
        if framing not in ("ndjson", "binary"):
            raise ValueError(f"unknown framing {framing!r}")
        self.framing = framing
        mod = msgspec.json if framing == "ndjson" else msgspec.msgpack
        self._mod = mod
        self._envelope = mod.Decoder(Request | list[msgspec.Raw])
        self._one_pass = mod.Decoder(_ONE_PASS_REQUEST)
        self._request = mod.Decoder(Request)
        self._any = mod.Decoder()
        self._params: dict[type, Any] = {}
        self._empty_params = b"{}" if framing == "ndjson" else b"\x80"
        self._encoder = mod.Encoder()
        self._frame = frame_ndjson if framing == "ndjson" else frame_binary
        self._binary = framing == "binary"

    # --- decoding -------------------------------------------------------------------------------

    def decode(self, frame: bytes) -> tuple[list[Incoming], bool]:
        """A frame's requests, and whether it was a batch (a batch is answered with one array)."""
        try:
            request = self._one_pass.decode(frame)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return self.decode_general(frame)  # not one well-formed request: a batch, or the general way says why
        params = request.params
        field = params.free_form  # a free-form value must be one the daemon can keep (a falsy one always is)
        if field and (value := getattr(params, field)) and not value_ok(value):
            return self.decode_general(frame)  # the general way says where
        return [Call(request.id, _ONE_PASS_SPECS[type(request)], params)], False

    def _decode_one_pass(self, raw: bytes) -> Call | None:
        try:
            request = self._one_pass.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return None  # not a well-formed request of a known method: the general way says why
        params = request.params
        field = params.free_form
        if field and (value := getattr(params, field)) and not value_ok(value):
            return None
        return Call(request.id, _ONE_PASS_SPECS[type(request)], params)

    def decode_general(self, frame: bytes) -> tuple[list[Incoming], bool]:
        """decode() without the one-pass way: what it must agree with (and what it falls back to)."""
        try:
            envelope = self._envelope.decode(frame)
        except msgspec.ValidationError as exc:
            return [self._reject_invalid(frame, exc)], False
        except msgspec.DecodeError as exc:
            surrogate = self._lone_surrogates(frame)
            if surrogate is not None:
                return surrogate
            return [Rejected(None, ProtocolError("parse_error", f"parse error: {exc}"))], False
        except RecursionError:
            return [Rejected(None, ProtocolError("too_large", f"too large: {_TOO_DEEP}"))], False
        if isinstance(envelope, Request):
            return [self._to_call(envelope)], False
        if not envelope:
            return [Rejected(None, ProtocolError("invalid_request", "empty batch"))], False
        return [self._decode_item(raw) for raw in envelope], True

    def _decode_item(self, raw: bytes) -> Incoming:
        """One request of a batch."""
        call = self._decode_one_pass(raw)
        if call is not None:
            return call
        try:
            return self._to_call(self._request.decode(raw))
        except msgspec.ValidationError as exc:
            return self._reject_invalid(raw, exc)
        except RecursionError:
            return Rejected(None, ProtocolError("too_large", f"too large: {_TOO_DEEP}"))

    def _lone_surrogates(self, frame: bytes) -> tuple[list[Incoming], bool] | None:
        """The answer to a JSON frame msgspec refused for a lone surrogate escape (the module
        docstring), or None when that is not what is wrong with it."""
        if self._binary or not _SURROGATE_ESCAPE.search(frame):
            return None
        try:
            obj = json.loads(frame.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float)
        except (ValueError, RecursionError):
            return None  # malformed anyway (or not UTF-8): msgspec's parse error stands
        if _surrogate_path(obj, "$") is None:
            return None  # refused for something else
        if isinstance(obj, list) and obj:
            return [self._surrogate_item(item) for item in obj], True
        return [self._surrogate_item(obj)], False

    def _surrogate_item(self, obj: Any) -> Incoming:
        """A request of a frame read by the standard library's parser: refused where it holds a
        lone surrogate, else decoded as any request (from its re-encoding, which has none)."""
        path = _surrogate_path(obj, "$")
        if path is None:
            return self._decode_item(self._encoder.encode(obj))
        problem = "a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair), which is not Unicode text"
        request_id: Any = obj.get("id", UNSET) if isinstance(obj, dict) else None
        readable = isinstance(request_id, (int, str)) and not isinstance(request_id, bool) and _surrogate_path(request_id, "") is None
        if request_id is not UNSET and not readable:
            request_id = None  # (an id with the surrogate, too)
        if path.startswith(("$.params.", "$.params[")):  # a notification's is not answered, as for any params
            return Rejected(request_id, ProtocolError("invalid_params", f"invalid params: {problem} - at `${path[len('$.params'):]}`"))
        request_id = None if request_id is UNSET else request_id  # an invalid request is answered even without an id
        return Rejected(request_id, ProtocolError("invalid_request", f"invalid request: {problem} - at `{path}`"))

    def _reject_invalid(self, raw: bytes, exc: Exception) -> Rejected:
        # msgspec validates while it parses, so a frame rejected by validation may still be
        # malformed further on: then it is a parse error, and no id can be trusted.
        try:
            obj = self._any.decode(raw)
        except msgspec.DecodeError as parse_exc:
            return Rejected(None, ProtocolError("parse_error", f"parse error: {parse_exc}"))
        except RecursionError:
            return Rejected(None, ProtocolError("too_large", f"too large: {_TOO_DEEP}"))
        request_id: Any = None
        if isinstance(obj, dict):
            candidate = obj.get("id", UNSET)
            if candidate is UNSET or isinstance(candidate, (int, str)) and not isinstance(candidate, bool):
                request_id = candidate
            if "method" not in obj:
                problem = "missing `method`"
            elif not isinstance(obj.get("method"), str):
                problem = "`method` must be a string"
            elif "params" in obj and not isinstance(obj["params"], dict):
                problem = "`params` must be an object"
            else:
                problem = str(exc)  # msgspec names the field: `$.id`, `$.jsonrpc`, ...
            if request_id is UNSET:
                request_id = None  # an invalid request is answered even without an id
        else:
            problem = f"a request must be an object, not {type(obj).__name__}"
        return Rejected(request_id, ProtocolError("invalid_request", f"invalid request: {problem}"))

    def _to_call(self, request: Request) -> Incoming:
        if request.jsonrpc != "2.0":
            # not a request object, so not a notification either: answered, with id null if absent
            request_id = None if request.id is UNSET else request.id
            return Rejected(request_id, ProtocolError("invalid_request", 'invalid request: "jsonrpc" must be "2.0"'))
        spec = METHODS.get(request.method)
        if spec is None:
            return Rejected(
                request.id,
                ProtocolError("method_not_found", f"method not found: {request.method!r}", method=request.method),
            )
        try:  # the params' Raw is a view of the (immutable) frame: decoded without a copy
            params = self.decode_params(spec.params, request.params or self._empty_params)
        except ProtocolError as exc:
            return Rejected(request.id, exc)
        return Call(request.id, spec, params)

    def decode_params(self, params_type: type, raw: bytes) -> Any:
        decoder = self._params.get(params_type)
        if decoder is None:
            decoder = self._params[params_type] = self._mod.Decoder(params_type)
        try:
            params = decoder.decode(raw)
        except msgspec.ValidationError as exc:
            raise _params_error(exc, params_type) from None
        except msgspec.DecodeError as exc:
            raise ProtocolError("invalid_params", f"invalid params: {exc}") from None
        except RecursionError:
            raise ProtocolError("too_large", f"too large: {_TOO_DEEP} in params") from None
        problem = free_form_problem(params)  # JSON's data model only (protocol/methods.py)
        if problem is not None:
            raise _params_error(ValueError(problem), params_type)
        return params

    # --- encoding -------------------------------------------------------------------------------

    def encode(self, message: Any) -> bytes:
        """A reply (Success, Failure or a list of them) as one framed message."""
        return self._frame(self._encoder.encode(message))

    def encode_into(self, message: Any, out: bytearray) -> None:
        """Append `message` framed to `out` (no intermediate bytes). On an encoding error `out` is
        left as it was and the error raised."""
        start = len(out)
        try:
            if self._binary:
                self._encoder.encode_into(message, out, start + 4)
                out[start : start + 4] = (len(out) - start - 4).to_bytes(4, "big")
            else:
                self._encoder.encode_into(message, out, start)
                out += b"\n"
        except BaseException:
            del out[start:]
            raise

    def encode_request(self, request_id: RequestId, method: str, params: Any) -> bytes:
        """A request as one framed message (for clients and tests)."""
        return self._frame(self._encoder.encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))


def framing_error_line(first_byte: int) -> bytes:
    """The one JSON line sent before closing a connection whose first byte picks no framing."""
    error = ProtocolError(
        "parse_error",
        f"unknown framing: first byte 0x{first_byte:02x}; send JSON lines or 0x00-prefixed binary frames",
    )
    return frame_ndjson(msgspec.json.encode(failure(None, error)))
