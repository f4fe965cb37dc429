"""A page within the body cap that repeats the families we read is refused before it costs seconds and memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.vllm import (
    MAX_ENGINES_PER_MODEL,
    MAX_MODELS_PER_PAGE,
    MAX_SAMPLE_LINES,
    parse_vllm_metrics,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IDLE = (FIXTURES / "vllm/vllm-0.32.0-cpu-ngram-k3-idle.txt").read_text()
T = 1_800_000_000.0


def engines_page(engines: int, *, model: str = "m") -> str:
    """`engines` engines of one model, each with the two gauges a snapshot needs."""
    lines: list[str] = []
    for e in range(engines):
        lines += [
            f'vllm:num_requests_running{{engine="{e}",model_name="{model}"}} 1.0',
            f'vllm:num_requests_waiting{{engine="{e}",model_name="{model}"}} 0.0',
        ]
    return "\n".join(lines) + "\n"


def reason_of(text: str) -> tuple[ScrapeErrorReason, str]:
    with pytest.raises(ScrapeError) as caught:
        parse_vllm_metrics(text, taken_at_s=T)
    return caught.value.reason, caught.value.detail


def test_a_page_repeating_one_family_100k_times_is_refused_by_its_line_count() -> None:
    # The probe's page: 100 000 num_requests_running series (6 MB, under the 8 MiB body cap) after a real page.
    flood = "".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1.0\n' for i in range(100_000))
    reason, detail = reason_of(IDLE + flood)
    assert reason is ScrapeErrorReason.TOO_MANY_SERIES
    assert "MAX_SAMPLE_LINES" in detail


def test_the_line_cap_counts_only_the_families_read() -> None:
    # 3x the cap of a family the parser does not read is the server's business: the real page is still read.
    other = "".join(f'vllm:prefix_cache_hits_total{{engine="{i}",model_name="x"}} 1.0\n'
                    for i in range(3 * MAX_SAMPLE_LINES))
    snapshots = parse_vllm_metrics(IDLE + other, taken_at_s=T)
    assert list(snapshots) == ["tiny"]


def test_engines_up_to_the_cap_are_summed_and_one_more_is_refused() -> None:
    snapshots = parse_vllm_metrics(engines_page(MAX_ENGINES_PER_MODEL), taken_at_s=T)
    assert snapshots["m"].engines == MAX_ENGINES_PER_MODEL
    assert snapshots["m"].num_requests_running == MAX_ENGINES_PER_MODEL
    reason, detail = reason_of(engines_page(MAX_ENGINES_PER_MODEL + 1))
    assert reason is ScrapeErrorReason.TOO_MANY_SERIES
    assert "MAX_ENGINES_PER_MODEL" in detail


def test_models_up_to_the_cap_are_read_and_one_more_is_refused() -> None:
    def models_page(count: int) -> str:
        return "".join(engines_page(1, model=f"model-{i}") for i in range(count))

    assert len(parse_vllm_metrics(models_page(MAX_MODELS_PER_PAGE), taken_at_s=T)) == MAX_MODELS_PER_PAGE
    reason, detail = reason_of(models_page(MAX_MODELS_PER_PAGE + 1))
    assert reason is ScrapeErrorReason.TOO_MANY_SERIES
    assert "MAX_MODELS_PER_PAGE" in detail


def test_thousands_of_invented_spec_names_still_name_a_renamed_family() -> None:
    # Without the known spec families, unknown vllm:spec_decode* names mean a renamed family (MISSING_FAMILY);
    # a page of 50 000 invented ones keeps only a bounded sample of them to quote.
    invented = "".join(f'vllm:spec_decode_x{i}_total{{engine="0",model_name="m"}} 1.0\n' for i in range(50_000))
    reason, detail = reason_of(engines_page(1) + invented)
    assert reason is ScrapeErrorReason.MISSING_FAMILY
    assert "more" in detail
    assert len(detail) < 1000
