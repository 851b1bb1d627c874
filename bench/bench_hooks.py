#!/usr/bin/env python3
"""The Claude Code hook as Claude Code runs it: one whole process per UserPromptSubmit, timed from
spawn to exit, against a running daemon, with its anchors in the same run.

    .venv/bin/python bench/bench_hooks.py [--runs 60] [--embedder e5-small] [--memories 200] [--out bench/results]

Variants, run in interleaved rounds (each round runs every variant once, in a shuffled order, so
that the machine's load falls on all of them alike):

- `python -c pass`: the interpreter alone (the floor of any Python hook);
- `eurekamem call sys.ping`: the CLI's fastest round trip (imports, parser, connect, one call);
- `hook (hit)`: `python -m eurekamem.integrations.claude_code` (the command `eurekamem hooks install`
  writes) with a UserPromptSubmit payload whose prompt finds memories: memory.inject with a query,
  the context printed;
- `hook (miss)`: the same with a prompt below the score floor (nothing printed);
- `eurekamem hook (hit)`: the same event through the CLI's parser (`eurekamem hook`).

Reported: p50 / p95 / max per variant in milliseconds, and each hook's p50 and p95 as ratios to the
anchors; the daemon's own memory.inject time (its histogram in sys.stats) so the rest is the
process; the hook process's largest imports (`-X importtime`, one run). The target of issue 28 is
p95 ≤ 150 ms on an idle machine; the load average at start and end says how idle this one was.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import PY, Daemon, log, pct  # noqa: E402

TOPICS = [
    ("Tests run with pytest", "The project's tests run with pytest and its fixtures; unittest classes are not used."),
    ("Deploys go to Fly.io", "Production deploys go to Fly.io from the main branch, on Fridays."),
    ("Lint with ruff", "ruff checks and formats the code; the line length is 120."),
    ("Migrations with alembic", "Database migrations are alembic revisions, one per pull request."),
]
HIT = "How do we run the tests here, pytest or unittest?"
MISS = "zebra marmalade quantum harp"


def seed_memories(sock: str, domain: str, n: int, rng: random.Random) -> None:
    from eurekamem.client import Client

    with Client(sock, timeout=600) as c:
        items = []
        for i in range(n):
            title, content = TOPICS[i % len(TOPICS)]
            noise = " ".join(rng.choice(["cache", "queue", "retry", "schema", "index", "token", "worker"]) for _ in range(6))
            items.append({"domain": domain, "category": "fact", "title": f"{title} ({i})",
                          "content": f"{content} Note {i}: {noise}.", "confidence": 0.9, "dedup": False})
        for start in range(0, len(items), 50):
            c.call("memory.add_many", {"items": items[start : start + 50]})


def timed(argv: list[str], stdin: str, env: dict[str, str], cwd: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    out = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, cwd=cwd, timeout=60)
    return time.perf_counter() - started, out


def importtime(argv: list[str], stdin: str, env: dict[str, str], cwd: str, top: int = 10) -> list[tuple[str, float]]:
    out = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], input=stdin, capture_output=True, text=True,
                         env=env, cwd=cwd, timeout=60)
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = [p.strip() for p in line[len("import time:"):].split("|")]
        if parts[1].isdigit():
            rows.append((parts[2].strip(), int(parts[1]) / 1000))
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=60, help="rounds (each runs every variant once)")
    ap.add_argument("--embedder", default="e5-small", help="the daemon's embedder (default: e5-small, the default)")
    ap.add_argument("--memories", type=int, default=200, help="memories in the project's domain")
    ap.add_argument("--out", default=str(_common.HERE / "results"))
    args = ap.parse_args()
    _common.set_log_prefix("hooks")
    rng = random.Random(_common.SEED)
    tmp = Path(tempfile.mkdtemp(prefix="em-bench-hooks-", dir="/tmp"))
    project = tmp / "shop-api"
    (project / ".git").mkdir(parents=True)
    sock = str(tmp / "d.sock")
    daemon = Daemon("daemon", tmp / "root", sock, embedder=args.embedder).start(300)
    bin_dir = Path(PY).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EUREKAMEM_", "EUREKACLAW_", "XDG_"))}
    env.update(HOME=str(tmp), EUREKAMEM_SOCKET=sock, EUREKACLAW_DIR=str(tmp / "root"))
    try:
        machine_start = _common.machine()
        log(f"seeding {args.memories} memories")
        seed_memories(sock, "shop-api", args.memories, rng)

        def payload(prompt: str) -> str:
            return json.dumps({"session_id": "bench-session", "transcript_path": str(tmp / "t.jsonl"), "cwd": str(project),
                               "permission_mode": "default", "hook_event_name": "UserPromptSubmit", "prompt": prompt})

        hook = [PY, "-m", "eurekamem.integrations.claude_code"]
        variants: dict[str, tuple[list[str], str]] = {
            "python -c pass": ([PY, "-c", "pass"], ""),
            "eurekamem call sys.ping": ([str(bin_dir / "eurekamem"), "call", "sys.ping"], ""),
            "hook (hit)": (hook, payload(HIT)),
            "hook (miss)": (hook, payload(MISS)),
            "eurekamem hook (hit)": ([str(bin_dir / "eurekamem"), "hook"], payload(HIT)),
        }
        for name, (argv, stdin) in variants.items():  # check each once, and warm the caches
            _, out = timed(argv, stdin, env, str(project))
            if out.returncode != 0 or out.stderr:
                raise SystemExit(f"{name} failed: {out.stderr}")
            if name.endswith("(hit)") and "additionalContext" not in out.stdout:
                raise SystemExit(f"{name} injected nothing: {out.stdout!r}")
            if name.endswith("(miss)") and out.stdout:
                raise SystemExit(f"{name} injected something: {out.stdout!r}")
        samples: dict[str, list[float]] = {name: [] for name in variants}
        log(f"{args.runs} rounds of {len(variants)} variants")
        for _ in range(args.runs):
            order = list(variants)
            rng.shuffle(order)
            for name in order:
                took, out = timed(*variants[name], env, str(project))
                assert out.returncode == 0, out.stderr
                samples[name].append(took)
        with _common.client(sock, timeout=30) as c:
            stats = c.call("sys.stats")
        inject = _common.method_stats(stats, "memory.inject")
        imports = importtime(hook, payload(HIT), env, str(project))
        machine_end = _common.machine()
    finally:
        daemon.stop()
    table: dict[str, dict[str, float]] = {}
    for name, values in samples.items():
        v = sorted(values)
        table[name] = {"n": len(v), "p50_ms": round(pct(v, 0.5) * 1000, 1), "p95_ms": round(pct(v, 0.95) * 1000, 1),
                       "max_ms": round(v[-1] * 1000, 1)}
    bare, ping = table["python -c pass"], table["eurekamem call sys.ping"]
    lines = [
        f"# UserPromptSubmit hook as a process ({time.strftime('%Y-%m-%d %H:%M')})", "",
        f"{args.runs} interleaved rounds; daemon embedder {args.embedder}; {args.memories} memories in the project's domain; "
        f"load average {machine_start['loadavg']} at start, {machine_end['loadavg']} at end; {machine_start['nproc']} cores, "
        f"{machine_start['cpu']}; commit {machine_start['commit']}.", "",
        "| variant | p50 | p95 | max | p50 / bare python | p95 / bare python | p50 / call sys.ping | p95 / call sys.ping |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in table.items():
        lines.append(
            f"| {name} | {row['p50_ms']} ms | {row['p95_ms']} ms | {row['max_ms']} ms | "
            f"{_common.ratio(row['p50_ms'], bare['p50_ms'])} | {_common.ratio(row['p95_ms'], bare['p95_ms'])} | "
            f"{_common.ratio(row['p50_ms'], ping['p50_ms'])} | {_common.ratio(row['p95_ms'], ping['p95_ms'])} |")
    lines += ["", f"The daemon's own memory.inject (all calls of the run, its histogram): {json.dumps(inject)}", "",
              "The hook process's largest imports (cumulative, one run, -X importtime):", ""]
    lines += [f"- {name}: {ms:.1f} ms" for name, ms in imports]
    text = "\n".join(lines) + "\n"
    stem = "hooks-" + time.strftime("%Y%m%d-%H%M%S")
    md, _ = _common.write_report(Path(args.out), stem, text, {
        "variants": table, "samples_s": samples, "daemon_inject": inject, "imports_ms": imports,
        "machine_start": machine_start, "machine_end": machine_end, "args": vars(args)})
    print(text)
    log(f"wrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
