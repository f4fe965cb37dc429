"""What a change costs (policies/decide/change_cost.py), how decide weighs it (per delivered token, at the band's
pessimistic end, scaled into the plan's units) and the re-measuring probe (policies/decide/probe.py probe_for)."""

from __future__ import annotations

from policies.decide.change_cost import change_cost_of, inflight_work_s, queued_work_s
from policies.decide.probe import Remembered, probe_for
from policies.decide.rule import DecideConfig, DecideInputs, DecideState, HorizonCurve, Probe, decide
from policies.types import CurvePoint, DataState, Evidence


def _curve(*speedups: float) -> tuple[CurvePoint, ...]:
    return tuple(
        CurvePoint(gamma=g, speedup=s, speedup_low=s, speedup_high=s, expected_accepted_length=1.0,
                   step_time_s=0.01, extrapolated=False)
        for g, s in enumerate((1.0, *speedups))
    )


def _evidence(**fields: float | None) -> Evidence:
    base: dict[str, float | None] = {"batch": 32.0, "waiting": 0.0, "generation_tokens_per_s": 1600.0,
                                     "prompt_tokens_per_s": 3200.0, "context_tokens_per_seq": 640.0}
    base.update(fields)
    return Evidence(target="t", model="m", at_s=0.0, state=DataState.OK, speculation_on=True, deployed_k=3,
                    acceptance=None, batch=base["batch"] or 0.0, waiting=base["waiting"] or 0.0,
                    generation_tokens_per_s=base["generation_tokens_per_s"],
                    prompt_tokens_per_s=base["prompt_tokens_per_s"],
                    context_tokens_per_seq=base["context_tokens_per_seq"])


def test_in_flight_work_is_half_a_requests_decode_time() -> None:
    # rho = 3200 / 1600 = 2, O = 640 / (2 + 0.5) = 256 tokens; half of it, 128 tokens, at one sequence's
    # 32 / 1600 = 0.02 s per token: 2.56 s of full service.
    assert abs(inflight_work_s(_evidence()) - 2.56) < 1e-9


def test_waiting_requests_add_no_cost() -> None:
    # Queued requests lose no computed work: the cost is the same with 0 or 500 waiting.
    assert inflight_work_s(_evidence(waiting=500.0)) == inflight_work_s(_evidence(waiting=0.0))


def test_queued_work_is_each_queued_requests_whole_output() -> None:
    # O = 256 tokens each (as above); 64 queued x 256 / 1600 tokens/s = 10.24 s of full service.
    assert abs(queued_work_s(_evidence(waiting=64.0)) - 10.24) < 1e-9
    assert queued_work_s(_evidence(waiting=0.0)) == 0.0
    assert queued_work_s(_evidence(waiting=64.0, generation_tokens_per_s=None)) == 0.0


def test_missing_rates_leave_only_the_outage() -> None:
    assert inflight_work_s(_evidence(generation_tokens_per_s=None)) == 0.0
    assert inflight_work_s(_evidence(context_tokens_per_seq=None)) == 0.0
    # 20 s outage + 0 s in flight.
    assert change_cost_of(change_cost_s=20.0, inflight_s=0.0) == 20.0


def test_free_changes_lose_nothing_in_flight() -> None:
    # No restart, no in-flight work lost either; a restart costs its outage plus the work in flight.
    assert change_cost_of(change_cost_s=0.0, inflight_s=5.0) == 0.0
    assert change_cost_of(change_cost_s=20.0, inflight_s=2.56) == 22.56
    assert change_cost_of(change_cost_s=20.0, inflight_s=float("nan")) == 20.0


def test_probe_waits_until_the_memory_is_old_enough_to_be_worth_a_look() -> None:
    config = DecideConfig(change_cost_s=20, payback_horizon_s=600, dwell_s=120)
    remembered = _curve(0.9, 0.8, 0.7)
    prior = _curve(1.3, 1.5, 1.4)
    def look(age_s: float, inflight_s: float = 0.0) -> Probe | None:
        return probe_for(Remembered(age_s, 1, remembered), prior=prior, inflight_s=inflight_s, config=config,
                         half_life_s=1800.0)

    # Cost: 2 x 20 + 120 s x (1 - 0.9) = 52 s. Gain: p x (1.5 - 1) x 600.
    # age 600 s: p = 1 - 2^(-1/3) = 0.206 -> 61.9 s > 52 s; age 450 s: p = 0.159 -> 47.7 s < 52 s.
    probe = look(600.0)
    assert probe is not None and probe.gamma == 1
    assert look(450.0) is None
    # 5 s in flight per change: 2 x 25 + 12 = 62 s > 61.9 s: not yet at 600 s.
    assert look(600.0, inflight_s=5.0) is None


def test_no_probe_when_even_the_prior_says_speculation_loses() -> None:
    config = DecideConfig(change_cost_s=0)
    below = _curve(0.9, 0.95)
    assert probe_for(Remembered(1e5, 1, below), prior=below, inflight_s=0.0, config=config,
                     half_life_s=1800.0) is None


def _slo_curve(s3: float, share0: float, share3: float) -> tuple[CurvePoint, ...]:
    # An SLO-goodput curve: gamma 0 is the unit, gamma 3 at s3; each point carries its share meeting the SLO.
    points = []
    for g in range(4):
        s = 1.0 if g == 0 else (s3 if g == 3 else 0.5 * s3)
        share = share0 if g == 0 else (share3 if g == 3 else share3 / 2)
        points.append(CurvePoint(gamma=g, speedup=s, speedup_low=s, speedup_high=s, expected_accepted_length=1.0,
                                 step_time_s=0.01, slo_share=share))
    return tuple(points)


def _decide_on_k3(curve: tuple[CurvePoint, ...]) -> tuple[bool, str]:
    # Published on at k=3 (the first decision adopts the deployment), then a dwell later: is off published?
    config = DecideConfig(change_cost_s=20.0, payback_horizon_s=600.0)
    first, state = decide(_evidence(), curve, config, DecideState(), 1000.0)
    assert first.enabled and first.num_speculative_tokens == 3
    _, state = decide(_evidence(), curve, config, state, 1005.0)
    decision, _ = decide(_evidence(), curve, config, state, 1005.0 + config.dwell_s + 5.0)
    return decision.enabled, decision.reason


def test_slo_gain_is_counted_per_delivered_token_not_as_a_ratio_of_tiny_shares() -> None:
    # Neither option meets the SLO: 2% of tokens off vs 1% on. Off "doubles SLO goodput" (S(3) = 0.5), but it
    # moves 1% of the served tokens across the SLO: 0.01 x 600 s = 6 s < 20 s + in-flight: keep running (and
    # keep measuring the acceptance, which turning off would blind).
    enabled, reason = _decide_on_k3(_slo_curve(s3=0.5, share0=0.02, share3=0.01))
    assert enabled and "off gains +1.0% against the running option's band high end" in reason  # (1 - 0.5) / 0.5 x 0.01
    # Off meets the SLO for 60% of tokens where k=3 meets it for 30%: 30% of the service, 180 s > the cost.
    enabled, _ = _decide_on_k3(_slo_curve(s3=0.5, share0=0.6, share3=0.3))
    assert not enabled


def test_under_an_slo_a_probe_counts_the_tokens_it_could_move_across_the_slo() -> None:
    # Off meets the SLO for 1% of tokens, the prior says gamma 3 would for ~99% (S = 99): a 98% gain in service
    # per delivered token, not 9800%. Cost: 2 x 20 s (the remembered S(3) = 1 costs nothing while on).
    config = DecideConfig(change_cost_s=20, payback_horizon_s=600, dwell_s=120)
    prior = _slo_curve(s3=99.0, share0=0.01, share3=0.99)
    remembered = _slo_curve(s3=1.0, share0=0.01, share3=0.01)
    def look(age_s: float) -> Probe | None:
        return probe_for(Remembered(age_s, 3, remembered), prior=prior, inflight_s=0.0, config=config,
                         half_life_s=1800.0)

    # age 120 s: p = 1 - 2^(-1/15) = 0.045 -> 0.045 x 98 x 0.01 x 600 = 26.6 s < 40 s: not yet (a ratio would have
    # said 2660 s); age 240 s: p = 0.088 -> 51.7 s > 40 s.
    assert look(120.0) is None
    probe = look(240.0)
    assert probe is not None and "share 0.01 meeting the SLO off" in probe.why


def test_a_planned_cost_is_todays_cost_in_the_plans_units() -> None:
    # 20 s + 2.56 s in flight = 22.56 s today; x 0.1 in the plan's units (a light spell) = 2.256 s: gamma 1
    # planned 8% better over 600 s (48 s) pays. The wait is today's cost over today's gain (here the same 8%):
    # 22.56 / 0.08 = 282 s -> the 120 s dwell.
    assert _planned_switch_time(0.08, cost_scale=0.1) == 120.0
    # x 2.5 (deep in a heavy phase): 56.4 s > 48 s, never; a 60% gain (360 s) pays and waits 22.56 / 0.6 = 37.6 s
    # (the 40 s tick).
    assert _planned_switch_time(0.08, cost_scale=2.5) is None
    assert _planned_switch_time(0.6, cost_scale=2.5) == 40.0


def test_a_turn_off_must_pay_at_speculations_best_not_at_the_point_value() -> None:
    # SLO goodput, 1% of tokens meeting it at gamma 3. The point value says plain decoding would bring 12%
    # (S(3) = 0.083): (12 - 1) % of the service x 600 s = 66 s, more than the 22.6 s a restart costs. Against the
    # band's high end (S(3) = 0.80) the gain is (1 - 0.80) / 0.083 x 1% = 2.4% of the service, 14.4 s: off would
    # blind the advisor for a gain within the model's own uncertainty, so it keeps gamma 3.
    def curve(s3_high: float) -> tuple[CurvePoint, ...]:
        points = []
        for g in range(4):
            s = 1.0 if g == 0 else 0.01 / 0.12
            high = 1.0 if g == 0 else s3_high
            share = 0.12 if g == 0 else 0.01
            points.append(CurvePoint(gamma=g, speedup=s, speedup_low=s, speedup_high=high,
                                     expected_accepted_length=1.0, step_time_s=0.01, slo_share=share))
        return tuple(points)

    enabled, reason = _decide_on_k3(curve(0.80))
    assert enabled and "held back by its cost" in reason
    # The same point value with a band whose high end also says off pays: (1 - 0.2) / 0.083 x 1% = 9.6%, 58 s.
    assert not _decide_on_k3(curve(0.2))[0]
    # High end 0.45: 6.6%, 39.6 s > 22.6 s, off; priced relative to the high end instead ((1 / 0.45 - 1) x 1% =
    # 1.2%, 7.3 s) it would have been held.
    assert not _decide_on_k3(curve(0.45))[0]


def _planned_switch_time(gain_s1: float, *, cost_scale: float, from_s: float = 1150.0) -> float | None:
    # On at k=3 (the baseline, published at T=1000); from T=from_s the plan says gamma 1 is worth gain_s1 over
    # S(3) = 1.0: how long after from_s the switch is published (a tick every 5 s), None if never.
    config = DecideConfig(change_cost_s=20.0, payback_horizon_s=600.0, dwell_s=120.0, confirm_s=30.0)
    steady = _curve(0.9, 0.95, 1.0)
    better = _curve(1.0 + gain_s1, 1.0, 1.0)
    state = DecideState()
    for tick in range(0, 120):
        now = 1000.0 + 5.0 * tick
        curve = steady if now < from_s else better
        inputs = DecideInputs(plan=HorizonCurve(curve, cost_scale))
        decision, state = decide(_evidence(), curve, config, state, now, inputs=inputs)
        if decision.num_speculative_tokens == 1:
            return now - from_s
    return None


def test_under_an_slo_a_small_running_share_makes_a_restart_dear_in_the_plans_units() -> None:
    # The plan's value is SLO goodput; the cost scale is today's delivered rate over the running option's planned
    # value, 1 / share when steady. gamma 1 planned 50% better: at share 0.02 the 22.56 s restart is 1128 s of
    # planned value (> 300 s won): held; at share 0.6 it is 37.6 s (< 300 s): it pays, and waits today's 22.56 s
    # over today's 50%, 45 s (the 50 s tick).
    assert _planned_switch_time(0.5, cost_scale=1 / 0.02) is None
    assert _planned_switch_time(0.5, cost_scale=1 / 0.6) == 50.0


def test_the_baseline_does_not_hold_back_the_first_change() -> None:
    # The first decision adopts what runs; it is not a change, so a change seen 50 s later waits only its own
    # 22.56 / 0.6 = 37.6 s (the 40 s tick), not until the baseline is a dwell old.
    assert _planned_switch_time(0.6, cost_scale=0.1, from_s=1050.0) == 40.0


def test_with_a_plan_the_wait_is_todays_cost_over_todays_gain() -> None:
    # The plan says gamma 1 is worth 60% more over the recent load; this window says 8% (the load just turned).
    # Valued on the plan (360 s against 2.3 s at cost scale 0.1) it pays; the wait is today's 22.56 s over today's
    # 8% = 282 s -> the 120 s dwell, not 22.56 / 0.6 = 38 s.
    config = DecideConfig(change_cost_s=20.0, payback_horizon_s=600.0, dwell_s=120.0, confirm_s=30.0)
    today, planned = _curve(1.08, 1.0, 1.0), _curve(1.6, 1.0, 1.0)
    inputs = DecideInputs(plan=HorizonCurve(planned, 0.1))
    _, state = decide(_evidence(), today, config, DecideState(), 1000.0, inputs=inputs)
    decision, state = decide(_evidence(), today, config, state, 1040.0, inputs=inputs)
    assert decision.num_speculative_tokens == 3
    assert "wait 120s (cost today 22.6s / gain expected now +8.0%" in decision.reason
    decision, _ = decide(_evidence(), today, config, state, 1120.0, inputs=inputs)
    assert decision.num_speculative_tokens == 1
