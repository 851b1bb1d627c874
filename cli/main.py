"""The `eurekamem` command: serve, call, status, repair."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eurekamem.cli.backup import cmd_backup, cmd_restore
from eurekamem.cli.common import _err
from eurekamem.cli.metrics import cmd_metrics, cmd_top
from eurekamem.cli.transfer import cmd_export, cmd_import
from eurekamem.cli.verify import cmd_verify

log = logging.getLogger("eurekamem.admin")


def _setup_logging(level: str, fmt: str = "auto") -> None:
    from eurekamem.daemon.config import setup_logging

    setup_logging(level, fmt)


def _effective(args: argparse.Namespace) -> Any:
    """The effective configuration (flags > env > file > default); ConfigError says what is wrong."""
    from eurekamem.daemon import config as _config

    return _config.load(_config.flags_from_args(None, args), getattr(args, "config", None))


def cmd_serve(args: argparse.Namespace) -> int:
    import trio
    from eurekamem.daemon.app import Daemon
    from eurekamem.daemon.config import Config, ConfigError, build_config
    from eurekamem.daemon.errors import StartupError
    from eurekamem.daemon.storage.journal import JournalCorrupt

    try:
        effective = _effective(args)
        config: Config = build_config(effective)
    except ConfigError as exc:
        print(f"eurekamem: {exc}", file=sys.stderr)
        return 1
    _setup_logging(effective["log_level"], effective["log_format"])
    daemon = Daemon(config)

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        logging.getLogger("eurekamem").info("signal %s received", signal.Signals(signum).name)
                        daemon.request_shutdown()
                        return

            nursery.start_soon(watch_signals)
            await daemon.serve()
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except BaseException as exc:  # trio wraps task errors in exception groups; look inside
        leaf = _single_leaf(exc)
        if isinstance(leaf, StartupError):
            print(f"eurekamem: {leaf}", file=sys.stderr)
            return 1
        if isinstance(leaf, JournalCorrupt):
            print(f"eurekamem: {leaf}", file=sys.stderr)
            return 2
        raise
    return 0


def _single_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _client(args: argparse.Namespace) -> Any:
    from eurekamem.client import Client

    return Client(client_socket(args), timeout=args.timeout)


def client_socket(args: argparse.Namespace) -> str:
    """The daemon's socket as `serve` would pick it: --socket, env, config file, default."""
    from eurekamem.daemon.config import ConfigError, load

    flags = {"data_dir": getattr(args, "data_dir", None), "socket": getattr(args, "socket", None)}
    try:
        return load(flags, getattr(args, "config", None))["socket"]
    except ConfigError as exc:
        print(f"eurekamem: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _call_reporting(args: argparse.Namespace, method: str, params: dict[str, Any]) -> tuple[bool, Any]:
    """(True, result), or (False, None) after printing the error the daemon answered or why it is unreachable."""
    from eurekamem.client import ConnectionLost, EurekamemError

    try:
        with _client(args) as client:
            return True, client.call(method, params)
    except EurekamemError as exc:
        print(f"eurekamem: {exc.kind}: {exc.message}", file=sys.stderr)
    except (ConnectionLost, OSError) as exc:
        print(f"eurekamem: cannot reach the daemon: {exc}", file=sys.stderr)
    return False, None


def cmd_call(args: argparse.Namespace) -> int:
    try:
        params = json.loads(args.params) if args.params else {}
    except ValueError as exc:
        print(f"eurekamem: params are not JSON: {exc}", file=sys.stderr)
        return 1
    if not isinstance(params, dict):
        print("eurekamem: params must be a JSON object", file=sys.stderr)
        return 1
    ok, result = _call_reporting(args, args.method, params)
    if not ok:
        return 1
    print(json.dumps(result, indent=2 if args.pretty else None, ensure_ascii=False))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from eurekamem.client import ConnectionLost, EurekamemError

    try:
        with _client(args) as client:
            stats = client.call("sys.stats", {})
    except (EurekamemError, ConnectionLost, OSError) as exc:
        print(f"eurekamem: not running or not reachable: {exc}", file=sys.stderr)
        return 1
    journal = stats["journal"]
    print(f"eurekamem {stats['version']}  pid {stats['pid']}  since {stats['started_at']}")
    print(f"  data     {stats['data_dir']}")
    print(f"  socket   {stats['socket']}")
    state = "READ-ONLY: " + str(journal["failed"]) if stats["read_only"] else "writable"
    print(f"  journal  {journal['bytes']} bytes in {journal['segments']} segments, seq {journal['last_seq']}, fsync {journal['fsync']}, {state}")
    for tier, counts in stats["tiers"].items():
        print(f"  {tier:<10} " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    requests = stats["requests"]
    print(f"  requests {requests['total']} on {requests['connections_total']} connections ({requests['connections_open']} open)")
    for name, m in requests["methods"].items():
        print(f"    {name:<22} {m['count']:>9}  p50 {m['p50_us']:>8} us  p99 {m['p99_us']:>8} us  errors {sum(m['errors'].values())}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """sys.resume: after the journal failed (disk full, I/O error) and space was freed, accept writes again."""
    ok, result = _call_reporting(args, "sys.resume", {})
    if not ok:
        return 1
    if result.get("resumed"):
        print(f"resumed: writable again (was read-only since {result.get('failed_at')}: {result.get('was')}); "
              f"cut {result.get('cut_records', 0)} unacknowledged records, now writing {result.get('segment')}")
    else:
        print("not read-only: nothing to resume")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    """The data root as `serve` and `verify` find it (--data-dir, $EUREKACLAW_DIR, config.toml, default)."""
    from eurekamem.cli.common import _effective as effective_of
    from eurekamem.daemon.config import ConfigError
    from eurekamem.daemon.errors import StartupError
    from eurekamem.daemon.paths import Paths, acquire_lock
    from eurekamem.daemon.storage.journal import repair

    try:
        paths = Paths(Path(effective_of(args, ("data_dir",))["data_dir"]))
    except ConfigError as exc:
        return _err(str(exc))
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
    """Write eurekamem.service and eurekamem.socket into the user's systemd folder; touch nothing else."""
    from eurekamem.daemon import systemd as _systemd

    folder = Path(args.unit_dir).expanduser() if args.unit_dir else _systemd.unit_dir()
    units = _systemd.render_units(_systemd.exec_start(_systemd.daemon_argv()))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eurekamem", description="The memory service for AI agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", help="data root (default $EUREKACLAW_DIR or ~/.eurekaclaw)")
        p.add_argument("--socket", help="socket path (default $EUREKAMEM_SOCKET, $XDG_RUNTIME_DIR/eurekamem/eurekamem.sock, <data root>/run/eurekamem.sock)")
        p.add_argument("--config", help="config file (default $XDG_CONFIG_HOME/eurekamem/config.toml)")

    serve = sub.add_parser("serve", help="run the daemon in the foreground")
    common(serve)
    from eurekamem.daemon.config import add_serve_flags

    add_serve_flags(serve)  # a flag per setting (--fsync, --embedder, --log-level, ...): flag > env > file > default
    serve.set_defaults(func=cmd_serve)

    call = sub.add_parser("call", help="call one method and print its JSON result")
    common(call)
    call.add_argument("method")
    call.add_argument("params", nargs="?", help="JSON object of params")
    call.add_argument("--pretty", action="store_true", help="indent the JSON output")
    call.add_argument("--timeout", type=float, default=30.0)
    call.set_defaults(func=cmd_call)

    status = sub.add_parser("status", help="a short human summary of the running daemon")
    common(status)
    status.add_argument("--timeout", type=float, default=5.0)
    status.set_defaults(func=cmd_status)

    resume = sub.add_parser("resume", help="after a disk-full or I/O error made the daemon read-only: write again")
    common(resume)
    resume.add_argument("--timeout", type=float, default=60.0)
    resume.set_defaults(func=cmd_resume)

    rep = sub.add_parser("repair", help="back up and truncate a journal the daemon refuses to open")
    rep.add_argument(
        "--data-dir", help="data root (default $EUREKACLAW_DIR, the config file's data_dir, ~/.eurekaclaw)"
    )
    rep.add_argument("--config", help="config file (for its data_dir)")
    rep.set_defaults(func=cmd_repair)

    install = sub.add_parser("install-service", help="write the systemd user units (eurekamem.service, eurekamem.socket)")
    install.add_argument("--dry-run", action="store_true", help="print the units and where they would go; write nothing")
    install.add_argument("--unit-dir", help="folder for the units (default $XDG_CONFIG_HOME/systemd/user or ~/.config/systemd/user)")
    install.set_defaults(func=cmd_install_service)


    add_commands(sub, common)  # config show, metrics, top, backup, restore, export, import, verify
    from eurekamem.cli.mcp_server import add_mcp_command

    add_mcp_command(sub, common)  # mcp: the stdio MCP server
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)



def cmd_config_show(args: argparse.Namespace) -> int:
    from eurekamem.daemon import config as _config

    try:
        effective = _config.load(_config.flags_from_args(None, args), args.config)
    except _config.ConfigError as exc:
        return _err(str(exc))
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


def add_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register config show, metrics, top, backup, restore, export, import and verify."""
    from eurekamem.daemon.config import add_serve_flags

    config = sub.add_parser("config", help="the effective configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print every setting, its value and where it came from (default, file, env, flag)")
    common(show)
    add_serve_flags(show)
    show.add_argument("--json", action="store_true", help="as JSON")
    show.set_defaults(func=cmd_config_show)

    metrics = sub.add_parser("metrics", help="sys.stats in Prometheus text format")
    common(metrics)
    metrics.add_argument("--timeout", type=float, default=5.0)
    metrics.set_defaults(func=cmd_metrics)

    top = sub.add_parser("top", help="a live status view, refreshed every second (q or Ctrl-C quits)")
    common(top)
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--iterations", type=int, default=0, help="stop after this many refreshes (0: until q)")
    top.add_argument("--timeout", type=float, default=5.0)
    top.set_defaults(func=cmd_top)

    backup = sub.add_parser("backup", help="a consistent archive (.tar or .tar.gz) of the running daemon's data")
    common(backup)
    backup.add_argument("path", help="the archive to write: NAME.tar or NAME.tar.gz")
    backup.add_argument("--timeout", type=float, default=600.0)
    backup.set_defaults(func=cmd_backup)

    restore = sub.add_parser("restore", help="unpack a backup into an empty data root")
    restore.add_argument("path", help="the archive written by eurekamem backup")
    restore.add_argument("--data-dir", help="the empty data root to fill (default $EUREKACLAW_DIR or ~/.eurekaclaw)")
    restore.add_argument("--config", help="config file (for its data_dir)")
    restore.set_defaults(func=cmd_restore)

    export = sub.add_parser("export", help="every record as JSON lines, read through the daemon")
    common(export)
    export.add_argument("--format", choices=["jsonl"], default="jsonl")
    export.add_argument("--out", help="write here instead of stdout")
    export.add_argument("--timeout", type=float, default=600.0)
    export.set_defaults(func=cmd_export)

    imp = sub.add_parser("import", help="add a jsonl export, or a plain EurekaClaw data root, through the daemon")
    common(imp)
    imp.add_argument("source", help="a .jsonl file from eurekamem export, or an EurekaClaw data root folder")
    imp.add_argument("--timeout", type=float, default=600.0)
    imp.set_defaults(func=cmd_import)

    verify = sub.add_parser("verify", help="check journal, snapshots, vectors and memory files against each other (daemon stopped)")
    verify.add_argument("--data-dir", help="data root (default $EUREKACLAW_DIR or ~/.eurekaclaw)")
    verify.add_argument("--config", help="config file (for its data_dir)")
    verify.set_defaults(func=cmd_verify)


if __name__ == "__main__":  # last: `python -m eurekamem.cli.main` needs every function above defined
    sys.exit(main())
