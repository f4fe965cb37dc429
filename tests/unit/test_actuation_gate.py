"""The actuation safety gate (policies/act/gate.py): each rule on its own, with the arithmetic spelled out."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from policies.act.deployment import ActuatorError, DeploymentObservation, SpeculationSetting
from policies.act.gate import (
    ActuationConfig,
    ActuationState,
    Override,
    SkipReason,
    actions_within,
    cooldown_remaining_s,
    desired_setting,
    gate_action,
    materially_different,
    same_setting,
    schedule_change_share,
)
from policies.offline.schedule import BatchSchedule, ScheduleBand
from policies.types import DataState, Decision

T0 = 1_700_000_000.0
CONFIG = ActuationConfig(dwell_s=300, cooldown_s=900, max_actions_per_hour=2, max_actions_per_day=8)
OFF = SpeculationSetting(0)
K3 = SpeculationSetting(3)


def decision(*, state: DataState = DataState.OK, enabled: bool = True, num_speculative_tokens: int = 3
             ) -> Decision:
    return Decision(
        target="llama", model="m", state=state, enabled=enabled, num_speculative_tokens=num_speculative_tokens,
        expected_speedup=1.4, expected_speedup_low=1.3, expected_speedup_high=1.5, reason="on", evaluated_at_s=T0,
    )


def observed(setting: SpeculationSetting | None = OFF, *, rollout_in_progress: bool = False,
             error: ActuatorError | None = None, detail: str = "") -> DeploymentObservation:
    return DeploymentObservation(at_s=T0, setting=setting, rollout_in_progress=rollout_in_progress,
                                 resource_version="7", error=error, detail=detail)


def held(state: ActuationState | None = None, *, since: float = T0 - 400, wanted: SpeculationSetting = K3
         ) -> ActuationState:
    """A state whose wanted setting has held since `since` (400 s before T0 by default: past the 300 s dwell)."""
    return replace(state or ActuationState(), wanted=wanted, wanted_since_s=since)


def plan(state: ActuationState, *, now: float = T0, d: Decision | None = None,
         obs: DeploymentObservation | None = None, desired: SpeculationSetting | None = K3,
         config: ActuationConfig = CONFIG) -> tuple[bool, SkipReason | None, ActuationState]:
    result, after = gate_action(d if d is not None else decision(), obs or observed(), desired, config=config,
                                state=state, now_s=now)
    return result.act, result.skip, after


def test_acts_when_every_rule_is_met_and_counts_the_action() -> None:
    act, skip, after = plan(held())
    assert act and skip is None
    assert after.last_action_s == T0 and after.recent_actions_s == (T0,)


def test_dwell_starts_on_the_first_ok_tick_and_is_served_after_dwell_s() -> None:
    _, skip, state = plan(ActuationState(), now=T0)
    assert skip == SkipReason.DWELL and state.wanted_since_s == T0
    _, skip, state = plan(state, now=T0 + 299)  # held 299 s < 300 s
    assert skip == SkipReason.DWELL
    act, _, _ = plan(state, now=T0 + 300)  # held 300 s >= 300 s
    assert act


def test_a_new_wanted_setting_restarts_the_dwell() -> None:
    _, _, state = plan(ActuationState(), now=T0)
    _, skip, state = plan(state, now=T0 + 200, desired=SpeculationSetting(4), d=decision(num_speculative_tokens=4))
    assert skip == SkipReason.DWELL and state.wanted_since_s == T0 + 200
    _, skip, _ = plan(state, now=T0 + 400, desired=SpeculationSetting(4), d=decision(num_speculative_tokens=4))
    assert skip == SkipReason.DWELL  # 400 - 200 = 200 s < 300 s
    act, _, _ = plan(state, now=T0 + 500, desired=SpeculationSetting(4), d=decision(num_speculative_tokens=4))
    assert act  # 500 - 200 = 300 s


@pytest.mark.parametrize(
    ("state", "reason"),
    [(DataState.STALE, SkipReason.STALE), (DataState.ERROR, SkipReason.ERROR),
     (DataState.INSUFFICIENT_DATA, SkipReason.INSUFFICIENT_DATA)],
)
def test_never_on_a_decision_that_is_not_ok_and_it_restarts_the_dwell(state: DataState, reason: SkipReason) -> None:
    act, skip, after = plan(held(), d=decision(state=state))
    assert not act and skip == reason
    assert after.wanted_since_s is None
    # Back to ok: the dwell starts again from this tick, though the same setting was wanted before.
    _, skip, after = plan(after, now=T0 + 5)
    assert skip == SkipReason.DWELL and after.wanted_since_s == T0 + 5


def test_no_decision_and_no_desired_setting_are_skips() -> None:
    result, _ = gate_action(None, observed(), None, config=CONFIG, state=held(), now_s=T0)
    assert result.skip == SkipReason.NO_DECISION
    _, skip, _ = plan(held(), desired=None)
    assert skip == SkipReason.NO_DESIRED


def test_never_while_a_rollout_is_in_progress_or_the_observation_failed() -> None:
    _, skip, _ = plan(held(), obs=observed(rollout_in_progress=True))
    assert skip == SkipReason.ROLLOUT_IN_PROGRESS
    _, skip, _ = plan(held(), obs=observed(None, error=ActuatorError.FORBIDDEN, detail="403"))
    assert skip == SkipReason.OBSERVATION_ERROR
    _, skip, _ = plan(held(), obs=observed(OFF, error=ActuatorError.CONFLICT))
    assert skip == SkipReason.OBSERVATION_ERROR


def test_no_op_when_the_deployment_already_runs_it() -> None:
    act, skip, after = plan(held(), obs=observed(K3))
    assert not act and skip == SkipReason.ALREADY_APPLIED and after.last_action_s is None
    # Off is off whatever the schedule says: no band drafting equals no speculation.
    _, skip, _ = plan(held(wanted=OFF), obs=observed(SpeculationSetting(0, ((256, 0),))), desired=OFF,
                      d=decision(enabled=False, num_speculative_tokens=0))
    assert skip == SkipReason.ALREADY_APPLIED


def test_cooldown_counts_from_the_last_action() -> None:
    state = held(replace(ActuationState(), last_action_s=T0 - 899, recent_actions_s=(T0 - 899,)))
    _, skip, _ = plan(state)  # 899 s since the last action < 900 s
    assert skip == SkipReason.COOLDOWN
    assert cooldown_remaining_s(state, CONFIG, T0) == 1.0  # 900 - 899
    act, _, _ = plan(state, now=T0 + 1)  # 900 s
    assert act


def test_hourly_cap_is_a_sliding_window() -> None:
    no_cooldown = replace(CONFIG, cooldown_s=0)
    # Two actions at T0-3500 and T0-100: both within the hour (3500 < 3600): at the cap of 2.
    state = held(replace(ActuationState(), last_action_s=T0 - 100, recent_actions_s=(T0 - 3500, T0 - 100)))
    _, skip, _ = plan(state, config=no_cooldown)
    assert skip == SkipReason.HOURLY_CAP
    # 100 s later the first is 3600 s old, out of the window: 1 < 2.
    act, _, after = plan(state, now=T0 + 100, config=no_cooldown)
    assert act and after.recent_actions_s == (T0 - 3500, T0 - 100, T0 + 100)


def test_daily_cap_is_a_sliding_window_and_old_actions_are_forgotten() -> None:
    config = replace(CONFIG, cooldown_s=0, max_actions_per_hour=100, max_actions_per_day=3)
    times = (T0 - 86000, T0 - 50000, T0 - 20000)  # all within the last 86400 s: 3 = the cap
    state = held(replace(ActuationState(), last_action_s=times[-1], recent_actions_s=times))
    _, skip, _ = plan(state, config=config)
    assert skip == SkipReason.DAILY_CAP
    act, _, after = plan(state, now=T0 + 400, config=config)  # T0-86000 is now 86400 s old: out
    assert act and after.recent_actions_s == (*times[1:], T0 + 400)
    assert actions_within(after, 86400, T0 + 400) == 3


def test_paused_blocks_everything_including_an_override() -> None:
    override = Override(setting=OFF, expires_at_s=T0 + 60, reason="incident", set_at_s=T0)
    _, skip, _ = plan(held(replace(ActuationState(), paused=True)))
    assert skip == SkipReason.PAUSED
    _, skip, _ = plan(replace(ActuationState(), paused=True, override=override))
    assert skip == SkipReason.PAUSED


def test_an_override_wins_over_the_recommendation_cooldown_and_caps() -> None:
    override = Override(setting=OFF, expires_at_s=T0 + 60, reason="incident", set_at_s=T0 - 5)
    # The deployment runs k 3, the recommendation is stale and the cooldown of the action at T0 - 10 (before the
    # override was set) has 890 s left: the override's first attempt acts.
    state = replace(ActuationState(), override=override, last_action_s=T0 - 10, recent_actions_s=(T0 - 10,))
    result, after = gate_action(decision(state=DataState.STALE), observed(K3), K3, config=CONFIG, state=state,
                                now_s=T0)
    assert result.act and result.via_override and result.desired == OFF
    assert after.last_action_s == T0
    # Once it runs, it is a no-op; it never bypasses a rollout in progress.
    _, skip, _ = plan(after, obs=observed(OFF))
    assert skip == SkipReason.ALREADY_APPLIED
    _, skip, _ = plan(after, obs=observed(K3, rollout_in_progress=True))
    assert skip == SkipReason.ROLLOUT_IN_PROGRESS


def test_a_failing_override_is_tried_at_once_then_retried_once_per_cooldown() -> None:
    override = Override(setting=OFF, expires_at_s=T0 + 7200, reason="incident", set_at_s=T0)
    # A recommendation action 100 s before the override does not hold back the override's first attempt.
    state = replace(ActuationState(), override=override, last_action_s=T0 - 100, recent_actions_s=(T0 - 100,))
    act, _, state = plan(state, now=T0, obs=observed(K3))
    assert act
    # The patch failed (the deployment still runs k 3): the next ticks are in the cooldown of that attempt.
    result, state = gate_action(decision(), observed(K3), K3, config=CONFIG, state=state, now_s=T0 + 5)
    assert not result.act and result.skip == SkipReason.COOLDOWN and result.via_override
    assert "895 s" in result.detail  # 900 - (T0 + 5 - T0)
    act, skip, state = plan(state, now=T0 + 899, obs=observed(K3))
    assert skip == SkipReason.COOLDOWN
    act, _, state = plan(state, now=T0 + 900, obs=observed(K3))  # 900 s after the first attempt: retried
    assert act and state.last_action_s == T0 + 900
    # A new override (set after the last attempt) gets its own immediate first attempt.
    newer = Override(setting=SpeculationSetting(2), expires_at_s=T0 + 7200, reason="try k 2", set_at_s=T0 + 901)
    act, _, _ = plan(replace(state, override=newer), now=T0 + 902, obs=observed(K3))
    assert act


def test_an_override_expires_by_itself() -> None:
    override = Override(setting=OFF, expires_at_s=T0 + 60, reason="test", set_at_s=T0)
    state = held(replace(ActuationState(), override=override))
    _, skip, after = plan(state, now=T0 + 60, obs=observed(K3))  # expires at T0 + 60 (now >= expiry)
    assert after.override is None
    assert skip == SkipReason.ALREADY_APPLIED  # the recommendation (k 3) rules again and already runs


def test_desired_setting_per_mode() -> None:
    on, off = decision(num_speculative_tokens=4), decision(enabled=False, num_speculative_tokens=0)
    assert desired_setting(on, mode="kubernetes") == SpeculationSetting(4)
    assert desired_setting(off, mode="kubernetes") == OFF
    assert desired_setting(on, mode="routing", on_pool_k=2) == SpeculationSetting(2)
    assert desired_setting(off, mode="routing", on_pool_k=2) == OFF
    assert desired_setting(on, mode="routing") is None
    assert desired_setting(on, mode="schedule") is None
    bands = (ScheduleBand(1, 30, 5, 2.0, 1.8, False), ScheduleBand(31, 256, 2, 1.3, 1.1, False))
    schedule = BatchSchedule(bands=bands, max_num_seqs=256, gamma_max=8, context_tokens=512, margin=0)
    # The largest band k (5) is num_speculative_tokens; bands as (upper batch bound, k).
    assert desired_setting(off, mode="schedule", schedule=schedule) == SpeculationSetting(5, ((30, 5), (256, 2)))
    useless = replace(schedule, bands=(ScheduleBand(1, 256, 0, 0.9, 0.8, False),))
    assert desired_setting(on, mode="schedule", schedule=useless) == OFF


def test_schedule_change_share_is_log_weighted_over_the_batch_range() -> None:
    base = SpeculationSetting(4, ((3, 4), (256, 2)))
    flat = SpeculationSetting(2, ((256, 2),))
    # k differs (4 vs 2) at batch 1..3: ln(4) / ln(257).
    assert schedule_change_share(base, flat) == pytest.approx(math.log(4) / math.log(257))
    top_only = SpeculationSetting(2, ((199, 2), (256, 1)))
    # k differs at batch 200..256: ln(257 / 200) / ln(257) ~ 0.045.
    assert schedule_change_share(flat, top_only) == pytest.approx(math.log(257 / 200) / math.log(257))
    assert schedule_change_share(flat, flat) == 0.0


def test_a_schedule_rolls_out_only_when_it_changed_materially() -> None:
    running = SpeculationSetting(4, ((3, 4), (256, 2)))
    nudged = SpeculationSetting(4, ((4, 4), (256, 2)))  # batch 4 moves: ln(5/4)/ln(257) = 0.04 < 0.10
    assert not materially_different(running, nudged, CONFIG)
    _, skip, _ = plan(held(wanted=nudged), obs=observed(running), desired=nudged)
    assert skip == SkipReason.BELOW_CHANGE_THRESHOLD
    moved = SpeculationSetting(4, ((16, 4), (256, 2)))  # batch 4..16: ln(17/4)/ln(257) = 0.26 >= 0.10
    assert materially_different(running, moved, CONFIG)
    act, _, _ = plan(held(wanted=moved), obs=observed(running), desired=moved)
    assert act
    # Turning speculation off is always material, however the bands compare.
    assert materially_different(running, OFF, CONFIG)
    assert same_setting(OFF, SpeculationSetting(0, ((256, 0),)))


def test_a_schedule_jittering_within_the_threshold_keeps_its_dwell_clock() -> None:
    first = SpeculationSetting(4, ((3, 4), (256, 2)))
    jitter = SpeculationSetting(4, ((4, 4), (256, 2)))
    _, _, state = plan(ActuationState(), now=T0, desired=first, obs=observed(OFF))
    _, skip, state = plan(state, now=T0 + 200, desired=jitter, obs=observed(OFF))
    assert skip == SkipReason.DWELL and state.wanted_since_s == T0 and state.wanted == jitter
    act, _, _ = plan(state, now=T0 + 300, desired=jitter, obs=observed(OFF))  # 300 s since T0
    assert act


def test_every_skip_reason_is_a_metric_label() -> None:
    for reason in SkipReason:
        assert reason.value.replace("_", "").isalpha() and reason.value.islower()
