"""AdvisorLoop.run_once driven with an injected time and fake sources (no network, no wall clock)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from estimate_builders import FIXTURE_TAKEN_AT_S, advance, itl, make_snapshot, make_spec

from policies.advise import AdvisorConfig
from policies.decide.rule import DecideConfig
from policies.estimate.window import EstimatorConfig
from policies.model.costmodel import ModelContext
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.types import DataState, DraftMethod, EngineSnapshot, GpuSnapshot
from service.board import INTERNAL_ERROR_REASON, Board
from service.loop import (
    AdvisorLoop,
    ContextUnavailableError,
    LoopConfig,
    LoopWiring,
    TargetSpec,
)
from service.sources.errors import ScrapeError, ScrapeErrorReason

T0 = FIXTURE_TAKEN_AT_S
INTERVAL_S = 5.0
ESTIMATOR = EstimatorConfig(window_s=60.0, min_drafts=200, z=1.96, stale_after_s=30.0)
DECIDE = DecideConfig(margin=0.05, dwell_s=120.0, gamma_max=8)
CONFIG = LoopConfig(estimator=ESTIMATOR, interval_s=INTERVAL_S, advisor=AdvisorConfig(decide=DECIDE))

Outcome = dict[str, EngineSnapshot] | Exception


class FakeScraper:
    """Answers each scrape with the next scripted outcome (a snapshot dict, or an exception to raise)."""

    def __init__(self, *outcomes: Outcome) -> None:
        self._outcomes: Iterator[Outcome] = iter(outcomes)
        self.calls: list[float] = []

    async def scrape(self, now_s: float) -> dict[str, EngineSnapshot]:
        self.calls.append(now_s)
        outcome = next(self._outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return {name: replace(snap, taken_at_s=now_s) for name, snap in outcome.items()}


class FakeGpu:
    def __init__(self) -> None:
        self.reads: list[float] = []

    async def read(self, now_s: float) -> GpuSnapshot:
        self.reads.append(now_s)
        return GpuSnapshot(taken_at_s=now_s, source="absent")


class StepTimer:
    """A monotonic timer that advances 1 ms per read, so every step has a known, non-zero duration."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def context(model_name: str = "llama-3.1-8b") -> ModelContext:
    model = model_by_name(model_name)
    return ModelContext(
        hardware=hardware_by_name("h100-sxm"), model=model, drafter=drafter_for(DraftMethod.NGRAM, model)
    )


def fixed_context(_model: str, _gpu: GpuSnapshot) -> ModelContext:
    return context()


def no_context(model: str, _gpu: GpuSnapshot) -> ModelContext:
    raise ContextUnavailableError(f"model '{model}' is not in the catalog")


def make_loop(
    *targets: tuple[str, FakeScraper],
    gpu: FakeGpu | None = None,
    resolve: Callable[[str, GpuSnapshot], ModelContext] = fixed_context,
    model: str | None = None,
) -> tuple[AdvisorLoop, Board]:
    board = Board(((name, model) for name, _ in targets), started_at_s=T0)
    loop = AdvisorLoop(
        [TargetSpec(name=name, model=model, scraper=scraper, resolve_context=resolve) for name, scraper in targets],
        wiring=LoopWiring(gpu=gpu or FakeGpu(), board=board, timer=StepTimer()),
        config=CONFIG,
    )
    return loop, board


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


FIRST = {"tiny": make_snapshot()}
# 400 new drafts (>= min_drafts 200) with 600 accepted tokens, 280 + 200 + 120 = 600 across the positions.
SECOND = {"tiny": advance(make_snapshot(), dt_s=INTERVAL_S, drafts=400, draft_tokens=1200, accepted=600,
                          per_position=(280, 200, 120))}
TIMEOUT = ScrapeError(ScrapeErrorReason.TIMEOUT, "no answer within 4 s")


def test_good_scrapes_publish_evidence_and_decision() -> None:
    scraper = FakeScraper(FIRST, SECOND)
    loop, board = make_loop(("a", scraper))

    run(loop.run_once(T0))
    run(loop.run_once(T0 + INTERVAL_S))

    status = board.get("a")
    assert status is not None and status.evidence is not None and status.decision is not None
    assert scraper.calls == [T0, T0 + INTERVAL_S]
    assert status.last_good_scrape_s == T0 + INTERVAL_S
    assert status.evidence.state is DataState.OK
    assert status.evidence.model == "tiny"
    # Window delta: 600 accepted over 400 drafts -> E[L] = 1 + 600/400 = 2.5.
    assert status.evidence.acceptance is not None
    assert status.evidence.acceptance.mean_acceptance_length == pytest.approx(2.5)
    assert status.decision.state is DataState.OK
    # First decision: the deployment that runs (n-gram on, k=3) is the baseline; the curve is published with it.
    assert (status.decision.enabled, status.decision.num_speculative_tokens) == (True, 3)
    assert [p.gamma for p in status.decision.curve] == list(range(DECIDE.gamma_max + 1))
    assert board.iterations == 2 and board.last_iteration_s == T0 + INTERVAL_S
    assert dict(status.scrape_errors) == {}


def test_failed_scrape_keeps_last_recommendation_as_stale_then_error() -> None:
    scraper = FakeScraper(FIRST, TIMEOUT, TIMEOUT)
    loop, board = make_loop(("a", scraper))

    run(loop.run_once(T0))
    good = board.get("a")
    assert good is not None and good.decision is not None

    run(loop.run_once(T0 + INTERVAL_S))  # 5 s after the last good scrape: within stale_after_s (30 s)
    stale = board.get("a")
    assert stale is not None and stale.decision is not None and stale.evidence is not None
    assert stale.evidence.state is DataState.STALE
    assert "timeout" in stale.evidence.reason
    assert stale.decision.state is DataState.STALE
    assert (stale.decision.enabled, stale.decision.num_speculative_tokens) == (
        good.decision.enabled,
        good.decision.num_speculative_tokens,
    )
    assert stale.last_good_scrape_s == T0
    assert dict(stale.scrape_errors) == {"timeout": 1}

    run(loop.run_once(T0 + 40.0))  # 40 s > stale_after_s: the data is too old to call stale
    broken = board.get("a")
    assert broken is not None and broken.decision is not None
    assert broken.decision.state is DataState.ERROR
    assert broken.decision.enabled == good.decision.enabled
    assert dict(broken.scrape_errors) == {"timeout": 2}
    assert broken.last_error is not None and broken.last_error.startswith("timeout")


def test_never_scraped_target_is_an_error_and_counts_reasons() -> None:
    refused = ScrapeError(ScrapeErrorReason.CONNECT, "connection refused")
    loop, board = make_loop(("a", FakeScraper(refused, refused)))
    run(loop.run_once(T0))
    run(loop.run_once(T0 + INTERVAL_S))
    status = board.get("a")
    assert status is not None and status.decision is not None
    assert status.decision.state is DataState.ERROR
    assert status.last_good_scrape_s is None
    assert dict(status.scrape_errors) == {"connect": 2}
    assert not board.is_ready()


def test_bug_in_one_target_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    broken = FakeScraper(FIRST, RuntimeError("boom"))
    healthy = FakeScraper(FIRST, SECOND)
    loop, board = make_loop(("broken", broken), ("healthy", healthy))

    run(loop.run_once(T0))
    with caplog.at_level(logging.ERROR, logger="spec_advisor"):
        run(loop.run_once(T0 + INTERVAL_S))

    failed = board.get("broken")
    assert failed is not None and failed.decision is not None
    assert dict(failed.scrape_errors) == {INTERNAL_ERROR_REASON: 1}
    assert failed.decision.state is DataState.ERROR  # last recommendation kept, marked
    # ... and its sentence and causes say so, not the ok decision's (the setting kept is the one published).
    assert [why.code.value for why in failed.decision.why] == ["error"]
    assert failed.decision.summary.startswith("Keeping the last advice, speculation on, k=")
    ok = board.get("healthy")
    assert ok is not None and ok.last_good_scrape_s == T0 + INTERVAL_S
    assert board.iterations == 2
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None  # logged with its traceback


def test_model_selection() -> None:
    two_models = {"tiny": make_snapshot(), "other": make_snapshot(model_name="other")}
    loop, board = make_loop(("a", FakeScraper(two_models)))
    run(loop.run_once(T0))
    status = board.get("a")
    assert status is not None
    assert dict(status.scrape_errors) == {"model_missing": 1}
    assert status.last_error is not None and "set the target's model" in status.last_error

    loop, board = make_loop(("a", FakeScraper(two_models)), model="other")
    run(loop.run_once(T0))
    status = board.get("a")
    assert status is not None and status.evidence is not None
    assert status.evidence.model == "other"

    loop, board = make_loop(("a", FakeScraper(FIRST)), model="absent")
    run(loop.run_once(T0))
    status = board.get("a")
    assert status is not None and status.last_error is not None
    assert "model 'absent' is not served (served: tiny)" in status.last_error


def test_unknown_model_profile_is_an_error_with_its_reason() -> None:
    loop, board = make_loop(("a", FakeScraper(FIRST)), resolve=no_context)
    run(loop.run_once(T0))
    status = board.get("a")
    assert status is not None and status.evidence is not None and status.decision is not None
    assert status.evidence.state is DataState.ERROR
    assert "not in the catalog" in status.evidence.reason
    assert status.decision.state is DataState.ERROR
    assert status.decision.curve == ()
    assert status.last_good_scrape_s == T0  # the scrape itself was fine


def test_gpu_is_read_once_per_tick_and_steps_are_timed() -> None:
    gpu = FakeGpu()
    loop, board = make_loop(("a", FakeScraper(FIRST)), ("b", FakeScraper(FIRST)), gpu=gpu)
    run(loop.run_once(T0))
    assert gpu.reads == [T0]
    timings = board.timings
    assert set(timings.counts) == {"gpu", "scrape", "estimate", "advise", "publish"}
    # One gpu read per tick; scrape/estimate/advise/publish once per target (2 targets).
    assert sum(timings.counts["gpu"]) == 1
    assert all(sum(timings.counts[step]) == 2 for step in ("scrape", "estimate", "advise", "publish"))
    assert all(total > 0 for total in timings.sums_s.values())


def test_one_log_line_per_decision_change(caplog: pytest.LogCaptureFixture) -> None:
    loop, _ = make_loop(("a", FakeScraper(FIRST, SECOND, TIMEOUT)))
    with caplog.at_level(logging.INFO, logger="spec_advisor"):
        run(loop.run_once(T0))  # nothing -> ok (on, 3): a change
        run(loop.run_once(T0 + INTERVAL_S))  # ok (on, 3) again: no line
        run(loop.run_once(T0 + 2 * INTERVAL_S))  # ok -> stale: a change
    changes = [r for r in caplog.records if r.getMessage() == "recommendation changed"]
    assert len(changes) == 2
    first, second = (getattr(r, "fields") for r in changes)  # noqa: B009
    assert first["state"] == "ok" and first["previous_state"] is None and first["reason"]
    assert second["state"] == "stale" and second["previous_state"] == "ok"
    assert "timeout" in second["reason"]


def test_run_forever_only_sleeps_around_run_once() -> None:
    scraper = FakeScraper(FIRST, SECOND, SECOND)
    loop, board = make_loop(("a", scraper))
    times = iter([T0, T0 + 1.5, T0 + 5.0, T0 + 5.5, T0 + 10.0, T0 + 10.2])
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        run(loop.run_forever(lambda: next(times), sleep=fake_sleep))
    assert scraper.calls == [T0, T0 + 5.0, T0 + 10.0]
    # Each sleep is interval - iteration time: 5 - 1.5, 5 - 0.5, 5 - 0.2.
    assert sleeps == pytest.approx([3.5, 4.5, 4.8])
    assert board.iterations == 3


def test_engine_roofline_counters_become_saturation_ratios() -> None:
    peak_flops = hardware_by_name("h100-sxm").peak_flops_per_s  # bf16 dense: the Llama-3.1-8B profile is bf16
    peak_bytes = hardware_by_name("h100-sxm").mem_bandwidth_bytes_per_s
    first = {"tiny": make_snapshot(estimated_flops=0.0, estimated_read_bytes=0.0)}
    # Over 5 s the engine counts 0.4 x peak FLOP/s and 0.7 x peak bytes/s of work.
    second = {
        "tiny": advance(
            first["tiny"], dt_s=INTERVAL_S, drafts=400, draft_tokens=1200, accepted=600, per_position=(280, 200, 120),
            estimated_flops=0.4 * peak_flops * INTERVAL_S, estimated_read_bytes=0.7 * peak_bytes * INTERVAL_S,
        )
    }
    loop, board = make_loop(("a", FakeScraper(first, second)))
    run(loop.run_once(T0))
    run(loop.run_once(T0 + INTERVAL_S))
    status = board.get("a")
    assert status is not None
    assert status.engine_activity["tensor_active"] == pytest.approx(0.4)
    assert status.engine_activity["dram_active"] == pytest.approx(0.7)


def test_decision_names_its_objective_and_the_calibration_error() -> None:
    # Two scrapes with a queue (3 waiting) and an ITL histogram: 120 samples of 8 ms on top of 100 of 7 ms ->
    # window step time (0.96 s) / 120 = 8 ms, a calibration point. The decision says which objective applied.
    first = {
        "tiny": make_snapshot(num_requests_running=2.0, num_requests_waiting=3.0, inter_token_latency=itl(0.7, 100))
    }
    second = {"tiny": advance(first["tiny"], dt_s=INTERVAL_S, drafts=400, draft_tokens=1200, accepted=600,
                              per_position=(280, 200, 120), inter_token_latency=itl(0.7 + 0.96, 220))}
    loop, board = make_loop(("a", FakeScraper(first, second)))
    run(loop.run_once(T0))
    run(loop.run_once(T0 + INTERVAL_S))
    status = board.get("a")
    assert status is not None and status.decision is not None and status.evidence is not None
    assert status.evidence.step_time_s == pytest.approx(0.96 / 120)
    assert status.decision.objective == "capacity"
    assert "objective capacity (capacity-bound: 3 waiting" in status.decision.reason
    assert status.decision.calibration_error_ratio is not None
    # Two points at nearly the same operating point: the cold start (lifetime ITL 0.7 s / 100 = 7 ms) and the window
    # (8 ms). No scales explain both; the median error is about half their 13% spread.
    assert 0.03 < status.decision.calibration_error_ratio < 0.10
    assert "model calibration error" in status.decision.reason


class RaisingGpu:
    """A GPU source that breaks its never-raise contract (a bug, or a library error nobody caught)."""

    def __init__(self, *errors: Exception) -> None:
        self._errors = iter(errors)

    async def read(self, now_s: float) -> GpuSnapshot:
        raise next(self._errors)


class FailingGpu:
    """A GPU source that reports its failures, as the contract says (the DCGM source's timeout text)."""

    async def read(self, now_s: float) -> GpuSnapshot:
        return GpuSnapshot(taken_at_s=now_s, source="dcgm", error="timeout: http://dcgm:9400/metrics: 2.0 s")


def test_a_gpu_source_that_raises_does_not_stop_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    gpu = RaisingGpu(AttributeError("no nvmlGpmSampleGet"), AttributeError("no nvmlGpmSampleGet"), OSError("lost"))
    board = Board([("a", None)], started_at_s=T0)
    loop = AdvisorLoop(
        [TargetSpec(name="a", model=None, scraper=FakeScraper(FIRST, SECOND, SECOND), resolve_context=fixed_context)],
        wiring=LoopWiring(gpu=gpu, board=board, timer=StepTimer(), gpu_source_name="nvml"), config=CONFIG,
    )
    with caplog.at_level(logging.ERROR, logger="spec_advisor"):
        for tick in range(3):
            run(loop.run_once(T0 + tick * INTERVAL_S))

    assert board.iterations == 3
    status = board.get("a")
    assert status is not None and status.evidence is not None and status.decision is not None
    assert status.last_good_scrape_s == T0 + 2 * INTERVAL_S  # the targets were evaluated every tick
    gpu_seen = status.evidence.gpu
    assert gpu_seen is not None and gpu_seen.source == "nvml" and gpu_seen.taken_at_s == T0 + 2 * INTERVAL_S
    assert gpu_seen.error == "unexpected: OSError: lost"
    # Counted every time, by the configured source; logged once per distinct error (two distinct of three).
    assert dict(board.gpu_errors) == {("nvml", "unexpected"): 3}
    logged = [r for r in caplog.records if r.getMessage().startswith("GPU telemetry source raised")]
    assert len(logged) == 2 and all(r.exc_info is not None for r in logged)


def test_gpu_errors_reported_by_the_source_are_counted_by_reason() -> None:
    board = Board([("a", None)], started_at_s=T0)
    loop = AdvisorLoop(
        [TargetSpec(name="a", model=None, scraper=FakeScraper(FIRST, SECOND), resolve_context=fixed_context)],
        wiring=LoopWiring(gpu=FailingGpu(), board=board, timer=StepTimer(), gpu_source_name="dcgm"), config=CONFIG,
    )
    run(loop.run_once(T0))
    run(loop.run_once(T0 + INTERVAL_S))
    assert dict(board.gpu_errors) == {("dcgm", "timeout"): 2}


def test_the_loop_publishes_the_cost_model_it_used() -> None:
    loop, board = make_loop(("a", FakeScraper(FIRST)))
    run(loop.run_once(T0))
    status = board.get("a")
    assert status is not None
    assert status.context == context()  # what /v1/schedule prices with, not a rebuild from the profile names
    assert status.profiles["model"] == "llama-3.1-8b"


def test_the_second_scrape_after_a_cold_start_keeps_the_recommendation_ok() -> None:
    # FIRST holds 540 lifetime drafts (>= 200); 5 s later only 20 more: the window is not yet evidence of its own,
    # so the acceptance stays on the lifetime counts instead of flapping to insufficient_data.
    second = {"tiny": advance(make_snapshot(), dt_s=INTERVAL_S, drafts=20, draft_tokens=58, accepted=55,
                              per_position=(20, 18, 17))}
    loop, board = make_loop(("a", FakeScraper(FIRST, second)))
    run(loop.run_once(T0))
    run(loop.run_once(T0 + INTERVAL_S))
    status = board.get("a")
    assert status is not None and status.evidence is not None and status.decision is not None
    assert status.evidence.state is DataState.OK and status.decision.state is DataState.OK
    assert status.evidence.acceptance is not None and status.evidence.acceptance.cold_start is True
    assert status.evidence.acceptance.drafts == 560  # 540 + 20, lifetime


def test_a_held_decision_does_not_blame_the_model() -> None:
    # 100 lifetime drafts (< 200) with an ITL histogram (50 samples of 10 ms): the calibration learns a point, the
    # decision holds on insufficient data, and its reason is about the data only.
    few = {"tiny": make_snapshot(spec=make_spec(drafts=100, draft_tokens=300, accepted_tokens=150,
                                                per_position=(80, 50, 20)),
                                 num_requests_running=2.0, inter_token_latency=itl(0.5, 50))}
    loop, board = make_loop(("a", FakeScraper(few)))
    run(loop.run_once(T0))
    status = board.get("a")
    assert status is not None and status.decision is not None
    assert status.decision.state is DataState.INSUFFICIENT_DATA
    assert status.decision.calibration_error_ratio is not None  # the fit ran and is published
    assert "calibration" not in status.decision.reason
    assert "100 drafts" in status.decision.reason
