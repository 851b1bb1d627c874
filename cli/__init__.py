"""The `eurekamem` command line: `eurekamem.cli.main:main` is the console script."""
