# ruff: noqa: N802  (the NvmlApi protocol must spell pynvml's camelCase function names)
"""Local GPU telemetry through NVML (`nvidia-ml-py`, imported as `pynvml`).

NVML's `utilization.gpu` only says a kernel was running (it reads ~100% at batch 1); saturation comes from GPM
(Hopper and newer): tensor-pipe activity, DRAM bandwidth and SM utilisation over an interval between two samples.
This source takes one GPM sample per `read` and reports the activity since the previous `read`, so the interval is
the scrape interval and nothing sleeps. The first read after start (or after an error) has no GPM ratios yet.

NVML calls are blocking C calls (`nvmlInit` can take a second), so they run in a worker thread.

Errors follow service/sources/gpu.py's convention (read by `gpu_error_reason`): "nvml_error: NVMLError_GpuIsLost:
..." for errors NVML reports, "unexpected: AttributeError: ..." for anything else (an older nvidia-ml-py without a
function, a ctypes error, a bug of ours).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

from policies.types import GpuSnapshot
from service.sources.gpu import ERROR_NVML, ERROR_UNEXPECTED, SOURCE_ABSENT, gpu_error_reason

# `gpu_error_reason` lived here first; re-exported for callers that import it from this module.
__all__ = ["ACTIVITY_GPM", "SOURCE_NVML", "NvmlApi", "NvmlSource", "gpu_error_reason"]

SOURCE_NVML = "nvml"
ACTIVITY_GPM = "gpm"


class NvmlApi(Protocol):
    """The part of the `pynvml` module this source uses; tests inject a fake with the same surface."""

    NVMLError: type[Exception]
    NVMLError_LibraryNotFound: type[Exception]
    NVMLError_Uninitialized: type[Exception]
    NVML_GPM_METRICS_GET_VERSION: int
    NVML_GPM_METRIC_ANY_TENSOR_UTIL: int
    NVML_GPM_METRIC_DRAM_BW_UTIL: int
    NVML_GPM_METRIC_SM_UTIL: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # .gpu: percent
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .used, .total: bytes
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any: ...  # .isSupportedDevice
    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleFree(self, sample: Any) -> None: ...
    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any: ...
    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any: ...
    def c_nvmlGpmMetricsGet_t(self) -> Any: ...  # pynvml's ctypes struct, called to make one


@dataclass(slots=True)
class _Device:
    handle: Any
    gpm_supported: bool
    previous: Any = None  # GPM sample of the previous read, or None
    current: Any = None  # spare buffer the next sample is written into
    previous_valid: bool = False


@dataclass(frozen=True, slots=True)
class _Activity:
    tensor: float
    dram: float
    sm: float


class NvmlSource:
    """`GpuSource` over NVML. Initialises on the first `read`.

    - NVML library not installed (CPU machine, CI): `source="absent"`, no error, and NVML is not tried again.
    - Any other NVML error: a snapshot with `error` set ("nvml_error: ..."); the next `read` tries again
      (re-initialising if NVML reports itself uninitialised).
    - Any other exception (an nvidia-ml-py too old for a call, a ctypes error): the same, with "unexpected: ...".
      `read` never raises (the `GpuSource` contract): GPU data is optional, the advisor must outlive its probe.
    """

    def __init__(self, nvml: NvmlApi | None = None) -> None:
        self._nvml: NvmlApi = nvml if nvml is not None else pynvml
        self._devices: list[_Device] | None = None
        self._names: list[str] = []
        self._absent = False
        self._lock = asyncio.Lock()

    async def read(self, now_s: float) -> GpuSnapshot:
        async with self._lock:  # one NVML conversation at a time: the GPM sample buffers are shared state
            return await asyncio.to_thread(self._read_blocking, now_s)

    def close(self) -> None:
        """Free GPM buffers and shut NVML down (call once, from the composition root's shutdown)."""
        if self._devices is None:
            return
        devices, self._devices = self._devices, None
        try:
            for device in devices:
                for sample in (device.previous, device.current):
                    if sample is not None:
                        self._nvml.nvmlGpmSampleFree(sample)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass  # shutting down anyway; a driver that already lost the GPU has nothing left to free

    # -- blocking part (worker thread) --------------------------------------------------------------------------

    def _read_blocking(self, now_s: float) -> GpuSnapshot:
        if self._absent:
            return GpuSnapshot(taken_at_s=now_s, source=SOURCE_ABSENT)
        nvml = self._nvml
        try:
            devices = self._devices if self._devices is not None else self._init()
            if not devices:
                return GpuSnapshot(taken_at_s=now_s, source=SOURCE_ABSENT)
            utils: list[float] = []
            activity: list[_Activity] = []
            used = total = 0.0
            for device in devices:
                utils.append(float(nvml.nvmlDeviceGetUtilizationRates(device.handle).gpu))
                memory = nvml.nvmlDeviceGetMemoryInfo(device.handle)
                used += float(memory.used)
                total += float(memory.total)
                if device.gpm_supported:
                    reading = self._gpm_step(device)
                    if reading is not None:
                        activity.append(reading)
        except nvml.NVMLError_LibraryNotFound:
            self._absent = True
            return GpuSnapshot(taken_at_s=now_s, source=SOURCE_ABSENT)
        except nvml.NVMLError as exc:
            return self._failed(now_s, exc, reason=ERROR_NVML)
        except Exception as exc:  # the GpuSource contract: a broken probe never stops the loop
            return self._failed(now_s, exc, reason=ERROR_UNEXPECTED)
        return GpuSnapshot(
            taken_at_s=now_s,
            source=SOURCE_NVML,
            device_name=self._names[0],
            device_count=len(devices),
            gpu_util_ratio=min(sum(utils) / len(utils) / 100.0, 1.0),
            memory_used_bytes=used,
            memory_total_bytes=total,
            tensor_active_ratio=_mean([a.tensor for a in activity]),
            dram_active_ratio=_mean([a.dram for a in activity]),
            sm_active_ratio=_mean([a.sm for a in activity]),
            activity_source=ACTIVITY_GPM if activity else None,
        )

    def _failed(self, now_s: float, exc: Exception, *, reason: str) -> GpuSnapshot:
        self._after_error(exc)
        return GpuSnapshot(
            taken_at_s=now_s,
            source=SOURCE_NVML,
            device_name=self._names[0] if self._names else None,
            device_count=len(self._names),
            error=f"{reason}: {type(exc).__name__}: {exc}",
        )

    def _init(self) -> list[_Device]:
        nvml = self._nvml
        nvml.nvmlInit()
        devices: list[_Device] = []
        names: list[str] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            names.append(name.decode() if isinstance(name, bytes) else name)
            devices.append(_Device(handle=handle, gpm_supported=self._gpm_supported(handle)))
        self._devices, self._names = devices, names
        return devices

    def _gpm_supported(self, handle: Any) -> bool:
        try:
            return bool(self._nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except (self._nvml.NVMLError, AttributeError):
            # Pre-Hopper GPU, a driver without GPM, or an nvidia-ml-py older than its GPM bindings (the function
            # or struct is missing): utilisation and memory only.
            return False

    def _gpm_step(self, device: _Device) -> _Activity | None:
        """Take this read's GPM sample; return the activity since the previous one (None on the first)."""
        nvml = self._nvml
        if device.current is None:
            device.current = nvml.nvmlGpmSampleAlloc()
        if device.previous is None:
            device.previous = nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(device.handle, device.current)
        activity = self._gpm_metrics(device.previous, device.current) if device.previous_valid else None
        device.previous, device.current = device.current, device.previous
        device.previous_valid = True
        return activity

    def _gpm_metrics(self, first: Any, second: Any) -> _Activity | None:
        nvml = self._nvml
        ids = (
            nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
            nvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
            nvml.NVML_GPM_METRIC_SM_UTIL,
        )
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1 = first
        request.sample2 = second
        for slot, metric_id in enumerate(ids):
            request.metrics[slot].metricId = metric_id
        result = nvml.nvmlGpmMetricsGet(request)
        metrics = [result.metrics[slot] for slot in range(len(ids))]
        values = [float(m.value) for m in metrics]
        if any(m.nvmlReturn != 0 for m in metrics) or not all(math.isfinite(v) for v in values):
            return None  # 0 is NVML_SUCCESS; a metric the device cannot compute leaves the interval unusable
        tensor, dram, sm = (_percent_to_ratio(v) for v in values)
        return _Activity(tensor=tensor, dram=dram, sm=sm)

    def _after_error(self, exc: Exception) -> None:
        # The GPM interval spans the failure: start a new pair on the next read.
        for device in self._devices or ():
            device.previous_valid = False
        if isinstance(exc, self._nvml.NVMLError_Uninitialized):
            self._devices = None


def _percent_to_ratio(percent: float) -> float:
    return min(max(percent / 100.0, 0.0), 1.0)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
