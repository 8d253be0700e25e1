"""What the tests of ``modelsvc build`` (tests/tools/test_build*.py) share: the services' folder, whose configs they
build from, and the check that a call fails with a given usage error.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from modelsvc.tools.trt import BuildUsageError
from tests._server import ROOT

SERVICES = ROOT / "services"


def usage(match: str) -> Any:
    return pytest.raises(BuildUsageError, match=re.escape(match))
