"""EurekaClaw's real code on eurekamem: install() the integration, then drive EurekaClaw's own
MemoryManager, SkillRegistry, SkillInjector and SessionMemoryExtractor (the classes its agents and
its learning loop use) and check that what they do lands in the daemon.

    pip install -e /path/to/EurekaClaw          # into the environment that has eurekamem
    python examples/eurekaclaw_real.py          # a fresh data root and a daemon of its own
    python examples/eurekaclaw_real.py --wait   # and wait for the extraction job (the daemon needs an LLM:
                                                #   ANTHROPIC_API_KEY in the environment)

Skips (exit 0, saying why) when EurekaClaw is not importable. No EurekaClaw LLM call is made: the
session's learning is the daemon's job. For a whole research run, routed:
`python -m eurekamem.integrations.eurekaclaw prove "..." --domain "..."` (EurekaClaw's own command).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wait", action="store_true", help="wait for the session.extract job to finish")
    parser.add_argument("--keep", action="store_true", help="keep the data root (removed at the end otherwise)")
    args = parser.parse_args()
    if importlib.util.find_spec("eurekaclaw") is None:
        print("skipped: EurekaClaw is not importable here (pip install -e <your EurekaClaw checkout>)")
        return 0
    root = Path(tempfile.mkdtemp(prefix="eurekaclaw-on-eurekamem-"))
    socket_path = str(root / "run" / "eurekamem.sock")
    # EurekaClaw reads its settings once, at import: point them at the fresh root first
    os.environ["EUREKACLAW_DIR"] = str(root)
    os.environ["EUREKAMEM_SOCKET"] = socket_path
    os.environ["EUREKAMEM_NO_AUTOSTART"] = "1"  # the daemon below is this script's; it stops it at the end
    daemon = subprocess.Popen(
        [sys.executable, "-m", "eurekamem.daemon", "serve", "--data-dir", str(root), "--socket", socket_path],
        stdout=subprocess.DEVNULL,
        stderr=open(root / "daemon.log", "ab"),  # the daemon's, for its lifetime
    )
    try:
        if not _wait_for(socket_path, daemon, timeout=60.0):
            print(f"the daemon did not start; see {root / 'daemon.log'}", file=sys.stderr)
            return 1
        return _exercise(root, socket_path, args.wait)
    finally:
        daemon.terminate()
        daemon.wait(30)
        if args.keep:
            print(f"data root kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


class _NoLLM:
    """EurekaClaw's LLM client where none is called: any call raises."""

    @property
    def messages(self) -> Any:
        raise RuntimeError("no LLM in this example")


def _wait_for(socket_path: str, daemon: subprocess.Popen[bytes], timeout: float) -> bool:
    from eurekamem.client._autostart import daemon_answers

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and daemon.poll() is None:
        if daemon_answers(socket_path):
            return True
        time.sleep(0.05)
    return False


def _exercise(root: Path, socket_path: str, wait: bool) -> int:
    from eurekamem.client import Client
    from eurekamem.integrations import eurekaclaw as integration

    integration.install()
    from eurekaclaw.knowledge_bus.bus import KnowledgeBus
    from eurekaclaw.learning.loop import SessionMemoryExtractor
    from eurekaclaw.memory.manager import MemoryManager
    from eurekaclaw.orchestrator.meta_orchestrator import MetaOrchestrator, SkillInjector, SkillRegistry
    from eurekaclaw.types.agents import AgentRole
    from eurekaclaw.types.artifacts import FailedAttempt, ProofRecord, ResearchBrief, TheoryState
    from eurekaclaw.types.skills import SkillMeta, SkillRecord
    from eurekaclaw.types.tasks import Task, TaskPipeline

    checks: list[tuple[str, bool]] = []
    for name, cls in [("MemoryManager", MemoryManager), ("SkillRegistry", SkillRegistry),
                      ("SkillInjector", SkillInjector), ("SessionMemoryExtractor", SessionMemoryExtractor)]:
        checks.append((f"{name} is routed", cls.__module__.startswith("eurekamem.integrations")))

    session = f"example-{os.getpid()}"
    domain = "multi-armed bandits"
    bus = KnowledgeBus(session)
    bus.put_research_brief(ResearchBrief(session_id=session, input_mode="detailed", domain=domain, query="UCB1 regret"))
    # EurekaClaw's orchestrator builds its memory, registry, injector, agents and learning loop itself
    orchestrator = MetaOrchestrator(bus, client=_NoLLM())
    memory, registry = orchestrator.memory, orchestrator.skill_registry
    registry.upsert(SkillRecord(
        meta=SkillMeta(name="ucb_regret_example", agent_roles=["theory"], description="UCB1 regret via concentration",
                       source="manual"),
        content="# UCB regret\n\nSplit the regret on the confidence events; union-bound the failures.",
    ))
    # what the theory agent does with them in a run: its system prompt, its events, its graph and records
    agent = orchestrator.agents[AgentRole.THEORY]
    prompt = agent.build_system_prompt(Task(task_id="t", name="theory", agent_role="theory"))
    memory.log_event("theory", "Tool lean4: L_conc checks")
    memory.remember("proof_hint.ucb", {"hint": "union bound over confidence events"}, tags=["proof_hint"])
    conc = memory.add_theorem("L_conc", "Hoeffding for rewards in [0, 1]", domain=domain, session_id=session)
    pulls = memory.add_theorem("L_pulls", "Suboptimal arms are pulled O(log T / gap^2) times", domain=domain)
    memory.link_theorems(pulls.node_id, conc.node_id, relation="uses")
    bus.put_theory_state(TheoryState(
        session_id=session, theorem_id="thm", informal_statement="UCB1 has regret O(sqrt(K T log T))",
        proven_lemmas={"L_conc": ProofRecord(lemma_id="L_conc", proof_text="Chernoff.", verified=True)},
        failed_attempts=[FailedAttempt(lemma_id="L_tail", attempt_text="Bernstein", failure_reason="variance unbounded",
                                       iteration=1)],
        status="in_progress",
    ))
    # post-run learning, as the orchestrator calls it (no LLM call is reached: one failure is below the
    # loop's distillation threshold, and the extraction is the daemon's job)
    asyncio.run(orchestrator.learning_loop.post_run(TaskPipeline(pipeline_id="p", session_id=session), bus))
    closed: dict[str, Any] = bus.get("eurekamem_extraction") or {}

    with Client(socket_path, timeout=60.0) as client:
        checks += [
            ("the event is in the daemon", [e.content for e in client.recent(session)] == []
             and closed.get("events_written") == 1),
            ("the record is in the daemon", client.recall("proof_hint.ucb") is not None),
            ("the graph has the link", [n.theorem_name for n in client.related(pulls.node_id, depth=1)] == ["L_conc"]),
            ("the skill is the daemon's", client.skill("ucb_regret_example").usage_count == 1),
            ("the agent's system prompt holds it", '<skill name="ucb_regret_example">' in prompt),
            ("post-run learning closed the session: a job", isinstance(closed.get("job_id"), str)),
        ]
        if wait and closed.get("job_id"):
            job = client.wait_job(closed["job_id"], timeout=300)
            checks.append((f"the extraction job finished ({job.state}: {job.error or 'ok'})", job.state == "done"))
    for what, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
