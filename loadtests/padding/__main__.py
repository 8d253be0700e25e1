"""``python -m loadtests.padding``: see bench.py."""

import sys

from loadtests.padding.bench import main

sys.exit(main())
