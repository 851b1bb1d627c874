"""The HTTP clients the providers use, reading every response bounded by the answer cap.

Rule kept here: no response of an LLM endpoint is read past `answer_byte_cap(max_output_tokens)`
bytes (an answer cannot legitimately be longer: max_output_tokens tokens of at most
BYTES_PER_TOKEN bytes each, in the provider's JSON, plus the envelope). Both providers' clients
(httpx for the OpenAI-compatible one, the anthropic SDK's httpx2) send through `send` below: it asks
for an uncompressed body (Accept-Encoding: identity, so the bytes counted are the bytes decoded),
refuses a Content-Length above the cap before reading anything, and otherwise stops reading at the
cap, closing the connection; either raises AnswerTooLarge, which the provider turns into this
layer's `oversized` error. A body compressed against the request is refused too (its decoded size
is not bounded by what is read), and redirects are not followed (their bodies would be read
outside the count). The cap of a request is the one `capped(...)` set for the task that sends it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import AsyncIterator, Iterator
from typing import Any

__all__ = [
    "BYTES_PER_TOKEN",
    "ENVELOPE_BYTES",
    "AnswerTooLarge",
    "CappedSend",
    "answer_byte_cap",
    "capped",
]

BYTES_PER_TOKEN = 32  # generous: a token is a few characters, each at most a JSON escape inside a JSON string
ENVELOPE_BYTES = 64 * 1024  # what a response holds besides the answer (ids, usage, metadata, an error's text)
DEFAULT_MAX_OUTPUT_TOKENS = 4096  # LLMConfig's default: the cap of a request sent outside `capped`


def answer_byte_cap(max_output_tokens: int) -> int:
    """The most bytes of a response read for an answer of at most `max_output_tokens` tokens."""
    return max(1, max_output_tokens) * BYTES_PER_TOKEN + ENVELOPE_BYTES


DEFAULT_CAP = DEFAULT_MAX_OUTPUT_TOKENS * BYTES_PER_TOKEN + ENVELOPE_BYTES  # answer_byte_cap(4096)
_CAP: contextvars.ContextVar[int] = contextvars.ContextVar("eurekamem_llm_answer_cap", default=DEFAULT_CAP)


@contextlib.contextmanager
def capped(max_output_tokens: int) -> Iterator[int]:
    """Within the block, this task's requests read at most answer_byte_cap(max_output_tokens) bytes."""
    cap = answer_byte_cap(max_output_tokens)
    token = _CAP.set(cap)
    try:
        yield cap
    finally:
        _CAP.reset(token)


class AnswerTooLarge(Exception):
    """A response longer than the cap: `seen` bytes read (or declared by Content-Length) when it stopped."""

    def __init__(self, cap: int, seen: int, how: str) -> None:
        super().__init__(cap, seen, how)
        self.cap = cap
        self.seen = seen
        self.how = how

    def __str__(self) -> str:
        return f"the response {self.how} more than the answer cap of {self.cap:,} bytes"


class _Capped:
    """A response's byte stream that raises AnswerTooLarge past `cap` bytes. Made a subclass of the
    client's own AsyncByteStream (`_capped_stream`): httpx and httpx2 each check for theirs."""

    def __init__(self, inner: Any, cap: int) -> None:
        self._inner = inner
        self._cap = cap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._cap:
                raise AnswerTooLarge(self._cap, seen, f"went on past {seen:,} bytes,")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


@functools.cache
def _capped_stream(base: type) -> type:
    return type(f"Capped{base.__name__}", (_Capped, base), {})


class CappedSend:
    """Mixed into an httpx (or httpx2) AsyncClient: every send reads its response bounded (the
    module's rule). A subclass names its library's AsyncByteStream in `stream_base`."""

    stream_base: type

    async def send(self, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
        cap = _CAP.get()
        request.headers["Accept-Encoding"] = "identity"
        kwargs["follow_redirects"] = False
        response = await super().send(request, stream=True, **kwargs)  # type: ignore[misc]
        try:
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise AnswerTooLarge(cap, 0, f"is compressed ({encoding}) though asked not to be, so it may be")
            length = response.headers.get("content-length", "")
            if length.isdigit() and int(length) > cap:
                raise AnswerTooLarge(cap, int(length), f"declares {int(length):,} bytes,")
            response.stream = _capped_stream(self.stream_base)(response.stream, cap)
            if not stream:
                await response.aread()
        except BaseException:
            await response.aclose()
            raise
        return response
