"""The walk-through: every shell, Python and JSON example of README.md and protocol/PROTOCOL.md, run
in order against a real daemon on a fresh data root, as a new user would run them.

The user: $EUREKACLAW_DIR names a fresh data root, $XDG_RUNTIME_DIR is unset (so the socket is
<data root>/run/eurekamem.sock), HOME is a fresh folder (no config file), the working directory is
a fresh folder, and `eurekamem` is this environment's command on PATH. One daemon per document,
with the default embedder, started as `eurekamem serve` would be.

Each block is a test of its own, run in the document's order. A block passes when it exits 0,
prints no traceback, every JSON-RPC answer it prints is a result, unless the block documents an
error answer itself (an `"error"` in its text), and it prints what it shows it prints.

Shown outputs: a comment `# → TEXT` (after a statement, or on a line of its own after a command)
says that the block prints a line TEXT. A block's `# →` lines must match lines of its output in
their order (lines without a marker in between are not checked; a block without markers is
checked as above only). In TEXT, `…` stands for any text; a number with a decimal point matches
any number within 0.01 of it (DECIMAL_TOLERANCE: scores and cosines of the same model differ by
less between machines), any other number only itself; memory ids (a UUID, or its first hex
digits followed by `…`) and times (RFC 3339, and the YYYYMMDD_ of a memory's file name) match any
id and any time. A block is skipped when an HTML comment right before
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
SHOWN = re.compile(r"#\s*→\s?(.*)$")  # a shown output: `# → TEXT`
DECIMAL_TOLERANCE = 0.01
# ids and times, masked alike in what a document shows and in what the block printed
MASKS = (
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "\x00id\x00"),
    (re.compile(r"\b[0-9a-f]{4,}(?:-[0-9a-f]+)*-?…"), "\x00id\x00"),  # a shown id's first digits
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?"), "\x00time\x00"),
    (re.compile(r"(?<![0-9])20\d{6}_"), "\x00date\x00_"),  # a memory file's date
)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


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

    @property
    def shown(self) -> list[str]:
        """The outputs the block shows (`# → TEXT`), in order."""
        return [match.group(1).rstrip() for line in self.text.splitlines() if (match := SHOWN.search(line))]


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


def _masked(text: str) -> str:
    for pattern, mask in MASKS:
        text = pattern.sub(mask, text)
    return text


def _pattern(shown: str) -> tuple[re.Pattern[str], list[str]]:
    """A shown line as a regex over a printed line, and the numbers it shows (each a group)."""
    parts, numbers = [], []
    for piece in re.split(r"(…|\x00\w+\x00)", _masked(shown)):
        if piece == "…":
            parts.append(".*?")
        elif piece.startswith("\x00"):
            parts.append(re.escape(piece))
        else:
            at = 0
            for match in NUMBER.finditer(piece):
                parts.append(re.escape(piece[at : match.start()]) + f"({NUMBER.pattern})")
                numbers.append(match.group())
                at = match.end()
            parts.append(re.escape(piece[at:]))
    return re.compile("".join(parts)), numbers


def _matches(shown: str, printed: str) -> bool:
    pattern, numbers = _pattern(shown)
    found = pattern.fullmatch(_masked(printed.strip()))
    if found is None:
        return False
    for want, got in zip(numbers, found.groups()):
        if "." in want or "e" in want.lower():
            if abs(float(got) - float(want)) > DECIMAL_TOLERANCE:
                return False
        elif got != want:
            return False
    return True


def unmatched(shown: list[str], stdout: str) -> list[str]:
    """The shown lines that the output does not hold in their order (each matched by the first
    printed line after the previous match); [] when all are there."""
    printed = stdout.splitlines()
    at = 0
    for i, line in enumerate(shown):
        while at < len(printed) and not _matches(line, printed[at]):
            at += 1
        if at == len(printed):
            return shown[i:]
        at += 1
    return []


def test_shown_outputs_are_compared_as_documented() -> None:
    """The comparison itself: wildcards, numbers within the tolerance, ids and times masked, order."""
    assert unmatched(["0.559 Peeling for anytime bounds 0.857"], "0.5586 Peeling for anytime bounds 0.85702\n") == []
    assert unmatched(["0.637 Peeling for anytime bounds"], "0.5586 Peeling for anytime bounds\n")  # off by more than 0.01
    assert unmatched(["0.559 Hoeffding needs bounded rewards"], "0.5586 Peeling for anytime bounds\n")  # another memory
    assert unmatched(['{"id":4,"n":2}'], '{"id":4,"n":2.0}\n') and unmatched(['{"id":4}'], '{"id":5}\n')  # integers exactly
    printed = ('created memories/bandit_theory/20261205_peeling.md\n'
               '{"id":"0b6a2f7e-93c1-4b51-8d7e-5d2e3f4a1b2c","updated_at":"2026-12-05T08:01:02.123456Z","x":[1,2]}\n')
    shown = ["created memories/bandit_theory/20261129_peeling.md", '{"id":"963c1840-…","updated_at":"2026-11-29T10:00:00Z",…}']
    assert unmatched(shown, printed) == []
    assert unmatched(list(reversed(shown)), printed) == [shown[0]]  # in order
    assert unmatched([], "anything") == []
    assert Block("d", 1, "python", "print(1)  # → 1\n# a comment\n# → two words\n", None, "").shown == ["1", "two words"]


def test_every_block_is_known() -> None:
    """Each document has examples, every block's language is one the walk-through runs, and skips are few."""
    for doc in DOCS:
        assert any(b.doc == doc and b.lang in ("sh", "python") for b in ALL), doc
        assert any(b.doc == doc and b.shown and b.directive != "skip" for b in ALL), doc  # outputs are checked
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
    missing = unmatched(block.shown, done.stdout)
    assert not missing, f"{block.id} does not print what it shows: {missing[0]!r}\n{report}"
    logged_errors = [line for line in walk.daemon.log if '"level": "error"' in line]
    assert not logged_errors, logged_errors
