"""The `eurekamem` command: the parser, and the commands that run or touch the daemon's own files.

Rule kept here: `eurekamem COMMAND` imports what COMMAND needs and nothing else, so that a command
that only talks to a running daemon (call, status, socket, memories, resume, ...) answers in a few
tens of milliseconds: it imports the light client (client/_line.py) and the standard library, never
eurekamem.daemon, trio, numpy, msgspec or a model. This module imports only the standard library and
cli/common.py at the top. tests/test_cli.py runs the client-side commands in a subprocess and fails
when one imports trio, numpy, hnswlib, the daemon or an embedder; bench/bench_cli.py times them.

Adding a command (keep to this pattern; each step is one place):
1. Write `add_NAME(sub, name, help)` (here, or in your module if that module imports only the standard
   library and cli/common.py at its top): it calls `sub.add_parser(name, help=help, ...)`, adds the
   arguments, and sets `func="eurekamem.cli.MODULE:cmd_NAME"`, a string, so that the command's module
   is imported only when the command runs.
2. Add one line to COMMANDS: "NAME": ("the one-line help", "eurekamem.cli.MODULE:add_NAME").
Only the command being run has its add_ function imported and called (all of them for
build_parser(ALL)); the others appear in `eurekamem --help` by their line. A client-side command
also goes into CLIENT_COMMANDS of tests/test_cli.py, which checks what it imports.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from .common import CONFIG_HELP, DATA_DIR_HELP, fail, location_flags, timeout_flag
from .common import effective_config as effective

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (a client command's start)
if TYPE_CHECKING:
    from typing import Any

# --- the commands that run the daemon or read its files (they import eurekamem.daemon) -----------


def cmd_serve(args: argparse.Namespace) -> int:
    from ..daemon.foreground import serve

    return serve(args)


def cmd_repair(args: argparse.Namespace) -> int:
    """The data root as `serve` and `verify` find it (--data-dir, $EUREKACLAW_DIR, config.toml, default)."""
    from ..daemon.config import ConfigError
    from ..daemon.errors import StartupError
    from ..daemon.paths import Paths, acquire_lock
    from ..daemon.storage.journal import repair

    try:
        paths = Paths(Path(effective(args, ("data_dir",))["data_dir"]))
    except ConfigError as exc:
        return fail(str(exc))
    try:
        fd = acquire_lock(paths)
    except StartupError as exc:
        print(f"eurekamem: {exc}", file=sys.stderr)
        return 1
    try:
        report = repair(paths.journal)
    finally:
        os.close(fd)
    print(report)
    return 0


def cmd_install_service(args: argparse.Namespace) -> int:
    """Write eurekamem.service and eurekamem.socket into the user's systemd folder; touch nothing else.

    Each choice is printed with its reason: the command (this environment's, unless --command), the
    data root (--data-dir, else $EUREKACLAW_DIR, else ~/.eurekaclaw as systemd's %h/.eurekaclaw) and
    the socket (--socket, else systemd's %t/eurekamem/eurekamem.sock)."""
    from ..daemon import systemd as _systemd

    folder = Path(args.unit_dir).expanduser() if args.unit_dir else _systemd.unit_dir()
    if args.command_line:
        exec_start, why_exec = args.command_line, "from --command"
    else:
        argv = _systemd.daemon_argv()
        exec_start = _systemd.exec_start(argv)
        why_exec = (
            f"the eurekamem command of this Python environment ({sys.prefix}): the service runs this environment's "
            "code, so keep it (or run install-service again from another one, or pass --command)"
        )
    if args.data_dir:
        data_dir, why_data = _systemd.unit_path(os.path.abspath(os.path.expanduser(args.data_dir))), "from --data-dir"
    elif os.environ.get("EUREKACLAW_DIR"):
        data_dir = _systemd.unit_path(os.path.abspath(os.path.expanduser(os.environ["EUREKACLAW_DIR"])))
        why_data = "from $EUREKACLAW_DIR"
    else:
        data_dir, why_data = "%h/.eurekaclaw", "the default, ~/.eurekaclaw (neither --data-dir nor $EUREKACLAW_DIR given)"
    if args.socket:
        socket = _systemd.unit_path(os.path.abspath(os.path.expanduser(args.socket)))
        why_socket = "from --socket (for clients to find it: EUREKAMEM_SOCKET or `socket =` in config.toml)"
    else:
        socket = _systemd.DEFAULT_LISTEN
        why_socket = "the default, $XDG_RUNTIME_DIR/eurekamem/eurekamem.sock, where clients look first when $XDG_RUNTIME_DIR is set"
    units = _systemd.render_units(exec_start, data_dir=data_dir, socket=socket)
    print(f"# ExecStart={exec_start}\n#   {why_exec}")
    print(f"# EUREKACLAW_DIR={data_dir}\n#   {why_data}")
    print(f"# ListenStream={socket}\n#   {why_socket}")
    for name, text in units.items():
        path = folder / name
        if args.dry_run:
            print(f"# would write {path}:\n{text}")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        old = path.read_text() if path.exists() else None
        if old == text:
            print(f"unchanged {path}")
            continue
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        print(f"{'replaced' if old is not None else 'wrote'} {path}")
    print("then run:" if not args.dry_run else "# then run:")
    for line in _systemd.install_commands():
        print(f"  {line}")
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    import json

    from ..daemon import config as _config

    try:
        effective = _config.load(_config.flags_from_args(None, args), args.config)
    except _config.ConfigError as exc:
        return fail(str(exc))
    if args.json:
        doc = {
            "config_file": str(effective.config_file) if effective.config_file else None,
            "settings": {
                name: {"value": value, "source": effective.sources[name], "origin": effective.origins[name]}
                for name, value in effective.values.items()
            },
        }
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(_config.format_effective(effective))
    return 0


# --- the parser ------------------------------------------------------------------------------------


def _version() -> str:
    from .. import __version__

    return f"eurekamem {__version__} (Python {sys.version.split()[0]}, {sys.prefix})"


class _VersionAction(argparse.Action):
    """--version on one line, unwrapped (argparse's own "version" action wraps it at 80 columns)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(_version())
        parser.exit()


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named in argv (the first word that is not an option), None if none."""
    return next((word for word in argv if not word.startswith("-")), None)


ALL = "*"  # build_parser(): every command with every flag

# name: (the line `eurekamem --help` shows, "module:add_function" that builds its parser); in help order
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("run the daemon in the foreground (Ctrl-C or SIGTERM stops it)", "eurekamem.cli.main:add_serve"),
    "call": ("call one method and print its JSON result (`call --help` lists the methods)", "eurekamem.cli.calls:add_call"),
    "status": ("a short human summary of the running daemon", "eurekamem.cli.calls:add_status"),
    "socket": (
        "print the socket path the daemon listens on and the commands connect to", "eurekamem.cli.calls:add_socket"
    ),
    "resume": (
        "after a disk-full or I/O error made the daemon read-only: write again", "eurekamem.cli.calls:add_resume"
    ),
    "memories": (
        "what the agents know: list, show, search, add or forget domain memories", "eurekamem.cli.calls:add_memories"
    ),
    "repair": (
        "back up and truncate a journal the daemon refuses to open (daemon stopped)", "eurekamem.cli.main:add_repair"
    ),
    "install-service": (
        "write the systemd user units (eurekamem.service, eurekamem.socket) and say what they run",
        "eurekamem.cli.main:add_install_service",
    ),
    "config": ("the effective configuration", "eurekamem.cli.main:add_config"),
    "metrics": ("sys.stats in Prometheus text format", "eurekamem.cli.main:add_metrics"),
    "top": ("a live status view, refreshed every second (q or Ctrl-C quits)", "eurekamem.cli.main:add_top"),
    "backup": ("a consistent archive (.tar or .tar.gz) of the running daemon's data", "eurekamem.cli.main:add_backup"),
    "restore": ("unpack a backup into an empty data root", "eurekamem.cli.main:add_restore"),
    "export": (
        "every record as JSON lines, or as an EurekaClaw data root, read through the daemon",
        "eurekamem.cli.main:add_export",
    ),
    "import": (
        "add a jsonl export, or a plain EurekaClaw data root, through the daemon (progress on stderr)",
        "eurekamem.cli.main:add_import",
    ),
    "verify": (
        "check journal, snapshots, vectors and memory files against each other (daemon stopped)",
        "eurekamem.cli.main:add_verify",
    ),
    "migrate": (
        "copy a journal data root into an empty PostgreSQL database (daemon stopped)", "eurekamem.cli.main:add_migrate"
    ),
    "mcp": (
        "an MCP server on stdio, or streamable HTTP on 127.0.0.1 (Claude Code, Claude Desktop, Cursor, ...)",
        "eurekamem.cli.main:add_mcp",
    ),
    "ui": ("a web page on 127.0.0.1 to see, search, review and correct the memories", "eurekamem.cli.main:add_ui"),
    "hooks": (
        "install, remove or show eurekamem's hooks in Claude Code's settings.json", "eurekamem.cli.hooks:add_hooks"
    ),
    "hook": (
        "the hook command: one Claude Code hook event on stdin, the answer on stdout (exits 0)",
        "eurekamem.cli.hooks:add_hook",
    ),
}


def build_parser(command: str | None = ALL) -> argparse.ArgumentParser:
    """The parser; given the `command` being run (None: none named), only that command's parser is
    built (its add_ function imported and called), the others are a name and a help line."""
    parser = argparse.ArgumentParser(
        prog="eurekamem",
        description="The memory service for AI agents: one daemon on a Unix socket, and the commands to use it.",
        epilog="`eurekamem COMMAND --help` describes a command; `eurekamem call --help` lists the methods.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version (and this environment) and exit")
    # prog given: argparse would otherwise make a help formatter now, which imports shutil (bz2, lzma)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", prog="eurekamem")
    for name, (help_line, add) in COMMANDS.items():
        if command == ALL or command == name:
            _imported(add)(sub, name, help_line)
        else:
            sub.add_parser(name, help=help_line)  # `eurekamem --help` lists it; running it builds its parser
    return parser


# --- each command's parser (the add_ functions of COMMANDS) ------------------------------------------


def add_serve(sub: Any, name: str, help_line: str) -> None:
    from ..daemon.config import add_serve_flags

    serve = sub.add_parser(name, help=help_line)
    location_flags(serve)
    add_serve_flags(serve)  # a flag per setting (--fsync, --embedder, --log-level, ...): flag > env > file > default
    serve.set_defaults(func="eurekamem.cli.main:cmd_serve")


def add_repair(sub: Any, name: str, help_line: str) -> None:
    rep = sub.add_parser(name, help=help_line)
    rep.add_argument("--data-dir", help=DATA_DIR_HELP)
    rep.add_argument("--config", help=CONFIG_HELP + " (for its data_dir)")
    rep.set_defaults(func="eurekamem.cli.main:cmd_repair")


def add_install_service(sub: Any, name: str, help_line: str) -> None:
    install = sub.add_parser(name, help=help_line)
    install.add_argument("--dry-run", action="store_true", help="print the units and where they would go; write nothing")
    install.add_argument("--unit-dir", help="folder for the units (default: $XDG_CONFIG_HOME/systemd/user, else ~/.config/systemd/user)")
    install.add_argument("--data-dir", help="the service's data root (default: $EUREKACLAW_DIR, else ~/.eurekaclaw)")
    install.add_argument("--socket", help="the socket systemd listens on (default: $XDG_RUNTIME_DIR/eurekamem/eurekamem.sock)")
    install.add_argument(
        "--command", dest="command_line", metavar="COMMAND_LINE",
        help="the service's ExecStart= (default: this environment's `eurekamem serve`, an absolute path)",
    )
    install.set_defaults(func="eurekamem.cli.main:cmd_install_service")


def add_config(sub: Any, name: str, help_line: str) -> None:
    from ..daemon.config import add_serve_flags

    config = sub.add_parser(name, help=help_line)
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    show = config_sub.add_parser("show", help="print every setting, its value and where it came from (default, file, env, flag)")
    location_flags(show)
    add_serve_flags(show)
    show.add_argument("--json", action="store_true", help="as JSON")
    show.set_defaults(func="eurekamem.cli.main:cmd_config_show")


def add_metrics(sub: Any, name: str, help_line: str) -> None:
    metrics = sub.add_parser(name, help=help_line)
    location_flags(metrics)
    timeout_flag(metrics, 5.0)
    metrics.set_defaults(func="eurekamem.cli.metrics:cmd_metrics")


def add_top(sub: Any, name: str, help_line: str) -> None:
    top = sub.add_parser(name, help=help_line)
    location_flags(top)
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="seconds between refreshes (default: 1)")
    top.add_argument("--iterations", type=int, default=0, metavar="N", help="stop after N refreshes (default: 0, until q)")
    timeout_flag(top, 5.0)
    top.set_defaults(func="eurekamem.cli.metrics:cmd_top")


def add_backup(sub: Any, name: str, help_line: str) -> None:
    backup = sub.add_parser(name, help=help_line)
    location_flags(backup)
    backup.add_argument("path", help="the archive to write: NAME.tar or NAME.tar.gz")
    timeout_flag(backup, 600.0)
    backup.set_defaults(func="eurekamem.cli.backup:cmd_backup")


def add_restore(sub: Any, name: str, help_line: str) -> None:
    restore = sub.add_parser(name, help=help_line)
    restore.add_argument("path", help="the archive written by eurekamem backup")
    restore.add_argument("--data-dir", help="the empty data root to fill (default: $EUREKACLAW_DIR, else ~/.eurekaclaw)")
    restore.add_argument("--config", help=CONFIG_HELP + " (for its data_dir)")
    restore.set_defaults(func="eurekamem.cli.backup:cmd_restore")


def add_export(sub: Any, name: str, help_line: str) -> None:
    export = sub.add_parser(name, help=help_line)
    location_flags(export)
    export.add_argument("--format", choices=["jsonl", "eurekaclaw"], default="jsonl",
                        help="jsonl (default), or eurekaclaw: a data root EurekaClaw's own code reads, ids and times kept")
    export.add_argument("--out", metavar="PATH", help="write here instead of stdout (eurekaclaw: the new or empty folder)")
    export.add_argument("dir", nargs="?", metavar="DIR", help="with --format eurekaclaw: the new or empty folder to write")
    timeout_flag(export, 600.0)
    export.set_defaults(func="eurekamem.cli.transfer:cmd_export")


def add_import(sub: Any, name: str, help_line: str) -> None:
    imp = sub.add_parser(name, help=help_line)
    location_flags(imp)
    imp.add_argument("source", help="a .jsonl file from eurekamem export, or an EurekaClaw data root folder")
    timeout_flag(imp, 600.0)
    imp.set_defaults(func="eurekamem.cli.transfer:cmd_import")


def add_verify(sub: Any, name: str, help_line: str) -> None:
    verify = sub.add_parser(name, help=help_line)
    verify.add_argument("--data-dir", help=DATA_DIR_HELP)
    verify.add_argument("--config", help=CONFIG_HELP + " (for its data_dir)")
    verify.set_defaults(func="eurekamem.cli.verify:cmd_verify")


def add_migrate(sub: Any, name: str, help_line: str) -> None:
    migrate = sub.add_parser(name, help=help_line)
    migrate.add_argument("--to", required=True, choices=["postgres"], help="the store to copy into")
    migrate.add_argument("--postgres-dsn", required=True, help="the database's connection string")
    migrate.add_argument("--data-dir", help=DATA_DIR_HELP)
    migrate.add_argument("--config", help=CONFIG_HELP + " (for its data_dir)")
    migrate.add_argument(
        "--force", action="store_true", help="write into a database that holds data (same ids replaced, others kept)"
    )
    migrate.set_defaults(func="eurekamem.cli.migrate:cmd_migrate")


def add_mcp(sub: Any, name: str, help_line: str) -> None:
    from .mcp_server import add_mcp_command

    add_mcp_command(sub, location_flags)  # mcp: the MCP server (its parser is the server module's)


def add_ui(sub: Any, name: str, help_line: str) -> None:
    from .ui import add_ui_command

    add_ui_command(sub, location_flags)  # ui: the web page (its libraries imported only when it runs)


def _imported(spec: str) -> Any:
    """The function a "module:function" string names, imported now (by __import__: importlib's
    import_module goes around the interpreter's import timing, which `python -X importtime` reports)."""
    module, _, name = spec.partition(":")
    return getattr(__import__(module, fromlist=[name]), name)


def _resolve(func: Any) -> Callable[[argparse.Namespace], int]:
    result: Callable[[argparse.Namespace], int] = func if callable(func) else _imported(func)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser(_command_of(argv)).parse_args(argv)
        return _resolve(args.func)(args)
    except BrokenPipeError:
        # the reader went away (`eurekamem call ... | head`): end quietly as other Unix tools do, with
        # the status a shell gives a process SIGPIPE ended, and nothing left for the exit's flush
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        import signal  # here: its enums cost every command's start

        return 128 + signal.SIGPIPE


if __name__ == "__main__":  # last: `python -m eurekamem.cli.main` needs every function above defined
    sys.exit(main())
