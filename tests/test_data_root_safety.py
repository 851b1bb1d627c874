"""The daemon never takes over a folder that is not a data root (issue 27, section 1).

A routed EurekaClaw `SkillRegistry(skills_dir=X)` took `X.parent` as a data root and autostarted a
daemon there; with EurekaClaw's tests (`tempfile.TemporaryDirectory()`) that was $TMPDIR, and the
daemon's start took group and other permissions off everything in it (a /tmp stand-in went
1777 -> 1700). Here, on stand-ins: the daemon refuses a shared folder (sticky, world-writable or
another user's) as its root and changes nothing in it; in a folder it did not make it tightens
only its own folders; the routed classes never autostart on a folder derived from an argument,
and given such a folder they are EurekaClaw's own classes on its files.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon_process import DaemonProcess
from eurekamem.daemon.paths import OWN_FOLDERS
from eurekamem.daemon.storage.files import make_private, unsafe_root_reason
from eurekamem.integrations import eurekaclaw as integration

FAKE = Path(__file__).resolve().parent / "fake_eurekaclaw"
TIMEOUT = 60.0


def _modes(root: Path) -> dict[str, int]:
    """Every entry under root (root included) and its mode."""
    return {str(p.relative_to(root)): os.lstat(p).st_mode for p in [root, *root.rglob("*")]}


def _tmp_stand_in(parent: Path, mode: int = 0o1777) -> Path:
    """A folder shaped as /tmp: sticky and world-writable, holding other programs' files and folders."""
    shared = parent / "tmp"
    shared.mkdir()
    (shared / "other-program").mkdir(mode=0o755)
    (shared / "other-program" / "socket-dir").mkdir(mode=0o755)
    (shared / "other-program" / "state.json").write_text("{}")
    (shared / "x11-lock").write_text("1")
    for path, m in ((shared / "other-program", 0o755), (shared / "other-program" / "socket-dir", 0o777),
                    (shared / "other-program" / "state.json", 0o644), (shared / "x11-lock", 0o644)):
        os.chmod(path, m)
    os.chmod(shared, mode)
    return shared


def _start_refused(root: Path, sock: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "eurekamem.daemon", "serve", "--data-dir", str(root), "--socket", str(sock)],
        capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, "EUREKAMEM_NO_AUTOSTART": "1"}, check=False,
    )
    assert done.returncode != 0, done.stderr
    return done.stdout + done.stderr


@pytest.mark.parametrize("mode", [0o1777, 0o0777, 0o1755])
def test_a_shared_folder_is_refused_as_a_data_root_and_nothing_in_it_changes(tmp_path: Path, mode: int) -> None:
    shared = _tmp_stand_in(tmp_path, mode)
    before = _modes(shared)
    output = _start_refused(shared, tmp_path / "s.sock")
    assert "refusing" in output and str(shared) in output, output
    assert "sticky" in output or "every user may write" in output, output
    assert _modes(shared) == before  # 1777 stays 1777, nothing of the other programs is touched
    assert not (shared / "memory").exists() and not (shared / "run").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_another_users_folder_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)  # nobody
    output = _start_refused(theirs, tmp_path / "s.sock")
    assert "belongs to uid 65534" in output, output
    assert list(theirs.iterdir()) == []


def test_the_reasons_are_plain() -> None:
    assert unsafe_root_reason("/nonexistent/eurekamem/root") is None  # the daemon makes it
    assert "sticky" in (unsafe_root_reason("/tmp") or "")


def test_tightening_never_enters_a_shared_folder_nor_another_users_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "memories" / "shared").mkdir(parents=True)
    (root / "memories" / "shared" / "theirs.md").write_text("x")
    (root / "memories" / "mine.md").write_text("x")
    os.chmod(root / "memories" / "shared" / "theirs.md", 0o644)
    os.chmod(root / "memories" / "shared", 0o1777)
    os.chmod(root / "memories" / "mine.md", 0o644)
    os.chmod(root / "memories", 0o755)
    assert make_private(root) == 3  # root (0755 by tmp_path), memories/, mine.md
    assert stat.S_IMODE(os.stat(root / "memories" / "shared").st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(root / "memories" / "shared" / "theirs.md").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(root / "memories" / "mine.md").st_mode) == 0o600


def test_in_a_folder_it_did_not_make_the_daemon_tightens_only_its_own_folders(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "memories" / "bandits").mkdir(parents=True)
    (root / "memories" / "bandits" / "20240101_note.md").write_text("---\ntitle: Note\n---\n\n# Note\n\nAn old note.\n")
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("print()\n")
    for path, m in ((root, 0o755), (root / "memories", 0o755), (root / "memories" / "bandits", 0o755),
                    (root / "memories" / "bandits" / "20240101_note.md", 0o644), (root / "src", 0o755),
                    (root / "src" / "main.py", 0o644)):
        os.chmod(path, m)
    daemon = DaemonProcess(root, tmp_path / "s.sock").start()
    assert daemon.terminate() == 0
    assert "a folder the daemon did not make" in daemon.output
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "src").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "src" / "main.py").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(root / "memories").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(root / "memories" / "bandits" / "20240101_note.md").st_mode) == 0o600
    assert not (root / "memory" / "journal" / "MADE_HERE").exists()
    assert set(OWN_FOLDERS) >= {p.name for p in root.iterdir()} - {"src"}


def test_a_root_the_daemon_made_is_its_own_to_keep_private(tmp_path: Path) -> None:
    root = tmp_path / "made"
    daemon = DaemonProcess(root, tmp_path / "s.sock").start()
    assert daemon.terminate() == 0
    assert (root / "memory" / "journal" / "MADE_HERE").exists()
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    (root / "notes.txt").write_text("a file another program left in the root")
    os.chmod(root / "notes.txt", 0o644)
    os.chmod(root, 0o755)
    daemon = DaemonProcess(root, tmp_path / "s.sock").start()
    assert daemon.terminate() == 0
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(root / "notes.txt").st_mode) == 0o600


# --- the routed classes ---------------------------------------------------------------------


def _forget_eurekaclaw() -> None:
    for name in [n for n in sys.modules if n == "eurekaclaw" or n.startswith("eurekaclaw.")]:
        del sys.modules[name]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The stand-in EurekaClaw installed and routed, its configured root a fresh folder with no daemon
    (autostart allowed, the socket the configured root's own): yields that root."""
    _forget_eurekaclaw()
    monkeypatch.syspath_prepend(str(FAKE))
    configured = tmp_path / "configured"
    monkeypatch.setenv("EUREKACLAW_DIR", str(configured))
    monkeypatch.delenv("EUREKAMEM_SOCKET", raising=False)
    monkeypatch.delenv("EUREKAMEM_NO_AUTOSTART", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    integration.install()
    yield configured
    integration.uninstall()
    _forget_eurekaclaw()


def test_a_registry_on_a_temporary_folder_is_eurekaclaws_own_and_starts_no_daemon(fake: Path, tmp_path: Path) -> None:
    """EurekaClaw's tests: SkillRegistry(skills_dir=<TemporaryDirectory()>/skills) with $TMPDIR a
    /tmp stand-in. Before the fix this autostarted a daemon on the stand-in and made it 1700."""
    from eurekaclaw.memory.manager import MemoryManager
    from eurekaclaw.skills.registry import SkillRegistry

    shared = _tmp_stand_in(tmp_path)
    work = shared / "tmpabc123"
    (work / "skills" / "my-skill").mkdir(parents=True)
    (work / "skills" / "my-skill" / "SKILL.md").write_text(
        "---\nname: my-skill\ndescription: a test skill\ntags: [proof]\n---\n\nUse induction.\n"
    )
    before = _modes(shared)
    registry = SkillRegistry(skills_dir=work / "skills")
    assert type(registry).__module__.startswith("eurekaclaw."), type(registry)  # EurekaClaw's own class
    assert [s.meta.name for s in registry.load_all()] == ["my-skill"]  # on that folder's files
    manager = MemoryManager("s1", memory_dir=work / "memory")
    assert type(manager).__module__.startswith("eurekaclaw."), type(manager)
    after = _modes(shared)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing of others changed
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    assert not (shared / "run").exists() and not (shared / "memory").exists()
    assert not (work / "run").exists()
    assert not fake.exists()  # nor was the configured root's daemon started for it


def test_a_folder_a_daemon_serves_is_routed_to_it(fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eurekaclaw.skills.registry import SkillRegistry

    other = tmp_path / "other-root"
    sock = tmp_path / "other.sock"
    daemon = DaemonProcess(other, sock).start()
    try:
        monkeypatch.setenv("EUREKAMEM_SOCKET", str(sock))
        registry = SkillRegistry(skills_dir=other / "skills")
        assert type(registry).__module__ == "eurekamem.integrations.eurekaclaw._routed"
        assert registry.load_all() == []
        # the same socket, but another folder: that daemon does not serve it, so EurekaClaw's own
        elsewhere = SkillRegistry(skills_dir=tmp_path / "elsewhere" / "skills")
        assert type(elsewhere).__module__.startswith("eurekaclaw.")
    finally:
        integration.uninstall()
        assert daemon.terminate() == 0


def test_the_client_drop_in_autostarts_only_on_the_configured_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eurekamem.client import MemoryManager

    monkeypatch.setenv("EUREKACLAW_DIR", str(tmp_path / "configured"))
    monkeypatch.delenv("EUREKAMEM_NO_AUTOSTART", raising=False)
    assert MemoryManager("s").autostart
    assert MemoryManager("s", tmp_path / "configured" / "memory").autostart
    assert not MemoryManager("s", tmp_path / "tmpabc" / "memory").autostart  # derived from an argument
    assert MemoryManager("s", tmp_path / "tmpabc" / "memory", autostart=True).autostart  # asked for
