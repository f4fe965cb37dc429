"""The model's own uncertainty in S(gamma): what the calibration has not pinned down, carried into the band.

A curve point's band has two independent parts:
- the acceptance's: E[L] low/high from the drafts counted (policies/model/acceptance.py), already in the point;
- the cost model's: S depends on the fitted scales x (log-scales and beta, policies/model/calibrate.py `PARAMS`),
  known to within the fit's posterior covariance Sigma (the prior's where no data speaks to a direction), and on
  the model's form, whose error e (relative, on a step time) the caller estimates from the calibration: the live
  advisor uses max(median |error| over recent windows, |error at the newest window|) (policies/advise.py), a
  what-if from a measured profile the largest |error| over the profile's points (policies/model/measured_profile.py).

Linear propagation in log space (the delta method): with d_j(gamma) = d log S(gamma) / d x_j by forward
differences of step h,

    var_model(gamma) = d^T Sigma d + e^2                           (log S units)
    low  = S exp(-sqrt(log(S / S_acc_low)^2  + (z sd_model)^2))     the two parts in quadrature
    high = S exp(+sqrt(log(S_acc_high / S)^2 + (z sd_model)^2))

z = 1.645: the band is a two-sided 90% interval, the coverage the real-engine benchmark checks. Why this covers a
compute-bound verification that was never measured: while every observed step verified the same tokens per
sequence, the data cannot tell the per-token cost (and the compute scale at the verify step's size) from the
per-request and fixed costs; their posterior variance stays near the prior's (per_token 0.8, compute 0.5 in log
space), and S(gamma) at a larger q is sensitive to exactly those directions, so its band opens by about
z x 0.8 x (the per-token share of the step): ~x1.6 either way where verified tokens are a third of the step.
Steps at a second q (speculation off and on, another k) identify them and the band closes. A fit whose error e
grew (the form is wrong) widens every band by e.

That linearisation is taken where the fit stands, and at one q the fit stands at one end of a ridge: it holds the
per-token cost at its prior and gives the step's growth with batch to the per-request cost, whose share of the step
is then large and the per-token one small, so the band opens little in the direction that matters most at high
batch. So the band also reaches the other end (`CalibrationFit.split_alternative`: per-request at its prior, the
growth paid per verified token, every observed step priced the same): with d_alt(gamma) = log S_alt - log S,
    low  = min(low, low e^d_alt),   high = max(high, high e^d_alt)      (the same band moved to the other split)
and the ratio's sd against the running option takes max(d_alt(reference) - d_alt(gamma), 0) / z in quadrature:
only where the other split makes the move to gamma gain less (decide discounts a move's gain by that sd).
Example (the real CPU server, k=3 only, steps 2.60 ms at 1 sequence and 7.24 ms at 4.4): S(3) at 4.4 is 1.38
[1.04..1.82] from the fit alone; the other split (0.60 ms per drafted token verified instead of 0.14, after the
fitted overhead scale of 0.77) gives 0.49, and the band becomes [0.37..1.82], where the measured speedup at such
batches was 0.89-1.02.

Example: S = 1.50, acceptance band [1.44, 1.56], d = (-0.20 for per_token, +0.05 for overhead, 0 else),
Sigma diagonal 0.64 / 0.49, e = 0.05: var = 0.0256 + 0.0012 + 0.0025 = 0.0293, sd 0.171, z sd = 0.282;
low = 1.5 exp(-sqrt(0.0408^2 + 0.282^2)) = 1.13, high = 1.5 exp(sqrt(0.0392^2 + 0.282^2)) = 1.99.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from policies.model.calibrate import PARAMS
from policies.model.roofline import CostScales
from policies.types import CurvePoint

Z_90 = 1.6448536269514722  # the standard normal's 95th percentile: a two-sided 90% band
_STEP = 0.1  # forward-difference step: 10% on a scale, 0.1 on beta (S is smooth in both at that size)
Covariance = Sequence[Sequence[float]]


def shifted(scales: CostScales, index: int, step: float) -> CostScales:
    """`scales` with parameter `index` (`PARAMS` order) moved by `step` in its fitted coordinate (log for the
    eight scales, as it is for beta). Example: index 4 (per_token), step 0.1 -> per_token x e^0.1 = x1.105."""
    name = PARAMS[index]
    if name == "gemm_slope":
        return replace(scales, gemm_slope=scales.gemm_slope + step)
    value: float = getattr(scales, name)
    return replace(scales, **{name: value * math.exp(step)})


def _slopes(
    curve_at: Callable[[CostScales], Sequence[CurvePoint]],
    scales: CostScales,
    covariance: Covariance,
    points: Sequence[CurvePoint],
) -> list[tuple[float, ...]]:
    """d log S(gamma) / d x_j for every parameter j (rows) and point (columns), by forward differences."""
    slopes: list[tuple[float, ...]] = []
    for j in range(len(covariance)):
        if covariance[j][j] <= 0.0:
            slopes.append((0.0,) * len(points))
            continue
        moved = curve_at(shifted(scales, j, _STEP))
        slopes.append(tuple(
            (math.log(m.speedup) - math.log(p.speedup)) / _STEP if m.speedup > 0 and p.speedup > 0 else 0.0
            for m, p in zip(moved, points, strict=True)
        ))
    return slopes


def _quadratic(d: Sequence[float], covariance: Covariance) -> float:
    """d^T Sigma d (>= 0 up to rounding)."""
    total = 0.0
    for a, da in enumerate(d):
        if da == 0.0:
            continue
        for b, db in enumerate(d):
            total += da * covariance[a][b] * db
    return max(total, 0.0)


def model_sd(
    curve_at: Callable[[CostScales], Sequence[CurvePoint]],
    scales: CostScales,
    covariance: Covariance,
    *,
    error_ratio: float = 0.0,
    base: Sequence[CurvePoint] | None = None,
    reference_gamma: int | None = None,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(sd of log S(gamma), sd of log(S(gamma) / S(reference))) for every point of `curve_at(scales)` (module
    docstring): the covariance propagated through forward differences of `curve_at`, plus the calibration's form
    error `error_ratio` (>= 0) once. The second is all zeros without a `reference_gamma` on the curve, and 0 at
    the reference itself. Why the ratio has its own sd: two options priced by the same uncertain costs move
    together (a dearer per-draft-token cost lowers both S(1) and S(3), S(3) more), so how sure the model is that
    one beats the other is not read off their two bands."""
    points = tuple(base) if base is not None else tuple(curve_at(scales))
    slopes = _slopes(curve_at, scales, covariance, points)
    form = max(error_ratio, 0.0) ** 2
    columns = [tuple(row[g] for row in slopes) for g in range(len(points))]
    absolute = tuple(math.sqrt(_quadratic(column, covariance) + form) for column in columns)
    index = next((i for i, p in enumerate(points) if p.gamma == reference_gamma), None)
    if index is None:
        return absolute, (0.0,) * len(points)
    reference = columns[index]
    relative = tuple(
        0.0 if g == index
        else math.sqrt(_quadratic([a - r for a, r in zip(column, reference, strict=True)], covariance) + form)
        for g, column in enumerate(columns)
    )
    return absolute, relative


def _split_shifts(
    curve_at: Callable[[CostScales], Sequence[CurvePoint]],
    alternative: CostScales | None,
    points: Sequence[CurvePoint],
) -> tuple[float, ...]:
    """log S_alternative(gamma) - log S(gamma) per point of `points` (priced at the fit's scales): 0 without an
    alternative, or where either is not > 0."""
    if alternative is None:
        return (0.0,) * len(points)
    other = tuple(curve_at(alternative))
    return tuple(
        math.log(o.speedup / p.speedup) if o.speedup > 0.0 and p.speedup > 0.0 else 0.0
        for p, o in zip(points, other, strict=True)
    )


def widen(
    points: Sequence[CurvePoint], sds: Sequence[float], *, z: float = Z_90, gain_sds: Sequence[float] | None = None
) -> tuple[CurvePoint, ...]:
    """Each point's band with the model part `sds` (log-space sd) added in quadrature (module docstring), and its
    `gain_sd` set from `gain_sds` when given; gamma 0's band (the baseline, S = 1 by definition) is left as it is."""
    out: list[CurvePoint] = []
    for index, (given, sd) in enumerate(zip(points, sds, strict=True)):
        point = given if gain_sds is None else replace(given, gain_sd=gain_sds[index])
        if point.gamma == 0 or sd <= 0.0 or point.speedup <= 0.0:
            out.append(point)
            continue
        spread = z * sd
        below = math.log(point.speedup / point.speedup_low) if point.speedup_low > 0 else 0.0
        above = math.log(point.speedup_high / point.speedup) if point.speedup_high > 0 else 0.0
        low = point.speedup * math.exp(-math.sqrt(max(below, 0.0) ** 2 + spread**2))
        high = point.speedup * math.exp(math.sqrt(max(above, 0.0) ** 2 + spread**2))
        out.append(replace(point, speedup_low=low, speedup_high=high))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Spread:
    """What a calibration leaves unknown, for `banded`: the posterior `covariance` of the fitted parameters
    (`PARAMS` order), the model's form error `error_ratio` (a relative step-time error, >= 0) and, while the
    per-token cost is not identified, the other split of the same steps (`alternative`,
    `CalibrationFit.split_alternative`; None when there is none)."""

    covariance: Covariance
    error_ratio: float = 0.0
    alternative: CostScales | None = None


def banded(
    curve_at: Callable[[CostScales], Sequence[CurvePoint]],
    scales: CostScales,
    spread: Spread,
    *,
    base: Sequence[CurvePoint] | None = None,
    reference_gamma: int | None = None,
) -> tuple[CurvePoint, ...]:
    """`curve_at(scales)` (or `base`, already priced there) with the model's uncertainty in every 90% band (z =
    Z_90), and each point's `gain_sd` against `reference_gamma` (the option that runs) when given. With an
    alternative split the band also reaches it, and a gain sd takes max(d_alt(reference) - d_alt(gamma), 0) / z in
    quadrature (module docstring)."""
    points = tuple(base) if base is not None else tuple(curve_at(scales))
    sds, gains = model_sd(
        curve_at, scales, spread.covariance, error_ratio=spread.error_ratio, base=points,
        reference_gamma=reference_gamma,
    )
    shifts = _split_shifts(curve_at, spread.alternative, points)  # all 0 without an alternative
    index = next((i for i, p in enumerate(points) if p.gamma == reference_gamma), None)
    if index is not None:
        gains = tuple(
            math.hypot(gain, max(shifts[index] - shift, 0.0) / Z_90) for gain, shift in zip(gains, shifts, strict=True)
        )
    widened = widen(points, sds, z=Z_90, gain_sds=gains if reference_gamma is not None else None)
    return tuple(_reach(point, shift) for point, shift in zip(widened, shifts, strict=True))


def _reach(point: CurvePoint, shift: float) -> CurvePoint:
    """`point`'s band joined with the same band moved by `shift` in log S (the other split's curve, as sure as this
    one): low = min(low, low e^shift), high = max(high, high e^shift). Gamma 0 (S = 1 by definition) is left."""
    if point.gamma == 0 or shift == 0.0:
        return point
    moved = math.exp(shift)
    return replace(
        point, speedup_low=min(point.speedup_low, point.speedup_low * moved),
        speedup_high=max(point.speedup_high, point.speedup_high * moved),
    )
