"""The walk-through: every shell, Python and JSON example of README.md and protocol/PROTOCOL.md, run
in order against a real daemon on a fresh data root, as a new user would run them.

The user: $EUREKACLAW_DIR names a fresh data root, $XDG_RUNTIME_DIR is unset (so the socket is
<data root>/run/eurekamem.sock), HOME is a fresh folder (no config file), the working directory is
a fresh folder, and `eurekamem` is this environment's command on PATH. One daemon per document,
with the default embedder, started as `eurekamem serve` would be.

Each block is a test of its own, run in the document's order. A block passes when it exits 0,
prints no traceback, and every JSON-RPC answer it prints is a result, unless the block documents an
error answer itself (an `"error"` in its text). A block is skipped when an HTML comment right before
it says `<!-- docs-check: skip (reason) -->`; `<!-- docs-check: stopped -->` runs it with the daemon
stopped (and starts it again after). Blocks that call socat are skipped, saying so, when socat is
not installed (.ci/run installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from daemon_process import DaemonProcess

REPO = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "protocol/PROTOCOL.md")
BLOCK_TIMEOUT = 300  # seconds: the first tier-4 call may wait for the model to load
FENCE = re.compile(r"^```(\w*)\s*$")
DIRECTIVE = re.compile(r"<!--\s*docs-check:\s*(skip|stopped)\s*(?:\((.*)\))?\s*-->")


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    text: str
    directive: str | None
    reason: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}:{self.lang}"


def blocks(doc: str) -> list[Block]:
    lines = (REPO / doc).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, lang = i, match.group(1)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        before = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        directive = DIRECTIVE.search(before)
        out.append(Block(doc, start + 1, lang, "\n".join(lines[start + 1 : j]) + "\n",
                         directive.group(1) if directive else None, (directive.group(2) or "") if directive else ""))
        i = j + 1
    return out


# a block without a language is an illustration (the framings' byte layouts), not a command
ALL = [block for doc in DOCS for block in blocks(doc) if block.lang]


class Walk:
    """One document's user: a data root, a home, a working folder, and the daemon."""

    def __init__(self, doc: str) -> None:
        self.doc = doc
        self.base = Path(tempfile.mkdtemp(prefix="em-docs-", dir="/tmp"))  # short: the socket is under it
        self.root = self.base / "root"
        for name in ("home", "work"):
            (self.base / name).mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "EUREKAMEM_", "EUREKACLAW_"))}
        self.env.update(
            HOME=str(self.base / "home"), EUREKACLAW_DIR=str(self.root), EUREKAMEM_NO_AUTOSTART="1",
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1",
        )
        # the data root and socket a user's `eurekamem serve` picks here, given explicitly
        self.daemon = DaemonProcess(self.root, self.root / "run" / "eurekamem.sock", env=self.env)

    def start(self) -> None:
        self.daemon.start()

    def close(self) -> None:
        self.daemon.terminate()
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def walks() -> Iterator[dict[str, Walk]]:
    opened: dict[str, Walk] = {}
    yield opened
    for walk in opened.values():
        walk.close()


def _walk(walks: dict[str, Walk], doc: str) -> Walk:
    if doc not in walks:
        for other in list(walks):  # one daemon at a time: the previous document's is done
            walks.pop(other).close()
        walks[doc] = Walk(doc)
        walks[doc].start()
    return walks[doc]


def _run(walk: Walk, block: Block) -> subprocess.CompletedProcess[str]:
    if block.lang in ("sh", "bash", "shell"):
        argv = ["bash", "-euo", "pipefail", "-c", block.text]
    else:
        argv = [sys.executable, "-c", block.text]
    return subprocess.run(argv, cwd=walk.base / "work", env=walk.env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)


def _answers(stdout: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for line in stdout.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and item.get("jsonrpc") == "2.0":
                out.append(item)
    return out


def test_every_block_is_known() -> None:
    """Each document has examples, every block's language is one the walk-through runs, and skips are few."""
    for doc in DOCS:
        assert any(b.doc == doc and b.lang in ("sh", "python") for b in ALL), doc
    assert {b.lang for b in ALL} <= {"sh", "python", "json"}, {b.lang for b in ALL}
    skipped = [b for b in ALL if b.directive == "skip"]
    assert all(b.reason for b in skipped)  # every skip says why
    assert len(skipped) <= len(ALL) // 3, [b.id for b in skipped]


@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_example(block: Block, walks: dict[str, Walk]) -> None:
    if block.directive == "skip":
        pytest.skip(f"marked in {block.doc}: {block.reason}")
    if block.lang == "json":
        json.loads(block.text)  # a configuration snippet: it must at least be JSON
        return
    if "socat" in block.text and shutil.which("socat") is None:
        pytest.skip("socat is not installed (apt-get install socat; .ci/run installs it)")
    walk = _walk(walks, block.doc)
    if block.directive == "stopped":
        walk.daemon.terminate()
        try:
            done = _run(walk, block)
        finally:
            walk.start()
    else:
        done = _run(walk, block)
    report = f"{block.id} exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    assert done.returncode == 0, report
    assert "Traceback" not in done.stderr, report
    errors = [a for a in _answers(done.stdout) if "error" in a]
    if '"error"' not in block.text:  # a block that shows an error answer documents it
        assert not errors, report
    logged_errors = [line for line in walk.daemon.log if '"level": "error"' in line]
    assert not logged_errors, logged_errors
