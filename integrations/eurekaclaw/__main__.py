"""`python -m eurekamem.integrations.eurekaclaw ARGS...`: EurekaClaw's own `eurekaclaw ARGS...`
command (its console script, `eurekaclaw.cli:main`), with install() done first. Exit status 2 and
a message on stderr when EurekaClaw is not importable."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Callable
from typing import Any

from . import install


def _eurekaclaw_main() -> Callable[..., Any] | None:
    """EurekaClaw's console script as installed (its entry point), else eurekaclaw.cli:main."""
    for entry in importlib.metadata.entry_points(group="console_scripts", name="eurekaclaw"):
        return entry.load()  # type: ignore[no-any-return]
    try:
        main = importlib.import_module("eurekaclaw.cli").main
    except ImportError as exc:
        if exc.name is not None and (exc.name == "eurekaclaw" or exc.name.startswith("eurekaclaw.")):
            return None
        raise
    return main if callable(main) else None


def run(argv: list[str]) -> int:
    install()
    main = _eurekaclaw_main()
    if main is None:
        print(
            "eurekamem: EurekaClaw is not importable in this environment "
            "(install it here, e.g. `pip install -e <your EurekaClaw checkout>`)",
            file=sys.stderr,
        )
        return 2
    sys.argv = ["eurekaclaw", *argv]
    try:
        result = main()
    except SystemExit as done:  # click's commands end this way
        code = done.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
        return code if isinstance(code, int) else (0 if code is None else 1)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
