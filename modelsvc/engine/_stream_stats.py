"""Triton's ``response_stats`` for decoupled models: per response index ("0", "1", ...), how long the model took to
compute it and to hand its outputs over, and whether it succeeded, failed, was empty or was cancelled.

As Triton counts them: a response's compute time runs from the previous response of the same request (from the
start of ``execute`` for the first one) to its send; ``compute_output`` is the time the server took to check and
take its outputs; ``success`` and ``fail`` count the sum of both; ``empty_response`` counts a final flag sent
without a response (its compute time); ``cancel`` counts a request whose client went away before its final
response, at the index of the response it was waiting for (its duration: the time taken to cancel it here).
The statistics (HTTP ``/v2/models/{m}/stats``, gRPC ``ModelStatistics``) show ``response_stats`` for decoupled
models only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..scheduler import Duration

_KINDS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")


@dataclass(slots=True)
class ResponseStat:
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)

    def as_json(self) -> dict[str, dict[str, int]]:
        return {kind: getattr(self, kind).as_json() for kind in _KINDS}


class ResponseStats:
    """The ``response_stats`` of one model version, keyed by response index."""

    __slots__ = ("by_index",)

    def __init__(self) -> None:
        self.by_index: dict[int, ResponseStat] = {}

    def _at(self, index: int) -> ResponseStat:
        stat = self.by_index.get(index)
        if stat is None:
            stat = self.by_index[index] = ResponseStat()
        return stat

    def response(self, index: int, infer_ns: int, output_ns: int, ok: bool) -> None:
        stat = self._at(index)
        stat.compute_infer.add(infer_ns)
        stat.compute_output.add(output_ns)
        (stat.success if ok else stat.fail).add(infer_ns + output_ns)

    def empty(self, index: int, infer_ns: int) -> None:
        stat = self._at(index)
        stat.compute_infer.add(infer_ns)
        stat.empty_response.add(infer_ns)

    def cancelled(self, index: int, ns: int) -> None:
        self._at(index).cancel.add(ns)

    def as_json(self) -> dict[str, Any]:
        return {str(index): self.by_index[index].as_json() for index in sorted(self.by_index)}
