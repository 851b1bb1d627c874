"""The errors of the LLM layer, split by what the job queue should do about them.

Rule kept here: every failure of a call is exactly one of two kinds. `LLMUnavailable` means the
provider could not be used now (not configured, no key, refused, timed out, rate-limited, 5xx
after every attempt, an oversized answer): the job stays queued and backs off, using `retry_after` when the provider
said how long. `LLMFailed` means the provider answered and the answer is unusable (it did not
validate twice, it was empty, it was a refusal, the request itself was rejected): the job fails
with `reason`. Each error carries a short machine `kind`, for statistics and for `jobs.list`.

The texts here are built by the layer and scrubbed of the API key before they leave it; an error
never carries the provider SDK's exception as its cause (that text is not ours to vouch for).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

__all__ = [
    "FAILED_KINDS",
    "UNAVAILABLE_KINDS",
    "LLMError",
    "LLMFailed",
    "LLMUnavailable",
    "Usage",
]

# LLMUnavailable kinds: the first four are not retried within a call (they need a person or time).
UNAVAILABLE_KINDS = (
    "not_configured",  # no provider configured and none implied by the environment
    "no_key",  # the provider needs a key and its variable is not set
    "auth",  # 401 / 403: the key was refused
    "not_found",  # 404: wrong base URL or unknown model
    "rate_limited",  # 429
    "server_error",  # 5xx (Anthropic's 529 included), 408, 409, or an answer that is not JSON at all
    "timeout",  # no answer within the call's timeout
    "connection",  # refused, reset, DNS, TLS
    # an answer longer than max_output_tokens allows (bytes past the cap, or more output tokens than
    # asked): refused unread and never sent back; not retried within the call (the job backs off)
    "oversized",
)
FAILED_KINDS = (
    "invalid_answer",  # did not validate against the output type, twice
    "empty_content",  # no content (a reasoning model that only reasoned)
    "refusal",  # the model refused
    "truncated",  # cut off at max_output_tokens
    "no_answer",  # no tool call / no choice in an otherwise well-formed response
    "bad_request",  # another 4xx: this request will never succeed as it is
)


class Usage(msgspec.Struct, frozen=True):
    """Tokens one call (or one failed call, up to its failure) used, as the provider reported them.

    `estimated` is True when a provider did not report usage and the layer counted characters."""

    input_tokens: int = 0
    output_tokens: int = 0
    estimated: bool = False

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.estimated or other.estimated,
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class LLMError(Exception):
    """A call to the LLM layer did not produce a value. `kind` is one of UNAVAILABLE_KINDS or
    FAILED_KINDS, `reason` a human sentence; `usage` the tokens spent before the failure."""

    def __init__(
        self, kind: str, reason: str, *, provider: str = "", model: str = "", usage: Usage | None = None
    ) -> None:
        super().__init__(kind, reason)
        self.kind = kind
        self.reason = reason
        self.provider = provider
        self.model = model
        self.usage = usage if usage is not None else Usage()

    def __str__(self) -> str:
        where = f"{self.provider}:{self.model}: " if self.provider else ""
        return f"{where}{self.kind}: {self.reason}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind!r}, {self.reason!r})"

    def scrub(self, redact: Callable[[str], str]) -> None:
        """Pass every text this error holds through `redact` (which removes the key)."""
        self.reason = redact(self.reason)
        self.args = (self.kind, self.reason)


class LLMUnavailable(LLMError):
    """The provider cannot be used now; try the job again later (after `retry_after` seconds when
    the provider said so). `transient` is True for the kinds worth retrying within the same call."""

    def __init__(
        self,
        kind: str,
        reason: str,
        *,
        retry_after: float | None = None,
        provider: str = "",
        model: str = "",
        usage: Usage | None = None,
    ) -> None:
        if kind not in UNAVAILABLE_KINDS:
            raise ValueError(f"unknown LLMUnavailable kind {kind!r}")
        super().__init__(kind, reason, provider=provider, model=model, usage=usage)
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        return self.kind in ("rate_limited", "server_error", "timeout", "connection")


class LLMFailed(LLMError):
    """The provider answered and the answer cannot be used; the job fails with `reason`."""

    def __init__(
        self, kind: str, reason: str, *, provider: str = "", model: str = "", usage: Usage | None = None
    ) -> None:
        if kind not in FAILED_KINDS:
            raise ValueError(f"unknown LLMFailed kind {kind!r}")
        super().__init__(kind, reason, provider=provider, model=model, usage=usage)
