"""``python -m heapstate``: the heapstate command line (the same as the ``heapstate`` script)."""

from heapstate.cli import main

raise SystemExit(main())
