"""`python -m rlightning` is the `rlightning` command."""

import sys

from rlightning.cli import main

sys.exit(main())
