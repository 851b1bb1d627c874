"""The real daemon as a subprocess, for integration tests: started, waited for, stopped."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT = 30.0
# The `eurekamem` command as its entry point runs it (eurekamem.cli.main:main). Not `python -m
# eurekamem.daemon`, which imports the whole daemon before it hands a command to the CLI (~0.5 s of
# CPU a call, many times over in the tests that run commands).
CLI = [sys.executable, "-m", "eurekamem.cli.main"]


class DaemonProcess:
    def __init__(self, data_dir: Path, socket_path: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.env = env  # the daemon's environment (default: this process's)
        self.data_dir = data_dir
        self.socket_path = socket_path
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: list[str] = []
        self._ready = threading.Event()
        self._ended = threading.Event()
        self._lines = threading.Condition()

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "eurekamem.daemon", "serve",
            "--data-dir", str(self.data_dir), "--socket", str(self.socket_path), *self.extra,
        ]

    def start(self, expect_ready: bool = True) -> DaemonProcess:
        base = os.environ if self.env is None else self.env
        env = {k: v for k, v in base.items() if k not in ("EUREKAMEM_SOCKET", "EUREKACLAW_DIR")}
        self._ready.clear()
        self._ended.clear()
        self.log = []
        self.proc = subprocess.Popen(self.argv(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        if expect_ready:
            self._ready.wait(START_TIMEOUT)
            if not self._ready.is_set():
                self.kill()
                raise RuntimeError("daemon did not get ready:\n" + "".join(self.log))
        return self

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            with self._lines:
                self.log.append(line)
                self._lines.notify_all()
            if "serving on" in line:
                self._ready.set()
        self._ended.set()
        with self._lines:
            self._lines.notify_all()

    def wait_for_line(self, text: str, timeout: float = START_TIMEOUT, start: int = 0) -> str:
        """The first log line from index `start` on that contains `text`, waiting for it (woken by
        each new line); AssertionError if the daemon ends or `timeout` passes first."""
        with self._lines:
            found = self._lines.wait_for(
                lambda: next((x for x in self.log[start:] if text in x), None) or (self._ended.is_set() and "ended"),
                timeout,
            )
        if not found or found == "ended":
            raise AssertionError(f"no log line with {text!r} ({'daemon ended' if found else 'timed out'}):\n{self.output}")
        return str(found)

    def wait_for_output(self, text: str, timeout: float = START_TIMEOUT) -> bool:
        """Wait until `text` is in the output (the daemon logged it), at most `timeout` seconds;
        False if it never came (or the daemon's stderr ended without it)."""
        with self._lines:
            return self._lines.wait_for(lambda: text in self.output or self._ended.is_set(), timeout) and text in self.output

    def wait_exit(self, timeout: float = START_TIMEOUT) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        self._ended.wait(timeout)
        return code

    def terminate(self, timeout: float = START_TIMEOUT) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(START_TIMEOUT)

    @property
    def output(self) -> str:
        return "".join(self.log)


@contextlib.contextmanager
def shared_daemon(prefix: str, *extra: str, env: dict[str, str] | None = None) -> Iterator[DaemonProcess]:
    """One daemon on a fresh short root (/tmp/<prefix>...: the socket path stays short) for the tests of a
    module that do not interfere (each its own keys, sessions, nodes): a module-scoped fixture yields from
    it, one start (~1-3 s of a busy machine) instead of one a test. Stopped with SIGTERM, the root removed."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    proc = DaemonProcess(root / "data", root / "s.sock", *extra, env=env).start()
    try:
        yield proc
    finally:
        proc.terminate()
        shutil.rmtree(root, ignore_errors=True)


def wait_gone(pid: int, timeout: float = START_TIMEOUT) -> None:
    """Wait for any process (a child or not: a daemon started detached) to exit, by its pidfd."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if not select.select([fd], [], [], timeout)[0]:
            raise TimeoutError(f"process {pid} still running after {timeout} s")
    finally:
        os.close(fd)


def _remember_writer(path: Path, name: str, acked: dict[str, int], lock: threading.Lock, total: list[int], enough: threading.Event, seed: int) -> None:
    """persistent.remember in a loop; what the daemon acknowledged goes into `acked` (key -> value)."""
    import random

    from eurekamem.client import Client, ConnectionLost, EurekamemError

    rng = random.Random(seed)
    client = Client(path, timeout=30.0)
    i = 0
    try:
        while i < 100_000:  # bounded; the kill ends it much sooner
            key = f"{name}-{i}"
            value = rng.randrange(1 << 30)
            client.remember(key, value, tags=[name])
            with lock:
                acked[key] = value
                total[0] += 1
                if total[0] >= 400:
                    enough.set()
            i += 1
    except (ConnectionLost, EurekamemError, OSError):
        return  # the daemon was killed under us: this write was never acknowledged
    finally:
        client.close()


def kill_9_under_writers(proc: DaemonProcess, rounds: int, writers: int = 8) -> dict[str, int]:
    """Start the daemon, kill -9 it under `writers` concurrent writers once each has had time to
    write (400 acknowledged in all), `rounds` times; then start it again and check that every
    acknowledged write is there with its value (AssertionError naming the first one lost). Returns
    the acknowledged writes; the daemon is left running."""
    from eurekamem.client import Client

    acked: dict[str, int] = {}
    lock = threading.Lock()
    for round_no in range(rounds):
        proc.start()
        total = [0]
        enough = threading.Event()
        threads = [
            threading.Thread(
                target=_remember_writer,
                args=(proc.socket_path, f"r{round_no}w{w}", acked, lock, total, enough, round_no * 100 + w),
            )
            for w in range(writers)
        ]
        for t in threads:
            t.start()
        assert enough.wait(START_TIMEOUT * 3), "writers made no progress"
        proc.kill()
        for t in threads:
            t.join(START_TIMEOUT)
            assert not t.is_alive()
    proc.start()
    with Client(proc.socket_path, timeout=30.0) as c:
        keys = sorted(acked)
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            records = c.call_many([("persistent.recall", {"key": k}) for k in chunk])
            for key, record in zip(chunk, records):
                assert record is not None, f"acknowledged write {key} was lost"
                value = record["value"] if isinstance(record, dict) else record.value
                assert value == acked[key], f"acknowledged write {key} came back as {value!r}, not {acked[key]!r}"
    return acked
