"""The real daemon as a subprocess, driven through the client, raw NDJSON, the CLI and kill -9."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon_process import CLI, DaemonProcess, kill_9_under_writers, shared_daemon
from eurekamem.client import Client, InvalidParams, MemoryManager, NotFound

TIMEOUT = 20.0  # socket timeout of every client in these tests


@pytest.fixture
def daemon(data_dir: Path, sock_dir: Path):  # type: ignore[no-untyped-def]
    """A daemon of the test's own: for the tests that stop it or start a second one on its root."""
    proc = DaemonProcess(data_dir, sock_dir / "s.sock").start()
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def shared() -> Iterator[DaemonProcess]:
    """One daemon for the tests that only talk to it (each its own keys, sessions and nodes)."""
    with shared_daemon("em-int-") as proc:
        yield proc


def test_client_round_trip(shared: DaemonProcess) -> None:
    with Client(shared.socket_path, timeout=TIMEOUT) as c:
        assert c.ping() is True
        record = c.remember("theory.failed_strategies.x", {"why": "loose"}, tags=["failed"], source_session="s1")
        assert c.recall("theory.failed_strategies.x").record_id == record.record_id
        assert c.recall("nope") is None
        assert [r.key for r in c.by_tag("failed")] == ["theory.failed_strategies.x"]
        assert c.keys("theory.") == ["theory.failed_strategies.x"]
        a = c.add_theorem("A", "a", domain="d")
        b = c.add_theorem("B", "b", domain="d")
        c.link(a.node_id, b.node_id, "generalizes")
        assert [n.node_id for n in c.related(b.node_id)] == [a.node_id]
        with pytest.raises(NotFound) as err:
            c.link(a.node_id, "missing")
        assert err.value.kind == "not_found"
        with pytest.raises(InvalidParams):
            c.call("persistent.remember", {"key": 1, "value": 2})
        entry = c.log_event("s1", "theory", "tried Bernstein", {"step": 1})
        assert c.recent("s1")[-1].entry_id == entry.entry_id
        assert c.forget("theory.failed_strategies.x") is True


def test_memory_manager_is_a_drop_in(shared: DaemonProcess) -> None:
    with MemoryManager("run-1", socket_path=shared.socket_path) as mm:
        mm.log_event("survey", "read 3 papers", {"n": 3})
        mm.log_event("theory", "proved lemma 1")
        assert [e.content for e in mm.recent_events(agent_role="theory")] == ["proved lemma 1"]
        assert mm.remember("k", [1, 2], tags=["t"]) is None
        assert mm.recall("k") == [1, 2]  # the value, as EurekaClaw's recall returns
        assert mm.recall("absent") is None
        assert [r.key for r in mm.recall_by_tag("t")] == ["k"]
        a = mm.add_theorem("A", "a", domain="bandits", session_id="run-1", tags=["x"])
        b = mm.add_theorem("B", "b")
        assert mm.link_theorems(a.node_id, b.node_id) is None
        assert [n.theorem_name for n in mm.find_related_theorems(a.node_id, depth=1)] == ["B"]


def test_raw_ndjson_and_socat(shared: DaemonProcess) -> None:
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.settimeout(TIMEOUT)
    raw.connect(str(shared.socket_path))
    raw.sendall(b'{"id":1,"method":"persistent.remember","params":{"key":"shell","value":"hi"}}\r\n{"id":2,"method":"persistent.recall","params":{"key":"shell"}}\n')
    raw.shutdown(socket.SHUT_WR)
    data = b""
    while chunk := raw.recv(65536):
        data += chunk
    raw.close()
    answers = {a["id"]: a for a in map(json.loads, data.splitlines())}
    assert answers[2]["result"]["value"] == "hi"
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed; the raw socket part passed")
    out = subprocess.run(
        ["socat", "-", f"UNIX-CONNECT:{shared.socket_path}"],
        input=b'{"id":1,"method":"sys.ping"}\n', capture_output=True, timeout=TIMEOUT, check=True,
    )
    assert json.loads(out.stdout) == {"jsonrpc": "2.0", "id": 1, "result": {"pong": True}}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=TIMEOUT)


def test_cli_call_and_status(shared: DaemonProcess) -> None:
    sock = str(shared.socket_path)
    done = run_cli("call", "--socket", sock, "persistent.remember", '{"key": "cli", "value": {"a": 1}}')
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["value"] == {"a": 1}
    done = run_cli("call", "--socket", sock, "persistent.recall", '{"key": "cli"}')
    assert json.loads(done.stdout)["key"] == "cli"
    failed = run_cli("call", "--socket", sock, "graph.related", '{"node_id": "nope"}')
    assert failed.returncode == 1 and "not_found" in failed.stderr and failed.stdout == ""
    failed = run_cli("call", "--socket", sock, "persistent.recall", "{not json")
    assert failed.returncode == 1 and "not JSON" in failed.stderr
    status = run_cli("status", "--socket", sock)
    assert status.returncode == 0 and "persistent" in status.stdout and "journal" in status.stdout
    absent = run_cli("status", "--socket", str(shared.socket_path) + ".absent")
    assert absent.returncode == 1


def test_sigterm_is_a_clean_shutdown(daemon: DaemonProcess, data_dir: Path) -> None:
    with Client(daemon.socket_path, timeout=TIMEOUT) as c:
        for i in range(50):
            c.remember(f"k{i}", i)
    assert daemon.terminate() == 0
    assert not daemon.socket_path.exists()
    persistent = json.loads((data_dir / "memory" / "persistent.json").read_text())
    assert len(persistent) == 50 and persistent["k49"]["value"] == 49
    checkpoint = json.loads((data_dir / "memory" / "journal" / "checkpoint.json").read_text())
    assert checkpoint["seq"] >= 50


def test_second_daemon_exits_with_a_clear_message(daemon: DaemonProcess, data_dir: Path, sock_dir: Path) -> None:
    second = DaemonProcess(data_dir, sock_dir / "other.sock").start(expect_ready=False)
    assert second.wait_exit() == 1
    assert "another eurekamem daemon" in second.output
    with Client(daemon.socket_path, timeout=TIMEOUT) as c:
        assert c.ping()


def test_kill_9_loses_no_acknowledged_write(data_dir: Path, sock_dir: Path) -> None:
    """kill -9 under 8 concurrent writers, three times; every acknowledged write must survive."""
    proc = DaemonProcess(data_dir, sock_dir / "s.sock")
    try:
        acked = kill_9_under_writers(proc, rounds=3)
        assert len(acked) >= 1200
    finally:
        assert proc.terminate() == 0


def test_corrupt_journal_refuses_to_start_until_repaired(data_dir: Path, sock_dir: Path) -> None:
    proc = DaemonProcess(data_dir, sock_dir / "s.sock").start()
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        for i in range(40):
            c.remember(f"k{i}", "v" * 50)
    proc.kill()  # no final snapshot: everything lives in the journal
    segments = sorted((data_dir / "memory" / "journal").glob("*.log"))
    target = max(segments, key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte in the middle: later records are still valid
    target.write_bytes(bytes(data))
    proc.start(expect_ready=False)
    assert proc.wait_exit() == 2
    assert target.name in proc.output and "offset" in proc.output and "eurekamem repair" in proc.output
    repaired = run_cli("repair", "--data-dir", str(data_dir))
    assert repaired.returncode == 0, repaired.stderr
    assert list(target.parent.glob(target.name + ".bak-*")), "repair keeps a backup"
    proc.start()
    try:
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            present = [c.recall(f"k{i}") is not None for i in range(40)]
        assert present[0] and not all(present)  # a prefix survives, the damaged tail is gone
        assert present == sorted(present, reverse=True)
    finally:
        assert proc.terminate() == 0


def test_memory_manager_load_for_injection(data_dir: Path, sock_dir: Path) -> None:
    proc = DaemonProcess(data_dir, sock_dir / "s.sock").start()
    try:
        with MemoryManager("run-1", socket_path=proc.socket_path) as mm:
            assert mm.load_for_injection("bandits") == ""
            mm.client.add_memory("bandits", "pitfalls", "Hoeffding is loose", "Use Bernstein when the variance is small.")
            mm.client.add_memory("bandits", "proof_strategy", "Peeling", "Peel the horizon into geometric epochs.")
            mm.client.add_memory("other", "fact", "Global", "Seen from every domain.", scope="global")
            assert mm.client.search_memories("seen from every domain", domain="bandits", mode="lexical")[0]["memory"]["scope"] == "global"
            block = mm.load_for_injection("bandits", k=1, query="variance concentration inequality")
            assert block == "<memories>\n\n# Hoeffding is loose\n\nUse Bernstein when the variance is small.\n\n</memories>"
            newest = mm.load_for_injection("bandits", k=4)  # EurekaClaw's: the domain's folder, newest first
            assert "# Global" not in newest and newest.index("# Peeling") < newest.index("# Hoeffding")
            budgeted = mm.load_for_injection("bandits", k=4, token_budget=1000)  # the daemon's: global ones too
            assert budgeted.index("# Global") < budgeted.index("# Peeling") < budgeted.index("# Hoeffding")
    finally:
        assert proc.terminate() == 0
