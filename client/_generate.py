"""Writes _async_calls.py from _calls.py: the AsyncClient's convenience methods are the Client's, awaited.

Rule kept here: the transformation is textual and total, so the generated module keeps the source's
signatures, docstrings and comments exactly; every `def` of the class becomes `async def`, every
`self._run(` becomes `await self._run(`, and a source line this does not understand (a nested
function, a lambda, a call of another method of self) stops the generation instead of producing a wrong
client. Run `make client-calls` after editing _calls.py: it runs this file as a plain script (it
imports only the standard library), which works even while the package cannot import for want of
the generated module; tests/test_client_unit.py fails while the checked-in module differs from what
this writes.
"""

from __future__ import annotations

import re
from pathlib import Path

SOURCE = Path(__file__).with_name("_calls.py")
TARGET = Path(__file__).with_name("_async_calls.py")

_HEADER = '''"""The AsyncClient's convenience methods: generated from _calls.py by _generate.py; do not edit.

Run `make client-calls` after changing _calls.py (tests/test_client_unit.py fails while this file is
stale). Each method is its blocking twin's, as a coroutine: the same signature, docstring and op_*
builder, its request awaited through `self._run`.
"""
'''

# A method of the class, or the `_run` it declares for the type checker (under `if TYPE_CHECKING:`).
_METHOD = re.compile(r"^(    )def |^(        )def _run\(")
_DEF = re.compile(r"^\s*(async\s+)?def\s|\blambda\b")
_SELF_CALL = re.compile(r"self\.(\w+)\(")


def async_calls(source: str) -> str:
    """The text of _async_calls.py for the text of _calls.py."""
    if not source.startswith('"""'):
        raise ValueError("_calls.py must start with its docstring")
    end = source.index('"""', 3) + 3
    first = source.count("\n", 0, end) + 1  # the line number of the first line after the docstring
    lines = [_async_line(line, number) for number, line in enumerate(source[end:].split("\n"), start=first)]
    return _HEADER.rstrip("\n") + "\n".join(lines)


def _async_line(line: str, number: int) -> str:
    stripped = line.lstrip()
    if stripped.startswith("class Calls"):
        return line.replace("class Calls", "class AsyncCalls", 1)
    if '"""The convenience calls of the blocking Client,' in line:
        return line.replace("of the blocking Client,", "of the AsyncClient,", 1)
    if stripped.startswith('__all__ = '):
        return line.replace('"Calls"', '"AsyncCalls"')
    if _DEF.search(line):
        if not _METHOD.match(line):
            raise ValueError(f"_calls.py line {number}: only methods of Calls may be defined: {line.strip()}")
        line = line.replace("def ", "async def ", 1)
    for name in _SELF_CALL.findall(line):
        if name != "_run":
            raise ValueError(f"_calls.py line {number}: a call may only go through self._run: {line.strip()}")
    return line.replace("self._run(", "await self._run(")


def main() -> None:
    TARGET.write_text(async_calls(SOURCE.read_text()))


if __name__ == "__main__":
    main()
