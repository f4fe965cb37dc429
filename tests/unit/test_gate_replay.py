"""The actuation gate over recorded decisions (policies/act/replay.py): one action where a live runner would take
one, none where it would hold back, and the gain read off the decision's own curve."""

from __future__ import annotations

from policies.act.gate import ActuationConfig, judged_decision
from policies.act.replay import ReplayTick, replay_gate
from policies.types import CurvePoint, DataState, Decision

CONFIG = ActuationConfig(dwell_s=10.0, cooldown_s=30.0, max_actions_per_hour=2, max_actions_per_day=8)


def point(gamma: int, speedup: float) -> CurvePoint:
    return CurvePoint(gamma=gamma, speedup=speedup, speedup_low=speedup * 0.9, speedup_high=speedup * 1.1,
                      expected_accepted_length=1.0 + gamma * 0.5, step_time_s=0.01)


def decision(t: float, k: int, state: DataState = DataState.OK) -> Decision:
    # At this load k 3 is priced at 0.90x and off at 1.00x.
    return Decision(target="t", model="m", state=state, enabled=k > 0, num_speculative_tokens=k,
                    expected_speedup=1.0 if k == 0 else 0.9, expected_speedup_low=0.9, expected_speedup_high=1.1,
                    reason="r", evaluated_at_s=t, curve=(point(0, 1.0), point(3, 0.9)))


def ticks(wanted: list[int], *, deployed_k: int = 3, evidence: DataState = DataState.OK) -> list[ReplayTick]:
    return [ReplayTick(at_s=5.0 * i, decision=decision(5.0 * i, k), evidence_state=evidence, deployed_k=deployed_k)
            for i, k in enumerate(wanted)]


def test_a_held_turn_off_is_one_action_after_the_dwell_then_already_applied() -> None:
    replay = replay_gate(ticks([0] * 10), config=CONFIG)
    assert [(a.at_s, a.running_k, a.wanted_k) for a in replay.actions] == [(10.0, 3, 0)]
    action = replay.actions[0]
    assert action.gain is not None and abs(action.gain - 1.0 / 0.9) < 1e-9
    assert action.gain_low is not None and abs(action.gain_low - 0.9 / 0.9) < 1e-9
    # Before: held by the dwell (t=0, 5); after: the counterfactual deployment already runs it (t=15..45).
    assert replay.skips == {"dwell": 2, "already_applied": 7}


def test_a_flip_back_waits_out_the_cooldown() -> None:
    # Off wanted from t=0, back to k 3 from t=20: act off at 10, then k 3 once held and cooled down (10 + 30 = 40).
    replay = replay_gate(ticks([0, 0, 0, 0] + [3] * 8), config=CONFIG)
    assert [(a.at_s, a.wanted_k) for a in replay.actions] == [(10.0, 0), (40.0, 3)]


def test_thin_live_evidence_never_acts() -> None:
    replay = replay_gate(ticks([0] * 10, evidence=DataState.INSUFFICIENT_DATA), config=CONFIG)
    assert replay.actions == ()
    assert replay.skips == {"insufficient_data": 10}


def test_what_history_already_ran_is_not_an_action() -> None:
    replay = replay_gate(ticks([3] * 6, deployed_k=3), config=CONFIG)
    assert replay.actions == ()
    assert replay.skips == {"already_applied": 6}


def test_the_judged_decision_takes_the_evidence_state_only_when_the_decision_is_ok() -> None:
    ok = decision(0.0, 0)
    assert judged_decision(ok, DataState.OK) is ok
    assert judged_decision(ok, None) is not None
    assert judged_decision(ok, None).state == DataState.INSUFFICIENT_DATA  # type: ignore[union-attr]
    stale = decision(0.0, 0, DataState.STALE)
    assert judged_decision(stale, DataState.OK) is stale
    assert judged_decision(None, DataState.OK) is None


def test_a_grid_keeps_its_last_point_and_refuses_what_cannot_be_counted() -> None:
    from service.backtest.replay import Grid  # noqa: PLC0415  (service code: the replay's grid)

    assert Grid(start_s=0.0, end_s=1.0, step_s=0.1).points == 11  # 1.0 / 0.1 is 9.999... in binary
    assert Grid(start_s=0.0, end_s=0.7, step_s=0.7).points == 2
    for start, end, step in ((0.0, 10.0, 1e-320), (-1e308, 1e308, 1.0), (0.0, 10.0, 0.001), (5.0, 1.0, 1.0)):
        try:
            Grid(start_s=start, end_s=end, step_s=step)
        except ValueError:
            continue
        raise AssertionError((start, end, step))
