"""``modelsvc serve --workers N``: the ingest workers against one process (``python -m loadtests.ingest``)."""
