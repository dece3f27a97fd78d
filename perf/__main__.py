"""``python -m perf [--quick] [--only NAME ...]``: every benchmark of the registry in :mod:`perf.suite`, each in its
own subprocess, then one summary table, ``perf/results/suite.json`` and the generated section of
``docs/performance.md``. Run from the repository root."""

import sys

from perf.suite import main

sys.exit(main())
