"""`spec-advisor profile`: drive one inference server through closed-loop concurrency levels and record, per level,
the engine's mean step at the batch it verified: the measured step-time table `serve` and `whatif` calibrate from
(policies/model/measured_profile.py).

The plan, per level c (e.g. 1, 2, 4, ... 64 clients): c clients each keep one request in flight (service/loadgen.py)
for `warmup_s + level_s + TAIL_S`; the first `warmup_s` fill the batch and are not measured; `/metrics` is scraped
at the end of the warm-up and `level_s` later (under load: the clients run on `TAIL_S` after it), and the
estimator turns the two scrapes into the level's evidence (policies/estimate/window.py: ITL and iteration-token counters
give the step, the sequences per step, the prefill mixed in and the proposed length). A level whose scrapes hold
fewer than `MIN_LEVEL_SAMPLES` ITL samples or `MIN_LEVEL_STEPS` engine steps, or with speculation on but no
draft proposed, is skipped and reported with the condition that failed (`skip_reason`). Bounds: at most 16
levels of at most 512 clients and 600 s each; the worst case (`ProfilePlan.bound_s`, the load only: a level's
drain waits for its requests in flight, each bounded by the client's timeout) is printed before the first request.

Refusals and failures: before loading anything, two scrapes `IDLE_CHECK_S` apart must show no running or waiting
request and no generated token between them, or the server is serving someone and the plan refuses (`--force`
overrides). A scrape that fails, a counter reset (restart), or a level whose requests mostly fail stops the plan:
the levels measured so far are returned as an incomplete profile with the reason.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from policies.estimate.window import EstimatorConfig, EstimatorState, estimate, observe
from policies.model.calibrate import CalibrationConfig, observation_from
from policies.model.costmodel import ModelContext, step_batch
from policies.model.measured_profile import MeasuredProfile, ProfileError, ProfileIdentity, ProfilePoint, parse_profile
from policies.types import EngineSnapshot, Evidence
from service.loadgen import MAX_CONCURRENCY
from service.sources.errors import ScrapeError

MAX_LEVELS = 16
MAX_LEVEL_S = 600.0
IDLE_CHECK_S = 2.0
TAIL_S = 1.0
# ITL samples a level needs: its mean step then has a standard error of ~1/sqrt(200) = 7% of the steps' spread,
# which on an engine stepping steadily under a held load (spread well under the mean) is ~1-2% of the step.
MIN_LEVEL_SAMPLES = 200.0
# Engine steps a level needs (ITL samples / sequences per step): at a batch of 64, 200 samples are 3 steps, and a
# mean over 3 steps is one prefill burst away from any value; 200 steps put the mean's error at ~1-2% again.
MIN_LEVEL_STEPS = 200.0
# A level where more than this share of requests failed measured an engine in trouble, not its steps.
MAX_ERROR_SHARE = 0.5
# A profile of 1000 points is ~400 KB of JSON.
MAX_PROFILE_BYTES = 4 * 1024 * 1024


INTERRUPTED = "interrupted"  # the start of `ProfileOutcome.stopped` when the run was cancelled (Ctrl-C)


class ProfileRefusedError(Exception):
    """The server is serving traffic (or the plan is out of bounds): nothing was loaded. The message says why."""


@dataclass(frozen=True, slots=True)
class LevelLoad:
    """What the closed loop did at one level: requests finished, failed, and completion tokens received."""

    requests: int
    errors: int
    completion_tokens: int
    stopped_early: bool = False


@dataclass(frozen=True, slots=True)
class Timebase:
    """Where a profile run's time comes from: `clock` gives Unix seconds (scrape times, the profile's timestamp),
    `sleep` waits a number of seconds. Tests pass simulated ones."""

    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


class Engine(Protocol):
    """The server under measurement: its /metrics (one model's snapshot), its version, and a closed-loop load."""

    async def scrape(self, now_s: float) -> EngineSnapshot: ...

    async def drive(self, concurrency: int, duration_s: float) -> LevelLoad: ...


@dataclass(frozen=True, slots=True)
class ProfilePlan:
    """Concurrency levels (clients, ascending, 1..512, at most 16), seconds measured per level (1..600) after
    `warmup_s` (0..600) of unmeasured load, and whether to load a server that is serving traffic."""

    levels: tuple[int, ...]
    level_s: float
    warmup_s: float
    force: bool = False

    def __post_init__(self) -> None:
        if not 1 <= len(self.levels) <= MAX_LEVELS:
            raise ProfileRefusedError(f"1..{MAX_LEVELS} concurrency levels expected, got {len(self.levels)}")
        if any(not 1 <= c <= MAX_CONCURRENCY for c in self.levels):
            raise ProfileRefusedError(f"concurrency levels must be 1..{MAX_CONCURRENCY}, got {list(self.levels)}")
        if not 1.0 <= self.level_s <= MAX_LEVEL_S or not 0.0 <= self.warmup_s <= MAX_LEVEL_S:
            raise ProfileRefusedError(f"level 1..{MAX_LEVEL_S:g} s and warm-up 0..{MAX_LEVEL_S:g} s expected")

    @property
    def bound_s(self) -> float:
        """The plan's longest run (s): every level's warm-up and measurement, plus the idle check."""
        return IDLE_CHECK_S + len(self.levels) * (self.warmup_s + self.level_s + TAIL_S)


@dataclass(frozen=True, slots=True)
class LevelReport:
    """One level's outcome, for the progress line: its point, or why it has none."""

    index: int
    concurrency: int
    point: ProfilePoint | None
    load: LevelLoad
    skipped: str | None = None


@dataclass(frozen=True, slots=True)
class ProfileOutcome:
    """The measured profile (None when no level produced a point) and, when the plan stopped early, why."""

    profile: MeasuredProfile | None
    levels: tuple[LevelReport, ...]
    stopped: str | None = None


async def check_idle(engine: Engine, timebase: Timebase) -> None:
    """Raise ProfileRefusedError unless two scrapes `IDLE_CHECK_S` apart show an idle server (no running or
    waiting request, no token generated between them). ScrapeError propagates (the server cannot be read)."""
    first = await engine.scrape(timebase.clock())
    await timebase.sleep(IDLE_CHECK_S)
    second = await engine.scrape(timebase.clock())
    busy = max(first.num_requests_running, second.num_requests_running)
    waiting = max(first.num_requests_waiting, second.num_requests_waiting)
    generated = _delta(first.generation_tokens, second.generation_tokens)
    if busy > 0 or waiting > 0 or generated > 0:
        raise ProfileRefusedError(
            f"the server is serving traffic ({busy:g} running, {waiting:g} waiting, {generated:g} tokens generated "
            f"in {IDLE_CHECK_S:g} s): profiling loads it with up to the plan's clients; measure a staging replica, "
            "or pass --force to load this one anyway"
        )


def _delta(before: float | None, after: float | None) -> float:
    if before is None or after is None:
        return 0.0
    return max(after - before, 0.0)


async def run_profile(
    plan: ProfilePlan,
    engine: Engine,
    ctx: ModelContext,
    identity: ProfileIdentity,
    *,
    timebase: Timebase,
    on_level: Callable[[LevelReport], None] | None = None,
) -> ProfileOutcome:
    """Run `plan` against `engine` (module docstring). Raises ProfileRefusedError when the server is busy and the
    plan is not forced, ScrapeError when it cannot be read before anything was loaded; later failures end the
    plan with `ProfileOutcome.stopped` set and the points measured so far. So does a cancellation once a level
    has started (Ctrl-C: asyncio.run cancels the main task): the level in progress is dropped, its load stopped,
    the levels before it are kept (`INTERRUPTED`)."""
    if not plan.force:
        await check_idle(engine, timebase)
    reports: list[LevelReport] = []
    stopped: str | None = None
    for index, concurrency in enumerate(plan.levels):
        try:
            report = await _level(plan, engine, ctx, index=index, concurrency=concurrency, timebase=timebase)
        except ScrapeError as exc:
            stopped = f"the server stopped answering at {concurrency} clients: {exc.detail}"
            break
        except _LevelFailedError as exc:
            stopped = str(exc)
            break
        except asyncio.CancelledError:
            stopped = f"{INTERRUPTED} at {concurrency} clients"
            break
        reports.append(report)
        if on_level is not None:
            on_level(report)
    points = tuple(r.point for r in reports if r.point is not None)
    profile = (
        MeasuredProfile(identity=identity, created_at_s=timebase.clock(), points=points, complete=stopped is None)
        if points else None
    )
    return ProfileOutcome(profile=profile, levels=tuple(reports), stopped=stopped)


class _LevelFailedError(Exception):
    pass


async def _level(
    plan: ProfilePlan,
    engine: Engine,
    ctx: ModelContext,
    *,
    index: int,
    concurrency: int,
    timebase: Timebase,
) -> LevelReport:
    # The clients run `TAIL_S` past the second scrape, so it reads the engine under the level's load, not draining.
    clock, sleep = timebase.clock, timebase.sleep
    load_task = asyncio.create_task(engine.drive(concurrency, plan.warmup_s + plan.level_s + TAIL_S))
    try:
        await sleep(plan.warmup_s)
        before = await engine.scrape(clock())
        await sleep(plan.level_s)
        after = await engine.scrape(clock())
        await sleep(TAIL_S)
        load = await load_task
    finally:
        if not load_task.done():
            load_task.cancel()
            await asyncio.gather(load_task, return_exceptions=True)
    if load.stopped_early:
        raise _LevelFailedError(f"the server stopped answering at {concurrency} clients (every request failed)")
    total = load.requests + load.errors
    if total and load.errors / total > MAX_ERROR_SHARE:
        raise _LevelFailedError(
            f"{load.errors} of {total} requests failed at {concurrency} clients: the server is not serving normally"
        )
    evidence = level_evidence(before, after, window_s=plan.level_s)
    if evidence is None:
        raise _LevelFailedError(f"the server's counters restarted during the {concurrency}-client level")
    context = None if evidence.context_tokens_per_seq is not None else load_context_tokens(before, after, load)
    return level_report(evidence, ctx, index=index, concurrency=concurrency, load=load, context_tokens=context)


def load_context_tokens(before: EngineSnapshot, after: EngineSnapshot, load: LevelLoad) -> float | None:
    """The mean context of a decoding sequence (tokens) from what the level sent, for an engine that does not
    report its KV capacity (the estimator's context then defaults): prompt + half the completion, per request,
    with the prompt from the engine's own counters, prompt tokens per generated token over the measured span.

        c = completion_tokens / requests,   ctx = c x dprompt / dgenerated + c / 2

    Example: 64-token completions while the engine counted 30 prompt tokens per 64 generated -> 30 + 32 = 62.
    None when nothing was generated or finished."""
    generated = _delta(before.generation_tokens, after.generation_tokens)
    prompts = _delta(before.prompt_tokens, after.prompt_tokens)
    if load.requests <= 0 or generated <= 0.0:
        return None
    completion = load.completion_tokens / load.requests
    return completion * prompts / generated + completion / 2.0


def level_evidence(before: EngineSnapshot, after: EngineSnapshot, *, window_s: float) -> Evidence | None:
    """The estimator's evidence over the span between two scrapes of one level (no acceptance minimum: the level
    is measured for its step, not judged for a decision), or None when the counters restarted in between."""
    config = EstimatorConfig(window_s=max(window_s, 1.0) * 4.0, min_drafts=0, stale_after_s=max(window_s, 1.0) * 4.0)
    state = observe(observe(EstimatorState(), before, config), after, config)
    if len(state.snapshots) < 2:
        return None
    return estimate(state, target="profile", config=config, now_s=after.taken_at_s)


def level_report(
    evidence: Evidence, ctx: ModelContext, *, index: int, concurrency: int, load: LevelLoad,
    context_tokens: float | None = None,
) -> LevelReport:
    """The level's profile point from its evidence, or the reason it has none (`skip_reason`); `context_tokens`
    replaces the evidence's context when the engine did not report one (`load_context_tokens`)."""
    why = skip_reason(evidence)
    observation = None if why else observation_from(
        evidence, ctx, config=CalibrationConfig(min_step_samples=MIN_LEVEL_SAMPLES)
    )
    drafted = evidence.acceptance is not None and evidence.acceptance.drafts > 0
    if observation is not None and observation.draft_passes > 0 and (not drafted or observation.tokens_per_seq <= 1.0):
        why = (
            f"speculation is on (k={evidence.deployed_k}) but no drafts were proposed: its steps are neither plain "
            "nor speculative (an n-gram drafter with no matches in these prompts)"
        )
        observation = None
    if observation is None:
        reason = why or f"the level's evidence is not usable ({evidence.reason or evidence.state.value})"
        return LevelReport(index=index, concurrency=concurrency, point=None, load=load, skipped=reason)
    accepted = evidence.acceptance.mean_acceptance_length if evidence.acceptance is not None else None
    point = ProfilePoint(
        concurrency=concurrency,
        deployed_k=evidence.deployed_k,
        batch=observation.batch,
        tokens_per_seq=observation.tokens_per_seq,
        draft_passes=observation.draft_passes,
        context_tokens=observation.context_tokens if context_tokens is None else context_tokens,
        prefill_tokens=observation.prefill_tokens,
        step_s=observation.step_s,
        step_samples=evidence.step_samples,
        mean_accepted_length=accepted if accepted is not None and math.isfinite(accepted) else None,
        prefill_chunk_tokens=observation.prefill_chunk_tokens,
    )
    return LevelReport(index=index, concurrency=concurrency, point=point, load=load)


def skip_reason(evidence: Evidence) -> str | None:
    """Why a level's evidence gives no point, naming the first condition that failed, or None: the server must
    report inter-token latency, the level must hold `MIN_LEVEL_SAMPLES` ITL samples and `MIN_LEVEL_STEPS` engine
    steps (samples / sequences per step), and the engine must have been decoding (batch >= 0.5).
    Example: 900 samples at batch 32 -> "only 28 engine steps (900 inter-token samples at batch 32.0; need 200)"."""
    if evidence.step_time_s is None:
        return "the server reported no inter-token latency"
    samples = evidence.step_samples
    if samples < MIN_LEVEL_SAMPLES:
        return f"only {samples:.0f} inter-token samples (need {MIN_LEVEL_SAMPLES:.0f}); lengthen --level-s"
    batch = step_batch(evidence)
    if not batch >= 0.5:
        return f"the engine was idle (batch {batch:.2f})"
    steps = samples / batch
    if steps < MIN_LEVEL_STEPS:
        return (
            f"only {steps:.0f} engine steps ({samples:.0f} inter-token samples at batch {batch:.1f}; need "
            f"{MIN_LEVEL_STEPS:.0f}); lengthen --level-s"
        )
    return None


def parse_levels(text: str) -> tuple[int, ...]:
    """"1,2,4,8" -> (1, 2, 4, 8): ascending and distinct; ValueError naming the problem otherwise (the bounds
    are ProfilePlan's)."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"concurrency levels are comma-separated integers, got {text!r}") from None
    if not levels or list(levels) != sorted(set(levels)):
        raise ValueError(f"concurrency levels must be ascending and distinct, got {text!r}")
    return levels


def progress_line(report: LevelReport, *, total: int) -> str:
    """One level's line on stderr: '[3/7] 4 clients: batch 3.9, step 14.10 ms, 3.69 tokens verified per
    sequence, 160 requests, 0 errors', or '[1/7] 1 clients: skipped (<why>); 57 requests'."""
    head = f"[{report.index + 1}/{total}] {report.concurrency} clients"
    if report.point is None:
        return f"{head}: skipped ({report.skipped}); {report.load.requests} requests"
    p = report.point
    return (
        f"{head}: batch {p.batch:.1f}, step {p.step_s * 1e3:.2f} ms, {p.tokens_per_seq:.2f} tokens verified per "
        f"sequence, {report.load.requests} requests, {report.load.errors} errors"
    )


def describe(levels: Sequence[int], plan: ProfilePlan) -> str:
    """The plan as printed before it starts."""
    return (
        f"profiling at {len(levels)} levels ({', '.join(str(c) for c in levels)} clients), {plan.warmup_s:g} s "
        f"warm-up + {plan.level_s:g} s measured each: at most {plan.bound_s:.0f} s"
    )


def read_profile(path: Path) -> MeasuredProfile:
    """A profile file, parsed and checked (policies/model/measured_profile.py); ProfileError naming the problem."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise ProfileError(f"{path} is larger than {MAX_PROFILE_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, an integer past Python's digit limit
        raise ProfileError(f"{path} is not JSON: {exc}") from None
    try:
        return parse_profile(data)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from None
