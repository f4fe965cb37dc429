"""Evidence x profiles -> the speedup curve S(gamma), calibrated to the step time the server reports.

    S(gamma) = (E_c[L](gamma) / (T_draft(gamma) + T_target(B, q))) / (1 / T_target(B, q = 1)),   q = 1 + c gamma

the ratio of tokens per second per sequence with gamma drafts to plain decoding at the same batch B (so it is also
the inverse ratio of inter-token latencies). c in (0, 1] is the draft coverage, the share of sequence-steps that
carry a draft (1 for EAGLE/MTP/draft models; an n-gram drafter without a match leaves a step plain), so a step
verifies q = 1 + c gamma tokens per sequence and emits E_c[L] = 1 + c (E[L] - 1) (policies/model/acceptance.py, which
also gives E[L]); T_target and T_draft from policies/model/roofline.py. Example: c = 0.58, gamma 3, E[L](3) = 3.4 ->
q = 2.74, E_c[L] = 2.39. The band uses the E[L] band with the same step times.

Operating point: B = max(evidence.decode_seqs_per_step, 1) sequences per step, or max(evidence.batch, 1) running
requests when the per-step count is unknown (no iteration-tokens / ITL histograms, no step in the window). Why the
per-step count first: B is the batch a step verifies, and the observed step time (mean ITL) is measured over the
steps the engine ran; the running gauge is a mean over scrapes that also counts idle gaps and requests still
prefilling, and on a load ramp it misdescribes the steps (132 running on average where the steps held 70
decoding, on the simulator). The step time paired with that batch must describe the same steps: see
`observed_step_s`. ctx = evidence.context_tokens_per_seq, or
DEFAULT_CONTEXT_TOKENS = 1024 when unknown (a typical chat turn: a few hundred prompt tokens plus history);
P = evidence.prefill_tokens_per_step (prompt tokens chunked into each step, 0 when unknown), carried in chunks of
evidence.prompt_tokens_per_request tokens (a whole prompt per step; None: P in every step), enters the
calibration (the observed step includes it) but not S. Why: prompt tokens arrive at a rate R_p set by the
clients, not per step, so a step carries P(gamma) = R_p T_step(gamma) of them and, prefill math being additive
(policies/model/roofline.py), T_step = T_dec + c P = T_dec / (1 - R_p c). The factor 1 / (1 - R_p c) is the same for
every gamma and cancels in S = E[L] T_dec(0) / T_dec(gamma). (Holding P per step fixed instead would dilute S
towards 1 and, at batch 256 with a queue, call speculation a gain where the simulator's truth is a loss.) The
absolute step time and ITL do grow by 1 / (1 - R_p c): the ITL-SLO objective uses that (policies/model/objectives.py).
`curve_for(..., Shape(..., prefill_tokens=P))` prices the other case, a step whose prompt tokens are fixed by the
token budget.

Calibration. `evaluate(..., scales=...)` prices with scales fitted elsewhere (the online fitter over many points,
policies/model/calibrate.py, is what the loop uses). Without them, a one-point calibration (below). When the
server reports its mean step time T_obs (ITL histogram), predict the step at the operating point the server is
running: q_obs = 1 + draft_coverage x mean_proposed_length (tokens proposed per decoding sequence-step) and k
drafting steps when speculation is on, q_obs = 1 and no drafting when off. Split the prediction into host
overhead O (fixed + per-request + speculative bookkeeping + draft-step launches) and physics P (roofline +
all-reduce), then

    overhead_scale s = clamp((T_obs - P) / O, 0.1, 10)     -- first: overheads are the uncertain part
    roofline_scale e = clamp((T_obs - s O) / P, 0.25, 4)   -- only if s alone cannot explain T_obs

Why overhead first: roofline terms are bounded by datasheet peaks and known to ~15%, while host overhead varies
several-fold between engine versions, CPUs and deployments; on the CPU test box (a 590k-parameter model on
2 cores) it is ~95% of the step. A uniform scale of the whole step would be useless: S is a ratio, and only the
split between fixed and roofline time moves it. The clamps keep one bad reading (a prefill burst, a stall) from
producing absurd constants; `Calibration.relative_error` reports what the clamps left unexplained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.model.acceptance import AcceptancePoint, acceptance_curve
from policies.model.profiles import DrafterProfile, HardwareProfile, ModelProfile
from policies.model.roofline import CostScales, Shape, drafting_time, step_components, target_step_time
from policies.types import AcceptanceEvidence, CurvePoint, Evidence

DEFAULT_CONTEXT_TOKENS = 1024.0
OVERHEAD_SCALE_RANGE = (0.1, 10.0)
ROOFLINE_SCALE_RANGE = (0.25, 4.0)
# How far the window's ITL sum may exceed window x running requests before the counters are taken to run on
# another clock than the scrapes (`_counters_match_window`): the gauge's scrape mean misses ramps by tens of %.
_CLOCK_SLACK = 2.0


@dataclass(frozen=True, slots=True)
class ModelContext:
    """The profiles a cost evaluation needs: target hardware (per GPU), target model, drafter, and TP degree;
    `step_token_budget` the engine's most tokens per step (vLLM's max_num_batched_tokens; None = unknown), which
    verified drafts share with chunked prefill, and `max_num_seqs` its most sequences per step (None = unknown),
    which caps the batch a full budget would hold (policies/model/token_budget.py)."""

    hardware: HardwareProfile
    model: ModelProfile
    drafter: DrafterProfile
    tensor_parallel: int = 1
    step_token_budget: float | None = None
    max_num_seqs: float | None = None

    def __post_init__(self) -> None:
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        draft = self.drafter.tensor_parallel
        if draft < 0 or draft > self.tensor_parallel:
            raise ValueError(f"the drafter's tensor_parallel must be 0 (the target's) to {self.tensor_parallel}, "
                             f"got {draft}")
        budget = self.step_token_budget
        if budget is not None and not (math.isfinite(budget) and budget >= 1):
            raise ValueError(f"step_token_budget must be a number of tokens >= 1, got {budget}")
        seqs = self.max_num_seqs
        if seqs is not None and not (math.isfinite(seqs) and seqs >= 1):
            raise ValueError(f"max_num_seqs must be a number of sequences >= 1, got {seqs}")


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """Where the server runs now: `batch` (>= 1) sequences at `context_tokens` each, verifying `tokens_per_seq`
    tokens per step after `draft_steps` drafting steps (0 and 1.0 when speculation is off)."""

    batch: float
    context_tokens: float
    tokens_per_seq: float
    draft_steps: int
    prefill_tokens: float = 0.0
    prefill_chunk_tokens: float | None = None

    @property
    def shape(self) -> Shape:
        """The target forward this point runs (policies/model/roofline.py)."""
        return Shape(
            batch=self.batch, context_tokens=self.context_tokens, tokens_per_seq=self.tokens_per_seq,
            prefill_tokens=self.prefill_tokens, prefill_chunk_tokens=self.prefill_chunk_tokens,
        )


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted cost scales and how well they explain the observed step (seconds).

    `predicted_step_s` is the uncalibrated model at the operating point, `calibrated_step_s` after scaling;
    `observed_step_s` None means nothing was observed and the scales are 1.
    """

    scales: CostScales
    point: OperatingPoint
    predicted_step_s: float
    calibrated_step_s: float
    observed_step_s: float | None

    @property
    def calibrated(self) -> bool:
        return self.observed_step_s is not None

    @property
    def relative_error(self) -> float | None:
        """calibrated / observed - 1 (0 when the clamps did not bind); None without an observation."""
        if self.observed_step_s is None:
            return None
        return self.calibrated_step_s / self.observed_step_s - 1.0


@dataclass(frozen=True, slots=True)
class CostModelResult:
    """A full evaluation: the curve, the calibration behind it, and the plain-decoding step time it divides by."""

    curve: tuple[CurvePoint, ...]
    calibration: Calibration
    baseline_step_s: float


def operating_point(evidence: Evidence, *, budget: float | None = None) -> OperatingPoint:
    """The (B, ctx, q, draft steps) the evidence describes, its tokens per sequence from the window's own
    acceptance counters: `operating_point_with(evidence, evidence.acceptance, budget=budget)`."""
    return operating_point_with(evidence, evidence.acceptance, budget=budget)


def operating_point_with(
    evidence: Evidence, acceptance: AcceptanceEvidence | None, *, budget: float | None = None
) -> OperatingPoint:
    """The (B, ctx, q, draft steps) the evidence describes, the proposed tokens per step read from `acceptance`
    (the window's own, or the profile that stands in for a thin window); see the module docstring for defaults.
    The prompt chunk is `prefill_chunk(...)` under the step token budget `budget` (None = unknown).

    Example: batch 0.4, no context, speculation on at k=3 proposing 2.79 tokens per draft, no prefill measured ->
    OperatingPoint(batch=1.0, context_tokens=1024.0, tokens_per_seq=3.79, draft_steps=3, prefill_tokens=0.0);
    with drafts on only 58% of sequence-steps (`draft_coverage` 0.58) -> tokens_per_seq = 1 + 0.58 x 2.79 = 2.62.
    With decode_seqs_per_step 70.0 measured while the running gauge averaged 131.9 (a load ramp) -> batch 70.0.
    """
    batch = max(step_batch(evidence), 1.0)
    context = evidence.context_tokens_per_seq
    if context is None or not math.isfinite(context) or context <= 0:
        context = DEFAULT_CONTEXT_TOKENS
    prefill = evidence.prefill_tokens_per_step
    if prefill is None or not math.isfinite(prefill) or prefill < 0:
        prefill = 0.0
    tokens_per_seq, steps = 1.0, 0
    if evidence.speculation_on and evidence.deployed_k > 0:
        proposed = float(evidence.deployed_k)
        if acceptance is not None and acceptance.drafts > 0:
            # Tokens proposed per decoding sequence-step: per draft, times the share of sequence-steps that drafted.
            per_draft = min(max(acceptance.mean_proposed_length, 0.0), float(evidence.deployed_k))
            coverage = acceptance.draft_coverage
            proposed = per_draft * (min(max(coverage, 0.0), 1.0) if math.isfinite(coverage) else 1.0)
        tokens_per_seq, steps = 1.0 + proposed, evidence.deployed_k
    chunk = prefill_chunk(evidence.prompt_tokens_per_request, prefill_tokens=prefill,
                          decode_tokens=batch * tokens_per_seq, budget=budget)
    return OperatingPoint(
        batch=batch, context_tokens=context, tokens_per_seq=tokens_per_seq, draft_steps=steps,
        prefill_tokens=prefill, prefill_chunk_tokens=chunk,
    )


def prefill_chunk(
    prompt_tokens: float | None, *, prefill_tokens: float, decode_tokens: float, budget: float | None
) -> float | None:
    """The prompt tokens one prefilling step carries (tokens; None = unknown: every step carries the mean): a whole
    prompt (`prompt_tokens`, the window's prompt tokens per prefilled request), at most what the step token
    budget leaves beside the decode tokens, which the engine schedules first: min(prompt, max(P, budget - B q)).
    Never below the mean P per step (a chunk in every step); None when that leaves no token (no P, and decode
    tokens that fill the budget). Example: prompt 2000 tokens, budget 512, 100 decode tokens, P 300 -> min(2000,
    max(300, 412)) = 412; no budget -> 2000; prompt NaN -> None; P 0 and 600 decode tokens -> None."""
    if prompt_tokens is None or not (math.isfinite(prompt_tokens) and prompt_tokens > 0):
        return None
    if budget is None or not math.isfinite(budget):
        return prompt_tokens
    chunk = min(prompt_tokens, max(prefill_tokens, budget - decode_tokens))
    return chunk if chunk > 0 else None


def chunked_shape(
    *, batch: float, context_tokens: float, prefill_tokens: float, prompt_tokens: float | None, budget: float | None
) -> Shape:
    """The plain step's shape at `batch` sequences with P = `prefill_tokens` prompt tokens per step carried in
    whole prompts of `prompt_tokens` (`prefill_chunk` with the batch's B decode tokens; None: every step carries P):
    what an offline answer (a what-if grid point, a schedule's batch) prices for every gamma at that batch.
    Example: batch 64, P 200, prompt 2000, budget 512 -> chunk min(2000, max(200, 448)) = 448."""
    chunk = prefill_chunk(prompt_tokens, prefill_tokens=prefill_tokens, decode_tokens=batch, budget=budget)
    return Shape(batch=batch, context_tokens=context_tokens, prefill_tokens=prefill_tokens,
                 prefill_chunk_tokens=chunk)


def step_batch(evidence: Evidence) -> float:
    """The batch an engine step verified (sequences, >= 0, not floored): `decode_seqs_per_step` when measured
    (finite, >= 0), else the running-requests mean `batch` (module docstring), else 1.0 when that is not finite.

    Example: decode_seqs_per_step 70.0, batch 131.9 -> 70.0; decode_seqs_per_step None, batch 12.5 -> 12.5.
    """
    per_step = evidence.decode_seqs_per_step
    if per_step is not None and math.isfinite(per_step) and per_step >= 0:
        return per_step
    return evidence.batch if math.isfinite(evidence.batch) else 1.0


def observed_step_s(evidence: Evidence) -> float | None:
    """The mean engine step (s) to calibrate against at `step_batch(evidence)`; None without a usable ITL mean.

    `evidence.step_time_s` is the ITL mean ΣnT/Σn over steps i that decoded n_i sequences for T_i seconds: a
    mean weighted by each step's batch, so it describes a batch Σn²/Σn, larger than the per-step mean Σn/N that
    `decode_seqs_per_step` measures whenever the batch varies within the window (a ramp, or just Poisson
    arrivals: 11.2 per step but 12.4 ITL-weighted on a held simulator load; pairing the ITL mean with 11.2
    over-predicted mid-size batches by up to 11% held and 28% on the demo's ramps). The per-step mean duration
    ΣT/N pairs with Σn/N. It is bounded by two measurable quantities: the engines cannot have been busy longer
    than the window, ΣT <= engines x window_s, so ΣT/N <= engines x window_s x decode_seqs_per_step /
    step_samples (N = step_samples / decode_seqs_per_step); and ΣT/N <= ΣnT/Σn since longer steps are those
    with more sequences. The first is tight on a busy engine, the second on a mostly idle one (a light load,
    where the batch barely varies), so the lesser of the two is returned. The first needs the counters and the
    scrape clock to tick together; when the window's ITL sum shows more sequence-seconds of decoding than the
    window held (`_counters_match_window`: a simulator run faster than real time) it is void and the ITL mean is
    returned. Without a per-step batch the ITL mean
    is returned as it is (it pairs with the running gauge no better, but nothing else was measured).
    `evidence.engines` (>= 1) data-parallel engines step concurrently, so together they are busy up to
    engines x window_s.

    Example: ITL mean 23.6 ms, window 30 s, 1,500 ITL samples at 17.8 sequences per step (N = 84.3 steps):
    30 / 84.3 = 356 ms -> 23.6 ms (an idle window). On a busy window: 30 s, 26,700 samples at 17.8 per step
    (N = 1,500): 30 / 1,500 = 20.0 ms < 23.6 ms -> 20.0 ms.
    """
    observed = evidence.step_time_s
    if observed is None or not math.isfinite(observed) or observed <= 0:
        return None
    per_step = evidence.decode_seqs_per_step
    usable = per_step is not None and math.isfinite(per_step) and per_step > 0
    engines = max(1, evidence.engines)
    if not usable or not evidence.window_s > 0 or not evidence.step_samples > 0:
        return observed
    assert per_step is not None  # narrowed by `usable`
    if not _counters_match_window(evidence):
        return observed
    return min(observed, engines * evidence.window_s * per_step / evidence.step_samples)


def _counters_match_window(evidence: Evidence) -> bool:
    """Whether the engine's counters and the scrape clock plausibly tick at the same rate over the window.

    The wall-clock bound of `observed_step_s` rests on it. Measurable check: the window's ITL sum ΣnT is
    sequence-seconds of decoding, and a request accrues at most about one window of inter-token latency within a
    window (plus the one interval straddling its start), so ΣnT <= window_s x (requests running). The running
    gauge is a mean over scrapes (a ramp's scrapes can miss its peak), hence `_CLOCK_SLACK`. A simulator run
    faster than real time (time x20: 20 simulated seconds of steps in one second of scrapes) breaks it by ~20x;
    trusting the bound there made every step 20x too short (0.9 ms where the ITL mean was 13.6 ms at batch 2),
    which drove the fitted scales to their 1/8 bounds.
    """
    assert evidence.step_time_s is not None  # checked by the caller
    running = max(evidence.batch, evidence.decode_seqs_per_step or 0.0, 1.0)
    itl_sum = evidence.step_time_s * evidence.step_samples
    return itl_sum <= _CLOCK_SLACK * evidence.window_s * running


def _step_parts(
    ctx: ModelContext, point: OperatingPoint, scales: CostScales | None = None
) -> tuple[float, float]:
    target = target_step_time(ctx.hardware, ctx.model, point.shape, tensor_parallel=ctx.tensor_parallel, scales=scales)
    draft = drafting_time(
        ctx.hardware, ctx.drafter, Shape(batch=point.batch, context_tokens=point.context_tokens),
        gamma=point.draft_steps, tensor_parallel=ctx.tensor_parallel, scales=scales,
    )
    return target.overhead_s + draft.overhead_s, target.physics_s + draft.physics_s


def step_time_at(ctx: ModelContext, point: OperatingPoint, *, scales: CostScales | None = None) -> float:
    """The model's step time (s) at `point` (batch, context, tokens per sequence, draft steps, prefill): the target
    forward plus the drafting, with `scales` (uncalibrated physics when None)."""
    overhead, physics = _step_parts(ctx, point, scales)
    return overhead + physics


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


def calibrate(evidence: Evidence, ctx: ModelContext) -> Calibration:
    """Fit the overhead (then, if needed, roofline) scale so the model reproduces `evidence.step_time_s`.

    Uses the step time (`observed_step_s`: the mean step at the per-step batch) only when it is a finite positive
    number of seconds; otherwise returns scales (1, 1). Formulas and clamps in the module docstring.

    Example: tiny-llama on the `cpu` profile, speculation off, B=1, ctx 1024: predicted O = 1.27 + 0.18 ms,
    P = (1.18 MB weights + 1.05 MB KV) / 14 GB/s = 0.16 ms; observed 3.2 ms -> s = (3.2 - 0.16) / 1.45 = 2.10,
    e = 1, calibrated step = 3.2 ms.
    """
    point = operating_point(evidence, budget=ctx.step_token_budget)
    overhead, physics = _step_parts(ctx, point)
    predicted = overhead + physics
    observed = observed_step_s(evidence)
    if observed is None:
        return Calibration(CostScales(), point, predicted, predicted, None)
    wanted = (observed - physics) / overhead if overhead > 0 else math.inf
    s = _clamp(wanted, OVERHEAD_SCALE_RANGE) if overhead > 0 else 1.0
    e = 1.0
    if s != wanted and physics > 0:  # the overhead clamp bound: let the physics absorb the rest
        e = _clamp((observed - s * overhead) / physics, ROOFLINE_SCALE_RANGE)
    return Calibration(CostScales(overhead=s, roofline=e), point, predicted, s * overhead + e * physics, observed)


def curve_for(
    ctx: ModelContext,
    acceptance: Sequence[AcceptancePoint],
    at: Shape,
    *,
    scales: CostScales | None = None,
    tree_tokens: float | None = None,
) -> tuple[tuple[CurvePoint, ...], float]:
    """S(gamma) for each acceptance point at an explicit operating point (what-if: another batch or context with
    the scales calibrated elsewhere). Returns (curve, plain-decoding step seconds). `acceptance` must start at
    gamma 0 and be contiguous. `at` is the plain-decoding step (tokens_per_seq 1; each gamma verifies its own):
    `batch` >= 1; `context_tokens` >= 0; `prefill_tokens` >= 0 prompt tokens chunked into every step, the same for
    every gamma (0 for a rate-bound prompt load, where it cancels: module docstring). ValueError outside them.
    `tree_tokens` (None = a chain): a drafter that proposes a tree of that many draft tokens per sequence, gamma
    levels deep; the target then verifies tree_tokens + 1 tokens per sequence at every gamma >= 1 (the nodes and
    the bonus position) instead of gamma + 1, and drafting is priced as gamma passes (a level's few nodes cost a
    head or small draft model at decode batch sizes what one token does: it streams its weights once).

    Example: E[L](3) = 2.79, T_target(q=1) = 6.82 ms, T_draft(3) = 3.2 ms, T_target(q=4) = 6.85 ms ->
    S(3) = 2.79 x 6.82 / (3.2 + 6.85) = 1.89.
    """
    if at.tokens_per_seq != 1.0:
        raise ValueError(f"curve_for prices from the plain step: tokens_per_seq must be 1, got {at.tokens_per_seq}")
    scales = scales or CostScales()
    base = target_step_time(ctx.hardware, ctx.model, at, tensor_parallel=ctx.tensor_parallel, scales=scales).total_s
    points: list[CurvePoint] = []
    for index, acc in enumerate(acceptance):
        if acc.gamma != index:
            raise ValueError("acceptance points must be gamma 0, 1, 2, ... in order")
        if acc.gamma == 0:
            points.append(CurvePoint(0, 1.0, 1.0, 1.0, 1.0, base, extrapolated=False))
            continue
        draft = drafting_time(ctx.hardware, ctx.drafter, at, gamma=acc.gamma, tensor_parallel=ctx.tensor_parallel,
                              scales=scales)
        if tree_tokens is not None:
            verified = tree_tokens + 1.0
        else:
            verified = acc.verified_tokens if acc.verified_tokens is not None else acc.gamma + 1.0
        verify = target_step_time(
            ctx.hardware, ctx.model, replace(at, tokens_per_seq=verified), tensor_parallel=ctx.tensor_parallel,
            scales=scales,
        )
        step = draft.total_s + verify.total_s
        points.append(
            CurvePoint(
                gamma=acc.gamma,
                speedup=acc.expected_length * base / step,
                speedup_low=acc.expected_length_low * base / step,
                speedup_high=acc.expected_length_high * base / step,
                expected_accepted_length=acc.expected_length,
                step_time_s=step,
                extrapolated=acc.extrapolated,
                extrapolated_share=acc.extrapolated_share,
            )
        )
    return tuple(points), base


def evaluate(
    evidence: Evidence, ctx: ModelContext, *, gamma_max: int, scales: CostScales | None = None
) -> CostModelResult:
    """Calibrate to the evidence (or use `scales`, fitted elsewhere, e.g. by policies/model/calibrate.py), then price
    gamma = 0..gamma_max (>= 0; ValueError when negative) at the evidence's operating point.

    Example: see `speedup_curve`; this also returns the calibration (scales, error) and the baseline step.
    """
    calibration = calibrate(evidence, ctx) if scales is None else _given_scales(evidence, ctx, scales)
    acceptance = acceptance_curve(evidence.acceptance, method=ctx.drafter.method, gamma_max=gamma_max)
    curve, base = curve_for(
        ctx, acceptance, Shape(batch=calibration.point.batch, context_tokens=calibration.point.context_tokens),
        scales=calibration.scales,
    )
    return CostModelResult(curve=curve, calibration=calibration, baseline_step_s=base)


def _given_scales(evidence: Evidence, ctx: ModelContext, scales: CostScales) -> Calibration:
    point = operating_point(evidence, budget=ctx.step_token_budget)
    overhead, physics = _step_parts(ctx, point)
    scaled = step_components(
        ctx.hardware, ctx.model, ctx.drafter, point.shape, draft_passes=point.draft_steps,
        tensor_parallel=ctx.tensor_parallel,
    ).total_s(scales)
    return Calibration(scales, point, overhead + physics, scaled, observed_step_s(evidence))


def speedup_curve(
    evidence: Evidence, ctx: ModelContext, *, gamma_max: int, scales: CostScales | None = None
) -> tuple[CurvePoint, ...]:
    """S(gamma) for gamma = 0..gamma_max (>= 0): one CurvePoint each, gamma 0 exactly 1.0 with step_time_s the
    plain-decoding step. Speedups are ratios of tokens/s per sequence (> 0, typically 0.3..4); bands come from
    the acceptance interval, `extrapolated` marks gammas beyond the measured k (or a prior).

    Example: H100 SXM, Llama-3.1-8B, EAGLE-3 head, B=1, ctx 512, r = (0.78, 0.58, 0.43) (E[L](3) = 2.79),
    no step-time observation: T_target(q=1) = 6.82 ms, T_draft(3) + T_target(q=4) ~ 10.0 ms ->
    S(3) = 2.79 x 6.82 / 10.0 ~ 1.90 (vLLM measured 7.07 / 4.09 = 1.73x, vllm-eagle-k-sweep-bs1.csv).
    `scales` as in `evaluate`.
    """
    return evaluate(evidence, ctx, gamma_max=gamma_max, scales=scales).curve
