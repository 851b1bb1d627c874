"""bench/loadgen.c, the C load generator of the benchmark suite, against the real daemon: it counts
answers exactly, keeps the keys it writes distinct, and counts error answers as errors.

Compiled with the machine's C compiler (skipped when there is none); every run has an idle timeout
and a subprocess timeout (bench/run.py's loadgen()), so a hung daemon fails the test instead of hanging it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon_process import DaemonProcess
from eurekamem.client import Client

ROOT = Path(__file__).resolve().parent.parent
IDLE = 10.0  # seconds without an answer before loadgen gives up


def _load_run() -> Any:
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = _load_run()


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler (cc, gcc, clang) to build bench/loadgen.c")
    path, why_not = run.loadgen_binary(tmp_path_factory.mktemp("loadgen"))
    assert path, why_not  # a compiler that cannot build it is a failure, not a skip
    return path


@pytest.fixture
def daemon(data_dir: Path, sock_dir: Path) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(data_dir, sock_dir / "s.sock").start()
    yield proc
    proc.kill()


def test_pipelined_answers_are_counted_exactly(binary: str, daemon: DaemonProcess) -> None:
    s = run.loadgen(binary, str(daemon.socket_path), "sys.ping", {}, window=8, requests=300, warm=20, idle_timeout=IDLE)
    assert (s["requests"], s["ok"], s["errors"], s["first_error"]) == (300, 300, 0, None)
    assert s["latency_samples"] == 300
    assert 0 < s["p50_us"] <= s["p99_us"] <= s["max_us"]
    assert s["ops_per_s"] > 0 and s["seconds"] > 0


def test_writes_use_distinct_keys_across_connections(binary: str, daemon: DaemonProcess) -> None:
    params = {"key": f"lg.{run.LOADGEN_COUNTER}", "value": {"n": 1}}
    s = run.loadgen(binary, str(daemon.socket_path), "persistent.remember", params, connections=3, window=4,
                    requests=120, idle_timeout=IDLE)
    assert (s["ok"], s["errors"]) == (120, 0)
    with Client(daemon.socket_path, timeout=IDLE) as c:
        assert sorted(c.keys("lg.", limit=10_000)) == [f"lg.{i:016d}" for i in range(120)]


def test_a_timed_durable_run(binary: str, daemon: DaemonProcess) -> None:
    s = run.loadgen_durable(binary, str(daemon.socket_path), clients=4, seconds=0.3)
    assert s["errors"] == 0 and s["writes"] > 0 and s["writes_per_s"] > 0
    assert 0.3 <= s["seconds"] < 5
    with Client(daemon.socket_path, timeout=IDLE) as c:
        # requests are numbered from 0, the warm-up's (3 a client) first: all these were answered, so written
        assert c.recall(f"bench.durable.c4.{s['writes'] + 3 * 4 - 1:016d}") is not None


def test_error_answers_are_counted_as_errors(binary: str, daemon: DaemonProcess) -> None:
    s = run.loadgen(binary, str(daemon.socket_path), "no.such.method", {}, window=4, requests=50, idle_timeout=IDLE)
    assert (s["requests"], s["ok"], s["errors"]) == (50, 0, 50)
    assert s["first_error"].startswith("-32601:") and "no.such.method" in s["first_error"]
    bad = run.loadgen(binary, str(daemon.socket_path), "persistent.recall", {"key": 7}, requests=5, idle_timeout=IDLE)
    assert (bad["ok"], bad["errors"]) == (0, 5) and bad["first_error"].startswith("-32602:")
    pipelined = run.loadgen_pipelined(binary, str(daemon.socket_path), "persistent.recall", 20, window=4, params={"key": 7})
    assert pipelined["errors"] == 20 and pipelined["ops_per_s"] is None  # not a throughput figure


def test_failures_raise(binary: str, sock_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="connect"):
        run.loadgen(binary, str(sock_dir / "absent.sock"), "sys.ping", {}, requests=1, idle_timeout=IDLE)
    template = tmp_path / "no-id.msgpack"
    template.write_bytes(b"\x81\xa6method\xa8sys.ping")  # no id placeholder
    proc = run.subprocess.run([binary, str(sock_dir / "absent.sock"), str(template), "-n", "1"], capture_output=True,
                              text=True, timeout=IDLE)
    assert proc.returncode == 1 and "must occur once" in proc.stderr
