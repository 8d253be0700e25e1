"""The response cache: identical requests to a model that enables it are answered without running it.

Enabled as in Triton, on both sides: the server gets a cache with ``--cache-config local,size=BYTES``
(one cache shared by every model), and a model uses it when its ``config.pbtxt`` says
``response_cache { enable: true }``. A model that enables it on a server without a cache loads with a
warning and runs uncached. Enabling it states that the model is deterministic: the same request gets
the same answer.

The key is a SHA-256 digest of everything that can change the answer: model name and version, every
input's name, datatype, shape and bytes (inputs in name order, so their order in the request does not
matter), the outputs asked for, and the request's parameters except those that only steer scheduling or
encoding (``priority``, ``timeout``, ``binary_data_output``). Triton hashes with 64 bits; with SHA-256 no
two requests share a key by chance, nor can a client craft one that takes another's answer. (SHA-256
runs on the CPU's SHA instructions where it has them: about 1.5 GB/s, twice BLAKE2b's speed here.)

Only successful answers are stored. The cache is LRU over a byte budget: an entry costs its output
bytes (for BYTES tensors, their elements' lengths plus Python's per-object overhead) plus a fixed
allowance for the key and bookkeeping; the least recently used entries go when a new one needs room,
and an answer larger than the whole budget is not stored. Stored and returned tensors are copies, so
a caller that changes its arrays cannot change the cache. Everything runs on the server's event loop,
so nothing here locks.

Statistics and metrics follow Triton's: a hit counts as a success and in ``cache_hit`` (with the time
to find and copy the answer), not in inference or execution counts; a miss counts in ``cache_miss``
(with the time to look up and to store the answer) and runs the model as usual.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backends import ModelConfig
from ..protocol import InferRequest, Tensor, serialize_bytes_tensor

if TYPE_CHECKING:
    from ..scheduler import ModelStats

logger = logging.getLogger("modelsvc.cache")

#: request parameters that do not change a model's answer, left out of the key
NEUTRAL_PARAMETERS = frozenset({"priority", "timeout", "binary_data_output"})
#: bytes counted per entry on top of its tensors (key, dictionary slot, response object)
ENTRY_OVERHEAD = 256
#: bytes counted per tensor of an entry (name, shape, array header)
TENSOR_OVERHEAD = 128
#: bytes counted per element of a BYTES tensor (a Python bytes object)
OBJECT_OVERHEAD = 40


class CacheConfigError(ValueError):
    """A ``--cache-config`` value that cannot be used."""


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """What ``--cache-config`` says: the cache implementation and its settings."""

    kind: str = "local"
    """``local``, the only implementation here (Triton's in-process LRU cache)."""
    size: int = 0
    """The byte budget; 0 turns the cache off."""


def parse_cache_config(values: Sequence[str]) -> CacheSettings | None:
    """Read tritonserver's ``--cache-config <cache>,<key>=<value>`` flags (repeatable); None without any.

    Only the ``local`` cache exists here and it takes one setting, ``size`` in bytes.
    """
    if not values:
        return None
    kind = ""
    size: int | None = None
    for value in values:
        name, sep, setting = value.partition(",")
        name = name.strip()
        if not sep or not name:
            raise CacheConfigError(
                f"--cache-config takes <cache>,<key>=<value> (like local,size=1048576), got {value!r}"
            )
        if name != "local":
            raise CacheConfigError(f"--cache-config: cache '{name}' is not available; modelsvc has the 'local' cache")
        if kind and name != kind:
            raise CacheConfigError(f"--cache-config names two caches, '{kind}' and '{name}'")
        kind = name
        key, eq, text = setting.partition("=")
        if not eq or key.strip() != "size":
            raise CacheConfigError(f"--cache-config: the local cache takes size=<bytes>, got {setting!r}")
        try:
            size = int(text.strip())
        except ValueError:
            raise CacheConfigError(f"--cache-config: size must be a whole number of bytes, got {text!r}") from None
        if size < 0:
            raise CacheConfigError(f"--cache-config: size cannot be negative, got {size}")
    if size is None:
        raise CacheConfigError("--cache-config: the local cache needs size=<bytes>")
    return CacheSettings(kind, size)


@dataclass(slots=True)
class _Entry:
    outputs: list[Tensor]
    cost: int


@dataclass(slots=True)
class ResponseCache:
    """One LRU store of answers for every model that uses it, within ``capacity`` bytes."""

    capacity: int
    used: int = 0
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    lookup_ns: int = 0
    insert_ns: int = 0
    _entries: OrderedDict[bytes, _Entry] = field(default_factory=OrderedDict)

    @classmethod
    def from_settings(cls, settings: CacheSettings | None) -> ResponseCache | None:
        """The server's cache, or None when ``--cache-config`` is absent or its size is 0."""
        if settings is None or settings.size == 0:
            return None
        return cls(settings.size)

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def utilization(self) -> float:
        """Share of the byte budget in use, 0.0 to 1.0."""
        return self.used / self.capacity if self.capacity else 0.0

    def lookup(
        self, model: str, version: str, request: InferRequest, wanted: Sequence[str], stats: ModelStats
    ) -> tuple[bytes, list[Tensor] | None]:
        """The request's key and, on a hit, copies of the stored outputs (None on a miss); counts either."""
        start = time.perf_counter_ns()
        key = request_key(model, version, request, wanted)
        entry = self._entries.get(key)
        self.lookups += 1
        if entry is None:
            elapsed = time.perf_counter_ns() - start
            self.misses += 1
            self.lookup_ns += elapsed
            stats.cache_miss.add(elapsed)
            return key, None
        self._entries.move_to_end(key)
        outputs = [_copy(t) for t in entry.outputs]
        elapsed = time.perf_counter_ns() - start
        self.hits += 1
        self.lookup_ns += elapsed
        stats.cache_hit.add(elapsed)
        return key, outputs

    def insert(self, key: bytes, outputs: Sequence[Tensor], stats: ModelStats) -> None:
        """Store copies of a successful answer under ``key``, making room by evicting the oldest entries."""
        start = time.perf_counter_ns()
        stored = [_copy(t) for t in outputs]
        cost = ENTRY_OVERHEAD + sum(_tensor_cost(t) for t in stored)
        if cost <= self.capacity:
            old = self._entries.pop(key, None)
            if old is not None:  # two identical requests missed together; keep the newer answer
                self.used -= old.cost
            while self.used + cost > self.capacity:
                _, evicted = self._entries.popitem(last=False)
                self.used -= evicted.cost
                self.evictions += 1
            self._entries[key] = _Entry(stored, cost)
            self.used += cost
        elapsed = time.perf_counter_ns() - start
        self.insert_ns += elapsed
        stats.cache_miss.add(elapsed, 0)  # the same miss: its time grows, its count does not


def warn_if_uncached(cache: ResponseCache | None, config: ModelConfig, label: str) -> None:
    """Log a warning when ``label`` (a model version) enables response_cache but the server has no cache."""
    if cache is None and config.HasField("response_cache") and config.response_cache.enable:
        logger.warning(
            "%s enables response_cache, but the server has no cache (start it with --cache-config "
            "local,size=BYTES): it runs uncached",
            label,
        )


def request_key(model: str, version: str, request: InferRequest, wanted: Sequence[str]) -> bytes:
    """A 32-byte digest of all that determines a request's answer (see the module's description)."""
    digest = hashlib.sha256()
    digest.update("\0".join([model, version, *wanted, ""]).encode())
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        digest.update(f"{tensor.name}\0{tensor.datatype}\0{tensor.shape}\0".encode())
        data = tensor.data
        if data.dtype == np.object_:
            digest.update(serialize_bytes_tensor(data))
        else:
            digest.update(np.ascontiguousarray(data).view(np.uint8).reshape(-1).data)
    params = request.parameters
    if params:
        relevant = sorted((k, repr(v)) for k, v in params.items() if k not in NEUTRAL_PARAMETERS)
        if relevant:
            digest.update(repr(relevant).encode())
    return digest.digest()


def _copy(tensor: Tensor) -> Tensor:
    return Tensor(tensor.name, tensor.datatype, tensor.shape, tensor.data.copy(), dict(tensor.parameters))


def _tensor_cost(tensor: Tensor) -> int:
    data: np.ndarray[Any, Any] = tensor.data
    cost = TENSOR_OVERHEAD + data.nbytes
    if data.dtype == np.object_:
        cost += sum(len(item) + OBJECT_OVERHEAD for item in data.reshape(-1))
    return cost
