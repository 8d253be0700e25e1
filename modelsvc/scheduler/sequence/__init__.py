"""Triton's sequence batcher (``sequence_batching``): requests of stateful models routed by correlation id to
sequence slots that live across requests.

``_sequence`` (``SequenceScheduler``, the scheduler of one model version), ``_sequence_config``
(``SequenceSettings``: the config's controls, states and strategy, checked at load), ``_sequence_rows`` (the
tensors of a batch's rows, pure) and ``_sequence_slots`` (sequences, their requests and the instances' slots).
Public through :mod:`modelsvc.scheduler`.
"""
