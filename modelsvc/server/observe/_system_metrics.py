"""GPU and CPU metrics with Triton's names, sampled every ``--metrics-interval-ms``.

Three parts, so that the code only a GPU runs stays small:

- readers that return plain records: ``CpuReader`` (machine-wide, from /proc/stat and /proc/meminfo, as
  Triton's CPU metrics) here, and the NVML reader in ``_nvml`` (GPU-only) that returns one ``GpuRecord`` per GPU;
- ``SystemMetrics``, the sampler: it calls the readers on a worker thread every interval, from a task on the
  server's event loop, and keeps the latest records;
- ``gpu_families`` and ``cpu_families``: records to Prometheus families (pure).

Units are Triton's: utilization as a ratio 0..1, memory in bytes, power in watts, energy in joules since the
server started (a counter).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from prometheus_client.metrics_core import Metric

logger = logging.getLogger("modelsvc")

DEFAULT_INTERVAL_MS = 2000
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """One GPU at one moment, in Triton's units; None where the GPU does not report that value."""

    uuid: str
    utilization: float | None
    """0..1 (NVML gives percent)."""
    memory_total_bytes: int
    memory_used_bytes: int
    power_usage_watts: float | None
    power_limit_watts: float | None
    energy_joules: float | None
    """Total energy since the driver loaded (NVML's counter, in joules); the exposition counts from the first sample."""


@dataclass(frozen=True, slots=True)
class CpuRecord:
    """The machine's CPUs and memory at one moment."""

    utilization: float
    """0..1, all cores together, over the time since the previous sample."""
    memory_total_bytes: int
    memory_used_bytes: int


class GpuReader(Protocol):
    """What the sampler needs of a GPU reader (``_nvml.NvmlReader`` on a GPU machine)."""

    def read(self) -> list[GpuRecord]: ...

    def close(self) -> None: ...


class GpuMetricsUnavailable(Exception):
    """No GPU metrics on this machine; the message says why (one INFO line in the log)."""


# -- CPU: /proc -------------------------------------------------------------------------------------


class ProcFormatError(ValueError):
    """/proc/stat or /proc/meminfo does not read as Linux writes it."""


def parse_proc_stat(text: str) -> tuple[int, int]:
    """``(busy, total)`` clock ticks of all CPUs together from /proc/stat's ``cpu`` line.

    Idle time is ``idle`` + ``iowait``; ``guest`` and ``guest_nice`` are already inside ``user`` and ``nice``,
    so they are not counted twice."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            try:
                ticks = [int(v) for v in fields[1:]]
            except ValueError:
                raise ProcFormatError(
                    f"/proc/stat: the cpu line holds a value that is not a number: {line!r}"
                ) from None
            if len(ticks) < 4:
                raise ProcFormatError(f"/proc/stat: the cpu line has {len(ticks)} fields, expected at least 4")
            total = sum(ticks[:8])  # user nice system idle iowait irq softirq steal
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            return total - idle, total
    raise ProcFormatError("/proc/stat has no 'cpu' line")


def parse_meminfo(text: str) -> tuple[int, int]:
    """``(total, used)`` bytes from /proc/meminfo: used is MemTotal - MemAvailable, as Triton reports it."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in ("MemTotal", "MemAvailable") and parts:
            try:
                number = int(parts[0])
            except ValueError:
                raise ProcFormatError(f"/proc/meminfo: {key} is not a number: {line!r}") from None
            values[key] = number * (1024 if parts[1:] == ["kB"] else 1)
    for key in ("MemTotal", "MemAvailable"):
        if key not in values:
            raise ProcFormatError(f"/proc/meminfo has no {key} line")
    return values["MemTotal"], values["MemTotal"] - values["MemAvailable"]


def utilization(previous: tuple[int, int] | None, current: tuple[int, int]) -> float:
    """Busy share of the ticks between two /proc/stat readings (since boot without a previous one), in 0..1."""
    busy, total = current
    if previous is not None:
        busy, total = busy - previous[0], total - previous[1]
    if total <= 0:
        return 0.0
    return min(1.0, max(0.0, busy / total))


class CpuReader:
    """Reads /proc: utilization over the time since the previous ``read`` (the first one: since boot)."""

    def __init__(self, stat: Path = Path("/proc/stat"), meminfo: Path = Path("/proc/meminfo")) -> None:
        self.stat = stat
        self.meminfo = meminfo
        self._previous: tuple[int, int] | None = None

    def read(self) -> CpuRecord:
        ticks = parse_proc_stat(self.stat.read_text())
        total, used = parse_meminfo(self.meminfo.read_text())
        share = utilization(self._previous, ticks)
        self._previous = ticks
        return CpuRecord(utilization=share, memory_total_bytes=total, memory_used_bytes=used)


# -- records to families (pure) ---------------------------------------------------------------------

#: (name, HELP, type, reads the value) as Triton names and describes them
_GPU_FAMILIES: tuple[tuple[str, str, str, Callable[[GpuRecord], float | None]], ...] = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge", lambda r: r.utilization),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge", lambda r: r.memory_total_bytes),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge", lambda r: r.memory_used_bytes),
    ("nv_gpu_power_usage", "GPU power usage in watts", "gauge", lambda r: r.power_usage_watts),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge", lambda r: r.power_limit_watts),
)
_ENERGY = ("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started")


def gpu_families(records: Sequence[GpuRecord], energy_since_start: dict[str, float]) -> list[Metric]:
    """The nv_gpu_* gauges and the nv_energy_consumption counter, one sample per GPU labelled ``gpu_uuid``.

    ``energy_since_start`` maps a GPU's uuid to the joules it used since the first sample; a value a GPU does
    not report (None) gives no sample for that GPU. No records: no families at all."""
    if not records:
        return []
    families = []
    for name, doc, kind, read in _GPU_FAMILIES:
        family = Metric(name, doc, kind)
        for record in records:
            value = read(record)
            if value is not None:
                family.add_sample(name, {"gpu_uuid": record.uuid}, float(value))
        families.append(family)
    energy = Metric(_ENERGY[0], _ENERGY[1], "counter")
    for record in records:
        if record.uuid in energy_since_start:
            energy.add_sample(energy.name, {"gpu_uuid": record.uuid}, float(energy_since_start[record.uuid]))
    families.append(energy)
    return families


def cpu_families(record: CpuRecord | None) -> list[Metric]:
    """nv_cpu_utilization, nv_cpu_memory_total_bytes and nv_cpu_memory_used_bytes (no labels: machine-wide)."""
    if record is None:
        return []
    families = []
    for name, doc, value in (
        ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", record.utilization),
        ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", record.memory_total_bytes),
        ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", record.memory_used_bytes),
    ):
        family = Metric(name, doc, "gauge")
        family.add_sample(name, {}, float(value))
        families.append(family)
    return families


class EnergyCounter:
    """Joules per GPU since the first sample, from NVML's total since the driver loaded.

    A total that goes down (the driver reloaded, or the GPU was reset) starts a new base: the counter never
    decreases."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self.since_start: dict[str, float] = {}

    def update(self, records: Sequence[GpuRecord]) -> None:
        for record in records:
            if record.energy_joules is None:
                continue
            last = self._last.get(record.uuid)
            counted = self.since_start.get(record.uuid, 0.0)
            if last is not None and record.energy_joules >= last:
                counted += record.energy_joules - last
            self.since_start[record.uuid] = counted
            self._last[record.uuid] = record.energy_joules


# -- the sampler --------------------------------------------------------------------------------------


class SystemMetrics:
    """Samples the readers every ``interval_ms`` on a task of the running event loop; ``families`` gives the
    latest values. The readers run on a worker thread, so a slow NVML call never holds up serving."""

    def __init__(
        self,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        cpu: CpuReader | None = None,
        gpu: GpuReader | None = None,
    ) -> None:
        if interval_ms < 1:
            raise ValueError(f"metrics interval must be at least 1 ms, got {interval_ms}")
        self.interval_s = interval_ms / 1000
        self.cpu = cpu
        self.gpu = gpu
        self.cpu_record: CpuRecord | None = None
        self.gpu_records: list[GpuRecord] = []
        self.energy = EnergyCounter()
        self.samples = 0
        self._failing: set[str] = set()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start_for(
        cls,
        interval_ms: int,
        *,
        allow_cpu: bool,
        allow_gpu: bool,
        open_gpu: Callable[[], GpuReader],
    ) -> SystemMetrics | None:
        """The sampler that the flags ask for, started (its first sample taken); None when both are off.

        ``open_gpu`` gives the GPU reader (``_nvml.NvmlReader.open``) or raises ``GpuMetricsUnavailable``: then
        one INFO line says why, there are no GPU series, and the CPU ones go on."""
        if not (allow_cpu or allow_gpu):
            return None
        gpu = None
        if allow_gpu:
            try:
                gpu = await asyncio.to_thread(open_gpu)
            except GpuMetricsUnavailable as exc:
                logger.info("GPU metrics off: %s", exc)
        sampler = cls(interval_ms, cpu=CpuReader() if allow_cpu else None, gpu=gpu)
        await sampler.start()
        return sampler

    def families(self) -> list[Metric]:
        return [*gpu_families(self.gpu_records, self.energy.since_start), *cpu_families(self.cpu_record)]

    async def start(self) -> None:
        """Take the first sample now, then one every interval until ``stop``."""
        await self.sample()
        self._task = asyncio.create_task(self._run(), name="modelsvc-system-metrics")

    async def sample(self) -> None:
        """Read every reader once (on a worker thread) and keep what they return."""
        if self.cpu is not None:
            self.cpu_record = await self._read("CPU", self.cpu.read, None)
        if self.gpu is not None:
            records = await self._read("GPU", self.gpu.read, None)
            self.gpu_records = records or []
            self.energy.update(self.gpu_records)
        self.samples += 1

    async def _read(self, what: str, read: Callable[[], T], failed: T) -> T:
        """``read()`` on a worker thread; a failure is logged once per run of failures and gives ``failed``."""
        try:
            value = await asyncio.to_thread(read)
        except Exception as exc:  # a GPU that falls off the bus, an unreadable /proc: keep serving
            if what not in self._failing:
                logger.warning("cannot read the %s metrics: %s", what, exc)
                self._failing.add(what)
            return failed
        if what in self._failing:
            logger.info("%s metrics readable again", what)
            self._failing.discard(what)
        return value

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
                return
            except TimeoutError:
                pass
            await self.sample()

    async def stop(self) -> None:
        """Stop sampling (a sample under way finishes first) and close the GPU reader."""
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None
        if self.gpu is not None:
            gpu, self.gpu = self.gpu, None
            await asyncio.to_thread(gpu.close)
