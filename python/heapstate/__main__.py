"""``python -m heapstate``: the heapstate command line."""

from heapstate.cli import main

raise SystemExit(main())
