"""`POST /v1/whatif` (price a hypothetical workload) and `GET /v1/schedule` (engine-native per-batch schedules for
the live targets), as one APIRouter the app includes; the wire models are shared with `spec-advisor whatif` and
`spec-advisor schedule`.

Bad input is always a 4xx, never a 500: a body over `max_body_bytes` is a 413 (checked while reading, before
parsing); wrong types, unknown fields, out-of-range numbers and work limits (list lengths, points per request) are a
422 whose `loc` names the field and whose `msg` says the limit; an unknown GPU or model is a 422 naming the field
and the known names. The pure model (policies/offline/whatif.py, policies/offline/schedule.py) is the authority on the
semantic limits; the pydantic bounds below repeat them so OpenAPI documents them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, HTTPException, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from policies.model.costmodel import ModelContext
from policies.model.kv_capacity import VLLM_GPU_MEMORY_UTILIZATION
from policies.model.measured_profile import MeasuredProfile
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.model.roofline import CostScales
from policies.offline.schedule import (
    MAX_NUM_SEQS_LIMIT,
    BatchSchedule,
    ScheduleAsk,
    ScheduleInputs,
    engine_max_num_seqs,
    inputs_from_evidence,
    schedule_for,
    sglang_adaptive_config,
    trtllm_schedule,
    vllm_speculative_config,
)
from policies.offline.whatif import (
    GAMMA_LIMIT,
    MAX_BATCH,
    MAX_BATCH_SIZES,
    MAX_BATCHED_TOKENS,
    MAX_CONTEXT_LENGTHS,
    MAX_CONTEXT_TOKENS,
    MAX_POINTS,
    MAX_PREFILL_TOKENS_PER_STEP,
    MAX_TENSOR_PARALLEL,
    MAX_TREE_TOKENS,
    AcceptanceSpec,
    WhatIfInput,
    WhatIfInputError,
    WhatIfResult,
    evaluate_whatif,
)
from policies.types import DataState, DraftMethod, Evidence
from service.board import Board
from service.http.bounded import bounded_route

DEFAULT_MAX_BODY_BYTES = 256 * 1024  # an inline config.json is a few KB; this leaves room and bounds the parse
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs on most GPUs: pass yours
DEFAULT_GAMMA_MAX = 8

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
BatchSize = Annotated[float, Field(ge=1.0, le=MAX_BATCH)]
ContextLength = Annotated[float, Field(ge=0.0, le=MAX_CONTEXT_TOKENS)]
Gamma = Annotated[int, Field(ge=0, le=GAMMA_LIMIT, strict=True)]
ModelName = Annotated[str, Field(min_length=1, max_length=200)]


class _Strict(BaseModel):
    # Unknown fields are typos that would silently change the answer; NaN/Infinity are not numbers to price.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DrafterIn(_Strict):
    method: DraftMethod = Field(description="How drafts are produced: ngram, suffix, eagle, eagle3, mtp, draft_model.")
    draft_model: ModelName | dict[str, Any] | None = Field(
        default=None, description="Only for method draft_model: a catalog model name or its inline config.json."
    )
    tree_tokens: int | None = Field(
        default=None, ge=1, le=MAX_TREE_TOKENS, strict=True,
        description="A tree drafter's draft tokens per sequence per step (SGLang --speculative-num-draft-tokens "
        "minus 1); gammas are then the tree's depth. None: a chain of gamma drafts.",
    )
    tensor_parallel: int | None = Field(
        default=None, ge=1, le=MAX_TENSOR_PARALLEL, strict=True,
        description="Only for method draft_model: the GPUs the draft model runs on (vLLM draft_tensor_parallel_size, "
        "1 or the target's tensor_parallel). None: the target's degree.",
    )


class AcceptanceIn(_Strict):
    """Exactly one of per_position, mean_acceptance_length (+ measured_at_k), iid_rate."""

    per_position: list[Probability] | None = Field(
        default=None, min_length=1, max_length=GAMMA_LIMIT,
        description="r_i = P(at least i drafts accepted), i = 1..k, non-increasing (vLLM per-position counters / "
        "drafts).",
    )
    mean_acceptance_length: float | None = Field(
        default=None, ge=1.0, le=GAMMA_LIMIT + 1.0,
        description="Mean tokens per verification incl. the bonus token (vLLM: 1 + accepted / drafts).",
    )
    measured_at_k: int | None = Field(
        default=None, ge=1, le=GAMMA_LIMIT, strict=True, description="The k the mean acceptance length was measured at."
    )
    iid_rate: Probability | None = Field(
        default=None, description="Per-token i.i.d. acceptance alpha (Leviathan et al.), not vLLM's acceptance rate."
    )
    draft_coverage: float = Field(
        default=1.0, gt=0.0, le=1.0,
        description="Share of sequence-steps that carry a draft (an n-gram/suffix drafter drafts only where the "
        "context matches; the sidecar's /v1/evidence reports it). 1 for EAGLE/MTP/draft models.",
    )


class HardwareIn(_Strict):
    """A GPU the catalog lacks, by its datasheet numbers (dense tensor rates without sparsity)."""

    name: str = Field(min_length=1, max_length=64, description="A name for the GPU, echoed in the answer.")
    bf16_dense_tflops: float = Field(gt=0, le=1e6, description="Dense bf16 tensor rate per GPU, TFLOP/s.")
    mem_bandwidth_gbps: float = Field(gt=0, le=1e6, description="Memory bandwidth per GPU, GB/s.")
    memory_gb: float = Field(gt=0, le=1e5, description="Memory per GPU, GB: bounds the weights and KV that fit.")
    fp8_dense_tflops: float | None = Field(default=None, gt=0, le=1e6, description="None: fp8 at the bf16 rate.")
    interconnect_gbps_per_direction: float | None = Field(
        default=None, gt=0, le=1e5, description="GPU-to-GPU link per direction; None: PCIe Gen4 x16 (32 GB/s)."
    )


class WhatIfRequest(_Strict):
    """A hypothetical deployment and the grid to price it on."""

    hardware: Annotated[str, Field(min_length=1, max_length=64)] | HardwareIn = Field(
        description="Catalog hardware profile (e.g. h100-sxm), or the datasheet numbers of a GPU it lacks."
    )
    tensor_parallel: int = Field(
        default=1, ge=1, le=MAX_TENSOR_PARALLEL, strict=True,
        description="GPUs the target is sharded over (tensor-parallel degree); the all-reduce is priced.",
    )
    target_model: ModelName | dict[str, Any] = Field(
        description="Catalog model name / Hugging Face id, or the model's config.json as an object."
    )
    drafter: DrafterIn = Field(description="What produces the draft tokens; decides the drafting cost.")
    acceptance: AcceptanceIn = Field(
        description="How often drafts are accepted: exactly one of per_position, mean_acceptance_length (with "
        "measured_at_k) or iid_rate."
    )
    batch_sizes: list[BatchSize] = Field(
        default=[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0], min_length=1, max_length=MAX_BATCH_SIZES,
        description="Running sequences per step.",
    )
    context_lengths: list[ContextLength] = Field(
        default=[1024.0], min_length=1, max_length=MAX_CONTEXT_LENGTHS, description="Mean context per sequence."
    )
    gammas: list[Gamma] = Field(
        default=[0, 1, 2, 3, 4, 5, 6, 7, 8], min_length=1, max_length=GAMMA_LIMIT + 1,
        description=f"Draft tokens per step to price, 0..{GAMMA_LIMIT} (0 = speculation off).",
    )
    prefill_tokens_per_step: float = Field(
        default=0.0, ge=0.0, le=MAX_PREFILL_TOKENS_PER_STEP,
        description="Prompt tokens computed per step on average (chunked prefill); the same with and without "
        "speculation. Priced into every step, or in whole-prompt chunks with prompt_tokens.",
    )
    prompt_tokens: float | None = Field(
        default=None, gt=0.0, le=MAX_CONTEXT_TOKENS,
        description="Prompt tokens per request: the chunk a prefilling step carries (capped by what "
        "max_num_batched_tokens leaves beside the decode tokens), so a share prefill_tokens_per_step / chunk of the "
        "steps carry one and the rest none; a MoE's expert bytes are priced per step from it. Needs "
        "prefill_tokens_per_step > 0. None: every step carries prefill_tokens_per_step.",
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=MAX_BATCHED_TOKENS, strict=True,
        description="The engine's most tokens per step (vLLM's --max-num-batched-tokens): the step's prompt tokens "
        "and 1 + gamma per running sequence share it, so a step may hold fewer than the batch. None: unbounded.",
    )
    gpu_memory_utilization: float = Field(
        default=VLLM_GPU_MEMORY_UTILIZATION, gt=0.0, le=1.0,
        description="Share of each GPU's memory the engine may use for weights and KV (vLLM's flag, default 0.9).",
    )

    def to_input(self) -> WhatIfInput:
        acc = self.acceptance
        return WhatIfInput(
            hardware=self.hardware if isinstance(self.hardware, str) else self.hardware.model_dump(exclude_none=True),
            target_model=self.target_model,
            drafter_method=self.drafter.method,
            draft_model=self.drafter.draft_model,
            acceptance=AcceptanceSpec(
                per_position=None if acc.per_position is None else tuple(acc.per_position),
                mean_acceptance_length=acc.mean_acceptance_length,
                measured_at_k=acc.measured_at_k,
                iid_rate=acc.iid_rate,
                draft_coverage=acc.draft_coverage,
            ),
            batch_sizes=tuple(self.batch_sizes),
            context_lengths=tuple(self.context_lengths),
            gammas=tuple(self.gammas),
            tensor_parallel=self.tensor_parallel,
            prefill_tokens_per_step=self.prefill_tokens_per_step,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_batched_tokens=self.max_num_batched_tokens,
            prompt_tokens=self.prompt_tokens,
            tree_tokens=self.drafter.tree_tokens,
            draft_tensor_parallel=self.drafter.tensor_parallel,
        )


# ------------------------------------------------------------------------------------------------------------
# What-if answer
# ------------------------------------------------------------------------------------------------------------


class ProfilesOut(BaseModel):
    hardware: str = Field(description="The hardware profile priced (catalog name, or the name given with its numbers).")
    model: str = Field(description="The target model profile priced (its catalog or config.json name).")
    model_params: float = Field(description="The target's total parameters, a count (embeddings included).")
    model_active_params: float = Field(
        description="Parameters used per token, a count: equal to model_params for a dense model, fewer for MoE."
    )
    drafter_method: DraftMethod = Field(description="How drafts are produced.")
    drafter_params: float = Field(
        description="Weights one draft step streams, a count; 0 for host-side n-gram/suffix lookup."
    )
    tensor_parallel: int = Field(description="GPUs the target is sharded over.")
    sources: dict[str, str] = Field(
        description="Where each profile's numbers come from, in words, by key (hardware, model, drafter): a datasheet, "
        "a config.json, or operator-supplied numbers."
    )


class AcceptanceUsedOut(BaseModel):
    measured_positions: int = Field(description="Positions stated by the input; deeper ones are extrapolated.")
    expected_accepted_length: list[float] = Field(description="E[L](gamma) for gamma = 0..max(gammas).")
    extrapolated: list[bool] = Field(
        description="Per gamma = 0..max(gammas): true where E[L] rests on positions the input did not state."
    )


class PointOut(BaseModel):
    batch: float = Field(description="Running sequences, as asked (a step holds fewer where max_num_batched_tokens "
                         "binds).")
    context_tokens: float = Field(description="Mean context per sequence, tokens, as asked.")
    gamma: int = Field(description="Draft tokens per step; 0 = speculation off.")
    step_time_s: float = Field(
        description="Predicted time of one engine step (drafting + verification), seconds: the inter-token latency "
        "is this over expected_accepted_length. Where max_num_batched_tokens holds fewer than the batch a step, the "
        "time between one sequence's steps (the step over the share of the batch it holds)."
    )
    expected_accepted_length: float = Field(
        description="Tokens each sequence gains per step, bonus token included (E[L], 1 + c (E[L] - 1) with draft "
        "coverage c); 1 at gamma 0."
    )
    tokens_per_s_per_seq: float = Field(
        description="Predicted tokens/s per sequence: expected_accepted_length / step_time_s."
    )
    tokens_per_s_total: float = Field(description="Predicted tokens/s of the server: batch x tokens_per_s_per_seq.")
    speedup: float = Field(description="Tokens/s per sequence vs speculation off at the same batch and context.")
    speedup_low: float = Field(
        description="Low end of the speedup's 90% band (acceptance and cost-model uncertainty; notes say which)."
    )
    speedup_high: float = Field(description="High end of the speedup's 90% band.")
    extrapolated: bool = Field(description="True when the point rests on acceptance positions the input did not state.")
    extrapolated_share: float = Field(
        description="Share (0..1) of expected_accepted_length resting on positions the input did not state; 0 = "
        "fully stated."
    )
    fits_in_memory: bool = Field(description="Weights + KV (context + gamma per sequence) fit the memory budget.")
    max_batch_in_memory: float | None = Field(
        description="Most sequences whose KV fits at this context and gamma (0: the weights alone do not fit; "
        "null: no KV per sequence to bound it, e.g. context 0 with speculation off)."
    )


class BestOut(BaseModel):
    batch: float = Field(description="Running sequences per step, as asked.")
    context_tokens: float = Field(description="Mean context per sequence, tokens, as asked.")
    gamma: int = Field(description="Best gamma among those asked whose KV fits; 0 = leave speculation off.")
    speedup: float = Field(description="The best gamma's speedup vs speculation off (x; 1.0 when gamma is 0).")
    tokens_per_s_total: float = Field(description="Predicted tokens/s of the server at the best gamma.")
    fits_in_memory: bool = Field(
        description="False: no option asked fits this batch and context (then best is among all of them)."
    )


class CrossoverOut(BaseModel):
    context_tokens: float = Field(description="Mean context per sequence, tokens, as asked.")
    gamma: int = Field(description="Draft tokens per step (each gamma >= 1 asked).")
    batch: float | None = Field(description="Smallest batch with speedup <= 1; null = still > 1 at the search end.")
    helps_at_batch_1: bool = Field(description="Whether this gamma beats speculation off (speedup > 1) at batch 1.")
    searched_up_to_batch: float = Field(
        description="The largest batch searched, sequences: a null batch means the speedup is still above 1 there."
    )
    helps_between: list[tuple[float, float | None]] = Field(
        default_factory=list,
        description="Every batch range where speedup > 1, as [from, to] (to null = up to the search end); "
        "empty = this gamma never helps at this context. Long contexts can make it win only from some batch on.",
    )


class WhatIfResponse(BaseModel):
    profiles: ProfilesOut = Field(description="The cost-model profiles the answer was priced with, and their sources.")
    acceptance: AcceptanceUsedOut = Field(description="The acceptance curve used: E[L] per gamma, measured or not.")
    points: list[PointOut] = Field(description="Every (context, batch, gamma) asked, priced.")
    best: list[BestOut] = Field(description="The best gamma per (context, batch) asked.")
    crossovers: list[CrossoverOut] = Field(
        description="Per (context, gamma >= 1): the batch where the speedup falls to 1 and the batch ranges where "
        "it helps."
    )
    notes: list[str] = Field(
        description="Caveats in words: calibration, extrapolation, how the acceptance was read, memory misfits."
    )


def whatif_response(result: WhatIfResult) -> WhatIfResponse:
    """The wire form of a what-if result (JSON-safe: every number the model returns is finite)."""
    ctx = result.context
    return WhatIfResponse(
        profiles=ProfilesOut(
            hardware=ctx.hardware.name,
            model=ctx.model.name,
            model_params=ctx.model.params,
            model_active_params=ctx.model.active_params,
            drafter_method=ctx.drafter.method,
            drafter_params=ctx.drafter.params,
            tensor_parallel=ctx.tensor_parallel,
            sources={"hardware": ctx.hardware.source, "model": ctx.model.source, "drafter": ctx.drafter.source},
        ),
        acceptance=AcceptanceUsedOut(
            measured_positions=result.measured_positions,
            expected_accepted_length=[p.expected_length for p in result.acceptance],
            extrapolated=[p.extrapolated for p in result.acceptance],
        ),
        points=[PointOut.model_validate(p, from_attributes=True) for p in result.points],
        best=[BestOut.model_validate(b, from_attributes=True) for b in result.best],
        crossovers=[CrossoverOut.model_validate(c, from_attributes=True) for c in result.crossovers],
        notes=list(result.notes),
    )


def run_whatif(request: WhatIfRequest, profile: MeasuredProfile | None = None) -> WhatIfResponse:
    """Evaluate a validated request, calibrated on `profile` when given (a measured profile of the deployment);
    WhatIfInputError (naming the field) for what the model cannot price or a profile of another deployment."""
    return whatif_response(evaluate_whatif(request.to_input(), profile))


# ------------------------------------------------------------------------------------------------------------
# Schedule answer
# ------------------------------------------------------------------------------------------------------------


class BandOut(BaseModel):
    lo: int = Field(description="Smallest batch size (running sequences) of the band, inclusive.")
    hi: int = Field(description="Largest batch size (running sequences) of the band, inclusive.")
    num_speculative_tokens: int = Field(description="K for batch sizes lo..hi; 0 = no drafts.")
    speedup_at_lo: float = Field(description="vs speculation off; below 1 in a K=0 band (the schedule's overhead).")
    speedup_at_hi: float = Field(description="Speedup vs speculation off at batch size hi; below 1 in a K=0 band.")
    extrapolated: bool = Field(description="True when the band rests on acceptance beyond the deployed k.")


class VllmScheduleOut(BaseModel):
    speculative_config: dict[str, Any] | None = Field(
        description="Merge into the deployed --speculative-config (keep its model); null = turn speculation off."
    )
    cli: str | None = Field(description="The same as a --speculative-config argument; null = turn speculation off.")
    notes: list[str] = Field(description="Caveats in words: what to add before applying it, or why to turn it off.")


class SglangScheduleOut(BaseModel):
    adaptive_config: dict[str, Any] | None = Field(
        description="SGLang's --speculative-adaptive-config JSON (batch-size lower bound -> candidate_steps); null = "
        "turn speculation off."
    )
    cli: str | None = Field(description="The server flags that load it; null = turn speculation off.")
    notes: list[str] = Field(description="What to check before applying it, or why to turn speculation off.")


class TrtllmScheduleOut(BaseModel):
    speculative_config: dict[str, Any] | None = Field(
        description="Fields of TensorRT-LLM's speculative_config (DecodingBaseConfig); null = cannot express / off."
    )
    yaml: str | None = Field(description="The same as an extra_llm_api_options YAML fragment.")
    notes: list[str] = Field(description="What to check before applying it, or why it cannot be expressed.")


_NO_SCHEDULE = "null when no schedule was computed (see reason)"


class ScheduleOut(BaseModel):
    target: str = Field(description="The target's configured name.")
    model: str | None = Field(description="The served model; null when not known yet.")
    state: DataState = Field(
        description="How far the target's evidence can be trusted (as in /v1/evidence); error when the schedule could "
        "not be computed."
    )
    reason: str = Field(description="What the schedule rests on, or why there is none.")
    max_num_seqs: int = Field(description="The largest batch size covered: the request's max_num_seqs, sequences.")
    context_tokens: float | None = Field(
        description="Context per sequence priced, tokens: the observed one (1024 when unknown) or the request's "
        "context_tokens; null when no schedule was computed and none was given."
    )
    gamma_max: int = Field(description="The deepest K a band may use, draft tokens (k_max, else the configured one).")
    margin: float = Field(description="Share (0..1) a K >= 1 must gain over K = 0 to be chosen.")
    speculation_useful: bool | None = Field(
        description=f"False when no batch size gains from drafting: run without speculation; {_NO_SCHEDULE}."
    )
    bands: list[BandOut] = Field(
        description="Contiguous batch-size ranges covering 1..max_num_seqs with their K; empty when none was computed."
    )
    vllm: VllmScheduleOut | None = Field(description=f"The schedule as vLLM Dynamic SD configuration; {_NO_SCHEDULE}.")
    trtllm: TrtllmScheduleOut | None = Field(
        description=f"The schedule as TensorRT-LLM configuration; {_NO_SCHEDULE}."
    )
    sglang: SglangScheduleOut | None = Field(
        default=None, description=f"The schedule as SGLang adaptive-speculation configuration; {_NO_SCHEDULE}."
    )


class SchedulesOut(BaseModel):
    targets: list[ScheduleOut] = Field(
        description="One schedule per configured target (only the one asked for with ?target=)."
    )


def _band_value(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def schedule_out(
    *, target: str, model: str | None, state: DataState, reason: str, plan: ScheduleInputs
) -> ScheduleOut:
    """Compute and render both engines' schedules for `plan` (ValueError from the model for bad ranges)."""
    schedule = schedule_for(plan)
    method = plan.ctx.drafter.method
    return ScheduleOut(
        target=target,
        model=model,
        state=state,
        reason=reason,
        max_num_seqs=schedule.max_num_seqs,
        context_tokens=schedule.context_tokens,
        gamma_max=schedule.gamma_max,
        margin=schedule.margin,
        speculation_useful=schedule.speculation_useful,
        bands=[
            BandOut(
                lo=band.lo, hi=band.hi, num_speculative_tokens=band.gamma,
                speedup_at_lo=_band_value(band.speedup_at_lo), speedup_at_hi=_band_value(band.speedup_at_hi),
                extrapolated=band.extrapolated,
            )
            for band in schedule.bands
        ],
        vllm=_vllm_out(schedule, method),
        trtllm=_trtllm_out(plan, schedule),
        sglang=_sglang_out(schedule),
    )


def _sglang_out(schedule: BatchSchedule) -> SglangScheduleOut:
    config = sglang_adaptive_config(schedule)
    if config is None:
        return SglangScheduleOut(adaptive_config=None, cli=None,
                                 notes=["no batch size gains from drafting: run without --speculative-algorithm"])
    notes = [
        "save adaptive_config as a JSON file; keep --speculative-algorithm and the draft model you deploy",
        "SGLang pads a batch up to its next CUDA-graph size before choosing a tier: a batch just below a tier's key "
        "may already run that tier",
    ]
    if any(band.gamma == 0 for band in schedule.bands):
        notes.append("tiers of 0 steps need SGLang 0.5.23 or later (PR #23994)")
    cli = (f"--speculative-adaptive --speculative-adaptive-config adaptive.json --speculative-eagle-topk 1 "
           f"--speculative-num-steps {schedule.max_gamma}")
    return SglangScheduleOut(adaptive_config=config, cli=cli, notes=notes)


def _vllm_out(schedule: BatchSchedule, method: DraftMethod) -> VllmScheduleOut:
    config = vllm_speculative_config(schedule, method=method)
    if config is None:
        return VllmScheduleOut(
            speculative_config=None, cli=None,
            notes=["no batch size gains from drafting: remove --speculative-config (a K=0 schedule still costs "
                   "time per step: dynamic-sd-k0-overhead.csv)"],
        )
    notes = [
        "add your drafter's \"model\" (and any other keys you deploy with) to this JSON",
        "vLLM's Dynamic SD docs run it with VLLM_USE_V2_MODEL_RUNNER=0",
    ]
    if any(band.gamma == 0 for band in schedule.bands):
        notes.append("K=0 bands keep the speculative machinery on and cost time (dynamic-sd-k0-overhead.csv)")
    if any(band.extrapolated for band in schedule.bands):
        notes.append("some bands rest on acceptance beyond the deployed k (extrapolated)")
    return VllmScheduleOut(
        speculative_config=config, cli=f"--speculative-config '{json.dumps(config, separators=(', ', ': '))}'",
        notes=notes,
    )


def _trtllm_out(plan: ScheduleInputs, schedule: BatchSchedule) -> TrtllmScheduleOut:
    trt = trtllm_schedule(plan, schedule)
    if trt is None:
        why = (
            "no batch size gains from drafting: run without speculative_config"
            if not schedule.speculation_useful
            else "the best schedule is off at batch 1 and drafts later; TRT-LLM's smallest key must carry "
            "max_draft_len > 0"
        )
        return TrtllmScheduleOut(speculative_config=None, yaml=None, notes=[why])
    config: dict[str, Any] = {"max_draft_len": trt.max_draft_len}
    if trt.draft_len_schedule is not None:
        config["draft_len_schedule"] = dict(trt.draft_len_schedule)
    if trt.max_concurrency is not None:
        config["max_concurrency"] = trt.max_concurrency
    notes = [*trt.notes, "merge into speculative_config (keep decoding_type and speculative_model)"]
    text = yaml.safe_dump({"speculative_config": config}, sort_keys=False, default_flow_style=False)
    return TrtllmScheduleOut(speculative_config=config, yaml=text, notes=notes)


def schedule_text(out: ScheduleOut) -> str:
    """A human rendering of one target's schedule: the bands, then the two fragments ready to paste."""
    lines = [f"target {out.target} ({out.model or 'model unknown'}): state {out.state.value}"]
    if out.reason:
        lines.append(f"  {out.reason}")
    if not out.bands:
        return "\n".join(lines) + "\n"
    lines.append(
        f"  context {out.context_tokens:g} tokens/seq, batch 1..{out.max_num_seqs}, K <= {out.gamma_max}, "
        f"margin {out.margin:g}"
    )
    lines.append("  batch        K   speedup vs off (at lo .. at hi)")
    for band in out.bands:
        flag = "  (extrapolated)" if band.extrapolated else ""
        lines.append(
            f"  {band.lo:>5}-{band.hi:<5} {band.num_speculative_tokens:>2}   "
            f"{band.speedup_at_lo:.2f} .. {band.speedup_at_hi:.2f}{flag}"
        )
    for engine, cli, body, notes in (
        ("vLLM", out.vllm.cli if out.vllm else None, None, out.vllm.notes if out.vllm else []),
        ("TensorRT-LLM", None, out.trtllm.yaml if out.trtllm else None, out.trtllm.notes if out.trtllm else []),
        ("SGLang", out.sglang.cli if out.sglang else None,
         json.dumps(out.sglang.adaptive_config) if out.sglang and out.sglang.adaptive_config else None,
         out.sglang.notes if out.sglang else []),
    ):
        lines.append("")
        lines.append(f"{engine}:")
        if cli:
            lines.append(f"  {cli}")
        if body:
            lines.extend(f"  {line}" for line in body.rstrip().splitlines())
        lines.extend(f"  # {note}" for note in notes)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------------
# Live targets (what /v1/schedule reads)
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LiveTarget:
    """One configured target as the schedule endpoint needs it: its latest evidence and the cost model's
    profiles; `reason` says why either is missing."""

    name: str
    model: str | None
    evidence: Evidence | None
    context: ModelContext | None
    reason: str = ""
    # The scales the target's decision priced with (the board's calibration); None before its first fit.
    scales: CostScales | None = None


LiveTargets = Callable[[], Sequence[LiveTarget]]


def live_targets_from_board(
    board: Board, *, context_for: Callable[[str], ModelContext | None] | None = None
) -> LiveTargets:
    """Read the board's latest evidence per target; profiles from `context_for(target)` when given (the loop's
    resolved ModelContext, exact), else re-resolved from the board's profile names (catalog names only: a target
    whose model came from a config.json or whose drafter is a separate draft model is reported, not guessed).
    """

    def read() -> list[LiveTarget]:
        targets: list[LiveTarget] = []
        for status in board.statuses():
            context = context_for(status.target) if context_for is not None else None
            reason = ""
            if context is None:
                context, reason = _context_from_names(status.profiles)
            if status.evidence is None:
                reason = status.last_error or "not evaluated yet"
            scales = status.calibration.scales if status.calibration is not None else None
            targets.append(LiveTarget(status.target, status.model, status.evidence, context, reason, scales))
        return targets

    return read


def _context_from_names(profiles: Mapping[str, str]) -> tuple[ModelContext | None, str]:
    if not profiles:
        return None, "no cost-model profiles yet (the target has not been evaluated)"
    try:
        model = model_by_name(str(profiles["model"]))
        method = DraftMethod(str(profiles["drafter"]))
        return ModelContext(
            hardware=hardware_by_name(str(profiles["hardware"])),
            model=model,
            drafter=drafter_for(method, model),
            tensor_parallel=int(profiles.get("tensor_parallel", "1")),
        ), ""
    except (KeyError, ValueError) as exc:
        return None, f"profiles {dict(profiles)} cannot be rebuilt by name: {exc}"


# ------------------------------------------------------------------------------------------------------------
# Router
# ------------------------------------------------------------------------------------------------------------


def _invalid(error: WhatIfInputError) -> RequestValidationError:
    # The same shape as pydantic's own errors, so the app's handler renders it like any other 422.
    loc = ("body", *error.field.split("."))
    return RequestValidationError([{"loc": loc, "msg": error.message, "type": "value_error"}])


def create_whatif_router(
    *,
    live_targets: LiveTargets | None = None,
    gamma_max: int = DEFAULT_GAMMA_MAX,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    default_max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> APIRouter:
    """`POST /v1/whatif` and `GET /v1/schedule`. `live_targets` lists the configured targets with their evidence
    and profiles (None: /v1/schedule answers 404 for every target, what-if still works); `gamma_max` is the deepest
    K a schedule may use by default (the decision's gamma_max); `default_max_num_seqs` the batch range of a target
    without its own max_num_seqs (schedule.max_num_seqs, as the schedule actuator's)."""
    router = APIRouter(route_class=bounded_route(max_body_bytes, what="what-if"), tags=["what-if"])
    errors: dict[int | str, dict[str, Any]] = {
        404: {"description": "Unknown target."},
        413: {"description": "Body too large."},
        422: {"description": "Invalid input: `detail[].loc` names the field."},
    }

    @router.post(
        "/v1/whatif", response_model=WhatIfResponse, responses=errors,
        description="Predicted step time, tokens/s and speedup vs no speculation for every (batch, context, gamma), "
        f"the best gamma per (batch, context) and the crossover batch per gamma. At most {MAX_POINTS} points "
        "(batch sizes x context lengths x gammas) per request; body at most "
        f"{max_body_bytes} bytes. Schema and examples: docs/whatif.md.",
    )
    async def whatif(request: WhatIfRequest) -> WhatIfResponse:
        try:
            return await run_in_threadpool(run_whatif, request)
        except WhatIfInputError as exc:
            raise _invalid(exc) from None

    @router.get("/v1/schedule", response_model=SchedulesOut, responses=errors)
    async def schedule(
        target: Annotated[str | None, Query(min_length=1, max_length=64, description="Only this target.")] = None,
        max_num_seqs: Annotated[
            int | None, Query(ge=1, le=MAX_NUM_SEQS_LIMIT, description=(
                "The engine's --max-num-seqs. Default: the target's targets[].max_num_seqs, else "
                f"actuation.schedule.max_num_seqs ({DEFAULT_MAX_NUM_SEQS} unless set)."))
        ] = None,
        context_tokens: Annotated[
            float | None, Query(ge=0, le=MAX_CONTEXT_TOKENS, description="Override the observed context/seq.")
        ] = None,
        margin: Annotated[float, Query(ge=0, le=1, description="Gain K>=1 must show over K=0.")] = 0.0,
        k_max: Annotated[int | None, Query(ge=1, le=GAMMA_LIMIT, description="Deepest K allowed.")] = None,
    ) -> SchedulesOut:
        """Per-batch-size speculation schedules for vLLM (num_speculative_tokens_per_batch_size) and TensorRT-LLM
        (draft_len_schedule / max_concurrency), from each target's live acceptance and calibrated cost model."""
        known = list(live_targets()) if live_targets is not None else []
        chosen = known if target is None else [t for t in known if t.name == target]
        if target is not None and not chosen:
            names = ", ".join(t.name for t in known) or "none"
            raise HTTPException(status_code=404, detail=f"unknown target '{target}' (configured: {names})")
        deepest = k_max if k_max is not None else gamma_max

        def compute() -> SchedulesOut:
            return SchedulesOut(targets=[
                _live_schedule(t, max_num_seqs=max_num_seqs or engine_max_num_seqs(t.context, default_max_num_seqs),
                               context_tokens=context_tokens, margin=margin, gamma_max=deepest)
                for t in chosen
            ])

        return await run_in_threadpool(compute)

    return router


def _live_schedule(
    target: LiveTarget, *, max_num_seqs: int, context_tokens: float | None, margin: float, gamma_max: int
) -> ScheduleOut:
    evidence, context = target.evidence, target.context
    if evidence is not None and evidence.state is DataState.ERROR:
        # What the recommendation refuses to advise from (a profile past its age limit, no cost model), the
        # schedule does not plan from either.
        return ScheduleOut(
            target=target.name, model=target.model, state=DataState.ERROR,
            reason=evidence.reason or target.reason or "the target is in the error state",
            max_num_seqs=max_num_seqs, context_tokens=context_tokens, gamma_max=gamma_max, margin=margin,
            speculation_useful=None, bands=[], vllm=None, trtllm=None,
        )
    if evidence is None or context is None:
        return ScheduleOut(
            target=target.name, model=target.model,
            state=evidence.state if evidence is not None else DataState.INSUFFICIENT_DATA,
            reason=target.reason or "no evidence or profiles yet", max_num_seqs=max_num_seqs,
            context_tokens=context_tokens, gamma_max=gamma_max, margin=margin, speculation_useful=None,
            bands=[], vllm=None, trtllm=None,
        )
    try:
        plan = inputs_from_evidence(
            evidence, context,
            ScheduleAsk(max_num_seqs=max_num_seqs, gamma_max=gamma_max, context_tokens=context_tokens, margin=margin),
            scales=target.scales or CostScales(),
        )
        return _schedule_of(target, evidence, plan, calibrated=target.scales is not None)
    except ValueError as exc:  # the cost model refused this evidence: one target's error, not the endpoint's
        return ScheduleOut(
            target=target.name, model=target.model, state=DataState.ERROR, reason=f"cannot compute: {exc}",
            max_num_seqs=max_num_seqs, context_tokens=context_tokens, gamma_max=gamma_max, margin=margin,
            speculation_useful=None, bands=[], vllm=None, trtllm=None,
        )


def _schedule_of(target: LiveTarget, evidence: Evidence, plan: ScheduleInputs, *, calibrated: bool) -> ScheduleOut:
    source = "measured acceptance" if evidence.acceptance is not None else "the drafter's prior (nothing measured)"
    costs = (
        "the online calibration the recommendation priced with" if calibrated
        else "the uncalibrated profiles (no step time fitted yet)"
    )
    reason = f"from {source} and {costs}; evidence state {evidence.state.value}"
    if evidence.reason:
        reason += f" ({evidence.reason})"
    return schedule_out(
        target=target.name, model=evidence.model or target.model, state=evidence.state, reason=reason, plan=plan
    )
