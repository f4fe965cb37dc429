"""What a dcgm-exporter beside the simulated engine would serve: its `/metrics` page for one GPU.

Names, label set and units follow dcgm-exporter 4.x's default counters (the hand-made page in
tests/fixtures/sources/dcgm-exporter-2xh100.txt): PROF fields are ratios in 0..1 averaged over the collection
interval, DEV_GPU_UTIL a percentage, FB_* MiB. Rendered through prometheus_client like the engine's page.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_MIB = 1024.0 * 1024.0
_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname"]


@dataclass(frozen=True, slots=True)
class DcgmGauges:
    """One GPU's readings: activity ratios in 0..1 over the collection window, memory in bytes."""

    dram_active: float
    tensor_active: float
    busy: float
    fb_used_bytes: float
    fb_total_bytes: float


class _DcgmCollector(Collector):
    def __init__(self, gauges: DcgmGauges, *, model_name: str) -> None:
        self._g = gauges
        self._labels = ["0", "GPU-00000000-0000-0000-0000-000000000sim", "nvidia0", model_name, "spec-advisor-sim"]

    def collect(self) -> Iterator[Metric]:
        g = self._g
        free = max(g.fb_total_bytes - g.fb_used_bytes, 0.0)
        for name, help_text, value in (
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", round(100.0 * g.busy)),
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", round(g.fb_used_bytes / _MIB)),
            ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", round(free / _MIB)),
            ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", g.busy),
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", g.tensor_active),
            ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or "
             "receiving data.", g.dram_active),
        ):
            family = GaugeMetricFamily(name, help_text, labels=_LABELS)
            family.add_metric(self._labels, float(value))
            yield family


def render_dcgm(gauges: DcgmGauges, *, model_name: str) -> str:
    """The exporter's page in Prometheus text format 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DcgmCollector(gauges, model_name=model_name))
    return generate_latest(registry).decode("utf-8")
