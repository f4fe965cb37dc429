"""decide(): bounds, minimum change and dwell composed, driven by a hand-advanced clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from decide_builders import T0, make_acceptance, make_curve, make_evidence, make_point

from policies.decide import DecideConfig, DecideState, best_point, decide, reachable_gamma_limit
from policies.types import CurvePoint, Decision, Evidence, TargetState

CFG = DecideConfig(margin=0.05, dwell_s=120.0, gamma_max=8, min_speedup_gain_to_change_gamma=0.02)

# Best point gamma 3, S(3)=1.42 [1.31..1.55]: low end 1.31 >= 1 + 0.05, so "on" from off.
GOOD = make_curve(1.10, 1.30, (1.31, 1.42, 1.55), 1.35)
# Best point gamma 2, S(2)=0.85 [0.80..0.91]: high end 0.91 < 1, so "off" from on.
BAD = make_curve((0.78, 0.82, 0.88), (0.80, 0.85, 0.91), (0.70, 0.80, 0.85))
# Best point gamma 2, S(2)=1.03 [0.97..1.10]: between the thresholds, neither switches.
BAND = make_curve((0.95, 1.01, 1.05), (0.97, 1.03, 1.10), (0.90, 1.00, 1.08))

OFF = make_evidence()
ON2 = make_evidence(speculation_on=True, deployed_k=2)


def tick(
    state: DecideState,
    t: float,
    curve: Sequence[CurvePoint],
    evidence: Evidence = OFF,
    config: DecideConfig = CFG,
) -> tuple[Decision, DecideState]:
    return decide(replace(evidence, at_s=t), curve, config, state, t)


def published(state: DecideState) -> tuple[bool, int]:
    assert state.published is not None
    return state.published.enabled, state.published.num_speculative_tokens


# ---- first decision


def test_first_decision_publishes_the_deployment_and_starts_the_dwell() -> None:
    d, s = tick(DecideState(), T0, GOOD)
    assert (d.state, d.enabled, d.num_speculative_tokens) == (TargetState.OK, False, 0)
    assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (1.0, 1.0, 1.0)
    assert d.changed_at_s == T0 and d.evaluated_at_s == T0
    assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, 3, T0)
    assert "baseline is the current deployment (off)" in d.reason


def test_first_decision_while_on_reports_the_running_gamma_from_the_curve() -> None:
    d, s = tick(DecideState(), T0, GOOD, ON2)
    # running gamma 2 on GOOD: S(2)=1.30, default band +-0.05 -> [1.25..1.35]
    assert (d.enabled, d.num_speculative_tokens) == (True, 2)
    assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (1.30, 1.25, 1.35)
    # gamma*=3 gains 1.42 - 1.30 = 0.12 >= 0.02: a move to 3 waits out the dwell
    assert (s.pending_enabled, s.pending_gamma) == (True, 3)


def test_curve_is_passed_through() -> None:
    d, _ = tick(DecideState(), T0, GOOD)
    assert d.curve == GOOD
    assert (d.target, d.model) == (OFF.target, OFF.model)


# ---- dwell


def test_switches_on_after_the_dwell_not_before() -> None:
    s = DecideState()
    for dt in (0.0, 60.0, 119.0):
        d, s = tick(s, T0 + dt, GOOD)
        assert (d.enabled, d.num_speculative_tokens) == (False, 0), dt
    d, s = tick(s, T0 + 120.0, GOOD)  # 120 s since the candidate appeared at T0
    assert (d.enabled, d.num_speculative_tokens) == (True, 3)
    assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (1.42, 1.31, 1.55)
    assert d.changed_at_s == T0 + 120.0
    assert s.pending_enabled is None and s.pending_gamma is None and s.pending_since_s is None
    d, s = tick(s, T0 + 180.0, GOOD)
    assert (d.enabled, d.num_speculative_tokens, d.changed_at_s) == (True, 3, T0 + 120.0)


def test_zero_dwell_switches_at_the_first_disagreeing_tick() -> None:
    d, _ = tick(DecideState(), T0, GOOD, config=replace(CFG, dwell_s=0.0))
    assert (d.enabled, d.num_speculative_tokens, d.changed_at_s) == (True, 3, T0)


def test_flip_flopping_candidate_never_publishes() -> None:
    s = DecideState()
    for i in range(20):  # 20 ticks 60 s apart = 19 minutes, far beyond the 120 s dwell
        d, s = tick(s, T0 + 60.0 * i, GOOD if i % 2 == 0 else BAD)
        assert (d.enabled, d.num_speculative_tokens) == (False, 0), i


def test_flip_flopping_between_clearly_different_gammas_restarts_the_dwell() -> None:
    # both clear the bar, but the best gamma alternates 3 / 4 and each beats the pending one by far more than the
    # minimum change (GOOD: 1.42 - 1.35 = 0.07; four: 1.44 - 1.35 = 0.09, both >= 0.02): each restarts the clock
    four = make_curve(1.10, 1.30, 1.35, (1.32, 1.44, 1.56))
    s = DecideState()
    for i in range(10):
        d, s = tick(s, T0 + 100.0 * i, GOOD if i % 2 == 0 else four)
        assert d.enabled is False, i
        assert s.pending_since_s == T0 + 100.0 * i


# Near-equal neighbours: S(3) and S(4) swap places by 0.01, less than the 0.02 minimum change.
NEAR3 = make_curve(1.10, 1.30, (1.31, 1.42, 1.55), (1.30, 1.41, 1.54))  # gamma* = 3
NEAR4 = make_curve(1.10, 1.30, (1.30, 1.41, 1.54), (1.31, 1.42, 1.55))  # gamma* = 4


def test_alternating_near_equal_gammas_switch_on_after_one_dwell() -> None:
    s = DecideState()
    for i in range(4):  # T0, +30, +60, +90: the best gamma alternates 3, 4, 3, 4
        d, s = tick(s, T0 + 30.0 * i, NEAR3 if i % 2 == 0 else NEAR4)
        assert d.enabled is False, i
        # S(4) beats the pending S(3) by only 1.42 - 1.41 = 0.01 < 0.02: the same change, the clock from T0 runs on
        assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, 3, T0), i
    assert "within 0.02 of pending S(3)=1.41, keeping gamma 3" in d.reason
    assert "waiting 90s of 120s dwell before switching on at gamma 3" in d.reason
    d, s = tick(s, T0 + 120.0, NEAR3)  # 120 s since T0
    assert (d.enabled, d.num_speculative_tokens, d.expected_speedup, d.changed_at_s) == (True, 3, 1.42, T0 + 120.0)
    # Once on at 3, the alternation is below the minimum change over the running gamma: no further churn.
    for i in range(5, 11):
        d, s = tick(s, T0 + 30.0 * i, NEAR3 if i % 2 == 0 else NEAR4)
        assert (d.enabled, d.num_speculative_tokens, s.pending_enabled) == (True, 3, None), i


def test_a_gamma_that_beats_the_pending_one_by_the_minimum_change_restarts_the_dwell() -> None:
    five = make_curve(1.10, 1.30, (1.31, 1.42, 1.55), 1.35, (1.40, 1.50, 1.60))  # gamma* = 5
    _, s = tick(DecideState(), T0, GOOD)  # (on, 3) pending since T0
    d, s = tick(s, T0 + 60.0, five)
    # 1.50 - 1.42 = 0.08 >= 0.02: a different change, waiting from T0+60
    assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, 5, T0 + 60.0)
    assert "beats pending S(3)=1.42 by 0.08, dwell restarts" in d.reason
    d, s = tick(s, T0 + 120.0, five)  # 60 s < 120 s
    assert d.enabled is False
    d, s = tick(s, T0 + 180.0, five)  # 180 - 60 = 120 s
    assert (d.enabled, d.num_speculative_tokens) == (True, 5)


def test_on_versus_off_candidates_still_restart_the_dwell() -> None:
    s = _published_on_gamma_2()
    _, s = tick(s, T0 + 10.0, BAD, ON2)  # off pending since T0+10
    assert (s.pending_enabled, s.pending_since_s) == (False, T0 + 10.0)
    # GOOD while on at 2: gamma 3 gains 1.42 - 1.30 = 0.12 >= 0.02, so the candidate is (on, 3): not off any more
    _, s = tick(s, T0 + 60.0, GOOD, ON2)
    assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, 3, T0 + 60.0)
    # and back to off at T0+130: had the clock from T0+10 survived, 130 - 10 = 120 s would publish off now
    d, s = tick(s, T0 + 130.0, BAD, ON2)
    assert (d.enabled, d.num_speculative_tokens) == (True, 2)
    assert (s.pending_enabled, s.pending_since_s) == (False, T0 + 130.0)


def test_alternating_near_equal_gammas_move_the_running_gamma_after_one_dwell() -> None:
    s = _published_on_gamma_2()
    # Running gamma 2 at S(2)=1.40. On X the best is S(4)=1.43 (gain 0.03 >= 0.02), on Y it is S(3)=1.43; the
    # other of 3 / 4 sits 0.015 lower: within 0.02 of each other, but only 0.015 above S(2), too little to move to.
    x = make_curve(1.10, 1.40, 1.415, 1.43)
    y = make_curve(1.10, 1.40, 1.43, 1.415)
    expected_gammas = (4, 3, 4, 3)
    for i, gamma in enumerate(expected_gammas):  # T0+10, +40, +70, +100
        d, s = tick(s, T0 + 10.0 + 30.0 * i, x if i % 2 == 0 else y, ON2)
        assert (d.enabled, d.num_speculative_tokens) == (True, 2), i
        # the pending gamma follows the one that clears the minimum change, on a clock that started at T0+10
        assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, gamma, T0 + 10.0), i
    assert "no longer clears 0.02 over the running gamma" in d.reason
    d, s = tick(s, T0 + 130.0, x, ON2)  # 130 - 10 = 120 s
    assert (d.enabled, d.num_speculative_tokens, d.expected_speedup) == (True, 4, 1.43)
    assert d.changed_at_s == T0 + 130.0


def test_candidate_returning_to_published_clears_the_dwell() -> None:
    s = DecideState()
    _, s = tick(s, T0, GOOD)
    _, s = tick(s, T0 + 100.0, GOOD)
    d, s = tick(s, T0 + 110.0, BAND)  # off stays off in the band: candidate == published
    assert s.pending_since_s is None
    assert "withdrawn" in d.reason
    d, s = tick(s, T0 + 130.0, GOOD)  # the dwell starts again at T0+130
    assert d.enabled is False
    d, s = tick(s, T0 + 249.0, GOOD)  # 119 s < 120 s
    assert d.enabled is False
    d, s = tick(s, T0 + 250.0, GOOD)  # 120 s
    assert (d.enabled, d.num_speculative_tokens) == (True, 3)


# ---- bounds / hysteresis


def _published_on_gamma_2() -> DecideState:
    # running gamma 2 on BAND: on stays on (high 1.10 >= 1) and gamma* is 2, so nothing is pending
    _, s = tick(DecideState(), T0, BAND, ON2)
    assert (published(s), s.pending_enabled) == ((True, 2), None)
    return s


def test_band_holds_off_when_off() -> None:
    s = DecideState()
    for i in range(10):
        d, s = tick(s, T0 + 60.0 * i, BAND)
        assert (d.enabled, s.pending_enabled) == (False, None)
    # low end 0.97 < 1 + 0.05 keeps it off
    assert "low end 0.97 < 1+margin=1.05" in d.reason


def test_band_holds_on_when_on() -> None:
    s = _published_on_gamma_2()
    for i in range(1, 10):
        d, s = tick(s, T0 + 60.0 * i, BAND, ON2)
        assert (d.enabled, d.num_speculative_tokens, s.pending_enabled) == (True, 2, None)
    # high end 1.10 >= 1 keeps it on; the reason says the band, not confidence, did it
    assert "high end 1.10 >= 1" in d.reason
    assert "inside hysteresis band" in d.reason


def test_switches_off_after_the_dwell_when_the_high_end_drops_below_one() -> None:
    s = _published_on_gamma_2()
    d, s = tick(s, T0 + 10.0, BAD, ON2)
    assert (d.enabled, s.pending_enabled, s.pending_gamma) == (True, False, 0)
    assert "high end 0.91 < 1" in d.reason
    d, s = tick(s, T0 + 130.0, BAD, ON2)  # 130 - 10 = 120 s
    assert (d.enabled, d.num_speculative_tokens) == (False, 0)
    assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (1.0, 1.0, 1.0)
    assert d.changed_at_s == T0 + 130.0


def test_gamma_moves_only_for_the_minimum_gain() -> None:
    s = _published_on_gamma_2()
    small = make_curve(1.10, 1.40, 1.41)  # gain 1.41 - 1.40 = 0.01 < 0.02
    d, s = tick(s, T0 + 10.0, small, ON2)
    assert (d.num_speculative_tokens, s.pending_gamma) == (2, None)
    assert "gain 0.01 over S(2)=1.40" in d.reason and "keeps gamma 2" in d.reason
    enough = make_curve(1.10, 1.40, 1.43)  # gain 1.43 - 1.40 = 0.03 >= 0.02
    d, s = tick(s, T0 + 20.0, enough, ON2)
    assert (d.num_speculative_tokens, s.pending_enabled, s.pending_gamma) == (2, True, 3)
    d, s = tick(s, T0 + 140.0, enough, ON2)  # 140 - 20 = 120 s
    assert (d.enabled, d.num_speculative_tokens, d.expected_speedup) == (True, 3, 1.43)


def test_running_gamma_off_the_curve_claims_no_gain_and_moves_to_gamma_star() -> None:
    deep = replace(ON2, deployed_k=10)  # beyond gamma_max 8: no S(10) on the curve
    d, s = tick(DecideState(), T0, GOOD, deep)
    assert (d.enabled, d.num_speculative_tokens, d.expected_speedup) == (True, 10, 1.0)
    assert (s.pending_enabled, s.pending_gamma) == (True, 3)
    assert "S(10) not on the curve" in d.reason


# ---- gamma*: tie-breaking, gamma_max, extrapolation


def test_ties_go_to_the_smaller_gamma() -> None:
    tied = make_curve(1.20, 1.35, 1.35, 1.30)
    point = best_point(tied, 8)
    assert point is not None and point.gamma == 2
    # same in reverse order: the result does not depend on how the curve is listed
    point = best_point(tuple(reversed(tied)), 8)
    assert point is not None and point.gamma == 2
    _, s = tick(DecideState(), T0, tied)
    assert s.pending_gamma == 2


def test_gamma_star_ignores_gamma_zero_and_points_above_gamma_max() -> None:
    curve = (*make_curve(0.90, 0.95), make_point(9, 3.0))
    point = best_point(curve, 8)
    # gamma 0 (1.0) beats both 0.90 and 0.95 but is not a candidate; gamma 9 > gamma_max
    assert point is not None and point.gamma == 2


def test_extrapolated_best_point_with_a_wide_band_does_not_switch_on() -> None:
    # measured up to k=3; S(5)=1.50 is the best point but extrapolated with low end 0.95 < 1.05
    curve = make_curve(1.10, 1.20, (1.15, 1.25, 1.35), 1.40, (0.95, 1.50, 2.00), extrapolated_above=3)
    s = DecideState()
    for i in range(5):
        d, s = tick(s, T0 + 60.0 * i, curve)
        assert (d.enabled, s.pending_enabled) == (False, None)
    assert "S(5)=1.50 [0.95..2.00] extrapolated" in d.reason


def test_extrapolated_point_that_clears_the_bar_can_be_chosen_and_is_labelled() -> None:
    curve = make_curve(1.10, (1.20, 1.30, 1.40), extrapolated_above=1)
    _, s = tick(DecideState(), T0, curve)
    d, s = tick(s, T0 + 120.0, curve)
    assert (d.enabled, d.num_speculative_tokens) == (True, 2)
    assert "S(2)=1.30 [1.20..1.40] extrapolated" in d.reason


# ---- extrapolated gamma*: one step past the measured k, on its low end

ON3 = make_evidence(speculation_on=True, deployed_k=3)


def eagle_like(s4: tuple[float, float, float]) -> tuple[CurvePoint, ...]:
    """Measured up to k=3 (S(3)=1.50 [1.45..1.55]); gamma 4..8 extrapolated, rising to the best S(8)=1.70."""
    return make_curve(
        1.20, 1.40, (1.45, 1.50, 1.55), s4, (1.40, 1.62, 1.90), (1.35, 1.65, 2.00), (1.30, 1.68, 2.10),
        (1.30, 1.70, 2.20), extrapolated_above=3,
    )


def test_an_extrapolated_best_gamma_is_capped_one_step_past_the_measured_k() -> None:
    # The synthetic EAGLE k=3 case: S(8)=1.70 is best only by extrapolation. The move goes to gamma 4 (3 + 1), and
    # only because S(4)'s LOW end 1.53 clears S(3) + min gain = 1.50 + 0.02 = 1.52.
    curve = eagle_like((1.53, 1.60, 1.70))
    _, s = tick(DecideState(), T0, curve, ON3)
    d, s = tick(s, T0 + 10.0, curve, ON3)
    assert (d.num_speculative_tokens, s.pending_enabled, s.pending_gamma) == (3, True, 4)
    assert "S(8)=1.70" in d.reason and "best up to gamma 4 is S(4)=1.60" in d.reason
    d, s = tick(s, T0 + 130.0, curve, ON3)  # 130 - 10 = 120 s dwell
    assert (d.enabled, d.num_speculative_tokens, d.expected_speedup) == (True, 4, 1.60)


def test_an_extrapolated_gamma_whose_low_end_does_not_clear_keeps_the_running_gamma() -> None:
    # S(4) = 1.58 beats S(3) = 1.50 by 0.08 on its point value, but its low end 1.45 < 1.50 + 0.02 = 1.52.
    curve = eagle_like((1.45, 1.58, 1.75))
    s = DecideState()
    for i in range(5):
        d, s = tick(s, T0 + 60.0 * i, curve, ON3)
        assert (d.num_speculative_tokens, s.pending_enabled) == (3, None), i
    assert "extrapolated low end 1.45 vs S(3)+0.02=1.52 does not: keeps gamma 3" in d.reason


def test_the_next_step_up_waits_until_the_engine_runs_the_last_one() -> None:
    curve = eagle_like((1.53, 1.60, 1.70))
    _, s = tick(DecideState(), T0, curve, ON3)
    _, s = tick(s, T0 + 10.0, curve, ON3)
    d, s = tick(s, T0 + 130.0, curve, ON3)
    assert published(s) == (True, 4)
    # Recommend-only: the engine still runs k=3, so gamma 4 is still unmeasured; limit max(3 + 1, 4) = 4.
    d, s = tick(s, T0 + 200.0, curve, ON3)
    assert (d.num_speculative_tokens, s.pending_enabled) == (4, None)
    # Once k=4 runs and S(5) is the next extrapolated point (low 1.63 >= S(4) 1.60 + 0.02 = 1.62), gamma 5.
    measured4 = make_curve(
        1.20, 1.40, 1.50, (1.55, 1.60, 1.65), (1.63, 1.66, 1.80), (1.40, 1.68, 2.00), (1.30, 1.69, 2.10),
        (1.30, 1.70, 2.20), extrapolated_above=4,
    )
    on4 = make_evidence(speculation_on=True, deployed_k=4)
    d, s = tick(s, T0 + 260.0, measured4, on4)
    assert (s.pending_enabled, s.pending_gamma) == (True, 5)


def test_reachable_gamma_limit() -> None:
    assert reachable_gamma_limit(current_gamma=3, measured_k=3, gamma_max=8) == 4  # 3 + 1
    assert reachable_gamma_limit(current_gamma=5, measured_k=3, gamma_max=8) == 5  # never pulled below current
    assert reachable_gamma_limit(current_gamma=10, measured_k=10, gamma_max=8) == 8  # clipped to gamma_max
    assert reachable_gamma_limit(current_gamma=2, measured_k=0, gamma_max=8) == 2  # engine off: nothing measured


# ---- reason


def test_reason_names_the_numbers() -> None:
    on3 = replace(ON2, deployed_k=2, batch=6.0)
    curve = make_curve(1.10, 1.30, (1.31, 1.42, 1.55))
    curve = (*curve[:3], replace(curve[3], expected_accepted_length=2.61))
    _, s = tick(DecideState(), T0, curve, on3)
    d, _ = tick(s, T0 + 40.0, curve, on3)
    for part in (
        "on: S(3)=1.42 [1.31..1.55] at batch 6.0",
        "E[L](3)=2.61",
        "gain 0.12 over S(2)=1.30",  # 1.42 - 1.30
        "waiting 40s of 120s dwell before switching gamma 2->3",
    ):
        assert part in d.reason, (part, d.reason)
    assert "\n" not in d.reason


def test_reason_when_off_names_the_low_end_and_the_bar() -> None:
    d, _ = tick(DecideState(), T0, GOOD)
    assert "on: S(3)=1.42 [1.31..1.55] at batch 6.0" in d.reason
    assert "low end 1.31 clears 1+margin=1.05" in d.reason
    assert "waiting 0s of 120s dwell before switching on at gamma 3" in d.reason


def test_reason_when_off_at_high_batch() -> None:
    d, _ = tick(DecideState(), T0, BAD, replace(ON2, batch=180.0))
    assert "off: S(2)=0.85 [0.80..0.91] at batch 180.0" in d.reason
    assert "high end 0.91 < 1" in d.reason
    assert "switching off (from gamma 2)" in d.reason


# ---- evidence not ok


def test_stale_keeps_the_last_decision_and_resets_the_dwell() -> None:
    s = _published_on_gamma_2()
    _, s = tick(s, T0 + 10.0, BAD, ON2)  # off becomes the candidate at T0+10
    good = s.published
    assert good is not None
    stale = replace(ON2, state=TargetState.STALE, reason="last scrape 95s ago")
    d, s = tick(s, T0 + 100.0, (), stale)
    assert (d.state, d.enabled, d.num_speculative_tokens) == (TargetState.STALE, True, 2)
    assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (
        good.expected_speedup,
        good.expected_speedup_low,
        good.expected_speedup_high,
    )
    assert d.evaluated_at_s == T0 + 100.0
    # the last good decision was evaluated at T0+10: 100 - 10 = 90 s ago
    assert "stale:" in d.reason and "last good decision 90s ago" in d.reason
    assert "last scrape 95s ago" in d.reason and "dwell restarts" in d.reason
    assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (None, None, None)
    assert s.published == good
    # back to ok at T0+130: had the stale spell counted, 130 - 10 = 120 s would publish "off" now
    d, s = tick(s, T0 + 130.0, BAD, ON2)
    assert (d.state, d.enabled, s.pending_since_s) == (TargetState.OK, True, T0 + 130.0)
    d, s = tick(s, T0 + 250.0, BAD, ON2)  # 250 - 130 = 120 s
    assert d.enabled is False


def test_error_and_insufficient_data_never_flip() -> None:
    s = _published_on_gamma_2()
    for kind in (TargetState.ERROR, TargetState.INSUFFICIENT_DATA, TargetState.STALE):
        d, s2 = tick(s, T0 + 30.0, BAD, replace(ON2, state=kind, speculation_on=False, deployed_k=0))
        assert (d.state, d.enabled, d.num_speculative_tokens) == (kind, True, 2)
        assert s2.published == s.published
        assert d.reason.startswith(f"{kind.value}: keeping on, gamma 2")


def test_not_ok_with_nothing_published_shows_the_deployment() -> None:
    for kind in (TargetState.ERROR, TargetState.INSUFFICIENT_DATA, TargetState.STALE):
        d, s = tick(DecideState(), T0, (), replace(ON2, state=kind, deployed_k=3))
        assert (d.state, d.enabled, d.num_speculative_tokens) == (kind, True, 3)
        assert (d.expected_speedup, d.expected_speedup_low, d.expected_speedup_high) == (1.0, 1.0, 1.0)
        assert d.changed_at_s is None and d.evaluated_at_s == T0
        assert s == DecideState()
        assert "nothing published yet" in d.reason


def test_insufficient_data_reason_says_how_many_drafts() -> None:
    told = replace(OFF, state=TargetState.INSUFFICIENT_DATA, reason="120 drafts in window, need 300")
    d, _ = tick(DecideState(), T0, (), told)
    assert "120 drafts in window, need 300" in d.reason
    # without a reason from the estimator, the count comes from the acceptance evidence itself
    untold = replace(told, reason="", acceptance=make_acceptance(drafts=42.0))
    d, _ = tick(DecideState(), T0, (), untold)
    assert "42 drafts seen" in d.reason


def test_ok_evidence_without_a_usable_curve_is_an_error_that_keeps_state() -> None:
    s = _published_on_gamma_2()
    d, s2 = tick(s, T0 + 30.0, make_curve(), ON2)  # only gamma 0
    assert (d.state, d.enabled, d.num_speculative_tokens) == (TargetState.ERROR, True, 2)
    assert "no predicted speedup for any gamma in 1..8" in d.reason
    assert s2.published == s.published


# ---- purity


def test_same_inputs_give_the_same_outputs() -> None:
    _, s = tick(DecideState(), T0, GOOD)
    first = decide(replace(OFF, at_s=T0 + 40.0), GOOD, CFG, s, T0 + 40.0)
    second = decide(replace(OFF, at_s=T0 + 40.0), GOOD, CFG, s, T0 + 40.0)
    assert first == second
    # and the state passed in is untouched (a frozen value, still waiting since T0)
    assert (s.pending_enabled, s.pending_gamma, s.pending_since_s) == (True, 3, T0)
