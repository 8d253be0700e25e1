"""``python -m loadtests.services``: see bench.py."""

import sys

from loadtests.services.bench import main

sys.exit(main())
