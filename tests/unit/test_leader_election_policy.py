"""policies/act/leader.py: client-go's leader election decisions as pure functions of the record read and the time."""

from __future__ import annotations

import pytest

from policies.act.leader import (
    ElectionConfig,
    ElectionState,
    LeaseRecord,
    WriteKind,
    conflicted,
    follower_detail,
    is_holder,
    lease_valid,
    observe,
    plan_attempt,
    released,
    renewal,
    should_act,
    written,
)

ME = ElectionConfig(identity="pod-a_1", lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)
WALL = 1_800_000_000.25  # Unix seconds written into records
US = 1_800_000_000_250_000  # the same, in microseconds


def held_by(holder: str, *, renew_us: int = US, transitions: int = 3) -> LeaseRecord:
    return LeaseRecord(holder, 15, acquire_time_us=US - 60_000_000, renew_time_us=renew_us, transitions=transitions)


def test_an_absent_lease_is_created_naming_us() -> None:
    plan = plan_attempt(ElectionState(), None, config=ME, now_s=5.0, wall_s=WALL)
    assert plan.write is not None and plan.write.kind is WriteKind.CREATE and plan.write.takeover
    assert plan.write.record == LeaseRecord("pod-a_1", 15, US, US, 0)
    assert not should_act(plan.state, ME, 5.0)  # not before the API server stored it


def test_a_held_lease_is_left_alone_until_it_expires_on_our_own_clock() -> None:
    # The holder's renewTime says it renewed an hour ago by our wall clock (its clock is behind): that does not
    # matter. What counts is that we saw the record change at t=100 on our clock.
    stale_clock = held_by("pod-b_2", renew_us=US - 3_600_000_000)
    plan = plan_attempt(ElectionState(), stale_clock, config=ME, now_s=100.0, wall_s=WALL)
    assert plan.write is None and "held by pod-b_2" in plan.why
    assert plan.state.observed_at_s == 100.0
    # Read again unchanged at 114.9: still valid; at 115.0 (100 + 15) it has expired and we take it over.
    again = plan_attempt(plan.state, stale_clock, config=ME, now_s=114.9, wall_s=WALL)
    assert again.write is None and again.state.observed_at_s == 100.0
    takeover = plan_attempt(again.state, stale_clock, config=ME, now_s=115.0, wall_s=WALL + 15)
    assert takeover.write is not None and takeover.write.kind is WriteKind.UPDATE and takeover.write.takeover
    record = takeover.write.record
    assert record.holder == "pod-a_1" and record.transitions == 4  # leaseTransitions + 1 on a takeover
    assert record.acquire_time_us == record.renew_time_us == US + 15_000_000


def test_a_renewed_lease_never_expires_for_an_observer_whatever_its_times_say() -> None:
    # renewTime an hour in the future (the holder's clock is ahead): an observer still waits only on its own clock.
    state = ElectionState()
    for step in range(10):
        now_s = 100.0 + 10 * step  # the holder renews every 10 s; each read shows a new record
        record = held_by("pod-b_2", renew_us=US + 3_600_000_000 + step)
        plan = plan_attempt(state, record, config=ME, now_s=now_s, wall_s=WALL)
        assert plan.write is None
        state = plan.state
    assert lease_valid(state, 190.0 + 14.9) and not lease_valid(state, 190.0 + 15)


def test_a_released_lease_is_taken_over_at_once() -> None:
    release = LeaseRecord("", 1, US, US, transitions=7)
    plan = plan_attempt(ElectionState(), release, config=ME, now_s=50.0, wall_s=WALL)
    assert plan.write is not None and plan.write.takeover and plan.why == "take over (released)"
    assert plan.write.record.holder == "pod-a_1" and plan.write.record.transitions == 8


def test_the_holder_renews_keeping_acquire_time_and_transitions() -> None:
    mine = held_by("pod-a_1", transitions=4)
    state = written(ElectionState(), mine, ME, sent_at_s=100.0)
    plan = plan_attempt(state, mine, config=ME, now_s=102.0, wall_s=WALL + 2)
    assert plan.write is not None and not plan.write.takeover and plan.why == "renew"
    assert plan.write.record == LeaseRecord("pod-a_1", 15, mine.acquire_time_us, US + 2_000_000, 4)
    fast = renewal(state, ME, now_s=102.0, wall_s=WALL + 2)  # the same record, without reading first
    assert fast is not None and fast.record == plan.write.record
    assert renewal(state, ME, now_s=115.0, wall_s=WALL) is None  # expired on our clock: read first
    assert renewal(written(ElectionState(), held_by("pod-b_2"), ME, sent_at_s=100.0), ME, now_s=101.0,
                   wall_s=WALL) is None  # not ours


def test_the_leader_acts_until_its_renew_deadline_which_ends_before_anyone_may_take_over() -> None:
    state = written(ElectionState(), held_by("pod-a_1"), ME, sent_at_s=100.0)
    assert is_holder(state, ME)
    assert should_act(state, ME, 109.99)
    assert not should_act(state, ME, 110.0)  # 100 + renew deadline 10
    # Any observer saw that record at or after the write was sent, so its expiry clock ends at 115 or later.
    observer = ElectionConfig(identity="pod-b_2", lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)
    for seen_at in (100.0, 100.5, 103.0):
        seen = observe(ElectionState(), held_by("pod-a_1"), seen_at)
        first_takeover = seen_at + 15
        assert plan_attempt(seen, held_by("pod-a_1"), config=observer, now_s=first_takeover - 1e-6,
                            wall_s=WALL).write is None
        assert first_takeover > 110.0


def test_a_conflict_stops_acting_at_once_and_a_new_holder_is_followed() -> None:
    state = written(ElectionState(), held_by("pod-a_1"), ME, sent_at_s=100.0)
    assert not should_act(conflicted(state), ME, 100.1)
    # The read after the conflict shows another holder: we are no longer the holder, whatever we wrote before.
    plan = plan_attempt(conflicted(state), held_by("pod-b_2", transitions=4), config=ME, now_s=100.2, wall_s=WALL)
    assert plan.write is None and not is_holder(plan.state, ME) and not should_act(plan.state, ME, 100.2)


def test_release_gives_the_lease_back_only_when_held() -> None:
    state = written(ElectionState(), held_by("pod-a_1", transitions=5), ME, sent_at_s=100.0)
    write = released(state, ME, wall_s=WALL)
    assert write is not None and write.kind is WriteKind.UPDATE
    assert write.record == LeaseRecord("", 1, US, US, 5)  # no holder, 1 s, the same transitions (client-go)
    assert not should_act(written(state, write.record, ME, sent_at_s=101.0), ME, 101.0)
    assert released(written(ElectionState(), held_by("pod-b_2"), ME, sent_at_s=1.0), ME, wall_s=WALL) is None
    assert released(ElectionState(), ME, wall_s=WALL) is None


def test_the_details_say_who_leads() -> None:
    assert "no replica holds the lease yet" in follower_detail(ElectionState(), ME, 0.0)
    other = observe(ElectionState(), held_by("pod-b_2"), 1.0)
    assert follower_detail(other, ME, 2.0) == "the lease is held by pod-b_2; this replica (pod-a_1) only advises"
    mine = written(ElectionState(), held_by("pod-a_1"), ME, sent_at_s=100.0)
    assert "could not renew the lease for 12.0 s (renew deadline 10 s)" in follower_detail(mine, ME, 112.0)
    assert "a write of it was refused" in follower_detail(conflicted(mine), ME, 100.5)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"identity": ""}, "identity"),
    ({"lease_duration_s": 0, "renew_deadline_s": 0.5, "retry_period_s": 0.1}, "at least 1"),
    ({"lease_duration_s": 10, "renew_deadline_s": 10.0}, "shorter than lease_duration_s"),
    ({"renew_deadline_s": 2.0, "retry_period_s": 2.0}, "1.2 x retry_period_s"),
])
def test_config_is_checked(kwargs: dict[str, object], message: str) -> None:
    values: dict[str, object] = {"identity": "a", "lease_duration_s": 15, "renew_deadline_s": 10.0,
                                 "retry_period_s": 2.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        ElectionConfig(**values)  # type: ignore[arg-type]
