"""`eurekamem hooks install|uninstall|status` (Claude Code's settings.json) and `eurekamem hook` (the hook
command itself, as `python -m eurekamem.integrations.claude_code` runs it).

Rule kept here: only the standard library at the top (the parser imports this module for every
command); the integration's modules are imported when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import fail


def add_hooks(sub: Any, name: str, help_line: str) -> None:
    """`hooks install|uninstall|status` (cli/main.py's COMMANDS)."""
    hooks = sub.add_parser(name, help=help_line)
    hooks_sub = hooks.add_subparsers(dest="hooks_command", required=True, metavar="SUBCOMMAND")

    install = hooks_sub.add_parser("install", help="add the hooks (SessionStart, UserPromptSubmit, PreCompact, Stop, SessionEnd)")
    install.add_argument("agent", choices=["claude-code"], help="the agent whose settings get the hooks")
    _scope(install, "user")
    install.add_argument("--domain", help="the domain and conversation group (default: each session's git root's folder name)")
    install.add_argument("--post-tool-use", action="store_true",
                         help="also log each tool's name and outcome as an episodic event (PostToolUse; off by default)")
    install.add_argument("--socket", help="a socket for the hooks to use (default: as every client finds it)")
    install.add_argument("--data-dir", help="a data root for the hooks to use (default: $EUREKACLAW_DIR, else ~/.eurekaclaw)")
    install.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    install.set_defaults(func="eurekamem.cli.hooks:cmd_install")

    uninstall = hooks_sub.add_parser("uninstall", help="remove exactly the hooks install added (every scope unless --scope)")
    uninstall.add_argument("agent", nargs="?", choices=["claude-code"], default="claude-code")
    _scope(uninstall, None)
    uninstall.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    uninstall.set_defaults(func="eurekamem.cli.hooks:cmd_uninstall")

    status = hooks_sub.add_parser("status", help="the hooks installed in each scope, and where the sessions here go")
    status.add_argument("agent", nargs="?", choices=["claude-code"], default="claude-code")
    status.add_argument("--project-dir", help="the project whose settings to read (default: the working directory)")
    status.add_argument("--json", action="store_true", help="as JSON")
    status.set_defaults(func="eurekamem.cli.hooks:cmd_status")



def add_hook(sub: Any, name: str, help_line: str) -> None:
    """`hook`, the command Claude Code runs (cli/main.py's COMMANDS): its flags are the integration's."""
    from ..integrations.claude_code.command import add_hook_flags

    hook = sub.add_parser(name, help=help_line)
    add_hook_flags(hook)
    hook.set_defaults(func="eurekamem.cli.hooks:cmd_hook")


def _scope(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument("--scope", choices=["user", "project", "local"], default=default,
                   help="user: ~/.claude/settings.json; project: .claude/settings.json; local: .claude/settings.local.json"
                        + (f" (default: {default})" if default else " (default: every scope)"))
    p.add_argument("--project-dir", help="the project for --scope project or local (default: the working directory)")


def _report(change: Any, dry_run: bool) -> None:
    verb = "would change" if dry_run else ("wrote" if change.written else "unchanged")
    print(f"{verb} {change.path}")
    for event, what in change.events.items():
        print(f"  {event}: {what}")


def cmd_install(args: argparse.Namespace) -> int:
    from ..integrations.claude_code import settings

    flags: list[str] = []
    for name in ("domain", "socket", "data_dir"):
        value = getattr(args, name)
        if value:
            flags += [f"--{name.replace('_', '-')}", value]
    if args.post_tool_use:
        flags.append("--post-tool-use")
    try:
        path = settings.settings_path(args.scope, args.project_dir)
        change = settings.install(path, settings.command_line(flags), post_tool_use=args.post_tool_use, dry_run=args.dry_run)
    except settings.SettingsError as exc:
        return fail(str(exc))
    _report(change, args.dry_run)
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    from ..integrations.claude_code import settings

    status = 0
    for scope in [args.scope] if args.scope else list(settings.SCOPES):
        try:
            change = settings.uninstall(settings.settings_path(scope, args.project_dir), dry_run=args.dry_run)
        except settings.SettingsError as exc:
            status = fail(str(exc))
            continue
        if change.events:
            _report(change, args.dry_run)
        else:
            print(f"none in {change.path}")
    return status


def cmd_status(args: argparse.Namespace) -> int:
    import os

    from ..integrations.claude_code import events, settings

    doc: dict[str, Any] = {
        "scopes": {scope: settings.status(settings.settings_path(scope, args.project_dir)) for scope in settings.SCOPES},
        "domain_here": events.project_domain(args.project_dir or os.getcwd()),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    for scope, st in doc["scopes"].items():
        where = st["path"] + ("" if st["exists"] else " (no file)")
        print(f"{scope}: {where}")
        if "error" in st:
            print(f"  {st['error']}")
        for event, hooks in st["ours"].items():
            for hook in hooks:
                print(f"  {event}: {hook['command']} (timeout {hook['timeout']} s)")
        if not st["ours"] and "error" not in st:
            print("  no eurekamem hooks")
        for event, n in st["others"].items():
            print(f"  {event}: {n} other hook{'s' if n != 1 else ''}, kept")
    print(f"sessions started here use the domain and group {doc['domain_here']!r} (unless installed with --domain)")
    return 0


def cmd_hook(args: argparse.Namespace) -> int:
    from ..integrations.claude_code.command import run

    return run(args, sys.stdin, sys.stdout, sys.stderr)
