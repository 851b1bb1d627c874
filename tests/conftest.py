"""Shared fixtures: short temporary socket paths, an in-process daemon, a raw NDJSON connection;
and the test layers (markers, see pyproject.toml): each test gets one of unit, trio, e2e, soak."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from eurekamem.daemon import Config, Daemon
from eurekamem.daemon.retrieval.embed import Embedder, make_embedder

IO_TIMEOUT = 20  # seconds; every I/O test runs under trio.fail_after(IO_TIMEOUT)


# The layers. A test is `e2e` when it starts a subprocess (the daemon, the eurekamem command, a load
# generator, `mount`): its own code, a fixture it takes or a helper it calls (in its module, or
# one of the helpers named in SPAWNING) uses one of SPAWN_MARKS; whole modules in LAYERS are given
# their layer. Any other test is `trio` if it is a coroutine (an in-process daemon or actor, real
# sockets) and `unit` if not. A test marked by hand keeps its marker.
LAYERS = {"test_soak": "soak", "test_faults": "e2e", "test_loadgen": "e2e"}
LAYER_NAMES = ("unit", "trio", "e2e", "soak")
SPAWN_MARKS = ("DaemonProcess", "subprocess", "run_process", "Popen", "sys.executable", "NotifiedDaemon")


def _spawning_names(path: str) -> set[str]:
    """The module's functions (tests, helpers, fixtures) that start a subprocess, directly or through
    another such function of the module."""
    import ast

    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    functions = {
        node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    spawning = {name for name, node in classes.items() if any(mark in ast.unparse(node) for mark in SPAWN_MARKS)}
    spawning |= set(SPAWN_MARKS)
    changed = True
    while changed:
        changed = False
        for name, node in functions.items():
            if name in spawning:
                continue
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
                n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            }
            used |= {arg.arg for arg in node.args.args}  # fixtures, by parameter name
            if used & spawning or any(mark in ast.unparse(node) for mark in SPAWN_MARKS):
                spawning.add(name)
                changed = True
    return spawning


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    import inspect

    spawning: dict[str, set[str]] = {}
    for item in items:
        if any(item.get_closest_marker(name) for name in LAYER_NAMES) or not isinstance(item, pytest.Function):
            continue
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        layer = LAYERS.get(module)
        if layer is None:
            path = str(item.path)
            if path not in spawning:
                spawning[path] = _spawning_names(path)
            if item.originalname in spawning[path] or set(item.fixturenames) & spawning[path]:
                layer = "e2e"
            else:
                layer = "trio" if inspect.iscoroutinefunction(item.function) else "unit"
        item.add_marker(layer)


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
