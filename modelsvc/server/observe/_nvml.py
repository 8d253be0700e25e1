"""The GPU reader: NVML (nvidia-ml-py, module ``pynvml``) to one ``GpuRecord`` per GPU.

The only part of the GPU and CPU metrics that needs a GPU; everything it returns is plain data that
``_system_metrics`` turns into Triton's series. NVML's units are converted here: utilization percent to a
ratio, milliwatts to watts, millijoules to joules.
"""

from __future__ import annotations

from typing import Any

from ._system_metrics import GpuMetricsUnavailable, GpuRecord


class NvmlReader:
    """NVML, initialised once; ``read`` queries every GPU that NVML sees (those the container was given)."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles

    @classmethod
    def open(cls) -> NvmlReader:
        """Initialise NVML and find the GPUs; ``GpuMetricsUnavailable`` (one line, the reason) where it cannot."""
        try:
            import pynvml
        except ImportError:
            raise GpuMetricsUnavailable(
                "nvidia-ml-py is not installed (pip install nvidia-ml-py, a dependency of modelsvc)"
            ) from None
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as exc:
            raise GpuMetricsUnavailable(f"NVML cannot start: {exc}") from None
        try:
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise GpuMetricsUnavailable(f"NVML cannot list the GPUs: {exc}") from None
        if not handles:
            pynvml.nvmlShutdown()
            raise GpuMetricsUnavailable("NVML finds no GPU")
        return cls(pynvml, handles)

    def read(self) -> list[GpuRecord]:
        """One record per GPU; a value the GPU does not report (power on some boards, energy before Volta) is None."""
        nvml = self._nvml
        records = []
        for handle in self._handles:
            uuid = nvml.nvmlDeviceGetUUID(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            util = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
            power = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
            limit = self._optional(nvml.nvmlDeviceGetPowerManagementLimit, handle)
            energy = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            records.append(
                GpuRecord(
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    utilization=None if util is None else util.gpu / 100,
                    memory_total_bytes=int(memory.total),
                    memory_used_bytes=int(memory.used),
                    power_usage_watts=None if power is None else power / 1000,
                    power_limit_watts=None if limit is None else limit / 1000,
                    energy_joules=None if energy is None else energy / 1000,
                )
            )
        return records

    def _optional(self, query: Any, handle: Any) -> Any:
        try:
            return query(handle)
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        self._nvml.nvmlShutdown()
