"""eurekamem.integrations.eurekaclaw against a stand-in for EurekaClaw v0.2.0 (tests/fake_eurekaclaw:
its module paths, class names, signatures and imports), over a real daemon subprocess whose LLM is
the loopback stub of tests/test_llm.py: after install(), a run's memory calls land in the daemon,
its post-run learning queues a session.extract job that completes, its skill registry reads and
writes the daemon's skills; the launcher and the environment variable do the same for EurekaClaw's
own command; install twice is once, uninstall puts everything back; the daemon away, nothing fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from test_extraction import INSIGHTS
from test_llm import StubLLMServer, anthropic_tool

from daemon_process import DaemonProcess, shared_daemon
from eurekamem.client import Client
from eurekamem.integrations import eurekaclaw as integration
from eurekamem.integrations.eurekaclaw import _routed
from eurekamem.protocol.blocks import SKILLS_NOTE

FAKE = Path(__file__).resolve().parent / "fake_eurekaclaw"
DOMAIN = "bandit theory"
KEY = "sk-test-integration"
TIMEOUT = 60.0
ROUTED = "eurekamem.integrations.eurekaclaw._routed"
SITECUSTOMIZE = (  # README's line: with the variable unset it imports nothing of eurekamem
    'import os; os.environ.get("EUREKAMEM_EUREKACLAW") and __import__("eurekamem.integrations.eurekaclaw", '
    'fromlist=["install_from_env"]).install_from_env()\n'
)


@pytest.fixture(scope="module")
def stub() -> Iterator[StubLLMServer]:
    server = StubLLMServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def daemon(stub: StubLLMServer) -> Iterator[DaemonProcess]:
    env = {**os.environ, "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": stub.url("anthropic")}
    with shared_daemon("em-ec-", env=env) as proc:
        yield proc


def _forget_eurekaclaw() -> None:
    for name in [n for n in sys.modules if n == "eurekaclaw" or n.startswith("eurekaclaw.")]:
        del sys.modules[name]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-in importable as `eurekaclaw`, freshly imported by each test; uninstalled after."""
    _forget_eurekaclaw()
    monkeypatch.syspath_prepend(str(FAKE))
    yield
    integration.uninstall()
    _forget_eurekaclaw()


@pytest.fixture
def routed_to(daemon: DaemonProcess, fake: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """EurekaClaw's settings and the client pointed at the daemon (no autostart); a Client to check with."""
    monkeypatch.setenv("EUREKACLAW_DIR", str(daemon.data_dir))
    monkeypatch.setenv("EUREKAMEM_SOCKET", str(daemon.socket_path))
    monkeypatch.setenv("EUREKAMEM_NO_AUTOSTART", "1")
    with Client(daemon.socket_path, timeout=TIMEOUT) as client:
        yield client


_counter = iter(range(10**6))


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


def answer() -> Any:
    return anthropic_tool(INSIGHTS, name="session_insights")


# --- install, uninstall --------------------------------------------------------------------------


def test_install_patches_every_binding_once_and_uninstall_restores_the_originals(fake: None) -> None:
    import eurekaclaw.memory
    import eurekaclaw.memory.manager as manager_module
    import eurekaclaw.orchestrator.meta_orchestrator as orchestrator
    import eurekaclaw.skills

    originals = {
        "MemoryManager": manager_module.MemoryManager,
        "SkillRegistry": sys.modules["eurekaclaw.skills.registry"].SkillRegistry,
        "SkillInjector": sys.modules["eurekaclaw.skills.injector"].SkillInjector,
        "SessionMemoryExtractor": sys.modules["eurekaclaw.learning.memory_extractor"].SessionMemoryExtractor,
    }
    integration.install()
    integration.install()  # twice is once
    assert integration.installed()
    assert sum(isinstance(f, integration._PatchOnImport) for f in sys.meta_path) == 1
    routed = manager_module.MemoryManager
    assert routed.__module__ == ROUTED and issubclass(routed, originals["MemoryManager"])
    # every copy EurekaClaw's modules made with `from ... import ...`
    assert eurekaclaw.memory.MemoryManager is routed and orchestrator.MemoryManager is routed
    assert sys.modules["eurekaclaw.agents.base"].MemoryManager is routed
    assert sys.modules["eurekaclaw.agents.theory.inner_loop"].MemoryManager is routed
    for module in ("eurekaclaw.skills", "eurekaclaw.skills.injector", "eurekaclaw.learning.loop", "eurekaclaw.skills.evolver"):
        assert sys.modules[module].SkillRegistry.__module__ == ROUTED, module
    assert eurekaclaw.skills.SkillInjector.__module__ == ROUTED and orchestrator.SkillInjector is eurekaclaw.skills.SkillInjector
    assert sys.modules["eurekaclaw.learning.loop"].SessionMemoryExtractor.__module__ == ROUTED
    # a module imported now copies the routed name
    import eurekaclaw.cli  # noqa: F401

    integration.uninstall()
    integration.uninstall()
    assert not integration.installed() and not any(isinstance(f, integration._PatchOnImport) for f in sys.meta_path)
    assert eurekaclaw.memory.MemoryManager is originals["MemoryManager"] is orchestrator.MemoryManager
    assert sys.modules["eurekaclaw.agents.base"].MemoryManager is originals["MemoryManager"]
    assert eurekaclaw.skills.SkillRegistry is originals["SkillRegistry"] is orchestrator.SkillRegistry
    assert eurekaclaw.skills.SkillInjector is originals["SkillInjector"]
    assert sys.modules["eurekaclaw.learning.loop"].SessionMemoryExtractor is originals["SessionMemoryExtractor"]
    # installed again: the same routed classes
    integration.install()
    assert manager_module.MemoryManager is routed


def test_install_imports_nothing_and_patches_modules_as_they_are_imported(fake: None) -> None:
    integration.install()
    assert not any(n == "eurekaclaw" or n.startswith("eurekaclaw.") for n in sys.modules)  # its import cost stays its own
    from eurekaclaw.agents.theory.inner_loop import MemoryManager as from_package
    from eurekaclaw.orchestrator.meta_orchestrator import ContinualLearningLoop, MemoryManager, SkillRegistry

    assert MemoryManager.__module__ == ROUTED and from_package is MemoryManager
    assert SkillRegistry.__module__ == ROUTED
    assert sys.modules["eurekaclaw.learning.loop"].SessionMemoryExtractor.__module__ == ROUTED
    assert ContinualLearningLoop.__module__ == "eurekaclaw.learning.loop"  # not routed: it calls the routed ones
    # the patched module's loader still answers what the real loader would
    spec = sys.modules["eurekaclaw.memory.manager"].__spec__
    assert spec is not None and spec.loader is not None and "class MemoryManager" in spec.loader.get_source(spec.name)


def test_a_public_method_the_integration_does_not_know_is_named(fake: None) -> None:
    """A newer EurekaClaw's extra method would still use its files: install() warns with its name."""
    from eurekaclaw.skills.registry import SkillRegistry

    class Newer(SkillRegistry):
        def delete(self, name: str) -> None: ...

    routed = _routed.make("SkillRegistry", Newer)
    assert _routed.unrouted_methods(Newer, routed) == ["delete"]
    assert _routed.unrouted_methods(SkillRegistry, _routed.make("SkillRegistry", SkillRegistry)) == []
    from eurekaclaw.skills.injector import SkillInjector

    assert _routed.unrouted_methods(SkillInjector, _routed.make("SkillInjector", SkillInjector)) == []


def test_the_environment_variable_installs_only_when_set(fake: None) -> None:
    assert integration.install_from_env({}) is False and not integration.installed()
    assert integration.install_from_env({integration.ENV: "0"}) is False and not integration.installed()
    assert integration.install_from_env({integration.ENV: "1"}) is True and integration.installed()


# --- a run, routed --------------------------------------------------------------------------------


def test_a_routed_run_lands_in_the_daemon_and_its_learning_becomes_a_finished_job(
    routed_to: Client, daemon: DaemonProcess, stub: StubLLMServer
) -> None:
    client = routed_to
    client.put_skill(
        "ucb_regret", "# UCB regret\n\nSplit on the confidence events.", agent_roles=["theory"], usage_count=3,
        description="UCB1 regret via concentration",
    )
    client.put_skill("stage_only", "# By stage\n\nFor the theory stage.", pipeline_stages=["theory"])
    client.put_skill("survey_only", "# Survey\n\nNot for theory.", agent_roles=["survey"])
    import eurekaclaw.memory  # imported before install: its copy of the name is patched too

    integration.install()
    from eurekaclaw.knowledge_bus.bus import KnowledgeBus
    from eurekaclaw.llm import LLMClient
    from eurekaclaw.orchestrator.meta_orchestrator import MetaOrchestrator
    from eurekaclaw.types.tasks import InputSpec

    session = unique("run")
    bus = KnowledgeBus(session)
    llm = LLMClient()
    orchestrator = MetaOrchestrator(bus, client=llm)
    assert isinstance(orchestrator.memory, eurekaclaw.memory.MemoryManager)
    stub.script.append(answer())
    result = asyncio.run(orchestrator.run(InputSpec(domain=DOMAIN, query="UCB regret bound")))

    # the prompt: the daemon's skills for the theory role and stage, most used first, in EurekaClaw's own block
    prompt = bus.get("system_prompt")
    assert "<skills>\n<skill" in prompt and '<skill name="ucb_regret">' in prompt and '<skill name="stage_only">' in prompt
    assert prompt.index('"ucb_regret"') < prompt.index('"stage_only"') and "survey_only" not in prompt
    assert bus.get("injected_skills") == {"ucb_regret", "stage_only"}
    # the agent's memory calls answered by the daemon
    assert result.output["recent"] == ["Tool lean4: L_conc checks", "Tool arxiv: found Auer et al. 2002"]
    theorems = {n.theorem_name: n for n in client.search_theorems(domain=DOMAIN)}
    assert {"L_conc", "L_pulls"} <= set(theorems)
    assert "L_conc" in {n.theorem_name for n in client.related(theorems["L_pulls"].node_id, depth=1)}
    assert client.recall("theory.failed_strategies.L_tail").value == {"reason": "variance unbounded"}
    # post-run learning: stats and the distilled skill through skills.*, the extraction as a job
    used = client.skill("ucb_regret")
    assert used.usage_count == 4 and used.success_rate == 0.0  # the run did not prove its theorem
    distilled = client.skill(f"check_the_variance_{session[:8]}")
    assert distilled.source == "distilled" and "variance unbounded" in distilled.body
    closed = bus.get(_routed.BUS_KEY)
    assert closed["events_written"] == 2 and isinstance(closed["job_id"], str)
    events = json.loads((daemon.data_dir / "runs" / session / "episodic.json").read_text())
    assert [e["content"] for e in events] == result.output["recent"]
    job = client.wait_job(closed["job_id"], timeout=TIMEOUT)
    assert job.state == "done" and job.kind == "session.extract", job
    assert job.result["domain"] == DOMAIN and job.result["session_id"] == session  # the brief's domain
    memories = client.list_memories(domain=DOMAIN, limit=100)
    assert {m.source_session for m in memories.memories} == {session} and memories.total == 4
    assert llm.calls == []  # EurekaClaw's own extractor never ran: the daemon's LLM did the work
    prompt_sent = stub.requests[-1].body["messages"][0]["content"]
    assert "Tool lean4: L_conc checks" in prompt_sent and "variance unbounded" in prompt_sent
    # the next run's memory-guided stage reads what the job learned
    from eurekaclaw.memory.manager import MemoryManager

    block = MemoryManager(session_id=unique("next")).load_for_injection(DOMAIN, k=4)
    assert block.startswith("<memories>") and "Bernstein" in block


def test_the_skill_registry_reads_and_writes_the_daemons_skills(
    routed_to: Client, daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = routed_to
    integration.install()
    from eurekaclaw.skills.injector import SkillInjector
    from eurekaclaw.skills.registry import SkillRegistry
    from eurekaclaw.types.skills import SkillMeta, SkillRecord
    from eurekaclaw.types.tasks import Task

    tag = unique("tag")
    registry = SkillRegistry()
    record = SkillRecord(
        meta=SkillMeta(name=unique("azuma"), tags=[tag], agent_roles=["theory"], pipeline_stages=["proof_attempt"],
                       description="Azuma-Hoeffding for martingales", source="manual"),
        content="# Azuma\n\nBounded increments give sub-Gaussian tails. </skills> not a tag here.",
    )
    registry.upsert(record)
    assert record.file_path == str(daemon.data_dir / "skills" / record.meta.name / "SKILL.md")
    stored = client.skill(record.meta.name)
    assert stored.body == record.content and stored.tags == [tag] and stored.source == "manual"
    client.put_skill(unique("draft"), "# Draft\n\nNot yet.", tags=[tag], status="draft")
    # reads: EurekaClaw's types, active skills only
    got = registry.get(record.meta.name)
    assert isinstance(got, SkillRecord) and got.meta == record.meta and got.content == record.content
    assert got.meta.created_at.tzinfo is None  # naive UTC, as EurekaClaw's utcnow
    assert [s.meta.name for s in registry.get_by_tags([tag])] == [record.meta.name]
    assert record.meta.name in {s.meta.name for s in registry.get_by_role("theory")}
    assert record.meta.name in {s.meta.name for s in registry.get_by_pipeline_stage("proof_attempt")}
    assert record.meta.name in {s.meta.name for s in registry.load_all()}
    assert registry.get(unique("nothing")) is None and registry.get("") is None and registry.get("a/b") is None
    # found among the best three: the module's one daemon also holds the skills earlier tests made
    # (a distilled "check the variance" one among them), and whether this new skill's vector is ready
    # yet decides whether the dense side ranks it first, so its place in the order is not this test's
    found = [s.meta.name for s in registry.search("Azuma: bounded increments give sub-Gaussian tails", k=3)]
    assert record.meta.name in found and all(isinstance(name, str) for name in found)
    # record_use through update_stats (EurekaClaw's moving average, in the daemon)
    registry.update_stats(record.meta.name, success=True)
    registry.update_stats(record.meta.name, success=False)
    registry.update_stats(unique("unknown"), success=True)  # ignored, as EurekaClaw does
    assert (client.skill(record.meta.name).usage_count, client.skill(record.meta.name).success_rate) == (2, 0.7)
    # the injector: the selected skill first, then skills.inject's order; the block escapes the body's tags
    other = unique("other")
    client.put_skill(
        other, "# Other\n\nFor theory.", agent_roles=["theory"], pipeline_stages=["proof_attempt"], usage_count=10**6
    )
    injector = SkillInjector(registry, selected_skills=[record.meta.name])
    task = Task(task_id="t", name="lemma", agent_role="proof_attempt", description="bound the martingale")
    chosen = injector.top_k(task, role="theory", k=2)
    assert [s.meta.name for s in chosen] == [record.meta.name, other]
    semantic = injector.top_k(task, role="theory", k=2, strategy="semantic")  # no model loaded here
    assert semantic[0].meta.name == record.meta.name and len(semantic) == 2
    block = injector.render_for_prompt(chosen)  # EurekaClaw's own block by default (tests/test_eurekaclaw_skills.py)
    assert block.startswith(f'<skills>\n<skill name="{record.meta.name}">\n# Azuma') and block.endswith("</skills>")
    monkeypatch.setenv(_routed.RANKING_ENV, "hybrid")  # the daemon's block: its note, the body's tags escaped
    block = injector.render_for_prompt(chosen)
    assert block.startswith("<skills>\n" + SKILLS_NOTE) and block.endswith("</skills>")
    assert block.count("</skills>") == 1 and "&lt;/skills> not a tag here" in block
    assert injector._injected == {record.meta.name, other}
    # what the daemon refuses (a body of only white space) is logged, never raised at the agent
    empty = SkillRecord(meta=SkillMeta(name=unique("empty"), source="manual"), content="   ")
    registry.upsert(empty)
    assert registry.get(empty.meta.name) is None


def _away(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, socket.socket, Any, Any, Any]:
    """A data root with a skill file the daemon wrote, a socket that accepts and never answers (the
    test closes it: the daemon gone), install(); the bus of a session with a TheoryState, EurekaClaw's
    LLM client (its extractor's answer set) and the routed extractor."""
    root = tmp_path / "root"
    (root / "skills" / "written").mkdir(parents=True)
    (root / "skills" / "written" / "SKILL.md").write_text(
        "---\nagent_roles:\n- theory\ndescription: As the daemon writes it\nname: written\nsource: manual\n"
        "version: '1.0'\n---\n\n# Written\n\nBy the daemon, earlier."
    )
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "silent.sock"))
    listener.listen(8)
    monkeypatch.setenv("EUREKACLAW_DIR", str(root))
    monkeypatch.setenv("EUREKAMEM_SOCKET", str(tmp_path / "silent.sock"))
    monkeypatch.setenv("EUREKAMEM_NO_AUTOSTART", "1")
    integration.install(timeout=30.0)
    from eurekaclaw.knowledge_bus.bus import KnowledgeBus
    from eurekaclaw.learning.memory_extractor import SessionMemoryExtractor
    from eurekaclaw.llm import LLMClient
    from eurekaclaw.types.artifacts import ResearchBrief, TheoryState

    session = unique("away")
    bus = KnowledgeBus(session)
    bus.put_research_brief(ResearchBrief(session_id=session, input_mode="detailed", domain=DOMAIN, query="q"))
    bus.put_theory_state(TheoryState(session_id=session, theorem_id="t", informal_statement="a claim"))
    llm = LLMClient()
    llm.answer = {"pitfalls": [{"title": "Kept anyway", "content": "EurekaClaw's own extractor wrote this."}]}
    return root, listener, bus, llm, SessionMemoryExtractor(client=llm)


def test_the_daemon_away_nothing_fails_reads_use_the_files_and_learning_falls_back(
    fake: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, listener, bus, llm, extractor = _away(tmp_path, monkeypatch)
    session = bus.session_id
    seen: list[bool] = []

    async def run() -> list[dict[str, Any]]:
        extraction = asyncio.create_task(extractor.extract_and_save(bus))

        async def meanwhile() -> None:
            await asyncio.sleep(0)
            seen.append(extraction.done())  # the agent's loop runs while session.close waits in a thread
            listener.close()  # the daemon goes away: the waiting close fails at once

        await meanwhile()
        return await extraction

    saved = asyncio.run(run())
    assert seen == [False]
    assert [s["title"] for s in saved] == ["Kept anyway"] and len(llm.calls) == 1  # the fallback ran
    assert (root / "memories" / "bandit_theory").is_dir() and bus.get(_routed.BUS_KEY) is None
    # every other call answers at once, as EurekaClaw's would with nothing there
    from eurekaclaw.memory.manager import MemoryManager
    from eurekaclaw.skills.registry import SkillRegistry
    from eurekaclaw.types.skills import SkillMeta, SkillRecord

    memory = MemoryManager(session_id=session)
    assert memory.log_event("theory", "still running").content == "still running"
    assert [e.content for e in memory.recent_events(5)] == ["still running"]
    assert memory.recall("anything") is None and memory.buffered == 1
    registry = SkillRegistry()
    assert [s.meta.name for s in registry.get_by_role("theory")] == ["written"]  # EurekaClaw's loader, the daemon's file
    assert registry.get("written").content == "# Written\n\nBy the daemon, earlier."
    registry.upsert(SkillRecord(meta=SkillMeta(name="later", source="manual"), content="# Later\n\nBuffered."))
    assert _routed.link_for(root).conduit.buffered == 1  # delivered in order once the daemon answers


# --- EurekaClaw's own command: the launcher, and the environment variable ---------------------------


def _command_env(root: Path, daemon: DaemonProcess, *path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (integration.ENV, "PYTHONPATH")}
    env.update(
        EUREKACLAW_DIR=str(root), EUREKAMEM_SOCKET=str(daemon.socket_path), EUREKAMEM_NO_AUTOSTART="1",
        PYTHONPATH=os.pathsep.join(str(p) for p in (*path, FAKE)),
    )
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_launcher_and_the_environment_variable_route_eurekaclaws_own_command(
    daemon: DaemonProcess, stub: StubLLMServer, tmp_path: Path
) -> None:
    cli = "import sys; from eurekaclaw.cli import main; sys.exit(main())"
    with Client(daemon.socket_path, timeout=TIMEOUT) as client:
        # python -m eurekamem.integrations.eurekaclaw run ...: EurekaClaw's command, routed
        session = unique("launched")
        stub.script.append(answer())
        out = _run([sys.executable, "-m", "eurekamem.integrations.eurekaclaw", "run", session, DOMAIN, "UCB"],
                   _command_env(daemon.data_dir, daemon), tmp_path)
        assert out["memory"] == ROUTED and out["registry"] == ROUTED and "<skills>\n<skill" in out["system_prompt"]
        assert client.wait_job(out["extraction"]["job_id"], timeout=TIMEOUT).state == "done"
        # EUREKAMEM_EUREKACLAW=1 with the README's sitecustomize line, and EurekaClaw's command as it is
        readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
        assert SITECUSTOMIZE.strip() in readme  # the line the README tells users to add
        site = tmp_path / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        session = unique("env")
        stub.script.append(answer())
        env = {**_command_env(daemon.data_dir, daemon, site), integration.ENV: "1"}
        out = _run([sys.executable, "-c", cli, "run", session, DOMAIN, "UCB"], env, tmp_path)
        assert out["memory"] == ROUTED and out["recent"][0] == "Tool lean4: L_conc checks"
        job = client.wait_job(out["extraction"]["job_id"], timeout=TIMEOUT)
        assert job.state == "done" and job.result["session_id"] == session
        # the variable unset: EurekaClaw's own classes (on a root of their own: they write files)
        own = tmp_path / "own"
        out = _run([sys.executable, "-c", cli, "run", unique("own"), DOMAIN, "UCB"],
                   _command_env(own, daemon, site), tmp_path)
        assert out["memory"] == "eurekaclaw.memory.manager" and out["extraction"] is None
    # EurekaClaw not importable: a clear message
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "eurekamem.integrations.eurekaclaw", "--help"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 2 and "EurekaClaw is not importable" in done.stderr


def test_the_example_script_runs_against_the_stand_in_and_skips_without_eurekaclaw(tmp_path: Path) -> None:
    script = str(Path(__file__).resolve().parent.parent / "examples" / "eurekaclaw_real.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EUREKACLAW_DIR", "EUREKAMEM_SOCKET")}
    done = subprocess.run([sys.executable, script], env={**env, "PYTHONPATH": str(FAKE)}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len([line for line in lines if line.startswith("ok ")]) == 10 and not any("FAIL" in x for x in lines)
    skipped = subprocess.run([sys.executable, script], env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=TIMEOUT)
    assert skipped.returncode == 0 and skipped.stdout.startswith("skipped: EurekaClaw is not importable")


async def test_under_trio_too_the_extraction_waits_in_a_worker_thread(
    fake: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, listener, bus, llm, extractor = _away(tmp_path, monkeypatch)
    saved: list[dict[str, Any]] = []
    finished = trio.Event()

    async def extract() -> None:
        saved.extend(await extractor.extract_and_save(bus))
        finished.set()

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(extract)
            await trio.testing.wait_all_tasks_blocked()
            assert not finished.is_set()  # trio's loop runs on while session.close waits in a thread
            listener.close()
    assert [s["title"] for s in saved] == ["Kept anyway"] and len(llm.calls) == 1
    assert (root / "memories" / "bandit_theory").is_dir()


def test_the_sitecustomize_line_imports_nothing_while_the_variable_is_unset() -> None:
    """Every Python start runs the README's line: unset, it is one lookup (no eurekamem import)."""
    env = {k: v for k, v in os.environ.items() if k != integration.ENV}
    code = SITECUSTOMIZE + "import sys; print(sorted(m for m in sys.modules if m.startswith('eurekamem')))\n"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT,
                          check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_a_routed_managers_records_are_eurekaclaws_own_pydantic_types(routed_to: Client) -> None:
    """EurekaClaw's callers get eurekaclaw.types.memory's models from its manager (isinstance,
    pydantic's API): the routed manager returns those, built from the daemon's answers."""
    integration.install()
    from eurekaclaw.memory.manager import MemoryManager
    from eurekaclaw.types.memory import CrossRunRecord, EpisodicEntry, KnowledgeNode

    memory = MemoryManager(session_id=unique("types"))
    marker = object()
    entry = memory.log_event("theory", "a step", {"obj": marker})
    assert type(entry) is EpisodicEntry and entry.metadata["obj"] is marker  # the caller's objects, as EurekaClaw's
    assert [type(e) for e in memory.recent_events(5)] == [EpisodicEntry]
    tag, domain = unique("tag"), unique("domain")
    memory.remember(unique("theory.k"), {"bound": 2}, tags=[tag])
    (record,) = memory.recall_by_tag(tag)
    assert type(record) is CrossRunRecord and record.value == {"bound": 2} and record.created_at.tzinfo is None
    a = memory.add_theorem("Azuma", "martingale differences bounded", domain=domain)
    b = memory.add_theorem("Freedman", "martingale variance bound", domain=domain)
    memory.link_theorems(b.node_id, a.node_id)
    assert type(a) is KnowledgeNode and a.created_at.tzinfo is None
    assert [(type(n), n.node_id) for n in memory.find_related_theorems(a.node_id)] == [(KnowledgeNode, b.node_id)]
    found = memory.retrieve_relevant_theorems("martingale variance", domain=domain)
    assert [(type(n), n.node_id) for n in found] == [(KnowledgeNode, b.node_id), (KnowledgeNode, a.node_id)]
    assert KnowledgeNode.model_validate_json(found[0].model_dump_json()) == found[0]  # pydantic's own API


def test_a_routed_managers_session_is_eurekaclaws_episodic_memory_api(routed_to: Client) -> None:
    """EurekaClaw's MemoryManager has `.session` (its EpisodicMemory): the routed one answers the
    same calls over the session's events."""
    integration.install()
    from eurekaclaw.memory.manager import MemoryManager
    from eurekaclaw.types.memory import EpisodicEntry

    session_id = unique("view")
    memory = MemoryManager(session_id=session_id)
    session = memory.session
    assert session.session_id == session_id and len(session) == 0 and session.get_all() == []
    first = session.record("theory", "Tried Hoeffding first")
    memory.log_event("survey", "Read the UCB paper")
    assert type(first) is EpisodicEntry and first.session_id == session_id
    assert [e.content for e in session.get_all()] == ["Tried Hoeffding first", "Read the UCB paper"]
    assert [e.content for e in session.get_recent(5, agent_role="survey")] == ["Read the UCB paper"]
    assert [e.entry_id for e in session.search("hoeffding")] == [first.entry_id] and len(session) == 2


def test_a_routed_managers_persistent_and_graph_are_eurekaclaws_apis_over_the_daemon(routed_to: Client) -> None:
    """EurekaClaw's MemoryManager has `.persistent` and `.graph` (its PersistentMemory and
    KnowledgeGraph): the routed one answers their calls through the daemon, with EurekaClaw's own
    pydantic records, and sees what another writer stored since (EurekaClaw's own objects would not)."""
    integration.install()
    from eurekaclaw.memory.manager import MemoryManager
    from eurekaclaw.types.memory import CrossRunRecord, KnowledgeNode

    u = unique("views")
    memory = MemoryManager(session_id=u)
    persistent, graph = memory.persistent, memory.graph
    assert persistent.memory_dir == graph.memory_dir == Path(os.environ["EUREKACLAW_DIR"]) / "memory"
    record = persistent.put(f"{u}.hint", "peel the horizon", tags=[u], source_session=u)
    assert type(record) is CrossRunRecord and record.value == "peel the horizon" and record.created_at.tzinfo is None
    routed_to.call("persistent.remember", {"key": f"{u}.other", "value": 3, "tags": [u]})  # another writer
    assert [type(r) for r in persistent.search_keys(u)] == [CrossRunRecord, CrossRunRecord]
    assert [r.key for r in persistent.get_by_tag(u)] == [f"{u}.hint", f"{u}.other"] and persistent.get(f"{u}.other") == 3
    persistent.delete(f"{u}.hint")
    assert routed_to.call("persistent.recall", {"key": f"{u}.hint"}) is None
    assert [r.key for r in persistent.all_records() if r.key.startswith(u)] == [f"{u}.other"]
    a = graph.add_theorem("Azuma", "bounded martingale differences", domain=u, tags=["lemma"])
    b = memory.add_theorem("Freedman", "martingale variance", domain=u, tags=["lemma"])
    graph.add_edge(b.node_id, a.node_id, "generalizes")
    assert type(a) is KnowledgeNode and [n.node_id for n in graph.find_related(a.node_id)] == [b.node_id]
    assert [(type(n), n.theorem_name) for n in graph.search_by_domain(u.upper())] == [
        (KnowledgeNode, "Azuma"), (KnowledgeNode, "Freedman")]
    assert {n.node_id for n in graph.search_by_tag("lemma")} >= {a.node_id, b.node_id}
    assert {n.node_id for n in graph.all_nodes()} >= {a.node_id, b.node_id}
    assert graph.stats() == {k: routed_to.call("graph.stats")[k] for k in ("nodes", "edges")}
    nx_graph = graph.to_networkx()
    assert nx_graph.edges[b.node_id, a.node_id] == {"relation": "generalizes"}
    assert nx_graph.nodes[a.node_id]["theorem_name"] == "Azuma" and "related_to" not in nx_graph.nodes[a.node_id]
