"""`python -m eurekamem.daemon`: `serve` starts the daemon without the CLI (daemon/foreground.py).

Rule kept here: the daemon does not need the CLI to start. Any other command (`backup`, `status`,
...) is the `eurekamem` command's, which `python -m eurekamem.daemon` has always run too; only
then is the CLI imported, so that those command lines keep working.
"""

import sys


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        from .foreground import main as serve_main

        return serve_main(argv)
    from ..cli.main import main as cli_main  # the other commands are the CLI's

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
