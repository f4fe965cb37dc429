"""Planning restart-costly changes over the recent load (policies/decide/horizon.py) and decide's use of the plan."""

from __future__ import annotations

import math

import pytest

from policies.decide.horizon import (
    HorizonState,
    HorizonTick,
    cost_scale,
    horizon_curve,
    observe,
    planned_rate,
    queue_cost_s,
    queue_weight,
)
from policies.decide.rule import DecideConfig, DecideInputs, DecideState, HorizonCurve, decide
from policies.types import CurvePoint, DataState, Evidence

T0 = 1_800_000_000.0


def _curve(*speedups: float, band: float = 0.0) -> tuple[CurvePoint, ...]:
    return tuple(
        CurvePoint(gamma=g, speedup=s, speedup_low=s - band, speedup_high=s + band, expected_accepted_length=1.0,
                   step_time_s=0.01)
        for g, s in enumerate((1.0, *speedups))
    )


def test_a_tick_adds_the_value_of_each_gamma_in_tokens_per_second() -> None:
    state = observe(
        HorizonState(), HorizonTick(_curve(1.46, 1.60, 1.70), running_gamma=3, value_rate=300.0, capacity_bound=False),
        now_s=T0, tau_s=600.0, margin=0.02,
    )
    # V_t(g) = 300 x S(g) / S(3).
    assert state.values == pytest.approx((300 / 1.70, 300 * 1.46 / 1.70, 300 * 1.60 / 1.70, 300.0))
    assert planned_rate(state, 3) == pytest.approx(300.0)
    assert queue_weight(state, tau_s=600.0) == 1.0


def test_old_ticks_fade_with_the_horizon() -> None:
    light = observe(
        HorizonState(), HorizonTick(_curve(1.0), running_gamma=1, value_rate=300.0, capacity_bound=False), now_s=T0,
        tau_s=600.0, margin=0.02,
    )
    heavy = observe(
        light, HorizonTick(_curve(1.0), running_gamma=1, value_rate=6000.0, capacity_bound=True), now_s=T0 + 600.0,
        tau_s=600.0, margin=0.02,
    )
    # The light tick weighs exp(-1) = 0.368 against the heavy tick's 1.
    w = math.exp(-1.0)
    assert planned_rate(heavy, 1) == pytest.approx((w * 300.0 + 6000.0) / (w + 1.0))
    # The heavy tick came 600 s after the light one: it counts at most 60 s of overload, of a 600 s horizon.
    assert queue_weight(heavy, tau_s=600.0) == pytest.approx(1.0 - 60.0 / 600.0)
    # No rate: nothing added, the sums only fade (the mean is unchanged).
    later = observe(
        heavy, HorizonTick(_curve(1.0), running_gamma=1, value_rate=None, capacity_bound=True), now_s=T0 + 1200.0,
        tau_s=600.0, margin=0.02,
    )
    assert later.weight == pytest.approx(heavy.weight * w)
    assert planned_rate(later, 1) == pytest.approx(planned_rate(heavy, 1) or 0.0)


def test_a_fresh_plan_does_not_take_a_short_overload_for_a_persistent_one() -> None:
    # A sidecar that starts during an overload: after 2 minutes of capacity-bound ticks the queue still mostly
    # counts (1 - (1 - e^-0.2) = 0.82); after an hour it does not (0.0025).
    def overloaded_for(seconds: float) -> HorizonState:
        state = HorizonState()
        for i in range(int(seconds / 5.0) + 1):
            state = observe(
                state, HorizonTick(_curve(1.0), running_gamma=1, value_rate=6000.0, capacity_bound=True),
                now_s=T0 + 5.0 * i, tau_s=600.0, margin=0.02,
            )
        return state

    assert queue_weight(overloaded_for(5.0), tau_s=600.0) == pytest.approx(1.0 - 5.0 / 600.0, rel=1e-3)
    assert queue_weight(overloaded_for(120.0), tau_s=600.0) == pytest.approx(math.exp(-0.2), abs=0.01)
    assert queue_weight(overloaded_for(3600.0), tau_s=600.0) == pytest.approx(math.exp(-6.0), abs=0.01)


def test_a_queue_costs_no_more_than_the_horizon_can_serve_of_it() -> None:
    state = HorizonState()
    for i in range(25):  # 120 s capacity-bound: the queue counts at ~0.82
        state = observe(
            state, HorizonTick(_curve(1.0), running_gamma=1, value_rate=6000.0, capacity_bound=True),
            now_s=T0 + 5.0 * i, tau_s=600.0, margin=0.02,
        )
    weight = queue_weight(state, tau_s=600.0)
    assert 0.75 < weight < 0.9
    # A queue shorter than the horizon counts whole, at the weight.
    assert queue_cost_s(state, 10.0, tau_s=600.0) == pytest.approx(weight * 10.0)
    # One of 2160 s of service (an overload no gamma serves) counts only the 600 s the horizon can serve of it,
    # and a longer one no more: the cost stops growing with the queue.
    assert queue_cost_s(state, 2160.0, tau_s=600.0) == pytest.approx(weight * 600.0)
    assert queue_cost_s(state, 1e7, tau_s=600.0) == queue_cost_s(state, 2160.0, tau_s=600.0)
    assert queue_cost_s(state, 0.0, tau_s=600.0) == 0.0
    assert queue_cost_s(state, float("nan"), tau_s=600.0) == 0.0
    # No horizon to bound it by: the whole queue at the weight (which is then 1).
    assert queue_cost_s(state, 2160.0, tau_s=0.0) == pytest.approx(2160.0)


def test_a_broken_curve_point_teaches_the_plan_nothing() -> None:
    state = observe(
        HorizonState(), HorizonTick(_curve(1.2), running_gamma=1, value_rate=300.0, capacity_bound=False), now_s=T0,
        tau_s=600.0, margin=0.02,
    )
    broken = _curve(float("nan"))
    after = observe(
        state, HorizonTick(broken, running_gamma=1, value_rate=300.0, capacity_bound=False), now_s=T0 + 5.0,
        tau_s=600.0, margin=0.02,
    )
    assert after.weight == pytest.approx(state.weight * math.exp(-5.0 / 600.0))
    assert planned_rate(after, 1) == pytest.approx(300.0)
    assert horizon_curve(after, _curve(1.2)) is not None


def test_the_plan_curve_is_the_mean_value_over_plain_decoding_with_this_ticks_band() -> None:
    state = HorizonState(values=(2800.0, 3050.0, 3000.0, 2900.0), weight=1.0, at_s=T0, accepted=(1.0,) * 4,
                         measured=(1.0,) * 4)
    curve = _curve(1.46, 1.60, 1.70, band=0.06)
    planned = horizon_curve(state, curve)
    assert planned is not None
    assert [p.speedup for p in planned] == pytest.approx([1.0, 3050 / 2800, 3000 / 2800, 2900 / 2800])
    assert planned[1].speedup_low == pytest.approx(3050 / 2800 * 1.40 / 1.46)
    assert planned[1].speedup_high == pytest.approx(3050 / 2800 * 1.52 / 1.46)
    # Nothing to plan on: no plan, or a curve of another length (the deployed k moved past gamma_max).
    assert horizon_curve(HorizonState(), curve) is None
    assert horizon_curve(state, curve[:3]) is None
    restarted = observe(
        state, HorizonTick(curve[:3], running_gamma=1, value_rate=100.0, capacity_bound=False), now_s=T0 + 5,
        tau_s=600.0, margin=0.02,
    )
    assert restarted.weight == 1.0 and len(restarted.values) == 3


def _evidence() -> Evidence:
    return Evidence(target="t", model="m", at_s=0.0, state=DataState.OK, speculation_on=True, deployed_k=3,
                    acceptance=None, batch=2.0, waiting=0.0, generation_tokens_per_s=300.0,
                    prompt_tokens_per_s=600.0, context_tokens_per_seq=600.0)


def _published_after_a_dwell(cost_scale: float) -> tuple[bool, int, float, str]:
    # Light load now: this window says gamma 3 (S 1.70 vs 1.46); the recent load's mix (a heavy phase where gamma
    # 1 bought capacity) says gamma 1 is worth 7.7% more than gamma 3.
    curve = _curve(1.46, 1.60, 1.70)
    plan = _curve(1.10, 1.05, 1.02)
    config = DecideConfig(change_cost_s=20.0, payback_horizon_s=600.0)
    state = DecideState()
    decision = None
    for t in (0.0, 5.0, 130.0):
        inputs = DecideInputs(plan=HorizonCurve(plan, cost_scale))
        decision, state = decide(_evidence(), curve, config, state, T0 + t, inputs=inputs)
    assert decision is not None
    return decision.enabled, decision.num_speculative_tokens, decision.expected_speedup, decision.reason


def test_decide_moves_to_the_planned_gamma_when_a_restart_is_cheap_now() -> None:
    # 7.8% x 600 s = 47 s against (20 s + in-flight) x 0.09: moved, and the published speedup is this window's S(1).
    enabled, gamma, speedup, reason = _published_after_a_dwell(cost_scale=0.09)
    assert (enabled, gamma) == (True, 1)
    assert speedup == pytest.approx(1.46)
    assert "planned over the recent load" in reason


def test_decide_holds_the_planned_gamma_when_a_restart_is_dear_now() -> None:
    # Today's rate 2.5x the planned value (deep in a heavy phase): (20 s + 0.8 s in flight) x 2.5 = 52 s > 47 s.
    enabled, gamma, _, reason = _published_after_a_dwell(cost_scale=2.5)
    assert (enabled, gamma) == (True, 3)
    assert "held back by its cost" in reason


def _slo_curve(s3: float, share0: float, share3: float) -> tuple[CurvePoint, ...]:
    shares = (share0, share3 / 2, share3 / 2, share3)
    speeds = (1.0, 0.5 * s3, 0.5 * s3, s3)
    return tuple(CurvePoint(gamma=g, speedup=s, speedup_low=s, speedup_high=s, expected_accepted_length=1.0,
                            step_time_s=0.01, slo_share=share)
                 for g, (s, share) in enumerate(zip(speeds, shares, strict=True)))


def _verdicts(curve: tuple[CurvePoint, ...], *, planned: bool) -> list[tuple[bool, int]]:
    config = DecideConfig(change_cost_s=20.0, payback_horizon_s=600.0)
    evidence = _evidence()
    state, plan, out = DecideState(), HorizonState(), []
    for t in (0.0, 5.0, 130.0):
        inputs = DecideInputs()
        if planned:
            # As advise_target does: the value rate is G x share(running); the cost scale G / V(running).
            plan = observe(
                plan,
                HorizonTick(
                    curve, running_gamma=3, value_rate=300.0 * (curve[3].slo_share or 1.0), capacity_bound=False
                ),
                now_s=T0 + t, tau_s=600.0, margin=0.02,
            )
            planned_curve = horizon_curve(plan, curve)
            scale = cost_scale(plan, running_gamma=3, delivered_rate=300.0) or 1.0
            inputs = DecideInputs(plan=HorizonCurve(planned_curve, scale)) if planned_curve is not None else inputs
        decision, state = decide(evidence, curve, config, state, T0 + t, inputs=inputs)
        out.append((decision.enabled, decision.num_speculative_tokens))
    return out


def test_under_an_slo_a_steady_plan_weighs_changes_per_delivered_token_like_a_single_window() -> None:
    # Neither option meets the SLO (2% vs 1%): off is "2x the SLO goodput" but moves 1% of the tokens: kept on.
    # 60% vs 30%: 30% of the service, worth the restart: off. The plan and the single window agree on both.
    for curve, expected in ((_slo_curve(0.5, 0.02, 0.01), (True, 3)), (_slo_curve(0.5, 0.6, 0.3), (False, 0))):
        assert _verdicts(curve, planned=True)[-1] == _verdicts(curve, planned=False)[-1] == expected


def test_the_cost_scale_is_todays_delivered_rate_over_the_planned_value() -> None:
    # Steady under an SLO with 30% of gamma 3's tokens meeting it: V(3) = 300 x 0.3 = 90 tokens/s of SLO goodput;
    # a restart's cost is in delivered tokens: scale 300 / 90 = 1 / 0.3.
    curve = _slo_curve(0.5, 0.6, 0.3)
    plan = observe(
        HorizonState(), HorizonTick(curve, running_gamma=3, value_rate=300.0 * 0.3, capacity_bound=False), now_s=T0,
        tau_s=600.0, margin=0.02,
    )
    assert cost_scale(plan, running_gamma=3, delivered_rate=300.0) == pytest.approx(1 / 0.3)
    # Light now (300 tokens/s) after a heavy spell planned at ~3400: a tenth of today's cost.
    mixed = HorizonState(values=(3000.0, 3100.0, 3200.0, 3400.0), weight=1.0, at_s=T0)
    assert cost_scale(mixed, running_gamma=3, delivered_rate=300.0) == pytest.approx(300 / 3400)
    assert cost_scale(HorizonState(), running_gamma=3, delivered_rate=300.0) is None
    assert cost_scale(mixed, running_gamma=3, delivered_rate=None) is None




def _drafting(length: float, *, low: float, high: float) -> tuple[CurvePoint, ...]:
    """Off at 1.0 and gamma 3 at S 1.40 [low..high] accepting `length` tokens per verification."""
    return (
        CurvePoint(gamma=0, speedup=1.0, speedup_low=1.0, speedup_high=1.0, expected_accepted_length=1.0,
                   step_time_s=0.01),
        CurvePoint(gamma=1, speedup=1.2, speedup_low=1.1, speedup_high=1.3, expected_accepted_length=1.8,
                   step_time_s=0.012),
        CurvePoint(gamma=2, speedup=1.3, speedup_low=1.2, speedup_high=1.4, expected_accepted_length=2.5,
                   step_time_s=0.014),
        CurvePoint(gamma=3, speedup=1.4, speedup_low=low, speedup_high=high, expected_accepted_length=length,
                   step_time_s=0.016),
    )


def _planned_on(length: float, *, ticks: int = 24, capacity_bound: bool = False) -> HorizonState:
    state = HorizonState()
    for i in range(ticks):
        tick = HorizonTick(_drafting(length, low=1.35, high=1.45), running_gamma=3, value_rate=300.0,
                           capacity_bound=capacity_bound, measured=True)
        state = observe(state, tick, now_s=T0 + 5.0 * i, tau_s=600.0, margin=0.02)
    return state


def test_a_move_of_the_acceptance_past_its_band_restarts_the_plan_but_not_the_load_history() -> None:
    state = _planned_on(3.2, capacity_bound=True)
    assert state.weight > 20
    # E[L](3) 3.2 -> 2.6: |ln 0.8125| = 0.208 > max(0.02, ln(1.52 / 1.30) / 2 = 0.078).
    fell = HorizonTick(_drafting(2.6, low=1.30, high=1.52), running_gamma=3, value_rate=300.0, capacity_bound=True,
                       measured=True)
    after = observe(state, fell, now_s=T0 + 120.0, tau_s=600.0, margin=0.02)
    assert after.weight == 1.0  # only this tick
    assert after.values == pytest.approx(tuple(300.0 * p.speedup / 1.4 for p in fell.curve))
    assert after.capacity_s > state.capacity_s  # the overload seen so far still counts for the queue
    assert queue_weight(after, tau_s=600.0) < 1.0


def test_a_move_within_the_window_noise_or_below_the_margin_keeps_the_plan() -> None:
    state = _planned_on(3.2)
    # 3.2 -> 3.0 (|ln| = 0.065) inside a band of half-width ln(1.6 / 1.2) / 2 = 0.144: counting noise.
    noisy = HorizonTick(_drafting(3.0, low=1.2, high=1.6), running_gamma=3, value_rate=300.0, capacity_bound=False,
                        measured=True)
    assert observe(state, noisy, now_s=T0 + 120.0, tau_s=600.0, margin=0.02).weight > state.weight
    # 3.2 -> 3.1 (0.032) past a narrow band (half-width ln(1.405 / 1.395) / 2 = 0.0036) but below a 5% margin: no
    # change could pay for it.
    small = HorizonTick(_drafting(3.1, low=1.395, high=1.405), running_gamma=3, value_rate=300.0,
                        capacity_bound=False, measured=True)
    assert observe(state, small, now_s=T0 + 120.0, tau_s=600.0, margin=0.05).weight > state.weight
    # ... and restarts it with a 2% margin.
    assert observe(state, small, now_s=T0 + 120.0, tau_s=600.0, margin=0.02).weight == 1.0


def test_off_the_curve_acceptance_is_not_measured_and_never_restarts_the_plan() -> None:
    state = HorizonState()
    for i, length in enumerate((3.2, 3.2, 1.5)):  # remembered or the prior's: not a measurement of this window
        tick = HorizonTick(_drafting(length, low=1.30, high=1.52), running_gamma=0, value_rate=300.0,
                           capacity_bound=False)
        state = observe(state, tick, now_s=T0 + 5.0 * i, tau_s=600.0, margin=0.02)
    assert state.weight > 2.9


def test_acceptance_nobody_measured_neither_restarts_the_plan_nor_enters_its_mean() -> None:
    state = _planned_on(3.2)
    # A thin window priced from a remembered profile (not measured live): E[L] 2.0 says nothing about this window.
    stood_in = HorizonTick(_drafting(2.0, low=1.35, high=1.45), running_gamma=3, value_rate=300.0,
                           capacity_bound=False, measured=False)
    after = observe(state, stood_in, now_s=T0 + 120.0, tau_s=600.0, margin=0.02)
    assert after.weight > state.weight
    assert after.accepted[3] / after.measured[3] == pytest.approx(3.2)  # the mean is still the measured one
    # A band whose low end is 0 (an SLO the low end misses) is unbounded noise: no restart, however far E[L] moved.
    unbounded = HorizonTick(_drafting(1.5, low=0.0, high=1.45), running_gamma=3, value_rate=300.0,
                            capacity_bound=False, measured=True)
    assert observe(state, unbounded, now_s=T0 + 120.0, tau_s=600.0, margin=0.02).weight > state.weight
    infinite = HorizonTick(_drafting(1.5, low=1.35, high=float("inf")), running_gamma=3, value_rate=300.0,
                           capacity_bound=False, measured=True)
    assert observe(state, infinite, now_s=T0 + 120.0, tau_s=600.0, margin=0.02).weight > state.weight


def test_a_gamma_first_measured_after_a_step_up_does_not_restart_the_plan() -> None:
    # Measured at 2 for two minutes (gamma 3 only extrapolated), then gamma 3 runs: its first measured length (2.4,
    # far from the 3.2 the extrapolation said) has nothing measured to move from.
    state = HorizonState()
    for i in range(24):
        tick = HorizonTick(_drafting(3.2, low=1.35, high=1.45), running_gamma=2, value_rate=300.0,
                           capacity_bound=False, measured=True)
        state = observe(state, tick, now_s=T0 + 5.0 * i, tau_s=600.0, margin=0.02)
    assert state.measured[3] == 0.0 and state.measured[2] > 0.0
    up = HorizonTick(_drafting(2.4, low=1.35, high=1.45), running_gamma=3, value_rate=300.0, capacity_bound=False,
                     measured=True)
    after = observe(state, up, now_s=T0 + 120.0, tau_s=600.0, margin=0.02)
    assert after.weight > state.weight and after.accepted[3] / after.measured[3] == pytest.approx(2.4)
