"""The advisor's iteration: `run_once(now)` = read GPU, then per target (concurrently) scrape -> estimate -> advise
-> publish to the Board, then save the acceptance memory when it changed. `run_forever` only sleeps around it. Time
comes in as an argument; nothing here reads the wall clock (a monotonic timer, injected, only measures step
durations).

Acceptance memory (policies/estimate/memory.py): each target carries the last trusted acceptance profile per model, so a
target whose speculation is off is still priced from what was measured. With a `memory_store` it survives
restarts: loaded when the loop is built, saved after an iteration that changed it, at most once per
`memory_save_interval_s`, except that a new model, a new k or a first real window after a cold start is saved at
once (that is what the next restart most needs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from policies.advise import Advice, AdvisorConfig, AdvisorState, advise_target, method_options
from policies.decide.audit import (
    AuditConfig,
    ControllerAudit,
    MethodOption,
    SpeculationController,
    audit_controller,
    with_mixed_note,
)
from policies.decide.rule import held
from policies.estimate.memory import AcceptanceMemory
from policies.estimate.window import EstimatorConfig, EstimatorState, after_failed_scrape, estimate, observe
from policies.model.calibrate import CalibrationState, with_anchors
from policies.model.costmodel import ModelContext
from policies.model.measured_profile import (
    MeasuredProfile,
    ProfileError,
    check_age,
    check_identity,
    identity_of,
    observations,
)
from policies.types import DataState, Decision, EngineSnapshot, Evidence, GpuSnapshot
from service.board import INTERNAL_ERROR_REASON, Board, Pricing
from service.logs import fields, get_logger
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.gpu import ERROR_UNEXPECTED, SOURCE_ABSENT, gpu_error_reason
from service.sources.llamacpp import UNNAMED_MODEL
from service.stores.memory import LoadResult

# Distinct GPU-source exceptions remembered so each is logged (with its traceback) once, not every interval;
# bounded so a source whose messages vary cannot grow it without end.
_GPU_ERRORS_REMEMBERED = 32

_T = TypeVar("_T")


class Scraper(Protocol):
    """One inference server's /metrics reader (EngineScraper). Raises only `ScrapeError`."""

    async def scrape(self, now_s: float) -> dict[str, EngineSnapshot]: ...


class GpuReader(Protocol):
    """GPU telemetry (NvmlSource, DcgmSource, NoGpuSource). Should never raise: failures come back in the snapshot
    (a source that raises anyway is caught by `run_once` and reported as an "unexpected" error)."""

    async def read(self, now_s: float) -> GpuSnapshot: ...


class IterationListener(Protocol):
    """Runs after each iteration has published every target (the actuation runner reads the board then).
    Exceptions are caught, logged and counted as an internal error of the iteration; the loop goes on."""

    async def after_iteration(self, now_s: float) -> None: ...


class AcceptanceMemoryStore(Protocol):
    """Where the acceptance memory persists (service.stores.memory.MemoryStore). `load` never raises: a bad file
    comes back as `LoadResult.error`; `save` may raise OSError, which the loop logs and survives."""

    def load(self) -> LoadResult: ...

    def save(self, memories: Mapping[str, AcceptanceMemory], *, now_s: float) -> None: ...


class ContextUnavailableError(Exception):
    """The cost model cannot be set up for a target (unknown model or hardware profile); the message says why."""


# (served model name, this tick's GPU snapshot) -> the cost model's context; raises ContextUnavailableError.
ContextResolver = Callable[[str, GpuSnapshot], ModelContext]


@dataclass(frozen=True, slots=True)
class LoadedProfile:
    """A measured profile (policies/model/measured_profile.py) and the file it was read from, for the reasons."""

    source: str
    profile: MeasuredProfile


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """What the loop needs to know about one target; built by the composition root from the settings.

    `profile`: the deployment's measured profile, if any. When the target's profiles resolve, it must match them
    (`check_identity`) and it then seeds the calibration's anchors; every tick it must be younger than
    `profile_max_age_s`. Either failing puts the target in the error state with the reason."""

    name: str
    model: str | None  # the vLLM model_name to follow; None = the only one served
    scraper: Scraper
    resolve_context: ContextResolver
    profile: LoadedProfile | None = None
    profile_max_age_s: float = 30 * 24 * 3600.0
    controller: SpeculationController = SpeculationController.NONE  # the engine's own, as declared


@dataclass(slots=True)
class _LoopTarget:
    # The per-target state threaded through the pure policy functions between ticks, and what the loop itself
    # remembers of the last tick (it publishes to the board but never reads it back).
    spec: TargetSpec
    estimator_state: EstimatorState = field(default_factory=EstimatorState)
    advisor: AdvisorState = field(default_factory=AdvisorState)
    context: ModelContext | None = None
    context_key: tuple[str, str | None] | None = None  # (served model, GPU device name) it was resolved for
    context_error: str | None = None
    last_good_scrape_s: float | None = None
    last_error: str | None = None  # the error recorded since the last good scrape (warned once per outage)
    published: tuple[Evidence, Decision] | None = None  # what the last tick published


# What makes a memory change worth saving at once: per target, the models it remembers, each profile's k and
# whether it is still a cold start (lifetime counters) or a real window.
_MemoryShape = frozenset[tuple[str, str, int, bool]]


def _shape(memories: Mapping[str, AcceptanceMemory]) -> _MemoryShape:
    return frozenset(
        (target, e.model, e.k, e.cold_start) for target, memory in memories.items() for e in memory.entries
    )


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """How the loop advises: the estimator's config, the advisor's policy configs (decision rule, calibration,
    objective, acceptance memory), the tick interval in seconds, and the least time in seconds between two saves of
    a changed acceptance memory (a new model, k or first real window is saved at once)."""

    estimator: EstimatorConfig
    interval_s: float
    advisor: AdvisorConfig = field(default_factory=AdvisorConfig)
    memory_save_interval_s: float = 60.0


@dataclass(frozen=True, slots=True)
class LoopWiring:
    """The loop's collaborators: the GPU reader and the source name ("nvml", "dcgm", "absent") that labels a GPU
    read that raised instead of reporting, the board it publishes to, the listeners run after each iteration, the
    acceptance memory's store (None: kept in this process only), the timer that measures step durations (seconds)
    and the logger (None: the sidecar's "loop" logger)."""

    gpu: GpuReader
    board: Board
    gpu_source_name: str = SOURCE_ABSENT
    listeners: Sequence[IterationListener] = ()
    memory_store: AcceptanceMemoryStore | None = None
    timer: Callable[[], float] = time.perf_counter
    logger: logging.Logger | None = None


class AdvisorLoop:
    """Runs the pipeline for every target and publishes to the wiring's board. Safe to call `run_once` directly in
    tests."""

    def __init__(self, targets: Sequence[TargetSpec], *, wiring: LoopWiring, config: LoopConfig) -> None:
        """With a memory store, the acceptance memory is loaded here (a bad file is logged, kept in
        `memory_load_error` and ignored) and saved as the module docstring says."""
        self._targets = [
            _LoopTarget(spec=spec) for spec in targets
        ]
        self._gpu = wiring.gpu
        self._board = wiring.board
        self._estimator_config = config.estimator
        self._advisor_config = config.advisor
        self._gpu_source_name = wiring.gpu_source_name
        self._interval_s = config.interval_s
        self._timer = wiring.timer
        self._log = wiring.logger if wiring.logger is not None else get_logger("loop")
        self._gpu_errors_logged: dict[str, None] = {}  # insertion-ordered set of logged GPU exceptions
        self._listeners = tuple(wiring.listeners)
        memory_store = wiring.memory_store
        self._memory_store = memory_store
        self._memory_save_interval_s = config.memory_save_interval_s
        self._memory_saved: dict[str, AcceptanceMemory] = {}
        self._memory_attempt_s: float | None = None  # last save attempt (success or not): the throttle's clock
        self._memory_save_error: str | None = None
        self.memory_load_error: str | None = None
        if memory_store is not None:
            loaded = memory_store.load()
            self.memory_load_error = loaded.error
            for runtime in self._targets:
                memory = loaded.memories.get(runtime.spec.name, AcceptanceMemory())
                runtime.advisor = replace(runtime.advisor, memory=memory)
            self._memory_saved = self._memories()

    async def run_once(self, now_s: float) -> None:
        """One iteration at `now_s` (Unix seconds). A failing target, or a GPU source that raises, never stops the
        others or the loop."""
        gpu = await self._timed("gpu", self._read_gpu(now_s))
        if gpu.error is not None:
            self._board.record_gpu_error(gpu.source, gpu_error_reason(gpu))
        results = await asyncio.gather(
            *(self._run_target(runtime, now_s, gpu) for runtime in self._targets), return_exceptions=True
        )
        for runtime, result in zip(self._targets, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # cancellation and interpreter exits are not ours to swallow
                self._internal_error(runtime, result, now_s)
        self._board.finish_iteration(now_s)
        await self._save_memory(now_s, force=False)
        for listener in self._listeners:
            try:
                await listener.after_iteration(now_s)
            except Exception as exc:  # acting is optional; advising must go on whatever the actuator does
                self._log.error(
                    "iteration listener failed", exc_info=exc, extra=fields(listener=type(listener).__name__)
                )
                self._board.record_listener_error(type(listener).__name__)

    async def run_forever(
        self,
        clock: Callable[[], float],
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Call `run_once(clock())` every `interval_s` until cancelled; a slow iteration shortens the next sleep."""
        while True:
            started_s = clock()
            await self.run_once(started_s)
            await sleep(max(0.0, started_s + self._interval_s - clock()))

    async def flush_memory(self, now_s: float) -> None:
        """Save the acceptance memory now if it changed since the last save (at shutdown); never raises for I/O."""
        await self._save_memory(now_s, force=True)

    def memories(self) -> dict[str, AcceptanceMemory]:
        """The acceptance memory of every target, by target name (what a save would write)."""
        return self._memories()

    # ---------------------------------------------------------------------------------------------------------

    def _memories(self) -> dict[str, AcceptanceMemory]:
        return {runtime.spec.name: runtime.advisor.memory for runtime in self._targets}

    async def _save_memory(self, now_s: float, *, force: bool) -> None:
        store = self._memory_store
        if store is None:
            return
        current = self._memories()
        if current == self._memory_saved:
            return
        last = self._memory_attempt_s
        due = last is None or now_s - last >= self._memory_save_interval_s
        # A new model or k is saved at once, unless the last attempt failed (then the throttle spaces retries).
        urgent = self._memory_save_error is None and _shape(current) != _shape(self._memory_saved)
        if not (force or due or urgent):
            return
        self._memory_attempt_s = now_s
        try:
            await asyncio.to_thread(store.save, current, now_s=now_s)
        except (OSError, ValueError) as exc:  # ValueError: a non-finite number refused by allow_nan=False
            error = f"{type(exc).__name__}: {exc}"
            if error != self._memory_save_error:  # once per distinct failure, not every interval
                self._log.warning("acceptance memory not saved; it is kept in memory", extra=fields(error=error))
            self._memory_save_error = error
            return
        if self._memory_save_error is not None:
            self._log.info("acceptance memory saved again", extra=fields(after=self._memory_save_error))
        self._memory_save_error = None
        self._memory_saved = current

    async def _read_gpu(self, now_s: float) -> GpuSnapshot:
        try:
            return await self._gpu.read(now_s)
        except Exception as exc:  # a source broke its never-raise contract: GPU data is optional, the loop is not
            error = f"{ERROR_UNEXPECTED}: {type(exc).__name__}: {exc}"
            if error not in self._gpu_errors_logged:
                self._log.error(
                    "GPU telemetry source raised; continuing without GPU data",
                    exc_info=exc,
                    extra=fields(source=self._gpu_source_name, error=error, now_s=now_s),
                )
                self._gpu_errors_logged[error] = None
                if len(self._gpu_errors_logged) > _GPU_ERRORS_REMEMBERED:
                    del self._gpu_errors_logged[next(iter(self._gpu_errors_logged))]
            return GpuSnapshot(taken_at_s=now_s, source=self._gpu_source_name, error=error)

    async def _run_target(self, runtime: _LoopTarget, now_s: float, gpu: GpuSnapshot) -> None:
        name = runtime.spec.name
        try:
            snapshots = await self._timed("scrape", runtime.spec.scraper.scrape(now_s))
            snapshot = _pick_model(snapshots, runtime.spec.model)
        except ScrapeError as exc:
            self._scrape_failed(runtime, exc, now_s)
            evidence = self._estimate(runtime, now_s, gpu, snapshot=None, failure=exc)
            good_scrape_s: float | None = None
        else:
            self._recovered(runtime)
            evidence = self._estimate(runtime, now_s, gpu, snapshot=snapshot, failure=None)
            good_scrape_s = now_s

        started = self._timer()
        context = self._context_for(runtime, evidence, gpu, now_s)
        stale_profile = _profile_age_error(runtime.spec, now_s)
        if stale_profile is not None:
            # Never advise from a profile past its age limit, whatever else the evidence says.
            context = None
            evidence = replace(evidence, state=DataState.ERROR, reason=stale_profile)
        elif context is None and evidence.state == DataState.OK:
            evidence = replace(evidence, state=DataState.ERROR, reason=runtime.context_error or "no cost model")
        advice = advise_target(evidence, context, self._advisor_config, runtime.advisor, now_s)
        decision, runtime.advisor = advice.decision, advice.state
        self._board.timings.observe("advise", self._timer() - started)

        started = self._timer()
        self._log_change(runtime.published[1] if runtime.published else None, decision)
        runtime.published = (evidence, decision)
        if good_scrape_s is not None:
            runtime.last_good_scrape_s, runtime.last_error = good_scrape_s, None
        self._board.publish(
            name,
            evidence=evidence,
            decision=decision,
            good_scrape_s=good_scrape_s,
            pricing=Pricing(
                engine_activity=engine_activity(evidence, context) if good_scrape_s is not None else None,
                profiles=_profiles(context) if context is not None else None,
                context=context,
                calibration=advice.calibration,
                audit=self._audit(runtime, evidence, decision, context, advice),
            ),
        )
        self._board.timings.observe("publish", self._timer() - started)

    def _audit(
        self, runtime: _LoopTarget, evidence: Evidence, decision: Decision, context: ModelContext | None, advice: Advice
    ) -> ControllerAudit:
        """The engine controller's audit, with the other drafting methods priced from their priors where a
        controller is declared and the evidence is ok (policies/advise.py `method_options`)."""
        controller = runtime.spec.controller
        alternatives: tuple[MethodOption, ...] = ()
        if controller is not SpeculationController.NONE and evidence.state is DataState.OK and context is not None:
            alternatives = method_options(evidence, context, advice, self._advisor_config)
        config = AuditConfig(gamma_max=self._advisor_config.decide.gamma_max)
        return audit_controller(evidence, decision, context, controller=controller, config=config,
                                alternatives=alternatives)

    def _estimate(
        self,
        runtime: _LoopTarget,
        now_s: float,
        gpu: GpuSnapshot,
        *,
        snapshot: EngineSnapshot | None,
        failure: ScrapeError | None,
    ) -> Evidence:
        started = self._timer()
        if snapshot is not None:
            runtime.estimator_state = observe(runtime.estimator_state, snapshot, self._estimator_config)
        evidence = estimate(
            runtime.estimator_state, target=runtime.spec.name, config=self._estimator_config, now_s=now_s, gpu=gpu
        )
        if failure is not None:
            evidence = after_failed_scrape(
                evidence, failure=f"scrape failed ({failure.reason.value}): {failure.detail}",
                last_good_s=runtime.last_good_scrape_s, now_s=now_s, config=self._estimator_config,
            )
        self._board.timings.observe("estimate", self._timer() - started)
        return with_mixed_note(evidence, runtime.spec.controller)

    def _context_for(
        self, runtime: _LoopTarget, evidence: Evidence, gpu: GpuSnapshot, now_s: float
    ) -> ModelContext | None:
        model = evidence.model
        if not model:
            return runtime.context
        # Re-resolve when the model or the GPU changes: hardware "auto" follows the device name.
        key = (model, gpu.device_name)
        if runtime.context is not None and runtime.context_key == key:
            return runtime.context
        # A new model or GPU invalidates the fitted efficiencies and the plan: both were priced with the old
        # profiles.
        runtime.advisor = runtime.advisor.for_new_model(CalibrationState())
        try:
            context = runtime.spec.resolve_context(model, gpu)
            runtime.advisor = runtime.advisor.for_new_model(_anchored(runtime.spec.profile, context, now_s))
        except ContextUnavailableError as exc:
            if runtime.context_error != str(exc):
                self._log.warning(
                    "cost model unavailable", extra=fields(target=runtime.spec.name, model=model, reason=str(exc))
                )
            runtime.context, runtime.context_error = None, str(exc)
            return None
        runtime.context, runtime.context_key, runtime.context_error = context, key, None
        return runtime.context

    def _scrape_failed(self, runtime: _LoopTarget, exc: ScrapeError, now_s: float) -> None:
        name = runtime.spec.name
        first, runtime.last_error = runtime.last_error is None, f"{exc.reason.value}: {exc.detail}"
        self._board.record_error(name, exc.reason.value, exc.detail)
        # Warn once per outage, not every interval; the counter carries the rate.
        log = self._log.warning if first else self._log.debug
        log("scrape failed", extra=fields(target=name, reason=exc.reason.value, detail=exc.detail, now_s=now_s))

    def _recovered(self, runtime: _LoopTarget) -> None:
        if runtime.last_error is not None:
            self._log.info("scrape recovered", extra=fields(target=runtime.spec.name, after=runtime.last_error))

    def _internal_error(self, runtime: _LoopTarget, exc: Exception, now_s: float) -> None:
        name = runtime.spec.name
        self._log.error(
            "internal error while evaluating target", exc_info=exc, extra=fields(target=name, now_s=now_s)
        )
        self._board.record_error(name, INTERNAL_ERROR_REASON, f"{type(exc).__name__}: {exc}")
        runtime.last_error = f"{INTERNAL_ERROR_REASON}: {type(exc).__name__}: {exc}"
        if runtime.published is not None:
            # Keep the last recommendation visible, marked as an error with its original evaluation time.
            reason = f"internal error: {type(exc).__name__}: {exc}"
            evidence, decision = runtime.published
            age_s = max(0.0, now_s - decision.evaluated_at_s)
            runtime.published = (
                replace(evidence, state=DataState.ERROR, reason=reason),
                held(decision, kind=DataState.ERROR, reason=reason, age_s=age_s),
            )
            self._board.publish(
                name, evidence=runtime.published[0], decision=runtime.published[1], good_scrape_s=None
            )

    def _log_change(self, previous: Decision | None, current: Decision) -> None:
        before = (previous.state, previous.enabled, previous.num_speculative_tokens) if previous else None
        after = (current.state, current.enabled, current.num_speculative_tokens)
        if before == after:
            return
        self._log.info(
            "recommendation changed",
            extra=fields(
                target=current.target,
                model=current.model,
                state=current.state.value,
                enabled=current.enabled,
                num_speculative_tokens=current.num_speculative_tokens,
                previous_state=previous.state.value if previous else None,
                previous_enabled=previous.enabled if previous else None,
                previous_num_speculative_tokens=previous.num_speculative_tokens if previous else None,
                reason=current.reason,
            ),
        )

    async def _timed(self, step: str, awaitable: Awaitable[_T]) -> _T:
        started = self._timer()
        try:
            return await awaitable
        finally:
            self._board.timings.observe(step, self._timer() - started)


def _anchored(loaded: LoadedProfile | None, context: ModelContext, now_s: float) -> CalibrationState:
    """A fresh calibration for `context`, anchored on the target's measured profile when it has one; raises
    ContextUnavailableError when the profile measured another deployment."""
    if loaded is None:
        return CalibrationState()
    try:
        check_identity(loaded.profile, identity_of(context), what="the target")
    except ProfileError as exc:
        raise ContextUnavailableError(f"profile {loaded.source}: {exc}") from None
    return with_anchors(CalibrationState(), observations(loaded.profile, at_s=now_s))


def _profile_age_error(spec: TargetSpec, now_s: float) -> str | None:
    if spec.profile is None:
        return None
    try:
        check_age(spec.profile.profile, now_s=now_s, max_age_s=spec.profile_max_age_s)
    except ProfileError as exc:
        return f"profile {spec.profile.source}: {exc}"
    return None


def engine_activity(evidence: Evidence, context: ModelContext | None) -> dict[str, float]:
    """Saturation ratios from vLLM's own per-GPU roofline counters over the hardware's peaks (empty without them).

    Example: 395e12 FLOP/s achieved on an H100 SXM (989.4e12 bf16 peak) -> tensor_active 0.40.
    """
    if context is None:
        return {}
    hardware = context.hardware
    activity: dict[str, float] = {}
    if evidence.achieved_flops_per_s is not None:
        peak = hardware.flops_for_dtype(context.model.dtype_bytes)
        activity["tensor_active"] = evidence.achieved_flops_per_s / peak
    if evidence.achieved_read_bytes_per_s is not None:
        activity["dram_active"] = evidence.achieved_read_bytes_per_s / hardware.mem_bandwidth_bytes_per_s
    return activity


def _profiles(context: ModelContext) -> dict[str, str]:
    return {
        "hardware": context.hardware.name,
        "model": context.model.name,
        "drafter": context.drafter.method.value,
        "tensor_parallel": str(context.tensor_parallel),
    }


def _pick_model(snapshots: Mapping[str, EngineSnapshot], wanted: str | None) -> EngineSnapshot:
    served = ", ".join(sorted(snapshots)) or "none"
    if set(snapshots) == {UNNAMED_MODEL}:  # llama.cpp names no model: the target's setting names it
        return replace(snapshots[UNNAMED_MODEL], model_name=wanted or UNNAMED_MODEL)
    if wanted is not None:
        snapshot = snapshots.get(wanted)
        if snapshot is None:
            raise ScrapeError(ScrapeErrorReason.MODEL_MISSING, f"model '{wanted}' is not served (served: {served})")
        return snapshot
    if len(snapshots) == 1:
        return next(iter(snapshots.values()))
    if not snapshots:
        raise ScrapeError(ScrapeErrorReason.MODEL_MISSING, "the page carries no engine series of a model")
    raise ScrapeError(
        ScrapeErrorReason.MODEL_MISSING, f"the server serves several models ({served}); set the target's model"
    )
