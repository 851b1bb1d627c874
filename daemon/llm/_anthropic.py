"""The Anthropic provider: the `anthropic` SDK's AsyncAnthropic (under trio through anyio).

Rule kept here: structured output is one forced tool call (`tool_choice` names the tool, whose
`input_schema` is the output type's schema), and nothing but that tool call is an answer. The SDK
does not retry (`max_retries=0`: the layer above retries, with its own budget and back-off), and
its exceptions are turned into this layer's errors by status, keeping only the status, a snippet
of the body and Retry-After. A correction is sent the way the Messages API expects: the earlier
tool_use as the assistant's turn, then a tool_result marked `is_error` holding the problem. The SDK
sends through an httpx2 client of ours (`_http.CappedSend`), so no response is read past the answer
cap: the SDK reports that as a connection error caused by AnswerTooLarge, made `oversized` here.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2

from ._config import Secret
from ._errors import LLMError, LLMFailed, LLMUnavailable, Usage
from ._http import AnswerTooLarge, CappedSend, capped
from ._provider import (
    Completion,
    CompletionRequest,
    Provider,
    body_snippet,
    correction_text,
    oversized,
    parse_retry_after,
    status_error,
)

__all__ = ["AnthropicProvider"]


class _Client(CappedSend, anthropic.DefaultAsyncHttpxClient):
    """The SDK's default httpx2 client (its limits and keep-alive), reading every response bounded."""

    stream_base = httpx2.AsyncByteStream


class AnthropicProvider(Provider):
    name = "anthropic"

    def __init__(self, *, model: str, api_key: Secret, base_url: str, timeout: float) -> None:
        self.model = model
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key.reveal(), base_url=base_url, max_retries=0, timeout=timeout, http_client=_Client()
        )

    async def aclose(self) -> None:
        await self._client.close()

    def _messages(self, request: CompletionRequest) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": request.prompt}]
        for correction in request.corrections:
            answer = correction.answer
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": answer.call_id, "name": request.tool.name, "input": answer.data}
                    ],
                }
            )
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": answer.call_id,
                            "is_error": True,
                            "content": correction_text(request.tool.name, correction.problem),
                        }
                    ],
                }
            )
        return messages

    async def complete(self, request: CompletionRequest) -> Completion:
        tool = request.tool
        error: LLMError
        try:
            with capped(request.max_output_tokens):
                message = await self._client.messages.create(  # type: ignore[call-overload]  # plain dicts, not TypedDicts
                    model=self.model,
                    max_tokens=request.max_output_tokens,
                    system=request.system,
                    messages=self._messages(request),
                    tools=[{"name": tool.name, "description": tool.description, "input_schema": tool.schema}],
                    tool_choice={"type": "tool", "name": tool.name},
                )
        except anthropic.APITimeoutError:
            error = LLMUnavailable("timeout", "the request timed out")
        except anthropic.APIConnectionError as e:
            if isinstance(e.__cause__, AnswerTooLarge):
                error = oversized(e.__cause__, request.max_output_tokens)
            else:
                cause = type(e.__cause__).__name__ if e.__cause__ is not None else "unknown cause"
                error = LLMUnavailable("connection", f"cannot connect ({cause})")
        except anthropic.APIStatusError as e:
            error = status_error(e.status_code, body_snippet(e.response.text), parse_retry_after(e.response.headers))
        except anthropic.APIResponseValidationError as e:
            error = LLMUnavailable("server_error", f"the response is not a Messages answer (HTTP {e.status_code})")
        else:
            return self._completion(message, tool.name)
        raise error  # outside the except: the SDK's exception does not travel as its context

    def _completion(self, message: Any, tool_name: str) -> Completion:
        usage = message.usage
        input_tokens = (
            (usage.input_tokens or 0)
            + (getattr(usage, "cache_creation_input_tokens", None) or 0)
            + (getattr(usage, "cache_read_input_tokens", None) or 0)
        )
        spent = Usage(input_tokens, usage.output_tokens or 0)
        if message.stop_reason == "refusal":
            raise LLMFailed("refusal", "the model refused to answer", usage=spent)
        if message.stop_reason == "max_tokens":
            raise LLMFailed("truncated", "the answer was cut off at max_output_tokens", usage=spent)
        calls = [block for block in message.content if block.type == "tool_use" and block.name == tool_name]
        if not calls:
            kinds = ", ".join(block.type for block in message.content) or "nothing"
            raise LLMFailed("no_answer", f"no {tool_name} tool call in the answer (got {kinds})", usage=spent)
        call = calls[0]
        return Completion(data=call.input, text="", usage=spent, call_id=call.id)
