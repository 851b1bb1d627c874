import sys

from eurekamem.cli.main import main

sys.exit(main())
