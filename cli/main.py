"""The `eurekamem` command: the parser, and the commands that run or touch the daemon's own files.

Rule kept here: a command that only talks to a running daemon (call, status, socket, memories,
resume, metrics, top, backup, export, import) imports the client and the protocol, never
eurekamem.daemon (nor trio, numpy or a model), so that it answers in a few tens of milliseconds.
This module imports only the standard library and cli/common.py (itself only the standard
library) at the top; each command's module is imported when that command runs (COMMANDS names them as "module:function"), and the daemon's setting flags are
added to the parser only for the commands that take them (serve, config show).
tests/test_cli.py runs the client-side commands in a subprocess and checks what they imported.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import CONFIG_HELP, DATA_DIR_HELP, fail, location_flags, timeout_flag
from .common import effective_config as effective

DAEMON_FLAG_COMMANDS = ("serve", "config")  # the commands that take every setting as a flag (daemon/config.py)

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


def build_parser(command: str | None = ALL) -> argparse.ArgumentParser:
    """The whole parser; given the `command` being run (None: none named), only serve and config
    show get the daemon's setting flags (which import eurekamem.daemon) and only when they run."""
    parser = argparse.ArgumentParser(
        prog="eurekamem",
        description="The memory service for AI agents: one daemon on a Unix socket, and the commands to use it.",
        epilog="`eurekamem COMMAND --help` describes a command; `eurekamem call --help` lists the methods.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version (and this environment) and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    daemon_flags = command == ALL or command in DAEMON_FLAG_COMMANDS

    common, timeout = location_flags, timeout_flag
    serve = sub.add_parser("serve", help="run the daemon in the foreground (Ctrl-C or SIGTERM stops it)")
    common(serve)
    if daemon_flags:
        from ..daemon.config import add_serve_flags

        add_serve_flags(serve)  # a flag per setting (--fsync, --embedder, --log-level, ...): flag > env > file > default
    serve.set_defaults(func="eurekamem.cli.main:cmd_serve")

    from . import calls

    calls.add_client_commands(sub, common, timeout, command)

    rep = sub.add_parser("repair", help="back up and truncate a journal the daemon refuses to open (daemon stopped)")
    rep.add_argument("--data-dir", help=DATA_DIR_HELP)
    rep.add_argument("--config", help=CONFIG_HELP + " (for its data_dir)")
    rep.set_defaults(func="eurekamem.cli.main:cmd_repair")

    install = sub.add_parser(
        "install-service", help="write the systemd user units (eurekamem.service, eurekamem.socket) and say what they run"
    )
    install.add_argument("--dry-run", action="store_true", help="print the units and where they would go; write nothing")
    install.add_argument("--unit-dir", help="folder for the units (default: $XDG_CONFIG_HOME/systemd/user, else ~/.config/systemd/user)")
    install.add_argument("--data-dir", help="the service's data root (default: $EUREKACLAW_DIR, else ~/.eurekaclaw)")
    install.add_argument("--socket", help="the socket systemd listens on (default: $XDG_RUNTIME_DIR/eurekamem/eurekamem.sock)")
    install.add_argument(
        "--command", dest="command_line", metavar="COMMAND_LINE",
        help="the service's ExecStart= (default: this environment's `eurekamem serve`, an absolute path)",
    )
    install.set_defaults(func="eurekamem.cli.main:cmd_install_service")

    add_commands(sub, common, timeout, daemon_flags)
    from .mcp_server import add_mcp_command

    add_mcp_command(sub, common)  # mcp: the stdio MCP server
    from .ui import add_ui_command

    add_ui_command(sub, common)  # ui: the web page (its libraries imported only when it runs)
    from .hooks import add_hooks_commands

    add_hooks_commands(sub, command)  # hooks, hook: Claude Code's hooks (integrations/claude_code)
    return parser


def add_commands(
    sub: Any, common: Callable[[argparse.ArgumentParser], None], timeout: Callable[[argparse.ArgumentParser, float], None],
    daemon_flags: bool = True,
) -> None:
    """Register config show, metrics, top, backup, restore, export, import and verify."""
    config = sub.add_parser("config", help="the effective configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    show = config_sub.add_parser("show", help="print every setting, its value and where it came from (default, file, env, flag)")
    common(show)
    if daemon_flags:
        from ..daemon.config import add_serve_flags

        add_serve_flags(show)
    show.add_argument("--json", action="store_true", help="as JSON")
    show.set_defaults(func="eurekamem.cli.main:cmd_config_show")

    metrics = sub.add_parser("metrics", help="sys.stats in Prometheus text format")
    common(metrics)
    timeout(metrics, 5.0)
    metrics.set_defaults(func="eurekamem.cli.metrics:cmd_metrics")

    top = sub.add_parser("top", help="a live status view, refreshed every second (q or Ctrl-C quits)")
    common(top)
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="seconds between refreshes (default: 1)")
    top.add_argument("--iterations", type=int, default=0, metavar="N", help="stop after N refreshes (default: 0, until q)")
    timeout(top, 5.0)
    top.set_defaults(func="eurekamem.cli.metrics:cmd_top")

    backup = sub.add_parser("backup", help="a consistent archive (.tar or .tar.gz) of the running daemon's data")
    common(backup)
    backup.add_argument("path", help="the archive to write: NAME.tar or NAME.tar.gz")
    timeout(backup, 600.0)
    backup.set_defaults(func="eurekamem.cli.backup:cmd_backup")

    restore = sub.add_parser("restore", help="unpack a backup into an empty data root")
    restore.add_argument("path", help="the archive written by eurekamem backup")
    restore.add_argument("--data-dir", help="the empty data root to fill (default: $EUREKACLAW_DIR, else ~/.eurekaclaw)")
    restore.add_argument("--config", help=CONFIG_HELP + " (for its data_dir)")
    restore.set_defaults(func="eurekamem.cli.backup:cmd_restore")

    export = sub.add_parser("export", help="every record as JSON lines, or as an EurekaClaw data root, read through the daemon")
    common(export)
    export.add_argument("--format", choices=["jsonl", "eurekaclaw"], default="jsonl",
                        help="jsonl (default), or eurekaclaw: a data root EurekaClaw's own code reads, ids and times kept")
    export.add_argument("--out", metavar="PATH", help="write here instead of stdout (eurekaclaw: the new or empty folder)")
    export.add_argument("dir", nargs="?", metavar="DIR", help="with --format eurekaclaw: the new or empty folder to write")
    timeout(export, 600.0)
    export.set_defaults(func="eurekamem.cli.transfer:cmd_export")

    imp = sub.add_parser(
        "import", help="add a jsonl export, or a plain EurekaClaw data root, through the daemon (progress on stderr)"
    )
    common(imp)
    imp.add_argument("source", help="a .jsonl file from eurekamem export, or an EurekaClaw data root folder")
    timeout(imp, 600.0)
    imp.set_defaults(func="eurekamem.cli.transfer:cmd_import")

    verify = sub.add_parser("verify", help="check journal, snapshots, vectors and memory files against each other (daemon stopped)")
    verify.add_argument("--data-dir", help=DATA_DIR_HELP)
    verify.add_argument("--config", help=CONFIG_HELP + " (for its data_dir)")
    verify.set_defaults(func="eurekamem.cli.verify:cmd_verify")

    migrate = sub.add_parser("migrate", help="copy a journal data root into an empty PostgreSQL database (daemon stopped)")
    migrate.add_argument("--to", required=True, choices=["postgres"], help="the store to copy into")
    migrate.add_argument("--postgres-dsn", required=True, help="the database's connection string")
    migrate.add_argument("--data-dir", help=DATA_DIR_HELP)
    migrate.add_argument("--config", help=CONFIG_HELP + " (for its data_dir)")
    migrate.add_argument(
        "--force", action="store_true", help="write into a database that holds data (same ids replaced, others kept)"
    )
    migrate.set_defaults(func="eurekamem.cli.migrate:cmd_migrate")


def _resolve(func: Any) -> Callable[[argparse.Namespace], int]:
    if callable(func):
        result: Callable[[argparse.Namespace], int] = func
        return result
    module, _, name = func.partition(":")
    result = getattr(importlib.import_module(module), name)
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
        return 128 + signal.SIGPIPE


if __name__ == "__main__":  # last: `python -m eurekamem.cli.main` needs every function above defined
    sys.exit(main())
