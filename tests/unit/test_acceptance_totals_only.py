"""Engines that count only the accepted total (SGLang): the estimator fits an i.i.d. profile to the measured mean,
and the curve is exact at the deployed k and bounded, flagged as extrapolated, below it
(policies/estimate/window.py `_iid_profile`, policies/model/acceptance.py `_shorter_than_measured`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.estimate.window import EstimatorConfig, EstimatorState, estimate, observe
from policies.model.acceptance import acceptance_curve
from policies.types import AcceptanceEvidence, DataState, DraftMethod, EngineSnapshot, SpecDecodeCounters

CONFIG = EstimatorConfig()


def sglang_like(t: float, drafts: float, accepted: float) -> EngineSnapshot:
    spec = SpecDecodeCounters(drafts=drafts, draft_tokens=3 * drafts, accepted_tokens=accepted,
                              accepted_per_position=(), declared_k=3)
    return EngineSnapshot(taken_at_s=t, model_name="m", engines=1, spec=spec, num_requests_running=4.0,
                          num_requests_waiting=0.0, naming="sglang")


def test_the_window_mean_is_fitted_by_an_iid_profile_with_that_sum() -> None:
    state = EstimatorState()
    for snapshot in (sglang_like(0.0, 1000.0, 1500.0), sglang_like(60.0, 2000.0, 3040.0)):
        state = observe(state, snapshot, CONFIG)
    evidence = estimate(state, target="t", config=CONFIG, now_s=60.0)
    acceptance = evidence.acceptance
    assert evidence.state is DataState.OK and acceptance is not None
    assert not acceptance.positions_measured and evidence.deployed_k == 3
    # 1540 accepted over 1000 drafts in the window: m = 1.54; alpha solves a + a^2 + a^3 = 1.54 -> 0.7018
    assert acceptance.mean_acceptance_length == pytest.approx(2.54)
    assert sum(acceptance.per_position) == pytest.approx(1.54, abs=1e-9)
    assert acceptance.per_position[0] == pytest.approx(0.7018, abs=1e-4)
    ratios = [b / a for a, b in zip((1.0, *acceptance.per_position), acceptance.per_position, strict=False)]
    assert max(ratios) - min(ratios) == pytest.approx(0.0, abs=1e-9)  # i.i.d.: the same ratio at every position
    assert sum(acceptance.per_position_low) < 1.54 < sum(acceptance.per_position_high)


def evidence(m_low: float, m: float, m_high: float) -> AcceptanceEvidence:
    def iid(total: float) -> tuple[float, ...]:
        low, high = 0.0, 1.0
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (mid, high) if mid + mid**2 + mid**3 < total else (low, mid)
        return (low, low**2, low**3)

    return AcceptanceEvidence(
        per_position=iid(m), per_position_low=iid(m_low), per_position_high=iid(m_high), drafts=1000.0,
        draft_tokens=3000.0, accepted_tokens=1000 * m, mean_acceptance_length=1 + m, acceptance_rate=m / 3,
        mean_proposed_length=3.0, window_s=60.0, positions_measured=False,
    )


def test_the_curve_is_exact_at_k_and_bounded_for_any_profile_below_it() -> None:
    points = acceptance_curve(evidence(1.54, 1.54, 1.54), method=DraftMethod.EAGLE, gamma_max=5)
    at_k = points[3]
    assert at_k.expected_length == pytest.approx(2.54) and not at_k.extrapolated
    one = points[1]
    # gamma 1: any non-increasing profile with sum 1.54 over 3 positions has r_1 in [1.54 / 3, min(1, 1.54)]
    assert one.extrapolated
    assert one.expected_length_low == pytest.approx(1 + 1.54 / 3)
    assert one.expected_length_high == pytest.approx(2.0)
    assert one.expected_length == pytest.approx(1.7018, abs=1e-4)
    # the share resting on the i.i.d. assumption: (1.7018 - 1.5133) / 1.7018
    assert one.extrapolated_share == pytest.approx((1.7018 - (1 + 1.54 / 3)) / 1.7018, abs=1e-4)
    two = points[2]
    assert two.expected_length_low == pytest.approx(1 + 2 * 1.54 / 3)
    assert two.expected_length_high == pytest.approx(2.54)  # min(2, 1.54) + 1
    assert points[4].extrapolated and points[5].extrapolated


def test_the_band_below_k_widens_with_the_means_interval() -> None:
    points = acceptance_curve(evidence(1.4, 1.54, 1.7), method=DraftMethod.EAGLE, gamma_max=3)
    assert points[1].expected_length_low == pytest.approx(1 + 1.4 / 3)
    assert points[1].expected_length_high == pytest.approx(2.0)
    assert points[3].expected_length_low == pytest.approx(2.4, abs=1e-6)
    assert points[3].expected_length_high == pytest.approx(2.7, abs=1e-6)


def test_counted_positions_are_read_exactly_below_k() -> None:
    measured = AcceptanceEvidence(
        per_position=(0.8, 0.5, 0.24), per_position_low=(0.8, 0.5, 0.24), per_position_high=(0.8, 0.5, 0.24),
        drafts=1000.0, draft_tokens=3000.0, accepted_tokens=1540.0, mean_acceptance_length=2.54,
        acceptance_rate=0.513, mean_proposed_length=3.0, window_s=60.0,
    )
    point = acceptance_curve(measured, method=DraftMethod.EAGLE, gamma_max=3)[1]
    assert point.expected_length == pytest.approx(1.8) and not point.extrapolated


def test_a_k_change_of_totals_only_counters_keeps_the_window() -> None:
    # SGLang's adaptive tiers change k batch by batch; its counters run on, so the window is not restarted.
    state = EstimatorState()
    first = sglang_like(0.0, 1000.0, 1500.0)
    second = sglang_like(60.0, 2000.0, 2800.0)
    assert second.spec is not None
    second = replace(second, spec=replace(second.spec, declared_k=5))
    for snapshot in (first, second):
        state = observe(state, snapshot, CONFIG)
    evidence = estimate(state, target="t", config=CONFIG, now_s=60.0)
    assert evidence.deployed_k == 5 and evidence.acceptance is not None
    assert evidence.acceptance.drafts == 1000 and not evidence.acceptance.cold_start
    assert evidence.acceptance.mean_acceptance_length == pytest.approx(1 + 1300 / 1000)
