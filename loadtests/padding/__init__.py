"""Padding-aware batching (issue 14): ``python -m loadtests.padding`` (``bench``). The models and the check of
every answer (``_models``), the closed-loop client (``_load``) and the doc_classifier rows (``_service``)."""
