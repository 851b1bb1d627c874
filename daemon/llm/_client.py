"""`LLM`: structured completions with retries, a budget, validation, accounting and no key leaks.

Rules kept here:
- Every request goes through the budget first (waiting, never refusing) and runs under the
  configured timeout; 429, 5xx, connection errors and timeouts are retried up to `max_attempts`
  requests per answer with jittered exponential back-off, never sooner than a Retry-After (one
  longer than `max_retry_wait` is not waited out: the call ends with LLMUnavailable carrying it,
  so the job queue backs off instead of holding a job slot).
- An answer is capped: longer than `_http.answer_byte_cap(max_output_tokens)` bytes (the providers
  stop reading there) or reporting more output tokens than max_output_tokens, it is `oversized`
  (LLMUnavailable, not retried within the call, never sent back in a correction), and it is
  charged no more than its reservation. No request is charged more than its ceiling (the bytes it
  sent, as tokens, plus max_output_tokens), so no answer's reported usage can sink the budget.
- An answer is validated on arrival with msgspec.convert (strict) against the output type (in a
  worker thread when it is large). One that does not validate is sent back once with the
  validation error; a second invalid answer raises LLMFailed naming both problems. Nothing invalid
  is ever returned.
- The API key's value is removed from every text that leaves: error reasons, log lines, the last
  error in `statistics()`; so is whatever the injected `scrub` finds (the daemon passes its
  redaction, so an error body's or a refusal's secrets are gone too). Headers are never logged;
  provider exceptions are not chained.
- Tokens are counted per call (in the result, and on the error of a failed call) and per provider;
  `continue_from(previous)` (sys.resume resolving the LLM again) keeps counting where the previous
  client was, and keeps its budget when the limits are the same.
- A caller is told why it waits (the budget, a back-off before a retry) through the callback that
  `report_waits` sets for its task: the job queue's `waiting_reason` of a running job.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

import msgspec
import trio

from ._budget import Budget
from ._config import ResolvedLLM
from ._errors import LLMError, LLMFailed, LLMUnavailable, Usage
from ._http import answer_byte_cap
from ._provider import Completion, CompletionRequest, Correction, Provider, UnavailableProvider, cap_rule
from ._schema import tool_spec

__all__ = ["LLM", "StructuredResult", "make_provider", "report_waits"]

log = logging.getLogger("eurekamem.llm")

T = TypeVar("T", bound=msgspec.Struct)

CHARS_PER_TOKEN = 4  # for estimates only: the budget's reservation, usage a provider did not report
REDACTED = "[redacted]"
OFF_LOOP_BYTES = 64 * 1024  # an answer longer than this is validated in a worker thread
CEILING_SLACK_TOKENS = 2048  # a request's framing (roles, the tool's definition) beyond the bytes it sent

_WAITING: contextvars.ContextVar[Callable[[str | None], Any] | None] = contextvars.ContextVar(
    "eurekamem_llm_waiting", default=None
)


@contextlib.contextmanager
def report_waits(note: Callable[[str | None], Any]) -> Iterator[None]:
    """Within the block, this task's LLM calls call `note(reason)` when they start waiting (for the
    budget, or out a back-off before a retry) and `note(None)` when they stop."""
    token = _WAITING.set(note)
    try:
        yield
    finally:
        _WAITING.reset(token)


def _note(reason: str | None) -> None:
    note = _WAITING.get()
    if note is not None:
        note(reason)


class StructuredResult(msgspec.Struct, Generic[T], frozen=True):
    """A validated answer. `usage` sums every request of the call (an invalid first answer
    included); `attempts` counts the requests sent (retries included)."""

    value: T
    usage: Usage
    attempts: int
    provider: str
    model: str


def make_provider(resolved: ResolvedLLM) -> Provider:
    """The provider `resolved` names, or one that raises LLMUnavailable when none can be used."""
    if not resolved.available:
        return UnavailableProvider(
            resolved.provider, resolved.model, resolved.unavailable_kind, resolved.unavailable_reason
        )
    return _Deferred(resolved)


class _Deferred(Provider):
    """The configured provider, made when the first answer is asked for (`ready`): its SDK
    (anthropic's takes ~1.6 s of CPU to import, openai's httpx ~0.4 s) is imported then, in a worker
    thread, not while the daemon starts; a daemon whose jobs never call the LLM never imports it."""

    def __init__(self, resolved: ResolvedLLM) -> None:
        self.name = resolved.provider
        self.model = resolved.model
        self._resolved = resolved
        self._provider: Provider | None = None
        self._making = trio.Lock()

    async def ready(self) -> None:
        if self._provider is not None:
            return
        async with self._making:
            if self._provider is None:
                module = "._anthropic" if self.name == "anthropic" else "._openai"
                found = await trio.to_thread.run_sync(importlib.import_module, module, __package__)
                kind = found.AnthropicProvider if self.name == "anthropic" else found.OpenAIProvider
                r = self._resolved
                self._provider = kind(model=r.model, api_key=r.api_key, base_url=r.base_url, timeout=r.timeout)

    async def complete(self, request: CompletionRequest) -> Completion:
        if self._provider is None:
            await self.ready()
        assert self._provider is not None
        return await self._provider.complete(request)

    async def aclose(self) -> None:
        if self._provider is not None:
            await self._provider.aclose()


class _Counters:
    """What statistics() reports for the provider."""

    def __init__(self) -> None:
        self.calls = 0
        self.succeeded = 0
        self.requests = 0
        self.failures: Counter[str] = Counter()  # calls that ended in an error, by kind
        self.retried: Counter[str] = Counter()  # requests retried, by the kind of their error
        self.input_tokens = 0
        self.output_tokens = 0
        self.last_error = ""
        self.last_error_kind = ""
        self.last_error_at = 0.0  # Unix time (0: never)


class LLM:
    """One configured provider with its budget and counters; the job queue's way to an LLM.

    `sleep` is awaited for back-off delays and `rng` draws their jitter (inject both in tests);
    the budget waits on `budget_sleep` (trio.sleep: a MockClock drives it). `provider` replaces the
    one `resolved` names (a fake in tests). Use as `async with LLM(...) as llm:` or call aclose().
    """

    def __init__(
        self,
        resolved: ResolvedLLM,
        *,
        provider: Provider | None = None,
        sleep: Callable[[float], Awaitable[Any]] = trio.sleep,
        rng: random.Random | None = None,
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        max_retry_wait: float = 120.0,
        budget_clock: Callable[[], float] = trio.current_time,
        budget_sleep: Callable[[float], Awaitable[Any]] = trio.sleep,
        scrub: Callable[[str], str] | None = None,
    ) -> None:
        self.resolved = resolved
        self.provider = provider if provider is not None else make_provider(resolved)
        self.budget = Budget(
            resolved.requests_per_minute, resolved.tokens_per_minute, clock=budget_clock, sleep=budget_sleep
        )
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_retry_wait = max_retry_wait
        self._counters = _Counters()
        self._key = resolved.api_key.reveal()
        self._scrub = scrub  # more than the key to remove from what leaves (the daemon's redaction)

    def continue_from(self, previous: Any) -> None:
        """Count on from `previous` (the client this one replaces: sys.resume resolved the LLM
        again): its counters become this one's, shared, so what its calls still in flight end with
        counts too; and its budget, when the per-minute limits are the same, so a new client is
        no way around them."""
        counters = getattr(previous, "_counters", None)
        if isinstance(counters, _Counters):
            self._counters = counters
        budget = getattr(previous, "budget", None)
        if (
            isinstance(budget, Budget)
            and budget.requests_per_minute == self.budget.requests_per_minute
            and budget.tokens_per_minute == self.budget.tokens_per_minute
        ):
            self.budget = budget

    async def __aenter__(self) -> LLM:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.provider.aclose()

    def __repr__(self) -> str:
        return f"LLM({self.resolved.provider!r}, {self.resolved.model!r}, {self.redact(self.resolved.base_url)!r})"

    @property
    def available(self) -> bool:
        """False when no call can succeed until the configuration changes (see `unavailable_reason`)."""
        return self.resolved.available

    @property
    def unavailable_reason(self) -> str:
        return self.resolved.unavailable_reason

    def redact(self, text: str) -> str:
        """`text` without the API key's value (and what the injected `scrub` removes)."""
        if self._key:
            text = text.replace(self._key, REDACTED)
        return self._scrub(text) if self._scrub is not None else text

    # ---- the call ---------------------------------------------------------------------------------

    async def complete_structured(
        self,
        system: str,
        prompt: str,
        output_type: type[T],
        *,
        name: str,
        description: str = "",
    ) -> StructuredResult[T]:
        """Ask for one `output_type` value; `name` names the tool / schema (letters, digits, _ and -).

        Raises LLMUnavailable (try later: the job stays queued) or LLMFailed (the answer was unusable:
        the job fails with the reason). Both carry the tokens spent in `usage`."""
        tool = tool_spec(output_type, name, description)
        self._counters.calls += 1
        spent = Usage()
        attempts = 0
        problems: list[str] = []
        corrections: tuple[Correction, ...] = ()
        try:
            while True:
                request = CompletionRequest(system, prompt, tool, self.resolved.max_output_tokens, corrections)
                completion, sent, request_usage = await self._answer(request)
                attempts += sent
                spent += request_usage
                problem = completion.decode_error
                if not problem:
                    try:
                        value = await _convert(completion, output_type)
                    except msgspec.ValidationError as e:
                        problem = str(e)
                    else:
                        break
                problems.append(problem)
                if corrections:
                    raise LLMFailed(
                        "invalid_answer",
                        f"the answer did not validate twice: first {problems[0]}; then {problems[1]}",
                    )
                self._counters.retried["invalid_answer"] += 1
                log.info(
                    "llm %s: the %s answer did not validate, asking again: %s",
                    self.provider.name,
                    name,
                    self.redact(problem),
                )
                corrections = (Correction(completion, problem),)
        except LLMError as error:
            error.usage = spent + error.usage
            self._fail(error)
            raise
        self._counters.succeeded += 1
        return StructuredResult(value, spent, attempts, self.provider.name, self.provider.model)

    async def _answer(self, request: CompletionRequest) -> tuple[Completion, int, Usage]:
        """One answer: requests until one succeeds, with budget, timeout and back-off. Returns the
        answer, the requests sent, and the tokens used (failed requests' included)."""
        estimate = _estimate_input(request)
        spent = Usage()
        error: LLMError | None = None
        if isinstance(self.provider, UnavailableProvider):
            await self.provider.complete(request)  # raises at once: no budget spent, nothing retried
        await self.provider.ready()  # not within the first request's timeout
        reservation = estimate + request.max_output_tokens
        ceiling = _input_ceiling(request) + request.max_output_tokens  # the most a request is charged
        for attempt in range(1, self.resolved.max_attempts + 1):
            await self.budget.acquire(reservation, _WAITING.get())
            self._counters.requests += 1
            used = 0
            try:
                with trio.move_on_after(self.resolved.timeout) as deadline:
                    completion = await self.provider.complete(request)
                if deadline.cancelled_caught:
                    raise LLMUnavailable("timeout", f"no answer within {self.resolved.timeout:g} s")
                completion = self._capped(completion, request, estimate)
                used = min(completion.usage.total_tokens, ceiling)
                self._count_tokens(completion.usage)
                return completion, attempt, spent + completion.usage
            except LLMError as e:
                if e.kind == "oversized":  # charged what the cap allows, whatever it claims to have cost
                    e.usage = Usage(estimate, request.max_output_tokens, estimated=True)
                used = min(e.usage.total_tokens, ceiling)
                self._count_tokens(e.usage)
                spent += e.usage
                e.usage = spent
                error = e
            finally:
                self.budget.settle(reservation, used)
            if not (isinstance(error, LLMUnavailable) and error.transient) or attempt == self.resolved.max_attempts:
                break
            retry_after = error.retry_after
            if retry_after is not None and retry_after > self.max_retry_wait:
                error.reason += f" (Retry-After {retry_after:g} s is longer than this call waits)"
                break
            delay = self._backoff(attempt, retry_after)
            self._counters.retried[error.kind] += 1
            log.warning(
                "llm %s: %s; retrying in %.2f s (attempt %d of %d)",
                self.provider.name,
                self.redact(str(error.reason)),
                delay,
                attempt + 1,
                self.resolved.max_attempts,
            )
            _note(
                f"retrying the LLM request after {error.kind} at "
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(time.time() + delay))} ({delay:.1f} s; "
                f"attempt {attempt + 1} of {self.resolved.max_attempts})"
            )
            try:
                await self._sleep(delay)
            finally:
                _note(None)
        assert error is not None
        if isinstance(error, LLMUnavailable) and error.transient:
            error.reason += f" (after {attempt} attempt{'s' if attempt > 1 else ''})"
        raise error

    def _capped(self, completion: Completion, request: CompletionRequest, estimate: int) -> Completion:
        """The completion with usage a provider did not report estimated (output at most
        max_output_tokens), or LLMUnavailable("oversized") when it is longer than the cap allows."""
        limit = request.max_output_tokens
        cap = answer_byte_cap(limit)
        size = max(completion.size, len(completion.text))
        if size > cap:
            raise LLMUnavailable(
                "oversized",
                f"the answer is {size:,} bytes, more than the answer cap of {cap:,} bytes ({cap_rule(limit)}); refused",
            )
        usage = completion.usage
        if usage.estimated:
            output = min(len(completion.text) // CHARS_PER_TOKEN + 1, limit)
            return msgspec.structs.replace(completion, usage=Usage(estimate, output, estimated=True))
        if usage.output_tokens > limit:
            raise LLMUnavailable(
                "oversized",
                f"the provider reports {usage.output_tokens:,} output tokens, more than "
                f"llm_max_output_tokens {limit}; refused",
            )
        return completion

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Jittered exponential back-off after failed attempt `attempt` (1-based), at least Retry-After."""
        ceiling = min(self.backoff_max, self.backoff_base * 2.0 ** (attempt - 1))
        delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        return max(delay, retry_after) if retry_after is not None else delay

    def _count_tokens(self, usage: Usage) -> None:
        self._counters.input_tokens += usage.input_tokens
        self._counters.output_tokens += usage.output_tokens

    def _fail(self, error: LLMError) -> None:
        error.provider = self.provider.name
        error.model = self.provider.model
        error.scrub(self.redact)
        counters = self._counters
        counters.failures[error.kind] += 1
        counters.last_error = str(error)
        counters.last_error_kind = error.kind
        counters.last_error_at = time.time()
        level = logging.INFO if error.kind == "not_configured" else logging.WARNING
        log.log(level, "llm call failed: %s", counters.last_error)

    # ---- accounting -------------------------------------------------------------------------------

    def statistics(self) -> dict[str, dict[str, Any]]:
        """Per provider (one here, keyed by its name): calls, requests, failures by kind, tokens,
        the last error (scrubbed) and the budget's state. Plain builtins, ready for sys.stats."""
        counters = self._counters
        resolved = self.resolved
        entry = {
            "provider": resolved.provider,
            "model": resolved.model,
            "base_url": self.redact(resolved.base_url),
            "available": resolved.available,
            "unavailable_reason": resolved.unavailable_reason,
            "calls": counters.calls,
            "succeeded": counters.succeeded,
            "requests": counters.requests,
            "failures": dict(counters.failures),
            "retried": dict(counters.retried),
            "input_tokens": counters.input_tokens,
            "output_tokens": counters.output_tokens,
            "last_error": counters.last_error,
            "last_error_kind": counters.last_error_kind,
            "last_error_at": counters.last_error_at,
            "budget": self.budget.state(),
        }
        return {resolved.provider: entry}


async def _convert(completion: Completion, output_type: type[T]) -> T:
    """The answer converted (strictly) to `output_type`; in a worker thread when it is large."""
    if max(completion.size, len(completion.text)) > OFF_LOOP_BYTES:
        return await trio.to_thread.run_sync(lambda: msgspec.convert(completion.data, output_type, strict=True))
    return msgspec.convert(completion.data, output_type, strict=True)


def _input_ceiling(request: CompletionRequest) -> int:
    """The most input tokens `request` can cost: a token is at least one byte of what was sent."""
    sent = len(request.system.encode()) + len(request.prompt.encode()) + len(msgspec.json.encode(request.tool.schema))
    for correction in request.corrections:
        sent += len(correction.answer.text.encode()) + len(msgspec.json.encode(correction.answer.data))
        sent += len(correction.problem.encode())
    return sent + CEILING_SLACK_TOKENS * (1 + len(request.corrections))


def _estimate_input(request: CompletionRequest) -> int:
    """Input tokens `request` will cost, roughly (characters / 4), for the budget's reservation."""
    characters = len(request.system) + len(request.prompt) + len(msgspec.json.encode(request.tool.schema))
    for correction in request.corrections:
        characters += (
            len(correction.answer.text) + len(msgspec.json.encode(correction.answer.data)) + len(correction.problem)
        )
    return characters // CHARS_PER_TOKEN + 16
