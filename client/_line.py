"""A blocking client over NDJSON, for processes that start, make a call or a few, and exit: the
`eurekamem` commands that only talk to the daemon (call, status, memories, ...) and agents' hooks.

Rule kept here: only the standard library (json, socket) and the client's own errors and paths, no
msgspec, no thread, no protocol record: a process that imports this and makes a call answers within a
few milliseconds of Python's own start (bench/bench_cli.py measures it), where the full Client costs
msgspec's import (tens of ms on a busy machine) before its first byte. One connection, one call at a
time, results as plain JSON data; the daemon is found by the Client's rule (_paths.socket_paths) and
its errors are raised as the Client raises them (the typed EurekamemError subclasses, ConnectionLost,
Timeout). Programs that live longer want the Client: binary framing, pipelining, typed results.
"""

from __future__ import annotations

import _socket  # the C module (socket.py's import costs a command milliseconds; _paths.connect_unix)
import json
import os
import time

from ._errors import ConnectionLost, InvalidParams, Timeout, error_from_wire
from ._paths import connect_unix, data_root, default_socket_path, socket_paths, unreachable

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (a client command's start)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["LineClient"]

_RECV = 64 * 1024
_DEFAULT_TIMEOUT = 60.0  # as the Client's (client/_common.py's DEFAULT_TIMEOUT, not imported: it imports msgspec)


class LineClient:
    """path, timeout and data_dir as the Client's (no autostart): `path` when given, else
    default_socket_path(data_dir); when nothing listens there, the socket the daemon holding the data
    root recorded (the data root: `data_dir`, else, with no `path`, data_root())."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.path = os.fspath(path) if path is not None else default_socket_path(data_dir)
        self.rule_path = self.path
        self.root = data_root(data_dir) if data_dir is not None or path is None else None
        self.timeout = _DEFAULT_TIMEOUT if timeout is None else float(timeout)
        if not 0 < self.timeout < float("inf"):
            raise ValueError(f"timeout must be a finite number of seconds above 0, not {timeout!r}")
        self._sock: _socket.socket | None = None
        self._buf = bytearray()  # what was read past the last answer's newline
        self._next_id = 1

    def __repr__(self) -> str:
        return f"<eurekamem.LineClient {self.path!r} {'connected' if self._sock else 'idle'}>"

    def __enter__(self) -> LineClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._buf.clear()
        if sock is not None:
            sock.close()

    def _connect(self) -> _socket.socket:
        if self._sock is not None:
            return self._sock
        tried: list[tuple[str, BaseException]] = []
        for path in socket_paths(self.rule_path, self.root):
            try:
                sock = connect_unix(path, self.timeout)
            except OSError as exc:
                tried.append((path, exc))
                if isinstance(exc, (FileNotFoundError, ConnectionRefusedError)):
                    continue
            else:
                self.path, self._sock = path, sock
                return sock
            break
        raise ConnectionLost(unreachable(tried, self.root)) from tried[-1][1]

    def call(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        """Call `method` and return its result as plain data; raise its typed error (as Client.call)."""
        if kw:
            params = {**(params or {}), **kw}
        rid = self._next_id
        self._next_id += 1
        try:
            line = json.dumps(
                {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}},
                ensure_ascii=False, allow_nan=False, separators=(",", ":"),
            )
        except ValueError as exc:  # NaN or infinity: not JSON
            raise InvalidParams(f"params are not JSON: {exc}") from None
        sock = self._connect()
        deadline = time.monotonic() + self.timeout
        try:
            sock.settimeout(self.timeout)
            sock.sendall(line.encode() + b"\n")
            reply = self._read_reply(sock, rid, deadline)
        except TimeoutError:
            self.close()  # an answer may still come: the connection cannot be reused
            raise Timeout(f"no answer from {self.path} within {self.timeout}s") from None
        except OSError as exc:
            self.close()
            raise ConnectionLost(f"connection to {self.path} broke: {exc.strerror or exc}") from exc
        if reply.get("error") is not None:
            raise error_from_wire(reply["error"])
        return reply.get("result")

    def _read_reply(self, sock: _socket.socket, rid: int, deadline: float) -> dict[str, Any]:
        """The answer with id `rid`: the next non-blank line read (the server answers an unpipelined
        call before anything else; a line with another id is an error it could not attribute)."""
        while True:
            end = self._buf.find(b"\n")
            while end < 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                chunk = sock.recv(_RECV)
                if not chunk:
                    self.close()
                    raise ConnectionLost(f"eurekamem closed the connection ({self.path})")
                searched = len(self._buf)
                self._buf += chunk
                end = self._buf.find(b"\n", searched)
            line = bytes(self._buf[:end])
            del self._buf[: end + 1]
            if line.strip():
                break
        try:
            reply = json.loads(line)
        except ValueError as exc:
            self.close()
            raise ConnectionLost(f"malformed reply from server: {exc}") from None
        if not isinstance(reply, dict) or reply.get("id") != rid:
            self.close()
            if isinstance(reply, dict) and reply.get("id") is None and reply.get("error") is not None:
                err = error_from_wire(reply["error"])
                raise ConnectionLost(f"server could not attribute an error to a request: {err.kind}: {err}")
            raise ConnectionLost(f"malformed reply from server (not the answer to request {rid}): {line[:200]!r}")
        return reply
