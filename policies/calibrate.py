"""Online calibration: fit the cost model's efficiency terms to the step times the server reports.

The server tells us, every window, its mean step time T_obs at the operating point it runs (ITL histogram
Δsum/Δcount, policies/estimate.py) together with that point: batch B, verified tokens per sequence q, drafting
passes, context ctx and prefill tokens per step P. Each window becomes one `StepObservation`; the fitter state
(`CalibrationState`) carries the recent ones across loop iterations, per target, like `DecideState`.

What is fitted: four multipliers of policies/roofline.py's `CostScales`, in log space x = log(scale):
    memory       1 / (effective bandwidth error)    T's memory term      M(B, q, ctx, P) x memory
    compute      1 / (effective FLOP/s error)       T's compute term     C(B, q, ctx, P) x compute
    overhead     fixed host costs                   step, speculative-step and draft-launch fixed terms
    per_request  per-running-request host costs     plain + speculative bookkeeping + n-gram lookups (x B)
  T(x; point) = StepComponents(point).total_s(exp(x))      (roofline stays 1: it is memory/compute together)

Objective (a damped, bounded, robust least squares; Levenberg-Marquardt on the normal equations):
    minimise  sum_i  w_i rho(r_i / s)  +  sum_j (x_j / sigma_j)^2 / 2  [+ telemetry terms]
    r_i   = log T(x; point_i) - log T_obs_i          relative error of point i (log: symmetric, scale-free)
    w_i   = 0.5^(age_i / half_life_s)                old points fade (a redeploy, a driver update, drift)
    rho   = Huber with delta = `huber_delta` (in units of s): quadratic for small residuals, linear beyond, so a
            window dominated by a prefill burst or a stall pulls with a bounded force instead of a squared one
    s     = `step_noise` (0.05): the relative scatter one window's mean step time has (jitter, mix changes)
    prior = x_j ~ N(0, sigma_j^2): the physics (datasheet peaks x documented efficiencies) is the starting
            point; directions the data cannot tell apart (e.g. fixed overhead vs weight streaming when every
            point is memory-bound at one batch) stay at the prior instead of wandering
    bound = |x_j| <= log(`max_scale`) (default 8x either way)
Iterations start from the previous fit (warm start), so the estimate moves smoothly between ticks.

Hardware activity as extra evidence (when present). vLLM's `estimated_read_bytes_per_gpu` / `estimated_flops_
per_gpu` counters say how much work was done per second; DCGM's DRAM / tensor activity ratios say what fraction
of the time the units were busy. Together they measure the sustained rates directly:
    BW_measured = achieved_read_bytes_per_s / dram_active_ratio      ->  memory  scale obs = BW_model / BW_measured
    F_measured  = achieved_flops_per_s / tensor_active_ratio         ->  compute scale obs = F_model / F_measured
each entering as a pseudo-observation of x_memory / x_compute with sd `telemetry_sigma` (0.15: DCGM activity is
a sampled ratio, vLLM's counters are its own roofline estimate). Used only when the ratio is >= 0.05 (a nearly
idle unit makes the division meaningless). The counters alone are not used: work per second without the busy
fraction does not identify an efficiency.

Calibration error (what is exposed): the median over the most recent `error_points` observations of
|T(x; point_i) / T_obs_i - 1|, after the fit. Worked example: three recent points predicted 10.2, 19.0, 31.5 ms
against observed 10.0, 20.0, 30.0 ms -> errors 0.02, 0.05, 0.05 -> calibration error 0.05.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from policies.costmodel import ModelContext, operating_point
from policies.roofline import SMOOTH_MAX_P, CostScales, StepComponents, step_components
from policies.types import Evidence, TargetState

_PARAMS = ("memory", "compute", "overhead", "per_request", "draft")
_ACCEPTED_STATES = frozenset({TargetState.OK, TargetState.INSUFFICIENT_DATA})
_MIN_ACTIVITY_RATIO = 0.05
_FD_STEP = 1e-4


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    """How the fitter weighs its points. Times in seconds; sigmas are log-space standard deviations.

    `half_life_s` (> 0): a point's weight halves every this many seconds. `max_points` (>= 1): oldest dropped
    beyond it. `min_spacing_s` (>= 0): a new window closer than this to the last kept point replaces it (windows
    overlap: consecutive scrapes describe mostly the same steps). `min_step_samples`: ITL samples a window needs.
    `prior_sigma`: per scale (memory, compute, overhead, per_request); 0.35 = a 1.4x error is one sd, generous
    for datasheet peaks x 80-90% efficiencies; host overheads vary more between engine versions and CPUs (0.7,
    1.0). `max_scale`: bound on each scale either way. `step_noise`, `huber_delta`, `telemetry_sigma`: module
    docstring. `iterations`: LM iterations per tick. `error_points`: recent points in the reported error.
    """

    half_life_s: float = 900.0
    max_points: int = 64
    min_spacing_s: float = 20.0
    min_step_samples: float = 20.0
    prior_sigma: tuple[float, float, float, float, float] = (0.5, 0.5, 0.7, 0.5, 0.5)
    max_scale: float = 8.0
    step_noise: float = 0.05
    huber_delta: float = 1.5
    telemetry_sigma: float = 0.15
    iterations: int = 15
    error_points: int = 16

    def __post_init__(self) -> None:
        if not (self.half_life_s > 0 and self.max_points >= 1 and self.min_spacing_s >= 0):
            raise ValueError("half_life_s must be > 0, max_points >= 1, min_spacing_s >= 0")
        if len(self.prior_sigma) != len(_PARAMS) or min(self.prior_sigma) <= 0:
            raise ValueError("prior_sigma needs 5 positive values (memory compute overhead per_request draft)")
        if not (self.max_scale > 1 and self.step_noise > 0 and self.huber_delta > 0 and self.telemetry_sigma > 0):
            raise ValueError("max_scale must be > 1; step_noise, huber_delta, telemetry_sigma > 0")
        if self.iterations < 1 or self.error_points < 1:
            raise ValueError("iterations and error_points must be >= 1")


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


@dataclass(frozen=True, slots=True)
class _TermsCache:
    # Each point's step components, priced once per (point, context) instead of once per tick: a point stays
    # in the history for many ticks, and pricing it (policies/roofline.py) costs more than a fit iteration.
    # Keyed by the point objects' identity (`add_observation` carries them over unchanged); holding `points`
    # keeps them alive, so no other object can take one of their ids while the cache exists.
    ctx: ModelContext
    points: tuple[StepObservation, ...]
    terms: tuple[_Terms, ...]


@dataclass(frozen=True, slots=True)
class CalibrationState:
    """What the fitter carries between ticks: recent observations (oldest first) and the last fitted scales.
    (`cache` is derived from the points, a speed-up only; it takes no part in equality.)"""

    points: tuple[StepObservation, ...] = ()
    scales: CostScales = field(default_factory=CostScales)
    cache: _TermsCache | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class CalibrationFit:
    """The fitted scales, how well they explain the recent points, and how many points they rest on.

    `error_ratio`: median |predicted / observed - 1| over the recent points (None without points);
    `newest_error_ratio`: signed predicted / observed - 1 at the newest point.
    """

    scales: CostScales
    error_ratio: float | None
    newest_error_ratio: float | None
    points: int


def observation_from(evidence: Evidence, ctx: ModelContext, *, config: CalibrationConfig) -> StepObservation | None:
    """The evidence as a fitting point, or None when it carries no trustworthy step time (state not ok /
    insufficient_data, no ITL, fewer than `min_step_samples` samples, idle engine with batch < 0.5).

    Example: batch 64, speculation on at k=3 proposing 3.0, ctx 600, prefill 120 tokens/step, T 31 ms ->
    StepObservation(batch=64, tokens_per_seq=4.0, draft_passes=3, context_tokens=600, prefill_tokens=120,
    step_s=0.031).
    """
    step = evidence.step_time_s
    if evidence.state not in _ACCEPTED_STATES or step is None or not math.isfinite(step) or step <= 0:
        return None
    if evidence.step_samples < config.min_step_samples or not evidence.batch >= 0.5:
        return None
    point = operating_point(evidence)
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
    )


def _activity_scales(evidence: Evidence, ctx: ModelContext) -> tuple[float | None, float | None]:
    gpu = evidence.gpu
    if gpu is None:
        return None, None
    hardware = ctx.hardware
    memory = compute = None
    dram, tensor = gpu.dram_active_ratio, gpu.tensor_active_ratio
    if evidence.achieved_read_bytes_per_s and dram is not None and dram >= _MIN_ACTIVITY_RATIO:
        measured = evidence.achieved_read_bytes_per_s / dram
        memory = hardware.mem_bandwidth_bytes_per_s * hardware.bandwidth_efficiency / measured
    if evidence.achieved_flops_per_s and tensor is not None and tensor >= _MIN_ACTIVITY_RATIO:
        measured = evidence.achieved_flops_per_s / tensor
        compute = hardware.flops_for_dtype(ctx.model.dtype_bytes) * hardware.flops_efficiency / measured
    return memory, compute


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
        draft=math.exp(x[4]),
    )


def _components(ctx: ModelContext, point: StepObservation) -> StepComponents:
    return step_components(
        ctx.hardware, ctx.model, ctx.drafter, batch=point.batch, tokens_per_seq=point.tokens_per_seq,
        draft_passes=point.draft_passes, context_tokens=point.context_tokens, prefill_tokens=point.prefill_tokens,
        tensor_parallel=ctx.tensor_parallel,
    )


# ------------------------------------------------------------------------------------------------------------
# The fitter's inner loops. They price a step as `StepComponents.total_s` does, operation for operation in the
# same order (so every float is the same), over flat tuples and plain floats: the fit prices each point about
# a hundred times per tick, and attribute lookups, CostScales objects and calls dominated its cost.
# ------------------------------------------------------------------------------------------------------------

# (fixed, per_request, memory, compute, allreduce, prefill, draft_fixed, draft_memory, draft_compute, passes)
_Terms = tuple[float, float, float, float, float, float, float, float, float, float]
_INV_P = 1.0 / SMOOTH_MAX_P


def _terms(comp: StepComponents) -> _Terms:
    return (
        comp.fixed_s, comp.per_request_s, comp.memory_s, comp.compute_s, comp.allreduce_s, comp.prefill_s,
        comp.draft_fixed_s, comp.draft_memory_s, comp.draft_compute_s, float(comp.draft_passes),
    )


def _smooth_max(a: float, b: float) -> float:
    # roofline.smooth_max at p = SMOOTH_MAX_P, step for step (`max` keeps `a` unless `b` is larger).
    top = b if b > a else a
    if top <= 0:
        return 0.0
    return top * math.pow(math.pow(a / top, SMOOTH_MAX_P) + math.pow(b / top, SMOOTH_MAX_P), _INV_P)


_Scales5 = tuple[float, float, float, float, float]  # (memory, compute, overhead, per_request, draft)


def _total(t: _Terms, scales: _Scales5) -> float:
    """StepComponents.total_s at `scales` and roofline 1 (x 1.0 is exact, so it is left out)."""
    ms, cs, ov, pr, dr = scales
    fixed, per_request, memory, compute, allreduce, prefill, draft_fixed, draft_memory, draft_compute, passes = t
    overhead = ov * (fixed + pr * per_request)
    target = _smooth_max(ms * memory, cs * compute) + cs * prefill + allreduce
    draft = passes * _smooth_max(ms * draft_memory, cs * draft_compute)
    return overhead + dr * ov * draft_fixed + (target + dr * draft)


def _shifted_logs(t: _Terms, base: _Scales5, shifted: _Scales5) -> _Scales5:
    """log T with each scale in turn replaced by its shifted value (the finite-difference Jacobian's points);
    the parts a scale does not enter are computed once and reused, which leaves every sum unchanged."""
    fixed, per_request, memory, compute, allreduce, prefill, draft_fixed, draft_memory, draft_compute, passes = t
    ms, cs, ov, pr, dr = base
    ms2, cs2, ov2, pr2, dr2 = shifted
    inner = fixed + pr * per_request
    overhead = ov * inner
    compute_s = cs * compute
    prefill_s = cs * prefill
    target = _smooth_max(ms * memory, compute_s) + prefill_s + allreduce
    draft = passes * _smooth_max(ms * draft_memory, cs * draft_compute)
    launches = dr * ov * draft_fixed
    rest = target + dr * draft
    log = math.log
    return (
        log(overhead + launches + ((_smooth_max(ms2 * memory, compute_s) + prefill_s + allreduce)
                                   + dr * (passes * _smooth_max(ms2 * draft_memory, cs * draft_compute)))),
        log(overhead + launches + ((_smooth_max(ms * memory, cs2 * compute) + cs2 * prefill + allreduce)
                                   + dr * (passes * _smooth_max(ms * draft_memory, cs2 * draft_compute)))),
        log(ov2 * inner + dr * ov2 * draft_fixed + rest),
        log(ov * (fixed + pr2 * per_request) + launches + rest),
        log(overhead + dr2 * ov * draft_fixed + (target + dr2 * draft)),
    )


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


def _exp5(x: Sequence[float]) -> _Scales5:
    return math.exp(x[0]), math.exp(x[1]), math.exp(x[2]), math.exp(x[3]), math.exp(x[4])


def _objective(problem: _Problem, x: Sequence[float], config: CalibrationConfig) -> tuple[float, list[float]]:
    """The objective at x, and log T of every point there (what the next step's residuals start from)."""
    scales = _exp5(x)
    total = 0.0
    logs: list[float] = []
    noise, delta = config.step_noise, config.huber_delta
    for t, log_obs, weight in zip(problem.terms, problem.log_observed, problem.weights, strict=True):
        log_t = math.log(_total(t, scales))
        logs.append(log_t)
        u = (log_t - log_obs) / noise
        total += weight * _huber(u, delta)
    for index, log_obs, weight in problem.telemetry:
        total += weight * 0.5 * ((x[index] - log_obs) / config.telemetry_sigma) ** 2
    return total + sum(0.5 * (xj / sj) ** 2 for xj, sj in zip(x, config.prior_sigma, strict=True)), logs


def _huber(u: float, delta: float) -> float:
    a = abs(u)
    return 0.5 * u * u if a <= delta else delta * (a - 0.5 * delta)


def _normal_equations(
    problem: _Problem, x: list[float], logs: Sequence[float], config: CalibrationConfig
) -> tuple[list[list[float]], list[float]]:
    """The undamped Gauss-Newton system at x with Huber IRLS weights (`logs`: log T per point at x). It depends
    on x only, so a rejected step (same x, more damping) reuses it."""
    n = len(x)
    base = _exp5(x)
    shifted_x = [xj + _FD_STEP for xj in x]
    shifted = _exp5(shifted_x)
    noise, delta = config.step_noise, config.huber_delta
    noise2 = noise**2
    # Per point, in point order: the weighted Jacobian rows and the residual.
    weighted: list[list[float]] = [[] for _ in range(n)]
    columns: list[list[float]] = [[] for _ in range(n)]
    residuals: list[float] = []
    for t, log_t, log_obs, weight in zip(problem.terms, logs, problem.log_observed, problem.weights, strict=True):
        u = (log_t - log_obs) / noise
        irls = 1.0 if abs(u) <= delta else delta / abs(u)
        w = weight * irls / noise2
        for j, log_shifted in enumerate(_shifted_logs(t, base, shifted)):
            jac = (log_shifted - log_t) / _FD_STEP
            columns[j].append(jac)
            weighted[j].append(w * jac)
        residuals.append(log_t - log_obs)
    # Each sum runs over the points in order from 0.0, as accumulating point by point would.
    gradient = [0.0] * n
    normal = [[0.0] * n for _ in range(n)]
    for a in range(n):
        acc = 0.0
        for wa, r in zip(weighted[a], residuals, strict=True):
            acc += wa * r
        gradient[a] = acc
        row = normal[a]
        for b in range(n):
            acc = 0.0
            for wa, jb in zip(weighted[a], columns[b], strict=True):
                acc += wa * jb
            row[b] = acc
    for index, log_obs, weight in problem.telemetry:
        precision = weight / config.telemetry_sigma**2
        normal[index][index] += precision
        gradient[index] += precision * (x[index] - log_obs)
    for j, sigma in enumerate(config.prior_sigma):
        normal[j][j] += 1.0 / sigma**2
        gradient[j] += x[j] / sigma**2
    return normal, gradient


def _damped_step(
    system: tuple[list[list[float]], list[float]], x: list[float], damping: float, config: CalibrationConfig
) -> list[float]:
    """One damped Gauss-Newton step from x; returns the proposed new x (bounded)."""
    normal, gradient = system
    damped = [list(row) for row in normal]
    for j in range(len(x)):
        damped[j][j] *= 1.0 + damping
    delta = _solve(damped, [-g for g in gradient])
    bound = math.log(config.max_scale)
    return [min(max(xj + dj, -bound), bound) for xj, dj in zip(x, delta, strict=True)]


def _cached_terms(state: CalibrationState, ctx: ModelContext) -> _TermsCache:
    cache = state.cache
    if cache is not None and cache.points is state.points and cache.ctx is ctx:
        return cache
    known: dict[int, _Terms] = {}
    if cache is not None and (cache.ctx is ctx or cache.ctx == ctx):
        known = {id(p): t for p, t in zip(cache.points, cache.terms, strict=True)}
    terms = tuple(known.get(id(p)) or _terms(_components(ctx, p)) for p in state.points)
    return _TermsCache(ctx=ctx, points=state.points, terms=terms)


def fit(
    state: CalibrationState, ctx: ModelContext, *, now_s: float, config: CalibrationConfig
) -> tuple[CalibrationState, CalibrationFit]:
    """Refit the four scales to the points in `state` (weights decayed to `now_s`, Unix seconds) starting from
    the previous fit; returns the state with the new scales and the fit's summary. No points: the scales relax
    to the prior (1.0) and the error is None.

    Example: points from a server whose memory is really 2x slower than the profile says (every step's memory
    term doubled) at batches 1..256 -> memory scale ~2.0, compute/overhead near 1, error ~ the step noise.
    """
    if not state.points:
        return replace(state, scales=CostScales(), cache=None), CalibrationFit(CostScales(), None, None, 0)
    cache = _cached_terms(state, ctx)
    terms = cache.terms
    weights = tuple(0.5 ** (max(0.0, now_s - p.at_s) / config.half_life_s) for p in state.points)
    telemetry: list[tuple[int, float, float]] = []
    for p, w in zip(state.points, weights, strict=True):
        if p.memory_scale_obs is not None and p.memory_scale_obs > 0:
            telemetry.append((0, math.log(p.memory_scale_obs), w))
        if p.compute_scale_obs is not None and p.compute_scale_obs > 0:
            telemetry.append((1, math.log(p.compute_scale_obs), w))
    problem = _Problem(
        terms=terms,
        log_observed=tuple(math.log(p.step_s) for p in state.points),
        weights=weights,
        telemetry=tuple(telemetry),
    )
    previous = state.scales
    x = [math.log(getattr(previous, name)) for name in _PARAMS]
    damping = 1e-3
    value, logs = _objective(problem, x, config)
    system: tuple[list[list[float]], list[float]] | None = None
    for _ in range(config.iterations):
        if system is None:
            system = _normal_equations(problem, x, logs, config)
        candidate = _damped_step(system, x, damping, config)
        candidate_value, candidate_logs = _objective(problem, candidate, config)
        if candidate_value <= value:
            converged = value - candidate_value < 1e-9 * max(1.0, value)
            x, value, logs, damping = candidate, candidate_value, candidate_logs, max(damping / 3.0, 1e-6)
            system = None
            if converged:
                break
        else:
            damping *= 4.0
    scales = _scales(x)
    five = (scales.memory, scales.compute, scales.overhead, scales.per_request, scales.draft)
    errors = [_total(t, five) / p.step_s - 1.0 for t, p in zip(terms, state.points, strict=True)]
    recent = sorted(abs(e) for e in errors[-config.error_points :])
    middle = len(recent) // 2
    median = recent[middle] if len(recent) % 2 else 0.5 * (recent[middle - 1] + recent[middle])
    fitted = replace(state, scales=scales, cache=cache)
    return fitted, CalibrationFit(scales, median, errors[-1], len(state.points))


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
