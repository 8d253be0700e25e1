"""``logicd`` command line: ``serve`` runs one logic server; ``up`` runs a service's pair locally; ``new`` writes a
new service from a template; ``plan`` works out nodes, pod packing and cost from measured capacity.

    logicd serve SERVICE_DIR [--host H] [--port P] [--model-url URL]
    logicd up SERVICE_DIR [--host H] [--port P]
    logicd new NAME [--template text-classifier|embedder|blank] [--no-input] [--force] [-o DIR]
    logicd plan PLAN.yaml [--json] [--summary] [--picture FILE.svg] [--write-values DIR [--values-option O]]
    logicd plan --example [default|accelerators]

SERVICE_DIR is a service's folder (its ``service.yaml`` is read) or the ``.yaml`` file itself; omitted, the
file named by ``$LOGICD_CONFIG`` is read, else ``./service.yaml``. ``LOGICD_`` overrides apply, and the flags
override those. Exit status: 0 after a requested stop, 2 when the configuration or the service's code is
wrong (the message names the key or the import) or a plan cannot be made, 1 when a server fails at run time.
"""

from .._config import CONFIG_ENV
from ._loading import CONFIG_FILE, RUN_ERROR, USAGE_ERROR, config_path, with_overrides
from ._main import main
from ._up import EXAMPLE_FILE, free_port

__all__ = [
    "CONFIG_ENV",
    "CONFIG_FILE",
    "EXAMPLE_FILE",
    "RUN_ERROR",
    "USAGE_ERROR",
    "config_path",
    "free_port",
    "main",
    "with_overrides",
]
