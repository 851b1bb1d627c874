"""The Daemon only wires: every part gets its collaborators when it is made (issue 24, section 3).

Read from the source, so a part wired later by an attribute set from daemon/app.py (`actor.x = y`,
what the daemon once did for 13 collaborators) fails here, as does a collaborator typed Any in the
constructors the daemon calls."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

DAEMON = Path(__file__).resolve().parent.parent / "daemon"


def _attribute_sets(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, target) of every assignment to an attribute of anything but `self` itself."""
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and not (isinstance(target.value, ast.Name) and target.value.id == "self"):
                found.append((node.lineno, ast.unparse(target)))
    return found


@pytest.mark.unit
def test_the_daemon_sets_no_attribute_of_another_part() -> None:
    tree = ast.parse((DAEMON / "app.py").read_text())
    # not wiring: dispatch stamps a review call's peer_uid into its params, and the shutdown gives
    # the actors' nursery its grace period
    allowed = {"call.params", "system.cancel_scope.deadline"}
    assert [(line, target) for line, target in _attribute_sets(tree) if target not in allowed] == []


@pytest.mark.unit
def test_the_parts_the_daemon_makes_take_typed_collaborators() -> None:
    from eurekamem.daemon.accept import Acceptor
    from eurekamem.daemon.conversation.actor import ConversationActor
    from eurekamem.daemon.memory.actor import MemoryActor
    from eurekamem.daemon.snapshots import Snapshots
    from eurekamem.daemon.sys_calls import SysCalls
    from eurekamem.daemon.tiers.episodic import EpisodicActor

    collaborators = {
        MemoryActor: ("conversation", "jobs", "redactor", "on_purge", "loops"),
        ConversationActor: ("trigger",),
        EpisodicActor: ("jobs",),
        Snapshots: ("memory", "skills", "conversation", "persistent", "graph", "jobs", "purged"),
        SysCalls: ("acceptor", "redactor", "journal_actor"),
        Acceptor: ("config", "limits", "dispatch", "stats"),
    }
    # the durable tiers' parts reach SysCalls after the load (serve_durable: PostgreSQL may come later)
    durable = {SysCalls.serve_durable: ("memory", "skills", "conversation", "jobs", "snapshots")}
    untyped = []
    for cls, names in [*collaborators.items(), *durable.items()]:
        parameters = inspect.signature(cls if not isinstance(cls, type) else cls.__init__).parameters
        for name in names:
            annotation = parameters[name].annotation
            if annotation in ("Any", "Any | None") or "Any" in str(annotation).replace("dict[str, Any]", ""):
                untyped.append(f"{cls.__name__}({name}: {annotation})")
    assert untyped == []
