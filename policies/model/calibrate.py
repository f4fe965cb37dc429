"""Online calibration: fit the cost model's efficiency terms to the step times the server reports.

The server tells us, every window, its mean step time T_obs at the operating point it runs (ITL histogram
Δsum/Δcount, policies/estimate/window.py) together with that point: batch B, verified tokens per sequence q, drafting
passes, context ctx and prefill tokens per step P. Each window becomes one `StepObservation`; the fitter state
(`CalibrationState`) carries the recent ones across loop iterations, per target, like `DecideState`.

What is fitted: eight multipliers of policies/model/roofline.py's `CostScales` in log space x = log(scale), and the
GEMM efficiency elasticity beta as it is:
    memory       1 / (effective bandwidth error)    T's memory terms     weights and KV streaming x memory
    compute      1 / (effective FLOP/s error)       T's compute terms    linear-layer and attention math x compute
    overhead     fixed host costs                   step, speculative-step and draft-launch fixed terms
    per_request  per-running-request host costs     plain + speculative bookkeeping + n-gram lookups (x B)
    per_token    per-verified-token cost            sampler, rejection, per-token bookkeeping (x B q): the
                                                    marginal cost of a verified token besides its roofline
    draft        the drafter's own cost             draft launches and its passes' roofline
    spec         the speculative machinery's cost   per-step + per-request speculative bookkeeping, whatever gamma
    fill         the GEMM floor (one tile)          N_fill x fill rows: a small decode step's least math
    gemm_slope   efficiency elasticity beta         decode GEMM math x (N_ref / G)^beta (0 = one rate)
  T(x; point) = StepComponents(point).total_s(scales(x))   (roofline stays 1: it is memory/compute together)
per_token and per_request are told apart by steps that verify different tokens per sequence at similar batches
(speculation on and off, or another k), and so is the drafter's cost from the rest. The speculative machinery's
own cost (spec) comes with every speculative step whatever its k, so only plain steps beside speculative ones
tell it from the step's fixed and per-request costs: with two k and no plain step it is held at the prior
(`unidentified`), its prior variance in the covariance: a plain step's price, and so every S, then carries the
prior's uncertainty about that cost (0.775 ms measured on one engine; a fused, asynchronous one pays far less).
Beside plain steps it is fitted, told from the draft passes' launches by a second k. With one kind of step only
(`split_observed` False: one drafting setting, or tokens per sequence within 25% of each other) those directions
are not identified: at one q, x_per_token moves the step exactly as x_per_request does (both scale with B), and
drafting comes with every step. Fitted anyway, they soak up whatever
the other terms miss (on the real CPU server a window's extra 20% became a per-token cost 2.6x the prior's and an
S(3) of 1.1 where the truth was 2.1). So while the points hold one kind of step, per_token, draft and spec are held at
the prior (x = 0) and keep the prior's variance in the covariance: the curve is priced at the prior's split and
its band covers the rest (policies/model/uncertainty.py). Holding per_token gives the steps' growth with batch
beyond the prior's to per_request, the split under which speculation looks cheapest as the batch grows when the
steps grow faster than the prior says (dearest when slower); the fit also names the other
split of the same steps (`CalibrationFit.split_alternative`: per_request at the prior, per_token taking the
growth), which the band reaches too.
Why fill and gemm_slope: how a decode step's math grows with its tokens is set by the kernels' tiles and how
well small GEMMs use the tensor cores, which no datasheet gives; with one rate and a fixed floor, a fit over a
server's mixed steps missed pure-decode steps by 18-27% on the simulator (policies/model/roofline.py). Both are
identified by decode steps of different sizes: batches across the load's range, and gamma 0 vs gamma k steps
at one batch (k + 1 times the tokens). Each window's batch and step must describe the same steps, even when the
batch moved within it (a load ramp): the batch is the mean a step verified (`Evidence.decode_seqs_per_step`)
and the step the mean duration of those steps (`costmodel.observed_step_s`). The running-requests gauge
averaged over scrapes describes no step on a ramp; when the demo simulator's load jumps between 1 and 24
requests/s, so that its mid-size batches all come from ramps, the gauge left the fit up to ~21% off at mid-size
batches, and the per-step batch paired with the ITL mean (which weights steps by their batch) 28%; paired per
step, 9% on the ramps and 7.5% on held loads (tests/integration/test_model_sim_calibration.py).

Objective (a damped, bounded, robust least squares; Levenberg-Marquardt on the normal equations):
    minimise  sum_i  w_i rho(r_i / s)  +  sum_j (x_j / sigma_j)^2 / 2  [+ telemetry terms]
    r_i   = log T(x; point_i) - log T_obs_i          relative error of point i (log: symmetric, scale-free)
    w_i   = 0.5^(age_i / half_life_s)                old points fade (a redeploy, a driver update, drift)
    rho   = Huber with delta = `huber_delta` (in units of s): quadratic for small residuals, linear beyond, so a
            window dominated by a prefill burst or a stall pulls with a bounded force instead of a squared one
    s     = `step_noise` (0.05): the relative scatter one window's mean step time has (jitter, mix changes)
    prior = x_j ~ N(0, sigma_j^2) (`prior_sigma`, a draft model's `draft_model_sigma`, `fill_sigma`,
            `gemm_slope_sigma` for beta itself): the physics (datasheet peaks x documented efficiencies, one GEMM
            rate) is the starting point; directions the data cannot tell apart (e.g. fixed overhead vs weight
            streaming when every point is memory-bound at one batch) stay at the prior instead of wandering
    bound = |x_j| <= log(`max_scale`) (default 8x either way) for the scales (per_token: `max_per_token_scale`,
            64x: engines spend from ~1 to ~150 us per verified token); 0 <= beta <= `max_gemm_slope`
Incremental, as an online estimator: each tick starts from the previous tick's scales and damping (warm start)
and runs at most `iterations` LM steps, so a fit that needs more converges across ticks; a tick that added no
point to a converged fit refits nothing (the data did not change; only every weight decayed by the same factor,
which moves the optimum by less than the fit's own tolerance). A fit with no previous one (a fresh state) runs up
to `cold_iterations`. Converged means the last accepted step moved no log-scale by more than `step_tolerance`
(1e-3: a 0.1% scale change, far below the 5% step noise), or the next step is predicted to gain less than
`objective_tolerance`. Scales held at a bound by the data are frozen there
for the step (an active set), so a profile off by more than `max_scale` converges at the bound instead of
bouncing off it; a step that would carry a scale past its bound is shortened to stop on it (`_damped_step`), and
a shortened step is no sign of convergence. Example: a server told it is an H100 while it is an A10-class card
whose steps at batch 10-40 and k=3 are compute-bound: its first windows drive the overhead scale to its 8x
bound, and a step that would take it past 8 stops there while the others move; ten minutes in its windows fit
compute 6.7 and overhead 1.6 at a calibration error of 0.6% (memory, which compute-bound steps barely inform,
stays near its prior).
The Jacobian is analytic: with s = smooth_max(a, b) = (a^p + b^p)^(1/p),
    d s / d log a = s a^p / (a^p + b^p)       (and likewise for b),
and through the GEMM rows G = smooth_max(n + pad, N_fill x fill) and the factor (N_ref / G)^beta,
    d log gemm / d log fill = share_fill (1 - beta),    d log gemm / d beta = ln(N_ref / G)    (G < N_ref),
so one pass over the points prices log T and all nine derivatives.

Hardware activity as extra evidence (when present). vLLM's `estimated_read_bytes_per_gpu` / `estimated_flops_
per_gpu` counters say how much work was done per second; DCGM's DRAM / tensor activity ratios (and NVML GPM's
DRAM bandwidth / tensor utilisation) say what share of the units' PEAK rate that work used: DRAM_ACTIVE is the
ratio of cycles the memory interface moves data, so a kernel streaming at 80% of the peak bandwidth reads ~0.8,
the practical ceiling (NVIDIA's DCGM profiling-metric guidance). Dividing one by the other measures the device's
peak, not its sustained rate:
    BW_measured = achieved_read_bytes_per_s / dram_active_ratio     ->  memory  scale obs = BW_peak / BW_measured
    F_measured  = achieved_flops_per_s / tensor_active_ratio        ->  compute scale obs = F_peak / F_measured
with BW_peak, F_peak the profile's datasheet peaks: the scale by which the profile's peak is off, its efficiency
taken as right (the efficiencies stay with the step-time fit). This is what a wrong or missing hardware profile
needs; comparing with the profile's efficiency-scaled rate instead (before 2026-12-03) read a correct profile as
0.85x (memory) or 0.6x (compute) too slow. Each enters as a pseudo-observation of x_memory / x_compute with sd
`telemetry_sigma` (0.15: DCGM activity is a sampled ratio, vLLM's counters are its own estimate, and may leave out
the drafter's bytes that the device counts). All windows' readings of one scale count as ONE observation, their
weighted mean: their error is systematic (the device's efficiency is not the profile's; the drafter's bytes), so
sixty windows do not know it sixty times better. Counted per window, they pinned the memory scale to the peak ratio
(2.0 for a profile 2x too fast, where the world's sustained ratio is 2.07) with a combined sd of 2%, and the fit
bent the other terms to make up for it: mid-size batches 14-19% off on the simulator. Used only when the ratio is
>= 0.05 (a nearly idle unit makes the division meaningless). The counters alone are not used: work per second without
the busy share identifies nothing. Example: vLLM reports 1.2e12 B/s read while DRAM_ACTIVE is 0.6 -> a 2.0e12 B/s peak;
an H100 profile (3.35e12) is then 1.675x too fast: memory scale obs 1.675.

Calibration error (what is exposed): the median over the most recent `error_points` observations of
|T(x; point_i) / T_obs_i - 1|, after the fit. Worked example: three recent points predicted 10.2, 19.0, 31.5 ms
against observed 10.0, 20.0, 30.0 ms -> errors 0.02, 0.05, 0.05 -> calibration error 0.05.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from policies.model.costmodel import ModelContext, observed_step_s, operating_point, step_batch
from policies.model.profiles import DrafterProfile
from policies.model.roofline import (
    GEMM_REFERENCE_TOKENS,
    SMOOTH_MAX_P,
    CostScales,
    Shape,
    StepComponents,
    smooth_max,
    step_components,
)
from policies.types import DataState, DraftMethod, Evidence

_PARAMS = ("memory", "compute", "overhead", "per_request", "per_token", "draft", "spec", "fill", "gemm_slope")
# What steps of one kind (all speculative at one k, or all plain) cannot tell apart (module docstring).
_UNIDENTIFIED_BY_ONE_KIND = frozenset((_PARAMS.index("per_token"), _PARAMS.index("draft"), _PARAMS.index("spec")))
# What speculative steps alone (two k, no plain step) cannot tell apart: the speculative machinery's own cost.
UNIDENTIFIED_WITHOUT_PLAIN = frozenset((_PARAMS.index("spec"),))
_PER_TOKEN = _PARAMS.index("per_token")
_ANCHOR_WEIGHT_TOTAL = 16.0  # a measured profile's points weigh together at most this many fresh live points
_SPLIT_Q_RATIO = 1.25  # tokens per sequence this far apart separate the per-token cost from the per-request one
PARAMS = _PARAMS  # the fitted parameters, in the order of `CalibrationFit.covariance`
_LOG_PARAMS = 8  # the first eight are log-scales; gemm_slope is fitted as it is
_ACCEPTED_STATES = frozenset({DataState.OK, DataState.INSUFFICIENT_DATA})
_MIN_ACTIVITY_RATIO = 0.05
_INITIAL_DAMPING = 1e-3
_MIN_DAMPING = 1e-6
_MAX_DAMPING = 1e12  # a step this damped moves nothing: no descent direction is left


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    """How the fitter weighs its points. Times in seconds; sigmas are log-space standard deviations.

    `half_life_s` (> 0): a point's weight halves every this many seconds. `max_points` (>= 1): oldest dropped
    beyond it. `min_spacing_s` (>= 0): a new window closer than this to the last kept point replaces it (windows
    overlap: consecutive scrapes describe mostly the same steps). `min_step_samples`: ITL samples a window needs.
    `prior_sigma`: per scale (memory, compute, overhead, per_request, draft); 0.5 = a 1.6x error is one sd,
    generous for datasheet peaks x 80-90% efficiencies; host overheads vary more between engine versions and CPUs
    (0.7). The draft scale multiplies terms the other scales already carry (its passes stream at the memory
    scale, its launches cost the overhead scale, both fitted on the target's own steps), so it holds how the
    drafter's kernels differ from the target's. For a head (EAGLE, MTP: one layer and the lm_head, a pass of
    ~0.3 ms of which the launch is most) that is launch- and latency-bound work unlike the target's streaming:
    `prior_sigma`'s 0.5. A draft model (`draft_model_sigma`, `for_drafter`) is a whole transformer stack whose
    passes stream gigabytes through the same kernels as the target's steps, at smaller shapes: 0.3 (1.35x one
    sd). Weight shapes on one GPU spread that much: DeepGEMM's 64-row GEMMs on an H800 streamed 1688 GB/s
    (2112 x 7168) to 2668 GB/s (7168 x 16384) (tests/fixtures/published/gemm-efficiency-vs-m.csv, G-DEEPGEMM),
    a log range of 0.46. `spec_sigma`: the speculative machinery's own cost, 0.7 like the other host
    costs (its prior is one engine's measurement, policies/model/profiles.py `spec_step_overhead_s`).
    `per_token_sigma`: the per-token term's, 0.8 (its prior is fitted across published servers that
    spread 2-3x either side of it: policies/model/profiles.py). `fill_sigma` (log-space) and `gemm_slope_sigma` (beta
    itself): the priors of the GEMM terms; a kernel's tiles put the floor anywhere from one 64-row tile to a few
    hundred rows (0.7: 2x is one sd), and small
    GEMMs reach roughly 1/3 to all of the large-GEMM rate (0.2: beta 0.4 = a 256-row step at 0.44 of it is two
    sd). `max_scale`: bound on each scale either way (`max_per_token_scale` for per_token); `max_gemm_slope`:
    upper bound on beta (lower: 0, an
    efficiency that falls with the GEMM's size is not physical). `step_noise`, `huber_delta`, `telemetry_sigma`: module
    docstring. `iterations`: LM iterations per tick once warm (3-4 suffice: one new point moves the optimum a
    little); `cold_iterations`: for a fit with no previous one; `step_tolerance`: converged when an accepted
    step moves no log-scale by more than this; `objective_tolerance`: converged when the next step is predicted
    to lower the objective by no more than this (1e-5: a change of 2e-5 in chi-square, statistically nothing).
    `error_points`: recent points in the reported error.
    """

    half_life_s: float = 900.0
    max_points: int = 64
    min_spacing_s: float = 20.0
    min_step_samples: float = 20.0
    prior_sigma: tuple[float, float, float, float, float] = (0.5, 0.5, 0.7, 0.5, 0.5)
    draft_model_sigma: float = 0.3
    per_token_sigma: float = 0.8
    spec_sigma: float = 0.7
    fill_sigma: float = 0.7
    gemm_slope_sigma: float = 0.2
    max_scale: float = 8.0
    max_per_token_scale: float = 64.0
    max_gemm_slope: float = 0.8
    step_noise: float = 0.05
    huber_delta: float = 1.5
    telemetry_sigma: float = 0.15
    iterations: int = 4
    cold_iterations: int = 30
    step_tolerance: float = 1e-3
    objective_tolerance: float = 1e-5
    error_points: int = 16

    def __post_init__(self) -> None:
        if not (self.half_life_s > 0 and self.max_points >= 1 and self.min_spacing_s >= 0):
            raise ValueError("half_life_s must be > 0, max_points >= 1, min_spacing_s >= 0")
        if len(self.prior_sigma) != 5 or min(self.prior_sigma) <= 0:
            raise ValueError("prior_sigma needs 5 positive values (memory compute overhead per_request draft)")
        if not (self.fill_sigma > 0 and self.gemm_slope_sigma > 0 and 0 < self.max_gemm_slope <= 1
                and self.per_token_sigma > 0 and self.spec_sigma > 0 and self.draft_model_sigma > 0):
            raise ValueError(
                "fill_sigma, gemm_slope_sigma, per_token_sigma, spec_sigma, draft_model_sigma must be > 0, "
                "max_gemm_slope in (0, 1]")
        if not (self.max_scale > 1 and self.max_per_token_scale > 1 and self.step_noise > 0 and self.huber_delta > 0
                and self.telemetry_sigma > 0):
            raise ValueError("max_scale, max_per_token_scale must be > 1; step_noise, huber_delta, telemetry_sigma > 0")
        if self.iterations < 1 or self.cold_iterations < 1 or self.error_points < 1:
            raise ValueError("iterations, cold_iterations and error_points must be >= 1")
        if not (self.step_tolerance > 0 and self.objective_tolerance > 0):
            raise ValueError("step_tolerance and objective_tolerance must be > 0")


@dataclass(frozen=True, slots=True)
class StepObservation:
    """One window's mean step time at its operating point. `memory_scale_obs` / `compute_scale_obs` are the
    hardware-activity measurements of those scales (module docstring), None without DCGM/GPM activity."""

    at_s: float
    batch: float
    tokens_per_seq: float
    draft_passes: int
    context_tokens: float
    prefill_tokens: float
    step_s: float
    memory_scale_obs: float | None = None
    compute_scale_obs: float | None = None
    prefill_chunk_tokens: float | None = None  # the chunk the prompt tokens arrive in (roofline.Shape)

    @property
    def shape(self) -> Shape:
        """The target forward this window ran (policies/model/roofline.py)."""
        return Shape(
            batch=self.batch, context_tokens=self.context_tokens, tokens_per_seq=self.tokens_per_seq,
            prefill_tokens=self.prefill_tokens, prefill_chunk_tokens=self.prefill_chunk_tokens,
        )


@dataclass(frozen=True, slots=True)
class _TermsCache:
    # Each point's step components, priced once per (point, context) instead of once per tick: a point stays
    # in the history for many ticks, and pricing it (policies/model/roofline.py) costs more than a fit iteration.
    # Keyed by the point objects' identity (`add_observation` carries them over unchanged); holding `points`
    # keeps them alive, so no other object can take one of their ids while the cache exists.
    ctx: ModelContext
    points: tuple[StepObservation, ...]
    terms: tuple[_Terms, ...]
    log_observed: tuple[float, ...]
    # Every point priced at the fitted log-scales (log T and its Jacobian row): the next tick starts there.
    priced: _Evaluation | None = None


@dataclass(frozen=True, slots=True)
class CalibrationState:
    """What the fitter carries between ticks: recent observations (oldest first), the last fitted scales, the LM
    damping it ended with (the next tick's warm start), and whether that fit converged. (`cache` is derived from
    the points and `last_fit` from the fit, speed-ups only; neither takes part in equality.)"""

    points: tuple[StepObservation, ...] = ()
    scales: CostScales = field(default_factory=CostScales)
    # A measured profile's points (policies/model/measured_profile.py): never decayed nor dropped (the deployment was
    # measured on purpose; the live points add to it). Beside live points each weighs min(1, 16 / len(anchors)):
    # together at most as much as 16 fresh live points, so a long profile cannot outvote what the deployment does
    # today (64 live points at most, `max_points`); alone (a what-if, a first tick) each weighs 1.
    # Example: 40 anchors and some live points -> 0.4 each.
    anchors: tuple[StepObservation, ...] = ()
    damping: float = _INITIAL_DAMPING
    converged: bool = False
    cache: _TermsCache | None = field(default=None, compare=False, repr=False)
    last_fit: CalibrationFit | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class CalibrationFit:
    """The fitted scales, how well they explain the recent points, and how many points they rest on.

    `error_ratio`: median |predicted / observed - 1| over the recent points (None without points);
    `newest_error_ratio`: signed predicted / observed - 1 at the newest point. `covariance`: the fit's posterior
    covariance of the parameters (`PARAMS` order: log-scales, then beta), the inverse of the Gauss-Newton matrix
    at the optimum with the prior; with no points it is the prior's (diagonal sigma^2). What the data has not
    identified keeps its prior variance: policies/model/uncertainty.py turns it into the curve's band.
    `split_alternative`: while the per-token cost is not identified by speculative steps of one kind, the other
    explanation of the same points (`_split_alternative`), which the band must also cover; None otherwise (the
    cost identified, no speculative step to split, or nothing to move).
    """

    scales: CostScales
    error_ratio: float | None
    newest_error_ratio: float | None
    points: int
    covariance: tuple[tuple[float, ...], ...] | None = None
    split_alternative: CostScales | None = None


def observation_from(evidence: Evidence, ctx: ModelContext, *, config: CalibrationConfig) -> StepObservation | None:
    """The evidence as a fitting point, or None when it carries no trustworthy step time (state not ok /
    insufficient_data, no ITL, fewer than `min_step_samples` samples, idle engine with batch < 0.5).

    Batch and step describe the same steps: the batch is `costmodel.operating_point`'s (the sequences each engine
    step verified, `decode_seqs_per_step`, when measured, else the running-requests mean) and the step is
    `costmodel.observed_step_s` (the mean duration of those steps, not the ITL mean, which weights each step by
    its batch). The running gauge is a mean over scrapes, which on a load ramp describes no step; with both
    paired per step the demo's ramps converge like held loads (module docstring).

    Example: batch 64, speculation on at k=3 proposing 3.0, ctx 600, prefill 120 tokens/step, T 31 ms ->
    StepObservation(batch=64, tokens_per_seq=4.0, draft_passes=3, context_tokens=600, prefill_tokens=120,
    step_s=0.031).
    """
    step = observed_step_s(evidence)
    if evidence.state not in _ACCEPTED_STATES or step is None:
        return None
    if evidence.step_samples < config.min_step_samples or not step_batch(evidence) >= 0.5:
        return None
    point = operating_point(evidence, budget=ctx.step_token_budget)
    memory_obs, compute_obs = _activity_scales(evidence, ctx)
    return StepObservation(
        at_s=evidence.at_s,
        batch=point.batch,
        tokens_per_seq=point.tokens_per_seq,
        draft_passes=point.draft_steps,
        context_tokens=point.context_tokens,
        prefill_tokens=point.prefill_tokens,
        step_s=step,
        memory_scale_obs=memory_obs,
        compute_scale_obs=compute_obs,
        prefill_chunk_tokens=point.prefill_chunk_tokens,
    )


def _activity_scales(evidence: Evidence, ctx: ModelContext) -> tuple[float | None, float | None]:
    gpu = evidence.gpu
    if gpu is None:
        return None, None
    hardware = ctx.hardware
    memory = compute = None
    dram, tensor = gpu.dram_active_ratio, gpu.tensor_active_ratio
    # Activity ratios are shares of the device's peak rate, so work / activity measures that peak (docstring).
    if evidence.achieved_read_bytes_per_s and dram is not None and dram >= _MIN_ACTIVITY_RATIO:
        measured_peak = evidence.achieved_read_bytes_per_s / dram
        memory = hardware.mem_bandwidth_bytes_per_s / measured_peak
    if evidence.achieved_flops_per_s and tensor is not None and tensor >= _MIN_ACTIVITY_RATIO:
        measured_peak = evidence.achieved_flops_per_s / tensor
        compute = hardware.flops_for_dtype(ctx.model.dtype_bytes) / measured_peak
    return memory, compute


def with_anchors(state: CalibrationState, anchors: Sequence[StepObservation]) -> CalibrationState:
    """`state` fitting `anchors` (a measured profile's points) beside its live points, refit from scratch."""
    return CalibrationState(points=state.points, anchors=tuple(anchors))


def split_observed(points: Sequence[StepObservation]) -> bool:
    """Whether the points hold steps of two kinds: different drafting passes (plain and speculative, or two k) and
    tokens verified per sequence at least `_SPLIT_Q_RATIO` apart. That is what tells the per-token cost and the
    drafting cost from the rest (the band narrows, policies/model/uncertainty.py). Example: [k=3, k=3] -> False;
    [k=3, plain] -> True; [k=3 verifying 4.0, k=1 verifying 2.0] -> True; [plain, k=3 with drafts on 5% of the
    sequence-steps, verifying 1.15] -> False (the two kinds verify nearly the same tokens)."""
    passes = {p.draft_passes for p in points}
    if len(passes) < 2:
        return False
    tokens = [p.tokens_per_seq for p in points]
    return max(tokens) >= _SPLIT_Q_RATIO * min(tokens)


def unidentified(points: Sequence[StepObservation]) -> frozenset[int]:
    """The parameters (`PARAMS` indices) the points cannot identify, held at the prior in the fit (module
    docstring): per_token, draft and spec while the points hold one kind of step (`split_observed` False); spec
    alone while they hold two kinds but no plain step (two k: their difference is draft passes and the tokens
    they verify, while the machinery's own cost comes with both); none once plain steps are seen beside
    speculative ones. Plain steps and ONE k measure draft + spec only as their sum at that k (both are paid per
    speculative step, neither much with B), so the fit splits them by the prior and the posterior covariance
    keeps their correlation; plain steps and two k tell them apart. Example (tokens per sequence 4 and 3, 25%
    apart): [k=3] -> {per_token, draft, spec}; [k=3, k=2] -> {spec}; [k=3, plain] -> {}."""
    if not split_observed(points):
        return _UNIDENTIFIED_BY_ONE_KIND
    if any(p.draft_passes == 0 for p in points):
        return frozenset()
    return UNIDENTIFIED_WITHOUT_PLAIN


def add_observation(
    state: CalibrationState, observation: StepObservation, *, config: CalibrationConfig
) -> CalibrationState:
    """Append `observation`. The newest point is always kept; the one before it is kept only when it lies at least
    `min_spacing_s` after its own predecessor, otherwise the new point replaces it (overlapping windows describe
    the same steps). The oldest beyond `max_points` are dropped. An observation older than the newest is ignored.

    Example: min spacing 20, points at t=0, 30, 35 and a new one at t=40 -> t=0, 30, 40 (35 - 30 < 20: replaced);
    then t=55 -> t=0, 30, 40, 55 (55 - 30 >= 20).
    """
    points = state.points
    if points and observation.at_s < points[-1].at_s:
        return state
    if len(points) >= 2 and points[-1].at_s - points[-2].at_s < config.min_spacing_s:
        points = points[:-1]
    points = (*points, observation)[-config.max_points :]
    return replace(state, points=points)


def _scales(x: Sequence[float]) -> CostScales:
    return CostScales(
        memory=math.exp(x[0]), compute=math.exp(x[1]), overhead=math.exp(x[2]), per_request=math.exp(x[3]),
        per_token=math.exp(x[4]), draft=math.exp(x[5]), spec=math.exp(x[6]), fill=math.exp(x[7]), gemm_slope=x[8],
    )


def _components(ctx: ModelContext, point: StepObservation) -> StepComponents:
    return step_components(
        ctx.hardware, ctx.model, ctx.drafter, point.shape, draft_passes=point.draft_passes,
        tensor_parallel=ctx.tensor_parallel,
    )


# ------------------------------------------------------------------------------------------------------------
# The fitter's inner loops, over flat tuples and plain floats: attribute lookups, CostScales objects and calls
# dominated the cost of a fit that prices every point several times per tick.
# ------------------------------------------------------------------------------------------------------------

# (fixed, per_request, per_token, memory, kv_memory, attention, allreduce, prefill, draft_fixed, draft_memory,
#  draft_compute, passes, gemm_row_s, gemm_tokens + gemm_pad, gemm_fill, prefill_gemm, prompt rows,
#  draft_allreduce, spec_fixed, spec_per_request): `memory` is the weights' streaming, `kv_memory` and `attention`
#  the attention kernels' bytes and math, `prefill_gemm` the prompt tokens' linear layers (priced at the elasticity
#  of all the step's rows: decode + `prompt rows`), `draft_allreduce` one draft pass's TP comms, `spec_*` the
#  speculative machinery's own per-step and per-request cost
_Terms = tuple[
    float, float, float, float, float, float, float, float, float, float, float, float, float, float, float,
    float, float, float, float, float,
]
# (memory, compute, overhead, per_request, per_token, draft, spec, fill, gemm_slope): eight scales and beta
_Scales9 = tuple[float, float, float, float, float, float, float, float, float]
_INV_P = 1.0 / SMOOTH_MAX_P
_LOG_REFERENCE = math.log(GEMM_REFERENCE_TOKENS)
_NO_ELASTICITY = 1e-9  # beta's upper bound where the hardware has no GEMM tiles (its lower bound is 0)
_AT_BOUND = 1e-6  # a parameter this close to a bound is at it: a 0.0001% scale change (beta: 1e-6 itself)


def _terms(comp: StepComponents) -> _Terms:
    return (
        comp.fixed_s, comp.per_request_s, comp.per_token_s, comp.memory_s, comp.kv_memory_s, comp.attention_s,
        comp.allreduce_s, comp.prefill_s, comp.draft_fixed_s, comp.draft_memory_s, comp.draft_compute_s,
        float(comp.draft_passes), comp.gemm_row_s, comp.gemm_tokens + comp.gemm_pad, comp.gemm_fill,
        comp.prefill_gemm_s, comp.prefill_tokens, comp.draft_allreduce_s, comp.spec_fixed_s, comp.spec_per_request_s,
    )


def _gemm(row_s: float, rows_free: float, fill: float, beta: float) -> tuple[float, float, float]:
    """(linear-layer math s, d log / d log fill, d log / d beta) for `rows_free` = tokens + pad rows against a
    floor of `fill` rows at elasticity `beta` (policies/model/roofline.py `gemm_rows`, `gemm_efficiency_factor`)."""
    top = fill if fill > rows_free else rows_free
    if row_s <= 0.0 or top <= 0.0:
        return 0.0, 0.0, 0.0
    rb = math.pow(fill / top, SMOOTH_MAX_P)
    share = math.pow(rows_free / top, SMOOTH_MAX_P) + rb
    rows = top * math.pow(share, _INV_P)
    fill_share = rb / share
    if rows >= GEMM_REFERENCE_TOKENS:
        return row_s * rows, fill_share, 0.0
    size_log = _LOG_REFERENCE - math.log(rows if rows > 1.0 else 1.0)
    gemm = row_s * rows * (math.exp(beta * size_log) if beta != 0.0 else 1.0)
    return gemm, fill_share * (1.0 - beta if rows > 1.0 else 1.0), size_log


def _elasticity(rows_free: float, fill: float, beta: float) -> tuple[float, float, float]:
    """((N_ref / G)^beta, ln(N_ref / G), d log G / d log fill) for G = smooth_max(rows_free, fill) below N_ref
    rows; (1, 0, 0) at or above it (policies/model/roofline.py `gemm_efficiency_factor`)."""
    rows = smooth_max(rows_free, fill)
    if rows >= GEMM_REFERENCE_TOKENS or rows <= 1.0:
        return 1.0, 0.0, 0.0
    size_log = _LOG_REFERENCE - math.log(rows)
    fill_share = math.pow(fill / rows, SMOOTH_MAX_P)
    return math.exp(beta * size_log), size_log, fill_share


def _blend(a: float, b: float) -> tuple[float, float]:
    """(smooth_max(a, b), a's share d log s / d log a) for a, b >= 0 (policies/model/roofline.py `smooth_max`)."""
    top = b if b > a else a
    if top <= 0:
        return 0.0, 0.0
    ra = math.pow(a / top, SMOOTH_MAX_P)
    share = ra + math.pow(b / top, SMOOTH_MAX_P)
    return top * math.pow(share, _INV_P), ra / share


def _price(t: _Terms, scales: _Scales9) -> tuple[float, _Scales9]:
    """log T at `scales` (StepComponents.total_s with roofline 1, up to rounding) and d log T / d x_j for the
    nine parameters (the point's Jacobian row). Each term is linear in the scales it carries; a smooth_max
    s = (a^p + b^p)^(1/p) splits by shares: d s / d log a = s a^p / (a^p + b^p), and b takes the rest."""
    ms, cs, ov, pr, pt, dr, sp, fs, beta = scales
    (fixed, per_request, per_token, memory, kv_memory, attention, allreduce, prefill, draft_fixed, draft_memory,
     draft_compute, passes, row_s, rows_free, fill, prefill_gemm, prompt_rows, draft_allreduce, spec_fixed,
     spec_per_request) = t
    gemm, gemm_fill_slope, gemm_beta_slope = _gemm(row_s, rows_free, fill * fs, beta)
    prefill_beta = prefill_fill = 0.0
    if prefill_gemm > 0.0:
        # The prompt rows at the elasticity of the step's whole rows (policies/model/roofline.py `prefill_at`).
        factor, size_log, fill_share = _elasticity(rows_free + prompt_rows, fill * fs, beta)
        prefill += prefill_gemm * (factor - 1.0)
        prefill_beta = cs * prefill_gemm * factor * size_log
        prefill_fill = -cs * prefill_gemm * factor * beta * fill_share
    forward, forward_memory_share = _blend(ms * (memory + kv_memory), cs * (gemm + attention))
    roof, draft_memory_share = _blend(ms * draft_memory, cs * draft_compute) if passes > 0 else (0.0, 0.0)
    roof *= dr * passes  # the draft passes' roofline, split by memory_share; their comms scale with draft alone
    draft = roof + (dr * passes * draft_allreduce if passes > 0 else 0.0)
    plain_requests = ov * pr * per_request
    spec_requests = ov * sp * pr * spec_per_request
    spec = ov * sp * spec_fixed + spec_requests  # the speculative machinery's own cost
    requests = plain_requests + spec_requests  # every per-request term, the speculative one included
    tokens = ov * pt * per_token
    overhead = ov * fixed + plain_requests + tokens + spec
    launches = dr * ov * draft_fixed
    prefill_s = cs * prefill
    total = overhead + launches + forward + prefill_s + allreduce + draft
    inv = 1.0 / total
    forward_compute = forward * (1.0 - forward_memory_share)
    # d log T / d (log fill, beta): through the linear layers' share of the forward's compute side.
    gemm_part = forward_compute * gemm / (gemm + attention) * inv if gemm + attention > 0 else 0.0
    return math.log(total), (
        (forward * forward_memory_share + roof * draft_memory_share) * inv,
        (forward_compute + prefill_s + roof * (1.0 - draft_memory_share)) * inv,
        (overhead + launches) * inv,
        requests * inv,
        tokens * inv,
        (launches + draft) * inv,
        spec * inv,
        gemm_part * gemm_fill_slope + prefill_fill * inv,
        gemm_part * gemm_beta_slope + prefill_beta * inv,
    )


def log_step_and_slopes(components: StepComponents, x: Sequence[float]) -> tuple[float, tuple[float, ...]]:
    """log T of a step and d log T / d x_j for the nine fitted parameters at x (`PARAMS` order: log-scales, then
    beta), as the fitter prices them. Example: x = 0 (the profile's physics) gives log T = log total_s() and, for
    a batch-1 plain step that is 78% weight streaming, d log T / d log memory ~ 0.78."""
    return _price(_terms(components), _unpack(x))


def _unpack(x: Sequence[float]) -> _Scales9:
    return (
        math.exp(x[0]), math.exp(x[1]), math.exp(x[2]), math.exp(x[3]), math.exp(x[4]), math.exp(x[5]),
        math.exp(x[6]), math.exp(x[7]), x[8],
    )


@dataclass(frozen=True, slots=True)
class _Evaluation:
    """Every point priced at one x: log T and its Jacobian row, in point order."""

    x: tuple[float, ...]
    logs: tuple[float, ...]
    slopes: tuple[_Scales9, ...]


def _evaluate(terms: Sequence[_Terms], x: Sequence[float]) -> _Evaluation:
    scales = _unpack(x)
    priced = [_price(t, scales) for t in terms]
    return _Evaluation(x=tuple(x), logs=tuple(p[0] for p in priced), slopes=tuple(p[1] for p in priced))


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    # Gaussian elimination with partial pivoting on a small symmetric positive-definite system.
    n = len(vector)
    a = [[*row, vector[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        if abs(a[col][col]) < 1e-300:
            return [0.0] * n
        for row in range(col + 1, n):
            factor = a[row][col] / a[col][col]
            for k in range(col, n + 1):
                a[row][k] -= factor * a[col][k]
    out = [0.0] * n
    for row in range(n - 1, -1, -1):
        out[row] = (a[row][n] - sum(a[row][k] * out[k] for k in range(row + 1, n))) / a[row][row]
    return out


@dataclass(frozen=True, slots=True)
class _Problem:
    terms: tuple[_Terms, ...]
    log_observed: tuple[float, ...]
    weights: tuple[float, ...]
    # (parameter index, log of the observed scale, weight) pseudo-observations from hardware activity
    telemetry: tuple[tuple[int, float, float], ...]
    # Parameters the points do not identify, held at the prior (module docstring).
    held: frozenset[int] = frozenset()


def _sigmas(config: CalibrationConfig) -> tuple[float, ...]:
    """Prior sds in `PARAMS` order: memory, compute, overhead, per_request, per_token, draft, spec, fill, beta."""
    memory, compute, overhead, per_request, draft = config.prior_sigma
    return (memory, compute, overhead, per_request, config.per_token_sigma, draft, config.spec_sigma,
            config.fill_sigma, config.gemm_slope_sigma)


def for_drafter(config: CalibrationConfig, drafter: DrafterProfile) -> CalibrationConfig:
    """`config` with the draft scale's prior sd for `drafter`: `draft_model_sigma` for a draft model, `prior_sigma`'s
    fifth (a head's) otherwise (`CalibrationConfig`). Example: defaults and a Llama-3.2-1B draft model -> draft sd
    0.3; an EAGLE-3 head -> 0.5."""
    if drafter.method != DraftMethod.DRAFT_MODEL:
        return config
    return replace(config, prior_sigma=(*config.prior_sigma[:4], config.draft_model_sigma))


def for_other_drafter(fit: CalibrationFit, drafter: DrafterProfile, config: CalibrationConfig) -> CalibrationFit:
    """`fit` as it prices a drafter other than the one its points ran: the draft scale back at its prior (1, with
    `for_drafter`'s variance for `drafter`, uncorrelated with the rest), since the deployed drafter's measured
    passes and launches are not another's; the target's scales, their covariance and the split alternative's other
    scales stay. Example: a fit on an EAGLE-3 head with the draft scale at 1.4 (variance 0.01), pricing a draft
    model -> draft scale 1.0, variance 0.09 (0.3^2)."""
    draft = _PARAMS.index("draft")
    variance = _sigmas(for_drafter(config, drafter))[draft] ** 2
    covariance = fit.covariance
    if covariance is not None:
        covariance = tuple(
            tuple((variance if i == j else 0.0) if draft in (i, j) else value for j, value in enumerate(row))
            for i, row in enumerate(covariance)
        )
    alternative = fit.split_alternative
    return replace(
        fit, scales=replace(fit.scales, draft=1.0), covariance=covariance,
        split_alternative=None if alternative is None else replace(alternative, draft=1.0),
    )


def prior_covariance(config: CalibrationConfig) -> tuple[tuple[float, ...], ...]:
    """The prior's covariance of the parameters (`PARAMS` order): diagonal, sigma_j^2 (what nothing measured
    leaves). Example: the defaults give memory 0.25, compute 0.25, overhead 0.49, per_token 0.64 on the diagonal."""
    sigmas = _sigmas(config)
    return tuple(tuple(s * s if i == j else 0.0 for j in range(len(sigmas))) for i, s in enumerate(sigmas))


def _bounds(config: CalibrationConfig) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(lower, upper) per parameter: +-log(max_scale) for the log-scales, [0, max_gemm_slope] for beta."""
    bounds = [math.log(config.max_scale)] * _LOG_PARAMS
    bounds[_PARAMS.index("per_token")] = math.log(config.max_per_token_scale)
    return (*(-b for b in bounds), 0.0), (*bounds, config.max_gemm_slope)


def _objective(problem: _Problem, at: _Evaluation, config: CalibrationConfig) -> float:
    """The objective at `at.x`, from the points' log T there."""
    x = at.x
    total = 0.0
    noise, delta = config.step_noise, config.huber_delta
    flat = 0.5 * delta * delta
    for log_t, log_obs, weight in zip(at.logs, problem.log_observed, problem.weights, strict=True):
        u = abs(log_t - log_obs) / noise
        total += weight * (0.5 * u * u if u <= delta else delta * u - flat)  # Huber
    for index, log_obs, weight in problem.telemetry:
        total += weight * 0.5 * ((x[index] - log_obs) / config.telemetry_sigma) ** 2
    return total + sum(0.5 * (xj / sj) ** 2 for xj, sj in zip(x, _sigmas(config), strict=True))


def _normal_equations(
    problem: _Problem, at: _Evaluation, config: CalibrationConfig
) -> tuple[list[list[float]], list[float]]:
    """The undamped Gauss-Newton system at `at.x` with Huber IRLS weights. It depends on x only, so a rejected
    step (same x, more damping) reuses it."""
    x = at.x
    n = len(x)
    noise, delta = config.step_noise, config.huber_delta
    cutoff = delta * noise  # |log residual| beyond which Huber's weight falls off as cutoff / |r|
    inv_noise2 = 1.0 / noise**2
    residuals = [log_t - log_obs for log_t, log_obs in zip(at.logs, problem.log_observed, strict=True)]
    point_weights = [
        weight * inv_noise2 * (1.0 if abs(r) <= cutoff else cutoff / abs(r))
        for r, weight in zip(residuals, problem.weights, strict=True)
    ]
    # Column j holds every point's d log T / d log scale_j; the sums over points run in C (map, sum).
    columns = list(zip(*at.slopes, strict=True))
    weighted = [list(map(operator.mul, point_weights, column)) for column in columns]
    gradient = [sum(map(operator.mul, weighted[a], residuals)) for a in range(n)]
    normal = [[0.0] * n for _ in range(n)]
    for a in range(n):
        for b in range(a, n):
            normal[a][b] = normal[b][a] = sum(map(operator.mul, weighted[a], columns[b]))
    for index, log_obs, weight in problem.telemetry:
        precision = weight / config.telemetry_sigma**2
        normal[index][index] += precision
        gradient[index] += precision * (x[index] - log_obs)
    for j, sigma in enumerate(_sigmas(config)):
        normal[j][j] += 1.0 / sigma**2
        gradient[j] += x[j] / sigma**2
    return normal, gradient


def _damped_step(
    system: tuple[list[list[float]], list[float]], x: Sequence[float], damping: float, config: CalibrationConfig,
    held_at_prior: frozenset[int] = frozenset(),
) -> tuple[list[float], bool]:
    """One damped Gauss-Newton step from x; returns the proposed new x (bounded) and whether the step was shortened
    at a bound (its length then says nothing about convergence). A scale at its bound that the gradient, or the
    step solved without it held, pushes further out is held there (its row and column leave the system) and the
    step is solved again, so the others still get a full step instead of one spoiled by clipping (within
    `_AT_BOUND` of a bound counts as at it, so a range narrower than that, beta on a CPU, is held whichever way a
    step pushes); a step that would carry a scale past its bound is shortened to stop on it. Clipped after the
    solve, a step that counted on a scale moving past its bound is no descent at all (the Gauss-Newton model
    predicts a rise, and the fit would stop there as if converged). Example: overhead at 7.1 (bound 8) and a step
    that moves it to 9.5 and memory from 2.5 to 0.9: the step stops at 8, ln(8 / 7.1) / ln(9.5 / 7.1) = 0.41 of the
    way (memory to 2.5 x (0.9 / 2.5)^0.41 = 1.6)."""
    normal, gradient = system
    lower, upper = _bounds(config)
    n = len(x)
    # "At a bound" within _AT_BOUND: a scale a rounding error inside its bound is at it (a range narrower than that,
    # beta on a CPU, is at both ends).
    at_upper = [x[j] >= upper[j] - _AT_BOUND for j in range(n)]
    at_lower = [x[j] <= lower[j] + _AT_BOUND for j in range(n)]
    held = [
        j in held_at_prior or (at_upper[j] and gradient[j] < 0) or (at_lower[j] and gradient[j] > 0)
        for j in range(n)
    ]
    delta = _held_step(normal, gradient, damping, held)
    for _ in range(n):  # each pass holds at least one more scale, or ends
        outward = [j for j in range(n)
                   if not held[j] and ((at_upper[j] and delta[j] > 0) or (at_lower[j] and delta[j] < 0))]
        if not outward:
            break
        for j in outward:
            held[j] = True
        delta = _held_step(normal, gradient, damping, held)
    # A scale the step would carry past its bound stops there, on it, and the whole step with it (the same
    # direction, shortened: still a descent); the next step holds that scale at its bound if it still pushes out.
    share, limit, edge = 1.0, -1, 0.0
    for j in range(n):
        bound = upper[j] if delta[j] > 0 else lower[j]
        if delta[j] != 0.0 and not lower[j] <= x[j] + delta[j] <= upper[j] and (bound - x[j]) / delta[j] < share:
            share, limit, edge = (bound - x[j]) / delta[j], j, bound
    step = [min(max(xj + share * dj, lo), hi) for xj, dj, lo, hi in zip(x, delta, lower, upper, strict=True)]
    if limit >= 0:
        step[limit] = edge
    return step, share < 1.0


def _held_step(normal: list[list[float]], gradient: list[float], damping: float, held: list[bool]) -> list[float]:
    """The damped Gauss-Newton step -(N + damping diag(N))^-1 g over the scales not `held` (0 for those held)."""
    n = len(gradient)
    damped = [
        [0.0 if held[i] or held[j] else normal[i][j] * (1.0 + damping if i == j else 1.0) for j in range(n)]
        for i in range(n)
    ]
    for j in range(n):
        if held[j]:
            damped[j][j] = 1.0
    return _solve(damped, [0.0 if held[j] else -gradient[j] for j in range(n)])


def _predicted_decrease(
    system: tuple[list[list[float]], list[float]], x: Sequence[float], candidate: Sequence[float]
) -> float:
    """What the Gauss-Newton model says the step x -> candidate gains: -(g . d) - d^T N d / 2."""
    normal, gradient = system
    d = [c - xj for c, xj in zip(candidate, x, strict=True)]
    linear = sum(g * dj for g, dj in zip(gradient, d, strict=True))
    quadratic = sum(d[a] * sum(row[b] * d[b] for b in range(len(d))) for a, row in enumerate(normal))
    return -linear - 0.5 * quadratic


def _iterate(
    problem: _Problem, start: _Evaluation, damping: float, budget: int, config: CalibrationConfig
) -> tuple[_Evaluation, float, bool]:
    """Up to `budget` Levenberg-Marquardt steps from `start` at `damping`; returns the points priced at the
    final x, the damping, and whether it converged."""
    at, value = start, _objective(problem, start, config)
    system: tuple[list[list[float]], list[float]] | None = None
    for _ in range(budget):
        if system is None:
            system = _normal_equations(problem, at, config)
        candidate, shortened = _damped_step(system, at.x, damping, config, problem.held)
        moved = max(abs(c - xj) for c, xj in zip(candidate, at.x, strict=True))
        if moved == 0.0:
            return at, damping, True  # every scale held at a bound: nothing can move
        small = not shortened and _predicted_decrease(system, at.x, candidate) <= config.objective_tolerance
        if damping <= 1.0 and small:
            return at, damping, True  # the step could not gain anything that matters: no need to price it
        priced = _evaluate(problem.terms, candidate)
        candidate_value = _objective(problem, priced, config)
        if candidate_value <= value:
            # A short step is convergence only when it was not short for being damped (after rejections) nor
            # shortened at a bound.
            done = moved <= config.step_tolerance and damping <= 1.0 and not shortened
            at, value, damping, system = priced, candidate_value, max(damping / 3.0, _MIN_DAMPING), None
            if done:
                return at, damping, True
        else:
            damping *= 4.0
            if damping > _MAX_DAMPING:
                return at, _INITIAL_DAMPING, True
    return at, damping, False


def _log_scales(scales: CostScales) -> tuple[float, ...]:
    logs = tuple(math.log(getattr(scales, name)) for name in _PARAMS[:_LOG_PARAMS])
    return (*logs, scales.gemm_slope)


def _same(a: tuple[StepObservation, ...], b: tuple[StepObservation, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _cached_terms(state: CalibrationState, ctx: ModelContext) -> _TermsCache:
    """The points' terms (and log step times), anchors first, reusing those of points already priced for this
    context."""
    cache = state.cache
    every = (*state.anchors, *state.points)
    if cache is not None and _same(cache.points, every) and cache.ctx is ctx:
        return cache
    known: dict[int, tuple[_Terms, float]] = {}
    if cache is not None and (cache.ctx is ctx or cache.ctx == ctx):
        known = {id(p): (t, o) for p, t, o in zip(cache.points, cache.terms, cache.log_observed, strict=True)}
    fresh = [known.get(id(p)) or (_terms(_components(ctx, p)), math.log(p.step_s)) for p in every]
    return _TermsCache(
        ctx=ctx, points=every, terms=tuple(f[0] for f in fresh), log_observed=tuple(f[1] for f in fresh)
    )


def _start(state: CalibrationState, cache: _TermsCache, x: tuple[float, ...]) -> _Evaluation:
    """The points priced at x, the previous fit's prices reused for the points it priced there (a tick usually
    adds one point to a history of dozens at an unchanged x)."""
    old = state.cache
    if old is None or old.priced is None or old.priced.x != x or not (old.ctx is cache.ctx or old.ctx == cache.ctx):
        return _evaluate(cache.terms, x)
    known = {id(p): (log_t, row) for p, log_t, row in zip(old.points, old.priced.logs, old.priced.slopes, strict=True)}
    scales = _unpack(x)
    priced = [known.get(id(p)) or _price(t, scales) for p, t in zip(cache.points, cache.terms, strict=True)]
    return _Evaluation(x=x, logs=tuple(p[0] for p in priced), slopes=tuple(p[1] for p in priced))


def _covariance(problem: _Problem, at: _Evaluation, config: CalibrationConfig) -> tuple[tuple[float, ...], ...]:
    """The Laplace approximation of the posterior covariance at the optimum: the inverse of the Gauss-Newton
    matrix (the points' Huber-weighted J^T J / step_noise^2, the telemetry and the prior's 1 / sigma^2). A
    parameter in `problem.held` (not identified by one kind of step) keeps its prior variance, uncorrelated. One
    the data pushes against a bound is not treated apart: its variance is the curvature's at the bound (data and
    prior), so the band may understate how far past the bound the data would have taken it."""
    normal, _ = _normal_equations(problem, at, config)
    n = len(normal)
    sigmas = _sigmas(config)
    for j in problem.held:  # not identified by the points: the prior alone, uncorrelated with the rest
        for i in range(n):
            normal[i][j] = normal[j][i] = 0.0
        normal[j][j] = 1.0 / sigmas[j] ** 2
    columns = [_solve(normal, [1.0 if i == j else 0.0 for i in range(n)]) for j in range(n)]
    covariance = [[columns[j][i] for j in range(n)] for i in range(n)]
    for j in range(n):
        if not covariance[j][j] > 0.0:  # singular (cannot happen with a prior); keep the prior's
            covariance[j] = [0.0] * n
            for i in range(n):
                covariance[i][j] = 0.0
            covariance[j][j] = sigmas[j] ** 2
    return tuple(tuple(row) for row in covariance)


def fit(
    state: CalibrationState, ctx: ModelContext, *, now_s: float, config: CalibrationConfig
) -> tuple[CalibrationState, CalibrationFit]:
    """Refit the nine parameters (eight scales and beta) to the points in `state` (weights decayed to `now_s`, Unix
    seconds) starting from the previous fit and its damping; returns the state with the new scales and the fit's
    summary. At most
    `config.iterations` LM steps once warm (`cold_iterations` for a state never fitted); a converged state whose
    points did not change since is returned as it is. No points: the scales relax to the prior (1.0, beta 0) and
    the error is None.

    Example: points from a server whose memory is really 2x slower than the profile says (every step's memory
    term doubled) at batches 1..256 -> memory scale ~2.0, compute/overhead near 1, error ~ the step noise.
    """
    config = for_drafter(config, ctx.drafter)
    every = (*state.anchors, *state.points)
    if not every:
        empty = CalibrationFit(CostScales(), None, None, 0, covariance=prior_covariance(config))
        return CalibrationState(points=state.points, converged=True, last_fit=empty), empty
    if ctx.hardware.gemm_fill_tokens <= 1.0:
        # No tensor-core tiles or SM waves (a CPU backend): beta models GPU occupancy, which this hardware does not
        # have. Left free, it explained the host overhead of the CPU vLLM's tiny steps as GEMMs growing cheaper per
        # row, and predicted speculation paying MORE at batch 3.5 than at 1 (1.46 vs 1.43 at k=3, against the
        # direction the measured steps show). Pinned to ~0 by its bound.
        config = replace(config, max_gemm_slope=_NO_ELASTICITY)
    cache = _cached_terms(state, ctx)
    if state.converged and state.last_fit is not None and cache is state.cache:
        return state, state.last_fit  # the same points at the same optimum: nothing to refit
    # Capped only beside live points: a profile fitted alone (a what-if) keeps all its information.
    anchor_weight = min(1.0, _ANCHOR_WEIGHT_TOTAL / len(state.anchors)) if state.anchors and state.points else 1.0
    weights = (
        *(anchor_weight for _ in state.anchors),
        *(0.5 ** (max(0.0, now_s - p.at_s) / config.half_life_s) for p in state.points),
    )
    telemetry: list[tuple[int, float, float]] = []
    for index, values in (
        (0, [p.memory_scale_obs for p in every]), (1, [p.compute_scale_obs for p in every])
    ):
        seen = [(math.log(v), w) for v, w in zip(values, weights, strict=True) if v is not None and v > 0]
        if seen:
            # One observation for all windows (module docstring): their weighted mean, at the newest one's weight.
            total = sum(w for _, w in seen)
            telemetry.append((index, sum(v * w for v, w in seen) / total, max(w for _, w in seen)))
    held = unidentified(every)
    problem = _Problem(
        terms=cache.terms, log_observed=cache.log_observed, weights=weights, telemetry=tuple(telemetry), held=held,
    )
    budget = config.iterations if state.last_fit is not None else config.cold_iterations
    x0 = tuple(0.0 if j in held else xj for j, xj in enumerate(_log_scales(state.scales)))
    start = _start(state, cache, x0)
    at, damping, converged = _iterate(problem, start, state.damping, budget, config)
    scales = _scales(at.x)
    # Predicted / observed - 1 per point, from the log step times the fit already has at its x.
    errors = _errors(at, cache)
    median = _median_error(errors, config)
    alternative = (
        _split_alternative(scales, cache.terms, cache.log_observed, weights, config) if _PER_TOKEN in held else None
    )
    summary = CalibrationFit(
        scales, median, errors[-1], len(every), covariance=_covariance(problem, at, config),
        split_alternative=alternative,
    )
    # The next tick starts from log(scales): file the prices under that x (equal to at.x up to rounding).
    cache = replace(cache, priced=replace(at, x=_log_scales(scales)))
    fitted = replace(state, scales=scales, damping=damping, converged=converged, cache=cache, last_fit=summary)
    return fitted, summary


def _errors(at: _Evaluation, cache: _TermsCache) -> list[float]:
    """Predicted / observed - 1 per point, from the log step times priced at `at.x`."""
    return [math.exp(log_t - log_obs) - 1.0 for log_t, log_obs in zip(at.logs, cache.log_observed, strict=True)]


def _median_error(errors: Sequence[float], config: CalibrationConfig) -> float:
    """The calibration error: the median |predicted / observed - 1| over the `error_points` newest of `errors`
    (`_errors`; module docstring's worked example)."""
    recent = sorted(abs(e) for e in errors[-config.error_points :])
    middle = len(recent) // 2
    return recent[middle] if len(recent) % 2 else 0.5 * (recent[middle - 1] + recent[middle])


def _split_alternative(
    scales: CostScales,
    terms: Sequence[_Terms],
    log_observed: Sequence[float],
    weights: Sequence[float],
    config: CalibrationConfig,
) -> CostScales | None:
    """The other explanation of speculative steps that all verify about the same tokens per sequence q: there a
    per-request cost (paid by plain steps too) and a per-verified-token cost (paid for the q - 1 drafted tokens)
    both grow the step as the batch B, so any split of that growth fits alike. The fit holds the per-token scale
    s_t at its prior and lets the per-request scale s_r take the growth; the alternative gives the per-token scale
    what s_r took beyond its prior. Per point i, with R_i the per-request price (plain + s_spec x speculative,
    the part s_r multiplies) and K_i the per-token price (both x the overhead scale, both proportional to B),
    the steps stay the same when (s_r - 1) R_i = (s_t' - s_t) K_i; over points whose q differ a little, in least
    squares on relative step errors (weights w_i / T_i^2, T_i the observed step):
        s_t' = clamp(s_t + (s_r - 1) a, per-token bounds),    a = sum w R K / sum w K^2
        s_r' = s_r - (s_t' - s_t) b,                           b = sum w R K / sum w R^2
    At one q, a b = 1 and s_r' = 1 exactly; a clamped s_t' leaves the rest on s_r'. None when a point is plain
    (K = 0: a plain step pays no verified-token cost, so nothing splits) or nothing moves.
    Example (the CPU profile at q = 2.63: R = 0.20 ms x B on a speculative step, the plain 0.18 ms plus the n-gram
    lookup's 0.02 ms; K = 0.18 ms x B (q - 1)): s_r = 5.91, s_t = 1 -> s_t' = 1 + 4.91 x 0.20 / (0.18 x 1.63) =
    4.35 and s_r' = 1: 0.78 ms per drafted token verified instead of 0.18 ms, and a plain step's per-sequence cost
    0.18 ms instead of 1.06 ms (before the fitted overhead scale, which both share)."""
    ov, pr, sp = scales.overhead, scales.per_request, scales.spec
    rk = kk = rr = 0.0
    for t, log_obs, weight in zip(terms, log_observed, weights, strict=True):
        _, plain_requests, tokens, *_, spec_requests = t  # `_Terms` order
        per_request = ov * (plain_requests + sp * spec_requests)
        per_token = ov * tokens
        if not per_token > 0.0:
            return None
        w = weight * math.exp(-2.0 * log_obs)
        rk += w * per_request * per_token
        kk += w * per_token * per_token
        rr += w * per_request * per_request
    if kk <= 0.0 or rr <= 0.0 or pr == 1.0:
        return None
    bound = config.max_per_token_scale
    per_token_scale = min(max(scales.per_token + (pr - 1.0) * rk / kk, 1.0 / bound), bound)
    per_request_scale = max(pr - (per_token_scale - scales.per_token) * rk / rr, 1.0 / config.max_scale)
    return replace(scales, per_request=per_request_scale, per_token=per_token_scale)


def point_errors(state: CalibrationState) -> tuple[float, ...]:
    """Each point's predicted / observed - 1 at the scales `fit` returned `state` with (anchors first, then the live
    points, oldest first); () for a state not fitted yet. Example: a profile whose k=3 step at batch 1 the fit
    prices at 8.58 ms against 8.00 ms measured -> +0.0725 for that point."""
    cache = state.cache
    if cache is None or cache.priced is None:
        return ()
    return tuple(
        math.exp(log_t - log_obs) - 1.0 for log_t, log_obs in zip(cache.priced.logs, cache.log_observed, strict=True)
    )


def update(
    state: CalibrationState,
    evidence: Evidence,
    ctx: ModelContext,
    *,
    now_s: float,
    config: CalibrationConfig,
) -> tuple[CalibrationState, CalibrationFit]:
    """One tick: add the evidence's window as a point (when it has a trustworthy step time) and refit.

    Example: a first window at batch 1 observing 7.07 ms on an H100 profile that predicts 6.82 ms -> one point;
    the fit moves the scales just enough (the prior resists) that the prediction lands near 7.07 ms, and the
    error is the remaining relative difference.
    """
    observation = observation_from(evidence, ctx, config=config)
    if observation is not None:
        state = add_observation(state, observation, config=config)
    return fit(state, ctx, now_s=now_s, config=config)
