"""``python -m loadtests.fuzz``: see run.py."""

import sys

from loadtests.fuzz.run import main

sys.exit(main())
