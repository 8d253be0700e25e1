"""``python -m loadtests.abuse``: see bench.py."""

import sys

from loadtests.abuse.bench import main

sys.exit(main())
