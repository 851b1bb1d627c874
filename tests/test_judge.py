"""The merge judge: SKIP / MERGE / CREATE for an extraction's near duplicates, in one LLM call with
short local ids, through the real anthropic SDK against the loopback stub (tests/test_llm.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from test_extraction import DOMAIN, THEORY_STATE, close, extraction_daemon, finished
from test_llm import Recorded, StubLLMServer, anthropic_tool

from conftest import IO_TIMEOUT, RawConnection
from eurekamem.client import Client
from eurekamem.daemon.jobs.judge import Candidate, Verdicts, check
from eurekamem.protocol import Memory

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

KEPT = {  # memories kept before the session, one per category the judge will see
    "domain_knowledge": (
        "Hoeffding concentration",
        "Hoeffding bound for rewards in [0,1] gives exponential concentration of the empirical mean.",
    ),
    "proof_strategy": (
        "Peeling over epochs",
        "Peel the horizon into geometric epochs and union-bound over the epochs for anytime regret.",
    ),
    "pitfalls": (
        "Bernstein needs bounded variance",
        "Bernstein with the empirical variance fails when the variance of the rewards is unbounded.",
    ),
}


def insight(title: str, content: str, confidence: float = 0.9) -> dict[str, Any]:
    return {"title": title, "content": content, "confidence": confidence, "abstract": title + ".", "overview": content}


SESSION_INSIGHTS = {
    "domain_knowledge": [
        insight(
            "Hoeffding concentration for bounded rewards",
            "Hoeffding bound for rewards in [0,1] gives exponential concentration of the empirical mean "
            "around the true mean.",
        )
    ],
    "proof_strategy": [
        insight(
            "Peeling over geometric epochs",
            "Peel the horizon into geometric epochs and union-bound over the epochs; this gives anytime "
            "regret at a log log cost.",
        )
    ],
    "open_problems": [
        insight("Tail of the regret", "Whether the regret of UCB1 has a sub-Gaussian tail remains open.")
    ],
    "pitfalls": [
        insight(
            "Bernstein fails with unbounded variance",
            "Bernstein with the empirical variance fails when the variance of the rewards is unbounded; "
            "check the variance first.",
        )
    ],
}

MERGED = {
    "title": "Peeling over geometric epochs",
    "content": "Peel the horizon into geometric epochs and union-bound over them: anytime regret at a log log cost.",
    "abstract": "Peeling into geometric epochs gives anytime regret at a log log cost.",
    "overview": "Split the horizon into epochs of doubling length and union-bound over them.",
}

# the judge's ids follow the insights' order (domain_knowledge, proof_strategy, open_problems,
# pitfalls) among those with candidates; each insight here has one candidate, its own category's
GOOD_VERDICTS = [
    {"item": "N1", "decision": "CREATE", "reason": "About the deviation around the true mean, a new facet."},
    {
        "item": "N2",
        "decision": "MERGE",
        "target": "E2",
        "reason": "The same technique; the new one adds the cost.",
        **MERGED,
    },
    {"item": "N3", "decision": "SKIP", "target": "E3", "reason": "Already known."},
]


def extraction() -> Any:
    return anthropic_tool(SESSION_INSIGHTS, name="session_insights", input_tokens=1000, output_tokens=400)


def verdicts(decisions: list[dict[str, Any]]) -> Any:
    return anthropic_tool({"decisions": decisions}, name="merge_decisions", input_tokens=500, output_tokens=100)


async def keep(conn: RawConnection) -> dict[str, str]:
    ids = {}
    for category, (title, content) in KEPT.items():
        added = await conn.result(
            "memory.add", {"domain": DOMAIN, "category": category, "title": title, "content": content}
        )
        assert added["decision"] == "created"
        ids[category] = added["memory"]["id"]
    return ids


async def test_each_decision_in_one_call_with_local_ids(data_dir: Path, sock_dir: Path, stub: StubLLMServer) -> None:  # noqa: F811
    known = [
        {"item": "N1", "decision": "SKIP", "target": "E1", "reason": "Merged last time."},
        {"item": "N2", "decision": "SKIP", "target": "E2", "reason": "Already known."},
    ]
    stub.script.extend([extraction(), verdicts(GOOD_VERDICTS), extraction(), verdicts(known)])
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            kept = await keep(conn)
            before = {m["id"]: m for m in (await conn.result("memory.list", {"domain": DOMAIN}))["memories"]}
            job = await finished(conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"])
            assert job["state"] == "done" and job["result"]["llm_calls"] == 2
            assert job["tokens"] == {"input": 1500, "output": 500}
            decided = {m["category"]: m for m in job["result"]["memories"]}
            knowledge, strategy, problem, pitfall = (
                decided[c] for c in ("domain_knowledge", "proof_strategy", "open_problems", "pitfalls")
            )
            # CREATE: a new memory beside the kept one, its reason in its history
            assert (knowledge["decision"], knowledge["by"]) == ("created", "judge") and knowledge["id"] != kept[
                "domain_knowledge"
            ]
            assert knowledge["reason"] == "judge: About the deviation around the true mean, a new facet."
            history = await conn.result("memory.history", {"id": knowledge["id"]})
            assert [(v["decision"], v["reason"]) for v in history] == [("created", knowledge["reason"])]
            # MERGE: the kept memory rewritten (L0, L1, L2), the older text in its history
            assert (strategy["decision"], strategy["by"], strategy["id"]) == ("merged", "judge", kept["proof_strategy"])
            merged = await conn.result("memory.get", {"id": kept["proof_strategy"]})
            assert (merged["content"], merged["abstract"], merged["overview"]) == (
                MERGED["content"],
                MERGED["abstract"],
                MERGED["overview"],
            )
            assert "extracted" in merged["tags"] and merged["confidence"] == 0.9
            history = await conn.result("memory.history", {"id": kept["proof_strategy"]})
            assert [(v["version"], v["decision"]) for v in history] == [(1, "created"), (2, "merged")]
            assert history[0]["memory"] == before[kept["proof_strategy"]] and history[1]["reason"].startswith(
                "judge: The same technique"
            )
            # SKIP: nothing changes
            assert (pitfall["decision"], pitfall["by"], pitfall["id"]) == ("skipped", "judge", kept["pitfalls"])
            assert await conn.result("memory.get", {"id": kept["pitfalls"]}) == before[kept["pitfalls"]]
            # no candidate: the rules, without the judge
            assert (problem["decision"], problem["by"]) == ("created", "rules")
            assert (await conn.result("memory.list", {"domain": DOMAIN}))["total"] == 5
            # a second session with the same insights: the rules skip the exact duplicates (the two
            # memories made last time), the judge sees the two whose memories differ (merged, skipped)
            second = await close(conn, "run-8", domain=DOMAIN, theory_state={**THEORY_STATE, "iteration": 9})
            again = await finished(conn, second["job_id"])
            assert again["result"]["llm_calls"] == 2
            assert [(m["category"], m["decision"], m["by"]) for m in again["result"]["memories"]] == [
                ("domain_knowledge", "skipped", "rules"),
                ("proof_strategy", "skipped", "judge"),
                ("open_problems", "skipped", "rules"),
                ("pitfalls", "skipped", "judge"),
            ]
            assert (await conn.result("memory.list", {"domain": DOMAIN}))["total"] == 5
            await conn.aclose()
    judge_request = stub.requests[1]
    assert judge_request.body["tool_choice"] == {"type": "tool", "name": "merge_decisions"}
    prompt = judge_request.body["messages"][0]["content"]
    assert UUID.search(prompt) is None  # never a memory's id: short local ids only
    assert re.findall(r"\[(N\d+|E\d+)\]", prompt) == ["N1", "N2", "N3", "E1", "E2", "E3"]
    assert "[E2] proof_strategy: Peeling over epochs" in prompt and "may duplicate: E3" in prompt
    assert "Tail of the regret" not in prompt  # the insight without candidates is not judged


def invented(recorded: Recorded) -> Any:
    bad = [dict(GOOD_VERDICTS[0]), dict(GOOD_VERDICTS[1], target="E7"), dict(GOOD_VERDICTS[2])]
    return verdicts(bad)


async def test_a_merge_on_a_conflict_closes_the_old_memory_and_links_the_new_one(
    data_dir: Path,
    sock_dir: Path,
    stub: StubLLMServer,  # noqa: F811
) -> None:
    """MERGE with conflict: the merged text becomes a new memory, the old one is closed (not rewritten,
    not archived) when the new one became valid and names it in superseded_by; search sees the new
    one now and both with include_expired or as of before."""
    conflicting = [dict(GOOD_VERDICTS[0]), dict(GOOD_VERDICTS[1], conflict=True), dict(GOOD_VERDICTS[2])]
    stub.script.extend([extraction(), verdicts(conflicting)])
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            kept = await keep(conn)
            before = await conn.result("memory.get", {"id": kept["proof_strategy"]})
            job = await finished(conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"])
            assert job["state"] == "done", job
            strategy = next(m for m in job["result"]["memories"] if m["category"] == "proof_strategy")
            assert (strategy["decision"], strategy["by"]) == ("created", "judge") and strategy["id"] != before["id"]
            assert f"supersedes {before['id']}" in strategy["reason"]
            new = await conn.result("memory.get", {"id": strategy["id"]})
            assert (new["content"], new["abstract"], new["overview"]) == (
                MERGED["content"], MERGED["abstract"], MERGED["overview"])
            old = await conn.result("memory.get", {"id": before["id"]})
            assert old["status"] == "active" and old["content"] == before["content"]  # closed, not rewritten
            assert old["valid_until"] == new["valid_from"] and old["superseded_by"] == new["id"]
            history = await conn.result("memory.history", {"id": before["id"]})
            assert [v["decision"] for v in history] == ["created", "closed"]
            query = {"query": "peel the horizon into geometric epochs", "domain": DOMAIN, "mode": "lexical",
                     "categories": ["proof_strategy"]}
            assert [h["memory"]["id"] for h in await conn.result("memory.search", query)] == [new["id"]]
            everything = await conn.result("memory.search", {**query, "include_expired": True})
            assert {h["memory"]["id"] for h in everything} == {new["id"], old["id"]}
            then = await conn.result("memory.search", {**query, "as_of": before["created_at"]})
            assert [h["memory"]["id"] for h in then] == [old["id"]]
            await conn.aclose()


async def test_an_answer_naming_unknown_ids_is_refused_and_asked_again(
    data_dir: Path,
    sock_dir: Path,
    stub: StubLLMServer,  # noqa: F811
) -> None:
    stub.script.extend([extraction(), invented, verdicts(GOOD_VERDICTS)])
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            await keep(conn)
            job = await finished(conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"])
            assert job["state"] == "done" and job["result"]["llm_calls"] == 3
            await conn.aclose()
    retry_prompt = stub.requests[2].body["messages"][0]["content"]
    assert "Your previous answer was refused: N2: 'E7' is not one of the memories shown." in retry_prompt


async def test_a_judge_that_invents_ids_twice_fails_the_job_and_writes_nothing(
    data_dir: Path,
    sock_dir: Path,
    stub: StubLLMServer,  # noqa: F811
) -> None:
    stub.script.extend([extraction(), invented, invented])
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(sock_dir / "s.sock")
            kept = await keep(conn)
            before = await conn.result("memory.list", {"domain": DOMAIN})
            job = await finished(conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"])
            assert job["state"] == "failed"
            assert (
                job["error"]
                == "job: the judge's answer was refused twice; last: N2: 'E7' is not one of the memories shown"
            )
            assert (
                await conn.result("memory.list", {"domain": DOMAIN}) == before
            )  # not even the insight the rules would add
            assert (await conn.result("graph.stats", {}))["nodes"] == 0
            assert len(await conn.result("memory.history", {"id": kept["proof_strategy"]})) == 1
            await conn.aclose()


async def test_a_memory_changed_before_the_commit_goes_through_the_rules(
    data_dir: Path,
    sock_dir: Path,
    stub: StubLLMServer,  # noqa: F811
) -> None:
    socket_path = sock_dir / "s.sock"

    def judge_after_an_edit(recorded: Recorded) -> Any:
        prompt = recorded.body["messages"][0]["content"]
        assert "[E2] proof_strategy: Peeling over epochs" in prompt
        with Client(socket_path, timeout=IO_TIMEOUT) as c:  # someone edits the memory meanwhile
            [hit] = c.call("memory.list", {"domain": DOMAIN, "category": "proof_strategy"})["memories"]
            c.call("memory.update", {"id": hit["id"], "tags": ["edited"]})
        return verdicts(GOOD_VERDICTS)

    stub.script.extend([extraction(), judge_after_an_edit])
    with trio.fail_after(IO_TIMEOUT):
        async with extraction_daemon(data_dir, sock_dir, stub):
            conn = await RawConnection.open(socket_path)
            kept = await keep(conn)
            job = await finished(conn, (await close(conn, "run-7", domain=DOMAIN, theory_state=THEORY_STATE))["job_id"])
            strategy = next(m for m in job["result"]["memories"] if m["category"] == "proof_strategy")
            assert strategy["by"] == "rules" and "changed before the commit" in strategy["reason"]
            assert strategy["decision"] == "merged" and strategy["id"] == kept["proof_strategy"]  # by rule: longer text
            history = await conn.result("memory.history", {"id": kept["proof_strategy"]})
            assert [v["decision"] for v in history] == ["created", "updated", "merged"]
            assert history[-1]["reason"].startswith("near duplicate:")  # the rule's reason, not the judge's
            await conn.aclose()


def _candidate(memory_id: str) -> Candidate:
    memory = Memory(
        id=memory_id,
        domain="d",
        category="pitfalls",
        title="t",
        content="c",
        abstract="a",
        overview="o",
        confidence=0.9,
        fingerprint="f",
        created_at="t0",
        updated_at="t0",
        file="memories/d/x.md",
    )
    return Candidate(memory, 1, "near duplicate: keyword overlap 0.50 >= 0.4")


@pytest.mark.parametrize(
    ("decisions", "problem"),
    [
        ([{"item": "N1", "decision": "SKIP", "target": "E1", "reason": "r"}], "no decision for N2"),
        ([{"item": "N3", "decision": "CREATE", "reason": "r"}], "'N3' is not one of the new insights N1..N2"),
        ([{"item": "N1", "decision": "CREATE", "reason": "r"}] * 2, "N1 is decided twice"),
        ([{"item": "N1", "decision": "SKIP", "reason": "r"}], "N1: SKIP needs the target memory's E id"),
        ([{"item": "N1", "decision": "SKIP", "target": "E2", "reason": "r"}], "N1: E2 was not listed for it"),
        (
            [{"item": "N1", "decision": "SKIP", "target": "0b5e2c9d", "reason": "r"}],
            "N1: '0b5e2c9d' is not one of the memories shown",
        ),
        (
            [{"item": "N1", "decision": "MERGE", "target": "E1", "reason": "r", "title": "t", "content": " "}],
            "N1: MERGE needs the merged content, abstract, overview",
        ),
    ],
)
def test_the_checks_of_a_judge_answer(decisions: list[dict[str, Any]], problem: str) -> None:
    one, two = _candidate("m-1"), _candidate("m-2")
    shown = {"E1": one, "E2": two}
    candidates = [[one], [two]]
    answer = msgspec.convert({"decisions": decisions}, Verdicts)
    assert check(answer, 2, candidates, shown) == problem
    fine = msgspec.convert(
        {
            "decisions": [
                {"item": "N1", "decision": "SKIP", "target": "E1", "reason": "r"},
                {"item": "N2", "decision": "CREATE", "reason": "r"},
            ]
        },
        Verdicts,
    )
    assert check(fine, 2, candidates, shown) == ""
