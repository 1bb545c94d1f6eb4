"""``python -m ragsieve.cli ...``: the ``ragsieve`` command without its console script (tests, checkouts)."""

import sys

from ragsieve.cli import main

sys.exit(main())
