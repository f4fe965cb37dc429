"""The profile plan (service/profile.py) against an engine whose counters follow a known step time.

The fake engine runs `c` sequences per step while `c` clients drive it, each step taking 5 ms + 1 ms per token
verified (c x q), and exposes the counters vLLM would: ITL and iteration-token histograms, generation and prompt
tokens, the running gauge, and the speculative counters when k > 0. The test clock moves only when the plan sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from policies.model.costmodel import ModelContext
from policies.model.measured_profile import ProfileError, ProfileIdentity
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.types import DraftMethod, EngineSnapshot, HistogramReading, SpecDecodeCounters
from service.profile import (
    IDLE_CHECK_S,
    LevelLoad,
    LevelReport,
    ProfileOutcome,
    ProfilePlan,
    ProfileRefusedError,
    Timebase,
    load_context_tokens,
    parse_levels,
    progress_line,
    read_profile,
    run_profile,
)
from service.sources.errors import ScrapeError, ScrapeErrorReason

IDENTITY = ProfileIdentity("cpu", "tiny-llama", 1, "ngram", engine_version="0.32.0", served_model="tiny")


def _ctx() -> ModelContext:
    model = model_by_name("tiny-llama")
    return ModelContext(hardware=hardware_by_name("cpu"), model=model, drafter=drafter_for(DraftMethod.NGRAM, model))


def true_step_s(batch: float, tokens_per_seq: float) -> float:
    return 0.005 + 0.001 * batch * tokens_per_seq


@dataclass
class _Counters:
    steps: float = 0.0
    itl_count: float = 0.0
    itl_sum: float = 0.0
    generated: float = 0.0
    prompts: float = 0.0
    drafts: float = 0.0


class FakeEngine:
    def __init__(
        self, *, k: int = 3, background: int = 0, die_at_level: int | None = None, matches: bool = True
    ) -> None:
        self.now = 1_000.0
        self.k = k
        self.matches = matches  # False: speculation on, but the drafter never proposes (n-gram without matches)
        self.loads_cancelled = 0
        self.background = background  # clients of someone else, always running
        self.active = 0
        self.levels_started = 0
        self.die_at_level = die_at_level
        self.restart_at_scrape: int | None = None
        self.scrapes = 0
        self.created_s = 0.0
        self.counters = _Counters()
        self._last = self.now

    async def sleep(self, seconds: float) -> None:
        # Yield first, so a load task created just before starts at the time it was created, then move the clock.
        for _ in range(5):
            await asyncio.sleep(0)
        self.now += seconds
        for _ in range(5):
            await asyncio.sleep(0)

    def clock(self) -> float:
        return self.now

    def _advance(self) -> None:
        batch = self.active + self.background
        elapsed, self._last = self.now - self._last, self.now
        if batch <= 0:
            return
        drafting = self.k > 0 and self.matches
        q = 1.0 + self.k * 0.9 if drafting else 1.0
        step = true_step_s(batch, q)
        steps = elapsed / step
        c = self.counters
        c.steps += steps
        c.itl_count += steps * batch
        c.itl_sum += steps * batch * step
        c.generated += steps * batch * (q * 0.8 if drafting else 1.0)
        c.prompts += steps * 10.0
        c.drafts += steps * batch if drafting else 0.0

    async def scrape(self, now_s: float) -> EngineSnapshot:
        self._advance()
        self.scrapes += 1
        if self.scrapes == self.restart_at_scrape:
            self.created_s = self.now - 1.0  # the server restarted a second ago: its counters start again
            self.counters = _Counters()
        if self.die_at_level is not None and self.levels_started > self.die_at_level:
            raise ScrapeError(ScrapeErrorReason.CONNECT, "http://127.0.0.1:1/metrics: connection refused")
        c = self.counters
        spec = None
        if self.k:
            spec = SpecDecodeCounters(
                drafts=c.drafts, draft_tokens=c.drafts * self.k * 0.9, accepted_tokens=c.drafts * 2.0,
                accepted_per_position=(c.drafts * 0.9, c.drafts * 0.7, c.drafts * 0.4),
            )
        running = float(self.active + self.background)
        return EngineSnapshot(
            taken_at_s=now_s, model_name="tiny", engines=1, spec=spec, num_requests_running=running,
            num_requests_waiting=0.0, created_s=self.created_s, kv_cache_usage_ratio=running * 200 / 10_000,
            kv_cache_capacity_tokens=10_000.0, generation_tokens=c.generated, prompt_tokens=c.prompts,
            inter_token_latency=HistogramReading(sum=c.itl_sum, count=c.itl_count),
            iteration_tokens=HistogramReading(sum=c.generated, count=c.steps),
        )

    async def drive(self, concurrency: int, duration_s: float) -> LevelLoad:
        self._advance()
        self.levels_started += 1
        self.active = concurrency
        end = self.now + duration_s
        try:
            while self.now < end:
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.loads_cancelled += 1
            self.active = 0
            raise
        self._advance()
        self.active = 0
        return LevelLoad(requests=concurrency * 10, errors=0, completion_tokens=concurrency * 1280)


def _run(engine: FakeEngine, plan: ProfilePlan) -> object:
    return asyncio.run(run_profile(plan, engine, _ctx(), IDENTITY, timebase=Timebase(engine.clock, engine.sleep)))


def test_each_level_records_the_step_at_the_batch_it_verified() -> None:
    engine = FakeEngine(k=3)
    plan = ProfilePlan(levels=(1, 4, 16), level_s=20.0, warmup_s=5.0)
    outcome = asyncio.run(run_profile(plan, engine, _ctx(), IDENTITY, timebase=Timebase(engine.clock, engine.sleep)))
    assert outcome.stopped is None
    assert outcome.profile is not None and outcome.profile.complete
    points = outcome.profile.points
    assert [p.concurrency for p in points] == [1, 4, 16]
    for point, clients in zip(points, (1, 4, 16), strict=True):
        assert point.batch == pytest.approx(clients, rel=1e-6)
        assert point.tokens_per_seq == pytest.approx(1.0 + 3 * 0.9, rel=1e-6)
        assert point.draft_passes == 3 and point.deployed_k == 3
        assert point.step_s == pytest.approx(true_step_s(clients, 3.7), rel=1e-6)
        assert point.mean_accepted_length == pytest.approx(3.0, rel=1e-6)
        assert point.prefill_tokens == pytest.approx(10.0, rel=1e-6)
        assert point.context_tokens == pytest.approx(200.0, rel=1e-6)
    assert outcome.profile.identity == IDENTITY


def test_plain_server_records_plain_steps() -> None:
    engine = FakeEngine(k=0)
    outcome = _run(engine, ProfilePlan(levels=(2, 8), level_s=10.0, warmup_s=2.0))
    profile = outcome.profile  # type: ignore[attr-defined]
    assert [(p.tokens_per_seq, p.draft_passes) for p in profile.points] == [(1.0, 0), (1.0, 0)]
    assert profile.points[1].step_s == pytest.approx(true_step_s(8, 1.0), rel=1e-6)
    assert profile.points[1].mean_accepted_length is None


def test_a_server_serving_traffic_is_refused_before_any_load() -> None:
    engine = FakeEngine(background=3)
    with pytest.raises(ProfileRefusedError, match=r"serving traffic \(3 running.*--force"):
        _run(engine, ProfilePlan(levels=(1, 2), level_s=10.0, warmup_s=0.0))
    assert engine.levels_started == 0


def test_tokens_generated_between_the_idle_checks_are_traffic_too() -> None:
    engine = FakeEngine()

    async def generating_sleep(seconds: float) -> None:
        engine.counters.generated += 50.0  # someone's requests came and went between the two scrapes
        await engine.sleep(seconds)

    plan = ProfilePlan(levels=(1,), level_s=10.0, warmup_s=0.0)
    with pytest.raises(ProfileRefusedError, match=f"50 tokens generated in {IDLE_CHECK_S:g} s"):
        asyncio.run(run_profile(plan, engine, _ctx(), IDENTITY, timebase=Timebase(engine.clock, generating_sleep)))


def test_force_loads_a_busy_server() -> None:
    engine = FakeEngine(background=2)
    outcome = _run(engine, ProfilePlan(levels=(2,), level_s=10.0, warmup_s=1.0, force=True))
    assert outcome.profile.points[0].batch == pytest.approx(4.0)  # type: ignore[attr-defined]


def test_a_server_that_dies_mid_plan_leaves_an_incomplete_profile_of_the_levels_measured() -> None:
    engine = FakeEngine(die_at_level=2)
    outcome = _run(engine, ProfilePlan(levels=(1, 2, 4, 8), level_s=10.0, warmup_s=1.0))
    assert outcome.stopped is not None and "stopped answering at 4 clients" in outcome.stopped  # type: ignore[attr-defined]
    assert outcome.profile is not None and not outcome.profile.complete  # type: ignore[attr-defined]
    assert [p.concurrency for p in outcome.profile.points] == [1, 2]  # type: ignore[attr-defined]


def test_a_restart_mid_level_stops_the_plan() -> None:
    engine = FakeEngine()
    engine.restart_at_scrape = 6  # 2 idle checks, 2 per level: the second level's second scrape
    outcome = _run(engine, ProfilePlan(levels=(1, 2), level_s=10.0, warmup_s=0.0))
    assert "restarted" in (outcome.stopped or "")  # type: ignore[attr-defined]
    assert [p.concurrency for p in outcome.profile.points] == [1]  # type: ignore[attr-defined]


def test_a_level_too_short_for_the_calibration_is_skipped_with_the_reason() -> None:
    engine = FakeEngine()
    lines: list[str] = []
    plan = ProfilePlan(levels=(1, 8), level_s=1.0, warmup_s=0.0)
    outcome = asyncio.run(run_profile(
        plan, engine, _ctx(), IDENTITY, timebase=Timebase(engine.clock, engine.sleep),
        on_level=lambda report: lines.append(progress_line(report, total=2)),
    ))
    # 1 client for 1 s: ~115 ITL samples (steps of ~8.7 ms). 8 clients: 231 samples, but 8 per step, so 29 steps.
    assert outcome.levels[0].point is None
    assert "only 115 inter-token samples (need 200); lengthen --level-s" in (outcome.levels[0].skipped or "")
    assert outcome.levels[1].point is None
    assert "only 29 engine steps (231 inter-token samples at batch 8.0; need 200)" in (outcome.levels[1].skipped or "")
    assert outcome.profile is None
    assert lines[0].startswith("[1/2] 1 clients: skipped") and lines[1].startswith("[2/2] 8 clients: skipped")


def test_a_level_with_speculation_on_but_no_drafts_is_skipped_not_written() -> None:
    engine = FakeEngine(matches=False)
    outcome = _run(engine, ProfilePlan(levels=(4,), level_s=20.0, warmup_s=2.0))
    assert isinstance(outcome, ProfileOutcome)
    [level] = outcome.levels
    assert level.point is None and "no drafts were proposed" in (level.skipped or "")
    assert outcome.profile is None


@pytest.mark.parametrize(
    ("levels", "level_s", "warmup_s", "message"),
    [
        ((), 10.0, 0.0, "1..16 concurrency levels"),
        ((1, 513), 10.0, 0.0, "1..512"),
        ((1,), 0.5, 0.0, "level 1..600"),
        ((1,), 10.0, 601.0, "warm-up 0..600"),
    ],
)
def test_plans_out_of_bounds_are_refused(
    levels: tuple[int, ...], level_s: float, warmup_s: float, message: str
) -> None:
    with pytest.raises(ProfileRefusedError, match=message):
        ProfilePlan(levels=levels, level_s=level_s, warmup_s=warmup_s)


def test_levels_parse_ascending_and_distinct() -> None:
    assert parse_levels("1, 2,4,64") == (1, 2, 4, 64)
    for bad in ("4,2", "1,1", "a,b", ""):
        with pytest.raises(ValueError, match="concurrency levels"):
            parse_levels(bad)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe not utf-8", "is not JSON"),
        (b'{"format": "spec-advisor-profile/1", "created_at_s": ' + b"9" * 5000 + b"}", "is not JSON"),
        (b'{"format": "spec-advisor-profile/1", "created_at_s": ' + b"9" * 400 + b"}", "created_at_s: a finite"),
    ],
    ids=["not-utf8", "endless-integer", "integer-past-float"],
)
def test_an_unreadable_profile_file_is_a_profile_error_naming_it(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "profile.json"
    path.write_bytes(content)
    with pytest.raises(ProfileError, match=message) as raised:
        read_profile(path)
    assert str(path) in str(raised.value)


def test_the_context_of_an_engine_without_kv_capacity_comes_from_what_the_level_sent() -> None:
    # 100 requests of 64 completion tokens; the engine counted 3000 prompt tokens per 6400 generated: 30-token
    # prompts, so a decoding sequence holds 30 + 64 / 2 = 62 tokens on average.
    before = asyncio.run(FakeEngine().scrape(0.0))
    after = dataclasses.replace(
        before, generation_tokens=(before.generation_tokens or 0.0) + 6400.0,
        prompt_tokens=(before.prompt_tokens or 0.0) + 3000.0,
    )
    load = LevelLoad(requests=100, errors=0, completion_tokens=6400)
    assert load_context_tokens(before, after, load) == pytest.approx(62.0)
    assert load_context_tokens(before, before, load) is None  # nothing generated in the span
    assert load_context_tokens(before, after, LevelLoad(requests=0, errors=0, completion_tokens=0)) is None


def test_ctrl_c_keeps_the_levels_measured_before_it() -> None:
    # The main task is cancelled (what asyncio.run does on SIGINT) while the second level runs: its load stops,
    # and the first level comes back as an incomplete profile saying it was interrupted.
    engine = FakeEngine()
    plan = ProfilePlan(levels=(1, 4, 16), level_s=20.0, warmup_s=2.0)

    async def main() -> ProfileOutcome:
        task = asyncio.current_task()
        assert task is not None

        def ctrl_c_after_the_first(report: LevelReport) -> None:
            if report.index == 0:
                task.cancel()

        outcome = await run_profile(
            plan, engine, _ctx(), IDENTITY, timebase=Timebase(engine.clock, engine.sleep),
            on_level=ctrl_c_after_the_first,
        )
        assert engine.loads_cancelled == 1  # the interrupted level's clients were stopped before it returned
        return outcome

    outcome = asyncio.run(main())
    assert outcome.stopped == "interrupted at 4 clients"
    assert outcome.profile is not None and outcome.profile.complete is False
    assert [p.concurrency for p in outcome.profile.points] == [1]
