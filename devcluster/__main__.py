"""``python -m devcluster build|up|down|status|gomod``."""

from devcluster._cli import main

raise SystemExit(main())
