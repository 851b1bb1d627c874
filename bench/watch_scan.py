"""Watching memories/: what a scan of the tree costs, against an inotify watcher (watchfiles).

Builds a data root with N memory files (EurekaClaw's format, ~450 bytes each) in D domain folders
and measures:

- a full scan (daemon/memory/watch.py's scan_tree without a previous tree: os.scandir + stat of
  every file) and the comparison with what the previous scan knew, at N files: median and p90 of R;
- a partial scan (scan_tree with the previous tree: a stat of each folder, and of the files changed
  in the last HOT_SECONDS), the daemon's scan every watch_interval, in the steady state (every file
  and folder older than that) and right after every file was written (all hot);
- the share of one core that partial scans every `--interval` and full scans every
  max(`--full-interval`, FULL_SCAN_FACTOR x a full scan's time) take;
- the first scan after a start, which also reads and hashes every file (read_files + digest);
- the time from writing a new file to a scan that finds it (a scan every `--interval` seconds: at
  most the interval plus one scan; on average half the interval);
- with `--watchfiles` (and the watchfiles package importable): watchfiles.awatch under trio (it is
  anyio-based), the time from writing a file to the event, over R files, and the set-up time.

Run: .venv/bin/python bench/watch_scan.py --files 10000 [--watchfiles]
(the watchfiles figures need the watchfiles package importable, e.g. `pip install --target /tmp/wf watchfiles`
and PYTHONPATH=/tmp/wf: it is not a dependency).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from eurekamem.daemon.memory.watch import FULL_SCAN_FACTOR, scan_tree
from eurekamem.daemon.storage.watched import digest, read_files

BODY = (
    "---\ncategory: proof_strategy\ntitle: Insight {i}\ndomain: domain {d}\nconfidence: 0.85\n"
    "created_at: 2026-12-01T09:00:00.123456\n---\n\n# Insight {i}\n\n"
    "Peel the time axis into geometric epochs and union-bound over them to make a fixed-horizon bound anytime. "
    "This costs a log log factor, which the finer peeling of the later epochs can remove ({i}).\n"
)


def build(root: Path, files: int, domains: int) -> None:
    for d in range(domains):
        (root / "memories" / f"domain_{d}" / "_archive").mkdir(parents=True, exist_ok=True)
    for i in range(files):
        d = i % domains
        (root / "memories" / f"domain_{d}" / f"20261201_insight_{i}.md").write_text(BODY.format(i=i, d=d))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def age(root: Path, seconds: float) -> None:
    """Every file and folder under memories/ last changed `seconds` ago (the steady state)."""
    then = time.time() - seconds
    for path in sorted((root / "memories").rglob("*"), reverse=True):
        os.utime(path, (then, then))


def scans(root: Path, repeat: int, partial: bool) -> list[float]:
    tree = scan_tree(root)
    known = tree.flat()
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        tree = scan_tree(root, tree if partial else None)
        if tree.full:  # as MemoryFiles._scan compares
            seen = tree.flat()
            changed = [f for f, sig in seen.items() if known.get(f) != sig]
            gone = [f for f in known if f not in seen]
        else:
            changed = [f for f in tree.looked if known.get(f) != tree.sig(f)]
            gone = [f for f in tree.vanished if f in known]
        out.append(time.perf_counter() - started)
        assert not changed and not gone
    return sorted(out)


def first_scan(root: Path) -> float:
    started = time.perf_counter()
    seen = scan_tree(root).flat()
    for read in read_files(root, list(seen)):
        assert read.data is not None
        digest(read.data)
    return time.perf_counter() - started


def watchfiles_latency(root: Path, repeat: int) -> tuple[float, list[float]]:
    import trio
    import watchfiles

    latencies: list[float] = []

    async def main() -> float:
        setup = 0.0
        async with trio.open_nursery() as nursery:
            ready = trio.Event()
            got = [trio.Event()]  # the current file's event (replaced for each file)
            seen_at: list[float] = []

            async def watch() -> None:
                started = time.perf_counter()
                # debounce 0 and a 10 ms step: the earliest it can report (the defaults batch for 1.6 s)
                async for _changes in watchfiles.awatch(root / "memories", debounce=0, step=10, yield_on_timeout=True,
                                                        rust_timeout=50):
                    if not ready.is_set():
                        nonlocal setup
                        setup = time.perf_counter() - started
                        ready.set()
                        continue
                    if _changes:
                        seen_at.append(time.perf_counter())
                        got[0].set()

            nursery.start_soon(watch)
            await ready.wait()
            for i in range(repeat):
                got[0] = trio.Event()
                path = root / "memories" / "domain_0" / f"20261202_new_{i}.md"
                written = time.perf_counter()
                path.write_text(BODY.format(i=i, d=0))
                with trio.fail_after(10):
                    await got[0].wait()
                latencies.append(seen_at[-1] - written)
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        return setup

    setup = trio.run(main)
    return setup, latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--domains", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--interval", type=float, default=2.0, help="watch_interval: the partial scans'")
    parser.add_argument("--full-interval", type=float, default=30.0, help="watch_full_interval: the full scans'")
    parser.add_argument("--watchfiles", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        build(root, args.files, args.domains)
        print(f"built {args.files} files in {args.domains} folders in {time.perf_counter() - started:.1f} s (cpus: {os.cpu_count()})")
        hot = scans(root, args.repeat, partial=True)
        age(root, 86400)
        full = scans(root, args.repeat, partial=False)
        partial = scans(root, args.repeat, partial=True)

        def line(name: str, times: list[float]) -> float:
            median, p90 = statistics.median(times), times[int(len(times) * 0.9) - 1]
            print(f"{name} ({args.files} files): median {ms(median)}, p90 {ms(p90)} over {args.repeat}")
            return median

        full_median = line("full scan", full)
        partial_median = line("partial scan, steady state", partial)
        line("partial scan, every file written in the last 10 minutes", hot)
        full_every = max(args.full_interval, FULL_SCAN_FACTOR * full_median)
        print(f"  partial every {args.interval:g} s + full every {full_every:.0f} s: "
              f"{(partial_median / args.interval + full_median / full_every) * 100:.2f} % of one core "
              f"(a full scan every {args.interval:g} s: {full_median / args.interval * 100:.2f} %)")
        print(f"  pick-up time of a new file: at most {args.interval:g} s + one scan, on average {args.interval / 2:g} s")
        print(f"first scan after a start (stat, read and hash every file): {ms(first_scan(root))}")
        if args.watchfiles:
            setup, latencies = watchfiles_latency(root, args.repeat)
            latencies.sort()
            print(f"watchfiles: set-up {ms(setup)}; write -> event median {ms(statistics.median(latencies))}, "
                  f"max {ms(latencies[-1])} over {len(latencies)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
