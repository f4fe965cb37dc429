"""The REST API: the Board as JSON, liveness/readiness, and the sidecar's own /metrics. OpenAPI at /docs.

Times on the wire are RFC 3339 UTC strings (`evaluated_at`) or ages in seconds (`age_s`). A target that has not
been evaluated yet is listed with null values and a reason rather than left out, so `?target=` answers 200 for
every configured target and 404 only for names that are not configured.

Until a target's first good scrape its recommendation values (`enabled`, `num_speculative_tokens`, the expected
speedups) and its measurements (`speculation_on`, `deployed_k`, `batch`...) are null even though the loop has
evaluated it: the decision it holds then only echoes defaults (off, gamma 0, speedup 1.0), and a client that
ignores `state` would read those as "turn speculation off". Null says "unknown" to every client.

The board changes once per loop interval while clients may poll far more often, so each target's JSON is rendered
once per board write (`Board.version`) and served as bytes; the routes still declare their `response_model`, so
the OpenAPI schema is unchanged, and the bytes are what pydantic renders for that model. The one time-dependent
field, `age_s`, is the last field of a recommendation: the cached bytes stop just before its value, which is
written per request (one float), so the age is exact at every request without re-rendering the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, TypeAdapter
from starlette.exceptions import HTTPException as StarletteHTTPException

from policies.types import AcceptanceEvidence, CurvePoint, DataState, GpuSnapshot, Why, WhyCode
from service.board import Board, BoardEntry
from service.exporter import MetricsPage
from service.http.audit import ControllerAuditsOut, audits_body

JSON_MEDIA_TYPE = "application/json"

# pydantic's own float rendering, so a patched-in age reads exactly as the model would have rendered it.
_FLOAT_JSON: TypeAdapter[float] = TypeAdapter(float)
_NULL_AGE_TAIL = b'"age_s":null}'


TargetQuery = Annotated[
    str | None,
    Query(min_length=1, max_length=64, description="Only this target (its configured name)."),
]


class ErrorBody(BaseModel):
    error: str = Field(description="Machine-readable error code.")
    detail: str | list[dict[str, object]] = Field(description="What was wrong with the request.")


class WhyOut(BaseModel):
    code: WhyCode = Field(description="One cause of the decision (a bounded set; policies/types.py WhyCode).")
    numbers: dict[str, float] = Field(
        description="The numbers it rests on: gammas (0 = off), gains as shares (0.04 = 4%), times in seconds."
    )


class CurvePointOut(BaseModel):
    gamma: int = Field(description="Draft tokens per step this option runs; 0 = plain decoding (speculation off).")
    speedup: float = Field(
        description="Predicted multiplier vs plain decoding at the observed batch and context, in the terms "
        "`objective` names (1.0 at gamma 0; above 1 = faster)."
    )
    speedup_low: float = Field(
        description="Low end of the speedup's 90% band (acceptance uncertainty and the cost model's own)."
    )
    speedup_high: float = Field(description="High end of the speedup's 90% band.")
    extrapolated: bool = Field(
        description="True when the point rests on acceptance positions that were not measured (gamma beyond the "
        "deployed k, or a prior): treat it with more caution."
    )
    extrapolated_share: float = Field(
        description="Share (0..1) of the expected accepted length resting on acceptance positions that were not "
        "measured (beyond the deployed k, or a prior); 0 = fully measured."
    )
    slo_share: float | None = Field(
        default=None,
        description="Under an ITL SLO (objective.itl_slo_s): the share (0.01..1) of this option's tokens predicted to "
        "meet it; the speedup is then in SLO goodput. null without an SLO.",
    )


_UNTIL_SCRAPED = "null until the target's first good scrape"


class RecommendationOut(BaseModel):
    target: str = Field(description="The target's configured name.")
    model: str | None = Field(
        description="The served model: as the engine reports it, else as configured; null when neither is known yet."
    )
    state: DataState = Field(
        description="How far the data behind this recommendation can be trusted: ok, insufficient_data (speculating "
        "with too few drafts in the window to trust the acceptance, or not evaluated yet), stale (no good scrape for a "
        "while) or error (no usable data)."
    )
    enabled: bool | None = Field(description=f"Should speculative decoding be on; {_UNTIL_SCRAPED}.")
    num_speculative_tokens: int | None = Field(description=f"Draft tokens per step, 0 when off; {_UNTIL_SCRAPED}.")
    expected_speedup: float | None = Field(
        description=f"Predicted throughput multiplier vs plain decoding; {_UNTIL_SCRAPED}."
    )
    expected_speedup_low: float | None = Field(description=f"Low end of the speedup band; {_UNTIL_SCRAPED}.")
    expected_speedup_high: float | None = Field(description=f"High end of the speedup band; {_UNTIL_SCRAPED}.")
    summary: str = Field(description="The decision in one sentence (at most 120 characters) for an operator.")
    why: list[WhyOut] = Field(description="The causes the summary is made of, with their numbers.")
    reason: str = Field(description="The full arithmetic of the decision, clause by clause ('; ').")
    evaluated_at: str | None = Field(description="RFC 3339 UTC time of this evaluation.")
    curve: list[CurvePointOut] = Field(
        description="Predicted speedup for each draft-token count from 0 up, the options the recommendation chose "
        "from; empty when none was evaluated this time (not evaluated yet, or the evidence was not ok)."
    )
    objective: str = Field(
        description="What the curve's speedups measure: latency (tokens/s per sequence), capacity (the server's "
        "tokens/s while requests queue) or goodput_slo (tokens/s meeting the ITL SLO); empty when no curve was "
        "evaluated this time (the evidence was not ok)."
    )
    calibration_error_ratio: float | None = Field(
        description="The cost model's online calibration error: median |predicted / observed step time - 1| over "
        "recent windows; null before any step time was observed."
    )
    # Must stay the last field: its value is written per request after the cached rest (module docstring).
    age_s: float | None = Field(description="Seconds since the recommendation last rested on a good scrape.")


class RecommendationsOut(BaseModel):
    targets: list[RecommendationOut] = Field(
        description="One recommendation per configured target (only the one asked for with ?target=)."
    )


class AcceptanceOut(BaseModel):
    per_position: list[float] = Field(
        description="r_i = P(at least i drafts accepted) for i = 1..deployed k, ratios 0..1, non-increasing "
        "(vLLM per-position accepted counts / drafts over the window; where positions_measured is false, the "
        "i.i.d. profile alpha^i whose sum is the measured mean accepted drafts)."
    )
    positions_measured: bool = Field(
        default=True,
        description="True where the engine counts acceptance per position (vLLM, TensorRT-LLM, llama.cpp); false "
        "where it counts only the accepted total (SGLang): per_position is then a fit, exact only in its sum, and "
        "every gamma but the deployed k is priced as an extrapolation.",
    )
    per_position_low: list[float] = Field(
        description="Low end of each position's Wilson confidence interval (95% by default, estimator.z), 0..1."
    )
    per_position_high: list[float] = Field(
        description="High end of each position's Wilson confidence interval, 0..1."
    )
    mean_acceptance_length: float = Field(
        description="Tokens emitted per verification, bonus token included: 1 + accepted / drafts, in 1..k+1."
    )
    acceptance_rate: float = Field(
        description="Accepted / proposed draft tokens, ratio 0..1: the number vLLM users quote (it averages over "
        "positions)."
    )
    drafts: float = Field(
        description="Drafts (verifications) the acceptance rests on, a count; too few makes the state "
        "insufficient_data."
    )
    mean_proposed_length: float = Field(
        description="Draft tokens proposed per draft, tokens (at most k; an n-gram/suffix drafter may propose fewer)."
    )
    draft_coverage: float = Field(
        description="Share of decoding sequence-steps that carried a draft (n-gram/suffix draft only on a match)."
    )
    cold_start: bool = Field(
        description="True when measured over the engine's lifetime counters (first scrape, or a window still too "
        "young and thin) rather than over the window."
    )


_NO_ACTIVITY = "null without GPM (NVML) or DCGM profiling fields"


class GpuOut(BaseModel):
    source: str = Field(
        description="Where the GPU telemetry comes from: nvml, dcgm, or absent (none configured or found: not a "
        "failure)."
    )
    device_name: str | None = Field(description="GPU model name as the driver reports it; null when unknown.")
    device_count: int = Field(description="GPUs read, a count; 0 when absent.")
    gpu_util_ratio: float | None = Field(
        description="Share of time a kernel was running, 0..1, mean over GPUs (NVML utilization / DCGM GPU_UTIL): "
        "says busy, not saturated; null when not read."
    )
    tensor_active_ratio: float | None = Field(
        description=f"Tensor-core saturation, 0..1, mean over GPUs; {_NO_ACTIVITY}."
    )
    dram_active_ratio: float | None = Field(
        description=f"Memory-bandwidth saturation, 0..1, mean over GPUs; {_NO_ACTIVITY}."
    )
    sm_active_ratio: float | None = Field(
        description=f"Share of time the SMs had work, 0..1, mean over GPUs; {_NO_ACTIVITY}."
    )
    memory_used_bytes: float | None = Field(
        description="GPU memory in use, bytes, summed over GPUs; null when not read."
    )
    memory_total_bytes: float | None = Field(
        description="GPU memory in all, bytes, summed over GPUs; null when not read."
    )
    activity_source: str | None = Field(
        description="Where the saturation ratios come from: gpm or dcgm; null when there are none."
    )
    error: str | None = Field(description="Why the last GPU read failed ('reason: detail'); null when it worked.")


class EvidenceOut(BaseModel):
    target: str = Field(description="The target's configured name.")
    model: str | None = Field(
        description="The served model: as the engine reports it, else as configured; null when neither is known yet."
    )
    state: DataState = Field(
        description="How far this evidence can be trusted: ok, insufficient_data (speculating with too few drafts in "
        "the window to trust the acceptance, or not evaluated yet), stale (no good scrape for a while) or error (no "
        "usable data)."
    )
    reason: str = Field(
        description="Why the state is what it is, with the numbers (or the last scrape error before any evaluation)."
    )
    speculation_on: bool | None = Field(description=f"Whether the engine runs speculation now; {_UNTIL_SCRAPED}.")
    deployed_k: int | None = Field(description=f"Draft tokens per step the engine runs now; {_UNTIL_SCRAPED}.")
    acceptance: AcceptanceOut | None = Field(
        description="Measured draft acceptance; null when speculation is off or nothing was measured, and "
        f"{_UNTIL_SCRAPED}."
    )
    batch: float | None = Field(description=f"Running requests, mean over the window; {_UNTIL_SCRAPED}.")
    waiting: float | None = Field(description=f"Queued requests, mean over the window; {_UNTIL_SCRAPED}.")
    kv_cache_usage_ratio: float | None = Field(
        description="Share of the engine's KV cache in use at the newest scrape, 0..1; null when not exported, and "
        f"{_UNTIL_SCRAPED}."
    )
    context_tokens_per_seq: float | None = Field(
        description="KV tokens in use per running request at the newest scrape, tokens: the context the cost model "
        "prices; null when not measurable (KV not exported, too few running requests)."
    )
    step_time_s: float | None = Field(
        description="Mean engine step time over the window, seconds (vLLM inter-token latency sum / count); null "
        "when no step was measured."
    )
    prefill_tokens_per_step: float | None = Field(
        description="Prompt tokens computed per engine step on average (chunked prefill shares steps with decode)."
    )
    prompt_tokens_per_request: float | None = Field(
        default=None,
        description="Prompt tokens computed per prefilled request over the window (prompt tokens / time-to-first-"
        "token count): the chunk a prompt arrives in; a MoE's expert bytes are priced per step from it.",
    )
    decode_seqs_per_step: float | None = Field(
        default=None,
        description="Sequences each engine step decoded, mean over the window's steps: the batch the cost model "
        "prices (the running-requests mean also counts idle time and requests still prefilling).",
    )
    engines: int | None = Field(default=None, description="Data-parallel engines summed in this evidence.")
    window_s: float | None = Field(
        description=f"Seconds the window's counter deltas span (oldest to newest kept scrape); {_UNTIL_SCRAPED}."
    )
    gpu: GpuOut | None = Field(
        description="GPU telemetry read on this machine at the last evaluation; null until the target is evaluated."
    )
    engine_activity: dict[str, float] = Field(
        description="Saturation 0..1 from vLLM's estimated_flops/read_bytes_per_gpu counters over the hardware peaks."
    )
    profiles: dict[str, str] = Field(description="Cost-model profiles in use (hardware, model, drafter, TP).")
    calibration_error_ratio: float | None = Field(
        description="The cost model's calibration error against the measured step times (as in the recommendation)."
    )
    last_good_scrape_at: str | None = Field(
        description="RFC 3339 UTC time of the last successful scrape; null when none succeeded yet."
    )
    last_error: str | None = Field(
        description="The latest scrape or evaluation failure ('reason: detail'); null once a scrape succeeds again."
    )
    scrape_errors: dict[str, int] = Field(
        description="Failed scrapes since start-up by reason (timeout, connect, http_status, parse, ..., internal), "
        "counts."
    )


class EvidencesOut(BaseModel):
    targets: list[EvidenceOut] = Field(
        description="One evidence record per configured target (only the one asked for with ?target=)."
    )


class HealthOut(BaseModel):
    status: str = Field(description="ok or stalled (/healthz); ready or not_ready (/readyz).")
    detail: str = Field(description="Why, for people: e.g. how long ago the last loop iteration finished.")


@dataclass(frozen=True, slots=True)
class ApiExtensions:
    """What the caller adds to the built-in API: a lifespan (what runs around serving, e.g. the advisor loop) and
    routers included after the built-in routes (more endpoints, e.g. what-if, without touching this module); they
    share its JSON error bodies."""

    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None
    routers: Sequence[APIRouter] = ()


def create_api(
    board: Board,
    *,
    metrics: MetricsPage,
    clock: Callable[[], float],
    stall_after_s: float,
    version: str,
    extensions: ApiExtensions = ApiExtensions(),
) -> FastAPI:
    """The FastAPI app over `board`, with `extensions` added. `clock` gives Unix seconds for ages and the liveness
    check; /healthz fails when no iteration finished within `stall_after_s` seconds.
    """
    app = FastAPI(
        title="spec-advisor",
        version=version,
        description="Should speculative decoding be on, and with how many draft tokens.",
        lifespan=extensions.lifespan,
    )
    _install_error_handlers(app)
    bodies = BoardBodies(board)

    def selected(target: str | None) -> Sequence[BoardEntry]:
        if target is None:
            return board.statuses()
        status = board.get(target)
        if status is None:
            known = ", ".join(board.target_names)
            raise HTTPException(status_code=404, detail=f"unknown target '{target}' (configured: {known})")
        return (status,)

    @app.get(
        "/v1/recommendation",
        response_model=RecommendationsOut,
        responses={404: {"model": ErrorBody}, 422: {"model": ErrorBody}},
    )
    async def recommendation(target: TargetQuery = None) -> Response:
        """The latest recommendation per target, with its predicted speedup curve."""
        body = bodies.recommendations(selected(target), now_s=clock())
        return Response(content=body, media_type=JSON_MEDIA_TYPE)

    @app.get(
        "/v1/evidence", response_model=EvidencesOut, responses={404: {"model": ErrorBody}, 422: {"model": ErrorBody}}
    )
    async def evidence(target: TargetQuery = None) -> Response:
        """What was measured per target: acceptance, batch, step time, GPU, freshness."""
        return Response(content=bodies.evidence(selected(target)), media_type=JSON_MEDIA_TYPE)

    @app.get(
        "/v1/audit", response_model=ControllerAuditsOut,
        responses={404: {"model": ErrorBody}, 422: {"model": ErrorBody}},
    )
    async def audit(target: TargetQuery = None) -> ControllerAuditsOut:
        """The engine's own speculation controller (vLLM adaptive verification or Dynamic SD, TensorRT-LLM's
        draft_len_schedule) judged against the best static k, with what to do when it is worse."""
        return audits_body(selected(target))

    @app.get("/healthz", response_model=HealthOut, responses={503: {"model": HealthOut}})
    async def healthz() -> Response:
        """200 while the loop makes progress; 503 when no iteration finished within the stall limit."""
        now_s = clock()
        last = board.last_iteration_s
        if board.is_live(now_s, stall_after_s=stall_after_s):
            detail = "no iteration yet" if last is None else f"last iteration {now_s - last:.1f} s ago"
            return _json(200, HealthOut(status="ok", detail=detail))
        since = "start-up" if last is None else "the last iteration"
        detail = f"no iteration finished for {stall_after_s:g} s since {since}"
        return _json(503, HealthOut(status="stalled", detail=detail))

    @app.get("/readyz", response_model=HealthOut, responses={503: {"model": HealthOut}})
    async def readyz() -> Response:
        """200 once any target had a good scrape (one dead target does not take the others' advice offline)."""
        if board.is_ready():
            return _json(200, HealthOut(status="ready", detail="at least one target scraped"))
        return _json(503, HealthOut(status="not_ready", detail="no target has been scraped successfully yet"))

    @app.get("/metrics", response_class=Response, include_in_schema=True)
    async def metrics_page() -> Response:
        """The sidecar's own metrics in the Prometheus text format."""
        return Response(content=metrics.render(), media_type=metrics.content_type)

    for router in extensions.routers:
        app.include_router(router)
    return app


@dataclass(frozen=True, slots=True)
class _RenderedRecommendation:
    # The target's RecommendationOut as JSON: whole when age_s is null, else up to and including '"age_s":'.
    head: bytes
    last_good_decision_s: float | None

    def at(self, now_s: float) -> bytes:
        if self.last_good_decision_s is None:
            return self.head
        return self.head + _FLOAT_JSON.dump_json(max(0.0, now_s - self.last_good_decision_s)) + b"}"


class BoardBodies:
    """The /v1/recommendation and /v1/evidence bodies as JSON bytes, rendered per target at most once per board
    version. Entries exist only for configured targets, so the cache is as small as the board.
    """

    def __init__(self, board: Board) -> None:
        self._board = board
        self._version = -1
        self._recommendations: dict[str, _RenderedRecommendation] = {}
        self._evidence: dict[str, bytes] = {}

    def recommendations(self, statuses: Sequence[BoardEntry], *, now_s: float) -> bytes:
        """`RecommendationsOut` for `statuses` (read from the board just before, with no await in between)."""
        self._drop_if_outdated()
        parts: list[bytes] = []
        for status in statuses:
            rendered = self._recommendations.get(status.target)
            if rendered is None:
                rendered = self._recommendations[status.target] = _render_recommendation(status)
            parts.append(rendered.at(now_s))
        return _targets_envelope(parts)

    def evidence(self, statuses: Sequence[BoardEntry]) -> bytes:
        """`EvidencesOut` for `statuses` (read from the board just before, with no await in between)."""
        self._drop_if_outdated()
        parts: list[bytes] = []
        for status in statuses:
            rendered = self._evidence.get(status.target)
            if rendered is None:
                rendered = self._evidence[status.target] = _evidence(status).model_dump_json().encode()
            parts.append(rendered)
        return _targets_envelope(parts)

    def _drop_if_outdated(self) -> None:
        if self._board.version != self._version:
            self._recommendations.clear()
            self._evidence.clear()
            self._version = self._board.version


def _targets_envelope(parts: Sequence[bytes]) -> bytes:
    # Byte-for-byte what pydantic renders for `{"targets": [...]}` (compact separators).
    return b'{"targets":[' + b",".join(parts) + b"]}"


def _render_recommendation(status: BoardEntry) -> _RenderedRecommendation:
    last_good = status.last_good_decision_s if status.decision is not None else None
    body = _recommendation(status, age_s=None).model_dump_json().encode()
    if last_good is None:
        return _RenderedRecommendation(head=body, last_good_decision_s=None)
    if not body.endswith(_NULL_AGE_TAIL):
        raise AssertionError("age_s must stay the last field of RecommendationOut: its value is patched in per request")
    return _RenderedRecommendation(head=body[: -len(b"null}")], last_good_decision_s=last_good)


def rfc3339(epoch_s: float) -> str:
    """Unix seconds -> '2024-05-01T12:00:00.250Z' (UTC, millisecond precision)."""
    return datetime.fromtimestamp(epoch_s, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _recommendation(status: BoardEntry, *, age_s: float | None) -> RecommendationOut:
    decision = status.decision
    if decision is None:
        return RecommendationOut(
            target=status.target,
            model=status.model,
            state=DataState.INSUFFICIENT_DATA,
            enabled=None,
            num_speculative_tokens=None,
            expected_speedup=None,
            expected_speedup_low=None,
            expected_speedup_high=None,
            summary="Not evaluated yet: no good scrape of this target so far.",
            why=[],
            reason=status.last_error or "not evaluated yet",
            evaluated_at=None,
            curve=[],
            objective="",
            calibration_error_ratio=None,
            age_s=None,
        )
    known = status.last_good_scrape_s is not None  # else the decision only echoes defaults (module docstring)
    return RecommendationOut(
        target=status.target,
        model=decision.model or status.model,
        state=decision.state,
        enabled=decision.enabled if known else None,
        num_speculative_tokens=decision.num_speculative_tokens if known else None,
        expected_speedup=decision.expected_speedup if known else None,
        expected_speedup_low=decision.expected_speedup_low if known else None,
        expected_speedup_high=decision.expected_speedup_high if known else None,
        summary=decision.summary,
        why=[_why(why) for why in decision.why],
        reason=decision.reason,
        evaluated_at=rfc3339(decision.evaluated_at_s),
        curve=[_point(point) for point in decision.curve],
        objective=decision.objective,
        calibration_error_ratio=decision.calibration_error_ratio,
        age_s=age_s,
    )


def _why(why: Why) -> WhyOut:
    # JSON has no inf or NaN: a number that is not finite (a gain against a running k past the curve) is left out.
    return WhyOut(code=why.code, numbers={name: value for name, value in why.numbers if math.isfinite(value)})


def _point(point: CurvePoint) -> CurvePointOut:
    return CurvePointOut(
        gamma=point.gamma,
        speedup=point.speedup,
        speedup_low=point.speedup_low,
        speedup_high=point.speedup_high,
        extrapolated=point.extrapolated,
        extrapolated_share=point.extrapolated_share,
        slo_share=point.slo_share,
    )


def _acceptance(acceptance: AcceptanceEvidence) -> AcceptanceOut:
    return AcceptanceOut(
        per_position=list(acceptance.per_position),
        per_position_low=list(acceptance.per_position_low),
        per_position_high=list(acceptance.per_position_high),
        mean_acceptance_length=acceptance.mean_acceptance_length,
        acceptance_rate=acceptance.acceptance_rate,
        drafts=acceptance.drafts,
        mean_proposed_length=acceptance.mean_proposed_length,
        draft_coverage=acceptance.draft_coverage,
        positions_measured=acceptance.positions_measured,
        cold_start=acceptance.cold_start,
    )


def _gpu(gpu: GpuSnapshot) -> GpuOut:
    return GpuOut(
        source=gpu.source,
        device_name=gpu.device_name,
        device_count=gpu.device_count,
        gpu_util_ratio=gpu.gpu_util_ratio,
        tensor_active_ratio=gpu.tensor_active_ratio,
        dram_active_ratio=gpu.dram_active_ratio,
        sm_active_ratio=gpu.sm_active_ratio,
        memory_used_bytes=gpu.memory_used_bytes,
        memory_total_bytes=gpu.memory_total_bytes,
        activity_source=gpu.activity_source,
        error=gpu.error,
    )


def _evidence(status: BoardEntry) -> EvidenceOut:
    evidence = status.evidence
    last_good = None if status.last_good_scrape_s is None else rfc3339(status.last_good_scrape_s)
    if evidence is None:
        return EvidenceOut(
            target=status.target,
            model=status.model,
            state=DataState.INSUFFICIENT_DATA,
            reason=status.last_error or "not evaluated yet",
            speculation_on=None,
            deployed_k=None,
            acceptance=None,
            batch=None,
            waiting=None,
            kv_cache_usage_ratio=None,
            context_tokens_per_seq=None,
            step_time_s=None,
            prefill_tokens_per_step=None,
            window_s=None,
            gpu=None,
            engine_activity={},
            profiles=dict(status.profiles),
            calibration_error_ratio=None,
            last_good_scrape_at=last_good,
            last_error=status.last_error,
            scrape_errors=dict(status.scrape_errors),
        )
    if status.last_good_scrape_s is None:
        # Evaluated, but never measured: the engine fields are the estimator's defaults (module docstring).
        return EvidenceOut(
            target=status.target,
            model=evidence.model or status.model,
            state=evidence.state,
            reason=evidence.reason,
            speculation_on=None,
            deployed_k=None,
            acceptance=None,
            batch=None,
            waiting=None,
            kv_cache_usage_ratio=None,
            context_tokens_per_seq=None,
            step_time_s=None,
            prefill_tokens_per_step=None,
            window_s=None,
            gpu=None if evidence.gpu is None else _gpu(evidence.gpu),  # read by the GPU probe, not the scrape
            engine_activity=dict(status.engine_activity),
            profiles=dict(status.profiles),
            calibration_error_ratio=None,
            last_good_scrape_at=None,
            last_error=status.last_error,
            scrape_errors=dict(status.scrape_errors),
        )
    return EvidenceOut(
        target=status.target,
        model=evidence.model or status.model,
        state=evidence.state,
        reason=evidence.reason,
        speculation_on=evidence.speculation_on,
        deployed_k=evidence.deployed_k,
        acceptance=None if evidence.acceptance is None else _acceptance(evidence.acceptance),
        batch=evidence.batch,
        waiting=evidence.waiting,
        kv_cache_usage_ratio=evidence.kv_cache_usage_ratio,
        context_tokens_per_seq=evidence.context_tokens_per_seq,
        step_time_s=evidence.step_time_s,
        prefill_tokens_per_step=evidence.prefill_tokens_per_step,
        prompt_tokens_per_request=evidence.prompt_tokens_per_request,
        decode_seqs_per_step=evidence.decode_seqs_per_step,
        engines=evidence.engines,
        window_s=evidence.window_s,
        gpu=None if evidence.gpu is None else _gpu(evidence.gpu),
        engine_activity=dict(status.engine_activity),
        profiles=dict(status.profiles),
        calibration_error_ratio=status.decision.calibration_error_ratio if status.decision is not None else None,
        last_good_scrape_at=last_good,
        last_error=status.last_error,
        scrape_errors=dict(status.scrape_errors),
    )


def _json(status_code: int, body: BaseModel) -> Response:
    return JSONResponse(status_code=status_code, content=body.model_dump(mode="json"))


def _install_error_handlers(app: FastAPI) -> None:
    # Every client error is JSON with the same two keys, including 404s for unknown paths and 405s.
    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        body = ErrorBody(error=code, detail=str(exc.detail))
        return JSONResponse(status_code=exc.status_code, content=body.model_dump(mode="json"), headers=exc.headers)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems: list[dict[str, object]] = [
            {"loc": list(error.get("loc", ())), "msg": str(error.get("msg", ""))} for error in exc.errors()
        ]
        body = ErrorBody(error="invalid_request", detail=problems)
        return JSONResponse(status_code=422, content=body.model_dump(mode="json"))

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
