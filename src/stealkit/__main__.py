"""``python -m stealkit ...`` is the ``stealkit`` command (e.g. from a source tree: ``PYTHONPATH=src python -m stealkit``)."""

import sys

from stealkit.cli import main

sys.exit(main())
