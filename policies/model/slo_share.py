"""The share of requests whose own mean inter-token latency (ITL) meets an SLO, for an option not yet run.

Per-request mean ITLs are taken as log-normal, ln ITL ~ N(mu, sigma^2), so a share meeting SLO is
    share = max(floor, Phi((ln SLO - mu) / sigma))                                        floor: objectives.py
Two ways to get (mu, sigma), the measured one preferred (policies/model/objectives.py chooses):

1. Measured: vLLM's `request_time_per_output_token_seconds` histogram (each finished request's decode time /
   (its output tokens - 1)), its change over the estimator's window: the requests that finished while the
   running option c served. Its mean m = Δsum / Δcount anchors the location, mu_c = ln m - sigma^2 / 2 (the
   log-normal's mean is exp(mu + sigma^2 / 2)). sigma maximises the buckets' interval-censored likelihood
   plus a log-normal prior around the configured spread sigma_0 (objectives' `slo_itl_spread`):
       L(sigma) = sum_j n_j ln[Phi((ln u_j - mu_c) / sigma) - Phi((ln l_j - mu_c) / sigma)]
                  - (ln sigma - ln sigma_0)^2 / (2 x PRIOR_LOG_SD^2)
   over the buckets j = (l_j, u_j] holding n_j requests (l = 0 below the first bound, u = inf above the last),
   searched on a log grid of sigma in [SIGMA_MIN, SIGMA_MAX] and refined by golden section. Where the requests
   fill several buckets the data set sigma; where they all fall in one (vLLM's bounds near an SLO are 25 / 50 /
   75 ms, 2x apart at 25-50) the buckets only say sigma is small, and the prior holds it near sigma_0.
   Another option gamma moves every request's ITL by the ratio the cost model predicts for the mean,
   r = ITL(gamma) / ITL(c) (s / s), so mu_gamma = mu_c + ln r and
       share(gamma) = max(floor, Phi((ln(SLO x ITL(c) / ITL(gamma)) - mu_c) / sigma))
   Why measured: the level and the spread are the server's own (requests joining and leaving as the load moves,
   prefill chunks landing on some requests' steps, per-request acceptance), and the model's absolute ITL can be
   off by more than the SLO's margin; only its ratio between options is used. Example: every request between 25
   and 50 ms (one histogram bucket, mean 36-40 ms) and a 30 ms SLO: the fit gives ~1% meeting it; interpolating
   the histogram's CDF instead (log-uniform within a bucket) reads 26%. With every request in one bucket the
   bucket's shape is unknown, and the mean is what places the mass inside it. The other options'
   shares rest on the model's ratio, and under an open load on the batch each would hold
   (objectives.open_loop_batch).
   Assumed: one ratio for every request (the step is shared; only per-request acceptance moves requests apart),
   and requests counted alike (the SLO goodput counts tokens; long and short requests are taken to spread alike).
2. Modelled (no histogram, too few finished requests, or a hypothetical workload): mu = ln ITL(gamma) (the
   median at the model's mean) and sigma = sigma_0.
Units: seconds; sigma is a log-spread (0.10: a request's ITL is within +-10% of the median with 68% probability).

Worked example (measured): 100 requests, mean 33 ms, all in the bucket (25, 50] ms; sigma_0 0.10. The buckets
hold every request for any sigma below ~0.12, so they only cap it and the prior pulls it up to the cap (fit:
0.081): mu_c = ln 0.033 - 0.0033. SLO 30 ms: the running option meets it with Phi((ln 0.030 - mu_c) / 0.081) =
Phi(-1.14) = 0.13; an option predicted 10% faster (r = 0.9) with Phi((ln(0.030 / 0.9) - mu_c) / 0.081) =
Phi(0.16) = 0.57.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.types import HistogramReading

# The spread's prior width in log space: sigma_0 x 2 or / 2 is one sd. Wide: servers differ (one with steady
# load and one tenant spreads ~5%, one whose load swings under it 30% or more); the buckets decide when they can.
PRIOR_LOG_SD = math.log(2.0)
SIGMA_MIN = 0.01  # below 1% no server's jitter and acceptance spread go
SIGMA_MAX = 3.0  # a 20x spread between the 16th and 84th percentile: beyond it the shape says nothing more
_GRID_POINTS = 41
_GOLDEN_STEPS = 30
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


@dataclass(frozen=True, slots=True)
class LogNormalItl:
    """ln(per-request mean ITL in s) ~ N(mu, sigma^2) while the running option served."""

    mu: float
    sigma: float

    def share_within(self, limit_s: float) -> float:
        """P(ITL <= limit_s), 0..1."""
        if not (math.isfinite(limit_s) and limit_s > 0):
            return 0.0
        return _phi((math.log(limit_s) - self.mu) / self.sigma)


def modelled_share(itl_s: float, *, slo_s: float, spread: float, floor: float) -> float:
    """max(floor, Phi(ln(SLO / ITL) / spread)) (module docstring, 2). Example: SLO 8 ms, spread 0.10: ITL 8 ms ->
    0.5; 7.2 ms -> Phi(1.05) = 0.853; 11 ms -> the floor."""
    if not (math.isfinite(itl_s) and itl_s > 0):
        return floor
    return max(floor, _phi(math.log(slo_s / itl_s) / spread))


def fit_request_itl(histogram: HistogramReading, *, prior_spread: float) -> LogNormalItl | None:
    """The log-normal of the window's per-request mean ITLs (module docstring, 1); None when the histogram holds
    no request, no buckets, or a mean that is not a positive number.

    Example: 100 requests, sum 3.3 s, all in (0.025, 0.05]: mean 33 ms, sigma 0.081 (the buckets cap it, the prior
    pulls it up to the cap), mu = ln 0.033 - sigma^2 / 2.
    """
    count = histogram.count
    if not (count > 0 and histogram.buckets and math.isfinite(histogram.sum) and histogram.sum > 0):
        return None
    mean_s = histogram.sum / count
    cells = _cells(histogram)
    if not cells:
        return None
    log_mean = math.log(mean_s)
    log_prior = math.log(prior_spread)

    def objective(log_sigma: float) -> float:
        sigma = math.exp(log_sigma)
        mu = log_mean - sigma * sigma / 2.0
        total = 0.0
        for lower, upper, n in cells:
            low = _phi((math.log(lower) - mu) / sigma) if lower > 0 else 0.0
            high = _phi((math.log(upper) - mu) / sigma) if math.isfinite(upper) else 1.0
            total += n * math.log(max(high - low, 1e-300))
        return total - (log_sigma - log_prior) ** 2 / (2.0 * PRIOR_LOG_SD**2)

    lo, hi = math.log(SIGMA_MIN), math.log(SIGMA_MAX)
    grid = [lo + (hi - lo) * i / (_GRID_POINTS - 1) for i in range(_GRID_POINTS)]
    values = [objective(x) for x in grid]
    best = max(range(_GRID_POINTS), key=values.__getitem__)
    # Golden section within the best grid point's neighbours: the optimum lies there unless the grid missed a
    # peak narrower than its step (a factor 1.16 in sigma), which no censored likelihood of this kind has.
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, _GRID_POINTS - 1)]
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = objective(c), objective(d)
    for _ in range(_GOLDEN_STEPS):
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = objective(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = objective(d)
    log_sigma = (a + b) / 2.0 if max(fc, fd) >= values[best] else grid[best]
    sigma = math.exp(log_sigma)
    return LogNormalItl(mu=log_mean - sigma * sigma / 2.0, sigma=sigma)


def shifted_share(
    fitted: LogNormalItl, *, slo_s: float, running_itl_s: float, itl_s: float, floor: float
) -> float | None:
    """max(floor, P_fitted(ITL <= SLO x running_itl_s / itl_s)) (module docstring, 1): the share meeting the SLO
    when every request's mean ITL moves from the running option's (`running_itl_s`, the model's) to `itl_s` (the
    model's for the option). None when the ratio is not computable (the caller models instead).

    Example: mu = ln 0.033 - 0.0033, sigma 0.081, SLO 30 ms, running 40 ms, option 36 ms -> Phi(0.16) = 0.57.
    """
    if not (math.isfinite(running_itl_s) and running_itl_s > 0 and math.isfinite(itl_s) and itl_s > 0):
        return None
    return max(floor, fitted.share_within(slo_s * running_itl_s / itl_s))


def _cells(histogram: HistogramReading) -> list[tuple[float, float, float]]:
    """(lower, upper, requests) per non-empty bucket; cumulative counts made non-decreasing."""
    cells: list[tuple[float, float, float]] = []
    lower, below = 0.0, 0.0
    for le, reading in histogram.buckets:
        cumulative = max(reading, below)
        if cumulative > below and le > lower:
            cells.append((lower, le, cumulative - below))
        lower, below = le, cumulative
    return cells


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
