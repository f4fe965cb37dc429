"""NvmlSource against the real pynvml where this machine has no NVML, and against a fake with pynvml's surface.

The fake is injected through the constructor (no patching of the pynvml module). GPM percentages are turned into
ratios by /100; expected values are worked out in comments.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from policies.types import GpuSnapshot
from service.sources.gpu import GpuSource, NoGpuSource
from service.sources.nvml import NvmlSource, gpu_error_reason

T = 1_800_000_000.0


def read(source: GpuSource, now_s: float = T) -> GpuSnapshot:
    return asyncio.run(source.read(now_s))


def read_many(source: GpuSource, count: int) -> list[GpuSnapshot]:
    async def go() -> list[GpuSnapshot]:
        return [await source.read(T + i) for i in range(count)]

    return asyncio.run(go())


# ---------------------------------------------------------------------------------------------------------------
# A fake pynvml: same names, same struct shapes, errors from the real pynvml error hierarchy
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class FakeGpu:
    name: str | bytes = "NVIDIA H100 80GB HBM3"
    util_percent: int = 100
    used_bytes: int = 60 * 2**30
    total_bytes: int = 80 * 2**30
    gpm_supported: bool = True
    # GPM percentages reported for every interval: tensor, dram, sm.
    gpm_percent: tuple[float, float, float] = (40.0, 65.0, 85.0)
    gpm_return: int = 0


@dataclass
class _Metric:
    metricId: int = 0  # noqa: N815 (pynvml's field name)
    nvmlReturn: int = 0  # noqa: N815
    value: float = 0.0


@dataclass
class _MetricsGet:
    version: int = 0
    numMetrics: int = 0  # noqa: N815
    sample1: Any = None
    sample2: Any = None
    metrics: list[_Metric] = field(default_factory=lambda: [_Metric() for _ in range(8)])


class FakeNvml:
    """Implements the subset of pynvml that NvmlSource calls; `fail` maps a function name to an error to raise."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    NVML_GPM_METRIC_DRAM_BW_UTIL = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
    NVML_GPM_METRIC_SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.fail: dict[str, Exception] = {}
        self.calls: dict[str, int] = {}
        self.live_samples: set[int] = set()
        self.initialised = False
        self._next_sample = 0

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        error = self.fail.pop(name, None)
        if error is not None:
            raise error

    def nvmlInit(self) -> None:  # noqa: N802
        self._call("nvmlInit")
        self.initialised = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._call("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        self._call("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:  # noqa: N802
        self._call("nvmlDeviceGetName")
        gpu: FakeGpu = self.gpus[handle]
        return gpu.name

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:  # noqa: N802
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=self.gpus[handle].util_percent, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:  # noqa: N802
        self._call("nvmlDeviceGetMemoryInfo")
        gpu = self.gpus[handle]
        return SimpleNamespace(used=gpu.used_bytes, total=gpu.total_bytes, free=gpu.total_bytes - gpu.used_bytes)

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:  # noqa: N802
        self._call("nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(version=1, isSupportedDevice=int(self.gpus[handle].gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        self._call("nvmlGpmSampleAlloc")
        self._next_sample += 1
        sample = {"id": self._next_sample, "gpu": None}
        self.live_samples.add(self._next_sample)
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:  # noqa: N802
        self._call("nvmlGpmSampleFree")
        self.live_samples.discard(sample["id"])

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:  # noqa: N802
        self._call("nvmlGpmSampleGet")
        sample["gpu"] = handle
        return sample

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:  # noqa: N802
        self._call("nvmlGpmMetricsGet")
        assert metrics_get.version == self.NVML_GPM_METRICS_GET_VERSION
        assert metrics_get.sample1["id"] != metrics_get.sample2["id"]  # two distinct samples, as NVML requires
        gpu = self.gpus[metrics_get.sample2["gpu"]]
        by_id = dict(
            zip(
                (self.NVML_GPM_METRIC_ANY_TENSOR_UTIL, self.NVML_GPM_METRIC_DRAM_BW_UTIL, self.NVML_GPM_METRIC_SM_UTIL),
                gpu.gpm_percent,
                strict=True,
            )
        )
        for metric in metrics_get.metrics[: metrics_get.numMetrics]:
            metric.value = by_id[metric.metricId]
            metric.nvmlReturn = gpu.gpm_return
        return metrics_get

    def c_nvmlGpmMetricsGet_t(self) -> Any:  # noqa: N802
        return _MetricsGet()


# ---------------------------------------------------------------------------------------------------------------
# Real pynvml on a machine without NVML
# ---------------------------------------------------------------------------------------------------------------


def _nvml_library_missing() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return True
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return False


@pytest.mark.skipif(not _nvml_library_missing(), reason="this machine has NVML; the test is for machines without")
def test_real_pynvml_without_library_reports_absent_not_an_error() -> None:
    source = NvmlSource()
    first, second = read_many(source, 2)
    for snap in (first, second):
        assert snap.source == "absent"
        assert snap.error is None
        assert snap.device_count == 0


def test_no_gpu_source_is_absent() -> None:
    snap = read(NoGpuSource(), T)
    assert (snap.source, snap.taken_at_s, snap.error) == ("absent", T, None)


def test_library_not_found_from_a_fake_is_absent_and_not_retried() -> None:
    fake = FakeNvml([FakeGpu()])
    fake.fail["nvmlInit"] = pynvml.NVMLError_LibraryNotFound()
    snaps = read_many(NvmlSource(fake), 3)
    assert [s.source for s in snaps] == ["absent"] * 3
    assert all(s.error is None for s in snaps)
    assert fake.calls["nvmlInit"] == 1


# ---------------------------------------------------------------------------------------------------------------
# Readings
# ---------------------------------------------------------------------------------------------------------------


def test_first_read_has_device_facts_and_no_gpm_interval_yet() -> None:
    gpus = [FakeGpu(util_percent=100, used_bytes=60 * 2**30), FakeGpu(util_percent=50, used_bytes=20 * 2**30)]
    snap = read(NvmlSource(FakeNvml(gpus)))
    assert snap.source == "nvml"
    assert snap.error is None
    assert snap.device_name == "NVIDIA H100 80GB HBM3"
    assert snap.device_count == 2
    assert snap.gpu_util_ratio == pytest.approx(0.75)  # mean(100 %, 50 %) / 100
    assert snap.memory_used_bytes == 80 * 2**30  # 60 GiB + 20 GiB
    assert snap.memory_total_bytes == 160 * 2**30  # 2 x 80 GiB
    assert snap.tensor_active_ratio is None
    assert snap.activity_source is None


def test_second_read_reports_gpm_activity_averaged_over_devices() -> None:
    gpus = [FakeGpu(gpm_percent=(40.0, 60.0, 80.0)), FakeGpu(gpm_percent=(20.0, 70.0, 90.0))]
    _, second = read_many(NvmlSource(FakeNvml(gpus)), 2)
    assert second.activity_source == "gpm"
    assert second.tensor_active_ratio == pytest.approx(0.30)  # (40 + 20) / 2 / 100
    assert second.dram_active_ratio == pytest.approx(0.65)  # (60 + 70) / 2 / 100
    assert second.sm_active_ratio == pytest.approx(0.85)  # (80 + 90) / 2 / 100


def test_gpm_unsupported_device_gives_utilisation_only() -> None:
    fake = FakeNvml([FakeGpu(name=b"NVIDIA A100-SXM4-80GB", gpm_supported=False)])
    _, second = read_many(NvmlSource(fake), 2)
    assert second.device_name == "NVIDIA A100-SXM4-80GB"  # bytes from older pynvml decoded
    assert second.gpu_util_ratio == 1.0
    assert second.tensor_active_ratio is None
    assert second.activity_source is None
    assert "nvmlGpmSampleGet" not in fake.calls


def test_gpm_support_query_failing_counts_as_unsupported() -> None:
    fake = FakeNvml([FakeGpu()])
    fake.fail["nvmlGpmQueryDeviceSupport"] = pynvml.NVMLError_FunctionNotFound()
    _, second = read_many(NvmlSource(fake), 2)
    assert second.error is None
    assert second.activity_source is None


def test_a_metric_the_device_cannot_compute_leaves_activity_empty() -> None:
    fake = FakeNvml([FakeGpu(gpm_return=pynvml.NVML_ERROR_NOT_SUPPORTED)])
    _, second = read_many(NvmlSource(fake), 2)
    assert second.error is None
    assert second.tensor_active_ratio is None


# ---------------------------------------------------------------------------------------------------------------
# Errors: reported in the snapshot, and the source keeps working
# ---------------------------------------------------------------------------------------------------------------


def test_an_error_mid_run_is_reported_and_the_next_read_works() -> None:
    fake = FakeNvml([FakeGpu()])
    source = NvmlSource(fake)

    async def go() -> list[GpuSnapshot]:
        first = await source.read(T)
        fake.fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVMLError_GpuIsLost()
        failed = await source.read(T + 1)
        after = [await source.read(T + 2), await source.read(T + 3)]
        return [first, failed, *after]

    first, failed, after_1, after_2 = asyncio.run(go())
    assert first.error is None
    assert failed.source == "nvml"
    assert failed.error is not None and "GpuIsLost" in failed.error
    assert failed.device_name == "NVIDIA H100 80GB HBM3"  # what is still known is kept
    assert after_1.error is None
    assert after_1.memory_used_bytes == 60 * 2**30
    # The GPM interval spanning the failure is dropped: activity again from the read after.
    assert after_1.activity_source is None
    assert after_2.tensor_active_ratio == pytest.approx(0.40)
    assert fake.calls["nvmlInit"] == 1


def test_uninitialised_nvml_is_reinitialised_on_the_next_read() -> None:
    fake = FakeNvml([FakeGpu()])
    source = NvmlSource(fake)

    async def go() -> list[GpuSnapshot]:
        await source.read(T)
        fake.fail["nvmlDeviceGetUtilizationRates"] = pynvml.NVMLError_Uninitialized()
        return [await source.read(T + 1), await source.read(T + 2)]

    failed, recovered = asyncio.run(go())
    assert failed.error is not None
    assert recovered.error is None
    assert fake.calls["nvmlInit"] == 2


def test_an_init_error_other_than_missing_library_is_an_error_and_retried() -> None:
    fake = FakeNvml([FakeGpu()])
    fake.fail["nvmlInit"] = pynvml.NVMLError_DriverNotLoaded()
    failed, recovered = read_many(NvmlSource(fake), 2)
    assert failed.source == "nvml"
    assert failed.error is not None and "DriverNotLoaded" in failed.error
    assert recovered.error is None
    assert recovered.device_count == 1


def test_a_non_nvml_exception_mid_run_is_reported_and_the_source_stays_usable() -> None:
    # e.g. a ctypes error inside a binding: it must not escape read() and stop the loop's tick.
    fake = FakeNvml([FakeGpu()])
    source = NvmlSource(fake)

    async def go() -> list[GpuSnapshot]:
        first = await source.read(T)
        fake.fail["nvmlDeviceGetUtilizationRates"] = OSError("exception: access violation reading 0x0")
        failed = await source.read(T + 1)
        after = [await source.read(T + 2), await source.read(T + 3)]
        return [first, failed, *after]

    first, failed, after_1, after_2 = asyncio.run(go())
    assert first.error is None
    assert failed.source == "nvml"
    assert failed.error is not None and failed.error.startswith("unexpected: OSError: ")
    assert gpu_error_reason(failed) == "unexpected"
    assert failed.device_name == "NVIDIA H100 80GB HBM3"
    assert after_1.error is None
    assert after_1.activity_source is None  # the GPM interval spanning the failure is dropped
    assert after_2.tensor_active_ratio == pytest.approx(0.40)  # 40 % / 100


def test_an_attribute_error_at_init_is_an_error_and_retried() -> None:
    fake = FakeNvml([FakeGpu()])
    fake.fail["nvmlDeviceGetCount"] = AttributeError("module 'pynvml' has no attribute 'nvmlDeviceGetCount'")
    failed, recovered = read_many(NvmlSource(fake), 2)
    assert failed.error is not None and "AttributeError" in failed.error
    assert gpu_error_reason(failed) == "unexpected"
    assert recovered.error is None
    assert recovered.device_count == 1


def test_an_nvml_library_without_gpm_bindings_reads_utilisation_only() -> None:
    # nvidia-ml-py older than its GPM functions: AttributeError on the support query means "no GPM", not a fault.
    fake = FakeNvml([FakeGpu(util_percent=50)])
    fake.fail["nvmlGpmQueryDeviceSupport"] = AttributeError("nvmlGpmQueryDeviceSupport")
    first, second = read_many(NvmlSource(fake), 2)
    assert (first.error, second.error) == (None, None)
    assert second.gpu_util_ratio == 0.5  # 50 % / 100
    assert second.activity_source is None
    assert "nvmlGpmSampleGet" not in fake.calls


def test_nvml_errors_carry_the_nvml_error_reason() -> None:
    fake = FakeNvml([FakeGpu()])
    fake.fail["nvmlInit"] = pynvml.NVMLError_DriverNotLoaded()
    failed = read(NvmlSource(fake))
    assert failed.error is not None and failed.error.startswith("nvml_error: NVMLError_DriverNotLoaded")
    assert gpu_error_reason(failed) == "nvml_error"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (None, ""),
        ("nvml_error: NVMLError_GpuIsLost: GPU is lost", "nvml_error"),
        ("unexpected: OSError: boom", "unexpected"),
        # The DCGM source writes str(ScrapeError): "<scrape reason>: <detail>".
        ("timeout: http://dcgm:9400/metrics: no complete answer within 2.0 s", "timeout"),
        ("http_status: http://dcgm:9400/metrics: HTTP 503 Service Unavailable", "http_status"),
        # Anything off the convention stays inside the closed label set.
        ("something else: entirely", "unexpected"),
        ("no separator", "unexpected"),
    ],
)
def test_gpu_error_reason_reads_the_prefix_within_a_closed_set(error: str | None, reason: str) -> None:
    assert gpu_error_reason(GpuSnapshot(taken_at_s=T, source="dcgm", error=error)) == reason


def test_no_devices_is_absent() -> None:
    snap = read(NvmlSource(FakeNvml([])))
    assert (snap.source, snap.error) == ("absent", None)


def test_close_frees_gpm_samples_and_shuts_down() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu()])
    source = NvmlSource(fake)
    read_many(source, 2)
    assert len(fake.live_samples) == 4  # two buffers per device
    source.close()
    assert fake.live_samples == set()
    assert fake.calls["nvmlShutdown"] == 1
    source.close()  # idempotent
    assert fake.calls["nvmlShutdown"] == 1
