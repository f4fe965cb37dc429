"""Drafts counted per position (TensorRT-LLM): the acceptance among drafts that reached each position, which a
static k would see where a draft_len_schedule cut drafts short (policies/estimate/window.py `_given_drafted`,
policies/model/acceptance.py `full_length`). Numbers worked by hand in each test."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.estimate.window import EstimatorConfig, EstimatorState, estimate, observe
from policies.model.acceptance import acceptance_curve
from policies.types import AcceptanceEvidence, DraftMethod, EngineSnapshot, SpecDecodeCounters

CONFIG = EstimatorConfig(min_drafts=50)


def trt_like(t: float, drafted: tuple[float, ...], accepted: tuple[float, ...]) -> EngineSnapshot:
    spec = SpecDecodeCounters(drafts=drafted[0], draft_tokens=sum(drafted), accepted_tokens=sum(accepted),
                              accepted_per_position=accepted, drafted_per_position=drafted)
    return EngineSnapshot(taken_at_s=t, model_name="m", engines=1, spec=spec, num_requests_running=4.0,
                          num_requests_waiting=0.0, naming="trtllm")


BASE_DRAFTED = (1000.0, 1000.0, 1000.0)
BASE_ACCEPTED = (800.0, 550.0, 300.0)


def window(growth_drafted: tuple[float, ...], growth_accepted: tuple[float, ...]) -> AcceptanceEvidence | None:
    """The acceptance over one 60 s window in which the counters grew by these amounts."""
    drafted = tuple(a + b for a, b in zip(BASE_DRAFTED, growth_drafted, strict=True))
    accepted = tuple(a + b for a, b in zip(BASE_ACCEPTED, growth_accepted, strict=True))
    state = EstimatorState()
    for snapshot in (trt_like(0.0, BASE_DRAFTED, BASE_ACCEPTED), trt_like(60.0, drafted, accepted)):
        state = observe(state, snapshot, CONFIG)
    return estimate(state, target="t", config=CONFIG, now_s=60.0).acceptance


def test_a_schedule_that_drafted_the_last_position_half_as_often_is_seen_through() -> None:
    # 200 drafts; position 2 drafted by 100 of them; accepted (160, 110, 30):
    # per draft (0.80, 0.55, 0.15), among drafts that reached the position (0.80, 0.55, 0.30)
    acceptance = window((200.0, 200.0, 100.0), (160.0, 110.0, 30.0))
    assert acceptance is not None
    assert acceptance.per_position == pytest.approx((0.80, 0.55, 0.15))
    assert acceptance.per_position_given_drafted == pytest.approx((0.80, 0.55, 0.30))
    assert acceptance.mean_proposed_length == pytest.approx(500 / 200)
    low, high = acceptance.per_position_given_drafted_low, acceptance.per_position_given_drafted_high
    assert all(lo <= p <= hi for lo, p, hi in zip(low, acceptance.per_position_given_drafted, high, strict=True))
    assert high[2] - low[2] > high[1] - low[1]  # 100 trials at position 2 against 200 at position 1

    head = acceptance_curve(acceptance, method=DraftMethod.EAGLE3, gamma_max=4, full_length=True)
    lookup = acceptance_curve(acceptance, method=DraftMethod.NGRAM, gamma_max=4, full_length=False)
    # The deployed k=3 as it runs (the schedule cutting drafts): the measured per-draft profile, 2.5 proposed.
    assert head[3].expected_length == pytest.approx(1 + 0.80 + 0.55 + 0.15)
    assert head[3].verified_tokens == pytest.approx(1 + 500 / 200)
    # A static k=2 or 4 drafts every position: priced from the acceptance among drafts that reached it.
    assert head[2].expected_length == pytest.approx(1 + 0.80 + 0.55) and head[2].verified_tokens == pytest.approx(3.0)
    assert head[4].expected_length > 1 + 0.80 + 0.55 + 0.30  # extrapolated beyond 0.30, not beyond 0.15
    assert head[4].verified_tokens == pytest.approx(5.0)
    assert lookup[3].expected_length == pytest.approx(1 + 0.80 + 0.55 + 0.15)  # n-gram drafts end with the match
    assert lookup[4].expected_length < head[4].expected_length


def test_a_deeper_position_accepted_more_often_is_pooled_by_its_drafts() -> None:
    # ratios (0.5, 0.6) over 200 and 100 drafts pool to (0.5 x 200 + 0.6 x 100) / 300 = 0.5333 at both
    acceptance = window((200.0, 100.0, 0.0), (100.0, 60.0, 0.0))
    assert acceptance is not None
    given = acceptance.per_position_given_drafted
    assert given[0] == pytest.approx(160 / 300) and given[1] == pytest.approx(160 / 300)
    assert given[2] == pytest.approx(given[1])  # no draft reached position 2 in the window: the one before it


def test_a_base_without_drafted_counts_gives_no_given_drafted_profile() -> None:
    # Drafts counted per position only on the newer page: the window's deltas of them are unknown, not "all drafted".
    older = trt_like(0.0, BASE_DRAFTED, BASE_ACCEPTED)
    assert older.spec is not None
    older = replace(older, spec=replace(older.spec, drafted_per_position=()))
    newer = trt_like(60.0, (1200.0, 1200.0, 1100.0), (960.0, 660.0, 330.0))
    state = EstimatorState()
    for snapshot in (older, newer):
        state = observe(state, snapshot, CONFIG)
    acceptance = estimate(state, target="t", config=CONFIG, now_s=60.0).acceptance
    assert acceptance is not None and acceptance.per_position_given_drafted == ()


def test_a_spec_without_positions_or_k_measures_nothing_and_does_not_crash() -> None:
    spec = SpecDecodeCounters(drafts=100.0, draft_tokens=300.0, accepted_tokens=150.0, accepted_per_position=())
    snapshot = EngineSnapshot(taken_at_s=0.0, model_name="m", engines=1, spec=spec, num_requests_running=1.0,
                              num_requests_waiting=0.0)
    evidence = estimate(observe(EstimatorState(), snapshot, CONFIG), target="t", config=CONFIG, now_s=0.0)
    assert evidence.acceptance is None
