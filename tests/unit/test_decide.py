"""decide(): the one rule (value over the horizon, wait = cost / gain), driven by a hand-advanced clock.

Every expected number below is worked by hand from the module docstring's formulas (policies/decide/rule.py,
policies/decide/value.py), not read back from the code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from decide_builders import T0, make_acceptance, make_curve, make_evidence, make_point

from policies.decide.rule import (
    DecideConfig,
    DecideInputs,
    DecideState,
    HorizonCurve,
    best_point,
    decide,
    reachable_gamma_limit,
    wait_s,
)
from policies.decide.value import trial_moments, trial_value
from policies.types import CurvePoint, DataState, Decision, Evidence, WhyCode

# margin 2%, confirm 30 s, dwell 120 s; change_cost_s 0 (an engine that adapts per batch): every wait is 30 s.
CFG = DecideConfig(margin=0.02, dwell_s=120.0, confirm_s=30.0, gamma_max=8)
# A 20 s restart over a 600 s horizon (in-flight work passed as 0 by `tick`, so C = 20 s).
COST = replace(CFG, change_cost_s=20.0, payback_horizon_s=600.0)

# Off -> on: g(gamma) = S_low(gamma) - 1 = 0.05, 0.25, 0.31, 0.30 for gamma 1..4: gamma 3 is the candidate.
GOOD = make_curve(1.10, 1.30, (1.31, 1.42, 1.55), 1.35)
# On at 2 (S 0.85 [0.80..0.91]): off gains (1 - 0.91) / 0.85 = 10.6%; gamma 1 and 3 lose.
BAD = make_curve((0.78, 0.82, 0.88), (0.80, 0.85, 0.91), (0.70, 0.80, 0.85))
# S(2)=1.03 [0.97..1.10]: from off every low end is < 1.02; on at 2, off gains (1 - 1.10) / 1.03 < 0: both hold.
BAND = make_curve((0.95, 1.01, 1.05), (0.97, 1.03, 1.10), (0.90, 1.00, 1.08))

OFF = make_evidence()
ON2 = make_evidence(speculation_on=True, deployed_k=2)
ON3 = make_evidence(speculation_on=True, deployed_k=3)


def tick(
    state: DecideState,
    t: float,
    curve: Sequence[CurvePoint],
    evidence: Evidence = OFF,
    config: DecideConfig = CFG,
) -> tuple[Decision, DecideState]:
    return decide(replace(evidence, at_s=t), curve, config, state, t, inputs=DecideInputs(inflight_s=0.0))


def published(state: DecideState) -> tuple[bool, int]:
    assert state.published is not None
    return state.published.enabled, state.published.num_speculative_tokens


def _published_on_gamma_2(curve: Sequence[CurvePoint] = BAND, config: DecideConfig = CFG) -> DecideState:
    # running gamma 2 on BAND: nothing beats it by the margin, so nothing is pending
    _, s = tick(DecideState(), T0, curve, ON2, config)
    assert (published(s), s.pending_enabled) == ((True, 2), None)
    return s


# ---- first decision


def test_first_decision_publishes_the_deployment_and_starts_the_clock() -> None:
    d, s = tick(DecideState(), T0, GOOD)
    assert (d.state, d.enabled, d.num_speculative_tokens) == (DataState.OK, False, 0)
    assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (1.0, 1.0, 1.0)
    assert d.changed_at_s == T0 and d.evaluated_at_s == T0
    assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, 3, T0)
    assert s.last_change_s is None  # the baseline is not a change: it does not hold the next one back
    assert "baseline is the current deployment (off)" in d.reason


def test_first_decision_while_on_reports_the_running_gamma_from_the_curve() -> None:
    d, s = tick(DecideState(), T0, GOOD, ON2)
    # running gamma 2 on GOOD: S(2)=1.30, default band +-0.05 -> [1.25..1.35]
    assert (d.enabled, d.num_speculative_tokens) == (True, 2)
    assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (1.30, 1.25, 1.35)
    # gamma 3 gains (1.42 - 1.30) / 1.30 = 9.2% (no gain_sd: measured), gamma 4 3.8%: gamma 3 waits
    assert (s.pending_enabled, s.pending_gamma) == (True, 3)


def test_curve_is_passed_through() -> None:
    d, _ = tick(DecideState(), T0, GOOD)
    assert d.curve == GOOD
    assert (d.target, d.model) == (OFF.target, OFF.model)


# ---- the wait: cost / gain between confirm_s and dwell_s


def test_wait_is_the_cost_over_the_gain_clipped_to_confirm_and_dwell() -> None:
    assert wait_s(cost_s=22.6, gain=0.04, confirm_s=30.0, dwell_s=120.0) == 120.0  # 565 s -> the dwell
    assert wait_s(cost_s=22.6, gain=0.70, confirm_s=30.0, dwell_s=120.0) == pytest.approx(32.286, abs=1e-3)
    assert wait_s(cost_s=20.0, gain=0.25, confirm_s=30.0, dwell_s=120.0) == pytest.approx(80.0)
    assert wait_s(cost_s=0.0, gain=0.05, confirm_s=30.0, dwell_s=120.0) == 30.0  # free: the confirm
    assert wait_s(cost_s=20.0, gain=0.0, confirm_s=30.0, dwell_s=120.0) == 120.0  # nothing forgone


def test_a_free_change_is_published_after_the_confirm_not_before() -> None:
    s = DecideState()
    for dt in (0.0, 10.0, 29.0):
        d, s = tick(s, T0 + dt, GOOD)
        assert (d.enabled, d.num_speculative_tokens) == (False, 0), dt
    d, s = tick(s, T0 + 30.0, GOOD)
    assert (d.enabled, d.num_speculative_tokens) == (True, 3)
    assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (1.42, 1.31, 1.55)
    assert d.changed_at_s == T0 + 30.0 and s.last_change_s == T0 + 30.0
    assert s.pending_enabled is None and s.pending_gamma is None and s.pending_since_s is None
    d, s = tick(s, T0 + 90.0, GOOD)
    assert (d.enabled, d.num_speculative_tokens, d.changed_at_s) == (True, 3, T0 + 30.0)


def test_a_restart_waits_its_cost_over_its_gain() -> None:
    # Off -> gamma 3 gains 31% at the low end, so it is worth a restart; waiting forgoes its expected gain, 42%
    # (S 1.42): C = 20 s, 20 / 0.42 = 47.6 s.
    s = DecideState()
    for dt in (0.0, 30.0, 47.0):
        d, s = tick(s, T0 + dt, GOOD, config=COST)
        assert d.enabled is False, dt
    assert "wait 48s (cost today 20.0s / gain expected now +42.0%, in 30..120s)" in d.reason
    d, s = tick(s, T0 + 48.0, GOOD, config=COST)
    assert (d.enabled, d.num_speculative_tokens) == (True, 3)


def test_an_unsure_but_large_gain_waits_its_expected_rent_not_its_band_end() -> None:
    # Off -> gamma 3 at S 1.60 [1.05..2.40]: the low end gains 5%, 600 x 0.05 = 30 s > C 20 s: worth a restart.
    # Each second of waiting forgoes the expected 60%, not the 5% the band guarantees: 20 / 0.60 = 33 s, not the
    # 20 / 0.05 = 400 s -> 120 s dwell of the band's end.
    wide = make_curve(1.02, 1.04, (1.05, 1.60, 2.40), 1.03)
    s = DecideState()
    d, s = tick(s, T0, wide, config=COST)
    assert "wait 33s (cost today 20.0s / gain expected now +60.0%" in d.reason
    d, s = tick(s, T0 + 33.0, wide, config=COST)
    assert d.enabled is False
    d, s = tick(s, T0 + 34.0, wide, config=COST)
    assert (d.enabled, d.num_speculative_tokens) == (True, 3)


def test_a_grossly_wrong_setting_is_corrected_after_the_confirm_not_a_dwell() -> None:
    # k=8 at moderate load: S(8) 0.70; gamma 2 at 1.30 gains (1.30 - 0.70) / 0.70 = 85.7%; C = 20 s: 23 s -> 30 s.
    wrong = make_curve(1.10, 1.30, 1.25, 1.20, 1.10, 1.00, 0.90, 0.70)
    on8 = make_evidence(speculation_on=True, deployed_k=8)
    _, s = tick(DecideState(), T0, wrong, on8, COST)
    assert (s.pending_enabled, s.pending_gamma) == (True, 2)
    d, s = tick(s, T0 + 29.0, wrong, on8, COST)
    assert d.num_speculative_tokens == 8
    d, s = tick(s, T0 + 30.0, wrong, on8, COST)
    assert (d.enabled, d.num_speculative_tokens) == (True, 2)


def test_a_small_gain_that_pays_waits_the_whole_dwell() -> None:
    # On at 2 (S 1.40); gamma 3 at 1.46 gains 0.06 / 1.40 = 4.29%: 600 x 0.0429 = 25.7 s > 20 s, wait 466 -> 120 s.
    s = _published_on_gamma_2(make_curve(1.10, 1.40, 1.40), COST)
    curve = make_curve(1.10, 1.40, 1.46)
    d, s = tick(s, T0 + 10.0, curve, ON2, COST)
    assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, 3, T0 + 10.0)
    assert "gains +4.3% at its band's low end x 600s = 25.7s vs change cost 20.0s" in d.reason
    d, s = tick(s, T0 + 129.0, curve, ON2, COST)
    assert d.num_speculative_tokens == 2
    d, s = tick(s, T0 + 130.0, curve, ON2, COST)
    assert (d.num_speculative_tokens, d.expected_speedup) == (3, 1.46)


def test_a_gain_that_does_not_pay_its_restart_is_held_back() -> None:
    # gamma 3 at 1.44: 2.86% >= the margin, but 600 x 0.0286 = 17.1 s < 20 s.
    s = _published_on_gamma_2(make_curve(1.10, 1.40, 1.40), COST)
    for i in range(1, 6):
        d, s = tick(s, T0 + 60.0 * i, make_curve(1.10, 1.40, 1.44), ON2, COST)
        assert (d.num_speculative_tokens, s.pending_enabled) == (2, None), i
    assert "17.1s vs change cost 20.0s: held back by its cost" in d.reason


def test_a_restart_is_weighed_at_the_low_end_of_the_gains_band() -> None:
    # gamma 3 at 1.50 is +7.1% on the point; with gain_sd 0.04 its low end is 1.50 exp(-0.0658) = 1.4045, +0.3%:
    # below the margin.
    s = _published_on_gamma_2(make_curve(1.10, 1.40, 1.40), COST)
    curve = make_curve(1.10, 1.40, 1.50)
    unsure = (*curve[:3], replace(curve[3], gain_sd=0.04))
    d, s = tick(s, T0 + 10.0, unsure, ON2, COST)
    assert s.pending_enabled is None and "gains +0.3% at its band's low end < margin 2%" in d.reason
    # A free move (no restart) is taken on its expected gain, +7.1%: the next window shows whether it was right.
    _, s = tick(_published_on_gamma_2(make_curve(1.10, 1.40, 1.40)), T0 + 10.0, unsure, ON2)
    assert (s.pending_enabled, s.pending_gamma) == (True, 3)


def test_changes_stay_a_dwell_apart() -> None:
    s = DecideState()
    _, s = tick(s, T0, GOOD)
    d, s = tick(s, T0 + 30.0, GOOD)  # on at 3 (a change at T0+30)
    on3 = replace(ON2, deployed_k=3)
    bad3 = make_curve((0.78, 0.82, 0.88), 0.85, (0.80, 0.85, 0.91))  # S(3) 0.85 [0.80..0.91]: off gains 10.6%
    _, s = tick(s, T0 + 40.0, bad3, on3)
    assert (s.pending_enabled, s.pending_since_s) == (False, T0 + 40.0)
    d, s = tick(s, T0 + 70.0, bad3, on3)  # waited 30 s, but the last change was 40 s ago
    assert d.enabled is True
    assert "waiting 30s of 30s before switching off (from gamma 3) (80s more: last change 40s ago)" in d.reason
    d, s = tick(s, T0 + 149.0, bad3, on3)
    assert d.enabled is True
    d, s = tick(s, T0 + 150.0, bad3, on3)  # 120 s after the change at T0+30
    assert (d.enabled, d.changed_at_s) == (False, T0 + 150.0)


def test_a_spell_of_bad_data_keeps_the_spacing_after_a_change() -> None:
    s = DecideState()
    _, s = tick(s, T0, GOOD)
    _, s = tick(s, T0 + 30.0, GOOD)  # on at 3: a change at T0+30
    on3 = replace(ON2, deployed_k=3)
    _, s = tick(s, T0 + 40.0, (), replace(on3, state=DataState.STALE, reason="503"))
    assert s.last_change_s == T0 + 30.0
    bad3 = make_curve((0.78, 0.82, 0.88), 0.85, (0.80, 0.85, 0.91))
    _, s = tick(s, T0 + 50.0, bad3, on3)
    d, s = tick(s, T0 + 100.0, bad3, on3)  # 50 s of off as the candidate, but the change was 70 s ago
    assert d.enabled is True
    d, s = tick(s, T0 + 150.0, bad3, on3)
    assert (d.enabled, d.changed_at_s) == (False, T0 + 150.0)


def test_flip_flopping_candidate_never_publishes() -> None:
    s = DecideState()
    for i in range(20):  # 20 ticks 60 s apart: each GOOD starts a fresh clock, each BAD withdraws it
        d, s = tick(s, T0 + 60.0 * i, GOOD if i % 2 == 0 else BAD)
        assert (d.enabled, d.num_speculative_tokens) == (False, 0), i


# Near-equal neighbours: S(3) and S(4) swap places by 0.01.
NEAR3 = make_curve(1.10, 1.30, (1.31, 1.42, 1.55), (1.30, 1.41, 1.54))  # best low end: gamma 3
NEAR4 = make_curve(1.10, 1.30, (1.30, 1.41, 1.54), (1.31, 1.42, 1.55))  # best low end: gamma 4


def test_alternating_gammas_keep_one_clock_and_publish_the_candidate_of_the_tick() -> None:
    s = DecideState()
    for i in range(3):  # T0, +10, +20: the best gamma alternates 3, 4, 3 on one on/off clock
        d, s = tick(s, T0 + 10.0 * i, NEAR3 if i % 2 == 0 else NEAR4)
        assert d.enabled is False, i
        assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, 3 if i % 2 == 0 else 4, T0), i
    assert "waiting 20s of 30s before switching on at gamma 3" in d.reason
    d, s = tick(s, T0 + 30.0, NEAR4)
    assert (d.enabled, d.num_speculative_tokens, d.changed_at_s) == (True, 4, T0 + 30.0)
    # Once on at 4, gamma 3's gain over it is (1.42 - 1.41) / 1.41 = 0.7% < 2%: no churn.
    for i in range(4, 12):
        d, s = tick(s, T0 + 10.0 * i, NEAR3 if i % 2 == 0 else NEAR4, replace(ON2, deployed_k=4))
        assert (d.enabled, d.num_speculative_tokens, s.pending_enabled) == (True, 4, None), i


def test_one_clock_times_how_long_some_change_has_been_worth_making() -> None:
    s = _published_on_gamma_2()
    _, s = tick(s, T0 + 10.0, BAD, ON2)  # off is worth making since T0+10
    assert (s.pending_enabled, s.pending_since_s, s.candidate_since_s) == (False, T0 + 10.0, T0 + 10.0)
    # GOOD while on at 2: gamma 3 gains 9.2%: another change, but gamma 2 is still worse than something, so the
    # wait's clock runs on; the candidate's own on/off state starts afresh
    _, s = tick(s, T0 + 20.0, GOOD, ON2)
    assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, 3, T0 + 10.0)
    assert s.candidate_since_s == T0 + 20.0
    d, s = tick(s, T0 + 49.0, GOOD, ON2)
    assert (d.enabled, d.num_speculative_tokens) == (True, 2)
    d, s = tick(s, T0 + 50.0, GOOD, ON2)  # on at 3 for 30 s (the confirm), and 40 s >= the 30 s wait
    assert (d.enabled, d.num_speculative_tokens, d.changed_at_s) == (True, 3, T0 + 50.0)


def test_one_bad_tick_cannot_publish_a_change_another_was_waiting_for() -> None:
    # On at 2 (S 1.40) with a 20 s restart: gamma 3 at 1.46 (+4.3%) waits the whole 120 s dwell from T0+10.
    s = _published_on_gamma_2(make_curve(1.10, 1.40, 1.40), COST)
    slow = make_curve(1.10, 1.40, 1.46)
    _, s = tick(s, T0 + 10.0, slow, ON2, COST)
    _, s = tick(s, T0 + 110.0, slow, ON2, COST)
    # One window says gamma 2 is far worse than off (S(2) 0.50 [0.45..0.55]: off +90% at S(2)'s high end, a 30 s
    # wait): the clock has run 100 s, but off has been the candidate for 0 s of the 30 s confirm.
    outlier = make_curve(0.55, 0.50)
    d, s = tick(s, T0 + 110.0, outlier, ON2, COST)
    assert (d.enabled, d.num_speculative_tokens) == (True, 2)
    assert "its side held 0s of 30s" in d.reason
    # Back to what it was: gamma 3 has waited 120 s at T0+130 but its side has held only 1 s since T0+129.
    d, s = tick(s, T0 + 129.0, slow, ON2, COST)
    assert d.num_speculative_tokens == 2
    d, s = tick(s, T0 + 130.0, slow, ON2, COST)
    assert d.num_speculative_tokens == 2 and "its side held 1s of 30s" in d.reason
    d, s = tick(s, T0 + 159.0, slow, ON2, COST)  # more drafts for 30 s since T0+129; 149 s >= 120 s
    assert (d.enabled, d.num_speculative_tokens) == (True, 3)


def test_an_outlying_window_naming_another_gamma_cannot_ride_the_pending_clock() -> None:
    # As above, but the outlier says gamma 1 (S 1.00) gains (1.00 - 0.50) / 0.50 = 100% over S(2) 0.50: fewer drafts,
    # the other side from the pending gamma 3. Its side has held 0 s: not published.
    s = _published_on_gamma_2(make_curve(1.10, 1.40, 1.40), COST)
    slow = make_curve(1.10, 1.40, 1.46)
    _, s = tick(s, T0 + 10.0, slow, ON2, COST)
    d, s = tick(s, T0 + 110.0, make_curve((0.95, 1.00, 1.05), (0.45, 0.50, 0.55), 0.40), ON2, COST)
    assert d.num_speculative_tokens == 2 and "switching gamma 2->1" in d.reason and "its side held 0s" in d.reason


def test_a_candidate_moving_between_off_and_fewer_drafts_keeps_its_side() -> None:
    # On at 3 with S(3) 0.50 [0.45..0.55]: off gains (1 - 0.55) / 0.50 = 90%, a 30 s wait. The first window offers
    # off, the next gamma 1 (S 1.40 [1.35..1.45]: +180% over gamma 3): both are less speculation, one direction,
    # so the side held since T0 and the change is published at T0 + 30 s, not T0 + 5 + 30 s.
    worse = make_curve((0.75, 0.80, 0.85), (0.70, 0.75, 0.80), (0.45, 0.50, 0.55))
    _, s = tick(DecideState(), T0, worse, ON3, COST)
    assert (s.pending_enabled, s.candidate_since_s) == (False, T0)
    fewer = make_curve((1.35, 1.40, 1.45), (0.70, 0.75, 0.80), (0.45, 0.50, 0.55))
    _, s = tick(s, T0 + 5.0, fewer, ON3, COST)
    assert (s.pending_enabled, s.pending_gamma, s.candidate_since_s) == (True, 1, T0)
    d, s = tick(s, T0 + 30.0, fewer, ON3, COST)
    assert (d.enabled, d.num_speculative_tokens) == (True, 1)


def test_a_pending_change_that_no_longer_gains_is_withdrawn_after_confirm_s() -> None:
    # On at 2, BAD makes off the candidate (less speculation). In the next window off gains (1 - 1.00) / 1.00 = 0,
    # although gamma 3 is now expected to gain +3% (the other side). One window cannot withdraw the candidate (as
    # one cannot publish it): it keeps its wait until it has not been worth a change for confirm_s (30 s).
    _, s = tick(DecideState(), T0, BAD, ON2, COST)
    assert (published(s), s.pending_enabled) == ((True, 2), False)
    lean_up = make_curve((0.78, 0.82, 0.88), (0.90, 1.00, 1.10), (0.80, 1.03, 1.30))
    d, s = tick(s, T0 + 10.0, lean_up, ON2, COST)
    assert d.named(WhyCode.WITHDRAWN) is None and (published(s), s.pending_enabled) == ((True, 2), False)
    assert (s.pending_since_s, s.not_worth_since_s) == (T0, T0 + 10.0)
    assert "not worth a change this window, withdrawn after 30s of it (0s so far)" in d.reason
    d, s = tick(s, T0 + 40.0, lean_up, ON2, COST)  # 30 s of it
    assert d.named(WhyCode.WITHDRAWN) is not None and s.pending_since_s is None and s.not_worth_since_s is None


def test_a_spell_without_a_gain_holds_the_wait_and_a_longer_one_restarts_it() -> None:
    _, s = tick(DecideState(), T0, GOOD)  # off -> on at 3 worth it from T0: a 30 s wait (no change cost)
    d, s = tick(s, T0 + 10.0, FLAT)
    assert d.enabled is False and s.pending_since_s == T0 and s.not_worth_since_s == T0 + 10.0
    d, s = tick(s, T0 + 20.0, GOOD)  # back: the 10 s spell is not counted, the wait resumes from T0 + 10
    assert d.enabled is False and s.not_worth_since_s is None and s.pending_since_s == T0 + 10.0
    d, s = tick(s, T0 + 39.0, GOOD)
    assert d.enabled is False
    d, s = tick(s, T0 + 40.0, GOOD)  # 30 s worth making: published
    assert (d.enabled, d.num_speculative_tokens, d.changed_at_s) == (True, 3, T0 + 40.0)
    # Windows without a gain between two that have one do not publish the change by themselves.
    _, s = tick(DecideState(), T0, GOOD)
    for t in (10.0, 20.0, 29.0):
        _, s = tick(s, T0 + t, FLAT)
    d, s = tick(s, T0 + 30.0, GOOD)
    assert d.enabled is False and s.pending_since_s == T0 + 20.0
    # The same start, but 35 s without a gain before the candidate is back: a new wait from then.
    _, s = tick(DecideState(), T0, GOOD)
    _, s = tick(s, T0 + 10.0, FLAT)
    _, s = tick(s, T0 + 25.0, FLAT)  # 15 s of it: still waiting since T0
    assert s.pending_since_s == T0
    d, s = tick(s, T0 + 45.0, GOOD)
    assert d.enabled is False and s.pending_since_s == T0 + 45.0
    d, s = tick(s, T0 + 74.0, GOOD)
    assert d.enabled is False
    d, s = tick(s, T0 + 75.0, GOOD)
    assert (d.enabled, d.num_speculative_tokens) == (True, 3)


def test_a_spell_moves_the_side_clock_on_too() -> None:
    # Running gamma 2: off is worth it from T0 (one wait clock), gamma 3 from T0 + 10 (the side clock restarts: more
    # speculation now). A 10 s spell without a gain at T0 + 20 moves both clocks on by 10 s: the wait (30 s since
    # T0 + 10) is served at T0 + 40, the side (30 s since T0 + 20) only at T0 + 50.
    lean_up = make_curve((0.78, 0.82, 0.88), (0.90, 1.00, 1.10), (0.80, 1.03, 1.30))
    _, s = tick(DecideState(), T0, BAD, ON2)
    _, s = tick(s, T0 + 10.0, lean_up, ON2)
    assert (s.pending_gamma, s.pending_since_s, s.candidate_since_s) == (3, T0, T0 + 10.0)
    _, s = tick(s, T0 + 20.0, BAND, ON2)
    d, s = tick(s, T0 + 30.0, lean_up, ON2)
    assert (s.pending_since_s, s.candidate_since_s) == (T0 + 10.0, T0 + 20.0)
    d, s = tick(s, T0 + 45.0, lean_up, ON2)
    assert published(s) == (True, 2) and "its side held 25s of 30s" in d.reason
    d, s = tick(s, T0 + 50.0, lean_up, ON2)
    assert published(s) == (True, 3)


def test_a_spell_of_confirm_s_noticed_only_when_the_candidate_returns_withdraws_it() -> None:
    _, s = tick(DecideState(), T0, GOOD)
    _, s = tick(s, T0 + 10.0, FLAT)
    d, s = tick(s, T0 + 40.0, GOOD)  # the spell ran from T0 + 10 to now: 30 s, a new wait from T0 + 40
    assert d.named(WhyCode.WITHDRAWN) is not None and s.pending_since_s == T0 + 40.0


def test_without_a_confirm_time_a_change_still_waits_its_break_even_time_and_is_published() -> None:
    config = replace(COST, confirm_s=0.0)  # no confirmation: a window without a gain withdraws at once
    _, s = tick(DecideState(), T0, GOOD, OFF, config)
    d, s = tick(s, T0 + 10.0, FLAT, OFF, config)
    assert d.named(WhyCode.WITHDRAWN) is not None and s.pending_since_s is None and s.not_worth_since_s is None
    s, published_at = DecideState(), None
    for i in range(13):
        d, s = tick(s, T0 + 10.0 * i, GOOD, OFF, config)
        if d.enabled and published_at is None:
            published_at = 10.0 * i
    assert published_at is not None and 0.0 < published_at <= 60.0


def test_a_broken_point_prices_nothing() -> None:
    # gamma 1's low end is NaN: it is left out, and gamma 3 (low end 1.31, +31%) is still the candidate from off.
    broken = (GOOD[0], replace(GOOD[1], speedup_low=float("nan")), *GOOD[2:])
    _, s = tick(DecideState(), T0, broken)
    assert (s.pending_enabled, s.pending_gamma) == (True, 3)


# Every gamma's point within the margin of plain decoding (S(2) = 1.01): nothing is even expected to gain.
FLAT = make_curve((0.95, 1.00, 1.05), (0.96, 1.01, 1.08), (0.90, 0.99, 1.08))


def test_candidate_returning_to_published_clears_the_clock() -> None:
    s = DecideState()
    _, s = tick(s, T0, GOOD)
    _, s = tick(s, T0 + 20.0, GOOD)
    d, s = tick(s, T0 + 25.0, FLAT)  # no gamma expected to gain the margin: candidate == published, one window
    assert s.pending_since_s == T0 and d.named(WhyCode.WITHDRAWN) is None
    d, s = tick(s, T0 + 55.0, FLAT)  # 30 s of it
    assert s.pending_since_s is None
    assert "withdrawn" in d.reason and d.named(WhyCode.WITHDRAWN) is not None
    # On BAND (every low end below 1.02, gamma 2's point +3%) the pending gamma 3 is withdrawn too.
    _, s2 = tick(DecideState(), T0, GOOD)
    _, s2 = tick(s2, T0 + 20.0, BAND)
    d, s2 = tick(s2, T0 + 50.0, BAND)
    assert s2.pending_since_s is None and d.named(WhyCode.WITHDRAWN) is not None
    d, s = tick(s, T0 + 70.0, GOOD)  # the clock starts again at T0+70
    d, s = tick(s, T0 + 99.0, GOOD)
    assert d.enabled is False
    d, s = tick(s, T0 + 100.0, GOOD)
    assert (d.enabled, d.num_speculative_tokens) == (True, 3)


# ---- hysteresis: the pessimistic band on both sides


def test_band_holds_off_when_off() -> None:
    s = DecideState()
    for i in range(10):
        d, s = tick(s, T0 + 60.0 * i, BAND)
        assert (d.enabled, s.pending_enabled) == (False, None)
    # the best low end, S_low(2) = 0.97, gains -3% < 2%
    assert "stays: on, gamma 2 S(2)=1.03 [0.97..1.10] gains -3.0% at its band's low end < margin 2%" in d.reason


def test_band_holds_on_when_on() -> None:
    s = _published_on_gamma_2()
    for i in range(1, 10):
        d, s = tick(s, T0 + 60.0 * i, BAND, ON2)
        assert (d.enabled, d.num_speculative_tokens, s.pending_enabled) == (True, 2, None)
    # off would gain (1 - 1.10) / 1.03 = -9.7% at speculation's best; gamma 1: (1.01 - 1.03) / 1.03 = -1.9%
    assert "stays: on, gamma 1" in d.reason and "gains -1.9%" in d.reason


def test_switches_off_after_the_confirm_when_the_high_end_drops_below_one_by_the_margin() -> None:
    s = _published_on_gamma_2()
    d, s = tick(s, T0 + 10.0, BAD, ON2)
    assert (d.enabled, s.pending_enabled, s.pending_gamma) == (True, False, 0)
    assert "off gains +10.6% against the running option's band high end" in d.reason
    d, s = tick(s, T0 + 40.0, BAD, ON2)
    assert (d.enabled, d.num_speculative_tokens) == (False, 0)
    assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (1.0, 1.0, 1.0)
    assert d.changed_at_s == T0 + 40.0
    # High end 0.99: off gains (1 - 0.99) / 0.95 = 1.1% < 2%: a loss inside the margin keeps what runs.
    close = make_curve((0.78, 0.82, 0.88), (0.90, 0.95, 0.99), (0.70, 0.80, 0.85))
    _, s = tick(_published_on_gamma_2(), T0 + 10.0, close, ON2)
    assert s.pending_enabled is None


def test_gamma_moves_only_for_the_margin() -> None:
    s = _published_on_gamma_2()
    small = make_curve(1.10, 1.40, 1.42)  # (1.42 - 1.40) / 1.40 = 1.43% < 2%
    d, s = tick(s, T0 + 10.0, small, ON2)
    assert (d.num_speculative_tokens, s.pending_gamma) == (2, None)
    assert "gains +1.4% expected (a free move) < margin 2%" in d.reason
    enough = make_curve(1.10, 1.40, 1.43)  # 2.14% >= 2%
    d, s = tick(s, T0 + 20.0, enough, ON2)
    assert (d.num_speculative_tokens, s.pending_enabled, s.pending_gamma) == (2, True, 3)
    d, s = tick(s, T0 + 50.0, enough, ON2)
    assert (d.enabled, d.num_speculative_tokens, d.expected_speedup) == (True, 3, 1.43)


def test_running_gamma_off_the_curve_moves_to_the_best_option_against_plain_decoding() -> None:
    deep = replace(ON2, deployed_k=10)  # beyond gamma_max 8: no S(10) on the curve
    d, s = tick(DecideState(), T0, GOOD, deep)
    assert (d.enabled, d.num_speculative_tokens, d.expected_speedup) == (True, 10, 1.0)
    assert (s.pending_enabled, s.pending_gamma) == (True, 3)
    assert "the running gamma is not on the curve" in d.reason


# ---- which gamma: ties, gamma_max, extrapolation


def test_ties_go_to_the_smaller_gamma() -> None:
    tied = make_curve(1.20, 1.35, 1.35, 1.30)
    point = best_point(tied, 8)
    assert point is not None and point.gamma == 2
    point = best_point(tuple(reversed(tied)), 8)
    assert point is not None and point.gamma == 2
    _, s = tick(DecideState(), T0, tied)  # low ends 1.15, 1.30, 1.30, 1.25
    assert s.pending_gamma == 2


def test_best_point_ignores_gamma_zero_and_points_above_gamma_max() -> None:
    curve = (*make_curve(0.90, 0.95), make_point(9, 3.0))
    point = best_point(curve, 8)
    assert point is not None and point.gamma == 2


def test_extrapolated_best_point_with_a_wide_band_does_not_switch_on() -> None:
    # measured up to k=3; S(5)=1.50 is the best point but extrapolated with low end 0.95; gamma 4's low end 1.35
    # is the best: it is the candidate, not 5
    curve = make_curve(1.10, 1.20, (1.15, 1.25, 1.35), 1.40, (0.95, 1.50, 2.00), extrapolated_above=3)
    _, s = tick(DecideState(), T0, curve)
    assert (s.pending_enabled, s.pending_gamma) == (True, 4)


def eagle_like(s4: tuple[float, float, float]) -> tuple[CurvePoint, ...]:
    """Measured up to k=3 (S(3)=1.50 [1.45..1.55]); gamma 4..8 extrapolated, rising to the best S(8)=1.70."""
    return make_curve(
        1.20, 1.40, (1.45, 1.50, 1.55), s4, (1.40, 1.62, 1.90), (1.35, 1.65, 2.00), (1.30, 1.68, 2.10),
        (1.30, 1.70, 2.20), extrapolated_above=3,
    )


def test_an_extrapolated_gamma_is_reached_one_step_past_the_measured_k_on_its_low_end() -> None:
    # S(8)=1.70 is best only by extrapolation; the options stop at gamma 4 (3 + 1), valued at its low end:
    # (1.56 - 1.50) / 1.50 = 4% >= 2%.
    curve = eagle_like((1.56, 1.60, 1.70))
    _, s = tick(DecideState(), T0, curve, ON3)
    d, s = tick(s, T0 + 10.0, curve, ON3)
    assert (d.num_speculative_tokens, s.pending_enabled, s.pending_gamma) == (3, True, 4)
    assert "best S(8)=1.70 [1.30..2.20] extrapolated" in d.reason and "on, gamma 4 S(4)=1.60" in d.reason
    d, s = tick(s, T0 + 30.0, curve, ON3)
    assert (d.enabled, d.num_speculative_tokens, d.expected_speedup) == (True, 4, 1.60)


def test_an_extrapolated_gamma_whose_low_end_does_not_clear_keeps_the_running_gamma() -> None:
    # S(4) = 1.58 beats S(3) = 1.50 on its point, but its low end 1.45 gains -3.3%.
    curve = eagle_like((1.45, 1.58, 1.75))
    s = DecideState()
    for i in range(5):
        d, s = tick(s, T0 + 60.0 * i, curve, ON3)
        assert (d.num_speculative_tokens, s.pending_enabled) == (3, None), i


def test_the_next_step_up_waits_until_the_engine_runs_the_last_one() -> None:
    curve = eagle_like((1.56, 1.60, 1.70))
    _, s = tick(DecideState(), T0, curve, ON3)
    d, s = tick(s, T0 + 30.0, curve, ON3)
    assert published(s) == (True, 4)
    # Recommend-only: the engine still runs k=3, so gamma 4 is still unmeasured; limit max(3 + 1, 4) = 4.
    d, s = tick(s, T0 + 200.0, curve, ON3)
    assert (d.num_speculative_tokens, s.pending_enabled) == (4, None)
    # Once k=4 runs, S(5)'s low end 1.65 gains (1.65 - 1.60) / 1.60 = 3.1% over the measured S(4).
    measured4 = make_curve(
        1.20, 1.40, 1.50, (1.55, 1.60, 1.65), (1.65, 1.66, 1.80), (1.40, 1.68, 2.00), (1.30, 1.69, 2.10),
        (1.30, 1.70, 2.20), extrapolated_above=4,
    )
    on4 = make_evidence(speculation_on=True, deployed_k=4)
    d, s = tick(s, T0 + 260.0, measured4, on4)
    assert (s.pending_enabled, s.pending_gamma) == (True, 5)


def test_while_on_a_move_past_the_measured_k_is_worth_trying_when_no_gain_is_sure() -> None:
    # On at 3 with a 20 s restart: S(4)'s low end 1.45 gains -3.3%, so no change is sure. S(8) = 1.70
    # [1.30..2.20], extrapolated: mu = 1.70 / 1.50 - 1 = 13.3%, sigma = 1.133 x ln(2.20 / 1.30) / 3.29 = 0.181,
    # floor -20 / 480: E[max(g, floor)] = 0.1494, V_try = 120 x 0.133 + 480 x 0.1494 - 20 = 67.7 s, the greatest of
    # gammas 4..8 (12.7, 30.6, 44.5, 58.7, 67.7 s).
    curve = eagle_like((1.45, 1.58, 1.75))
    d, s = tick(DecideState(), T0, curve, ON3, COST)
    assert (s.pending_enabled, s.pending_gamma) == (True, 8)
    trial = d.named(WhyCode.TRIAL)
    assert trial is not None and trial.number("gamma") == 8
    assert trial.number("value_s") == pytest.approx(67.7, abs=0.3)
    assert "on, gamma 8 S(8)=1.70 [1.30..2.20] extrapolated is worth trying" in d.reason
    # Its wait: C 20 s over the expected 13.3% = 150 s -> the dwell, 120 s.
    d, s = tick(s, T0 + 119.0, curve, ON3, COST)
    assert d.num_speculative_tokens == 3
    d, s = tick(s, T0 + 120.0, curve, ON3, COST)
    assert (d.num_speculative_tokens, s.tried_s) == (8, T0 + 120.0)


def test_a_sure_move_up_goes_to_the_gamma_worth_most_to_try() -> None:
    # S(4)'s low end 1.56 gains +4%: 600 x 0.04 = 24 s > 20 s, a sure change; gamma 8's trial value (67.7 s) is the
    # greatest above 3, so the change goes there, as a turn-on would. Gamma 4's own trial value: mu = 1.60 / 1.50
    # - 1 = 6.7%, sigma = 1.067 x ln(1.70 / 1.56) / 3.29 = 0.0279: V_try = 8.0 + 480 x 0.0667 - 20 = 20.0 s.
    d, s = tick(DecideState(), T0, eagle_like((1.56, 1.60, 1.70)), ON3, COST)
    assert (s.pending_enabled, s.pending_gamma) == (True, 8)
    trial = d.named(WhyCode.TRIAL)
    assert trial is not None and trial.number("against_s") == pytest.approx(20.0, abs=0.1)
    assert "more than on, gamma 4, the sure change (20s)" in d.reason


def test_a_trial_is_not_repeated_within_the_payback_horizon() -> None:
    curve = eagle_like((1.45, 1.58, 1.75))
    _, s = tick(DecideState(), T0, curve, ON3, COST)
    # As if a trial had been published at T0 and left again: no other trial for 600 s.
    s = replace(s, pending_enabled=None, pending_gamma=None, pending_since_s=None, candidate_since_s=None,
                candidate_side=None, tried_s=T0)
    d, s = tick(s, T0 + 300.0, curve, ON3, COST)
    assert s.pending_enabled is None and d.named(WhyCode.TRIAL) is None
    _, s = tick(s, T0 + 600.0, curve, ON3, COST)
    assert (s.pending_enabled, s.pending_gamma) == (True, 8)


def test_no_trial_past_the_measured_k_without_a_restart_to_save() -> None:
    # The same curve with change_cost_s 0: each gamma up is free and measured before the next, so no trial.
    curve = eagle_like((1.45, 1.58, 1.75))
    s = DecideState()
    for i in range(3):
        d, s = tick(s, T0 + 60.0 * i, curve, ON3)
        assert s.pending_enabled is None and d.named(WhyCode.TRIAL) is None


def test_a_trial_starts_only_from_what_the_engine_runs() -> None:
    # Published k=4 (a sure change) while the engine still runs k=3 (recommend-only): no trial from 4.
    curve = eagle_like((1.56, 1.60, 1.70))
    _, s = tick(DecideState(), T0, curve, ON3, CFG)  # free moves: the sure change to 4, no trial
    _, s = tick(s, T0 + 30.0, curve, ON3, CFG)
    assert published(s) == (True, 4)
    d, s = tick(s, T0 + 200.0, curve, ON3, COST)
    assert d.named(WhyCode.TRIAL) is None and s.pending_gamma != 8


def test_a_trial_outlives_a_spell_of_bad_data() -> None:
    curve = eagle_like((1.45, 1.58, 1.75))
    _, s = tick(DecideState(), T0, curve, ON3, COST)
    _, s = tick(s, T0 + 120.0, curve, ON3, COST)
    assert (published(s), s.tried_s, s.tried_gamma) == ((True, 8), T0 + 120.0, 8)
    stale = replace(ON3, state=DataState.STALE, at_s=T0 + 130.0)  # the engine restarting to apply it
    _, s = decide(stale, curve, COST, s, T0 + 130.0, inputs=DecideInputs(inflight_s=0.0))
    assert (s.tried_s, s.tried_gamma) == (T0 + 120.0, 8)


# After a trial to 8: S(8) = 0.90 [0.85..0.95] against S(3) = 1.50, so a move down is sure.
WORSE_AT_8 = make_curve(1.20, 1.40, (1.45, 1.50, 1.55), 1.40, 1.30, 1.20, 1.00, (0.85, 0.90, 0.95))
ON8 = make_evidence(speculation_on=True, deployed_k=8)


def _tried_8_then(start_s: float, evidence: Evidence) -> DecideState:
    """The trial to 8 published at T0 + 120 (test above), then WORSE_AT_8 every 30 s from T0 + `start_s` for 280 s,
    the engine reporting `evidence`; returns the state once a move down is published."""
    curve = eagle_like((1.45, 1.58, 1.75))
    _, s = tick(DecideState(), T0, curve, ON3, COST)
    _, s = tick(s, T0 + 120.0, curve, ON3, COST)
    for t in range(int(start_s), int(start_s) + 280, 30):
        _, s = tick(s, T0 + t, WORSE_AT_8, evidence, COST)
    assert published(s)[1] < 8
    return s


def test_a_move_down_long_after_a_trial_does_not_count_as_leaving_it() -> None:
    # The trial to 8 paid; 700 s later (past the 600 s horizon) the load makes a smaller gamma better: that move
    # is the load's, not the trial's failure, so trials stay allowed.
    assert _tried_8_then(820.0, ON8).trial_left_s is None


def test_a_move_down_before_the_engine_ran_the_trial_does_not_count_as_leaving_it() -> None:
    assert _tried_8_then(300.0, ON3).trial_left_s is None  # the engine still runs k=3 (recommend-only)


def test_a_trial_that_was_left_is_not_tried_again_for_the_probe_back_off() -> None:
    s = _tried_8_then(300.0, ON8)
    assert s.trial_left_s is not None
    back = make_evidence(speculation_on=True, deployed_k=published(s)[1])
    later = T0 + 120.0 + COST.payback_horizon_s + 60.0  # past the horizon, within the 3600 s back-off
    d, s = tick(s, later, eagle_like((1.45, 1.58, 1.75)), back, COST)
    assert d.named(WhyCode.TRIAL) is None


def test_reachable_gamma_limit() -> None:
    assert reachable_gamma_limit(current_gamma=3, measured_k=3, gamma_max=8) == 4  # 3 + 1
    assert reachable_gamma_limit(current_gamma=5, measured_k=3, gamma_max=8) == 5  # never pulled below current
    assert reachable_gamma_limit(current_gamma=10, measured_k=10, gamma_max=8) == 8  # clipped to gamma_max
    assert reachable_gamma_limit(current_gamma=2, measured_k=0, gamma_max=8) == 2  # engine off: nothing measured


# ---- reason


def test_reason_names_the_numbers() -> None:
    on2 = replace(ON2, batch=6.0)
    curve = make_curve(1.10, 1.30, (1.31, 1.42, 1.55))
    _, s = tick(DecideState(), T0, curve, on2)
    d, _ = tick(s, T0 + 10.0, curve, on2)
    for part in (
        "on, gamma 2: best S(3)=1.42 [1.31..1.55] at batch 6.0",
        "on, gamma 3 S(3)=1.42 [1.31..1.55] gains +9.2% expected (a free move)",  # (1.42 - 1.30) / 1.30
        "waiting 10s of 30s before switching gamma 2->3",
    ):
        assert part in d.reason, (part, d.reason)
    assert "\n" not in d.reason


def test_reason_when_switching_off_at_high_batch() -> None:
    d, s = tick(DecideState(), T0, BAD, replace(ON2, batch=180.0))
    assert "best S(2)=0.85 [0.80..0.91] at batch 180.0" in d.reason
    d, _ = tick(s, T0 + 30.0, BAD, replace(ON2, batch=180.0))
    assert "switching off (from gamma 2) after 30s" in d.reason


# ---- evidence not ok


def test_stale_keeps_the_last_decision_and_restarts_the_wait() -> None:
    s = _published_on_gamma_2()
    _, s = tick(s, T0 + 10.0, BAD, ON2)  # off becomes the candidate at T0+10
    good = s.published
    assert good is not None
    stale = replace(ON2, state=DataState.STALE, reason="last scrape 95s ago")
    d, s = tick(s, T0 + 100.0, (), stale)
    assert (d.state, d.enabled, d.num_speculative_tokens) == (DataState.STALE, True, 2)
    assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (
        good.expected_speedup,
        good.expected_speedup_low,
        good.expected_speedup_high,
    )
    assert d.evaluated_at_s == T0 + 100.0
    # the last good decision was evaluated at T0+10: 100 - 10 = 90 s ago
    assert "stale:" in d.reason and "last good decision 90s ago" in d.reason
    assert "last scrape 95s ago" in d.reason and "its wait restarts" in d.reason
    assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (None, None, None)
    assert s.published == good
    # back to ok at T0+130: the clock starts again (the stale spell does not count toward the wait)
    d, s = tick(s, T0 + 130.0, BAD, ON2)
    assert (d.state, d.enabled, s.pending_since_s) == (DataState.OK, True, T0 + 130.0)
    d, s = tick(s, T0 + 159.0, BAD, ON2)
    assert d.enabled is True
    d, s = tick(s, T0 + 160.0, BAD, ON2)  # 30 s
    assert d.enabled is False


def test_error_and_insufficient_data_never_flip() -> None:
    s = _published_on_gamma_2()
    for kind in (DataState.ERROR, DataState.INSUFFICIENT_DATA, DataState.STALE):
        d, s2 = tick(s, T0 + 30.0, BAD, replace(ON2, state=kind, speculation_on=False, deployed_k=0))
        assert (d.state, d.enabled, d.num_speculative_tokens) == (kind, True, 2)
        assert s2.published == s.published
        assert d.reason.startswith(f"{kind.value}: keeping on, gamma 2")


def test_not_ok_with_nothing_published_shows_the_deployment() -> None:
    for kind in (DataState.ERROR, DataState.INSUFFICIENT_DATA, DataState.STALE):
        d, s = tick(DecideState(), T0, (), replace(ON2, state=kind, deployed_k=3))
        assert (d.state, d.enabled, d.num_speculative_tokens) == (kind, True, 3)
        assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (1.0, 1.0, 1.0)
        assert d.changed_at_s is None and d.evaluated_at_s == T0
        assert s == DecideState()
        assert "nothing published yet" in d.reason


def test_insufficient_data_reason_says_how_many_drafts() -> None:
    told = replace(OFF, state=DataState.INSUFFICIENT_DATA, reason="120 drafts in window, need 300")
    d, _ = tick(DecideState(), T0, (), told)
    assert "120 drafts in window, need 300" in d.reason
    # without a reason from the estimator, the count comes from the acceptance evidence itself
    untold = replace(told, reason="", acceptance=make_acceptance(drafts=42.0))
    d, _ = tick(DecideState(), T0, (), untold)
    assert "42 drafts seen" in d.reason


def test_ok_evidence_without_a_usable_curve_is_an_error_that_keeps_state() -> None:
    s = _published_on_gamma_2()
    d, s2 = tick(s, T0 + 30.0, make_curve(), ON2)  # only gamma 0
    assert (d.state, d.enabled, d.num_speculative_tokens) == (DataState.ERROR, True, 2)
    assert "no predicted speedup for any gamma in 1..8" in d.reason
    assert s2.published == s.published


# ---- purity


def test_same_inputs_give_the_same_outputs() -> None:
    _, s = tick(DecideState(), T0, GOOD)
    first = decide(replace(OFF, at_s=T0 + 20.0), GOOD, CFG, s, T0 + 20.0)
    second = decide(replace(OFF, at_s=T0 + 20.0), GOOD, CFG, s, T0 + 20.0)
    assert first == second
    # and the state passed in is untouched (a frozen value, still waiting since T0)
    assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, 3, T0)


# ---- off is an option only when speculation at its best loses


def test_a_turn_off_goes_to_the_best_gamma_when_it_is_expected_to_do_as_well_as_off() -> None:
    # On at 3, S(3) 0.80 [0.75..0.85]: off gains (1 - 0.85) / 0.80 = 18.8%. gamma 1 at 0.90 [0.85..0.95]
    # gains (0.90 - 0.80) / 0.80 = 12.5%. The best gamma (1) is expected to lose to plain decoding: off.
    s3 = (0.75, 0.80, 0.85)
    losing = make_curve((0.85, 0.90, 0.95), (0.70, 0.75, 0.80), s3)
    _, s = tick(DecideState(), T0, losing, ON3)
    assert (s.pending_enabled, s.pending_gamma) == (False, 0)
    # gamma 1 expected at 1.00 (as fast as plain decoding) but unsure of its gain over gamma 3 (gain_sd 0.15:
    # 1.00 exp(-0.247) = 0.781, (0.781 - 0.80) / 0.80 = -2.3%). Off still pays 18.8%, and gamma 1 is expected to
    # serve as well as off while keeping the acceptance measured: the move goes to gamma 1.
    even = make_curve((0.90, 1.00, 1.10), (0.70, 0.75, 0.80), s3)
    even = (even[0], replace(even[1], gain_sd=0.15), *even[2:])
    d, s = tick(DecideState(), T0, even, ON3, COST)  # a restart: gamma 1's doubt is priced
    assert (s.pending_enabled, s.pending_gamma) == (True, 1)
    assert "off gains +18.8%" in d.reason and "S(1)=1.00 [0.90..1.10] is expected to do as well as off" in d.reason
    # The wait is priced on the turn-off's expected gain, (1 - 0.80) / 0.80 = 25%: 20 s / 0.25 = 80 s; gamma 1 is
    # published on the first tick past it.
    d, s = tick(s, T0 + 79.0, even, ON3, COST)
    assert d.num_speculative_tokens == 3
    d, s = tick(s, T0 + 81.0, even, ON3, COST)
    assert (d.enabled, d.num_speculative_tokens) == (True, 1)


# ---- turning on from off: where to (value.trial_value)

# Nothing measured yet (a drafter loaded but never run): every gamma is the prior's guess. The band's low end
# picks gamma 1 (S_low 1.11 ties gamma 2 and is the smaller); gamma 3 is expected 1.64.
UNMEASURED = make_curve(
    (1.11, 1.39, 1.64), (1.11, 1.58, 2.05), (1.04, 1.64, 2.31), (0.96, 1.62, 2.46), extrapolated_above=0
)


def test_a_turn_on_goes_to_the_gamma_worth_most_to_try() -> None:
    # C = 20 s, H 600 s, T = the dwell, 120 s: floor a = -20 / 480. By hand (sigma = (high - low) / 3.2897):
    # gamma 1: mu 0.39, sigma 0.161, E[max] 0.3902 -> 46.8 + 187.3 - 20 = 214 s;
    # gamma 3: mu 0.64, sigma 0.386, d 1.766, E[max] 0.6460 -> 76.8 + 310.1 - 20 = 367 s;
    # gamma 2: 328.7 s; gamma 4: 359.2 s. Gamma 3 is the candidate; the wait is C over its expected gain, 20 / 0.64.
    d, s = tick(DecideState(), T0, UNMEASURED, config=COST)
    assert (s.pending_enabled, s.pending_gamma) == (True, 3)
    assert "on, gamma 1 S(1)=1.39 [1.11..1.64] extrapolated gains +11.0% at its band's low end" in d.reason
    assert "on, gamma 3 S(3)=1.64 [1.04..2.31] extrapolated is worth more to try: 367s over 600s against 214s" \
        in d.reason
    assert "wait 31s (cost today 20.0s / gain expected now +64.0%" in d.reason
    trial, gain = d.named(WhyCode.TRIAL), d.named(WhyCode.GAIN)
    assert trial is not None and trial.number("gamma") == 3 and trial.number("expected") == pytest.approx(0.64)
    # The causes name the option that will be published, with the gain the trial expects of it.
    assert gain is not None and gain.number("to_gamma") == 3 and gain.number("gain") == pytest.approx(0.64)
    assert d.summary == ("Running speculation off; speculation on, k=3 is worth most to try (expected +64%), due in "
                         "31 s if that holds.")
    d, s = tick(s, T0 + 31.0, UNMEASURED, config=COST)
    assert d.enabled is False
    d, s = tick(s, T0 + 32.0, UNMEASURED, config=COST)
    assert (d.enabled, d.num_speculative_tokens) == (True, 3)
    assert d.summary.startswith("Change to speculation on, k=3 (from speculation off): worth most to try; expected")


def test_a_turn_on_still_needs_a_gain_sure_at_its_band_low_end() -> None:
    # Gamma 3 is worth trying in expectation (1.40 [0.95..1.85]), but no gamma's low end clears the margin: off stays.
    hopeful = make_curve((0.97, 1.10, 1.25), (0.96, 1.25, 1.55), (0.95, 1.40, 1.85), extrapolated_above=0)
    s = DecideState()
    for i in range(4):
        d, s = tick(s, T0 + 60.0 * i, hopeful, config=COST)
        assert (d.enabled, s.pending_enabled) == (False, None), i


def test_a_turn_on_reaches_the_next_allowed_gamma_past_the_remembered_positions() -> None:
    # A drafter that runs only even k (drafter.allowed_k 2, 4: the curve holds no odd gamma), remembered at k=2:
    # the next gamma past it is 4, which the trial may reach: 1.80 [1.10..2.50] (its low end gains 10%, less than
    # gamma 2's 25% at 1.30 +-0.05, so the band's low end alone would go to 2).
    full = make_curve(1.15, 1.30, 1.35, (1.10, 1.80, 2.50), extrapolated_above=2)
    even = (full[0], full[2], full[4])
    _, s = tick(DecideState(), T0, even, config=COST)
    assert (s.pending_enabled, s.pending_gamma) == (True, 4)


def test_a_turn_on_tries_no_further_than_one_gamma_past_the_remembered_positions() -> None:
    # Remembered positions up to 2; gamma 4 would be worth most to try on its wide band (1.80 [1.00..2.60]), but
    # only gamma 3 lies one past what was measured. Gamma 3 (1.50 [1.20..1.80]) beats gamma 2 (1.35 +-0.05).
    curve = make_curve(1.20, 1.35, (1.20, 1.50, 1.80), (1.00, 1.80, 2.60), extrapolated_above=2)
    _, s = tick(DecideState(), T0, curve, config=COST)
    assert (s.pending_enabled, s.pending_gamma) == (True, 3)


def test_a_trial_risks_its_first_dwell_and_one_change_back_not_the_horizon() -> None:
    # S(2) = 0.50 for sure: T mu = 120 x -0.5 = -60 s, then the way back: 480 x (-20 / 480) = -20 s, less C 20 s.
    sure_loss = make_curve(1.10, (0.50, 0.50, 0.50))
    assert trial_value(sure_loss, (True, 2), horizon_s=600.0, cost_s=20.0, trial_s=120.0) == pytest.approx(-100.0)
    # Under an SLO the gain counts the tokens that move across it: off's share 0.5 halves mu and sigma.
    shared = (replace(sure_loss[0], slo_share=0.5), *sure_loss[1:])
    assert trial_value(shared, (True, 1), horizon_s=600.0, cost_s=0.0, trial_s=120.0) == pytest.approx(30.0, abs=0.1)
    assert trial_value(sure_loss, (False, 0), horizon_s=600.0, cost_s=20.0, trial_s=120.0) is None


def test_the_trial_moments_of_a_move_past_the_measured_k() -> None:
    # value.trial_moments' example: on at 3 (S 2.58), S(8) = 3.14 [2.53..3.88] extrapolated, gain_sd 0.05:
    # mu = 3.14 / 2.58 - 1 = 0.217, sd = max(0.05, ln(3.88 / 2.53) / 3.29 = 0.130), sigma = 1.217 x 0.130 = 0.158.
    curve = (make_point(0, 1.0), make_point(3, 2.58), replace(make_point(8, (2.53, 3.14, 3.88), extrapolated=True),
                                                               gain_sd=0.05))
    moments = trial_moments(curve, (True, 3), (True, 8))
    assert moments is not None
    assert moments[0] == pytest.approx(0.217, abs=0.001) and moments[1] == pytest.approx(0.158, abs=0.001)
    assert trial_moments(curve, (True, 8), (True, 3)) is None  # fewer drafts: not a trial
    # Under an SLO share of 0.5 both scale by it: mu = 0.217 x 0.5 = 0.109, sigma = 0.158 x 0.5 = 0.079.
    shared = tuple(replace(p, slo_share=0.5) for p in curve)
    moments = trial_moments(shared, (True, 3), (True, 8))
    assert moments is not None
    assert moments[0] == pytest.approx(0.1085, abs=0.001) and moments[1] == pytest.approx(0.079, abs=0.001)
    # An extrapolated band without a positive low end is not priced.
    broken = (*curve[:2], replace(curve[2], speedup_low=0.0))
    assert trial_moments(broken, (True, 3), (True, 8)) is None


def test_of_changes_as_sure_within_the_margin_the_one_expected_to_gain_most_is_made() -> None:
    # On at 3, S(3) 0.60 [0.40..0.90]: off gains (1 - 0.90) / 0.60 = 16.67% at the running option's high end.
    # Gamma 1 at 0.84 with gain_sd 0.11: 0.84 exp(-1.645 x 0.11) = 0.7010, (0.7010 - 0.60) / 0.60 = 16.83%: the
    # greatest V, but within the 2% margin of off's. Expected: off (1 - 0.60) / 0.60 = 66.7%, gamma 1 (0.84 - 0.60)
    # / 0.60 = 40%: off is as sure and expected to gain more.
    curve = make_curve(0.84, 0.65, (0.40, 0.60, 0.90))
    curve = (curve[0], replace(curve[1], gain_sd=0.11), *curve[2:])
    d, s = tick(DecideState(), T0, curve, ON3, COST)
    assert (s.pending_enabled, s.pending_gamma) == (False, 0)
    assert "off gains +16.7% against the running option's band high end" in d.reason
    assert "(as sure as on, gamma 1 at +16.8%, within the margin, and expected to gain more: +66.7%)" in d.reason
    # Planned over the recent load, the options are ranked on the plan's curve, and the reason gives the plan's
    # expected gain (66.7%), not this window's (S(3) 0.70 now: (1 - 0.70) / 0.70 = 42.9%).
    now = (*curve[:3], replace(curve[3], speedup=0.70))
    d, s = decide(replace(ON3, at_s=T0), now, COST, DecideState(), T0,
                  inputs=DecideInputs(inflight_s=0.0, plan=HorizonCurve(curve=curve)))
    assert (s.pending_enabled, s.pending_gamma) == (False, 0)
    assert "expected to gain more: +66.7%)" in d.reason and "gain expected now +42.9%" in d.reason
    # A gamma surer by more than the margin keeps its place: gain_sd 0.08 -> 0.84 x 0.8767 = 0.7364, +22.7%.
    surer = (curve[0], replace(curve[1], gain_sd=0.08), *curve[2:])
    _, s = tick(DecideState(), T0, surer, ON3, COST)
    assert (s.pending_enabled, s.pending_gamma) == (True, 1)


def test_as_sure_options_on_the_other_side_cannot_stall_a_change() -> None:
    # On at 3 (S 1.00 +-0.05). Gamma 4, one past the measured k, gains 20% at its low end (1.20): the best V, on the
    # side of more speculation. Gamma 2 (1.25) gains 19.0% at gain_sd 0.03 (1.25 x 0.9518 = 1.190) and 16.1% at
    # 0.045, in turn: within the margin of 20% on one tick, not on the next. Were it as sure across sides, the
    # candidate's side would flip every tick and its confirm never complete; gamma 4 is published after its wait,
    # C / r = 20 / 0.20 = 100 s (an extrapolated gamma's rent is at its low end).
    base = make_curve(1.10, 1.25, 1.00, (1.20, 1.30, 1.40), extrapolated_above=3)
    s, d = DecideState(), None
    for i in range(8):
        sd = 0.03 if i % 2 == 0 else 0.045
        curve = (*base[:2], replace(base[2], gain_sd=sd), *base[3:])
        d, s = tick(s, T0 + 15.0 * i, curve, ON3, COST)
    assert d is not None and (d.enabled, d.num_speculative_tokens) == (True, 4)
