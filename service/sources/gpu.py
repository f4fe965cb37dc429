"""The GPU telemetry port: what the loop asks of any GPU source, and the source for machines without one."""

from __future__ import annotations

from typing import Protocol

from policies.types import GpuSnapshot

SOURCE_ABSENT = "absent"


class GpuSource(Protocol):
    """Reads GPU telemetry at `now_s` (Unix seconds, stamped as `taken_at_s`).

    Never raises: a failed read is a `GpuSnapshot` with `error` set, so a broken GPU probe can never stop the
    advisor, which works from the engine's own metrics alone.
    """

    async def read(self, now_s: float) -> GpuSnapshot: ...


class NoGpuSource:
    """No GPU telemetry configured or available (CPU machine, CI): always `source="absent"`, never an error."""

    async def read(self, now_s: float) -> GpuSnapshot:
        return GpuSnapshot(taken_at_s=now_s, source=SOURCE_ABSENT)
