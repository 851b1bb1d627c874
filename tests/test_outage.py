"""Outages lose nothing and read what is on disk (issue 27, section 5), against a real daemon
subprocess killed, stopped (SIGSTOP) and restarted on the same data root:

- writes of every kind made while the daemon is away survive the agent process's exit (the spool
  under <root>/run/spool) and arrive exactly once, with their ids and times, when it is back — also
  when the agent died after the daemon had them but before the spool knew;
- reads while it is away answer from the root's files as EurekaClaw's own manager reads them, with
  what this process spooled on top;
- a hung daemon costs ~1 s once per process and root, not per call or per manager.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eurekaclaw_reference import ReferenceManager

from daemon_process import DaemonProcess
from eurekamem.client import Client, MemoryManager

TIMEOUT = 20.0


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="em-out-"))  # short: a Unix socket path has ~100 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _daemon(root: Path, sock_dir: Path) -> DaemonProcess:
    return DaemonProcess(root, sock_dir / "s.sock")


def _manager(proc: DaemonProcess, session: str = "s1", **kw: Any) -> MemoryManager:
    return MemoryManager(session, proc.data_dir / "memory", socket_path=proc.socket_path, autostart=False, **kw)


AGENT = """
import json, sys
from pathlib import Path
from eurekamem.client import MemoryManager
root, sock = Path(sys.argv[1]), sys.argv[2]
mm = MemoryManager("run-7", root / "memory", socket_path=sock, autostart=False)
events = [mm.log_event("theory", f"step {i}", {"i": i}) for i in range(3)]
mm.remember("theory.best", {"bound": 2}, tags=["bandits"])
a = mm.add_theorem("Hoeffding", "P(|X-EX|>=t) <= 2exp(-2t^2/n)", domain="bandit theory", tags=["concentration"])
b = mm.add_theorem("UCB regret", "R_T = O(sqrt(KT log T))", domain="bandit theory")
mm.link_theorems(b.node_id, a.node_id, "uses")
# the routed SkillRegistry's writes go through the same path (Link.write is the conduit's _write)
mm._write("skills.put", {"name": "ucb-proof", "body": "# UCB\\n\\nPeel the horizon.", "source": "manual"})
related = [n.node_id for n in mm.find_related_theorems(b.node_id)]
(best,) = mm.recall_by_tag("bandits")
print(json.dumps({
    "events": [[e.entry_id, e.timestamp.isoformat()] for e in events],
    "a": a.node_id, "b": b.node_id, "related": related, "buffered": mm.buffered,
    "nodes": {n.node_id: n.created_at.isoformat() for n in (a, b)},
    "best": [best.created_at.isoformat(), best.updated_at.isoformat()],
}))
"""


def _run_agent(root: Path, socket_path: Path) -> tuple[dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EUREKAMEM_SOCKET", "EUREKACLAW_DIR")}
    done = subprocess.run(
        [sys.executable, "-c", AGENT, str(root), str(socket_path)],
        env=env,
        capture_output=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout), done.stderr.decode()


def _state(proc: DaemonProcess) -> dict[str, Any]:
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        nodes = c.call("graph.search", {"limit": 10_000})
        hoeffding = [n for n in nodes if n["theorem_name"] == "Hoeffding"]
        related = c.call("graph.related", {"node_id": hoeffding[0]["node_id"]}) if hoeffding else []
        return {
            "events": [(e.entry_id, e.content) for e in c.recent("run-7", 500)],
            "event_times": [
                dt.datetime.fromisoformat(e.timestamp).replace(tzinfo=None) for e in c.recent("run-7", 500)
            ],
            "best": (lambda r: r and (r.record_id, r.value, r.tags, r.created_at, r.updated_at))(c.recall("theory.best")),
            "nodes": {n["node_id"]: n["created_at"] for n in nodes},
            "names": sorted(n["theorem_name"] for n in nodes),
            "related_to_hoeffding": [n["theorem_name"] for n in related],
            "edges": c.call("graph.stats")["edges"],
            "skill": c.call("skills.get", {"name": "ucb-proof"})["body"],
        }


def _naive(text: str) -> dt.datetime:
    """A time as naive UTC, whichever form it was given in (EurekaClaw's naive, the wire's aware)."""
    when = dt.datetime.fromisoformat(text)
    return when.astimezone(dt.UTC).replace(tzinfo=None) if when.tzinfo is not None else when


def test_writes_of_every_kind_survive_the_agents_exit_and_arrive_exactly_once(tmp_path: Path, sock_dir: Path) -> None:
    root = tmp_path / "root"
    proc = _daemon(root, sock_dir).start()
    proc.kill()  # the daemon is gone (kill -9) before the agent runs: autostart off
    out, err = _run_agent(root, proc.socket_path)
    assert out["buffered"] == 8 and out["related"] == [out["a"]]  # its own node and link, read back meanwhile
    assert "8 writes" in err and "not delivered at exit" in err  # said at exit, with what stays spooled
    spooled = list((root / "run" / "spool").iterdir())
    assert len(spooled) == 1  # on disk, for the next process on this root
    kept = spooled[0].read_bytes()

    proc.start()  # back on the same root: the next manager delivers what the exited agent spooled
    with _manager(proc, "someone-else") as mm:
        assert mm.recall("theory.best") == {"bound": 2}
    state = _state(proc)
    assert [eid for eid, _ in state["events"]] == [eid for eid, _ in out["events"]]  # their ids, once each
    assert state["event_times"] == [dt.datetime.fromisoformat(t) for _, t in out["events"]]  # when they happened
    assert state["best"][1:3] == ({"bound": 2}, ["bandits"])
    # delivered later, the same records the agent was handed: the nodes' ids and times, the record's times
    assert {i: _naive(t) for i, t in state["nodes"].items()} == {i: _naive(t) for i, t in out["nodes"].items()}
    assert [_naive(t) for t in state["best"][3:5]] == [_naive(t) for t in out["best"]]
    assert state["names"] == ["Hoeffding", "UCB regret"] and state["related_to_hoeffding"] == ["UCB regret"]
    assert state["edges"] == 1 and state["skill"] == "# UCB\n\nPeel the horizon."
    assert list((root / "run" / "spool").iterdir()) == []

    # the agent died after the daemon had them but before its spool knew: delivered again, once
    (root / "run" / "spool" / spooled[0].name).write_bytes(kept)
    with _manager(proc, "a-third") as mm:
        assert mm.recall("theory.best") == {"bound": 2}
    assert _state(proc) == state
    assert list((root / "run" / "spool").iterdir()) == []
    proc.terminate()


def test_reads_while_the_daemon_is_away_answer_from_the_files(tmp_path: Path, sock_dir: Path) -> None:
    root = tmp_path / "root"
    proc = _daemon(root, sock_dir).start()
    with _manager(proc) as mm:
        mm.remember("theory.k1", [1, 2], tags=["t"])
        mm.remember("theory.k2", "two", tags=["t", "u"])
        a = mm.add_theorem("Azuma", "martingale differences bounded", domain="probability")
        b = mm.add_theorem("Freedman", "martingale variance bound", domain="probability")
        mm.link_theorems(b.node_id, a.node_id)
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        c.add_memory("bandit theory", "proof_strategy", "Peeling", "Split the horizon into epochs of doubling length.")
    assert proc.terminate() == 0  # the daemon wrote EurekaClaw's files on its way out
    expected_block = ReferenceManager("x", root).load_for_injection("bandit theory")
    assert "Split the horizon" in expected_block

    mm = _manager(proc)
    before = time.monotonic()
    assert mm.recall("theory.k1") == [1, 2]
    assert [r.key for r in mm.recall_by_tag("t")] == ["theory.k1", "theory.k2"]
    assert [n.theorem_name for n in mm.find_related_theorems(a.node_id)] == ["Freedman"]
    assert [n.node_id for n in mm.retrieve_relevant_theorems("martingale variance", domain="probability")] == [
        b.node_id,
        a.node_id,
    ]
    assert mm.load_for_injection("bandit theory") == expected_block
    assert mm.load_for_injection("bandit theory", query="horizon epochs") == expected_block  # EurekaClaw's newest k
    assert mm.load_for_injection("no such domain") == ""
    # what this process spooled meanwhile, on top of the files
    mm.remember("theory.k1", [3], tags=["t"])
    c_node = mm.add_theorem("Bernstein", "variance-aware martingale bound", domain="probability")
    mm.link_theorems(c_node.node_id, a.node_id, "generalizes")
    assert mm.recall("theory.k1") == [3]
    assert [(r.key, r.value) for r in mm.recall_by_tag("t")] == [("theory.k1", [3]), ("theory.k2", "two")]
    assert sorted(n.theorem_name for n in mm.find_related_theorems(a.node_id)) == ["Bernstein", "Freedman"]
    assert time.monotonic() - before < 5.0  # nothing waited for the daemon
    proc.start()
    mm._retry_at = 0.0  # try now instead of waiting for the probe
    assert mm.recall("theory.k1") == [3]
    related = mm.find_related_theorems(c_node.node_id)  # our id reaches the node the daemon named
    assert [n.theorem_name for n in related] == ["Azuma", "Freedman"] and mm.delivered == 3
    mm.close()
    proc.terminate()


def test_persistent_and_graph_views_while_the_daemon_is_away(tmp_path: Path, sock_dir: Path) -> None:
    """EurekaClaw's `.persistent` and `.graph` calls answer from the files with this process's spooled
    writes on top (a delete too), and a record put meanwhile is the one delivered (its id)."""
    root = tmp_path / "root"
    proc = _daemon(root, sock_dir).start()
    with _manager(proc) as mm:
        mm.persistent.put("theory.k1", [1, 2], ["t"])
        mm.remember("theory.k2", "two", tags=["t"])
        a = mm.graph.add_theorem("Azuma", "martingale differences bounded", domain="probability")
        b = mm.graph.add_theorem("Freedman", "martingale variance bound", domain="probability")
        mm.graph.add_edge(b.node_id, a.node_id, "generalizes")
    assert proc.terminate() == 0

    mm = _manager(proc)
    persistent, graph = mm.persistent, mm.graph
    before = time.monotonic()
    assert [r.key for r in persistent.search_keys("theory.")] == ["theory.k1", "theory.k2"]
    assert graph.stats() == {"nodes": 2, "edges": 1}
    assert [n.theorem_name for n in graph.search_by_domain("PROBABILITY")] == ["Azuma", "Freedman"]
    put = persistent.put("theory.k3", 3, ["t"])
    persistent.delete("theory.k1")
    graph.add_theorem("Bernstein", "variance-aware", domain="probability")
    assert persistent.get("theory.k1") is None and put.record_id and put.created_at.tzinfo is None
    assert [r.key for r in persistent.all_records()] == ["theory.k2", "theory.k3"]
    assert [r.key for r in persistent.get_by_tag("t")] == ["theory.k2", "theory.k3"]
    assert [n.theorem_name for n in graph.all_nodes()] == ["Azuma", "Freedman", "Bernstein"]
    assert graph.stats() == {"nodes": 3, "edges": 1} and mm.buffered == 3
    assert time.monotonic() - before < 5.0  # nothing waited for the daemon
    proc.start()
    mm._retry_at = 0.0  # try now instead of waiting for the probe
    assert [(r.key, r.record_id) for r in persistent.all_records()] == [
        ("theory.k2", persistent.get_by_tag("t")[0].record_id), ("theory.k3", put.record_id)]
    assert persistent.get("theory.k1") is None and mm.delivered == 3
    assert [n.theorem_name for n in graph.all_nodes()] == ["Azuma", "Freedman", "Bernstein"]
    mm.close()
    proc.terminate()


def test_a_hung_daemon_costs_about_a_second_once_per_process(tmp_path: Path, sock_dir: Path) -> None:
    root = tmp_path / "root"
    proc = _daemon(root, sock_dir).start()
    assert proc.proc is not None
    try:
        first = _manager(proc)
        first.remember("k", 1)
        os.kill(proc.proc.pid, signal.SIGSTOP)
        started = time.monotonic()
        assert first.recall("k") in (None, 1)  # the files' answer (the daemon may not have written them yet)
        hung = time.monotonic() - started
        started = time.monotonic()
        for i in range(5):
            first.log_event("theory", f"while hung {i}")
            assert first.recall_by_tag("none") == []
        for n in range(3):  # every new manager of the root shares the open breaker
            other = _manager(proc, f"s{n}")
            other.remember(f"k{n}", n)
            assert other.recall(f"k{n}") == n  # its spooled value
            assert other.load_for_injection("anything") == ""
        rest = time.monotonic() - started
        print(f"hung daemon: first call {hung:.2f} s, the next 23 calls {rest:.3f} s")
        assert hung < 2.5, hung  # ~1 s: no answer in 0.5 s, then no pong in 0.5 s
        assert rest < 0.5, rest  # the breaker is open: straight to the fallback
        os.kill(proc.proc.pid, signal.SIGCONT)
        from eurekamem.client._manager import breaker_for

        assert breaker_for(root).wait_closed(TIMEOUT)  # the background probe found it again
        assert first.recall("k2") == 2  # and the spool went out first
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            assert [e.content for e in c.recent("s1", 20)] == [f"while hung {i}" for i in range(5)]
    finally:
        os.kill(proc.proc.pid, signal.SIGCONT)
        proc.terminate()


FAKE = Path(__file__).resolve().parent / "fake_eurekaclaw"


def _forget_eurekaclaw() -> None:
    for name in [n for n in sys.modules if n == "eurekaclaw" or n.startswith("eurekaclaw.")]:
        del sys.modules[name]


def test_routed_classes_share_the_breaker_inside_an_asyncio_loop(
    tmp_path: Path, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EurekaClaw's own classes, routed: a hung daemon stalls its asyncio loop ~1 s once, then the
    MemoryManagers it makes per prompt and the SkillRegistry answer from the files at once."""
    import asyncio

    from eurekamem.integrations import eurekaclaw as integration

    root = tmp_path / "root"
    proc = _daemon(root, sock_dir).start()
    assert proc.proc is not None
    monkeypatch.setenv("EUREKACLAW_DIR", str(root))
    monkeypatch.setenv("EUREKAMEM_SOCKET", str(proc.socket_path))
    monkeypatch.setenv("EUREKAMEM_NO_AUTOSTART", "1")
    _forget_eurekaclaw()
    monkeypatch.syspath_prepend(str(FAKE))
    try:
        integration.install()
        from eurekaclaw.memory.manager import MemoryManager as Routed
        from eurekaclaw.skills.registry import SkillRegistry

        Routed(session_id="warm").remember("k", 1)
        os.kill(proc.proc.pid, signal.SIGSTOP)

        async def agent_turn(n: int) -> float:
            started = time.monotonic()
            memory = Routed(session_id=f"s{n}")  # EurekaClaw makes one per prompt
            memory.log_event("theory", "step")
            memory.recall("k")
            SkillRegistry().load_all()
            memory.load_for_injection("bandit theory", k=4)
            return time.monotonic() - started

        async def run() -> list[float]:
            return [await agent_turn(n) for n in range(4)]

        took = asyncio.run(run())
        print(f"routed turns with the daemon hung: {', '.join(f'{t:.3f}' for t in took)} s")
        assert took[0] < 2.5 and sum(took[1:]) < 0.5, took
    finally:
        os.kill(proc.proc.pid, signal.SIGCONT)
        integration.uninstall()
        _forget_eurekaclaw()
        proc.terminate()


def test_a_memory_dir_in_a_shared_folder_keeps_its_spool_inside_itself(tmp_path: Path, sock_dir: Path) -> None:
    """EurekaClaw's tests pass TemporaryDirectory() folders: their parent ($TMPDIR, sticky and
    world-writable) gets no run/ folder; the spool lives in the memory_dir itself."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    memory_dir = shared / "tmpabc123"
    mm = MemoryManager("s", memory_dir, socket_path=sock_dir / "nobody.sock", autostart=False)
    mm.log_event("theory", "x")
    assert mm.buffered == 1
    assert not (shared / "run").exists()
    assert len(list((memory_dir / ".eurekamem-spool").iterdir())) == 1
