"""``python -m loadtests.grid``: see bench.py."""

from loadtests.grid.bench import main
from loadtests.harness._main import run

run(main)
