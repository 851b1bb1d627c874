"""The commands that only talk to a running daemon: call, status, socket, resume and memories.

Rule kept here: nothing here imports eurekamem.daemon (nor trio, numpy or msgspec): they talk through
the light client (client/_line.py: NDJSON, the standard library only) and read the protocol's light
modules (categories, readable), so each of these commands answers within a few tens of milliseconds
(tests/test_cli.py checks the imports in a subprocess, bench/bench_cli.py times them). Only their
help and error paths import the methods' table (`call --help`, an unknown method). The socket is
found by client/_paths.py's rules, the order `eurekamem serve` applies, then the data root's record.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence

from .common import client_target, duration_text, location_flags, terminal_columns, timeout_flag, timeout_help

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (a client command's start)
if TYPE_CHECKING:
    from typing import Any

# --- calling -----------------------------------------------------------------------------------------


def connect(args: argparse.Namespace) -> Any:
    """A LineClient for the daemon (found as client_target says), with the command's --timeout."""
    from ..client import LineClient

    path, root = client_target(args)
    return LineClient(path, timeout=args.timeout, data_dir=root)


def fail(message: str) -> int:
    print(f"eurekamem: {message}", file=sys.stderr)
    return 1


def _call_reporting(args: argparse.Namespace, method: str, params: dict[str, Any]) -> tuple[bool, Any]:
    """(True, result), or (False, None) after printing the error the daemon answered or why it is unreachable."""
    from ..client import ConnectionLost, EurekamemError, MethodNotFound

    try:
        with connect(args) as client:
            return True, client.call(method, params)
    except BrokenPipeError:  # stdout's reader went away, not the daemon: main() ends quietly
        raise
    except (ConnectionLost, OSError) as exc:
        unknown = _unknown_method(method)  # said first: no daemon would know it either
        print(f"eurekamem: {unknown or f'cannot reach the daemon: {exc}'}", file=sys.stderr)
    except MethodNotFound as exc:
        print(f"eurekamem: {_unknown_method(method) or f'{exc.kind}: {exc.message}'}", file=sys.stderr)
    except EurekamemError as exc:
        print(f"eurekamem: {exc.kind}: {exc.message}", file=sys.stderr)
    return False, None


def _unknown_method(method: str) -> str | None:
    """The error for a method name the protocol does not have (with the names it is close to), else
    None. Asked only after a call failed: the methods' table costs the params Structs' import."""
    from ..protocol import METHODS

    if method in METHODS:
        return None
    import difflib

    close = difflib.get_close_matches(method, list(METHODS), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"unknown method {method!r}{hint}; `eurekamem call --help` lists them"


def methods_listing() -> str:
    from ..protocol import METHODS

    width = max(len(name) for name in METHODS)
    lines = ["methods (`eurekamem call METHOD --help` prints one's params):"]
    for name, spec in METHODS.items():
        lines.append(f"  {name:<{width}}  {spec.doc}{'  [writes]' if spec.writes else ''}")
    return "\n".join(lines)


def cmd_call(args: argparse.Namespace) -> int:
    if args.help or not args.method:
        args.parser.print_help()
        print()
        print(methods_listing())
        return 0 if args.help else 2
    if args.method_help:
        from ..protocol import METHODS, method_help

        unknown = _unknown_method(args.method)
        if unknown:
            return fail(unknown)
        spec = METHODS[args.method]
        print(method_help(spec.name, spec.params, spec.doc, spec.writes))
        return 0
    text = sys.stdin.read() if args.params == "-" else args.params
    try:
        params = json.loads(text) if text else {}
    except ValueError as exc:
        return fail(f"params are not JSON: {exc}")
    if not isinstance(params, dict):
        return fail("params must be a JSON object")
    ok, result = _call_reporting(args, args.method, params)
    if not ok:
        return 1
    print(json.dumps(result, indent=2 if args.pretty else None, ensure_ascii=False))
    return 0


def cmd_socket(args: argparse.Namespace) -> int:
    """Print the socket path the other commands connect to: the rules' path (where `eurekamem serve`
    listens by the same rules), else the socket the daemon holding the data root records, when
    something listens there and not on the rules' path; --socket is printed as given."""
    from ..client import find_socket

    print(find_socket(*client_target(args)))
    return 0


# --- status ------------------------------------------------------------------------------------------


def embedding_line(stats: dict[str, Any]) -> str | None:
    """The background embedding's progress from sys.stats (memory.embedding), None when idle."""
    memory = stats.get("memory") or {}
    progress = memory.get("embedding") or {}
    pending = (stats.get("tiers", {}).get("memory") or {}).get("unembedded", 0)
    if not pending:
        return None
    done = progress.get("done", 0)
    total = done + pending
    text = f"{memory.get('model', '?')}: {done:,} of {total:,} memories embedded in the background"
    if progress.get("per_second"):
        text += f", {progress['per_second']:.1f}/s"
    if progress.get("eta_seconds") is not None:
        text += f", about {duration_text(progress['eta_seconds'])} left"
    return text


def cmd_status(args: argparse.Namespace) -> int:
    from ..client import ConnectionLost, EurekamemError

    try:
        with connect(args) as client:
            stats = client.call("sys.stats", {})
    except BrokenPipeError:  # stdout's reader went away, not the daemon: main() ends quietly
        raise
    except (EurekamemError, ConnectionLost, OSError) as exc:
        return fail(f"not running or not reachable: {exc}")
    journal = stats["journal"]
    print(f"eurekamem {stats['version']}  pid {stats['pid']}  since {stats['started_at']}")
    print(f"  data     {stats['data_dir']}")
    print(f"  socket   {stats['socket']}")
    model = (stats.get("memory") or {}).get("model")
    if model:
        print(f"  model    {model}")
    state = "READ-ONLY: " + str(journal["failed"]) if stats["read_only"] else "writable"
    print(
        f"  journal  {journal['bytes']} bytes in {journal['segments']} segments, seq {journal['last_seq']}, "
        f"fsync {journal['fsync']}, {state}"
    )
    for node_line in feed_lines((stats.get("store") or {}).get("feed")):
        print(node_line)
    for tier, counts in stats["tiers"].items():
        print(f"  {tier:<10} " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    line = embedding_line(stats)
    if line:
        print(f"  embedding {line}")
    requests = stats["requests"]
    print(f"  requests {requests['total']} on {requests['connections_total']} connections ({requests['connections_open']} open)")
    for name, m in requests["methods"].items():
        print(
            f"    {name:<22} {m['count']:>9}  p50 {m['p50_us']:>8} us  p99 {m['p99_us']:>8} us  "
            f"errors {sum(m['errors'].values())}"
        )
    return 0


def feed_lines(feed: dict[str, Any] | None) -> list[str]:
    """store = postgres: the node, how far it applied the change feed, and the other nodes seen lately."""
    if not feed:
        return []
    lines = [
        f"  node     {feed['name']} ({feed['node']}): applied seq {feed['applied_seq']} of {feed['head_seq']}, "
        f"{feed['lag_seqs']} behind ({feed['lag_seconds']} s)"
    ]
    for other in feed["nodes"]:
        lines.append(
            f"    node {other['name']} ({other['node']}): applied seq {other['applied_seq']}, seen {other['seen_seconds_ago']} s ago"
        )
    return lines


def cmd_resume(args: argparse.Namespace) -> int:
    """sys.resume: after the journal failed (disk full, I/O error) and space was freed, accept writes again."""
    ok, result = _call_reporting(args, "sys.resume", {})
    if not ok:
        return 1
    if result.get("resumed"):
        print(
            f"resumed: writable again (was read-only since {result.get('failed_at')}: {result.get('was')}); "
            f"cut {result.get('cut_records', 0)} unacknowledged records, now writing {result.get('segment')}"
        )
    else:
        print("not read-only: nothing to resume")
    return 0


# --- memories: a person's view of what is stored ------------------------------------------------------


def _width() -> int:
    return max(60, terminal_columns(100))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], stretch: int = -1) -> str:
    """Columns padded to their widest cell; column `stretch` (the last by default) is cut to fit the terminal."""
    if not rows:
        return ""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    stretch %= len(headers)
    room = _width() - sum(w + 2 for i, w in enumerate(widths) if i != stretch)
    widths[stretch] = max(10, min(widths[stretch], room))

    def cut(text: str, width: int) -> str:
        text = " ".join(text.split())
        return text if len(text) <= width else text[: width - 1] + "…"

    lines = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    for row in rows:
        lines.append("  ".join(cut(cell, widths[i]).ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return "\n".join(lines)


def _memory_row(memory: dict[str, Any]) -> list[str]:
    return [
        memory["id"][:8],
        memory["category"],
        memory["domain"] or "general",
        f"{memory['confidence']:.2f}",
        memory["updated_at"][:10],
        memory["title"] + ("  (global)" if memory.get("scope") == "global" else "")
        + ("  (archived)" if memory.get("status") == "archived" else ""),
    ]


MEMORY_HEADERS = ("ID", "CATEGORY", "DOMAIN", "CONF", "UPDATED", "TITLE")


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _resolve_id(client: Any, wanted: str) -> str:
    """A memory id from a whole id or the unique start of one (the 8 characters `memories list` shows)."""
    from ..client import NotFound

    if len(wanted) >= 36:
        return wanted
    found: list[str] = []
    offset = 0
    while True:
        page = client.call("memory.list", {"status": "any", "limit": 10_000, "offset": offset})
        found += [m["id"] for m in page["memories"] if m["id"].startswith(wanted)]
        offset += len(page["memories"])
        if not page["memories"] or offset >= page["total"]:
            break
    if len(found) == 1:
        return found[0]
    if not found:
        raise NotFound(f"no memory id starts with {wanted!r}")
    raise NotFound(f"{len(found)} memory ids start with {wanted!r}: give more of it ({', '.join(f[:13] for f in found[:5])} ...)")


def _run_memories(args: argparse.Namespace, body: Callable[[Any], int]) -> int:
    from ..client import ConnectionLost, EurekamemError

    try:
        with connect(args) as client:
            return body(client)
    except BrokenPipeError:  # stdout's reader went away, not the daemon: main() ends quietly
        raise
    except (ConnectionLost, OSError) as exc:
        return fail(f"cannot reach the daemon: {exc}")
    except EurekamemError as exc:
        return fail(f"{exc.kind}: {exc.message}")


def cmd_memories_list(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        params = {"status": args.status, "limit": args.limit, "offset": args.offset}
        if args.domain is not None:
            params["domain"] = args.domain
        if args.category:
            params["category"] = args.category
        page = client.call("memory.list", params)
        if args.json:
            _print_json(page)
        elif args.ids:  # one write: a reader that stops after the first line (| head -1) gets them all first
            sys.stdout.write("".join(f"{memory['id']}\n" for memory in page["memories"]))
        elif not page["memories"]:
            print("no memories" + (f" in {args.domain!r}" if args.domain is not None else ""), file=sys.stderr)
        else:
            print(table(MEMORY_HEADERS, [_memory_row(m) for m in page["memories"]]))
            shown = len(page["memories"])
            if shown < page["total"]:
                print(f"({shown} of {page['total']}; --offset {args.offset + shown} for more)", file=sys.stderr)
        return 0

    return _run_memories(args, body)


def _names_a_domain(client: Any, name: str) -> bool:
    """Does some memory (active or archived) belong to this domain (the same slug)?"""
    from ..client import InvalidParams

    try:
        return bool(client.call("memory.list", {"domain": name, "status": "any", "limit": 1})["total"])
    except InvalidParams:  # no valid domain name (a slash, too long, ...): an id then
        return False


def cmd_memories_show(args: argparse.Namespace) -> int:
    """One memory in full, or a domain's readable projection (its MEMORY.md; --global: GLOBAL.md).

    The argument is read as: a whole memory id; else the name of a domain that holds memories; else the
    start of a memory id. --domain D (or --global) always means the projection."""

    def show_projection(client: Any, domain: str | None) -> int:
        params: dict[str, Any] = {"readable": True, "limit": 10_000}
        if domain is not None:
            params["domain"] = domain
        page = client.call("memory.list", params)
        if args.json:
            _print_json(page)
        else:
            sys.stdout.write(page["readable"])
        return 0

    def body(client: Any) -> int:
        if args.globally or args.domain is not None:
            return show_projection(client, None if args.globally else args.domain)
        target = args.target
        if len(target) < 36 and _names_a_domain(client, target):
            return show_projection(client, target)
        memory = client.call("memory.get", {"id": _resolve_id(client, target)})
        if args.json:
            _print_json(memory)
            return 0
        print(f"# {memory['title']}\n")
        for name in ("id", "domain", "category", "scope", "status", "confidence", "tags", "source_session",
                     "created_at", "updated_at", "access_count", "file"):
            value = memory.get(name)
            if value in ("", [], None):
                continue
            print(f"{name + ':':<16}{', '.join(value) if isinstance(value, list) else value}")
        print(f"{'abstract:':<16}{memory['abstract']}")
        print()
        print(memory["content"])
        return 0

    given = sum((args.target is not None, args.domain is not None, args.globally))
    if given != 1:
        return fail("memories show takes one of: a memory id (or its start), a domain, --domain DOMAIN, --global")
    return _run_memories(args, body)


def cmd_memories_search(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        params: dict[str, Any] = {"query": args.query, "k": args.k, "mode": args.mode}
        if args.domain is not None:
            params["domain"] = args.domain
        if args.category:
            params["categories"] = args.category
        if args.min_score is not None:
            params["min_score"] = args.min_score
        hits = client.call("memory.search", params)
        if args.json:
            _print_json(hits)
        elif not hits:
            print("nothing found", file=sys.stderr)
        elif args.table:
            rows = [[f"{hit['score']:.3f}", *_memory_row(hit["memory"])] for hit in hits]
            print(table(("SCORE", *MEMORY_HEADERS), rows))
        else:
            from ..protocol.readable import render_hits

            sys.stdout.write(render_hits(args.query, args.domain, hits))
        return 0

    return _run_memories(args, body)


def cmd_memories_add(args: argparse.Namespace) -> int:
    content = sys.stdin.read() if args.content == "-" else args.content

    def body(client: Any) -> int:
        params: dict[str, Any] = {
            "domain": args.domain, "category": args.category, "title": args.title, "content": content,
            "confidence": args.confidence, "scope": args.scope, "dedup": not args.no_dedup,
        }
        if args.tags:
            params["tags"] = [t.strip() for t in args.tags.split(",") if t.strip()]
        result = client.call("memory.add", params)
        if args.json:
            _print_json(result)
            return 0
        memory = result.get("memory")
        where = f" {memory['id']} ({memory['file']})" if memory else ""
        reason = f": {result['reason']}" if result.get("reason") else ""
        print(f"{result['decision']}{where}{reason}")
        return 0

    return _run_memories(args, body)


def cmd_memories_forget(args: argparse.Namespace) -> int:
    def body(client: Any) -> int:
        result = client.call("memory.delete", {"id": _resolve_id(client, args.id), "purge": args.purge})
        if args.json:
            _print_json(result)
        else:
            print(f"{result['status']} {result['id']}" + ("" if args.purge else " (its file moved to _archive/; --purge erases it)"))
        return 0

    return _run_memories(args, body)


# --- the parser ---------------------------------------------------------------------------------------


def add_call(sub: Any, name: str, help_line: str) -> None:
    call = sub.add_parser(
        name, add_help=False, help=help_line,
        usage="eurekamem call [options] METHOD [PARAMS]\n       eurekamem call METHOD --help",
        description="Call one method of the daemon and print its JSON result; an error goes to stderr with exit status 1.",
    )
    call.add_argument("-h", "--help", action="store_true", help="show this help (with METHOD: that method's params) and exit")
    location_flags(call)
    call.add_argument("method", nargs="?", metavar="METHOD", help="a method name, such as sys.ping or memory.search")
    call.add_argument("params", nargs="?", metavar="PARAMS", help="the params as a JSON object ('-': read it from stdin)")
    call.add_argument("--pretty", action="store_true", help="indent the JSON output")
    timeout_flag(call, 30.0)
    call.set_defaults(func=_call_entry, parser=call, method_help=False)


def add_status(sub: Any, name: str, help_line: str) -> None:
    status = sub.add_parser(name, help=help_line)
    location_flags(status)
    timeout_flag(status, 5.0)
    status.set_defaults(func="eurekamem.cli.calls:cmd_status")


def add_socket(sub: Any, name: str, help_line: str) -> None:
    socket = sub.add_parser(
        name, help=help_line,
        description="Print the socket path, found as the other commands find it: by the rules `eurekamem serve` applies, "
        "else (when nothing listens there) the socket the daemon holding the data root records in its LOCK. "
        "For socat and other clients, e.g. socat - UNIX-CONNECT:$(eurekamem socket)",
    )
    location_flags(socket)
    socket.set_defaults(func="eurekamem.cli.calls:cmd_socket")


def add_resume(sub: Any, name: str, help_line: str) -> None:
    resume = sub.add_parser(name, help=help_line)
    location_flags(resume)
    timeout_flag(resume, 60.0)
    resume.set_defaults(func="eurekamem.cli.calls:cmd_resume")


class _Categories:
    """The nine categories as argparse's `choices`, read from the protocol only when argparse looks at
    them (a --category given, help, an error): protocol/categories.py imports typing, which
    `memories list` alone does not need (a named metavar keeps argparse from listing them at once)."""

    def __iter__(self) -> Iterator[str]:
        from ..protocol import MEMORY_CATEGORIES

        return iter(MEMORY_CATEGORIES)

    def __contains__(self, value: object) -> bool:
        return value in tuple(self)


def add_memories(sub: Any, name: str, help_line: str) -> None:
    memories = sub.add_parser(name, help=help_line)
    msub = memories.add_subparsers(dest="memories_command", required=True, metavar="SUBCOMMAND", prog="eurekamem memories")

    def memory_common(p: argparse.ArgumentParser) -> None:
        location_flags(p)
        p.add_argument("--json", action="store_true", help="print the daemon's JSON answer instead of a table")
        p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help=timeout_help(60.0))

    categories = _Categories()

    listing = msub.add_parser("list", help="memories newest first, as a table")
    memory_common(listing)
    listing.add_argument("--domain", help="only this domain (default: every domain)")
    listing.add_argument("--category", choices=categories, metavar="CATEGORY", help="only this category: %(choices)s")
    listing.add_argument("--status", choices=("active", "archived", "any"), default="active", help="(default: active)")
    listing.add_argument("--limit", type=int, default=50, metavar="N", help="at most N memories (default: 50, at most 10000)")
    listing.add_argument("--offset", type=int, default=0, metavar="N", help="skip the first N (default: 0)")
    listing.add_argument("--ids", action="store_true", help="print only the ids, one a line (for scripts)")
    listing.set_defaults(func="eurekamem.cli.calls:cmd_memories_list")

    show = msub.add_parser(
        "show", help="one memory in full, or a domain as its MEMORY.md shows it",
        usage="eurekamem memories show [options] (ID | DOMAIN | --domain DOMAIN | --global)",
        description="With a memory id (or its first characters): that memory in full. With a domain: the domain's "
        "active memories as its MEMORY.md shows them (by category, strongest first, each its L0 abstract, the group "
        "summary first), read from the daemon as of now. ID|DOMAIN is read as a whole memory id, else the name of a "
        "domain that holds memories, else the start of a memory id; --domain always names a domain (also one with no "
        "memory).",
    )
    memory_common(show)
    show.add_argument("target", nargs="?", metavar="ID|DOMAIN",
                      help="a memory id or its first characters (as `memories list` shows them), or a domain's name")
    show.add_argument("--domain", help="print this domain's MEMORY.md (its projection now)")
    show.add_argument("--global", dest="globally", action="store_true", help="print GLOBAL.md: every global memory")
    show.set_defaults(func="eurekamem.cli.calls:cmd_memories_show")

    search = msub.add_parser(
        "search", help="hybrid search (dense + BM25), shown as MEMORY.md shows memories",
        description="Hybrid search (dense + BM25). The results print as MEMORY.md shows memories: under their "
        "category (the categories in the order of their best result), best first, each its title, file, L0 abstract, "
        "score and id; --table prints a table instead, --json the daemon's answer.",
    )
    memory_common(search)
    search.add_argument("query", metavar="QUERY")
    search.add_argument("--table", action="store_true",
                        help="a table: score, id, category, domain, confidence, date, title")
    search.add_argument("--domain", help="this domain and every domain's global memories (default: every domain)")
    search.add_argument("--category", action="append", choices=categories, metavar="CATEGORY",
                        help="only this category (repeatable): %(choices)s")
    search.add_argument("-k", type=int, default=10, metavar="N", help="at most N results (default: 10, at most 100)")
    search.add_argument("--mode", choices=("hybrid", "dense", "lexical"), default="hybrid", help="(default: hybrid)")
    search.add_argument(
        "--min-score", type=float, metavar="SCORE",
        help="drop results scoring below SCORE, 0 to 1 (calibrated: about 0.5 separates relevant from not; PROTOCOL.md)",
    )
    search.set_defaults(func="eurekamem.cli.calls:cmd_memories_search")

    add = msub.add_parser("add", help="add a memory (deduplicated unless --no-dedup)")
    memory_common(add)
    add.add_argument("--domain", default="", help='the domain, such as "bandit theory" (default: "", i.e. general)')
    add.add_argument("--category", required=True, choices=categories, metavar="CATEGORY",
                     help="one of the nine categories: %(choices)s")
    add.add_argument("--title", required=True, help="a title of 1 to 1024 characters, on one line")
    add.add_argument("--content", required=True, help="the text ('-': read it from stdin)")
    add.add_argument("--confidence", type=float, default=0.8, help="0 to 1; below 0.5 the memory is skipped (default: 0.8)")
    add.add_argument("--tags", help="comma-separated tags")
    add.add_argument("--scope", choices=("local", "global"), default="local", help="global: seen from every domain (default: local)")
    add.add_argument("--no-dedup", action="store_true", help="store as given: no duplicate or near-duplicate check")
    add.set_defaults(func="eurekamem.cli.calls:cmd_memories_add")

    forget = msub.add_parser("forget", help="archive a memory (its file moves to _archive/), or --purge it")
    memory_common(forget)
    forget.add_argument("id", metavar="ID", help="a memory id, or its first characters")
    forget.add_argument("--purge", action="store_true", help="erase it for good: record, file and vector")
    forget.set_defaults(func="eurekamem.cli.calls:cmd_memories_forget")


def _call_entry(args: argparse.Namespace) -> int:
    """`call METHOD --help` prints the method's params; argparse's own -h would print call's usage."""
    if args.help and args.method:
        args.help, args.method_help = False, True
    return cmd_call(args)
