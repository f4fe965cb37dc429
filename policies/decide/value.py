"""Value of each option against the one that runs: the pessimistic gain g and V = H x g - C (decide's rule).

An option is (enabled, gamma), gamma 0 when off. Its gain over the running option c is read off the curve (or the
plan's curve), whose speedups S are in the objective's units (per-sequence speed, server throughput or SLO
goodput, policies/model/objectives.py), and is taken at the low end of its 90% band so that a change is paid for only
by a gain the model is sure of:

    c off      -> o on at gamma:  g = S_low(gamma) - 1                         (the band of S vs plain decoding)
    c on at k  -> o off:          g = (1 - S_high(k)) / S(k)                    (the running option at its best)
    c on at k  -> o on at gamma:  g = (S(gamma) exp(-1.645 gain_sd) - S(k)) / S(k)   (gain_sd: only when C > 0)

gain_sd is the sd of log(S(gamma) / S(k)) under the cost model's own uncertainty (CurvePoint.gain_sd,
policies/model/uncertainty.py): while one k runs, how a step grows with the tokens verified is the prior's, and S(1) vs
S(3) differs mostly by it. That doubt is priced only when the move costs a restart (C > 0): a free move between
gammas keeps speculating, its next window shows whether it was right, and undoing it costs nothing, so it is taken
on its expected gain (pessimism then would only keep a gamma the model expects to be worse). The acceptance both
share (measured at k, so at every gamma <= k) cancels in the
ratio; an extrapolated gamma's does not (its positions past k were never run), so it is taken at no more than its
own band's low end, S_low(gamma). Under an ITL SLO g is multiplied by the running option's SLO share
(CurvePoint.slo_share): the tokens the change moves across the SLO per delivered token, not a ratio of goodputs
(1% -> 2% of tokens meeting the SLO is a "100% gain" worth 1% of the service). g is a share of the service, so
g x H is the seconds of service the option wins back over a horizon of H seconds, and

    V(o) = H x g(o) - C        (s; C the change's cost in seconds of service, policies/decide/change_cost.py)

A move to more drafts can also be valued as a trial (`trial_value`, `trial_moments`): its expected gain, with the
way back after it has run and been measured (decide's turn-ons, and its moves up while on).

Example: running gamma 3 at S 1.20 [band high 1.30], off: g = (1 - 1.30) / 1.20 = -0.25; gamma 1 at S 1.35 with
gain_sd 0.05: g = (1.35 exp(-0.082) - 1.20) / 1.20 = +3.6%, V = 600 x 0.0362 - 22.6 = -0.9 s with H 600 s and
C 22.6 s: not worth a restart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from policies.model.uncertainty import Z_90
from policies.types import CurvePoint

# (enabled, gamma); gamma is 0 whenever enabled is False.
Key = tuple[bool, int]


@dataclass(frozen=True, slots=True)
class Valued:
    """One option against the running one: `gain` g (dimensionless share of the service, pessimistic),
    `value_s` V = H x g - C (s), `point` the option's curve point (None for off); `surer`, the option with the
    greatest V that this one was preferred to as just as sure and expected to gain more, `expected` (a share), by
    decide's `_likeliest` (None and NaN otherwise)."""

    key: Key
    gain: float
    value_s: float
    point: CurvePoint | None
    surer: Valued | None = None
    expected: float = math.nan


def point_at(curve: Sequence[CurvePoint], gamma: int) -> CurvePoint | None:
    """The curve point for `gamma` (an int >= 0), or None when the curve has none.

    Example: point_at(curve, 3) on a curve for gamma 0..8 returns the gamma=3 point; point_at(curve, 9) -> None.
    """
    return next((p for p in curve if p.gamma == gamma), None)


def pessimistic_gain(curve: Sequence[CurvePoint], current: Key, option: Key, *, costly: bool) -> float | None:
    """g(option) over `current` (module docstring); None when either has no point on the curve or g is not a
    finite number (a broken point prices nothing). `costly`: the change costs a restart (C > 0), so a move between
    gammas is taken at the low end of its gain's band."""
    gain = _gain(curve, current, option, costly=costly)
    return gain if gain is not None and math.isfinite(gain) else None


def expected_gain(curve: Sequence[CurvePoint], current: Key, option: Key, *, trial: bool = False) -> float | None:
    """g(option) over `current` at the points' own speedups (no band), per delivered token: what each second
    without the change forgoes in expectation (decide's wait). An extrapolated gamma (positions past the measured k
    never ran) is taken at no more than its band's low end, as in `pessimistic_gain`, unless the move is a `trial`
    (a move to more drafts valued by `trial_value`, whose way back bounds what it risks). None as `pessimistic_gain`.
    Example: on at 3 (S 0.80), off -> (1.0 - 0.80) / 0.80 = 0.25; off, gamma 3 at S 1.42 [1.31..1.55] -> 0.42;
    off, gamma 3 extrapolated at S 1.64 [1.04..2.31] -> 0.04, or 0.64 as a trial."""
    new = point_at(curve, option[1]) if option[0] else point_at(curve, 0)
    here = point_at(curve, current[1]) if current[0] else point_at(curve, 0)
    if new is None or here is None or not here.speedup > 0:
        return None
    target = min(new.speedup, new.speedup_low) if new.extrapolated and not trial else new.speedup
    gain = (target - here.speedup) / here.speedup * _share(here)
    return gain if math.isfinite(gain) else None


def _gain(curve: Sequence[CurvePoint], current: Key, option: Key, *, costly: bool) -> float | None:
    new = point_at(curve, option[1]) if option[0] else None
    if option[0] and new is None:
        return None
    if not current[0]:
        off = point_at(curve, 0)
        share = _share(off)
        return (new.speedup_low - 1.0) * share if new is not None else 0.0
    here = point_at(curve, current[1])
    if here is None or not here.speedup > 0:
        return None
    if new is None:
        return (1.0 - here.speedup_high) / here.speedup * _share(here)
    if option == current:
        return 0.0
    target = new.speedup * math.exp(-Z_90 * new.gain_sd) if costly and new.gain_sd > 0 else new.speedup
    if new.extrapolated:
        target = min(target, new.speedup_low)
    return (target - here.speedup) / here.speedup * _share(here)


def value_options(
    curve: Sequence[CurvePoint], current: Key, *, options: Sequence[Key], horizon_s: float, cost_s: float
) -> list[Valued]:
    """Every option in `options` (other than `current`) that the curve can price, valued against `current`:
    V = horizon_s x g - cost_s. Options the curve cannot price (no point) are left out."""
    out: list[Valued] = []
    for key in options:
        if key == current:
            continue
        gain = pessimistic_gain(curve, current, key, costly=cost_s > 0)
        if gain is None:
            continue
        point = point_at(curve, key[1]) if key[0] else None
        out.append(Valued(key=key, gain=gain, value_s=horizon_s * gain - cost_s, point=point))
    return out


def trial_value(
    curve: Sequence[CurvePoint], option: Key, *, horizon_s: float, cost_s: float, trial_s: float
) -> float | None:
    """V_try (s): the value over `horizon_s` of turning on at `option` from off when the move itself measures the
    option and a worse one is left again at one more change's cost (a move up from on: `trial_moments` with
    `trial_value_of`):

        V_try = T x mu + (H - T) x E[max(g, -C / (H - T))] - C        g ~ N(mu, sigma)

    From off: mu = S(gamma) - 1 (per delivered token, x the SLO share while off), sigma = (S_high - S_low) /
    (2 x 1.645), the 90% band read as a normal. From on at k to more drafts (gamma > k, `trial_moments`): mu the
    expected gain over k, sigma from the ratio's uncertainty. T = `trial_s`, the least time a published change runs
    (decide's max(dwell_s, probe_min_s)); C = `cost_s`. E[max(g, a)] = a + (mu - a) Phi(d) + sigma phi(d),
    d = (mu - a) / sigma. The floor a is the way back: after T the gamma's acceptance is measured (its positions
    up to gamma, for a drafter whose shorter drafts are prefixes of longer ones), and a gamma worse than where it
    came from by more than C / (H - T) is left. The floor is optimistic: leaving takes decide's own test (the
    pessimistic band, and paying C), so a gamma only a little worse may be kept.
    None when `trial_moments` cannot price the move (no finite point for the option, or the running one; `option`
    not on or, from on, not more drafts). Example: S(3) = 1.64 [1.04..2.31], H 600 s, T 120 s, C 33 s: mu 0.64,
    sigma 0.386, a -0.069, d 1.84, E 0.645 -> V_try = 76.8 + 309.6 - 33 = 353 s; S(1) = 1.39 [1.11..1.64] (sigma
    0.161): V_try = 46.8 + 187.2 - 33 = 201 s.
    """
    moments = trial_moments(curve, (False, 0), option)
    if moments is None:
        return None
    return trial_value_of(moments, horizon_s=horizon_s, cost_s=cost_s, trial_s=trial_s)


def trial_value_of(
    moments: tuple[float, float], *, horizon_s: float, cost_s: float, trial_s: float
) -> float | None:
    """V_try (s) from a trial's (mu, sigma) (`trial_moments`), as `trial_value`; None when `horizon_s` <= 0 or the
    value is not finite."""
    if horizon_s <= 0:
        return None
    mu, sigma = moments
    trial = min(max(trial_s, 0.0), horizon_s)
    rest = horizon_s - trial
    tail = rest * _expected_max(mu, sigma, -cost_s / rest) if rest > 0 else 0.0
    value = trial * mu + tail - cost_s
    return value if math.isfinite(value) else None


def trial_moments(curve: Sequence[CurvePoint], current: Key, option: Key) -> tuple[float, float] | None:
    """(mu, sigma) of the gain g of a trial move (`trial_value`), shares of the service.

    From off to on at gamma: mu = (S - 1) x share(off), sigma = (S_high - S_low) x share(off) / (2 x 1.645).
    From on at k to on at gamma > k: mu = `expected_gain` at the point speedups (an extrapolated gamma at its point,
    not its low end: running it measures its positions), sigma = (S(gamma) / S(k)) x sd x share(k) = (1 + mu /
    share) x sd x share, sd the sd of log(S(gamma) / S(k)): the cost model's `gain_sd`, or for an extrapolated
    gamma, whose positions past k were never run, at least its own band's ln(S_high / S_low) / (2 x 1.645). None
    for any other move, a point that is missing or not finite, or an extrapolated band without a positive low end.
    Example: on at 3, S(3) 2.58, S(8) 3.14 [2.53..3.88] extrapolated, gain_sd 0.05:
    mu = 0.217, sd = max(0.05, ln(3.88 / 2.53) / 3.29 = 0.130), sigma = 1.217 x 0.130 = 0.158.
    """
    point = point_at(curve, option[1]) if option[0] else None
    if point is None or not all(math.isfinite(x) for x in (point.speedup, point.speedup_low, point.speedup_high)):
        return None
    if not current[0]:
        share = _share(point_at(curve, 0))
        return (point.speedup - 1.0) * share, max(0.0, point.speedup_high - point.speedup_low) * share / (2.0 * Z_90)
    here = point_at(curve, current[1])
    mu = expected_gain(curve, current, option, trial=True)
    if here is None or mu is None or option[1] <= current[1] or not here.speedup > 0:
        return None
    sd = point.gain_sd if math.isfinite(point.gain_sd) and point.gain_sd > 0 else 0.0
    if point.extrapolated:
        if not point.speedup_low > 0:
            return None
        sd = max(sd, math.log(point.speedup_high / point.speedup_low) / (2.0 * Z_90))
    sigma = point.speedup / here.speedup * sd * _share(here)
    return (mu, sigma) if math.isfinite(sigma) else None


_STANDARD_NORMAL = NormalDist()


def _expected_max(mu: float, sigma: float, floor: float) -> float:
    """E[max(X, floor)] for X ~ N(mu, sigma^2) (sigma >= 0). Example: mu 0, sigma 1, floor 0 -> 0.399."""
    if sigma <= 0:
        return max(mu, floor)
    d = (mu - floor) / sigma
    return floor + (mu - floor) * _STANDARD_NORMAL.cdf(d) + sigma * _STANDARD_NORMAL.pdf(d)


def best_on(curve: Sequence[CurvePoint], options: Sequence[Key]) -> CurvePoint | None:
    """gamma*: the point with the best point speedup among the on options (ties: the smaller gamma; non-finite
    speedups skipped), or None. Example: S(1) 1.00 [0.98..1.02], S(2) 0.97 [0.90..1.05] -> the gamma 1 point."""
    found = (point_at(curve, key[1]) for key in options if key[0])
    points = [p for p in found if p is not None and math.isfinite(p.speedup)]
    return max(sorted(points, key=lambda p: p.gamma), key=lambda p: p.speedup, default=None)


def _share(point: CurvePoint | None) -> float:
    share = point.slo_share if point is not None else None
    return share if share is not None and math.isfinite(share) and share >= 0 else 1.0
