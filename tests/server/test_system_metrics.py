"""GPU and CPU metrics with Triton's names: /proc parsing, records to exposition, the sampler, and real
``modelsvc serve`` processes scraped over HTTP (no GPU here: the GPU-absent path; a real GPU under ``-m gpu``)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from modelsvc import _cli
from modelsvc.server.observe._metrics import render_families
from modelsvc.server.observe._nvml import NvmlReader
from modelsvc.server.observe._system_metrics import (
    CpuReader,
    CpuRecord,
    EnergyCounter,
    GpuMetricsUnavailable,
    GpuRecord,
    ProcFormatError,
    SystemMetrics,
    cpu_families,
    gpu_families,
    parse_meminfo,
    parse_proc_stat,
    utilization,
)
from tests._server import ModelsvcProcess, wait_for

STAT = """cpu  100 20 30 800 50 5 5 0 7 0
cpu0 50 10 15 400 25 2 3 0 7 0
intr 12345
"""
MEMINFO = """MemTotal:       16000000 kB
MemFree:         1000000 kB
MemAvailable:   12000000 kB
Buffers:          100000 kB
"""


# -- /proc parsing -------------------------------------------------------------------------------------


def test_proc_stat_busy_and_total_count_iowait_as_idle_and_guest_once():
    busy, total = parse_proc_stat(STAT)
    assert total == 100 + 20 + 30 + 800 + 50 + 5 + 5 + 0  # guest (7) is inside user already
    assert busy == total - 800 - 50


def test_meminfo_used_is_total_minus_available_in_bytes():
    assert parse_meminfo(MEMINFO) == (16_000_000 * 1024, 4_000_000 * 1024)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_proc_stat, "intr 1\n", "no 'cpu' line"),
        (parse_proc_stat, "cpu 1 2 x 4\n", "not a number"),
        (parse_proc_stat, "cpu 1 2\n", "2 fields"),
        (parse_meminfo, "MemTotal: 10 kB\n", "no MemAvailable line"),
        (parse_meminfo, "MemTotal: ten kB\nMemAvailable: 1 kB\n", "MemTotal is not a number"),
    ],
)
def test_proc_format_errors_name_the_file_and_field(parse, text, message):
    with pytest.raises(ProcFormatError, match=message):
        parse(text)


def test_utilization_over_an_interval_since_boot_and_clamped():
    assert utilization(None, (30, 100)) == 0.3  # the first reading: since boot
    assert utilization((30, 100), (80, 200)) == 0.5
    assert utilization((30, 100), (30, 100)) == 0.0  # no tick passed
    assert utilization((30, 100), (300, 200)) == 1.0


def test_cpu_reader_reports_the_interval_since_its_previous_read(tmp_path: Path):
    stat, meminfo = tmp_path / "stat", tmp_path / "meminfo"
    stat.write_text("cpu 10 0 10 80 0 0 0 0\n")
    meminfo.write_text(MEMINFO)
    reader = CpuReader(stat, meminfo)
    assert reader.read() == CpuRecord(0.2, 16_000_000 * 1024, 4_000_000 * 1024)
    stat.write_text("cpu 70 0 30 100 0 0 0 0\n")  # 60 + 20 busy of 100 ticks since
    assert reader.read().utilization == 0.8


def test_cpu_reader_on_this_machine_agrees_with_proc():
    record = CpuReader().read()
    assert 0.0 <= record.utilization <= 1.0
    assert record.memory_total_bytes == _meminfo_kb("MemTotal") * 1024
    assert 0 < record.memory_used_bytes < record.memory_total_bytes


# -- records to exposition (GPU records as data) ---------------------------------------------------------

A = GpuRecord("GPU-aaaa", 0.37, 80 * 2**30, 12 * 2**30, 212.5, 700.0, 1000.0)
B = GpuRecord("GPU-bbbb", None, 16 * 2**30, 0, None, None, None)  # a board that reports only memory


def _lines(text: str) -> list[str]:
    return text.splitlines()


def test_gpu_records_give_triton_names_units_labels_and_types():
    text = render_families(gpu_families([A, B], {"GPU-aaaa": 42.25})).decode()
    lines = _lines(text)
    for expected in (
        "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)",
        "# TYPE nv_gpu_utilization gauge",
        'nv_gpu_utilization{gpu_uuid="GPU-aaaa"} 0.37',
        "# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes",
        'nv_gpu_memory_total_bytes{gpu_uuid="GPU-aaaa"} 8.589934592e+10',
        'nv_gpu_memory_total_bytes{gpu_uuid="GPU-bbbb"} 1.7179869184e+10',
        'nv_gpu_memory_used_bytes{gpu_uuid="GPU-aaaa"} 1.2884901888e+10',
        'nv_gpu_memory_used_bytes{gpu_uuid="GPU-bbbb"} 0.0',
        "# HELP nv_gpu_power_usage GPU power usage in watts",
        'nv_gpu_power_usage{gpu_uuid="GPU-aaaa"} 212.5',
        "# HELP nv_gpu_power_limit GPU power management limit in watts",
        'nv_gpu_power_limit{gpu_uuid="GPU-aaaa"} 700.0',
        "# HELP nv_energy_consumption GPU energy consumption in joules since the Triton Server started",
        "# TYPE nv_energy_consumption counter",
        'nv_energy_consumption{gpu_uuid="GPU-aaaa"} 42.25',
    ):
        assert expected in lines, f"{expected!r} not in:\n{text}"
    # B reports no utilization, power or energy: it has no sample there (not a made-up 0)
    assert not [ln for ln in lines if "GPU-bbbb" in ln and not ln.startswith("nv_gpu_memory_")]
    assert "_total" not in text.replace("memory_total_bytes", "")  # Triton's bare counter name


def test_no_gpu_records_no_gpu_families():
    assert gpu_families([], {}) == []


def test_cpu_record_gives_triton_names_without_labels():
    text = render_families(cpu_families(CpuRecord(0.25, 1000, 400))).decode()
    assert _lines(text) == [
        "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]",
        "# TYPE nv_cpu_utilization gauge",
        "nv_cpu_utilization 0.25",
        "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes",
        "# TYPE nv_cpu_memory_total_bytes gauge",
        "nv_cpu_memory_total_bytes 1000.0",
        "# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes",
        "# TYPE nv_cpu_memory_used_bytes gauge",
        "nv_cpu_memory_used_bytes 400.0",
    ]
    assert cpu_families(None) == []


def _energy(uuid: str, joules: float | None) -> GpuRecord:
    return GpuRecord(uuid, 0.0, 1, 0, 1.0, 1.0, joules)


def test_energy_counts_from_the_first_sample_and_never_goes_down():
    counter = EnergyCounter()
    counter.update([_energy("GPU-a", 5000.0), _energy("GPU-b", None)])
    assert counter.since_start == {"GPU-a": 0.0}  # joules since the server started, not since the driver loaded
    counter.update([_energy("GPU-a", 5012.5)])
    counter.update([_energy("GPU-a", 5020.0)])
    assert counter.since_start == {"GPU-a": 20.0}
    counter.update([_energy("GPU-a", 3.0)])  # the driver reloaded: a new base, the counter keeps its count
    counter.update([_energy("GPU-a", 10.0)])
    assert counter.since_start == {"GPU-a": 27.0}


class _NvmlStub:
    """The few pynvml calls NvmlReader makes, answering in NVML's units (percent, mW, mJ)."""

    class NVMLError(Exception):
        pass

    class _Memory:
        total = 80 * 2**30
        used = 2**30

    class _Util:
        gpu = 45

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}".encode()

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._Memory()

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._Util()

    def nvmlDeviceGetPowerUsage(self, handle):
        return 212_500

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        raise self.NVMLError("Not Supported")


def test_nvml_units_become_triton_units():
    """NvmlReader's conversions, against a stand-in for pynvml (the real calls only run on a GPU)."""
    (record,) = NvmlReader(_NvmlStub(), ["x"]).read()
    assert record == GpuRecord("GPU-x", 0.45, 80 * 2**30, 2**30, 212.5, 700.0, None)


class _NvmlWithoutDriver:
    """pynvml where the driver's library is missing: nvmlInit raises, as on a machine without an NVIDIA driver."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self) -> None:
        raise self.NVMLError("NVML Shared Library Not Found")


def test_nvml_reader_without_nvml_says_why(monkeypatch: pytest.MonkeyPatch):
    """Both refusals, on any machine (with a GPU too): no nvidia-ml-py, and NVML that cannot start."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(GpuMetricsUnavailable, match=r"nvidia-ml-py is not installed \(pip install nvidia-ml-py"):
        NvmlReader.open()
    monkeypatch.setitem(sys.modules, "pynvml", _NvmlWithoutDriver())
    with pytest.raises(GpuMetricsUnavailable, match=r"^NVML cannot start: NVML Shared Library Not Found$"):
        NvmlReader.open()


# -- the sampler, with readers as data ---------------------------------------------------------------------


class _FakeGpu:
    def __init__(self, *batches: list[GpuRecord] | Exception) -> None:
        self.batches = list(batches)
        self.reads = 0
        self.closed = False

    def read(self) -> list[GpuRecord]:
        self.reads += 1
        batch = self.batches[min(self.reads, len(self.batches)) - 1]
        if isinstance(batch, Exception):
            raise batch
        return batch

    def close(self) -> None:
        self.closed = True


class _CountingCpu(CpuReader):
    def __init__(self, wanted: int) -> None:
        super().__init__()
        self.reads = 0
        self.wanted = wanted
        self.enough = asyncio.Event()
        self.loop = asyncio.get_running_loop()

    def read(self) -> CpuRecord:  # on the sampler's worker thread
        self.reads += 1
        if self.reads >= self.wanted:
            self.loop.call_soon_threadsafe(self.enough.set)
        return super().read()


async def test_sampler_samples_every_interval_and_stops_cleanly():
    cpu = _CountingCpu(wanted=4)
    gpu = _FakeGpu([_energy("GPU-a", 100.0)], [_energy("GPU-a", 130.0)])
    sampler = SystemMetrics(10, cpu=cpu, gpu=gpu)
    await sampler.start()
    assert sampler.samples == 1  # the first sample is taken before start returns
    await asyncio.wait_for(cpu.enough.wait(), 10)
    await sampler.stop()
    assert gpu.closed
    stopped_at = cpu.reads
    assert sampler.samples == stopped_at >= 4
    names = [f.name for f in sampler.families()]
    assert names[0] == "nv_gpu_utilization"
    assert names[-1] == "nv_cpu_memory_used_bytes"
    assert sampler.energy.since_start == {"GPU-a": 30.0}
    await asyncio.sleep(0.05)  # stopped means stopped: no read after stop
    assert cpu.reads == stopped_at


async def test_a_failing_gpu_read_drops_its_series_and_logs_once(caplog):
    gpu = _FakeGpu([A], RuntimeError("GPU is lost"), RuntimeError("GPU is lost"), [A])
    sampler = SystemMetrics(1000, gpu=gpu)
    with caplog.at_level(logging.INFO, logger="modelsvc"):
        await sampler.sample()
        assert len(sampler.families()) == 6
        await sampler.sample()
        await sampler.sample()
        assert sampler.families() == []
        await sampler.sample()
        assert len(sampler.families()) == 6
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["cannot read the GPU metrics: GPU is lost", "GPU metrics readable again"]
    assert caplog.records[0].levelno == logging.WARNING


async def test_start_for_without_a_gpu_logs_one_info_line_and_keeps_cpu(caplog):
    def no_gpu() -> _FakeGpu:
        raise GpuMetricsUnavailable("NVML cannot start: NVML Shared Library Not Found")

    with caplog.at_level(logging.DEBUG, logger="modelsvc"):
        sampler = await SystemMetrics.start_for(1000, allow_cpu=True, allow_gpu=True, open_gpu=no_gpu)
    assert sampler is not None
    try:
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (logging.INFO, "GPU metrics off: NVML cannot start: NVML Shared Library Not Found")
        ]
        assert [f.name for f in sampler.families()] == [
            "nv_cpu_utilization",
            "nv_cpu_memory_total_bytes",
            "nv_cpu_memory_used_bytes",
        ]
    finally:
        await sampler.stop()


async def test_start_for_with_both_off_samples_nothing():
    def never() -> _FakeGpu:
        raise AssertionError("GPU opened though --allow-gpu-metrics false")

    assert await SystemMetrics.start_for(1000, allow_cpu=False, allow_gpu=False, open_gpu=never) is None
    sampler = await SystemMetrics.start_for(1000, allow_cpu=True, allow_gpu=False, open_gpu=never)
    assert sampler is not None
    await sampler.stop()


def test_sampler_refuses_a_zero_interval():
    with pytest.raises(ValueError, match="at least 1 ms, got 0"):
        SystemMetrics(0)


# -- flags ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--metrics-interval-ms", "0"], "argument --metrics-interval-ms: must be at least 1, got 0"),
        (["--metrics-interval-ms", "2s"], "argument --metrics-interval-ms: expected a whole number, got '2s'"),
        (["--allow-gpu-metrics", "maybe"], "argument --allow-gpu-metrics: expected true or false, got 'maybe'"),
        (["--allow-cpu-metrics", "nope"], "argument --allow-cpu-metrics: expected true or false, got 'nope'"),
    ],
)
def test_bad_flag_values_are_usage_errors(tmp_path: Path, capsys, flag, message):
    with pytest.raises(SystemExit) as exited:
        _cli.main(["serve", "--model-repository", str(tmp_path), *flag])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_flags_parse_to_triton_defaults(tmp_path: Path):
    args = _cli._parser().parse_args(["serve", "--model-repository", str(tmp_path)])
    assert (args.allow_gpu_metrics, args.allow_cpu_metrics, args.metrics_interval_ms) == (True, True, 2000)
    args = _cli._parser().parse_args(
        ["serve", "--model-repository", str(tmp_path), "--allow-gpu-metrics=false", "--allow-cpu-metrics", "0"]
    )
    assert (args.allow_gpu_metrics, args.allow_cpu_metrics) == (False, False)


# -- real servers, scraped over HTTP ----------------------------------------------------------------------------


def _meminfo_kb(key: str) -> int:
    found = re.search(rf"^{key}:\s+(\d+) kB$", Path("/proc/meminfo").read_text(), re.MULTILINE)
    assert found, f"no {key} in /proc/meminfo"
    return int(found.group(1))


def _scrape(server: ModelsvcProcess) -> dict[str, float]:
    """The unlabelled nv_cpu_* samples and every nv_gpu_*/nv_energy_* sample line, by name and labels."""
    text = httpx.get(server.metrics_url, timeout=10).text
    samples = {}
    for line in text.splitlines():
        if line.startswith(("nv_cpu_", "nv_gpu_", "nv_energy_")):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def _scrape_ready(server: ModelsvcProcess) -> dict[str, float]:
    """The first scrape once the metrics endpoint answers (it opens just after the HTTP one says ready)."""

    def attempt() -> tuple[dict[str, float]] | None:
        try:
            return (_scrape(server),)  # a tuple: an empty scrape is an answer too
        except httpx.TransportError:
            return None

    return wait_for(attempt, "the metrics endpoint")[0]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    (tmp_path / "repo").mkdir()
    return tmp_path / "repo"


@pytest.fixture
def busy():
    """A child process that keeps one CPU busy while the test runs."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc
    proc.kill()
    proc.wait()


def _gpu_lines(server: ModelsvcProcess) -> list[str]:
    return [ln for ln in server.log().splitlines() if "GPU metrics" in ln or "NVML" in ln]


@pytest.mark.integration
def test_served_cpu_metrics_agree_with_proc_and_no_gpu_is_one_info_line(repository: Path):
    with ModelsvcProcess(repository, "--metrics-interval-ms", "100") as server:
        samples = _scrape_ready(server)
        assert 0.0 <= samples["nv_cpu_utilization"] <= 1.0
        assert samples["nv_cpu_memory_total_bytes"] == _meminfo_kb("MemTotal") * 1024
        used_now = (_meminfo_kb("MemTotal") - _meminfo_kb("MemAvailable")) * 1024
        tolerance = max(256 * 2**20, 0.05 * samples["nv_cpu_memory_total_bytes"])
        assert abs(samples["nv_cpu_memory_used_bytes"] - used_now) < tolerance
        if not Path("/proc/driver/nvidia").exists():  # no GPU here: no series, one INFO line, no error
            assert not [name for name in samples if not name.startswith("nv_cpu_")]
            lines = _gpu_lines(server)
            assert len(lines) == 1, server.log()
            assert re.search(r" I modelsvc\] GPU metrics off: NVML", lines[0]), lines
        assert not re.search(r"^\S+ \S+ [EW] ", server.log(), re.MULTILINE), server.log()


@pytest.mark.integration
def test_values_follow_the_interval(repository: Path, busy):
    """With a 100 ms interval the CPU values change while a CPU is kept busy; with an interval longer than the
    test they stay as sampled at start, however often they are scraped."""
    with ModelsvcProcess(repository, "--metrics-interval-ms", "600000") as slow:
        first = _scrape_ready(slow)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert _scrape(slow) == first
    with ModelsvcProcess(repository, "--metrics-interval-ms", "100") as fast:
        _scrape_ready(fast)
        seen: set[tuple[float, float]] = set()

        def changed_under_load() -> bool:
            # new samples show as new (utilization, memory used) pairs: on a saturated machine utilization alone
            # may read 1.0 every time, while memory used still moves
            samples = _scrape(fast)
            seen.add((samples["nv_cpu_utilization"], samples["nv_cpu_memory_used_bytes"]))
            # one of this machine's cores is busy: 0.5 on 2 cores, 0.06 on 16 (an H200 machine's)
            return len(seen) >= 3 and max(u for u, _ in seen) >= 0.8 / (os.cpu_count() or 1)

        wait_for(changed_under_load, "nv_cpu_utilization to change under load", timeout=30)


@pytest.mark.integration
def test_allow_cpu_metrics_false_removes_the_series_and_gpu_false_is_silent(repository: Path):
    flags = ("--allow-cpu-metrics", "false", "--allow-gpu-metrics=false", "--metrics-interval-ms", "50")
    with ModelsvcProcess(repository, *flags) as server:
        _scrape_ready(server)
        text = httpx.get(server.metrics_url, timeout=10).text
        assert "process_cpu_seconds_total" in text  # the endpoint is up, with the process collectors
        assert not re.search(r"^(# \w+ )?nv_(cpu|gpu|energy)_", text, re.MULTILINE), text
        assert _gpu_lines(server) == []
    with ModelsvcProcess(repository, "--allow-cpu-metrics", "false") as server:
        assert not [name for name in _scrape_ready(server) if name.startswith("nv_cpu_")]


def _gpu_or_skip_reason() -> str | None:
    try:
        reader = NvmlReader.open()
    except GpuMetricsUnavailable as exc:
        return f"no GPU metrics on this machine: {exc}"
    reader.close()
    return None


@pytest.mark.gpu
@pytest.mark.integration
def test_a_real_gpu_shows_its_series(repository: Path):
    reason = _gpu_or_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with ModelsvcProcess(repository, "--metrics-interval-ms", "100") as server:
        samples = _scrape_ready(server)
        uuids = set(re.findall(r'nv_gpu_memory_total_bytes\{gpu_uuid="(GPU-[^"]+)"\}', "\n".join(samples)))
        assert uuids, samples
        for uuid in uuids:
            label = f'{{gpu_uuid="{uuid}"}}'
            assert samples[f"nv_gpu_memory_total_bytes{label}"] > 0
            assert 0 <= samples[f"nv_gpu_memory_used_bytes{label}"] <= samples[f"nv_gpu_memory_total_bytes{label}"]
            assert 0.0 <= samples[f"nv_gpu_utilization{label}"] <= 1.0
            if f"nv_gpu_power_usage{label}" in samples:
                assert 0 < samples[f"nv_gpu_power_usage{label}"] < 2000  # watts, not milliwatts
            if f"nv_energy_consumption{label}" in samples:
                assert samples[f"nv_energy_consumption{label}"] >= 0
        assert not _gpu_lines(server), server.log()
