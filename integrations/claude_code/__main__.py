"""`python -m eurekamem.integrations.claude_code`: the hook command (see command.py)."""

import sys

from .command import main

sys.exit(main())
