"""Shared fixtures: short temporary socket paths, an in-process daemon, a raw NDJSON connection;
and the test layers (markers, see pyproject.toml): each test gets one of unit, io, trio, e2e, soak."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from eurekamem.daemon import Config, Daemon
from eurekamem.daemon import app as _app
from eurekamem.daemon.retrieval.embed import Embedder, make_embedder

IO_TIMEOUT = 20  # seconds; every I/O test runs under trio.fail_after(IO_TIMEOUT)

# pytest keeps each test module with its asserts rewritten as bytecode in tests/__pycache__, unless
# writing bytecode is off (PYTHONDONTWRITEBYTECODE, as on this project's machines and CI): then every
# run rewrites the ~90 modules' ~5,000 asserts again, ~8 s of CPU in each run's collection (in each
# xdist worker's). The package's bytecode is written for the same reason (pytest_sessionstart below).
sys.dont_write_bytecode = False

# In a pytest-xdist worker GNU readline (which pdb imports) writes a LINES and COLUMNS of its own into the
# environment: the commands the tests run would then cut their tables to 80 columns, where a run in one
# process, their output a pipe, prints them whole.
if "PYTEST_XDIST_WORKER" in os.environ:
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


# The layers. A test is `e2e` when it starts a subprocess (the daemon, the eurekamem command, a load
# generator, `mount`): its own code, a fixture it takes or a helper it calls (in its module, or
# or a fixture of this file in SPAWNING_FIXTURES) uses one of SPAWN_MARKS; whole modules in LAYERS are given
# their layer. Any other test is `trio` if it is a coroutine (an in-process daemon or actor, real
# sockets), `io` if it is not but opens a socket or runs an event loop itself (SOCKET_MARKS, found the
# same way: a Client against a stub server, trio.run of its own), and `unit` if neither. A test marked by hand keeps its marker. The derivation is checked while the
# tests run (_LayerCheck): a `unit` test that opens a socket or starts a process, or a `trio` or `io`
# test that starts a process, fails saying which marker it needs. (`trio` is also pytest-trio's marker,
# which runs a coroutine test: a test that is not one cannot have it, hence `io`.) `slow` is given by
# hand to an in-process test that takes seconds of CPU (a real model over a labelled set, a store of
# thousands), so that `-m unit` stays the quick loop; `make test-fast` still runs them.
LAYERS = {"test_soak": "soak", "test_faults": "e2e", "test_loadgen": "e2e"}
LAYER_NAMES = ("unit", "io", "trio", "e2e", "soak", "slow")
SPAWN_MARKS = ("DaemonProcess", "subprocess", "run_process", "Popen", "sys.executable", "NotifiedDaemon")
SOCKET_MARKS = ("trio.run", "running_daemon", "open_unix_socket", "socket.socket", "socketpair", "RawConnection",
                "StubLLMServer", "Client(", "AsyncClient", "MemoryManager(", "asyncio.run", "anyio.run", "HTTPServer",
                "socketserver", "create_connection", "urlopen", "httpx", ".notify(")


_MARKS: dict[Path, tuple[set[str], set[str]]] = {}


def _module_marks(path: Path) -> tuple[set[str], set[str]]:
    """The module's functions and classes (tests, helpers, fixtures) that start a subprocess, and those
    that open a socket or run an event loop, directly or through another such function of the module
    or one it imports from a helper module of tests/ (tests/jobs_helpers.py...)."""
    import ast

    if path in _MARKS:
        return _MARKS[path]
    _MARKS[path] = (set(), set())  # an import cycle between helpers ends here
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    uses: dict[str, set[str]] = {}  # name -> the names and attributes it uses, and its fixtures
    texts: dict[str, str] = {}
    imported: tuple[set[str], set[str]] = (set(), set())  # the names imported from a helper that spawn, that open sockets
    for node in tree.body:
        helper = path.parent / f"{node.module}.py" if isinstance(node, ast.ImportFrom) and node.module else None
        if helper is not None and helper.exists():
            for found, theirs in zip(imported, _module_marks(helper)):
                found.update(alias.asname or alias.name for alias in node.names if alias.name in theirs)
    nodes = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nodes += [node for node in tree.body if isinstance(node, ast.ClassDef)]
    for node in nodes:
        used = uses.setdefault(node.name, set())
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                used.add(n.id)
            elif isinstance(n, ast.Attribute):
                used.add(n.attr)
        if not isinstance(node, ast.ClassDef):
            used.update(arg.arg for arg in node.args.args)  # fixtures, by parameter name
        texts[node.name] = texts.get(node.name, "") + "\n".join(lines[node.lineno - 1 : node.end_lineno])

    def closure(marks: tuple[str, ...], seed: set[str]) -> set[str]:
        found = set(marks) | seed | {name for name, text in texts.items() if any(mark in text for mark in marks)}
        changed = True
        while changed:
            more = {name for name, used in uses.items() if name not in found and used & found}
            found |= more
            changed = bool(more)
        return found

    _MARKS[path] = closure(SPAWN_MARKS, imported[0]), closure(SOCKET_MARKS, imported[1])
    return _MARKS[path]


SPAWNING_FIXTURES = {"postgres_server"}  # this file's fixtures that start a subprocess


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    import inspect

    for item in items:
        if any(item.get_closest_marker(name) for name in LAYER_NAMES) or not isinstance(item, pytest.Function):
            continue
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        layer = LAYERS.get(module)
        if layer is None:
            spawning, socketing = _module_marks(Path(item.path))
            names = {item.originalname, *item.fixturenames}
            on_postgres = any(mark.name == "postgres" for mark in item.own_markers)  # store's postgres param
            if names & (spawning | SPAWNING_FIXTURES) or on_postgres:
                layer = "e2e"
            elif inspect.iscoroutinefunction(item.function):
                layer = "trio"
            elif names & socketing:
                layer = "io"
            else:
                layer = "unit"
        item.add_marker(layer)


class _LayerCheck:
    """What the running test does that its layer rules out, seen by an audit hook (sys.addaudithook):
    a socket made or a process started, in the main thread or a thread started during the test (the
    threads left by earlier tests, and trio's cached workers, are not this test's)."""

    EVENTS = {"socket.__new__": "opens a socket", "subprocess.Popen": "starts a process", "os.fork": "forks",
              "os.posix_spawn": "starts a process", "os.exec": "starts a process", "os.system": "starts a process"}
    ALLOWED = {"unit": (), "io": ("opens a socket",), "trio": ("opens a socket",), "slow": ("opens a socket",)}

    def __init__(self) -> None:
        self.seen: set[str] | None = None  # what the running test did; None between tests
        self.before: set[int] = set()

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.seen is None or event not in self.EVENTS:
            return
        if event == "subprocess.Popen" and args[0] == "/sbin/ldconfig":
            return  # ctypes.util.find_library, as an import may call it
        ident = threading.get_ident()
        if ident == threading.main_thread().ident or ident not in self.before:
            self.seen.add(self.EVENTS[event])

    def start(self) -> None:
        self.before = {t.ident for t in threading.enumerate() if t.ident is not None}
        self.seen = set()

    def check(self, item: pytest.Item) -> None:
        seen, self.seen = self.seen or set(), None
        layers = {name for name in LAYER_NAMES if item.get_closest_marker(name)}
        if not seen or layers & {"e2e", "soak"}:
            return
        layer = next((name for name in ("trio", "io", "slow") if name in layers), "unit")
        wrong = seen - set(self.ALLOWED[layer])
        if wrong:
            needs = "io" if wrong == {"opens a socket"} else "e2e"
            pytest.fail(f"this test {' and '.join(sorted(wrong))}, which a `{layer}` test may not: mark it "
                        f"@pytest.mark.{needs} (or name what it calls in tests/conftest.py's SPAWN_MARKS / "
                        "SOCKET_MARKS)", pytrace=False)


_LAYER_CHECK = _LayerCheck()
sys.addaudithook(_LAYER_CHECK.audit)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    _LAYER_CHECK.start()
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield
    _LAYER_CHECK.check(item)
    return result


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the package to bytecode once, before the tests start their ~300 daemon and command
    subprocesses: where PYTHONDONTWRITEBYTECODE is set (as on some CI machines) each of them would
    otherwise compile its ~140 modules again (~0.3 s of CPU a process). Up to date: ~0.1 s."""
    import compileall
    import re

    root = Path(__file__).resolve().parent.parent
    compileall.compile_dir(root, quiet=1, rx=re.compile(r"/(\.venv|\.git|build|tests|bench)/"))


@pytest.fixture
def sock_dir() -> Any:
    """A short folder for sockets (AF_UNIX paths must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="em-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """One real PostgreSQL with pgvector for the run (tests/pg_server.py); the tests that need it
    skip with the reason where it cannot run, or fail where EUREKAMEM_REQUIRE_POSTGRES=1 (CI)."""
    from pg_server import PostgresServer, Unavailable

    try:
        server = PostgresServer()
        server.init()
    except Unavailable as exc:
        if os.environ.get("EUREKAMEM_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required here (EUREKAMEM_REQUIRE_POSTGRES=1) but cannot run: {exc}")
        pytest.skip(f"PostgreSQL cannot run here: {exc}")
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def postgres_dsn(postgres_server: Any) -> Iterator[str]:
    """A fresh database (with the vector extension) on the run's PostgreSQL; dropped after."""
    dsn = postgres_server.create_database()
    yield dsn
    postgres_server.start()  # an outage test may have left it stopped
    postgres_server.drop_database(dsn)


@pytest.fixture(params=["journal", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The durable store a tier test runs on, as running_daemon's options: the journal (the
    default: none) and PostgreSQL (a fresh database of the run's server); a test taking it runs on both."""
    if request.param == "journal":
        return {}
    return {"store": "postgres", "postgres_dsn": request.getfixturevalue("postgres_dsn")}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    return root


_EMBEDDERS: dict[str, Embedder] = {}  # this test process's: a model loads once, however many daemons run


def shared_embedder(name: str, options: dict[str, Any] | None = None) -> Embedder:
    """One embedder per model and options for the whole test run (each Daemon would load its own)."""
    options = options or {}
    key = name + repr(sorted(options.items()))
    embedder = _EMBEDDERS.get(key)
    if embedder is None:
        embedder = _EMBEDDERS[key] = make_embedder(name, **options)
    return embedder


@contextlib.contextmanager
def tmpfs(tmp_path: Path, size: int) -> Iterator[Path]:
    """A real small disk: a tmpfs of `size` bytes mounted at tmp_path/disk for the block (needs
    root and mount; the test is skipped with the reason otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs (a real full disk)")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("no mount/umount command here")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(disk)],
                          capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip() or done.returncode}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True, timeout=10, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], check=True, timeout=10)


@contextlib.contextmanager
def _gc_tuned_without_the_collection() -> Iterator[None]:
    """daemon/app.py's _gc_tuned (the collector frozen and tuned for the daemon's life, undone after)
    less its full collection on entering: in a test process that walks every object of the run
    (~200k, ~0.15 s of CPU, more as the run goes on), once for each of the hundreds of in-process
    daemons the tests start. The subprocess daemons (e2e) run the daemon's own, collection included."""
    from unittest import mock

    tuned = _real_gc_tuned()
    with mock.patch("gc.collect", return_value=0):
        tuned.__enter__()
    try:
        yield
    finally:
        tuned.__exit__(None, None, None)


_real_gc_tuned = _app._gc_tuned
_app._gc_tuned = _gc_tuned_without_the_collection


@asynccontextmanager
async def running_daemon(data_dir: Path, socket_path: Path, **options: Any) -> AsyncIterator[Daemon]:
    fs = options.pop("fs", None)
    embedder = options.pop("embedder_instance", None)
    # the daemon's own arguments (its environment, job kinds, LLM factory); the rest is Config
    extra = {name: options.pop(name) for name in ("environ", "job_kinds", "llm_factory") if name in options}
    options.setdefault("snapshot_quiet", 3600.0)  # tests snapshot explicitly
    options.setdefault("snapshot_max_delay", 3600.0)
    config = Config(data_dir=data_dir, socket_path=socket_path, **options)
    if embedder is None:
        embedder = shared_embedder(config.embedder, config.embedder_options)
    daemon = Daemon(config, fs=fs, embedder=embedder, **extra)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.serve)
        try:
            yield daemon
        finally:
            daemon.request_shutdown()


class RawConnection:
    """NDJSON over a real Unix socket, for tests that speak the wire protocol by hand."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buf = bytearray()

    @classmethod
    async def open(cls, path: Path) -> RawConnection:
        return cls(await trio.open_unix_socket(str(path)))

    async def send_line(self, line: bytes | str) -> None:
        if isinstance(line, str):
            line = line.encode()
        await self.stream.send_all(line if line.endswith(b"\n") else line + b"\n")

    async def send(self, obj: Any) -> None:
        await self.send_line(json.dumps(obj))

    async def read_line(self) -> bytes | None:
        while b"\n" not in self._buf:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self._buf += data
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        return line

    async def read(self) -> Any:
        line = await self.read_line()
        assert line is not None, "connection closed before an answer came"
        return json.loads(line)

    async def call(self, method: str, params: dict | None = None, request_id: Any = 1) -> Any:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.read()

    async def result(self, method: str, params: dict | None = None) -> Any:
        answer = await self.call(method, params)
        assert "result" in answer, answer
        return answer["result"]

    async def error_kind(self, method: str, params: dict | None = None) -> str:
        answer = await self.call(method, params)
        assert "error" in answer, answer
        return answer["error"]["data"]["kind"]

    async def aclose(self) -> None:
        await self.stream.aclose()


@pytest.fixture
def stub() -> Iterator[Any]:
    """The loopback LLM server of tests/test_llm.py (StubLLMServer), closed after the test."""
    from test_llm import StubLLMServer

    server = StubLLMServer()
    yield server
    server.close()


@contextlib.asynccontextmanager
async def routed(actor, method: str):  # type: ignore[no-untyped-def]
    """Yield an Event set once the memory actor has routed a write of `method` to a lane (it counts
    in writes_waiting from then on). Not wait_all_tasks_blocked: the actor may be running
    background work (a projection, a scan) in a worker thread, and a task awaiting a thread counts
    as blocked while the request is still in front of the actor."""
    event = trio.Event()
    original = actor._to_bulk

    def to_lane(work):  # type: ignore[no-untyped-def]
        lane = original(work)
        if work.call.spec.name == method:
            event.set()
        return lane

    actor._to_bulk = to_lane
    try:
        yield event
    finally:
        del actor._to_bulk  # the class's method again


class HeldJournal:
    """The journal's next group held before it is durable (a slow disk), whichever way the actor
    syncs: the writer thread's write waits in that thread (journal_thread.WriterThreadSync._write);
    the kernel's completion is kept, unread, until `release` (journal_kernel.KernelSync). With `fail_errno` the held
    group's sync fails with it at release, and so does every later one while held."""

    def __init__(self, actor: Any, fail_errno: int | None = None) -> None:
        self.actor = actor
        self.backend = actor.backend  # the journal actor's sync back-end, whose steps are held
        self.fail_errno = fail_errno
        self.entered = threading.Event()  # a group waits (set from the writer thread, or from trio's)
        self.durable = False  # the held group was made durable
        self._go = threading.Event()
        self._held: list[int] = []
        self._write: Any = None

    async def wait_entered(self) -> None:
        assert await trio.to_thread.run_sync(self.entered.wait, IO_TIMEOUT), "no journal group came to be held"

    def __enter__(self) -> HeldJournal:
        backend = self.backend
        if backend.name == "kernel":
            def completed(result: int) -> None:  # caio's callback, inside drain: keep the result
                self._held.append(result)
                self.entered.set()

            backend._completed = completed
            return self
        self._write = write = backend._write

        def held_write(records: Any) -> Any:  # in the writer thread
            self.entered.set()
            assert self._go.wait(IO_TIMEOUT), "the test never released the journal write"
            if self.fail_errno is not None:
                raise OSError(self.fail_errno, os.strerror(self.fail_errno))
            last = write(records)
            self.durable = True
            return last

        backend._write = held_write
        return self

    def release(self) -> None:
        """Let the held group go on: its sync completes (or fails) now."""
        backend = self.backend
        if backend.name != "kernel":
            self._go.set()
            return
        if "_completed" in vars(backend):
            del backend._completed  # the back-end's own method again
        for result in self._held:
            backend._result = result if self.fail_errno is None else (1 << 64) - self.fail_errno
            self.actor.drain_acks()  # on trio's thread, as the poller's pass would
            self.durable = self.fail_errno is None
        self._held.clear()

    def __exit__(self, *exc: object) -> None:
        self.release()
        if self._write is not None:
            self.backend._write = self._write
