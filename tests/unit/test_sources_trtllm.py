"""TensorRT-LLM's /prometheus/metrics page -> EngineSnapshot (service/sources/trtllm.py). Expected numbers are
worked by hand from the fixture's values (its header states them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.trtllm import parse_trtllm_metrics

PAGE = (Path(__file__).parents[1] / "fixtures" / "trtllm" / "trtllm-050f80d-eagle3-k3.txt").read_text()
MODEL = "Llama-3.1-8B-Instruct"
L = 'engine_type="pytorch",model_name="m"'


def test_the_fixture_reads_per_position_from_the_request_counters() -> None:
    snapshot = parse_trtllm_metrics(PAGE, taken_at_s=1.0)[MODEL]
    assert snapshot.spec is not None
    assert snapshot.spec.drafts == 17600  # drafted at position 0
    assert snapshot.spec.draft_tokens == 3 * 17600
    assert snapshot.spec.accepted_per_position == (13728, 10841, 8334)
    assert snapshot.spec.drafted_per_position == (17600, 17600, 17600)
    assert snapshot.spec.accepted_tokens == 13728 + 10841 + 8334
    assert snapshot.num_requests_running == 12 and snapshot.num_requests_waiting == 0
    assert snapshot.kv_cache_usage_ratio == pytest.approx(0.4121)
    assert snapshot.kv_cache_capacity_tokens == 20000 * 32
    assert snapshot.generation_tokens == 50951


def page(spec: str) -> str:
    return (f'trtllm_num_requests_running{{{L},pid="1"}} 3.0\ntrtllm_num_requests_waiting{{{L},pid="1"}} 0.0\n'
            + spec)


def config(enabled: str = "true", k: str = "4") -> str:
    return (f'trtllm_speculative_config_info{{{L},pid="1",spec_draft_model="d",spec_enabled="{enabled}",'
            f'spec_method="Eagle3",spec_num_tokens="{k}"}} 1.0\n')


def test_speculation_off_by_config_or_absent() -> None:
    assert parse_trtllm_metrics(page(config(enabled="false")), taken_at_s=1.0)["m"].spec is None
    assert parse_trtllm_metrics(page(""), taken_at_s=1.0)["m"].spec is None


def test_configured_but_nothing_finished_yet_is_k_zeros() -> None:
    spec = parse_trtllm_metrics(page(config(k="4")), taken_at_s=1.0)["m"].spec
    assert spec is not None and spec.accepted_per_position == (0, 0, 0, 0) and spec.drafts == 0


def test_positions_never_accepted_are_zero_up_to_the_configured_k() -> None:
    counters = "".join(
        f'trtllm_spec_decode_drafted_tokens_total{{{L},token_position="{i}"}} 10.0\n' for i in range(4)
    ) + f'trtllm_spec_decode_accepted_tokens_total{{{L},token_position="0"}} 6.0\n'
    spec = parse_trtllm_metrics(page(config(k="4") + counters), taken_at_s=1.0)["m"].spec
    assert spec is not None and spec.accepted_per_position == (6, 0, 0, 0) and spec.draft_tokens == 40


def test_totals_without_per_position_counters_are_a_missing_family() -> None:
    totals = f"trtllm_spec_decode_num_accepted_tokens_total{{{L}}} 120.0\n"
    with pytest.raises(ScrapeError) as caught:
        parse_trtllm_metrics(page(config() + totals), taken_at_s=1.0)
    assert caught.value.reason is ScrapeErrorReason.MISSING_FAMILY
    assert "#12636" in caught.value.detail


def test_a_deeper_position_accepted_more_often_is_invalid() -> None:
    counters = "".join(
        f'trtllm_spec_decode_drafted_tokens_total{{{L},token_position="{i}"}} 10.0\n' for i in range(2)
    ) + "".join(
        f'trtllm_spec_decode_accepted_tokens_total{{{L},token_position="{i}"}} {v}\n' for i, v in ((0, 3.0), (1, 5.0))
    )
    with pytest.raises(ScrapeError) as caught:
        parse_trtllm_metrics(page(config(k="2") + counters), taken_at_s=1.0)
    assert caught.value.reason is ScrapeErrorReason.INVALID_VALUE


def test_a_non_numeric_k_is_invalid() -> None:
    with pytest.raises(ScrapeError) as caught:
        parse_trtllm_metrics(page(config(k="many")), taken_at_s=1.0)
    assert caught.value.reason is ScrapeErrorReason.INVALID_VALUE


def test_a_position_accepted_more_often_than_drafted_is_invalid() -> None:
    counters = "".join(
        f'trtllm_spec_decode_drafted_tokens_total{{{L},token_position="{i}"}} {v}\n' for i, v in enumerate((10, 10, 2))
    ) + "".join(
        f'trtllm_spec_decode_accepted_tokens_total{{{L},token_position="{i}"}} {v}\n' for i, v in enumerate((9, 6, 5))
    )
    with pytest.raises(ScrapeError) as caught:
        parse_trtllm_metrics(page(config(k="3") + counters), taken_at_s=1.0)
    assert caught.value.reason is ScrapeErrorReason.INVALID_VALUE


def test_a_gone_process_series_is_not_added_to_the_live_one() -> None:
    # Two pids (a restarted worker's leftover mmap file): KV pool 20000 x 64 per process, running 12 and 3.
    text = "".join(
        f'trtllm_num_requests_running{{{L},pid="{pid}"}} {running}\n'
        f'trtllm_num_requests_waiting{{{L},pid="{pid}"}} 0.0\n'
        f'trtllm_kv_cache_max_blocks{{{L},pid="{pid}"}} 20000.0\n'
        f'trtllm_kv_cache_tokens_per_block{{{L},pid="{pid}"}} 64.0\n'
        for pid, running in (("11", 12.0), ("12", 3.0))
    )
    snapshot = parse_trtllm_metrics(text, taken_at_s=1.0)["m"]
    assert snapshot.kv_cache_capacity_tokens == 20000 * 64
    assert snapshot.num_requests_running == 12
