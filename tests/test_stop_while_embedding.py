"""Stopping the daemon while it embeds imported memories in the background: prompt and quiet, and
the embedding goes on after the restart with what was left (issue: a stop took 13 s and logged a
trio.ClosedResourceError traceback)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from daemon_process import DaemonProcess
from eurekamem.client import Client

# e5-small (the default model, ~0.1 s a memory on one core): all 60 were one batch of some seconds
# before, which a stop waited for; now a batch takes about a second and a stop abandons it
MEMORIES = 60
MODEL = "e5-small"
STOP_LIMIT = 5.0  # seconds from SIGTERM to exit: the final snapshot and the interpreter's exit (~1.5 s idle)


def eurekaclaw_root(root: Path, n: int) -> None:
    """A plain EurekaClaw data root: n memory files in three domains, no vectors."""
    words = "bound regret bandit epoch peeling union variance martingale concentration lemma estimator".split()
    for i in range(n):
        folder = root / "memories" / f"domain_{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        text = " ".join(words[(i * 7 + j) % len(words)] for j in range(30))
        (folder / f"20260101_note_{i}.md").write_text(
            f"---\ncategory: domain_knowledge\ntitle: Note {i}\ndomain: domain_{i % 3}\nconfidence: 0.8\n"
            f"created_at: 2026-01-01T00:00:00\n---\n\n# Note {i}\n\n{text} (note {i}).\n"
        )


def test_a_stop_during_background_embedding_is_prompt_and_quiet_and_resumes(data_dir: Path, sock_dir: Path) -> None:
    eurekaclaw_root(data_dir, MEMORIES)
    sock = sock_dir / "s.sock"
    daemon = DaemonProcess(data_dir, sock, "--embedder", MODEL, "--log-format", "text").start()
    try:
        started = daemon.wait_for_line(f"in the background with {MODEL}")
        assert f"embedding {MEMORIES} memories" in started
        assert f"imported from EurekaClaw's files: {MEMORIES} memories" in daemon.output
        assert daemon.proc is not None
        began = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        code = daemon.wait_exit()
        took = time.monotonic() - began
    finally:
        daemon.kill()
    assert code == 0, daemon.output
    assert took < STOP_LIMIT, f"stopping took {took:.1f} s"
    for bad in ("Traceback", "ClosedResourceError", " ERROR ", "failed"):
        assert bad not in daemon.output, daemon.output
    assert "stopped after" in daemon.output.splitlines()[-1]

    again = DaemonProcess(data_dir, sock, "--embedder", MODEL, "--log-format", "text").start()
    try:
        resumed = again.wait_for_line(f"in the background with {MODEL}")
        left = int(resumed.split("embedding ", 1)[1].split()[0])
        assert 0 < left <= MEMORIES
        done = again.wait_for_line("background embedding done", timeout=300)
        assert f"done: {left:,} memories with {MODEL}" in done
        with Client(str(sock), timeout=30) as client:
            stats = client.stats()
        assert stats["tiers"]["memory"]["unembedded"] == 0 and stats["tiers"]["memory"]["vectors"] == MEMORIES
        embedding = stats["memory"]["embedding"]
        assert embedding["running"] is False and embedding["embedded_since_start"] == left, json.dumps(embedding)
    finally:
        again.terminate()
