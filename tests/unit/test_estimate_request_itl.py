"""`Evidence.request_itl`: the requests that finished in the window by their own mean inter-token latency, the
window's change in vllm:request_time_per_output_token_seconds, bucket by bucket."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from estimate_builders import FIXTURE_CREATED_S, FIXTURE_TAKEN_AT_S, advance, feed, make_snapshot

from policies.estimate.window import EstimatorConfig, estimate
from policies.types import EngineSnapshot, HistogramReading
from service.sources.vllm import parse_vllm_metrics

CONFIG = EstimatorConfig(window_s=60.0, min_drafts=0)
VLLM = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
BOUNDS = (0.025, 0.05, math.inf)


def histogram(total_s: float, counts: tuple[float, ...]) -> HistogramReading:
    return HistogramReading(sum=total_s, count=counts[-1], buckets=tuple(zip(BOUNDS, counts, strict=True)))


def _request_itl(snapshots: list[EngineSnapshot]) -> HistogramReading | None:
    state = feed(snapshots, CONFIG)
    return estimate(state, target="t", config=CONFIG, now_s=snapshots[-1].taken_at_s).request_itl


def test_the_window_holds_the_change_of_every_bucket() -> None:
    first = make_snapshot(request_itl=histogram(1.0, (10.0, 30.0, 32.0)))
    second = advance(first, dt_s=20.0, request_itl=histogram(2.9, (12.0, 70.0, 80.0)))
    window = _request_itl([first, second])
    assert window is not None
    assert window.sum == pytest.approx(1.9) and window.count == 48.0
    assert window.buckets == ((0.025, 2.0), (0.05, 40.0), (math.inf, 48.0))


def test_scrape_skew_never_gives_a_decreasing_cumulative_count() -> None:
    # The +Inf bucket read one request short of the 0.05 bucket's change (samples read at slightly different
    # instants): the cumulative counts stay non-decreasing and within the count.
    first = make_snapshot(request_itl=histogram(1.0, (10.0, 30.0, 32.0)))
    second = advance(first, dt_s=20.0, request_itl=HistogramReading(
        sum=2.0, count=70.0, buckets=((0.025, 12.0), (0.05, 71.0), (math.inf, 70.0))))
    window = _request_itl([first, second])
    assert window is not None
    assert window.count == 38.0
    assert window.buckets == ((0.025, 2.0), (0.05, 38.0), (math.inf, 38.0))


def test_none_when_the_buckets_changed_or_are_missing() -> None:
    first = make_snapshot(request_itl=histogram(1.0, (10.0, 30.0, 32.0)))
    moved = HistogramReading(sum=2.0, count=40.0, buckets=((0.02, 12.0), (0.05, 38.0), (math.inf, 40.0)))
    assert _request_itl([first, advance(first, dt_s=20.0, request_itl=moved)]) is None
    assert _request_itl([first, advance(first, dt_s=20.0, request_itl=None)]) is None
    no_buckets = make_snapshot(request_itl=HistogramReading(sum=1.0, count=10.0))
    assert _request_itl([no_buckets, advance(no_buckets, dt_s=20.0)]) is None


def test_real_vllm_captures_idle_then_after_30_requests() -> None:
    idle = parse_vllm_metrics(
        (VLLM / "vllm-0.32.0-cpu-ngram-k3-idle.txt").read_text(), taken_at_s=FIXTURE_CREATED_S + 10
    )
    after = parse_vllm_metrics(
        (VLLM / "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt").read_text(), taken_at_s=FIXTURE_TAKEN_AT_S
    )
    window = _request_itl([idle["tiny"], after["tiny"]])
    # Capture lines: vllm:request_time_per_output_token_seconds_count 0 -> 30, _sum 0 -> 0.019097..., every
    # bucket from le="0.01" up at 30 (the tiny model's requests ran at well under 10 ms per token).
    assert window is not None
    assert window.count == 30.0 and window.sum == pytest.approx(0.019097308873014408)
    assert window.buckets[0] == (0.01, 30.0) and window.buckets[-1] == (math.inf, 30.0)
    assert len(window.buckets) == 20


def test_requests_of_one_output_token_are_taken_out() -> None:
    # vLLM records a request with no token after its first as a mean ITL of 0: 10 of the 100 requests below sit
    # in every bucket and add nothing to the sum. Without them the mean is 3.0 / 90 = 33 ms, not 30 ms.
    first = make_snapshot(request_itl=histogram(0.0, (0.0, 0.0, 0.0)), single_token_requests=4.0)
    second = advance(first, dt_s=20.0, request_itl=histogram(3.0, (12.0, 90.0, 100.0)), single_token_requests=14.0)
    window = _request_itl([first, second])
    assert window is not None
    assert window.count == 90.0 and window.sum == pytest.approx(3.0)
    assert window.buckets == ((0.025, 2.0), (0.05, 80.0), (math.inf, 90.0))


def test_without_the_generation_tokens_histogram_the_window_is_left_as_read() -> None:
    first = make_snapshot(request_itl=histogram(0.0, (0.0, 0.0, 0.0)))
    second = advance(first, dt_s=20.0, request_itl=histogram(3.0, (12.0, 90.0, 100.0)), single_token_requests=14.0)
    window = _request_itl([first, second])
    assert window is not None
    assert window.count == 100.0 and window.buckets[0] == (0.025, 12.0)


def test_single_token_requests_read_from_the_le_1_bucket_of_a_real_capture() -> None:
    after = parse_vllm_metrics(
        (VLLM / "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt").read_text(), taken_at_s=FIXTURE_TAKEN_AT_S
    )
    # Capture line: vllm:request_generation_tokens_bucket{engine="0",le="1.0",model_name="tiny"} 0.0
    assert after["tiny"].single_token_requests == 0.0
    # Three of the thirty requests made to have given one token: every bucket below le="100.0" reads 3.
    edited = re.sub(
        r'(vllm:request_generation_tokens_bucket\{engine="0",le="(?:1|2|5|10|20|50)\.0",model_name="tiny"\}) 0\.0',
        r"\1 3.0",
        (VLLM / "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt").read_text(),
    )
    assert parse_vllm_metrics(edited, taken_at_s=FIXTURE_TAKEN_AT_S)["tiny"].single_token_requests == 3.0
