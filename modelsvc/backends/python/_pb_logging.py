"""pb_utils logging and custom metrics: ``Logger`` writes into the server's log (logger
``modelsvc.python_model``); ``MetricFamily`` and ``Metric`` count in the process."""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Sequence

from ._pb_errors import TritonModelException

logger = logging.getLogger("modelsvc.python_model")


class Logger:
    """Log from a model into the server's log (logger ``modelsvc.python_model``); verbose is DEBUG."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        python_level = {
            Logger.LogLevel.WARNING: logging.WARNING,
            Logger.LogLevel.ERROR: logging.ERROR,
            Logger.LogLevel.VERBOSE: logging.DEBUG,
        }.get(Logger.LogLevel(level), logging.INFO)
        logger.log(python_level, "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        logger.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        logger.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        logger.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        logger.debug("%s", message)


class Metric:
    """One labelled series of a MetricFamily. Counts in the process; not exported on /metrics."""

    def __init__(self, kind: int, labels: dict[str, str], buckets: Sequence[float] | None) -> None:
        self.labels = labels
        self._kind = kind
        self._value = 0.0
        self._lock = threading.Lock()

    def increment(self, value: float) -> None:
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a counter cannot go down")
        with self._lock:
            self._value += value

    def set(self, value: float) -> None:
        if self._kind != MetricFamily.GAUGE:
            raise TritonModelException("only a gauge can be set")
        with self._lock:
            self._value = value

    def observe(self, value: float) -> None:
        with self._lock:
            self._value += value

    def value(self) -> float:
        return self._value


class MetricFamily:
    """Triton's custom metrics API. The values live in the process; modelsvc does not export them yet."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name
        self.description = description
        self.kind = kind

    def Metric(self, labels: dict[str, str] | None = None, buckets: Sequence[float] | None = None) -> Metric:
        return Metric(self.kind, dict(labels or {}), buckets)
