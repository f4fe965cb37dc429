"""A target's measured profile in the loop: it anchors the calibration, and a profile of another deployment or past
its age limit puts the target in the error state with the reason (never a silent answer from stale data)."""

from __future__ import annotations

from test_loop import (
    CONFIG,
    FIRST,
    T0,
    FakeGpu,
    FakeScraper,
    StepTimer,
    context,
    fixed_context,
    run,
)

from policies.model.measured_profile import MeasuredProfile, ProfileIdentity, ProfilePoint
from policies.types import DataState
from service.board import Board
from service.http.whatif import _live_schedule, live_targets_from_board
from service.loop import AdvisorLoop, LoadedProfile, LoopWiring, TargetSpec

DAY_S = 86400.0
MAX_AGE_S = 30 * DAY_S


def _point(batch: float, q: float, step_ms: float) -> ProfilePoint:
    passes = 0 if q == 1.0 else 3
    return ProfilePoint(
        concurrency=round(batch), deployed_k=passes, batch=batch, tokens_per_seq=q, draft_passes=passes,
        context_tokens=600.0, prefill_tokens=20.0, step_s=step_ms / 1000.0, step_samples=2000.0,
    )


# llama-3.1-8b on one H100 with n-gram drafting (what test_loop's fixed_context resolves): plain and k=3 steps.
POINTS = (_point(1, 1.0, 7.1), _point(8, 1.0, 7.6), _point(1, 4.0, 7.9), _point(8, 4.0, 9.8))


def _profile(*, hardware: str = "h100-sxm", created_at_s: float = T0 - DAY_S) -> LoadedProfile:
    identity = ProfileIdentity(hardware, "llama-3.1-8b", 1, "ngram", engine_version="0.32.0")
    profile = MeasuredProfile(identity, created_at_s, POINTS)
    return LoadedProfile(source="/etc/spec-advisor/profile.json", profile=profile)


def _loop(profile: LoadedProfile, scraper: FakeScraper) -> tuple[AdvisorLoop, Board]:
    board = Board((("a", None),), started_at_s=T0)
    spec = TargetSpec(
        name="a", model=None, scraper=scraper, resolve_context=fixed_context, profile=profile,
        profile_max_age_s=MAX_AGE_S,
    )
    loop = AdvisorLoop(
        [spec], wiring=LoopWiring(gpu=FakeGpu(), board=board, timer=StepTimer()), config=CONFIG,
    )
    return loop, board


def test_a_matching_profile_calibrates_from_the_first_tick() -> None:
    loop, board = _loop(_profile(), FakeScraper(FIRST))
    run(loop.run_once(T0))
    status = board.get("a")
    assert status is not None and status.evidence is not None
    assert status.evidence.state != DataState.ERROR
    # The cold-start scrape has no step time of its own: the fit rests on the profile's four levels.
    assert status.calibration is not None and status.calibration.points == len(POINTS)
    assert status.calibration.error_ratio is not None and status.calibration.error_ratio < 0.15


def test_a_profile_of_another_gpu_puts_the_target_in_error_naming_it() -> None:
    loop, board = _loop(_profile(hardware="cpu"), FakeScraper(FIRST))
    run(loop.run_once(T0))
    status = board.get("a")
    assert status is not None and status.evidence is not None and status.decision is not None
    assert status.evidence.state == DataState.ERROR
    assert "profile /etc/spec-advisor/profile.json" in status.evidence.reason
    assert "hardware 'cpu', but the target uses 'h100-sxm'" in status.evidence.reason
    assert status.decision.state == DataState.ERROR


def test_a_profile_past_its_age_limit_puts_the_target_in_error_until_measured_again() -> None:
    loop, board = _loop(_profile(created_at_s=T0 - 40 * DAY_S), FakeScraper(FIRST))
    run(loop.run_once(T0))
    status = board.get("a")
    assert status is not None and status.evidence is not None
    assert status.evidence.state == DataState.ERROR
    assert "40.0 days old, past the 30.0-day limit" in status.evidence.reason


def test_a_profile_ages_out_while_the_sidecar_runs() -> None:
    loop, board = _loop(_profile(created_at_s=T0 - 29.99 * DAY_S), FakeScraper(FIRST, FIRST))
    run(loop.run_once(T0))
    status = board.get("a")
    assert status is not None and status.evidence is not None and status.evidence.state != DataState.ERROR
    run(loop.run_once(T0 + DAY_S))
    status = board.get("a")
    assert status is not None and status.evidence is not None
    assert status.evidence.state == DataState.ERROR and "days old" in status.evidence.reason


def test_the_schedule_endpoint_plans_nothing_from_a_target_whose_profile_aged_out() -> None:
    loop, board = _loop(_profile(created_at_s=T0 - 40 * DAY_S), FakeScraper(FIRST))
    run(loop.run_once(T0))
    # The loop's resolved profiles are still at hand (what /v1/schedule prices with): they must not be used.
    [target] = live_targets_from_board(board, context_for=lambda _name: context())()
    schedule = _live_schedule(target, max_num_seqs=64, context_tokens=None, margin=0.05, gamma_max=4)
    assert schedule.state == DataState.ERROR and "days old" in schedule.reason
    assert schedule.bands == [] and schedule.vllm is None and schedule.speculation_useful is None
