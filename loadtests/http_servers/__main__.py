"""``python -m loadtests.http_servers``: see bench.py."""

import sys

from loadtests.http_servers.bench import main

sys.exit(main())
