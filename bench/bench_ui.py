#!/usr/bin/env python3
"""`eurekamem ui` at scale: the server-side time of its pages over a real daemon holding N memories
in one domain, each next to its anchor measured in the same run: the daemon calls the page makes,
alone (so the ratio is what the UI adds: rendering, the guard, the ASGI app).

    .venv/bin/python bench/bench_ui.py [--n 100000] [--domains 1] [--repeat 30] [--out bench/results] [--data DIR]

--data DIR keeps the loaded data root in DIR and, when DIR already holds one, measures it without
loading again: run it once per build (another build's interpreter, e.g. a main checkout's
.venv/bin/python running this file) to compare two builds on the same 100,000 memories. The
anchors follow the build: with memory.domains (issue 32's follow-up) the pages read their counts
from it, before it from one memory.list per category.

The memories are loaded quickly: the daemon runs with an OpenAI-compatible embedder pointed at a
loopback server started here that answers seeded 16-dimension vectors at once (the UI reads no
vector; a real model would only slow the load), through memory.add_many, 256 a call, dedup off.
A page is timed from the request to the last byte of the answer through the app in this process
(httpx's ASGITransport, no sockets between the browser and the app); the daemon calls through the
real socket. Writes <out>/ui-<timestamp>.md and .json.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import SEED, Daemon, log, machine, summarize_s, table, write_report  # noqa: E402

_common.set_log_prefix("bench-ui")

DIM = 16
CHUNK = 256
DOMAIN = "bench domain"
TARGET_MS = 100.0  # issue 32: a page renders in < 100 ms server-side at 100k memories
WORDS = ("bound regret bandit proof lemma martingale variance estimator horizon epoch peeling doubling "
         "concentration tail median mean reward policy arm sample complexity confidence interval").split()
CATEGORIES = ["domain_knowledge", "proof_strategy", "open_problems", "pitfalls", "fact", "preference", "goal", "context"]


@contextlib.contextmanager
def embeddings_server() -> Iterator[str]:
    """A loopback OpenAI-compatible /v1/embeddings answering a seeded vector per input."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return None

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            data = []
            for i, text in enumerate(body["input"]):
                digest = hashlib.sha256(text.encode()).digest()
                data.append({"index": i, "embedding": [b / 255.0 - 0.5 for b in digest[:DIM]]})
            raw = json.dumps({"data": data, "model": body.get("model", "stub")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def domain_of(i: int, n: int, domains: int) -> str:
    """The i-th memory's domain: `domains` domains of n // domains memories each, in blocks (so one
    add_many call touches one or two of them); with one domain, DOMAIN."""
    return DOMAIN if domains == 1 else f"{DOMAIN} {i * domains // n}"


def load(sock: str, n: int, domains: int) -> dict[str, Any]:
    rng = random.Random(SEED)
    started = time.perf_counter()
    created = 0
    with contextlib.closing(_common.client(sock, timeout=1800)) as c:
        for start in range(0, n, CHUNK):
            items = []
            for i in range(start, min(n, start + CHUNK)):
                words = " ".join(rng.choice(WORDS) for _ in range(14))
                items.append({"domain": domain_of(i, n, domains), "category": CATEGORIES[i % len(CATEGORIES)], "title": f"Memory {i}: {words[:40]}",
                              "content": f"Memory {i}. {words}.", "dedup": False})
            created += sum(r["decision"] == "created" for r in c.call("memory.add_many", {"items": items}))
            if start and start % (CHUNK * 40) == 0:
                log(f"loaded {created:,} in {time.perf_counter() - started:.0f} s")
    seconds = time.perf_counter() - started
    log(f"loaded {created:,} memories in {seconds:.0f} s")
    return {"created": created, "seconds": round(seconds, 1), "per_s": round(created / seconds, 1)}


async def measure(sock: str, repeat: int, domain: str) -> dict[str, Any]:
    import httpx

    from eurekamem.client import AsyncClient
    from eurekamem.ui import Guard, graph_svg, make_app
    from eurekamem.ui import app as ui_app
    from eurekamem.ui.app import CATEGORIES as UI_CATEGORIES

    PAGE = ui_app.PAGE
    SECTION = getattr(ui_app, "SECTION", 10)  # a build from before the by-category page has none

    guard = Guard(port=8123)
    base = "http://127.0.0.1:8123"
    results: dict[str, Any] = {}
    async with AsyncClient(sock, timeout=600) as daemon_client:
        app = make_app(daemon_client, guard, by="bench")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base) as web:
            assert (await web.get(guard.url().removeprefix(base))).status_code == 200
            one = (await daemon_client.call("memory.list", {"domain": domain, "limit": 1}))["memories"][0]["id"]
            deep = (await daemon_client.call("memory.list", {"domain": domain, "limit": 1}))["total"] // PAGE // 2 + 1

            stats: Step = [("sys.stats", None)]
            await load_graph(daemon_client)
            if "memory.domains" in (await daemon_client.call("sys.hello"))["methods"]:
                counts: Step = [("memory.domains", {"domain": domain})]
                every_domain: Step = [("memory.domains", None)]
            else:  # a build from before memory.domains: a count per category, the newest 1,000 for the home page
                counts = [("memory.list", {"domain": domain, "category": c, "status": "active", "limit": 1}) for c in UI_CATEGORIES]
                every_domain = [("memory.list", {"limit": 1000, "status": "any"})]

            # each page, and the daemon calls it makes (the anchor: the same calls, without the UI)
            if "memory.strength" in (await daemon_client.call("sys.hello"))["methods"]:
                # by category, each strongest first (MEMORY.md's layout), and the shown memories' strength in words
                found = (await daemon_client.call("memory.domains", {"domain": domain}))["domains"][0]["categories"]
                held = [c for c in UI_CATEGORIES if found.get(c, {}).get("active")]
                sections: Step = [("memory.list", {"domain": domain, "category": c, "status": "active", "limit": SECTION, "offset": 0,
                                                   "order": "strongest"}) for c in held]
                deep = found["pitfalls"]["active"] // PAGE // 2 + 1

                def category_page(page: int) -> Step:
                    return [("memory.list", {"domain": domain, "category": "pitfalls", "status": "active", "limit": PAGE,
                                             "offset": (page - 1) * PAGE, "order": "strongest"})]

                async def shown(step: Step) -> Step:
                    answers = await daemon_client.call_many(step)
                    return [("memory.strength", {"ids": [m["id"] for a in answers for m in a["memories"]]})]

                every_section, first_page, middle_page = await shown(sections), await shown(category_page(1)), await shown(category_page(deep))
                pages: list[tuple[str, str, Callable[[], Awaitable[Any]]]] = [
                    ("domain page (by category)", f"/domain?name={domain}", lambda: calls(daemon_client, stats, counts, sections, every_section)),
                    ("one category, page 1", f"/domain?name={domain}&category=pitfalls", lambda: calls(
                        daemon_client, stats, counts, category_page(1), first_page)),
                    (f"one category, page {deep} (the middle)", f"/domain?name={domain}&category=pitfalls&page={deep}", lambda: calls(
                        daemon_client, stats, counts, category_page(deep), middle_page)),
                    ("a memory", f"/memory/{one}", lambda: calls(daemon_client, stats, [("memory.get", {"id": one})], [("memory.history", {"id": one})],
                                                                 [("memory.strength", {"ids": [one]})])),
                ]
            else:  # a build from before memory.strength: newest first, no strength
                pages = [
                    ("domain page 1", f"/domain?name={domain}", lambda: calls(daemon_client, stats, counts, [("memory.list", {"domain": domain, "limit": PAGE})])),
                    (f"domain page {deep} (the middle)", f"/domain?name={domain}&page={deep}", lambda: calls(daemon_client, stats, counts,
                                        [("memory.list", {"domain": domain, "limit": PAGE, "offset": (deep - 1) * PAGE})])),
                    ("domain page 1, one category", f"/domain?name={domain}&category=pitfalls", lambda: calls(daemon_client, stats, counts,
                                        [("memory.list", {"domain": domain, "category": "pitfalls", "limit": PAGE})])),
                    ("a memory", f"/memory/{one}", lambda: calls(daemon_client, stats, [("memory.get", {"id": one})], [("memory.history", {"id": one})])),
                ]
            pages += [
                ("domains (home)", "/", lambda: calls(daemon_client, stats, [("conversation.groups", None)], every_domain)),
                ("search (lexical)", "/search?q=martingale+peeling&mode=lexical", lambda: calls(daemon_client, stats, [("memory.search", {"query": "martingale peeling", "k": 20, "mode": "lexical"})],
                                    [("conversation.groups", None)])),
                ("graph: 300 of 1,000 theorems (drawn before)", "/graph", lambda: calls(
                    daemon_client, stats, [("graph.export", {"format": "node_link"})], [("graph.stats", None)])),
            ]
            export = (await daemon_client.call("graph.export", {"format": "node_link"}))["data"]
            layouts = []
            for _ in range(5):  # the first view of a picture: laid out (in a worker thread, on the page)
                t0 = time.perf_counter()
                part = graph_svg.select(graph_svg.build(export))
                graph_svg.svg(part.graph if isinstance(part, tuple) else part)  # before the cap's report: the graph itself
                layouts.append(time.perf_counter() - t0)
            results["graph layout"] = {"first_view": summarize_s(layouts), "nodes": graph_svg.MAX_NODES}
            log(f"graph: a first view's layout of {graph_svg.MAX_NODES} theorems p50 {results['graph layout']['first_view']['p50_ms']} ms")
            for name, path, anchor in pages:
                page_times, anchor_times = [], []
                for _ in range(3):  # warm: caches, the first render of each template
                    assert (await web.get(path)).status_code == 200
                    await anchor()
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    answer = await web.get(path)
                    t1 = time.perf_counter()
                    await anchor()
                    t2 = time.perf_counter()
                    assert answer.status_code == 200, (path, answer.text[-300:])
                    page_times.append(t1 - t0)
                    anchor_times.append(t2 - t1)
                results[name] = {"path": path, "page": summarize_s(page_times), "daemon_calls": summarize_s(anchor_times),
                                 "bytes": len(answer.content)}
                log(f"{name}: page p50 {results[name]['page']['p50_ms']} ms, its daemon calls alone "
                    f"{results[name]['daemon_calls']['p50_ms']} ms")
    return results


Step = list[tuple[str, dict[str, Any] | None]]

GRAPH = 1000  # theorems in the graph page's graph (the picture draws 300 of them)


async def load_graph(client: Any) -> None:
    """GRAPH theorems in ten domains, each using two earlier ones (seeded), unless already there."""
    if (await client.call("graph.stats"))["nodes"] >= GRAPH:
        return
    rng = random.Random(SEED)
    adds: Step = [("graph.add_theorem", {"theorem_name": f"Lemma {i}", "formal_statement": f"statement {i}", "domain": f"area {i % 10}"})
                  for i in range(GRAPH)]
    ids = [node["node_id"] for start in range(0, GRAPH, 500) for node in await client.call_many(adds[start : start + 500])]
    links: Step = [("graph.link", {"from_id": ids[i], "to_id": ids[rng.randrange(i)], "relation": rng.choice(["uses", "generalizes"])})
                   for i in range(1, GRAPH) for _ in range(2)]
    for start in range(0, len(links), 500):  # under the connection's 1,024 calls in flight
        for answer in await client.call_many(links[start : start + 500]):
            if isinstance(answer, Exception):
                raise answer


async def calls(client: Any, *steps: Step) -> None:
    """The page's daemon calls as it makes them: step after step, the calls of a step pipelined."""
    for step in steps:
        if len(step) == 1:
            await client.call(*step[0])
            continue
        for answer in await client.call_many(step):
            if isinstance(answer, Exception):
                raise answer


def report(n: int, domains: int, loaded: dict[str, Any], results: dict[str, Any]) -> str:
    rows = []
    for name, r in results.items():
        if "page" not in r:
            continue
        page, anchor = r["page"], r["daemon_calls"]
        rows.append([name, f"{page['p50_ms']:.1f}", f"{page['p99_ms']:.1f}", f"{anchor['p50_ms']:.1f}",
                     f"{page['p50_ms'] / anchor['p50_ms']:.2f}x" if anchor["p50_ms"] else "–",
                     f"{page['p50_ms'] - anchor['p50_ms']:.1f}", "✓" if page["p99_ms"] < TARGET_MS else "✗",
                     f"{r['bytes']:,}"])
    lines = [
        f"# eurekamem ui at {n:,} memories " + ("in one domain" if domains == 1 else
                                                f"in {domains} domains of {n // domains:,} (the pages of one)"), "",
        f"Loaded through memory.add_many ({loaded['per_s']:,.0f} memories/s, a stub embedder). Each page's "
        "server-side time (request to last byte, through the app in-process) next to its anchor, the same "
        "daemon calls alone, made as the page makes them (a step's calls pipelined); the UI's own share is the difference. Target: p99 < "
        f"{TARGET_MS:.0f} ms.", "",
        *table(["page", "p50 ms", "p99 ms", "its daemon calls p50 ms", "page / calls", "UI's own ms", "< 100 ms", "bytes"], rows),
        "",
    ]
    if "graph layout" in results:
        first = results["graph layout"]["first_view"]
        lines += [f"The graph page's first view of a picture lays out its {results['graph layout']['nodes']} theorems: "
                  f"p50 {first['p50_ms']:.0f} ms, p99 {first['p99_ms']:.0f} ms (networkx's spring layout, in a worker "
                  "thread; the page keeps the last 16 pictures, so a picture seen again costs what the table says).", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="memories to load (default 100,000)")
    parser.add_argument("--domains", type=int, default=1, help="spread the memories over this many domains (default 1: the worst case)")
    parser.add_argument("--repeat", type=int, default=30, help="timed requests per page (default 30)")
    parser.add_argument("--out", default=str(_common.HERE / "results"), help="folder of the report")
    parser.add_argument("--data", help="keep the data root here; reuse it when it is already loaded")
    args = parser.parse_args()
    import trio

    tmp = Path(tempfile.mkdtemp(prefix="em-bui-", dir="/tmp"))
    data = Path(args.data) if args.data else tmp / "data"
    marker = data / "bench-ui-loaded.json"  # what was loaded: --n and --domains must match
    try:
        with embeddings_server() as url:
            daemon = Daemon("daemon", data, str(tmp / "s.sock"), embedder="openai:stub",
                            extra=["--embed-url", url, "--embed-dim", str(DIM)]).start()
            try:
                if marker.exists():
                    loaded = json.loads(marker.read_text())
                    if (loaded["n"], loaded["domains"]) != (args.n, args.domains):
                        raise SystemExit(f"{data} holds --n {loaded['n']} --domains {loaded['domains']}")
                    log(f"reusing {data}: {loaded['created']:,} memories")
                else:
                    loaded = {"n": args.n, "domains": args.domains, **load(daemon.sock, args.n, args.domains)}
                    if args.data:
                        with contextlib.closing(_common.client(daemon.sock, timeout=600)) as c:
                            c.call("sys.snapshot")  # the next run starts from the snapshot, not 100,000 journal records
                        marker.write_text(json.dumps(loaded))
                results = trio.run(measure, daemon.sock, args.repeat, domain_of(0, args.n, args.domains))
            finally:
                daemon.stop()
        text = report(args.n, args.domains, loaded, results)
        print(text)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        md, _ = write_report(Path(args.out), f"ui-{stamp}", text,
                             {"n": args.n, "domains": args.domains, "load": loaded, "pages": results, "machine": machine(("trio", "starlette", "jinja2"))})
        log(f"wrote {md}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
