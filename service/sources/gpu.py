"""The GPU telemetry port: what the loop asks of any GPU source, the source for machines without one, and the
error-reason convention every source follows.

Error text convention (what `gpu_error_reason` reads): `GpuSnapshot.error` starts with a short snake_case reason
and ": ". NVML writes "nvml_error: NVMLError_GpuIsLost: ..." for errors NVML reports and "unexpected: ..." for
anything else; the DCGM source's errors are `str(ScrapeError)` ("timeout: ..."); the loop writes "unexpected: ..."
when a source broke its never-raise contract.
"""

from __future__ import annotations

from typing import Protocol

from policies.types import GpuSnapshot
from service.sources.errors import ScrapeErrorReason

SOURCE_ABSENT = "absent"

# GpuSnapshot.error reasons (metric label values of specadvisor_gpu_telemetry_errors_total).
ERROR_NVML = "nvml_error"  # NVML itself reported a failure (NVMLError and subclasses)
ERROR_UNEXPECTED = "unexpected"  # anything else; also for error text that follows no convention
# Every reason a GPU source writes: NVML's two, and the DCGM source's scrape reasons (timeout, connect, parse...).
# A closed set, so the reason can be a metric label without unbounded cardinality.
GPU_ERROR_REASONS: frozenset[str] = frozenset(
    {ERROR_NVML, ERROR_UNEXPECTED, *(r.value for r in ScrapeErrorReason)}
)


def gpu_error_reason(snapshot: GpuSnapshot) -> str:
    """The short reason label of a failed GPU read: the text before the first ": " of `snapshot.error`.

    "" when the snapshot has no error. A prefix outside `GPU_ERROR_REASONS` is reported as "unexpected", so the
    label set stays closed whatever a source writes.

    Example: error "nvml_error: NVMLError_GpuIsLost: GPU is lost" -> "nvml_error"; DCGM's "timeout: http://...:
    no complete answer within 2.0 s" -> "timeout"; "weird" -> "unexpected".
    """
    if snapshot.error is None:
        return ""
    prefix, sep, _ = snapshot.error.partition(": ")
    return prefix if sep and prefix in GPU_ERROR_REASONS else ERROR_UNEXPECTED


class GpuSource(Protocol):
    """Reads GPU telemetry at `now_s` (Unix seconds, stamped as `taken_at_s`).

    Never raises: a failed read is a `GpuSnapshot` with `error` set, so a broken GPU probe can never stop the
    advisor, which works from the engine's own metrics alone. (The loop still guards against a source that
    breaks this contract.)
    """

    async def read(self, now_s: float) -> GpuSnapshot: ...


class NoGpuSource:
    """No GPU telemetry configured or available (CPU machine, CI): always `source="absent"`, never an error."""

    async def read(self, now_s: float) -> GpuSnapshot:
        return GpuSnapshot(taken_at_s=now_s, source=SOURCE_ABSENT)
