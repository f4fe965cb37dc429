"""`Evidence.decode_seqs_per_step`: sequences each engine step verified, Δ(ITL count) / Δ(iteration-tokens count).

vLLM v1 records one inter-token latency per request per step that gave it tokens (its first token excluded) and
one iteration-tokens observation per step that emitted output, so the ratio is the batch a step verified; the
running-requests gauge (`Evidence.batch`) stays what it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from estimate_builders import FIXTURE_CREATED_S, FIXTURE_TAKEN_AT_S, advance, feed, itl, make_snapshot

from policies.estimate.window import EstimatorConfig, estimate
from policies.types import EngineSnapshot, HistogramReading
from service.sources.vllm import parse_vllm_metrics

CONFIG = EstimatorConfig(window_s=60.0, min_drafts=0)
VLLM = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


def steps(count: float, tokens: float = 0.0) -> HistogramReading:
    """An iteration-tokens histogram reading: `count` engine steps, `tokens` in all (only the count is used)."""
    return HistogramReading(sum=tokens, count=count)


def _estimate(snapshots: list[EngineSnapshot]) -> float | None:
    state = feed(snapshots, CONFIG)
    return estimate(state, target="t", config=CONFIG, now_s=snapshots[-1].taken_at_s).decode_seqs_per_step


def test_window_ratio_of_itl_count_to_step_count() -> None:
    first = make_snapshot(inter_token_latency=itl(10.0, 1000.0), iteration_tokens=steps(200.0))
    second = advance(
        first, dt_s=20.0, inter_token_latency=itl(24.0, 1700.0), iteration_tokens=steps(300.0), num_requests_running=2.0
    )
    # Window deltas: ITL count 1700 - 1000 = 700 decode observations over 300 - 200 = 100 steps -> 7.0 per step.
    # The running gauge is a different quantity: mean of (0, 2) scrapes = 1.0, left as it was.
    state = feed([first, second], CONFIG)
    evidence = estimate(state, target="t", config=CONFIG, now_s=second.taken_at_s)
    assert evidence.decode_seqs_per_step == pytest.approx(7.0)
    assert evidence.batch == pytest.approx(1.0)


def test_steps_that_only_finished_prefills_count_as_zero_decode() -> None:
    first = make_snapshot(inter_token_latency=itl(1.0, 100.0), iteration_tokens=steps(50.0))
    # 40 more steps but only 30 more ITL observations: e.g. 30 one-sequence decode steps and 10 steps that only
    # produced first tokens (TTFT, not ITL) -> 30 / 40 = 0.75 sequences per step.
    second = advance(first, dt_s=10.0, inter_token_latency=itl(1.3, 130.0), iteration_tokens=steps(90.0))
    assert _estimate([first, second]) == pytest.approx(0.75)


def test_none_without_the_iteration_histogram_or_the_itl_histogram() -> None:
    no_steps = make_snapshot(inter_token_latency=itl(1.0, 100.0))
    assert _estimate([no_steps, advance(no_steps, dt_s=10.0, inter_token_latency=itl(2.0, 200.0))]) is None
    no_itl = make_snapshot(iteration_tokens=steps(50.0))
    assert _estimate([no_itl, advance(no_itl, dt_s=10.0, iteration_tokens=steps(60.0))]) is None


def test_none_when_no_step_ran_in_the_window() -> None:
    first = make_snapshot(inter_token_latency=itl(1.0, 100.0), iteration_tokens=steps(50.0))
    # Idle: neither count moved, 0 / 0 is not a batch.
    assert _estimate([first, advance(first, dt_s=10.0)]) is None


def test_none_when_a_reading_is_not_a_number() -> None:
    first = make_snapshot(inter_token_latency=itl(1.0, 100.0), iteration_tokens=steps(50.0))
    # A NaN count would otherwise be clipped to a zero change by the delta and read as "0 sequences per step".
    second = advance(first, dt_s=10.0, inter_token_latency=itl(2.0, float("nan")), iteration_tokens=steps(60.0))
    assert _estimate([first, second]) is None
    third = advance(first, dt_s=10.0, inter_token_latency=itl(2.0, 200.0), iteration_tokens=steps(float("nan")))
    assert _estimate([first, third]) is None


def test_a_restart_starts_a_new_baseline_instead_of_a_negative_delta() -> None:
    before = make_snapshot(inter_token_latency=itl(10.0, 1000.0), iteration_tokens=steps(200.0))
    # The server restarted between scrapes: both counts are small again (new created_s). The window restarts at the
    # new scrape and reads its lifetime counters: 90 ITL observations over 30 steps -> 3.0 per step (a delta across
    # the restart would be 90 - 1000 < 0).
    after = advance(
        before,
        dt_s=20.0,
        created_s=FIXTURE_CREATED_S + 110.0,
        inter_token_latency=itl(1.0, 90.0),
        iteration_tokens=steps(30.0),
    )
    assert _estimate([before, after]) == pytest.approx(3.0)


def test_real_vllm_captures_idle_then_after_30_requests() -> None:
    """vLLM 0.32.0 on 2 CPU cores (tests/fixtures/vllm): the same server idle, then after 30 requests."""
    idle = parse_vllm_metrics(
        (VLLM / "vllm-0.32.0-cpu-ngram-k3-idle.txt").read_text(), taken_at_s=FIXTURE_CREATED_S + 10
    )
    after = parse_vllm_metrics(
        (VLLM / "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt").read_text(), taken_at_s=FIXTURE_TAKEN_AT_S
    )
    state = feed([idle["tiny"], after["tiny"]], CONFIG)
    evidence = estimate(state, target="t", config=CONFIG, now_s=FIXTURE_TAKEN_AT_S)
    # Capture lines: vllm:inter_token_latency_seconds_count 0 -> 550, vllm:iteration_tokens_total_count 0 -> 162:
    # 550 / 162 = 3.395 sequences decoded per step. The running gauge reads 0 at both scrapes (the requests ran
    # between them), so the gauge's mean batch is 0 while the steps verified ~3.4 sequences each.
    assert evidence.decode_seqs_per_step == pytest.approx(550.0 / 162.0)
    assert evidence.batch == 0.0
    # Consistency of the counts themselves: 30 requests of 64 tokens each, the first token of each a TTFT, so at
    # most 30 x 63 = 1890 ITL observations; n-gram accepted 1415 drafts, so far fewer verifications (550).
    assert evidence.step_samples == pytest.approx(550.0)


def test_evidence_carries_the_data_parallel_engine_count() -> None:
    # The dp2 capture sums two engines' counters (engine="0" and engine="1"); observed_step_s needs to know that
    # two engines were busy at once, so the evidence carries the count the snapshot parsed.
    text = (VLLM / "synthetic-ngram-k5-dp2.txt").read_text(encoding="utf-8")
    (snapshot,) = parse_vllm_metrics(text, taken_at_s=FIXTURE_TAKEN_AT_S).values()
    assert snapshot.engines == 2
    later = advance(snapshot, dt_s=10.0)
    state = feed([snapshot, later], CONFIG)
    assert estimate(state, target="t", config=CONFIG, now_s=later.taken_at_s).engines == 2
    single = make_snapshot()
    assert estimate(feed([single, advance(single, dt_s=10.0)], CONFIG), target="t", config=CONFIG,
                    now_s=single.taken_at_s + 10.0).engines == 1
