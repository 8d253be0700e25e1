"""A benchmark's ``__main__``: its exit status, 130 on Ctrl-C, and 2 with the traceback on any other error (so a
crash is told apart from a benchmark that ran and failed its checks, status 1)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import NoReturn


def run(main: Callable[[], int]) -> NoReturn:
    try:
        status = main()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:
        traceback.print_exc()
        sys.exit(2)
    sys.exit(status)
