"""E[L](gamma): exact up to the deployed k, conservative beyond it, priors when nothing is measured."""

from __future__ import annotations

import itertools

import pytest
from costmodel_builders import make_acceptance

from policies.model.acceptance import (
    METHOD_PRIORS,
    acceptance_curve,
    expected_length,
    extrapolate_positions,
)
from policies.types import AcceptanceEvidence, DraftMethod


def test_expected_length_sums_positions() -> None:
    # 1 + 0.8 + 0.6 = 2.4; 1 + 0.8 + 0.6 + 0.4 = 2.8.
    assert expected_length((0.8, 0.6, 0.4), 0) == 1.0
    assert expected_length((0.8, 0.6, 0.4), 2) == pytest.approx(2.4)
    assert expected_length((0.8, 0.6, 0.4), 3) == pytest.approx(2.8)
    with pytest.raises(ValueError):
        expected_length((0.8,), 2)


def test_exact_for_gamma_up_to_k() -> None:
    acc = make_acceptance((0.9537, 0.8611, 0.8056))  # the CPU capture: 515/540, 465/540, 435/540
    curve = acceptance_curve(acc, method=DraftMethod.NGRAM, gamma_max=3)
    # 1; 1.9537; 1.9537 + 0.8611 = 2.8148; + 0.8056 = 3.6204 (= 1 + 1415/540 in the capture).
    assert [p.expected_length for p in curve] == pytest.approx([1.0, 1.9537, 2.8148, 3.6204])
    assert not any(p.extrapolated for p in curve)


def test_extrapolation_continues_the_last_conditional_shrunk() -> None:
    # c_2 = 0.6 / 0.8 = 0.75; per extra position x 0.9 x 0.75 = 0.675: r_3 = 0.405, r_4 = 0.273375.
    assert extrapolate_positions((0.8, 0.6), length=4, shrink=0.9) == pytest.approx((0.8, 0.6, 0.405, 0.273375))
    # k = 1: c_1 = r_1 / r_0 = 0.5 -> i.i.d. continuation 0.25, 0.125.
    assert extrapolate_positions((0.5,), length=3, shrink=1.0) == pytest.approx((0.5, 0.25, 0.125))
    # Shorter than k truncates; a zero position stops everything after it.
    assert extrapolate_positions((0.8, 0.6), length=1, shrink=0.9) == (0.8,)
    assert extrapolate_positions((0.5, 0.0), length=4, shrink=0.9) == (0.5, 0.0, 0.0, 0.0)


def test_extrapolation_is_monotone_flagged_and_below_the_iid_continuation() -> None:
    r = (0.78, 0.58, 0.43)
    curve = acceptance_curve(make_acceptance(r), method=DraftMethod.EAGLE3, gamma_max=10)
    values = [p.expected_length for p in curve]
    assert all(b >= a for a, b in itertools.pairwise(values))
    assert [p.extrapolated for p in curve] == [False] * 4 + [True] * 7
    # The i.i.d. continuation from c_3 = 0.43 / 0.58: r_{3+j} = 0.43 c^j.
    c = 0.43 / 0.58
    for point in curve[4:]:
        iid = 1 + sum(r) + sum(0.43 * c**j for j in range(1, point.gamma - 2))
        assert point.expected_length < iid
        assert point.expected_length_high == pytest.approx(iid)  # the high band is the i.i.d. continuation


def test_extrapolation_is_conservative_on_the_published_eagle3_sweep() -> None:
    # vllm-eagle-k-sweep-bs1.csv: eagle3 AL(3) = 2.79, measured AL(7) = 3.54 with k=7 deployed.
    curve = acceptance_curve(make_acceptance((0.78, 0.58, 0.43)), method=DraftMethod.EAGLE3, gamma_max=7)
    assert curve[7].expected_length <= 3.54
    assert curve[7].expected_length > 3.3  # but not absurdly pessimistic (AL(6) measured 3.46)


def test_band_contains_the_point_everywhere() -> None:
    acc = make_acceptance((0.7, 0.5, 0.3), low=(0.6, 0.45, 0.2), high=(0.8, 0.55, 0.4))
    curve = acceptance_curve(acc, method=DraftMethod.EAGLE, gamma_max=8)
    for p in curve:
        assert p.expected_length_low <= p.expected_length <= p.expected_length_high
    # gamma 2 exact: low 1 + 0.6 + 0.45 = 2.05, point 2.2, high 2.35.
    assert (curve[2].expected_length_low, curve[2].expected_length_high) == pytest.approx((2.05, 2.35))


def test_inconsistent_input_is_repaired() -> None:
    # A non-monotone point (0.5 then 0.6) is capped to 0.5; a low above the point is lowered to it; an interval
    # list of the wrong length falls back to the point.
    acc = make_acceptance((0.5, 0.6), low=(0.7, 0.1), high=(0.9,))
    curve = acceptance_curve(acc, method=DraftMethod.EAGLE, gamma_max=2)
    assert curve[2].expected_length == pytest.approx(2.0)  # 1 + 0.5 + 0.5
    assert curve[2].expected_length_low == pytest.approx(1.6)  # 1 + 0.5 + 0.1
    assert curve[2].expected_length_high == pytest.approx(2.0)


@pytest.mark.parametrize("method", list(DraftMethod))
def test_prior_when_nothing_is_measured(method: DraftMethod) -> None:
    alpha = METHOD_PRIORS[method].alpha
    curve = acceptance_curve(None, method=method, gamma_max=5)
    assert curve[0].expected_length == 1.0 and not curve[0].extrapolated
    assert all(p.extrapolated for p in curve[1:])
    # i.i.d.: E[L](3) = 1 + a + a^2 + a^3.
    assert curve[3].expected_length == pytest.approx(1 + alpha + alpha**2 + alpha**3)
    # Wide band: the low end uses 0.6 a, the high end 1 - 0.6 (1 - a).
    low_alpha = 0.6 * alpha
    assert curve[3].expected_length_low == pytest.approx(1 + low_alpha + low_alpha**2 + low_alpha**3)
    assert curve[3].expected_length_high > curve[3].expected_length + 0.2
    assert METHOD_PRIORS[method].source


def test_eagle3_prior_reproduces_the_published_acceptance_length() -> None:
    # vllm-eagle-k-sweep-bs1.csv: eagle3 k=3 AL 2.79; eagle1 k=3 AL 2.29.
    assert acceptance_curve(None, method=DraftMethod.EAGLE3, gamma_max=3)[3].expected_length == pytest.approx(
        2.79, abs=0.03
    )
    assert acceptance_curve(None, method=DraftMethod.EAGLE, gamma_max=3)[3].expected_length == pytest.approx(
        2.29, abs=0.03
    )


def test_empty_positions_use_the_prior_and_negative_gamma_fails() -> None:
    empty = make_acceptance(())
    assert acceptance_curve(empty, method=DraftMethod.NGRAM, gamma_max=2) == acceptance_curve(
        None, method=DraftMethod.NGRAM, gamma_max=2
    )
    with pytest.raises(ValueError):
        acceptance_curve(None, method=DraftMethod.NGRAM, gamma_max=-1)


def test_extrapolated_share_says_how_much_of_e_l_is_not_measured() -> None:
    measured = AcceptanceEvidence(
        per_position=(0.78, 0.58, 0.43), per_position_low=(0.78, 0.58, 0.43), per_position_high=(0.78, 0.58, 0.43),
        drafts=1000.0, draft_tokens=3000.0, accepted_tokens=1790.0, mean_acceptance_length=2.79,
        acceptance_rate=0.597, mean_proposed_length=3.0, window_s=60.0,
    )
    curve = acceptance_curve(measured, method=DraftMethod.EAGLE3, gamma_max=5)
    assert [p.extrapolated_share for p in curve[:4]] == [0.0, 0.0, 0.0, 0.0]
    # c_3 = 0.43 / 0.58 = 0.7414, step 0.9 x 0.7414 = 0.6672: r_4 = 0.2869, r_5 = 0.1914; E[L](5) = 2.79 + 0.4783
    # = 3.2683, of which 0.4783 / 3.2683 = 14.6% is extrapolated.
    assert curve[5].expected_length == pytest.approx(3.2683, abs=1e-3)
    assert curve[5].extrapolated_share == pytest.approx(0.4783 / 3.2683, abs=1e-3)
    # A prior: everything but the bonus token rests on it. alpha 0.76, gamma 2: E[L] = 1 + 0.76 + 0.5776 = 2.3376.
    prior = acceptance_curve(None, method=DraftMethod.EAGLE3, gamma_max=2)
    assert prior[2].extrapolated_share == pytest.approx(1.3376 / 2.3376)
