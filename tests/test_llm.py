"""The LLM access layer (daemon/llm): the real anthropic SDK and the real httpx client against a
loopback stub server answering from fixtures; the budget on trio's MockClock with a fake provider.

No network besides 127.0.0.1; back-off delays go to a recording sleep, never really slept; every
random draw is seeded.
"""

from __future__ import annotations

import email.utils
import functools
import json
import logging
import random
import socket
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

import msgspec
import pytest
import trio
import trio.testing
from msgspec import Meta

from conftest import IO_TIMEOUT
from eurekamem.daemon.llm import (
    DEFAULT_ANTHROPIC_MODEL,
    LLM,
    Budget,
    Completion,
    CompletionRequest,
    LLMConfig,
    LLMConfigError,
    LLMFailed,
    LLMUnavailable,
    Provider,
    Usage,
    parse_config,
    resolve,
    tool_spec,
)
from eurekamem.daemon.llm._client import _estimate_input
from eurekamem.daemon.llm._provider import parse_retry_after
from eurekamem.daemon.llm._schema import strict_schema
from eurekamem.daemon.llm.loopback import HANG as LOOPBACK_HANG
from eurekamem.daemon.llm.loopback import LLMServer

KEY = "sk-SENTINEL-9f3c2a7e-do-not-leak"
SEED = 20261201


# --- the output types the tests ask for ------------------------------------------------------------


class Insight(msgspec.Struct, forbid_unknown_fields=True):
    title: Annotated[str, Meta(min_length=1, max_length=80)]
    confidence: Annotated[float, Meta(ge=0, le=1)]
    category: Literal["domain_knowledge", "proof_strategy", "open_problems", "pitfalls"]


class Extraction(msgspec.Struct):
    """Insights drawn from one research session."""

    items: list[Insight]
    summary: str = ""


class Node(msgspec.Struct):
    """A recursive type: no provider schema can inline it."""

    children: list[Node]


GOOD = {"items": [{"title": "Peeling", "confidence": 0.9, "category": "proof_strategy"}], "summary": "one"}
OUT_OF_RANGE = {"items": [{"title": "Peeling", "confidence": 1.7, "category": "proof_strategy"}]}
RANGE_ERROR = "Expected `float` <= 1.0 - at `$.items[0].confidence`"
WRONG_CATEGORY = {"items": [{"title": "Peeling", "confidence": 0.9, "category": "gossip"}]}


# --- fixtures: what the stub answers ---------------------------------------------------------------

Reply = tuple[int, Any, dict[str, str]]  # status, JSON body (or bytes), headers
HANG = "hang"  # a scripted reply: never answer


def anthropic_tool(
    data: Any,
    *,
    input_tokens: int = 120,
    output_tokens: int = 30,
    call_id: str = "toolu_01",
    name: str = "extraction",
    stop_reason: str = "tool_use",
    **usage: int,
) -> Reply:
    body = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "test-model",
        "content": [{"type": "tool_use", "id": call_id, "name": name, "input": data}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens, **usage},
    }
    return 200, body, {}


def openai_message(
    content: str | None,
    *,
    prompt_tokens: int | None = 200,
    completion_tokens: int = 40,
    finish_reason: str = "stop",
    **message: Any,
) -> Reply:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "finish_reason": finish_reason,
                "message": {"role": "assistant", "content": content, **message},
            }
        ],
    }
    if prompt_tokens is not None:
        body["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
    return 200, body, {}


def valid_answer(provider: str, data: Any = GOOD) -> Reply:
    return anthropic_tool(data) if provider == "anthropic" else openai_message(json.dumps(data))


def http_error(status: int, retry_after: str | None = None, message: str = "try again") -> Reply:
    body = {"type": "error", "error": {"type": "api_error", "message": message}}
    return status, body, ({"Retry-After": retry_after} if retry_after is not None else {})


# --- the stub server -------------------------------------------------------------------------------


class Recorded(msgspec.Struct):
    path: str
    headers: dict[str, str]
    body: Any


class StubLLMServer(LLMServer):
    """A loopback server (daemon/llm/loopback.py's LLMServer) speaking just enough of Anthropic's
    /v1/messages and OpenAI's /v1/chat/completions: each request takes the next scripted reply (a
    Reply, HANG, or a function of the Recorded request returning a Reply). Every request is recorded."""

    def __init__(self) -> None:
        self.script: deque[Reply | str | Callable[[Recorded], Reply]] = deque()
        self.requests: list[Recorded] = []
        super().__init__(answer_timeout=IO_TIMEOUT)

    def respond(self, path: str, headers: dict[str, str], body: Any) -> Any:
        recorded = Recorded(path, headers, body)
        self.requests.append(recorded)
        action = self.script.popleft() if self.script else http_error(500, message="script exhausted")
        if action == HANG:
            return LOOPBACK_HANG
        return action(recorded) if callable(action) else action


@pytest.fixture
def stub() -> Iterator[StubLLMServer]:
    server = StubLLMServer()
    yield server
    server.close()


class RecordingSleep:
    """An injected sleep: records each delay, yields once, never waits."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await trio.lowlevel.checkpoint()


KEY_VARIABLE = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
PROVIDERS = ["anthropic", "openai"]


def make_llm(provider: str, url: str, sleep: RecordingSleep | None = None, **settings: Any) -> LLM:
    settings.setdefault("model", "test-model")
    config = LLMConfig(provider=provider, base_url=url, **settings)  # type: ignore[arg-type]
    return LLM(resolve(config, {KEY_VARIABLE[provider]: KEY}), sleep=sleep or RecordingSleep(), rng=random.Random(SEED))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request_text(recorded: Recorded) -> str:
    return json.dumps(recorded.body)


# --- configuration ---------------------------------------------------------------------------------


def test_nothing_configured_uses_anthropic_when_its_key_is_set() -> None:
    resolved = resolve(None, {"ANTHROPIC_API_KEY": KEY})
    assert resolved.available and resolved.provider == "anthropic"
    assert resolved.model == DEFAULT_ANTHROPIC_MODEL == "claude-haiku-4-5"
    assert resolved.base_url == "https://api.anthropic.com"
    assert resolved.api_key.reveal() == KEY and KEY not in repr(resolved)
    assert (resolved.timeout, resolved.max_attempts, resolved.requests_per_minute) == (60.0, 4, 50)
    assert (resolved.tokens_per_minute, resolved.max_output_tokens) == (200_000, 4096)


def test_nothing_configured_and_no_key_means_no_provider() -> None:
    resolved = resolve(None, {"OPENAI_API_KEY": KEY})
    assert resolved.provider == "none" and not resolved.available
    assert resolved.unavailable_kind == "not_configured" and "ANTHROPIC_API_KEY" in resolved.unavailable_reason


def test_fast_model_and_base_url_come_from_the_environment() -> None:
    environ = {
        "ANTHROPIC_API_KEY": KEY,
        "EUREKACLAW_FAST_MODEL": "claude-fast-x",
        "ANTHROPIC_BASE_URL": "http://proxy:8080/",
    }
    resolved = resolve(None, environ)
    assert (resolved.model, resolved.base_url) == ("claude-fast-x", "http://proxy:8080")
    configured = resolve(LLMConfig(model="claude-configured", base_url="http://other"), environ)
    assert (configured.model, configured.base_url) == ("claude-configured", "http://other")


def test_anthropic_configured_without_its_key_is_unavailable_with_the_reason() -> None:
    resolved = resolve(LLMConfig(provider="anthropic"), {})
    assert resolved.unavailable_kind == "no_key" and "ANTHROPIC_API_KEY is not set" in resolved.unavailable_reason
    custom = resolve(LLMConfig(provider="anthropic", api_key_env="MY_KEY"), {"MY_KEY": KEY})
    assert custom.available and custom.api_key.reveal() == KEY


def test_openai_needs_a_model_but_a_local_server_needs_no_key() -> None:
    with pytest.raises(LLMConfigError, match="needs a model"):
        resolve(LLMConfig(provider="openai", base_url="http://127.0.0.1:11434/v1"), {})
    local = resolve(LLMConfig(provider="openai", model="qwen3", base_url="http://127.0.0.1:11434/v1"), {})
    assert local.available and not local.api_key and local.api_key_env == "OPENAI_API_KEY"
    named = resolve(LLMConfig(provider="openai", model="qwen3", api_key_env="VLLM_KEY"), {})
    assert named.unavailable_kind == "no_key" and named.base_url == "https://api.openai.com/v1"
    from_fast_model = resolve(LLMConfig(provider="openai"), {"EUREKACLAW_FAST_MODEL": "llama3.2"})
    assert from_fast_model.model == "llama3.2"


def test_bad_settings_are_refused_with_their_name() -> None:
    with pytest.raises(LLMConfigError, match="timeout"):
        resolve(LLMConfig(timeout=-1.0), {})
    with pytest.raises(LLMConfigError, match="base_url"):
        resolve(LLMConfig(provider="anthropic", base_url="ftp://x"), {"ANTHROPIC_API_KEY": KEY})
    with pytest.raises(LLMConfigError, match="temperature"):
        parse_config({"provider": "openai", "temperature": 0.2})
    with pytest.raises(LLMConfigError, match="provider"):
        parse_config({"provider": "gemini"})
    assert parse_config({"provider": "openai", "model": "m", "requests_per_minute": 5}).requests_per_minute == 5


# --- schemas -------------------------------------------------------------------------------------


def test_the_schema_is_inlined_from_the_struct() -> None:
    spec = tool_spec(Extraction, "extraction")
    text = json.dumps(spec.schema)
    assert "$ref" not in text and "$defs" not in text
    assert spec.schema["type"] == "object" and spec.schema["required"] == ["items"]
    item = spec.schema["properties"]["items"]["items"]
    assert item["properties"]["confidence"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert item["properties"]["category"]["enum"][0] == "domain_knowledge"
    assert spec.description == "Insights drawn from one research session."


def test_the_strict_schema_closes_every_object_and_requires_every_property() -> None:
    class Defaults(msgspec.Struct):
        default: str = "kept as a property"
        inner: Extraction | None = None

    strict = strict_schema(tool_spec(Defaults, "defaults").schema)
    assert strict["required"] == ["default", "inner"] and strict["additionalProperties"] is False
    assert "default" not in strict["properties"]["default"]  # the keyword goes, the property stays
    inner = strict["properties"]["inner"]["anyOf"][0]
    assert inner["additionalProperties"] is False and inner["required"] == ["items", "summary"]
    assert inner["properties"]["items"]["items"]["additionalProperties"] is False


def test_schemas_a_provider_cannot_take_are_refused() -> None:
    class Row(msgspec.Struct, array_like=True):
        a: int

    with pytest.raises(TypeError, match="recursive"):
        tool_spec(Node, "node")
    with pytest.raises(TypeError, match="object schema"):
        tool_spec(Row, "row")
    with pytest.raises(TypeError, match=r"msgspec\.Struct"):
        tool_spec(dict, "plain")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name"):
        tool_spec(Extraction, "has spaces")


# --- answers over the real clients -----------------------------------------------------------------


async def test_anthropic_valid_tool_answer(stub: StubLLMServer) -> None:
    stub.script.append(anthropic_tool(GOOD, input_tokens=321, output_tokens=45))
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm("anthropic", stub.url("anthropic"), max_output_tokens=777) as llm:
            result = await llm.complete_structured("You extract.", "The session...", Extraction, name="extraction")
    assert result.value == msgspec.convert(GOOD, Extraction)
    assert (result.usage.input_tokens, result.usage.output_tokens, result.attempts) == (321, 45, 1)
    assert (result.provider, result.model) == ("anthropic", "test-model")
    [sent] = stub.requests
    assert sent.path == "/v1/messages"
    assert sent.body["tool_choice"] == {"type": "tool", "name": "extraction"}
    assert sent.body["tools"][0]["input_schema"] == tool_spec(Extraction, "extraction").schema
    assert (sent.body["system"], sent.body["model"], sent.body["max_tokens"]) == ("You extract.", "test-model", 777)
    assert sent.body["messages"] == [{"role": "user", "content": "The session..."}]
    assert KEY in " ".join(sent.headers.values())  # the key went to the server, and only there
    assert sent.headers.get("x-stainless-retry-count") == "0"


async def test_openai_valid_json_schema_answer(stub: StubLLMServer) -> None:
    stub.script.append(
        openai_message("```json\n" + json.dumps(GOOD) + "\n```", prompt_tokens=222, completion_tokens=33)
    )
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm("openai", stub.url("openai")) as llm:
            result = await llm.complete_structured("You extract.", "The session...", Extraction, name="extraction")
    assert result.value.items[0].title == "Peeling" and result.usage == Usage(222, 33)
    [sent] = stub.requests
    assert sent.path == "/v1/chat/completions" and sent.headers["Authorization"] == f"Bearer {KEY}"
    response_format = sent.body["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "extraction" and response_format["json_schema"]["strict"] is True
    assert response_format["json_schema"]["schema"]["additionalProperties"] is False
    assert sent.body["messages"][0] == {"role": "system", "content": "You extract."}


async def test_a_local_server_without_a_key_gets_no_authorization_header(stub: StubLLMServer) -> None:
    stub.script.append(openai_message("<think>hmm</think>" + json.dumps(GOOD)))
    resolved = resolve(LLMConfig(provider="openai", model="qwen3", base_url=stub.url("openai")), {})
    with trio.fail_after(IO_TIMEOUT):
        async with LLM(resolved, sleep=RecordingSleep()) as llm:
            result = await llm.complete_structured("s", "p", Extraction, name="extraction")
    assert result.value.summary == "one" and "Authorization" not in stub.requests[0].headers


async def test_anthropic_invalid_answer_is_retried_once_with_the_error(stub: StubLLMServer) -> None:
    stub.script.extend(
        [
            anthropic_tool(OUT_OF_RANGE, call_id="toolu_bad", input_tokens=100, output_tokens=10),
            anthropic_tool(GOOD, input_tokens=150, output_tokens=20),
        ]
    )
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm("anthropic", stub.url("anthropic")) as llm:
            result = await llm.complete_structured("s", "p", Extraction, name="extraction")
            stats = llm.statistics()["anthropic"]
    assert result.value.items[0].confidence == 0.9
    assert (result.attempts, result.usage) == (2, Usage(250, 30))
    assert stats["retried"] == {"invalid_answer": 1} and stats["failures"] == {}
    first, second = stub.requests
    assert RANGE_ERROR not in request_text(first)
    user, assistant, correction = second.body["messages"]
    assert user == {"role": "user", "content": "p"}
    assert assistant["content"] == [
        {"type": "tool_use", "id": "toolu_bad", "name": "extraction", "input": OUT_OF_RANGE}
    ]
    [tool_result] = correction["content"]
    assert tool_result["type"] == "tool_result" and tool_result["tool_use_id"] == "toolu_bad"
    assert tool_result["is_error"] is True and RANGE_ERROR in tool_result["content"]


async def test_openai_invalid_answer_is_retried_once_with_the_error(stub: StubLLMServer) -> None:
    stub.script.extend([openai_message(json.dumps(WRONG_CATEGORY)), openai_message(json.dumps(GOOD))])
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm("openai", stub.url("openai")) as llm:
            result = await llm.complete_structured("s", "p", Extraction, name="extraction")
    assert result.attempts == 2 and result.value.items[0].category == "proof_strategy"
    messages = stub.requests[1].body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert json.loads(messages[2]["content"]) == WRONG_CATEGORY
    assert "Invalid enum value 'gossip' - at `$.items[0].category`" in messages[3]["content"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_answer_invalid_twice_fails_naming_both_problems(stub: StubLLMServer, provider: str) -> None:
    stub.script.extend([valid_answer(provider, OUT_OF_RANGE), valid_answer(provider, WRONG_CATEGORY)])
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm(provider, stub.url(provider)) as llm:
            with pytest.raises(LLMFailed) as failed:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
            stats = llm.statistics()[provider]
    error = failed.value
    assert error.kind == "invalid_answer" and RANGE_ERROR in error.reason and "'gossip'" in error.reason
    assert error.usage.total_tokens > 0 and len(stub.requests) == 2
    assert stats["failures"] == {"invalid_answer": 1} and stats["last_error_kind"] == "invalid_answer"


async def test_openai_content_that_is_not_json_counts_as_invalid(stub: StubLLMServer) -> None:
    stub.script.extend([openai_message("Sure! Here are the insights: ..."), openai_message(json.dumps(GOOD))])
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm("openai", stub.url("openai")) as llm:
            result = await llm.complete_structured("s", "p", Extraction, name="extraction")
    assert result.attempts == 2 and "is not JSON" in stub.requests[1].body["messages"][3]["content"]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_a_reasoning_model_with_empty_content_fails(stub: StubLLMServer, field: str) -> None:
    stub.script.append(openai_message("", finish_reason="length", **{field: "Let me think step by step..."}))
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm("openai", stub.url("openai")) as llm:
            with pytest.raises(LLMFailed) as failed:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
    assert failed.value.kind == "empty_content" and "only reasoning" in failed.value.reason
    assert len(stub.requests) == 1  # not retried, and not an empty result


async def test_null_content_without_reasoning_fails_too(stub: StubLLMServer) -> None:
    stub.script.append(openai_message(None))
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm("openai", stub.url("openai")) as llm:
            with pytest.raises(LLMFailed, match="empty content"):
                await llm.complete_structured("s", "p", Extraction, name="extraction")


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_refusal_fails(stub: StubLLMServer, provider: str) -> None:
    if provider == "anthropic":
        stub.script.append(anthropic_tool({}, stop_reason="refusal"))
    else:
        stub.script.append(openai_message(None, refusal="I can't help with that."))
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm(provider, stub.url(provider)) as llm:
            with pytest.raises(LLMFailed) as failed:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
    assert failed.value.kind == "refusal" and len(stub.requests) == 1


# --- retries, timeouts, refused connections --------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(("status", "retry_after", "kind"), [(429, "7", "rate_limited"), (500, "2.5", "server_error")])
async def test_429_and_500_are_retried_after_retry_after(
    stub: StubLLMServer, provider: str, status: int, retry_after: str, kind: str
) -> None:
    stub.script.extend([http_error(status, retry_after), valid_answer(provider)])
    sleep = RecordingSleep()
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm(provider, stub.url(provider), sleep) as llm:
            result = await llm.complete_structured("s", "p", Extraction, name="extraction")
            stats = llm.statistics()[provider]
    assert result.attempts == 2 and len(stub.requests) == 2
    assert sleep.delays == [float(retry_after)]  # the jitter (0.5 to 1 s on the first retry) is below it
    assert stats["retried"] == {kind: 1} and stats["requests"] == 2 and stats["succeeded"] == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_5xx_without_retry_after_backs_off_exponentially_then_is_unavailable(
    stub: StubLLMServer, provider: str
) -> None:
    stub.script.extend([http_error(503)] * 4)
    sleep = RecordingSleep()
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm(provider, stub.url(provider), sleep, max_attempts=4) as llm:
            with pytest.raises(LLMUnavailable) as unavailable:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
            stats = llm.statistics()[provider]
    error = unavailable.value
    assert error.kind == "server_error" and error.transient and "after 4 attempts" in error.reason
    assert error.retry_after is None and len(stub.requests) == 4
    assert len(sleep.delays) == 3
    for attempt, delay in enumerate(sleep.delays, start=1):  # base 1 s, doubling, half fixed and half jitter
        ceiling = 2.0 ** (attempt - 1)
        assert ceiling / 2 <= delay <= ceiling
    same_seed = LLM(llm.resolved, provider=FakeProvider(), rng=random.Random(SEED))
    assert [same_seed._backoff(n, None) for n in (1, 2, 3)] == sleep.delays  # seeded: reproducible
    assert stats["failures"] == {"server_error": 1} and stats["retried"] == {"server_error": 3}
    assert "HTTP 503" in stats["last_error"]


async def test_a_retry_after_longer_than_the_call_waits_ends_the_call_with_it(stub: StubLLMServer) -> None:
    stub.script.append(http_error(429, "3600"))
    sleep = RecordingSleep()
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm("anthropic", stub.url("anthropic"), sleep) as llm:
            with pytest.raises(LLMUnavailable) as unavailable:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
    assert unavailable.value.kind == "rate_limited" and unavailable.value.retry_after == 3600
    assert sleep.delays == [] and len(stub.requests) == 1


async def test_an_unavailable_error_carries_the_last_retry_after(stub: StubLLMServer) -> None:
    stub.script.extend([http_error(429, "2"), http_error(429, "3")])
    sleep = RecordingSleep()
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm("openai", stub.url("openai"), sleep, max_attempts=2) as llm:
            with pytest.raises(LLMUnavailable) as unavailable:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
    assert unavailable.value.kind == "rate_limited" and unavailable.value.retry_after == 3.0
    assert sleep.delays == [2.0]


def test_retry_after_is_read_in_milliseconds_seconds_or_as_a_date() -> None:
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "12"}) == 12.0
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 <= parse_retry_after({"retry-after": in_a_minute}) <= 61  # type: ignore[operator]
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "-3"}) is None
    assert parse_retry_after({}) is None


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_server_that_never_answers_times_out(stub: StubLLMServer, provider: str) -> None:
    stub.script.extend([HANG, HANG])
    sleep = RecordingSleep()
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm(provider, stub.url(provider), sleep, timeout=0.3, max_attempts=2) as llm:
            start = trio.current_time()
            with pytest.raises(LLMUnavailable) as unavailable:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
            elapsed = trio.current_time() - start
    assert unavailable.value.kind == "timeout" and "after 2 attempts" in unavailable.value.reason
    assert len(stub.requests) == 2 and len(sleep.delays) == 1
    assert 0.5 <= elapsed < 5  # two requests of 0.3 s each; the back-off was not slept


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_refused_connection_is_unavailable_after_every_attempt(provider: str) -> None:
    sleep = RecordingSleep()
    url = f"http://127.0.0.1:{closed_port()}" + ("/v1" if provider == "openai" else "")
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm(provider, url, sleep, max_attempts=3) as llm:
            with pytest.raises(LLMUnavailable) as unavailable:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
            stats = llm.statistics()[provider]
    assert unavailable.value.kind == "connection" and "after 3 attempts" in unavailable.value.reason
    assert len(sleep.delays) == 2 and stats["requests"] == 3 and stats["failures"] == {"connection": 1}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    ("status", "error_type", "kind"), [(401, LLMUnavailable, "auth"), (400, LLMFailed, "bad_request")]
)
async def test_a_refused_key_or_a_bad_request_is_not_retried(
    stub: StubLLMServer, provider: str, status: int, error_type: type[Exception], kind: str
) -> None:
    stub.script.append(http_error(status, message="no"))
    sleep = RecordingSleep()
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm(provider, stub.url(provider), sleep) as llm:
            with pytest.raises(error_type) as raised:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
    assert raised.value.kind == kind and f"HTTP {status}" in raised.value.reason  # type: ignore[attr-defined]
    assert len(stub.requests) == 1 and sleep.delays == []


async def test_no_provider_or_no_key_is_unavailable_without_a_request() -> None:
    for resolved, kind in [
        (resolve(None, {}), "not_configured"),
        (resolve(LLMConfig(provider="anthropic"), {}), "no_key"),
    ]:
        async with LLM(resolved, sleep=RecordingSleep()) as llm:
            assert not llm.available
            with pytest.raises(LLMUnavailable) as unavailable:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
            assert unavailable.value.kind == kind and not unavailable.value.transient
            stats = llm.statistics()[resolved.provider]
            assert stats["requests"] == 0 and stats["failures"] == {kind: 1} and stats["available"] is False


# --- the budget (MockClock, a fake provider: no real I/O) ------------------------------------------


class FakeProvider(Provider):
    """Answers GOOD at once, reporting `tokens` input tokens; records the trio time of each request."""

    name = "fake"
    model = "fake-model"

    def __init__(self, tokens: int = 10) -> None:
        self.tokens = tokens
        self.times: list[float] = []

    async def complete(self, request: CompletionRequest) -> Completion:
        self.times.append(trio.current_time())
        return Completion(data=GOOD, text=json.dumps(GOOD), usage=Usage(self.tokens, 0))


def fake_llm(provider: FakeProvider, **settings: Any) -> LLM:
    resolved = resolve(LLMConfig(provider="anthropic", **settings), {"ANTHROPIC_API_KEY": KEY})
    return LLM(resolved, provider=provider, sleep=RecordingSleep(), rng=random.Random(SEED))


async def test_requests_beyond_the_per_minute_budget_wait(autojump_clock: trio.testing.MockClock) -> None:
    provider = FakeProvider()
    llm = fake_llm(provider, requests_per_minute=2)
    with trio.fail_after(IO_TIMEOUT + 200):  # virtual seconds
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(functools.partial(llm.complete_structured, "s", "p", Extraction, name="extraction"))
                await trio.sleep(0)
    offsets = [round(t - start, 3) for t in provider.times]
    assert offsets == [0.0, 0.0, 30.0, 60.0]  # 2 a minute: one more every 30 s, in arrival order
    budget = llm.statistics()["anthropic"]["budget"]
    assert budget["waits"] == 2 and budget["waited_seconds"] == pytest.approx(60.0)


async def test_tokens_beyond_the_per_minute_budget_wait(autojump_clock: trio.testing.MockClock) -> None:
    provider = FakeProvider(tokens=1500)  # more than a minute's worth: the bucket goes into debt
    llm = fake_llm(provider, tokens_per_minute=1000, max_output_tokens=10)
    with trio.fail_after(IO_TIMEOUT + 200):
        start = trio.current_time()
        for _ in range(2):
            await llm.complete_structured("s", "p", Extraction, name="extraction")
    first, second = (t - start for t in provider.times)
    # After the first call the bucket is at 1000 - 1500 = -500; the second waits for that debt and
    # its own reservation (the estimated input plus max_output_tokens) at 1000 tokens a minute.
    reservation = _estimate_input(CompletionRequest("s", "p", tool_spec(Extraction, "extraction"), 10)) + 10
    assert first == 0 and second == pytest.approx((500 + reservation) * 60 / 1000)
    assert llm.statistics()["anthropic"]["input_tokens"] == 3000


async def test_the_budget_refills_continuously_and_settles_reservations(autojump_clock: trio.testing.MockClock) -> None:
    budget = Budget(60, 600)
    start = trio.current_time()
    for _ in range(60):
        await budget.acquire(10)
    assert trio.current_time() == start  # a full minute's worth at once
    await budget.acquire(10)
    assert trio.current_time() - start == pytest.approx(1.0)  # then one a second
    budget.settle(reserved=10, used=310)  # used far more than reserved: 300 tokens of debt
    await budget.acquire(10)
    assert trio.current_time() - start == pytest.approx(32.0)  # 310 tokens at 10 a second
    state = budget.state()
    assert state["requests_per_minute"] == 60 and state["tokens_per_minute"] == 600 and state["waits"] == 2


# --- token accounting ------------------------------------------------------------------------------


async def test_tokens_are_counted_per_call_and_per_provider(stub: StubLLMServer) -> None:
    stub.script.extend(
        [
            anthropic_tool(
                GOOD, input_tokens=100, output_tokens=20, cache_read_input_tokens=50, cache_creation_input_tokens=5
            ),
            anthropic_tool(GOOD, input_tokens=200, output_tokens=40),
        ]
    )
    with trio.fail_after(IO_TIMEOUT):
        config = LLMConfig(provider="anthropic", model="m", base_url=stub.url("anthropic"), tokens_per_minute=100_000)
        frozen_clock = 5.0  # no refill: the bucket shows exactly what was charged
        resolved = resolve(config, {"ANTHROPIC_API_KEY": KEY})
        async with LLM(resolved, sleep=RecordingSleep(), budget_clock=lambda: frozen_clock) as llm:
            first = await llm.complete_structured("s", "p", Extraction, name="extraction")
            second = await llm.complete_structured("s", "p", Extraction, name="extraction")
            stats = llm.statistics()["anthropic"]
    assert first.usage == Usage(155, 20) and second.usage == Usage(200, 40)
    assert (stats["input_tokens"], stats["output_tokens"], stats["calls"], stats["requests"]) == (355, 60, 2, 2)
    # The bucket was charged what was used (the reservations were settled), no more.
    assert stats["budget"]["tokens_available"] == 100_000 - 415


async def test_usage_a_server_does_not_report_is_estimated(stub: StubLLMServer) -> None:
    stub.script.append(openai_message(json.dumps(GOOD), prompt_tokens=None))
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm("openai", stub.url("openai")) as llm:
            result = await llm.complete_structured("s", "p" * 400, Extraction, name="extraction")
    assert result.usage.estimated and result.usage.input_tokens > 100 and result.usage.output_tokens > 0


# --- the key never leaks ---------------------------------------------------------------------------


def echo_key(status: int) -> Callable[[Recorded], Reply]:
    """A hostile reply: the request's own auth headers pasted into the body (and a Retry-After)."""

    def reply(recorded: Recorded) -> Reply:
        echoed = {name: value for name, value in recorded.headers.items() if KEY in value}
        assert echoed, "the key was not sent"
        return (
            status,
            {"type": "error", "error": {"type": "x", "message": f"bad credentials {echoed}"}},
            {"Retry-After": "1"},
        )

    return reply


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_key_never_appears_in_logs_stats_or_errors(
    stub: StubLLMServer, provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, the SDK's and httpx's included
    stub.script.extend([echo_key(500), echo_key(500), echo_key(401), echo_key(400)])
    sleep = RecordingSleep()
    errors: list[BaseException] = []
    with trio.fail_after(IO_TIMEOUT):
        async with make_llm(provider, stub.url(provider), sleep, max_attempts=2) as llm:
            for _ in range(3):  # 500 twice (unavailable), then 401 (auth), then 400 (bad request)
                with pytest.raises((LLMUnavailable, LLMFailed)) as raised:
                    await llm.complete_structured("s", "p", Extraction, name="extraction")
                errors.append(raised.value)
            stats = llm.statistics()
            llm_repr = repr(llm)
    assert [e.kind for e in errors] == ["server_error", "auth", "bad_request"]  # type: ignore[attr-defined]
    assert "bad credentials" in str(errors[0]) and "[redacted]" in str(errors[0])  # the echo was there, scrubbed
    texts = [caplog.text, json.dumps(stats), llm_repr, repr(llm.resolved)]
    for error in errors:
        texts += [str(error), repr(error), "".join(traceback.format_exception(error)), repr(error.args)]
        assert error.__cause__ is None and error.__context__ is None
    assert len(stub.requests) == 4 and any(KEY in v for v in stub.requests[0].headers.values())
    for text in texts:
        assert KEY not in text
    assert "retrying" in caplog.text and "llm call failed" in caplog.text  # the logs were really captured


def _named_settings(hint: str) -> list[str]:
    """The config keys (`llm_model`) and variables (`EUREKAMEM_LLM_MODEL`) a hint tells a person to set."""
    import re

    keys = re.findall(r"\b(llm_[a-z_]+)\b", hint)
    variables = [name.removeprefix("EUREKAMEM_").lower() for name in re.findall(r"\bEUREKAMEM_[A-Z_]+\b", hint)]
    return keys + variables


def test_every_llm_hint_names_settings_the_config_accepts() -> None:
    """A hint that says what to set must name a key of the config file (and its variable): `[llm]`
    sections are refused by the config, so a hint naming one sends a person to a dead end."""
    from eurekamem.daemon.config import Config

    fields = set(Config.__struct_fields__)
    not_configured = resolve(None, {}).unavailable_reason
    with pytest.raises(LLMConfigError) as no_model:
        resolve(LLMConfig(provider="openai", base_url="http://127.0.0.1:11434/v1"), {})
    for hint in (not_configured, str(no_model.value)):
        named = _named_settings(hint)
        assert named, hint  # each says what to set
        assert set(named) <= fields, (hint, set(named) - fields)
        assert "[llm]" not in hint, hint
