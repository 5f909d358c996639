"""`python -m loadtest.preflight ...` (make preflight): the command line of loadtest/preflight/cli.py."""

import sys

from loadtest.preflight.cli import main

sys.exit(main())
