"""Engine-native per-batch-size speculation schedules, from the same cost model and acceptance profile.

For every batch size B in 1..max_num_seqs the schedule picks the number of draft tokens K that maximises tokens/s
per sequence (so also total tokens/s at that B), among K = 0..gamma_max:

    S(K, B)  = E[L](K) T_target(B, 1) / T(K, B),  T(K, B) = T_draft(K, B) + T_target(B, K + 1)   K >= 1
    S0(B)    = T_target(B, 1) / min(T_target(B, 1) + overhead_scale x k0_overhead(B), T(1, B))  K = 0 in a schedule
    K*(B)    = argmax_K>=1 S(K, B) if that S > (1 + margin) S0(B), else 0      (ties keep K = 0)

With the engine's step budget N known (`ModelContext.step_token_budget`, vLLM's --max-num-batched-tokens) a step
holds min(B, (N - P) / (K + 1)) sequences, each T is the time between one sequence's steps, and a K whose
sequence does not fit N - P is no choice (policies/model/token_budget.py `curve_within_budget`).

K = 0 is not free: an engine running a schedule keeps the speculative machinery configured, and vLLM's Dynamic SD
at K=0 measured +0.943 ms per step at concurrency 2 and +16.656 ms at 189 over speculation disabled
(tests/fixtures/published/dynamic-sd-k0-overhead.csv, vLLM issue #49548; priced by
policies/model/roofline.py `dynamic_sd_k0_overhead_s`, scaled by the calibrated overhead scale because it is host work).
So a K=0 band's speedup vs "off" is below 1, and a schedule that is K=0 almost everywhere is worse than restarting
without speculation: `speculation_useful` is False when no band drafts at all. The min() caps that price at a K=1
step: K=0 does a subset of a K=1 step's work (no draft pass, one token verified), but the measured Dynamic SD
overhead (84 us per request, one deployment) exceeds the model's own speculative bookkeeping
(policies/model/profiles.py) from batch ~10 up, which would otherwise make "draft one token that is never accepted" look
cheaper than K=0.

Bands: neighbouring batch sizes with the same K merge into one [lo, hi, K] band; bands are contiguous and cover
1..max_num_seqs. K*(B) is evaluated exactly at every B up to DENSE_UP_TO, then on a geometric grid
(x GRID_FACTOR) with integer bisection wherever K* differs between two grid points, so every boundary the grid
brackets is exact (a K that appears and disappears strictly between two grid points would be missed; K*(B) is
piecewise constant over wide ranges, so this does not happen in practice).

Engine formats (what each engine accepts, as documented):
- vLLM Dynamic SD (docs/features/speculative_decoding/dynamic_speculative_decoding.md, vLLM 0.24+): in
  `--speculative-config`, `num_speculative_tokens_per_batch_size` is a list of `[start_bs, end_bs, K]` with
  inclusive ranges, used while the concurrency is within [start_bs, end_bs]; `num_speculative_tokens` is the
  maximum K. The doc's examples run with `VLLM_USE_V2_MODEL_RUNNER=0`.
- SGLang adaptive speculation (`--speculative-adaptive --speculative-adaptive-config FILE`, SGLang 0.5.13+,
  python/sglang/srt/speculative/adaptive_spec_params.py): a JSON object whose integer-string keys are batch-size
  lower bounds (a batch, padded up to the next CUDA-graph size, uses the largest key at or below it), each tier
  listing `candidate_steps`; with one candidate per tier the table is fixed. Only the step count varies (topk 1).
  A tier of 0 steps came with SGLang PR #23994 (0.5.23).
- TensorRT-LLM (`DecodingBaseConfig` in tensorrt_llm/llmapi/llm_args.py; PRs NVIDIA/TensorRT-LLM#8194, #8703,
  #10860): `draft_len_schedule` maps an upper batch-size bound to a draft length, {4: 4, 8: 2, 32: 1} = batch 1-4
  -> 4, 5-8 -> 2, 9-32 -> 1, above the largest key -> 0 (speculation off). The validator requires the smallest
  key's value to equal `max_draft_len` and every value <= `max_draft_len`; `max_concurrency` (speculation off
  above it) is mutually exclusive with `draft_len_schedule`, and the keys should be among
  `cuda_graph_config.batch_sizes` (CUDA graphs are captured per (batch, draft_len)). An open PR (#16888) floors
  one-engine schedules at draft length 1, so an explicit 0 inside the schedule may run as 1 there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from policies.model.acceptance import AcceptancePoint, acceptance_curve
from policies.model.costmodel import DEFAULT_CONTEXT_TOKENS, ModelContext, chunked_shape, evaluate
from policies.model.roofline import CostScales, Shape, dynamic_sd_k0_overhead_s
from policies.model.token_budget import curve_within_budget, fitting_gammas
from policies.types import DraftMethod, Evidence

MAX_NUM_SEQS_LIMIT = 16384
DENSE_UP_TO = 32
GRID_FACTOR = 1.125


@dataclass(frozen=True, slots=True)
class BandChoice:
    """The best K at one batch size, its speedup vs speculation off, and whether it rests on extrapolation."""

    gamma: int
    speedup: float
    extrapolated: bool


@dataclass(frozen=True, slots=True)
class ScheduleBand:
    """Batch sizes `lo`..`hi` (inclusive, >= 1) run `gamma` drafts (0 = none). Speedups are vs speculation off at
    the band's ends (a K=0 band is below 1: the schedule's own overhead)."""

    lo: int
    hi: int
    gamma: int
    speedup_at_lo: float
    speedup_at_hi: float
    extrapolated: bool


@dataclass(frozen=True, slots=True)
class BatchSchedule:
    """Contiguous bands covering 1..max_num_seqs, at one context length (tokens per sequence)."""

    bands: tuple[ScheduleBand, ...]
    max_num_seqs: int
    gamma_max: int
    context_tokens: float
    margin: float

    @property
    def max_gamma(self) -> int:
        return max(band.gamma for band in self.bands)

    @property
    def speculation_useful(self) -> bool:
        """False when every band is K=0: restart without speculation instead (K=0 bands still cost time)."""
        return self.max_gamma > 0


@dataclass(frozen=True, slots=True)
class TrtllmSchedule:
    """TensorRT-LLM speculative_config fields: `draft_len_schedule` or `max_concurrency` (never both), plus the
    batch sizes CUDA graphs must be captured for, and what could not be expressed."""

    max_draft_len: int
    draft_len_schedule: tuple[tuple[int, int], ...] | None
    max_concurrency: int | None
    cuda_graph_batch_sizes: tuple[int, ...]
    notes: tuple[str, ...]


def best_choice(
    ctx: ModelContext,
    acceptance: Sequence[AcceptancePoint],
    at: Shape,
    *,
    scales: CostScales | None = None,
    margin: float = 0.0,
) -> BandChoice:
    """K*(B) by the rule in the module docstring at B = `at.batch` (>= 1), `at.context_tokens` and
    `at.prefill_tokens` (`at.tokens_per_seq` 1: the plain step). `acceptance` covers gamma 0..gamma_max
    (acceptance_curve); `margin` >= 0 (relative gain K >= 1 must show over K = 0 inside the schedule).

    Example: H100, Llama-3.1-8B, EAGLE-3 prior (alpha 0.76, gamma_max 8), B=1, ctx 1024: S(5) ~ 2.02 is the
    largest; S0(1) = 7.01 / (7.01 + 0.86) = 0.89 ms/ms (the K=1 step, 8.57 ms, does not cap it) -> K* = 5.
    """
    scales = scales or CostScales()
    # A K whose sequence cannot fit the step's budget beside the prompt tokens is no choice (token_budget.py).
    fits = max(1, fitting_gammas(ctx.step_token_budget, acceptance, at))
    curve, base = curve_within_budget(ctx, acceptance[:fits], at, scales=scales)  # curve_for under the budget
    k0_step = base + scales.overhead * dynamic_sd_k0_overhead_s(at.batch)
    if len(curve) > 1:
        k0_step = min(k0_step, curve[1].step_time_s)  # K=0 never costs more than a K=1 step (module docstring)
    k0 = base / k0_step
    best = BandChoice(0, k0, extrapolated=False)
    drafting = max(curve[1:], key=lambda p: p.speedup, default=None)
    if drafting is not None and drafting.speedup > (1.0 + margin) * k0:
        best = BandChoice(drafting.gamma, drafting.speedup, drafting.extrapolated)
    return best


@dataclass(frozen=True, slots=True)
class ScheduleInputs:
    """Everything a schedule is computed from: the profiles, E[L] for gamma 0..gamma_max (acceptance_curve), the
    largest batch the engine runs (`max_num_seqs`, vLLM's --max-num-seqs), the context per sequence (tokens), the
    calibrated cost scales, prompt tokens chunked into each step (`prefill_tokens`, in whole prompts of
    `prompt_tokens` when known: costmodel.prefill_chunk, as a what-if prices them), and the margin K >= 1 must clear
    over K = 0."""

    ctx: ModelContext
    acceptance: tuple[AcceptancePoint, ...]
    max_num_seqs: int
    context_tokens: float
    scales: CostScales = field(default_factory=CostScales)
    prefill_tokens: float = 0.0
    margin: float = 0.0
    prompt_tokens: float | None = None

    def capped(self, gamma_cap: int) -> ScheduleInputs:
        """The same plan allowing K <= `gamma_cap` only (>= 0)."""
        return replace(self, acceptance=self.acceptance[: gamma_cap + 1])


def schedule_for(plan: ScheduleInputs) -> BatchSchedule:
    """Bands of K*(B) for B = 1..max_num_seqs (1..MAX_NUM_SEQS_LIMIT), merged where K is equal (module docstring).
    Raises ValueError when max_num_seqs, margin (>= 0) or context (>= 0) is out of range or acceptance is empty.

    Example: H100, Llama-3.1-8B, EAGLE-3 prior (alpha 0.76, gamma_max 8), ctx 512, max_num_seqs 1024 ->
    [[1, 30, 5], [31, 55, 4], [56, 114, 3], [115, 1024, 2]]: S(5) ~ 2.0 at batch 1, S(2) ~ 1.16 at 1024.
    """
    if not 1 <= plan.max_num_seqs <= MAX_NUM_SEQS_LIMIT:
        raise ValueError(f"max_num_seqs must be 1..{MAX_NUM_SEQS_LIMIT}, got {plan.max_num_seqs}")
    if not (math.isfinite(plan.margin) and plan.margin >= 0):
        raise ValueError(f"margin must be >= 0, got {plan.margin}")
    if not (math.isfinite(plan.context_tokens) and plan.context_tokens >= 0):
        raise ValueError(f"context_tokens must be >= 0, got {plan.context_tokens}")
    if not plan.acceptance:
        raise ValueError("acceptance must cover at least gamma 0")
    cache: dict[int, BandChoice] = {}

    def choice(batch: int) -> BandChoice:
        if batch not in cache:
            at = chunked_shape(batch=float(batch), context_tokens=plan.context_tokens,
                               prefill_tokens=plan.prefill_tokens, prompt_tokens=plan.prompt_tokens,
                               budget=plan.ctx.step_token_budget)
            cache[batch] = best_choice(plan.ctx, plan.acceptance, at, scales=plan.scales, margin=plan.margin)
        return cache[batch]

    probes = _probes(plan.max_num_seqs)
    boundaries: list[int] = []  # first batch of each band after the first
    for left, right in itertools.pairwise(probes):
        _split(left, right, choice, boundaries)
    starts = [1, *sorted(boundaries)]
    ends = [start - 1 for start in starts[1:]] + [plan.max_num_seqs]
    bands = tuple(
        ScheduleBand(
            lo=lo, hi=hi, gamma=choice(lo).gamma, speedup_at_lo=choice(lo).speedup,
            # No bracket between lo and hi changed K, so the choice evaluated at hi carries the same K.
            speedup_at_hi=choice(hi).speedup,
            extrapolated=choice(lo).extrapolated or choice(hi).extrapolated,
        )
        for lo, hi in zip(starts, ends, strict=True)
    )
    return BatchSchedule(bands=bands, max_num_seqs=plan.max_num_seqs, gamma_max=len(plan.acceptance) - 1,
                         context_tokens=plan.context_tokens, margin=plan.margin)


def _probes(max_num_seqs: int) -> list[int]:
    probes = list(range(1, min(DENSE_UP_TO, max_num_seqs) + 1))
    value = float(probes[-1])
    while probes[-1] < max_num_seqs:
        value *= GRID_FACTOR
        probes.append(min(max(int(value), probes[-1] + 1), max_num_seqs))
    return probes


def _split(left: int, right: int, choice: Callable[[int], BandChoice], boundaries: list[int]) -> None:
    # Integer bisection: find every B in (left, right] where K*(B) != K*(B - 1), assuming one change per bracket
    # found (recursing into both halves when the middle differs from both ends).
    if choice(left).gamma == choice(right).gamma:
        return
    if right - left == 1:
        boundaries.append(right)
        return
    middle = (left + right) // 2
    _split(left, middle, choice, boundaries)
    _split(middle, right, choice, boundaries)


@dataclass(frozen=True, slots=True)
class ScheduleAsk:
    """What a schedule is asked for: the largest batch the engine runs (`max_num_seqs`), the deepest K
    (`gamma_max`, 1..16), a context per sequence overriding the observed one (None: the evidence's), and the
    margin K >= 1 must clear over K = 0."""

    max_num_seqs: int
    gamma_max: int
    context_tokens: float | None = None
    margin: float = 0.0


def engine_max_num_seqs(ctx: ModelContext | None, default: int) -> int:
    """The batch range a live schedule covers: the target's own max_num_seqs where its settings give it
    (`ModelContext.max_num_seqs`), else `default`; within 1..MAX_NUM_SEQS_LIMIT. Example: 128 -> 128; None -> 256."""
    known = ctx.max_num_seqs if ctx is not None else None
    return default if known is None else max(1, min(MAX_NUM_SEQS_LIMIT, int(known)))


def inputs_from_evidence(
    evidence: Evidence, ctx: ModelContext, ask: ScheduleAsk, *, scales: CostScales
) -> ScheduleInputs:
    """The plan for a live target: acceptance from its evidence (the method's prior when nothing was measured),
    `scales` (the online calibration the target's decision priced with, carried on the board: one calibration for
    every answer about a target; CostScales() before its first fit), its observed context per sequence (unless
    `ask.context_tokens` overrides it). `ask.gamma_max` 1..16. No prompt tokens per step: as in the decision's curve, a
    prompt load set by the clients' rate costs every option the same share of its steps and cancels in S
    (policies/model/costmodel.py). With a step budget the schedule prices how one step fills (P = 0 here: all of N
    for the running sequences), where the recommendation prices the served mix's cap (policies/model/token_budget.py):
    the two agree where the budget does not bind.
    Example: evidence at batch 12 with r = (0.78, 0.58, 0.43) and the fitted scales -> acceptance E[L] 1, 1.78,
    2.36, 2.79 then extrapolated, priced with those scales at the evidence's operating point.
    """
    gamma_max, context_tokens = ask.gamma_max, ask.context_tokens
    if not 1 <= gamma_max <= 16:
        raise ValueError(f"gamma_max must be 1..16, got {gamma_max}")
    result = evaluate(evidence, ctx, gamma_max=gamma_max, scales=scales)
    point = result.calibration.point
    acceptance = acceptance_curve(evidence.acceptance, method=ctx.drafter.method, gamma_max=gamma_max)
    context = point.context_tokens if context_tokens is None else context_tokens
    if not (math.isfinite(context) and context >= 0):
        context = DEFAULT_CONTEXT_TOKENS
    return ScheduleInputs(
        ctx=ctx, acceptance=acceptance, max_num_seqs=ask.max_num_seqs, context_tokens=context,
        scales=result.calibration.scales, margin=ask.margin,
    )


# ------------------------------------------------------------------------------------------------------------
# Engine formats
# ------------------------------------------------------------------------------------------------------------


def vllm_bands(schedule: BatchSchedule) -> list[list[int]]:
    """`num_speculative_tokens_per_batch_size`: [[lo, hi, K], ...], contiguous, 1..max_num_seqs, K = 0 no drafts.

    Example: bands (1-48: 4), (49-160: 2), (161-256: 0) -> [[1, 48, 4], [49, 160, 2], [161, 256, 0]].
    """
    return [[band.lo, band.hi, band.gamma] for band in schedule.bands]


def vllm_speculative_config(schedule: BatchSchedule, *, method: DraftMethod) -> dict[str, object] | None:
    """The Dynamic SD part of vLLM's `--speculative-config` JSON, or None when no band drafts (turn speculation
    off instead: K=0 bands still cost time). Merge it into the deployed config (keep its `model` and the rest).

    Example: method eagle3, bands [[1, 48, 4], [49, 256, 0]] -> {"method": "eagle3", "num_speculative_tokens": 4,
    "num_speculative_tokens_per_batch_size": [[1, 48, 4], [49, 256, 0]]}.
    """
    if not schedule.speculation_useful:
        return None
    return {
        "method": method.value,
        "num_speculative_tokens": schedule.max_gamma,
        "num_speculative_tokens_per_batch_size": vllm_bands(schedule),
    }


def sglang_adaptive_config(schedule: BatchSchedule) -> dict[str, object] | None:
    """SGLang's `--speculative-adaptive-config` JSON for the bands (SGLang 0.5.13+, `adaptive_spec_params.py`), or
    None when no band drafts. Its top-level keys are batch-size lower bounds, a batch using the largest key at or
    below its size (padded up to the next CUDA-graph size first); one candidate per tier makes the table fixed.
    The server then needs `--speculative-adaptive`, topk 1 and `--speculative-num-steps` equal to one of the steps
    (the largest). A tier of 0 steps needs SGLang PR #23994 (in 0.5.23, not 0.5.13).

    Example: bands (1-8: 4), (9-64: 2), (65-256: 0) -> {"1": {"candidate_steps": [4]}, "9": {"candidate_steps":
    [2]}, "65": {"candidate_steps": [0]}}.
    """
    if not schedule.speculation_useful:
        return None
    return {str(band.lo): {"candidate_steps": [band.gamma]} for band in schedule.bands}


def trtllm_schedule(plan: ScheduleInputs, schedule: BatchSchedule | None = None) -> TrtllmSchedule | None:
    """TensorRT-LLM's fields for the plan (module docstring for the semantics), or None when no band drafts or
    the best schedule is off at batch 1 but drafts later (TRT-LLM's smallest key must carry max_draft_len > 0).

    max_draft_len D = K*(1). TRT-LLM rejects a value above D anywhere, so when the unconstrained schedule goes
    deeper than D at larger batches it is recomputed with K <= D (the best schedule TRT-LLM can express with
    D = K*(1)). A single drafting band followed by K=0 becomes `max_concurrency`; otherwise `draft_len_schedule`
    is keyed by each band's upper bound, the trailing K=0 band left implicit (above the largest key is 0).
    `schedule` is `schedule_for(plan)` when already computed.

    Example: bands (1-8: 4), (9-64: 2), (65-256: 0) -> max_draft_len 4, draft_len_schedule {8: 4, 64: 2};
    bands (1-100: 3), (101-256: 0) -> max_draft_len 3, max_concurrency 100.
    """
    schedule = schedule or schedule_for(plan)
    if not schedule.speculation_useful or schedule.bands[0].gamma == 0:
        return None
    first = schedule.bands[0].gamma
    notes: list[str] = []
    if schedule.max_gamma > first:
        schedule = schedule_for(plan.capped(first))
        notes.append(
            f"re-chosen with K <= {first} (batch 1's best): TRT-LLM requires the smallest key's draft length to "
            "equal max_draft_len and no larger value elsewhere"
        )
    bands = list(schedule.bands)
    while bands[-1].gamma == 0:
        bands.pop()
    if len(bands) == 1:
        cutoff = bands[0].hi
        return TrtllmSchedule(
            max_draft_len=first, draft_len_schedule=None,
            max_concurrency=cutoff if cutoff < schedule.max_num_seqs else None,
            cuda_graph_batch_sizes=(), notes=tuple(notes),
        )
    entries = tuple((band.hi, band.gamma) for band in bands)
    notes.append(f"cuda_graph_config.batch_sizes must include every key: {[key for key, _ in entries]}")
    return TrtllmSchedule(
        max_draft_len=first, draft_len_schedule=entries, max_concurrency=None,
        cuda_graph_batch_sizes=tuple(key for key, _ in entries), notes=tuple(notes),
    )
