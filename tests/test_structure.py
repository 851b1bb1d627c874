"""The house's shape, read from the imports as files (the tree is the package `eurekamem`, and it
imports itself package-relatively, so each import names a file of this tree).

Run as a script it prints the structure: each package with its modules' lines, the arrows between
packages (how many imports each way) and every import circle between modules:

    python tests/test_structure.py

As tests it keeps the layering (protocol imports nothing of ours, the client only protocol, the
daemon not the CLI, the search library no tier), that no module circle comes back, and that no
module imports another package's private module or another module's private name.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import Counter
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "client", "daemon", "cli", "integrations", "ui")


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name relative to the top ("daemon.memory.state")."""
    out = {"": REPO / "__init__.py"} if (REPO / "__init__.py").is_file() else {}  # (a tree from before it had one)
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for all the tests of this file (parsing is most of their time)."""
    return ast.parse(path.read_text(), str(path))


def _package_of(name: str, path: Path) -> list[str]:
    parts = name.split(".") if name else []
    return parts if path.name == "__init__.py" else parts[:-1]


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of this tree that `name` imports (a `from .x import y` that names a submodule y
    counts as importing it)."""
    found: set[str] = set()
    package = _package_of(name, path)
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = [*base, *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.split(".")[0] == "eurekamem":
                target = node.module.split(".")[1:]
            else:
                continue
            dotted = ".".join(target)
            for alias in node.names:
                sub = f"{dotted}.{alias.name}" if dotted else alias.name
                found.add(sub if sub in known else dotted)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "eurekamem":
                    found.add(".".join(alias.name.split(".")[1:]))
    return {f for f in found if f in known and f != name}


def graph() -> nx.DiGraph:
    known = modules()
    g = nx.DiGraph()
    for name, path in known.items():
        g.add_node(name, lines=len(path.read_text().splitlines()))
        for target in imports(name, path, known):
            g.add_edge(name, target)
    return g


def _top(name: str) -> str:
    return name.split(".")[0] or "(top)"


def circles(g: nx.DiGraph) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)


def report() -> str:
    g = graph()
    out = ["packages (lines; the largest modules):"]
    for package in ("(top)", *PACKAGES):
        names = [n for n in g if _top(n) == package]
        sizes = sorted(((g.nodes[n]["lines"], n) for n in names), reverse=True)
        largest = ", ".join(f"{n or '__init__'} {lines}" for lines, n in sizes[:5])
        out.append(f"  {package:<13} {sum(s for s, _ in sizes):>6}  {len(names):>3} modules  {largest}")
    out.append("the daemon's parts (lines; modules; the largest):")
    parts = sorted({n.split(".")[1] if n.count(".") >= 2 else "(its own modules)" for n in g if _top(n) == "daemon"})
    for part in parts:
        names = [n for n in g if _top(n) == "daemon" and (n.split(".")[1] if n.count(".") >= 2 else "(its own modules)") == part]
        sizes = sorted(((g.nodes[n]["lines"], n) for n in names), reverse=True)
        largest = ", ".join(f"{n.removeprefix('daemon.')} {lines}" for lines, n in sizes[:3])
        out.append(f"  {part:<18} {sum(s for s, _ in sizes):>6}  {len(names):>3}  {largest}")
    arrows = Counter((_top(a), _top(b)) for a, b in g.edges if _top(a) != _top(b))
    out.append("arrows between packages (imports):")
    out += [f"  {a} -> {b}: {count}" for (a, b), count in sorted(arrows.items())]
    found = circles(g)
    out.append(f"module circles: {len(found)}")
    out += [f"  {' <-> '.join(c)}" for c in found]
    return "\n".join(out)


def test_the_layers_point_one_way() -> None:
    g = graph()
    allowed = {
        "protocol": set(),
        "client": {"protocol", "(top)"},
        "integrations": {"protocol", "client", "(top)"},
        "ui": {"protocol", "client", "(top)"},
        "daemon": {"protocol", "client", "(top)"},
        "cli": {"protocol", "client", "daemon", "integrations", "ui", "(top)"},
    }
    # a package's __main__ is a command (`python -m eurekamem.daemon backup` hands the commands other
    # than serve to the CLI), run and never imported: it sits above every layer
    wrong = [
        (a, b) for a, b in g.edges
        if not a.endswith("__main__") and _top(b) != _top(a) and _top(b) not in allowed[_top(a)]
    ]
    assert not wrong, wrong


def test_the_search_library_imports_no_tier() -> None:
    """daemon/retrieval/ is below every tier: tier 4, the conversation tier, the skills registry
    and the jobs import it, never the other way round."""
    g = graph()
    tiers = ("daemon.memory", "daemon.conversation", "daemon.skills", "daemon.jobs", "daemon.tiers", "daemon.tier")
    assert any(a.startswith("daemon.retrieval") for a, _ in g.edges)
    wrong = [
        (a, b) for a, b in g.edges
        if a.startswith("daemon.retrieval") and any(b == t or b.startswith(t + ".") for t in tiers)
    ]
    assert not wrong, wrong


def test_the_conversation_tier_and_the_skills_registry_borrow_nothing_of_tier_4() -> None:
    """They search with daemon/retrieval/ as tier 4 does; only the jobs, which write memories, and
    the daemon's wiring import daemon/memory/."""
    g = graph()
    wrong = [
        (a, b) for a, b in g.edges
        if a.startswith(("daemon.conversation", "daemon.skills")) and b.startswith("daemon.memory")
    ]
    assert not wrong, wrong


def test_no_module_imports_another_in_a_circle() -> None:
    """A circle means neither module can be read, tested or moved without the other; a lazy import
    inside a function hides one at run time, not here."""
    assert circles(graph()) == []


def private_imports() -> list[str]:
    """Imports that reach past a package's public surface: a module whose name starts with `_` taken
    from outside the package that holds it, or a `_name` taken from another module."""
    known = modules()
    wrong = []
    for name, path in known.items():
        package = _package_of(name, path)
        for node in ast.walk(parsed(path)):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                target = [*package[: len(package) - node.level + 1], *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.split(".")[0] == "eurekamem":
                target = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                whole = [*target, alias.name]
                module = whole if ".".join(whole) in known else target
                private = [i for i, part in enumerate(module) if part.startswith("_") and not part.startswith("__")]
                if private and name.split(".")[: private[0]] != module[: private[0]]:
                    wrong.append(f"{name} imports the private module {'.'.join(module)}")
                elif module is target and alias.name.startswith("_") and not alias.name.startswith("__"):
                    wrong.append(f"{name} imports the private name {alias.name} of {'.'.join(target)}")
    return wrong


def test_no_module_imports_past_a_package_surface() -> None:
    """A private module (`protocol/_records.py`) is read through its package's `__init__`, and a
    private name stays in its module: otherwise the underscore promises nothing, and a module cannot
    change its insides without a search through every importer."""
    assert private_imports() == []


def test_the_import_reader_sees_the_arrows_it_should() -> None:
    """A guard on the reader itself: known arrows must be found, or the other tests prove nothing."""
    g = graph()
    assert g.has_edge("daemon.app", "daemon.config")
    assert g.has_edge("client", "protocol")
    assert g.number_of_edges() > 200
    assert "protocol._records" in modules() and "client._paths" in modules()  # the private modules it guards


if __name__ == "__main__":
    print(report())
    sys.exit(0)
