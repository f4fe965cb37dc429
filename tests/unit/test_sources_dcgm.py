"""dcgm-exporter text -> GpuSnapshot. Expected values come from the fixture's header line (worked out there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.sources.dcgm import parse_dcgm_metrics
from service.sources.errors import ScrapeError, ScrapeErrorReason

PAGE = (Path(__file__).resolve().parents[1] / "fixtures" / "sources" / "dcgm-exporter-2xh100.txt").read_text()
T = 1_800_000_000.0
MIB = 1024 * 1024


def test_two_gpu_page_is_averaged_for_ratios_and_summed_for_memory() -> None:
    snap = parse_dcgm_metrics(PAGE, taken_at_s=T)
    assert (snap.source, snap.taken_at_s, snap.error) == ("dcgm", T, None)
    assert snap.device_name == "NVIDIA H100 80GB HBM3"
    assert snap.device_count == 2
    assert snap.gpu_util_ratio == pytest.approx(0.96)  # (97 % + 95 %) / 2 / 100
    assert snap.tensor_active_ratio == pytest.approx(0.400)  # (0.412 + 0.388) / 2
    assert snap.dram_active_ratio == pytest.approx(0.635)  # (0.655 + 0.615) / 2
    assert snap.sm_active_ratio == pytest.approx(0.850)  # (0.871 + 0.829) / 2
    assert snap.activity_source == "dcgm"
    assert snap.memory_used_bytes == 141_346 * MIB  # 71234 + 70112 MiB
    assert snap.memory_total_bytes == 163_118 * MIB  # 2 x (used + free + reserved) = 2 x 81559 MiB


def test_label_match_keeps_only_the_selected_gpu() -> None:
    snap = parse_dcgm_metrics(PAGE, taken_at_s=T, label_match={"gpu": "1"})
    assert snap.device_count == 1
    assert snap.tensor_active_ratio == pytest.approx(0.388)
    assert snap.memory_used_bytes == 70_112 * MIB


def test_page_without_profiling_fields_has_no_activity() -> None:
    text = "".join(line + "\n" for line in PAGE.splitlines() if "DCGM_FI_PROF_" not in line)
    snap = parse_dcgm_metrics(text, taken_at_s=T)
    assert snap.activity_source is None
    assert snap.tensor_active_ratio is None
    assert snap.gpu_util_ratio == pytest.approx(0.96)


def test_total_memory_field_is_preferred_when_exported() -> None:
    text = 'DCGM_FI_DEV_FB_USED{gpu="0"} 1000\nDCGM_FI_DEV_FB_FREE{gpu="0"} 10\nDCGM_FI_DEV_FB_TOTAL{gpu="0"} 2048\n'
    snap = parse_dcgm_metrics(text, taken_at_s=T)
    assert snap.memory_total_bytes == 2048 * MIB
    assert snap.device_name is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('DCGM_FI_PROF_SM_ACTIVE{gpu="0"} NaN\n', ScrapeErrorReason.INVALID_VALUE),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} -3\n', ScrapeErrorReason.INVALID_VALUE),
        ('DCGM_FI_PROF_SM_ACTIVE{gpu="0} 1\n', ScrapeErrorReason.PARSE),
        ('DCGM_FI_PROF_SM_ACTIVE{gpu="0"} 0.5', ScrapeErrorReason.PARSE),  # no final newline: truncated
        ("", ScrapeErrorReason.MODEL_MISSING),
        ("<html>not metrics</html>\n", ScrapeErrorReason.MODEL_MISSING),
    ],
)
def test_bad_pages_raise_scrape_errors(text: str, reason: ScrapeErrorReason) -> None:
    with pytest.raises(ScrapeError) as caught:
        parse_dcgm_metrics(text, taken_at_s=T)
    assert caught.value.reason is reason
