"""The one interface every LLM provider implements, and the HTTP facts they share.

Rule kept here: a provider makes exactly one request per `complete()` call and either returns a
`Completion` (the decoded answer, or the reason it could not be decoded, and the tokens used) or
raises LLMUnavailable / LLMFailed with the kind the status or the answer implies. Retrying,
budgets, timeouts around the request, validation and key scrubbing belong to the layer above
(`_client.LLM`), so every provider gets them the same way. A provider never logs a header, and
never reads a response past the answer cap (`_http`: an answer longer than max_output_tokens
allows is `oversized`, refused unread).
"""

from __future__ import annotations

import abc
import email.utils
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from ._errors import LLMError, LLMFailed, LLMUnavailable, Usage
from ._http import BYTES_PER_TOKEN, ENVELOPE_BYTES, AnswerTooLarge
from ._schema import ToolSpec

__all__ = [
    "Completion",
    "CompletionRequest",
    "Correction",
    "Provider",
    "UnavailableProvider",
    "body_snippet",
    "oversized",
    "parse_retry_after",
    "status_error",
]


class Completion(msgspec.Struct, frozen=True):
    """One answer. `data` is the decoded JSON value (None when `decode_error` says why it could not
    be decoded); `text` the answer as sent back in a correction; `call_id` the tool call's id
    (Anthropic), "" otherwise; `size` the bytes of the response it came in (0: not known)."""

    data: Any
    text: str
    usage: Usage
    call_id: str = ""
    decode_error: str = ""
    size: int = 0


class Correction(msgspec.Struct, frozen=True):
    """An earlier answer and what was wrong with it, sent back so the model can fix it."""

    answer: Completion
    problem: str


class CompletionRequest(msgspec.Struct, frozen=True):
    system: str
    prompt: str
    tool: ToolSpec
    max_output_tokens: int
    corrections: tuple[Correction, ...] = ()


def correction_text(tool_name: str, problem: str) -> str:
    """What the model is told about an answer that did not validate."""
    return (
        f"That answer does not match the {tool_name} schema: {problem}. "
        f"Answer again with the whole {tool_name} object, corrected."
    )


class Provider(abc.ABC):
    """An LLM endpoint. `name` is the provider ("anthropic", "openai"), `model` the model asked."""

    name: str = ""
    model: str = ""

    @abc.abstractmethod
    async def complete(self, request: CompletionRequest) -> Completion:
        """Send one request; return its answer or raise LLMUnavailable / LLMFailed."""

    async def ready(self) -> None:  # noqa: B027 - most providers are ready once made
        """Be ready to send: called before each answer's requests, outside their timeout."""

    async def aclose(self) -> None:  # noqa: B027 - a provider without connections has nothing to close
        """Release the provider's connections."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.model!r})"


class UnavailableProvider(Provider):
    """No provider can be used (none configured, no key): every call raises LLMUnavailable."""

    def __init__(self, name: str, model: str, kind: str, reason: str) -> None:
        self.name = name
        self.model = model
        self.kind = kind
        self.reason = reason

    async def complete(self, request: CompletionRequest) -> Completion:
        raise LLMUnavailable(self.kind, self.reason)


def status_error(status: int, snippet: str, retry_after: float | None) -> LLMError:
    """The error an HTTP status (not 2xx) means for this layer."""
    text = f"HTTP {status}: {snippet}"
    if status == 429:
        return LLMUnavailable("rate_limited", text, retry_after=retry_after)
    if status >= 500 or status in (408, 409):
        return LLMUnavailable("server_error", text, retry_after=retry_after)
    if status in (401, 403):
        return LLMUnavailable("auth", text)
    if status == 404:
        return LLMUnavailable("not_found", text)
    return LLMFailed("bad_request", text)


def cap_rule(max_output_tokens: int) -> str:
    """How the answer cap of a request is made, for the reasons that name it."""
    return f"llm_max_output_tokens {max_output_tokens} x {BYTES_PER_TOKEN} bytes + {ENVELOPE_BYTES // 1024} KiB"


def oversized(too_large: AnswerTooLarge, max_output_tokens: int) -> LLMUnavailable:
    """The error of a response refused at the answer cap (nothing of it is kept or sent back)."""
    return LLMUnavailable("oversized", f"{too_large} ({cap_rule(max_output_tokens)}); refused, not read further")


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms`, else `retry-after` (seconds or an HTTP date)."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        try:
            value = float(milliseconds) / 1000
        except ValueError:
            value = -1.0
        if 0 <= value < float("inf"):
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        value = max(0.0, when.timestamp() - time.time())
    return value if 0 <= value < float("inf") else None


def body_snippet(text: str, limit: int = 300) -> str:
    """A response body squeezed to one line of at most `limit` characters, for an error message."""
    flat = " ".join(text.split())
    if not flat:
        return "<empty body>"
    return flat[:limit] + ("…" if len(flat) > limit else "")
