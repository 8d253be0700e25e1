"""``python -m loadtests.backends``: see bench.py."""

import sys

from loadtests.backends.bench import main

sys.exit(main())
