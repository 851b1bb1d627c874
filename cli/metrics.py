"""`eurekamem metrics` (sys.stats as Prometheus text) and `eurekamem top` (a live view in the terminal)."""

from __future__ import annotations

import argparse
import logging
import os
import re
import select
import sys
import time
from collections.abc import Iterator
from typing import Any

from .common import connect, fail

log = logging.getLogger("eurekamem.admin")


def _escape_label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class _Exposition:
    """Builds Prometheus text exposition format 0.0.4: HELP and TYPE once per family, then samples."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, list[str]]] = {}

    def _family(self, name: str, kind: str, help_text: str) -> list[str]:
        if name not in self.families:
            self.families[name] = (kind, help_text, [])
        return self.families[name][2]

    @staticmethod
    def _labels(labels: dict[str, Any] | None) -> str:
        if not labels:
            return ""
        return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items()) + "}"

    def sample(self, name: str, kind: str, help_text: str, value: Any, labels: dict[str, Any] | None = None, suffix: str = "") -> None:
        if value is None:
            return
        self._family(name, kind, help_text).append(f"{name}{suffix}{self._labels(labels)} {_number(value)}")

    def summary_us(self, name: str, help_text: str, summary: dict[str, Any], labels: dict[str, Any] | None = None) -> None:
        """A latency summary from a Histogram.summary() in microseconds, exposed in seconds."""
        labels = dict(labels or {})
        for quantile, key in (("0.5", "p50_us"), ("0.9", "p90_us"), ("0.99", "p99_us"), ("0.999", "p999_us")):
            if key in summary:
                self.sample(name, "summary", help_text, summary[key] / 1e6, {**labels, "quantile": quantile})
        if "sum_us" in summary:
            self.sample(name, "summary", help_text, summary["sum_us"] / 1e6, labels, "_sum")
        self.sample(name, "summary", help_text, summary.get("count", 0), labels, "_count")

    def render(self) -> str:
        out: list[str] = []
        for name, (kind, help_text, lines) in self.families.items():
            out.append(f"# HELP {name} {_escape_help(help_text)}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(lines)
        return "\n".join(out) + "\n"


_HANDLED = {"version", "pid", "started_at", "data_dir", "socket", "read_only", "tiers", "journal", "memory",
            "snapshot", "recovery", "requests"}


def render_metrics(stats: dict[str, Any]) -> str:
    """sys.stats as Prometheus text: requests, errors, latency summaries, journal, tiers, queues."""
    m = _Exposition()
    m.sample("eurekamem_info", "gauge", "Build information (always 1).", 1, {"version": stats.get("version", "")})
    m.sample("eurekamem_process_pid", "gauge", "The daemon's process id.", stats.get("pid"))
    started = _epoch(stats.get("started_at"))
    m.sample("eurekamem_start_time_seconds", "gauge", "When the daemon started, in seconds since the epoch.", started)
    m.sample("eurekamem_read_only", "gauge", "1 when the journal cannot be written and writes are refused.", bool(stats.get("read_only")))

    requests = stats.get("requests", {})
    for method, entry in requests.get("methods", {}).items():
        labels = {"method": method}
        m.sample("eurekamem_requests_total", "counter", "Requests answered, by method.", entry.get("count", 0), labels)
    for method, entry in requests.get("methods", {}).items():
        for kind, count in sorted(entry.get("errors", {}).items()):
            m.sample("eurekamem_request_errors_total", "counter", "Error answers, by method and error kind.", count, {"method": method, "kind": kind})
    for method, entry in requests.get("methods", {}).items():
        m.summary_us("eurekamem_request_duration_seconds", "Time from a request's arrival to its answer, by method.", entry, {"method": method})
    m.sample("eurekamem_connections_open", "gauge", "Client connections open now.", requests.get("connections_open"))
    m.sample("eurekamem_connections_total", "counter", "Client connections accepted since start.", requests.get("connections_total"))

    journal = stats.get("journal", {})
    m.sample("eurekamem_journal_bytes", "gauge", "Bytes in the journal's segment files.", journal.get("bytes"))
    m.sample("eurekamem_journal_segments", "gauge", "Journal segment files.", journal.get("segments"))
    m.sample("eurekamem_journal_last_seq", "gauge", "Sequence number of the last durable journal record.", journal.get("last_seq"))
    m.sample("eurekamem_journal_batches_total", "counter", "Journal group-commit batches written.", journal.get("batches"))
    m.sample("eurekamem_journal_records_total", "counter", "Journal records written.", journal.get("records"))
    m.sample("eurekamem_journal_failed", "gauge", "1 when the journal stopped after a write error.", bool(journal.get("failed")))
    m.sample("eurekamem_journal_resumes_total", "counter", "Times sys.resume made the journal writable again.", journal.get("resumes"))
    if isinstance(journal.get("fsync_latency"), dict):
        m.summary_us("eurekamem_journal_fsync_seconds", "Latency of the journal's fsync calls.", journal["fsync_latency"], {"policy": journal.get("fsync", "")})

    for tier, counts in stats.get("tiers", {}).items():
        for key, value in counts.items():
            if key == "queue":
                m.sample("eurekamem_queue_length", "gauge", "Requests waiting in a tier actor's queue.", value, {"tier": tier})
            elif isinstance(value, (int, float)):
                m.sample("eurekamem_tier_items", "gauge", "Items held by a tier, by kind (records, nodes, memories, ...).", value, {"tier": tier, "kind": key})

    memory = stats.get("memory", {})
    for key, help_text in (
        ("files_written", "Memory .md and _index.json files written."),
        ("projection_errors", "Failed writes of memory files (retried)."),
        ("reembedded", "Memories embedded again in the background."),
    ):
        m.sample(f"eurekamem_memory_{key}_total", "counter", help_text, memory.get(key))
    for mode, summary in (memory.get("search") or {}).items():
        if isinstance(summary, dict):
            m.summary_us("eurekamem_memory_search_seconds", "memory.search's own time, by mode: index, BM25 and fusion, without the query's embedding.", summary, {"mode": mode})
    if isinstance(memory.get("query_embedding"), dict):
        m.summary_us("eurekamem_memory_query_embedding_seconds", "Embedding one search query.", memory["query_embedding"])
    if memory.get("model"):
        m.sample("eurekamem_memory_model_info", "gauge", "The embedding model of tier 4 (always 1).", 1, {"model": memory["model"]})
    m.sample("eurekamem_snapshot_seq", "gauge", "Journal sequence number covered by the last snapshot.", stats.get("snapshot", {}).get("seq"))
    recovery = stats.get("recovery", {})
    m.sample("eurekamem_recovery_seconds", "gauge", "Time recovery took at start.", recovery.get("seconds"))
    m.sample("eurekamem_recovery_replayed_records", "gauge", "Journal records replayed at start.", recovery.get("replayed"))

    for key, value in stats.items():  # sections added later (jobs, limits, ...): numbers as gauges
        if key not in _HANDLED:
            for path, number in _numeric_leaves(value, [key]):
                name = "eurekamem_" + "_".join(re.sub(r"[^a-zA-Z0-9_]", "_", p) for p in path)
                m.sample(name, "gauge", f"sys.stats {'.'.join(path)}.", number)
    return m.render()


def _numeric_leaves(value: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    if isinstance(value, bool) or isinstance(value, (int, float)):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numeric_leaves(item, path + [str(key)])


def _epoch(stamp: Any) -> float | None:
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return None


def cmd_metrics(args: argparse.Namespace) -> int:
    from ..client import ConnectionLost, EurekamemError

    try:
        with connect(args) as client:
            stats = client.call("sys.stats", {})
    except BrokenPipeError:  # stdout's reader went away, not the daemon: main() ends quietly
        raise
    except (EurekamemError, ConnectionLost, OSError) as exc:
        return fail(f"not running or not reachable: {exc}")
    sys.stdout.write(render_metrics(stats))
    return 0


CLEAR = "\x1b[H\x1b[2J"


def render_top(stats: dict[str, Any], previous: dict[str, Any] | None, elapsed: float) -> str:
    lines = []
    journal = stats["journal"]
    requests = stats["requests"]
    rate = ""
    if previous is not None and elapsed > 0:
        rate = f"  {(requests['total'] - previous['requests']['total']) / elapsed:,.0f} req/s"
    lines.append(f"eurekamem {stats['version']}  pid {stats['pid']}  since {stats['started_at']}{rate}")
    lines.append(f"  data {stats['data_dir']}   socket {stats['socket']}")
    state = "READ-ONLY: " + str(journal.get("failed")) if stats.get("read_only") else "writable"
    fl = journal.get("fsync_latency", {})
    lines.append(
        f"  journal  {journal['bytes']:,} bytes, {journal['segments']} segments, seq {journal['last_seq']}, "
        f"fsync {journal['fsync']} p50 {fl.get('p50_us', 0)} us p99 {fl.get('p99_us', 0)} us, {state}"
    )
    for tier, counts in stats["tiers"].items():
        lines.append(f"  {tier:<10} " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    from .calls import embedding_line

    embedding = embedding_line(stats)
    if embedding:
        lines.append(f"  embedding {embedding}")
    lines.append(f"  connections {requests['connections_open']} open, {requests['connections_total']} total; {requests['total']:,} requests")
    lines.append(f"    {'method':<22} {'count':>9} {'rate/s':>8} {'p50 us':>10} {'p99 us':>10} {'max us':>10} {'errors':>7}")
    before = (previous or {}).get("requests", {}).get("methods", {})
    for name, entry in requests["methods"].items():
        per_second = (entry["count"] - before.get(name, {}).get("count", 0)) / elapsed if previous is not None and elapsed > 0 else 0.0
        lines.append(
            f"    {name:<22} {entry['count']:>9} {per_second:>8.0f} {entry['p50_us']:>10} {entry['p99_us']:>10} "
            f"{entry['max_us']:>10} {sum(entry['errors'].values()):>7}"
        )
    return "\n".join(lines)


class _Keys:
    """Single key presses from a terminal stdin (cbreak mode), restored on exit; nothing otherwise."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.saved: Any = None

    def __enter__(self) -> _Keys:
        try:
            if sys.stdin.isatty():
                import termios
                import tty

                self.fd = sys.stdin.fileno()
                self.saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
        except (OSError, ValueError, AttributeError):
            self.fd = None
        return self

    def wait(self, seconds: float) -> str:
        """Wait up to `seconds`; returns a key pressed meanwhile ("" when none)."""
        if self.fd is None:
            time.sleep(seconds)
            return ""
        ready, _, _ = select.select([self.fd], [], [], seconds)
        return os.read(self.fd, 16).decode(errors="replace") if ready else ""

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


def cmd_top(args: argparse.Namespace) -> int:
    from ..client import ConnectionLost, EurekamemError

    previous: dict[str, Any] | None = None
    previous_at = 0.0
    done = 0
    # a terminal gets a screen redrawn in place until q; a pipe or a file gets plain frames, no
    # screen codes: one, or --iterations of them, a blank line apart
    terminal = sys.stdout.isatty()
    iterations = args.iterations or (0 if terminal else 1)
    try:
        with connect(args) as client, _Keys() as keys:
            while True:
                try:
                    stats = client.call("sys.stats", {})
                except BrokenPipeError:  # stdout's reader went away, not the daemon: main() ends quietly
                    raise
                except (EurekamemError, ConnectionLost, OSError) as exc:
                    return fail(f"not running or not reachable: {exc}")
                now = time.monotonic()
                frame = render_top(stats, previous, now - previous_at)
                if terminal:
                    sys.stdout.write(CLEAR + frame + "\n\nq or Ctrl-C quits\n")
                else:
                    sys.stdout.write(("\n" if done else "") + frame + "\n")
                sys.stdout.flush()
                previous, previous_at = stats, now
                done += 1
                if iterations and done >= iterations:
                    return 0
                if "q" in keys.wait(args.interval).lower():
                    return 0
    except KeyboardInterrupt:
        return 0


