"""``python -m modelsvc.server.ingest SPEC INDEX INPUTS_FD OUTPUTS_FD``: one ingest worker, as the engine starts it."""

import sys

from ._worker import main

sys.exit(main(sys.argv[1:]))
