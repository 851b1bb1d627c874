"""The OpenAI-compatible provider: POST {base_url}/chat/completions through one httpx.AsyncClient
(OpenAI, Ollama, vLLM, llama.cpp server, LM Studio …).

Rule kept here: structured output is `response_format: json_schema` in strict mode, and the answer
is the message's `content` decoded as JSON; nothing else counts. A reasoning model that spent its
answer on `reasoning_content` / `reasoning` and returned no content has failed (LLMFailed
"empty_content"), never answered "nothing". A leading `<think>…</think>` block and a Markdown code
fence around the JSON, which some local servers add, are taken off before decoding. The key, when
there is one, goes only into the Authorization header, and headers are never logged. The response
is read bounded (`_http.CappedSend`), and a long one is decoded in a worker thread, off the event loop.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import msgspec
import trio

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
from ._schema import strict_schema

__all__ = ["OpenAIProvider"]

_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"^\s*```[A-Za-z]*\s*\n(.*?)\n?```\s*$", re.DOTALL)
OFF_LOOP_BYTES = 64 * 1024  # a response longer than this is decoded in a worker thread


class _Client(CappedSend, httpx.AsyncClient):
    """httpx's client, reading every response bounded by the answer cap."""

    stream_base = httpx.AsyncByteStream


class OpenAIProvider(Provider):
    name = "openai"

    def __init__(self, *, model: str, api_key: Secret, base_url: str, timeout: float) -> None:
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key.reveal()}"
        self._client = _Client(timeout=httpx.Timeout(timeout), headers=headers)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _payload(self, request: CompletionRequest) -> dict[str, Any]:
        tool = request.tool
        messages: list[dict[str, str]] = [
            {"role": "system", "content": request.system},
            {"role": "user", "content": request.prompt},
        ]
        for correction in request.corrections:
            messages.append({"role": "assistant", "content": correction.answer.text})
            messages.append({"role": "user", "content": correction_text(tool.name, correction.problem)})
        return {
            "model": self.model,
            "messages": messages,
            "max_tokens": request.max_output_tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": tool.name,
                    "description": tool.description,
                    "schema": strict_schema(tool.schema),
                    "strict": True,
                },
            },
        }

    async def complete(self, request: CompletionRequest) -> Completion:
        error: LLMError
        try:
            with capped(request.max_output_tokens):
                response = await self._client.post(self.url, json=self._payload(request))
        except httpx.TimeoutException:
            error = LLMUnavailable("timeout", "the request timed out")
        except httpx.TransportError as e:
            error = LLMUnavailable("connection", f"cannot connect ({type(e).__name__})")
        except AnswerTooLarge as e:
            error = oversized(e, request.max_output_tokens)
        else:
            if response.is_success:
                return await self._completion(response)
            error = status_error(response.status_code, body_snippet(response.text), parse_retry_after(response.headers))
        raise error  # outside the except: httpx's exception does not travel as its context

    async def _completion(self, response: httpx.Response) -> Completion:
        raw = response.content
        try:
            if len(raw) > OFF_LOOP_BYTES:
                body = await trio.to_thread.run_sync(msgspec.json.decode, raw)
            else:
                body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise LLMUnavailable("server_error", f"the response is not JSON: {body_snippet(response.text)}") from None
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise LLMFailed("no_answer", f"the response has no choices: {body_snippet(response.text)}")
        spent = _usage(body.get("usage"))
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            message = {}
        finish = choice.get("finish_reason")
        content = message.get("content")
        if message.get("refusal"):
            raise LLMFailed("refusal", f"the model refused: {body_snippet(str(message['refusal']), 200)}", usage=spent)
        text = _THINK.sub("", content).strip() if isinstance(content, str) else ""
        if not text:
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            detail = (
                f"only reasoning ({len(str(reasoning))} characters) and no content" if reasoning else "empty content"
            )
            raise LLMFailed("empty_content", f"the model returned {detail} (finish_reason {finish})", usage=spent)
        if finish == "length":
            raise LLMFailed("truncated", "the answer was cut off at max_output_tokens", usage=spent)
        fenced = _FENCE.match(text)
        if fenced:
            text = fenced.group(1).strip()
        try:
            if len(text) > OFF_LOOP_BYTES:
                data = await trio.to_thread.run_sync(msgspec.json.decode, text)
            else:
                data = msgspec.json.decode(text)
        except msgspec.DecodeError as e:
            return Completion(
                data=None, text=text, usage=spent, decode_error=f"the content is not JSON ({e})", size=len(raw)
            )
        return Completion(data=data, text=text, usage=spent, size=len(raw))


def _usage(usage: Any) -> Usage:
    if not isinstance(usage, dict):
        return Usage(estimated=True)
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return Usage(estimated=True)
    return Usage(prompt, completion)
