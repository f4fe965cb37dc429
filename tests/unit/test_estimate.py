"""Estimate stage: windowed counter deltas -> Evidence. Expected values are worked out by hand in comments."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from estimate_builders import (
    FIXTURE_CREATED_S,
    FIXTURE_TAKEN_AT_S,
    advance,
    feed,
    itl,
    make_snapshot,
    make_spec,
)

from policies.estimate.intervals import wilson_interval
from policies.estimate.window import EstimatorConfig, EstimatorState, estimate, observe
from policies.types import DataState, EngineSnapshot, Evidence, GpuSnapshot

CONFIG = EstimatorConfig()  # window 60 s, min 200 drafts, z 1.96, stale after 30 s
T0 = FIXTURE_TAKEN_AT_S
TARGET = "http://vllm:8000"


def run(
    snapshots: list[EngineSnapshot], *, now_s: float | None = None, config: EstimatorConfig = CONFIG
) -> Evidence:
    """Observe the snapshots, then estimate at `now_s` (default: the newest snapshot's time)."""
    state = feed(snapshots, config)
    when = now_s if now_s is not None else snapshots[-1].taken_at_s
    return estimate(state, target=TARGET, config=config, now_s=when)


def a_window(**growth: float) -> list[EngineSnapshot]:
    """The fixture scrape, then one 30 s later with 300 drafts, 800 draft tokens, 600 accepted and
    per-position growth (250, 200, 150) (which sums to 600, as vLLM's counters must)."""
    base = make_snapshot()
    later = advance(
        base,
        dt_s=30.0,
        drafts=growth.get("drafts", 300.0),
        draft_tokens=growth.get("draft_tokens", 800.0),
        accepted=growth.get("accepted", 600.0),
        per_position=(
            growth.get("p0", 250.0),
            growth.get("p1", 200.0),
            growth.get("p2", 150.0),
        ),
    )
    return [base, later]


# ----------------------------------------------------------------------------------------------------
# Cold start: the real capture's numbers
# ----------------------------------------------------------------------------------------------------


def test_cold_start_uses_lifetime_counters_of_the_real_capture() -> None:
    evidence = run([make_snapshot()])
    acceptance = evidence.acceptance
    assert acceptance is not None
    assert acceptance.cold_start is True
    # r_i = per_pos[i] / drafts = 515/540, 465/540, 435/540 = 0.953704, 0.861111, 0.805556
    assert acceptance.per_position == pytest.approx((515 / 540, 465 / 540, 435 / 540))
    # E[L] = 1 + accepted/drafts = 1 + 1415/540 = 3.620370
    assert acceptance.mean_acceptance_length == pytest.approx(1 + 1415 / 540)
    # acceptance rate = accepted/draft_tokens = 1415/1505 = 0.940199
    assert acceptance.acceptance_rate == pytest.approx(1415 / 1505)
    # mean proposed = draft_tokens/drafts = 1505/540 = 2.787037 (n-gram proposes fewer than k=3 at times)
    assert acceptance.mean_proposed_length == pytest.approx(1505 / 540)
    assert acceptance.drafts == 540
    # window = taken_at - created_s = 100 s (the builder scrapes 100 s after the counters were created)
    assert acceptance.window_s == pytest.approx(100.0)
    assert evidence.window_s == pytest.approx(100.0)
    # 540 drafts >= 200 needed
    assert evidence.state is DataState.OK
    assert evidence.speculation_on is True
    assert evidence.deployed_k == 3
    assert evidence.model == "tiny"
    assert evidence.target == TARGET
    assert "540 drafts" in evidence.reason
    assert "cold start" in evidence.reason


def test_cold_start_interval_is_the_wilson_interval_of_the_lifetime_counts() -> None:
    acceptance = run([make_snapshot()]).acceptance
    assert acceptance is not None
    # Position 0: Wilson(515, 540) ~ (0.93255, 0.96845) (worked out in test_intervals.py).
    assert acceptance.per_position_low[0] == pytest.approx(0.93255, abs=1e-5)
    assert acceptance.per_position_high[0] == pytest.approx(0.96845, abs=1e-5)
    for point, low, high in zip(
        acceptance.per_position, acceptance.per_position_low, acceptance.per_position_high, strict=True
    ):
        assert 0.0 <= low <= point <= high <= 1.0


def test_cold_start_rates_use_time_since_counters_were_created() -> None:
    # 1920 generated tokens over the 100 s since created_s = 19.2 tokens/s.
    evidence = run([make_snapshot()])
    assert evidence.generation_tokens_per_s == pytest.approx(19.2)


def test_cold_start_without_created_s_still_measures_acceptance_but_not_rates() -> None:
    evidence = run([make_snapshot(created_s=None)])
    assert evidence.acceptance is not None
    assert evidence.acceptance.per_position[0] == pytest.approx(515 / 540)
    assert evidence.acceptance.window_s == 0.0
    assert evidence.generation_tokens_per_s is None
    assert evidence.state is DataState.OK


# ----------------------------------------------------------------------------------------------------
# Windowed deltas and window expiry
# ----------------------------------------------------------------------------------------------------


def test_windowed_deltas_between_oldest_and_newest_snapshot() -> None:
    evidence = run(a_window())
    acceptance = evidence.acceptance
    assert acceptance is not None
    assert acceptance.cold_start is False
    # Δdrafts = 300; r = 250/300, 200/300, 150/300 = 0.8333, 0.6667, 0.5 (not the lifetime 515/540...)
    assert acceptance.per_position == pytest.approx((250 / 300, 200 / 300, 150 / 300))
    assert acceptance.drafts == 300
    # E[L] = 1 + 600/300 = 3.0; rate = 600/800 = 0.75; proposed = 800/300 = 2.6667
    assert acceptance.mean_acceptance_length == pytest.approx(3.0)
    assert acceptance.acceptance_rate == pytest.approx(0.75)
    assert acceptance.mean_proposed_length == pytest.approx(800 / 300)
    assert acceptance.window_s == pytest.approx(30.0)
    assert evidence.window_s == pytest.approx(30.0)
    assert evidence.state is DataState.OK
    assert "cold start" not in evidence.reason


def test_window_expiry_keeps_the_newest_snapshot_at_or_before_the_cutoff_as_base() -> None:
    # Scrapes every 20 s, 100 drafts each (per position 90, 80, 70; accepted 240; draft tokens 300).
    snapshots = [make_snapshot()]
    for _ in range(4):
        snapshots.append(
            advance(
                snapshots[-1],
                dt_s=20.0,
                drafts=100,
                draft_tokens=300,
                accepted=240,
                per_position=(90, 80, 70),
            )
        )
    state = feed(snapshots)
    # Newest at T0+80, cutoff T0+20: the snapshot at T0+20 is the base, T0 is dropped.
    assert [s.taken_at_s - T0 for s in state.snapshots] == [20.0, 40.0, 60.0, 80.0]
    acceptance = estimate(state, target=TARGET, config=CONFIG, now_s=T0 + 80).acceptance
    assert acceptance is not None
    # 3 intervals x 100 drafts = 300 drafts over 60 s; r0 = 270/300 = 0.9
    assert acceptance.drafts == 300
    assert acceptance.window_s == pytest.approx(60.0)
    assert acceptance.per_position[0] == pytest.approx(0.9)


def test_sparse_scrapes_keep_an_older_base_so_the_window_is_covered() -> None:
    # Scrapes at T0, T0+50, T0+100 with a 60 s window: cutoff T0+40; the newest snapshot at or before it is
    # T0, so T0 stays as the base and the deltas span 100 s rather than only 50 s.
    first = make_snapshot()
    second = advance(
        first, dt_s=50.0, drafts=150, draft_tokens=450, accepted=300, per_position=(120, 100, 80)
    )
    third = advance(
        second, dt_s=50.0, drafts=150, draft_tokens=450, accepted=300, per_position=(120, 100, 80)
    )
    state = feed([first, second, third])
    assert len(state.snapshots) == 3
    evidence = estimate(state, target=TARGET, config=CONFIG, now_s=third.taken_at_s)
    assert evidence.acceptance is not None
    assert evidence.acceptance.drafts == 300
    assert evidence.window_s == pytest.approx(100.0)


def test_batch_and_waiting_are_means_over_the_window_snapshots() -> None:
    first = make_snapshot(num_requests_running=2.0, num_requests_waiting=0.0)
    second = advance(first, dt_s=10.0, num_requests_running=4.0, num_requests_waiting=1.0)
    third = advance(second, dt_s=10.0, num_requests_running=6.0, num_requests_waiting=5.0)
    evidence = run([first, second, third])
    # batch = (2 + 4 + 6) / 3 = 4; waiting = (0 + 1 + 5) / 3 = 2
    assert evidence.batch == pytest.approx(4.0)
    assert evidence.waiting == pytest.approx(2.0)


def test_rates_are_counter_deltas_over_elapsed_time() -> None:
    first = make_snapshot(
        generation_tokens=1920.0, prompt_tokens=5000.0, estimated_flops=1e12, estimated_read_bytes=4e11
    )
    second = advance(
        first,
        dt_s=20.0,
        generation_tokens=2920.0,
        prompt_tokens=9000.0,
        estimated_flops=3e12,
        estimated_read_bytes=8e11,
    )
    evidence = run([first, second])
    # (2920 - 1920) / 20 = 50 tok/s; (9000 - 5000) / 20 = 200 tok/s;
    # (3e12 - 1e12) / 20 = 1e11 FLOP/s; (8e11 - 4e11) / 20 = 2e10 B/s
    assert evidence.generation_tokens_per_s == pytest.approx(50.0)
    assert evidence.prompt_tokens_per_s == pytest.approx(200.0)
    assert evidence.achieved_flops_per_s == pytest.approx(1e11)
    assert evidence.achieved_read_bytes_per_s == pytest.approx(2e10)


def test_rate_is_none_when_either_end_lacks_the_counter() -> None:
    first = make_snapshot(estimated_flops=None)
    second = advance(first, dt_s=20.0, estimated_flops=3e12)
    evidence = run([first, second])
    assert evidence.achieved_flops_per_s is None
    assert evidence.prompt_tokens_per_s is None  # absent at both ends


# ----------------------------------------------------------------------------------------------------
# Resets and new baselines
# ----------------------------------------------------------------------------------------------------


def test_counter_decrease_starts_a_new_baseline() -> None:
    before = make_snapshot()
    # Server restarted between scrapes (same created_s reported, e.g. a scraper that could not read it):
    # drafts fell 540 -> 250, so the window restarts at the new snapshot and uses its lifetime counters.
    restarted = make_snapshot(
        taken_at_s=T0 + 15.0,
        created_s=None,
        spec=make_spec(drafts=250, draft_tokens=700, accepted_tokens=450, per_position=(200, 150, 100)),
    )
    state = feed([before, restarted])
    assert state.snapshots == (restarted,)
    evidence = estimate(state, target=TARGET, config=CONFIG, now_s=T0 + 15.0)
    assert evidence.acceptance is not None
    assert evidence.acceptance.cold_start is True
    # r0 = 200/250 = 0.8, never a negative delta such as (250 - 540)
    assert evidence.acceptance.per_position[0] == pytest.approx(0.8)
    assert evidence.acceptance.drafts == 250


def test_decrease_of_a_non_speculative_counter_also_resets() -> None:
    before = make_snapshot(generation_tokens=1920.0)
    after = advance(before, dt_s=15.0, drafts=10, draft_tokens=30, accepted=20, per_position=(10, 6, 4))
    after = replace(after, generation_tokens=100.0)
    assert feed([before, after]).snapshots == (after,)


def test_created_s_change_starts_a_new_baseline_even_when_counters_grew() -> None:
    before = make_snapshot()
    # Every counter is higher than before, but the counters were re-created: the old baseline is meaningless.
    restarted = advance(
        before,
        dt_s=15.0,
        drafts=1000,
        draft_tokens=3000,
        accepted=2000,
        per_position=(900, 700, 400),
        created_s=FIXTURE_CREATED_S + 10.0,
    )
    state = feed([before, restarted])
    assert state.snapshots == (restarted,)
    acceptance = run([before, restarted]).acceptance
    assert acceptance is not None
    assert acceptance.cold_start is True
    # lifetime drafts = 540 + 1000 = 1540;
    # window = taken_at - new created_s = (T0 + 15) - (T0 - 100 + 10) = 105 s
    assert acceptance.drafts == 1540
    assert acceptance.window_s == pytest.approx(105.0)


def test_missing_created_s_on_one_side_is_not_a_restart() -> None:
    before = make_snapshot()
    after = advance(before, dt_s=15.0, drafts=10, draft_tokens=30, accepted=20, per_position=(10, 6, 4))
    after = replace(after, created_s=None)
    assert len(feed([before, after]).snapshots) == 2


def test_deployed_k_change_starts_a_new_baseline() -> None:
    k3 = make_snapshot()
    k5 = make_snapshot(
        taken_at_s=T0 + 15.0,
        spec=make_spec(
            drafts=600, draft_tokens=2500, accepted_tokens=1700, per_position=(550, 450, 350, 200, 150)
        ),
    )
    state = feed([k3, k5])
    assert state.snapshots == (k5,)
    evidence = estimate(state, target=TARGET, config=CONFIG, now_s=T0 + 15.0)
    assert evidence.deployed_k == 5
    assert evidence.acceptance is not None
    assert len(evidence.acceptance.per_position) == 5
    # r4 = 150/600 = 0.25
    assert evidence.acceptance.per_position[4] == pytest.approx(0.25)


def test_speculation_turned_off_reports_ok_without_acceptance() -> None:
    on = make_snapshot()
    off = make_snapshot(taken_at_s=T0 + 15.0, spec=None, num_requests_running=3.0)
    state = feed([on, off])
    assert state.snapshots == (off,)
    evidence = estimate(state, target=TARGET, config=CONFIG, now_s=T0 + 15.0)
    # Speculation off is not an error: OK, nothing measured, the decision layer handles it.
    assert evidence.state is DataState.OK
    assert evidence.speculation_on is False
    assert evidence.deployed_k == 0
    assert evidence.acceptance is None
    assert evidence.batch == pytest.approx(3.0)
    assert "speculation off" in evidence.reason


def test_speculation_turned_back_on_starts_a_new_baseline() -> None:
    off = make_snapshot(spec=None)
    on = make_snapshot(taken_at_s=T0 + 15.0)
    assert feed([off, on]).snapshots == (on,)


def test_model_or_engine_count_change_starts_a_new_baseline() -> None:
    first = make_snapshot()
    renamed = advance(first, dt_s=15.0, drafts=10, draft_tokens=30, accepted=20, per_position=(10, 6, 4))
    assert feed([first, replace(renamed, model_name="other")]).snapshots[0].model_name == "other"
    assert len(feed([first, replace(renamed, engines=2)]).snapshots) == 1


def test_duplicate_or_out_of_order_snapshot_is_ignored() -> None:
    first = make_snapshot()
    second = advance(first, dt_s=15.0, drafts=10, draft_tokens=30, accepted=20, per_position=(10, 6, 4))
    state = feed([first, second])
    older = replace(first, taken_at_s=T0 + 5.0)
    assert observe(state, older, CONFIG) == state
    assert observe(state, second, CONFIG) == state


def test_hand_built_state_spanning_a_reset_falls_back_to_the_newest_snapshot() -> None:
    # A state not built by observe(): the base has more drafts than the newest. No negative delta comes out.
    high = make_snapshot()
    low = make_snapshot(
        taken_at_s=T0 + 15.0,
        created_s=None,
        spec=make_spec(drafts=300, draft_tokens=900, accepted_tokens=600, per_position=(250, 200, 150)),
    )
    evidence = estimate(EstimatorState(snapshots=(high, low)), target=TARGET, config=CONFIG, now_s=T0 + 15.0)
    assert evidence.acceptance is not None
    assert evidence.acceptance.cold_start is True
    assert evidence.acceptance.drafts == 300


# ----------------------------------------------------------------------------------------------------
# Monotone repair and intervals
# ----------------------------------------------------------------------------------------------------


def test_non_monotone_per_position_is_pooled_to_the_mean_of_the_violators() -> None:
    # Window growth per position (250, 180, 200) of 300 drafts: position 2 exceeds position 1, impossible for
    # nested counters. Pool-adjacent-violators replaces the pair by its mean (180 + 200) / 2 = 190:
    # r = (250/300, 190/300, 190/300) = (0.8333, 0.6333, 0.6333).
    acceptance = run(a_window(p0=250, p1=180, p2=200, accepted=630)).acceptance
    assert acceptance is not None
    assert acceptance.per_position == pytest.approx((250 / 300, 190 / 300, 190 / 300))
    # The intervals follow the repaired counts, so they are monotone too.
    assert acceptance.per_position_low[1] == pytest.approx(acceptance.per_position_low[2])
    assert list(acceptance.per_position_high) == sorted(acceptance.per_position_high, reverse=True)


def test_pooling_cascades_when_the_pooled_mean_still_violates() -> None:
    # Growth (100, 120, 170) of 300 drafts: pool (100, 120) -> 110, still below 170 -> pool all three:
    # (100 + 120 + 170) / 3 = 130 at every position, r = 130/300 = 0.4333.
    acceptance = run(a_window(p0=100, p1=120, p2=170, accepted=390)).acceptance
    assert acceptance is not None
    assert acceptance.per_position == pytest.approx((130 / 300,) * 3)


def test_per_position_above_drafts_is_clipped_to_one() -> None:
    # 310 acceptances at position 0 out of 300 drafts (scrape skew): r0 = min(310, 300)/300 = 1.0.
    acceptance = run(a_window(p0=310)).acceptance
    assert acceptance is not None
    assert acceptance.per_position[0] == 1.0
    assert acceptance.per_position_high[0] == 1.0


def test_interval_contains_the_point_and_narrows_with_more_drafts() -> None:
    # Same proportions (r = 250/300 = 5/6 at position 0), ten times the drafts.
    small = run(a_window()).acceptance
    large = run(a_window(drafts=3000, draft_tokens=8000, accepted=6000, p0=2500, p1=2000, p2=1500)).acceptance
    assert small is not None
    assert large is not None
    assert small.per_position == pytest.approx(large.per_position)
    for acceptance in (small, large):
        for point, low, high in zip(
            acceptance.per_position, acceptance.per_position_low, acceptance.per_position_high, strict=True
        ):
            assert low < point < high
    for i in range(3):
        small_width = small.per_position_high[i] - small.per_position_low[i]
        large_width = large.per_position_high[i] - large.per_position_low[i]
        # Width scales ~ 1/sqrt(n): sqrt(10) = 3.16x narrower; allow slack for Wilson's shrinkage.
        assert large_width < small_width / 2.5


def test_interval_width_follows_the_configured_z() -> None:
    wide = run(a_window(), config=EstimatorConfig(z=2.576)).acceptance
    assert wide is not None
    assert (wide.per_position_low[0], wide.per_position_high[0]) == pytest.approx(
        wilson_interval(250, 300, z=2.576)
    )


# ----------------------------------------------------------------------------------------------------
# Insufficient data and staleness
# ----------------------------------------------------------------------------------------------------


def test_fewer_drafts_than_needed_is_insufficient_data_but_still_filled() -> None:
    # The window spans the full 60 s, so it stands on its own (a younger one would still be a cold start).
    base = make_snapshot(num_requests_running=2.0)
    later = advance(
        base,
        dt_s=60.0,
        drafts=150,
        draft_tokens=400,
        accepted=300,
        per_position=(120, 100, 80),
        num_requests_running=4.0,
    )
    evidence = run([base, later])
    assert evidence.state is DataState.INSUFFICIENT_DATA
    # 150 drafts < 200 needed; the reason names both numbers.
    assert "150" in evidence.reason
    assert "200" in evidence.reason
    # What is known is still there: r0 = 120/150 = 0.8, batch = (2 + 4) / 2 = 3.
    assert evidence.acceptance is not None
    assert evidence.acceptance.per_position[0] == pytest.approx(0.8)
    assert evidence.batch == pytest.approx(3.0)
    assert evidence.speculation_on is True


def test_idle_window_with_no_drafts_is_insufficient_data_without_acceptance() -> None:
    base = make_snapshot()
    idle = advance(base, dt_s=60.0)  # a full window without a draft
    evidence = run([base, idle])
    assert evidence.state is DataState.INSUFFICIENT_DATA
    assert evidence.acceptance is None
    assert "0 drafts" in evidence.reason


def test_min_drafts_is_configurable() -> None:
    # 300 drafts in the 30 s window: OK at the default 200, insufficient at 500 (with a 30 s window, so the
    # window is full and the lifetime's 840 drafts are not a cold-start fallback).
    assert run(a_window()).state is DataState.OK
    full = EstimatorConfig(min_drafts=500, window_s=30.0)
    assert run(a_window(), config=full).state is DataState.INSUFFICIENT_DATA


# ----------------------------------------------------------------------------------------------------
# The cold start lasts until the window stands on its own
# ----------------------------------------------------------------------------------------------------


def test_second_scrape_after_a_cold_start_stays_on_the_lifetime_counts() -> None:
    cold = make_snapshot(inter_token_latency=itl(2.0, 100.0))
    # 5 s later, 20 more drafts (per position 20, 18, 17; accepted 55; draft tokens 58): the window holds 20 < 200
    # drafts and spans 5 s < 60 s, so it is not yet evidence of its own.
    second = advance(cold, dt_s=5.0, drafts=20, draft_tokens=58, accepted=55, per_position=(20, 18, 17),
                     inter_token_latency=itl(3.0, 200.0))
    evidence = run([cold, second])
    acceptance = evidence.acceptance
    assert acceptance is not None
    assert evidence.state is DataState.OK
    assert acceptance.cold_start is True
    # Lifetime counts: drafts 540 + 20 = 560; r = (515 + 20, 465 + 18, 435 + 17) / 560 = (535, 483, 452) / 560.
    assert acceptance.drafts == 560
    assert acceptance.per_position == pytest.approx((535 / 560, 483 / 560, 452 / 560))
    # E[L] = 1 + (1415 + 55) / 560; over the 105 s since created_s (100 s + 5 s).
    assert acceptance.mean_acceptance_length == pytest.approx(1 + 1470 / 560)
    assert acceptance.window_s == pytest.approx(105.0)
    assert "cold start" in evidence.reason and "560 drafts" in evidence.reason
    # What needs no minimum count stays windowed: 200 - 100 ITL samples summing to 3.0 - 2.0 s in the 5 s
    # window -> 10 ms steps (the lifetime mean would be 3.0 / 200 = 15 ms).
    assert evidence.step_time_s == pytest.approx(1.0 / 100)
    assert evidence.window_s == pytest.approx(5.0)


def test_the_cold_start_ends_when_the_window_spans_window_s() -> None:
    # Scrapes every 5 s after the cold one, 10 drafts each (per position 8, 5, 2).
    snapshots = [make_snapshot()]
    for _ in range(12):
        snapshots.append(advance(snapshots[-1], dt_s=5.0, drafts=10, draft_tokens=30, accepted=15,
                                 per_position=(8, 5, 2)))
    # At 55 s the window holds 11 x 10 = 110 < 200 drafts and is younger than 60 s: lifetime counts,
    # 540 + 110 = 650 drafts, OK.
    at_55 = run(snapshots[:12])
    assert at_55.acceptance is not None and at_55.acceptance.cold_start is True
    assert at_55.acceptance.drafts == 650 and at_55.state is DataState.OK
    # At 60 s the window spans window_s and is judged on its own: 12 x 10 = 120 < 200 drafts -> insufficient.
    at_60 = run(snapshots)
    assert at_60.acceptance is not None and at_60.acceptance.cold_start is False
    assert at_60.acceptance.drafts == 120
    assert at_60.acceptance.per_position[0] == pytest.approx(8 / 10)  # 12 x 8 / 120
    assert at_60.state is DataState.INSUFFICIENT_DATA


def test_a_thin_lifetime_is_still_insufficient_data_flagged_cold_start() -> None:
    # A server restarted 10 s before the first scrape: 50 drafts lifetime, then 10 more 5 s later.
    cold = make_snapshot(
        taken_at_s=FIXTURE_CREATED_S + 10.0,
        spec=make_spec(drafts=50, draft_tokens=150, accepted_tokens=90, per_position=(40, 30, 20)),
    )
    second = advance(cold, dt_s=5.0, drafts=10, draft_tokens=30, accepted=18, per_position=(8, 6, 4))
    evidence = run([cold, second])
    assert evidence.state is DataState.INSUFFICIENT_DATA
    assert evidence.acceptance is not None and evidence.acceptance.cold_start is True
    # 50 + 10 = 60 lifetime drafts < 200, named with the 15 s since created_s.
    assert "60 drafts in 15s, need 200" in evidence.reason


def test_no_snapshot_is_stale() -> None:
    evidence = estimate(EstimatorState(), target=TARGET, config=CONFIG, now_s=T0)
    assert evidence.state is DataState.STALE
    assert evidence.acceptance is None
    assert evidence.at_s == T0
    assert "no snapshot" in evidence.reason


def test_old_newest_snapshot_is_stale_and_names_its_age() -> None:
    # Newest scrape at T0 + 30, judged at T0 + 75: 45 s old > 30 s allowed.
    evidence = run(a_window(), now_s=T0 + 75.0)
    assert evidence.state is DataState.STALE
    assert "45s" in evidence.reason
    # The last measurement is still reported for display.
    assert evidence.acceptance is not None


def test_snapshot_exactly_at_the_stale_limit_is_not_stale() -> None:
    # 30 s old with stale_after_s = 30: the limit itself is still fresh.
    assert run(a_window(), now_s=T0 + 60.0).state is DataState.OK


def test_stale_outranks_insufficient_data() -> None:
    evidence = run(
        [
            make_snapshot(
                spec=make_spec(drafts=10, draft_tokens=30, accepted_tokens=6, per_position=(3, 2, 1))
            )
        ],
        now_s=T0 + 100.0,
    )
    assert evidence.state is DataState.STALE


# ----------------------------------------------------------------------------------------------------
# Step time and context
# ----------------------------------------------------------------------------------------------------


def test_step_time_is_the_mean_of_the_itl_histogram_over_the_window() -> None:
    first = make_snapshot(inter_token_latency=itl(10.0, 500.0))
    second = advance(first, dt_s=20.0, inter_token_latency=itl(12.5, 600.0))
    evidence = run([first, second])
    # Δsum / Δcount = (12.5 - 10.0) / (600 - 500) = 2.5 / 100 = 0.025 s per step
    assert evidence.step_time_s == pytest.approx(0.025)
    assert evidence.step_samples == pytest.approx(100.0)


def test_step_time_is_none_without_new_itl_samples() -> None:
    first = make_snapshot(inter_token_latency=itl(10.0, 500.0))
    second = advance(first, dt_s=20.0)
    evidence = run([first, second])
    assert evidence.step_time_s is None
    assert evidence.step_samples == 0.0


def test_step_time_is_none_without_the_histogram() -> None:
    evidence = run(a_window())
    assert evidence.step_time_s is None


def test_cold_start_step_time_uses_the_lifetime_histogram() -> None:
    # 10.0 s over 500 samples = 0.02 s per step
    evidence = run([make_snapshot(inter_token_latency=itl(10.0, 500.0))])
    assert evidence.step_time_s == pytest.approx(0.02)


def test_context_per_sequence_from_kv_usage_capacity_and_running() -> None:
    snapshot = make_snapshot(
        kv_cache_usage_ratio=0.25, kv_cache_capacity_tokens=32768.0, num_requests_running=4.0
    )
    evidence = run([snapshot])
    # 0.25 x 32768 tokens / 4 running = 2048 tokens per sequence
    assert evidence.context_tokens_per_seq == pytest.approx(2048.0)
    assert evidence.kv_cache_usage_ratio == pytest.approx(0.25)


def test_context_uses_the_newest_snapshot_not_the_window_mean() -> None:
    first = make_snapshot(
        kv_cache_usage_ratio=0.1, kv_cache_capacity_tokens=10000.0, num_requests_running=1.0
    )
    second = advance(first, dt_s=20.0, kv_cache_usage_ratio=0.5, num_requests_running=5.0)
    evidence = run([first, second])
    # newest: 0.5 x 10000 / 5 = 1000 (the window-mean batch (1 + 5) / 2 = 3 would give 1666.7)
    assert evidence.context_tokens_per_seq == pytest.approx(1000.0)


@pytest.mark.parametrize(
    ("usage", "capacity", "running"), [(None, 32768.0, 4.0), (0.25, None, 4.0), (0.25, 32768.0, 0.0)]
)
def test_context_is_none_when_an_input_is_missing_or_nothing_runs(
    usage: float | None, capacity: float | None, running: float
) -> None:
    snapshot = make_snapshot(
        kv_cache_usage_ratio=usage, kv_cache_capacity_tokens=capacity, num_requests_running=running
    )
    assert run([snapshot]).context_tokens_per_seq is None


# ----------------------------------------------------------------------------------------------------
# Pass-through, config validation, invariants
# ----------------------------------------------------------------------------------------------------


def test_gpu_snapshot_and_time_are_passed_through() -> None:
    gpu = GpuSnapshot(taken_at_s=T0, source="absent")
    evidence = estimate(feed([make_snapshot()]), target=TARGET, config=CONFIG, now_s=T0 + 1.0, gpu=gpu)
    assert evidence.gpu is gpu
    assert evidence.at_s == T0 + 1.0


@pytest.mark.parametrize(
    "overrides",
    [{"window_s": 0.0}, {"min_drafts": -1}, {"z": 0.0}, {"stale_after_s": -5.0}],
)
def test_invalid_config_is_rejected(overrides: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        EstimatorConfig(**overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(25))
def test_random_scrape_sequences_keep_the_invariants(seed: int) -> None:
    """Property test (hypothesis is not installed): random growth, skew, restarts, k changes, spec off.

    Whatever happens: deltas are never negative, r is in [0, 1] and non-increasing, each interval contains its
    point, E[L] is in [1, k+1] and the kept window never spans a counter decrease.
    """
    rng = random.Random(seed)
    snapshot = make_snapshot()
    state = observe(EstimatorState(), snapshot, CONFIG)
    for _ in range(40):
        snapshot = _random_next_scrape(rng, snapshot)
        state = observe(state, snapshot, CONFIG)
        for older, newer in zip(state.snapshots, state.snapshots[1:], strict=False):
            if older.spec is not None and newer.spec is not None:
                assert newer.spec.drafts >= older.spec.drafts
        _assert_acceptance_invariants(estimate(state, target=TARGET, config=CONFIG, now_s=snapshot.taken_at_s))


def _random_next_scrape(rng: random.Random, snapshot: EngineSnapshot) -> EngineSnapshot:
    """The scrape after `snapshot`: speculation off (5%); a restart with a new k from 1..6 (5%, and always after
    speculation was off); else counters grown by up to 100 drafts, nested per position but for an occasional skew
    (a later position growing more than an earlier one)."""
    roll = rng.random()
    if roll < 0.05:
        return make_snapshot(taken_at_s=snapshot.taken_at_s + 5, spec=None)
    if roll < 0.1 or snapshot.spec is None:
        k = rng.randint(1, 6)
        per_position = tuple(sorted((float(rng.randint(0, 50)) for _ in range(k)), reverse=True))
        return make_snapshot(
            taken_at_s=snapshot.taken_at_s + 5,
            created_s=snapshot.taken_at_s + rng.random(),
            spec=make_spec(
                drafts=50.0,
                draft_tokens=50.0 * k,
                accepted_tokens=sum(per_position),
                per_position=per_position,
            ),
        )
    k = snapshot.spec.deployed_k
    drafts = float(rng.randint(0, 100))
    growth = sorted((rng.uniform(0, drafts) for _ in range(k)), reverse=True)
    if rng.random() < 0.3 and k > 1:
        growth[-1], growth[0] = growth[0], growth[-1]
    return advance(
        snapshot,
        dt_s=rng.uniform(1, 30),
        drafts=drafts,
        draft_tokens=drafts * k,
        accepted=sum(growth),
        per_position=tuple(growth),
    )


def _assert_acceptance_invariants(evidence: Evidence) -> None:
    """Counts non-negative, r non-increasing, each interval around its point in [0, 1], E[L] in [1, k + 1]."""
    acceptance = evidence.acceptance
    if acceptance is None:
        return
    assert acceptance.drafts > 0
    assert acceptance.draft_tokens >= 0
    assert acceptance.accepted_tokens >= 0
    r = list(acceptance.per_position)
    assert r == sorted(r, reverse=True)
    for point, low, high in zip(r, acceptance.per_position_low, acceptance.per_position_high, strict=True):
        assert 0.0 <= low <= point <= high <= 1.0
    assert 1.0 <= acceptance.mean_acceptance_length <= 1.0 + evidence.deployed_k + 1e-9
    assert 0.0 <= acceptance.acceptance_rate <= 1.0


def test_prefill_tokens_per_step_from_the_iteration_histogram() -> None:
    first = make_snapshot(prompt_tokens=5000.0, iteration_tokens=itl(1e5, 1000.0), inter_token_latency=itl(10.0, 500.0))
    second = advance(
        first, dt_s=20.0, prompt_tokens=9000.0, iteration_tokens=itl(1.2e5, 1400.0),
        inter_token_latency=itl(12.5, 600.0),
    )
    # 4000 prompt tokens over 400 engine steps (the iteration histogram's Δcount) = 10 per step.
    assert run([first, second]).prefill_tokens_per_step == pytest.approx(10.0)
    # Without the iteration histogram: prompt tokens/s x step time = 200 x 0.025 = 5 per step.
    no_iterations = advance(replace(first, iteration_tokens=None), dt_s=20.0, prompt_tokens=9000.0,
                            inter_token_latency=itl(12.5, 600.0))
    assert run([replace(first, iteration_tokens=None), no_iterations]).prefill_tokens_per_step == pytest.approx(5.0)
    assert run([make_snapshot(), advance(make_snapshot(), dt_s=20.0)]).prefill_tokens_per_step is None
