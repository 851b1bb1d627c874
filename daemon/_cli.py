"""The `eurekamem` command: serve, call, status, repair."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

DEFAULT_FSYNC = "always"


def data_root(arg: str | None) -> Path:
    from eurekamem.client._paths import data_root as resolve

    return resolve(arg)


def socket_path(arg: str | None, root: Path) -> Path:
    if arg:
        return Path(arg).expanduser()
    from eurekamem.client._paths import default_socket_path

    return Path(default_socket_path(str(root)))


def _setup_logging(level: str, fmt: str = "auto") -> None:
    from ._config import setup_logging

    setup_logging(level, fmt)


def _effective(args: argparse.Namespace) -> Any:
    """The effective configuration (flags > env > file > default); ConfigError says what is wrong."""
    from . import _config

    return _config.load(_config.flags_from_args(None, args), getattr(args, "config", None))


def cmd_serve(args: argparse.Namespace) -> int:
    import trio

    from ._app import Config, Daemon, StartupError
    from ._journal import JournalCorrupt

    from ._config import ConfigError, build_config

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
    from ._config import ConfigError, load

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
    from ._app import Paths, StartupError, acquire_lock
    from ._journal import repair

    paths = Paths(data_root(args.data_dir))
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
    from . import _systemd

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
    from ._config import add_serve_flags

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
    rep.add_argument("--data-dir", help="data root (default $EUREKACLAW_DIR or ~/.eurekaclaw)")
    rep.set_defaults(func=cmd_repair)

    install = sub.add_parser("install-service", help="write the systemd user units (eurekamem.service, eurekamem.socket)")
    install.add_argument("--dry-run", action="store_true", help="print the units and where they would go; write nothing")
    install.add_argument("--unit-dir", help="folder for the units (default $XDG_CONFIG_HOME/systemd/user or ~/.config/systemd/user)")
    install.set_defaults(func=cmd_install_service)

    from ._admin import add_commands

    add_commands(sub, common)  # config show, metrics, top, backup, restore, export, import, verify
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
