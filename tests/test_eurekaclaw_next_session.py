"""What a session learns reaches the next one (issue 27, section 6), against the stand-in EurekaClaw
(tests/fake_eurekaclaw) over a real daemon subprocess: BaseAgent.build_system_prompt carries the
brief's domain memories in EurekaClaw's block (its documented session-start injection, which its own
code never makes: it passes the injector no domain); the theory loop's prover is told the failed
strategies the daemon keeps for the lemma at hand; EurekaClaw's "Tool X: ..." events reach the
daemon with the metadata skill distillation reads. uninstall() gives EurekaClaw its own methods back.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_extraction import INSIGHTS
from test_llm import Recorded, StubLLMServer, anthropic_tool

from daemon_process import DaemonProcess, shared_daemon
from eurekamem.client import Client
from eurekamem.daemon.jobs.distill import find_pattern
from eurekamem.daemon.jobs.extract import failures_key
from eurekamem.integrations import eurekaclaw as integration
from eurekamem.integrations.eurekaclaw import _routed

FAKE = Path(__file__).resolve().parent / "fake_eurekaclaw"
DOMAIN = "bandit theory"
TIMEOUT = 60.0
DISTILLED = {  # what the daemon's LLM answers for the distilled skill
    "name": "verify_then_search",
    "description": "Check the lemma with Lean, then look up the literature it rests on.",
    "body": "Use when a lemma's proof cites a known bound.\n\n1. Run lean4_verify.\n2. Run arxiv_search.",
    "tags": ["verification"],
}


@pytest.fixture(scope="module")
def stub() -> Iterator[StubLLMServer]:
    server = StubLLMServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def daemon(stub: StubLLMServer) -> Iterator[DaemonProcess]:
    env = {**os.environ, "ANTHROPIC_API_KEY": "sk-test-next-session", "ANTHROPIC_BASE_URL": stub.url("anthropic")}
    with shared_daemon("em-ec-next-", env=env) as proc:
        yield proc


def by_tool(recorded: Recorded) -> Any:
    """The daemon's LLM: the session's insights, or the distilled skill, as the request asks."""
    name = recorded.body["tool_choice"]["name"]
    return anthropic_tool(DISTILLED if name == "distilled_skill" else INSIGHTS, name=name)


def _forget_eurekaclaw() -> None:
    for name in [n for n in sys.modules if n == "eurekaclaw" or n.startswith("eurekaclaw.")]:
        del sys.modules[name]


@pytest.fixture
def client(daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """The stand-in importable as `eurekaclaw` (fresh), EurekaClaw's settings and the client on the
    daemon (no autostart); a Client to check with. Uninstalled after."""
    _forget_eurekaclaw()
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.setenv("EUREKACLAW_DIR", str(daemon.data_dir))
    monkeypatch.setenv("EUREKAMEM_SOCKET", str(daemon.socket_path))
    monkeypatch.setenv("EUREKAMEM_NO_AUTOSTART", "1")
    with Client(daemon.socket_path, timeout=TIMEOUT) as checker:
        yield checker
    integration.uninstall()
    _forget_eurekaclaw()


_counter = iter(range(10**6))


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


def _agent(session: str, domain: str) -> tuple[Any, Any]:
    """EurekaClaw's theory agent as its orchestrator builds it, the brief on the bus; and a task."""
    from eurekaclaw.agents.theory.agent import TheoryAgent
    from eurekaclaw.knowledge_bus.bus import KnowledgeBus
    from eurekaclaw.llm import LLMClient
    from eurekaclaw.memory.manager import MemoryManager
    from eurekaclaw.skills.injector import SkillInjector
    from eurekaclaw.skills.registry import SkillRegistry
    from eurekaclaw.types.artifacts import ResearchBrief
    from eurekaclaw.types.tasks import Task

    bus = KnowledgeBus(session)
    bus.put_research_brief(ResearchBrief(session_id=session, input_mode="detailed", domain=domain, query="UCB regret"))
    agent = TheoryAgent(
        bus=bus, tool_registry=None, skill_injector=SkillInjector(SkillRegistry()),
        memory=MemoryManager(session_id=session), client=LLMClient(),
    )
    task = Task(task_id="t1", name="theory", agent_role="theory", description="bound the pulls of each suboptimal arm")
    return agent, task


def test_each_roles_system_prompt_carries_the_briefs_domain_memories_after_its_skills(client: Client) -> None:
    domain = unique("bandits")
    client.put_skill("ucb_split", "# UCB\n\nSplit on the confidence events.", agent_roles=["theory"])
    client.add_memory(domain, "proof_strategy", "Count the pulls", "Bound the regret through the pulls of each bad arm.")
    client.add_memory(domain, "pitfalls", "Bernstein needs a variance bound", "Check the variance before Bernstein.")
    client.add_memory(unique("other"), "pitfalls", "Elsewhere", "A memory of another domain, never injected here.")
    from eurekaclaw.agents.base import BaseAgent

    own = BaseAgent.build_system_prompt
    integration.install()
    agent, task = _agent(unique("s"), domain)
    agent.bus.put("domain_workflow_hint", "Prove the concentration lemma first.")

    prompt = agent.build_system_prompt(task)
    assert "<memories>" in prompt and "Bound the regret through the pulls" in prompt and "Check the variance" in prompt
    assert "another domain" not in prompt
    # EurekaClaw's layout: the role, its skills block with the memories after it, then the guidance
    assert prompt.index("You are the theory agent") < prompt.index('<skill name="ucb_split">')
    assert prompt.index("</skills>") < prompt.index("<memories>") < prompt.index("</memories>") < prompt.index("<domain_guidance>")
    assert prompt.count("<memories>") == 1

    # a domain with no memories: EurekaClaw's own prompt, nothing added
    empty, task = _agent(unique("s"), unique("nothing-here"))
    assert "<memories>" not in empty.build_system_prompt(task)

    integration.uninstall()  # EurekaClaw's own method again: no domain, no memories
    assert BaseAgent.build_system_prompt is own
    assert "<memories>" not in agent.build_system_prompt(task)


def test_the_prover_is_told_the_failed_strategies_the_daemon_keeps_for_the_lemma(
    client: Client, stub: StubLLMServer
) -> None:
    integration.install()  # before EurekaClaw's theory modules are imported: patched as they are
    from eurekaclaw.agents.theory.inner_loop_yaml import LemmaDeveloper, TheoryInnerLoopYaml
    from eurekaclaw.agents.theory.prover import Prover
    from eurekaclaw.knowledge_bus.bus import KnowledgeBus
    from eurekaclaw.learning.memory_extractor import SessionMemoryExtractor
    from eurekaclaw.llm import LLMClient
    from eurekaclaw.memory.manager import MemoryManager
    from eurekaclaw.types.artifacts import FailedAttempt, LemmaNode, ResearchBrief, TheoryState

    own = (LemmaDeveloper.run_iterative.__wrapped__, Prover.attempt.__wrapped__)
    domain = unique("Bandit Theory")
    # an earlier session failed on L_tail twice: its post-run learning has the daemon keep the record
    before = KnowledgeBus(unique("before"))
    before.put_research_brief(ResearchBrief(session_id=before.session_id, input_mode="detailed", domain=domain, query="q"))
    before.put_theory_state(TheoryState(
        session_id=before.session_id, theorem_id="thm", informal_statement="UCB1 regret",
        lemma_dag={"L_tail": LemmaNode(lemma_id="L_tail", statement="Tail bound")},
        failed_attempts=[
            FailedAttempt(lemma_id="L_tail", attempt_text="Bernstein", failure_reason="variance unbounded", iteration=1),
            FailedAttempt(lemma_id="L_tail", attempt_text="Azuma", failure_reason="increments unbounded", iteration=2),
        ],
    ))
    stub.script.extend([by_tool, by_tool])
    asyncio.run(SessionMemoryExtractor(client=LLMClient()).extract_and_save(before))
    job = client.wait_job(before.get(_routed.BUS_KEY)["job_id"], timeout=TIMEOUT)
    stub.script.clear()
    assert job.state == "done", job
    record = client.recall(failures_key(domain, "L_tail"))
    assert record is not None and [a["reason"] for a in record.value["attempts"]] == ["variance unbounded", "increments unbounded"]

    session = unique("s")
    bus = KnowledgeBus(session)
    loop = TheoryInnerLoopYaml(bus, memory=MemoryManager(session_id=session))
    developer = loop._instantiate("LemmaDeveloper")  # EurekaClaw compares classes with `is`: still its own
    assert type(developer) is LemmaDeveloper and isinstance(developer.prover, Prover)
    llm = developer.prover.client = LLMClient()
    state = TheoryState(
        session_id=session, theorem_id="thm",
        lemma_dag={"L_tail": LemmaNode(lemma_id="L_tail", statement="Tail bound"),
                   "L_conc": LemmaNode(lemma_id="L_conc", statement="Hoeffding")},
        open_goals=["L_tail", "L_conc"],
    )
    asyncio.run(developer.run_iterative(state, 1, 3, domain=domain))

    prompts = {call["messages"][0]["content"].split("Lemma ID: ")[1].split("\n")[0]: call["messages"][0]["content"]
               for call in llm.calls}
    tail = prompts["L_tail"]
    assert "PREVIOUS FAILED APPROACHES (avoid repeating these):" in tail
    assert tail.index("increments unbounded") < tail.index("variance unbounded")  # the newest first
    assert "PREVIOUS FAILED APPROACHES" not in prompts["L_conc"]  # nothing kept for this lemma

    # outside a routed lemma loop the prover is EurekaClaw's own
    alone = Prover(client=LLMClient())
    asyncio.run(alone.attempt(state, "L_tail"))
    assert "PREVIOUS FAILED" not in alone.client.calls[0]["messages"][0]["content"]

    integration.uninstall()
    assert (LemmaDeveloper.run_iterative, Prover.attempt) == own


def test_eurekaclaws_tool_results_reach_the_daemon_as_tool_steps_and_become_a_distilled_skill(
    client: Client, stub: StubLLMServer
) -> None:
    integration.install()
    session = unique("s")
    agent, _ = _agent(session, DOMAIN)
    for _ in range(2):  # what EurekaClaw's tool loop logs: f"Tool {name}: {result[:200]}", no metadata
        agent.log_tool_call("lean4_verify", "L_conc checks")
        agent.log_tool_call("arxiv_search", "found Auer et al. 2002")
    agent.log_tool_call("wolfram_alpha", "Error running tool 'wolfram_alpha': no app id")
    agent.memory.log_event("theory", "Theory loop: proved, 2 lemmas proved, 0 open")
    agent.memory.log_event("theory", "Tool custom: ran", {"tool": "named_by_caller", "ok": True})

    events = client.recent(session, n=20)
    assert [e.metadata.get("tool") for e in events] == [
        "lean4_verify", "arxiv_search", "lean4_verify", "arxiv_search", "wolfram_alpha", None, "named_by_caller",
    ]
    assert [e.metadata.get("success") for e in events[:5]] == [True, True, True, True, False]
    assert events[6].metadata == {"tool": "named_by_caller", "ok": True}  # a caller's own metadata is kept
    assert events[5].metadata == {}
    pattern = find_pattern(events)  # what the daemon's distillation reads from the session's events
    assert pattern is not None and pattern.tools == ("lean4_verify", "arxiv_search") and len(pattern.occurrences) == 2

    # the session's post-run learning: the daemon's extraction job distills the pattern into a draft
    from eurekaclaw.learning.memory_extractor import SessionMemoryExtractor
    from eurekaclaw.types.artifacts import TheoryState

    agent.bus.put_theory_state(TheoryState(session_id=session, theorem_id="thm", informal_statement="UCB1 regret"))
    stub.script.extend([by_tool, by_tool, by_tool])
    asyncio.run(SessionMemoryExtractor(client=agent.client).extract_and_save(agent.bus))
    job = client.wait_job(agent.bus.get(_routed.BUS_KEY)["job_id"], timeout=TIMEOUT)
    assert job.state == "done", job
    assert job.result["skill"] == {
        "decision": "drafted", "name": "verify_then_search", "pattern": ["lean4_verify", "arxiv_search"], "occurrences": 2,
    }
    draft = client.skill("verify_then_search")
    assert draft.status == "draft" and draft.source == "distilled" and draft.agent_roles == ["theory"]
    stub.script.clear()
