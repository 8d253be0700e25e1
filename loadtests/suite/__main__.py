"""``python -m loadtests.suite``: see bench.py."""

import sys

from loadtests.suite.bench import main

sys.exit(main())
