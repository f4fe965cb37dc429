"""GPU telemetry from a dcgm-exporter `/metrics` page (remote GPUs, or where NVML is not reachable from the pod).

dcgm-exporter writes one series per GPU (label `gpu`, plus `UUID`, `modelName`, `Hostname` and, with Kubernetes pod
mapping, `namespace`/`pod`/`container`; MIG adds `GPU_I_ID`). PROF fields are ratios in 0..1, DEV_GPU_UTIL is a
percentage, FB_* are MiB. Several GPUs are averaged for ratios and summed for memory.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from policies.types import GpuSnapshot
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.page import fetch_text

SOURCE_DCGM = "dcgm"

TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
FB_TOTAL = "DCGM_FI_DEV_FB_TOTAL"
_WANTED = frozenset({TENSOR_ACTIVE, DRAM_ACTIVE, SM_ACTIVE, GPU_UTIL, FB_USED, FB_FREE, FB_RESERVED, FB_TOTAL})
_PREFIX = "DCGM_FI_"
_GPU_LABEL = "gpu"
_MODEL_LABEL = "modelName"
_MIB = 1024 * 1024
_PARSER_ERRORS = (ValueError, IndexError, KeyError, TypeError, AttributeError)


def parse_dcgm_metrics(text: str, *, taken_at_s: float, label_match: Mapping[str, str] | None = None) -> GpuSnapshot:
    """Build a `GpuSnapshot` from dcgm-exporter text. Raises `ScrapeError` (PARSE, INVALID_VALUE, MODEL_MISSING).

    `label_match` keeps only series whose labels equal all the given values (e.g. `{"pod": "vllm-0"}` on a node
    exporter shared with other workloads).
    """
    by_name = _samples_by_name(text, label_match or {})
    gpus = {s.labels.get(_GPU_LABEL, "") for samples in by_name.values() for s in samples}
    if not gpus:
        raise ScrapeError(ScrapeErrorReason.MODEL_MISSING, "no matching DCGM_FI_ series on the page")
    tensor = _mean_ratio(by_name.get(TENSOR_ACTIVE))
    dram = _mean_ratio(by_name.get(DRAM_ACTIVE))
    sm = _mean_ratio(by_name.get(SM_ACTIVE))
    util_percent = _mean(by_name.get(GPU_UTIL))
    used_mib = _sum(by_name.get(FB_USED))
    total_mib = _sum(by_name.get(FB_TOTAL))
    if total_mib is None and used_mib is not None:
        free_mib = _sum(by_name.get(FB_FREE))
        if free_mib is not None:
            # dcgm-exporter's default field set has no FB_TOTAL: used + free (+ reserved) is the device memory.
            total_mib = used_mib + free_mib + (_sum(by_name.get(FB_RESERVED)) or 0.0)
    return GpuSnapshot(
        taken_at_s=taken_at_s,
        source=SOURCE_DCGM,
        device_name=_device_name(by_name),
        device_count=len(gpus),
        gpu_util_ratio=min(util_percent / 100.0, 1.0) if util_percent is not None else None,
        memory_used_bytes=used_mib * _MIB if used_mib is not None else None,
        memory_total_bytes=total_mib * _MIB if total_mib is not None else None,
        tensor_active_ratio=tensor,
        dram_active_ratio=dram,
        sm_active_ratio=sm,
        activity_source=SOURCE_DCGM if (tensor, dram, sm) != (None, None, None) else None,
    )


def _samples_by_name(text: str, label_match: Mapping[str, str]) -> dict[str, list[Sample]]:
    if text and not text.endswith("\n"):
        raise ScrapeError(ScrapeErrorReason.PARSE, "body does not end with a newline (truncated page)")
    lines = [
        line
        for line in text.split("\n")
        if line.startswith(_PREFIX) and line.partition("{")[0].split(None, 1)[0] in _WANTED
    ]
    by_name: dict[str, list[Sample]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            for s in family.samples:
                if all(s.labels.get(k) == v for k, v in label_match.items()):
                    by_name[s.name].append(s)
    except _PARSER_ERRORS as exc:
        raise ScrapeError(ScrapeErrorReason.PARSE, f"malformed DCGM line: {exc}") from exc
    return by_name


def _values(samples: list[Sample] | None) -> list[float]:
    values = []
    for s in samples or ():
        value = float(s.value)
        if not math.isfinite(value) or value < 0:
            raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"{s.name}{s.labels} = {value}")
        values.append(value)
    return values


def _mean(samples: list[Sample] | None) -> float | None:
    values = _values(samples)
    return sum(values) / len(values) if values else None


def _mean_ratio(samples: list[Sample] | None) -> float | None:
    mean = _mean(samples)
    # PROF ratios are sampled activity and can read a hair above 1.0.
    return min(mean, 1.0) if mean is not None else None


def _sum(samples: list[Sample] | None) -> float | None:
    values = _values(samples)
    return sum(values) if values else None


def _device_name(by_name: Mapping[str, list[Sample]]) -> str | None:
    """`modelName` of the lowest-numbered GPU (mixed GPU models on one exporter are rare; the first decides)."""
    named = [
        (s.labels.get(_GPU_LABEL, ""), s.labels[_MODEL_LABEL])
        for samples in by_name.values()
        for s in samples
        if s.labels.get(_MODEL_LABEL)
    ]
    if not named:
        return None
    return min(named, key=lambda pair: (len(pair[0]), pair[0]))[1]


class DcgmSource:
    """`GpuSource` over HTTP: GETs a dcgm-exporter page on every `read`. Failures go in `GpuSnapshot.error`."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        *,
        timeout_s: float = 5.0,
        max_body_bytes: int = 8 * 1024 * 1024,
        label_match: Mapping[str, str] | None = None,
    ) -> None:
        self._client = client
        self._url = url
        self._timeout_s = timeout_s
        self._max_body_bytes = max_body_bytes
        self._label_match = dict(label_match or {})

    async def read(self, now_s: float) -> GpuSnapshot:
        try:
            text = await fetch_text(
                self._client, self._url, timeout_s=self._timeout_s, max_body_bytes=self._max_body_bytes
            )
            return parse_dcgm_metrics(text, taken_at_s=now_s, label_match=self._label_match)
        except ScrapeError as exc:
            return GpuSnapshot(taken_at_s=now_s, source=SOURCE_DCGM, error=str(exc))
