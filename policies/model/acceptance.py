"""Expected accepted length E[L](gamma) from the measured per-position acceptance, beyond it, or from a prior.

Notation: r_i = P(at least i drafts accepted) for i = 1..k (vLLM's per-position counters / drafts; r_0 = 1), so
the tokens one verification emits (bonus token included) have expectation

    E[L](gamma) = 1 + sum_{i=1..gamma} r_i          (tokens per verification, in [1, gamma + 1])

With i.i.d. acceptance alpha this is (1 - alpha^(gamma+1)) / (1 - alpha). Reading r_i for a shorter gamma <= k is
exact: a chain of gamma drafts is accepted exactly as far as the first gamma positions of a k chain.

Beyond the deployed k (gamma > k) nothing was measured. We continue with the last measured conditional
acceptance c_k = r_k / r_{k-1}, shrunk per extra position:

    r_{k+j} = r_k * (s * c_k)^j,   s = 0.90 (point), 0.75 (low band), 1.00 (high band, from the high r_i)

s = 1 is the i.i.d. continuation; s < 1 encodes that drafters get worse deeper in the chain (EAGLE heads are
trained on short horizons). Why 0.90: tests/fixtures/published/vllm-eagle-k-sweep-bs1.csv (eagle3, Llama-3.1-8B)
measures AL 2.36 at k=2 and 2.79 at k=3, consistent with r = (0.78, 0.58, 0.43), c_3 = 0.74. The i.i.d.
continuation predicts AL(7) = 2.79 + 0.32 + 0.24 + 0.17 + 0.13 = 3.65, above the measured 3.54; s = 0.9
predicts 2.79 + 0.29 + 0.19 + 0.13 + 0.09 = 3.48, just below it: conservative, as an extrapolation should be.

With nothing measured (speculation off, never observed) a per-method prior stands in: i.i.d. alpha per method,
band alpha_low = 0.6 alpha, alpha_high = 1 - 0.6 (1 - alpha), every point flagged extrapolated.

How much of a prediction rests on extrapolation: `extrapolated_share` = (sum of the r_i not measured) / E[L],
in [0, 1). Measured up to k: sum_{i=k+1..gamma} r_i / E[L](gamma); from a prior: (E[L] - 1) / E[L] (only the
bonus token is certain). Example: r = (0.78, 0.58, 0.43) measured at k=3, gamma 5 with r_4 = 0.287, r_5 = 0.191
-> E[L] = 3.268, share = 0.478 / 3.268 = 0.146: 15% of the predicted tokens per step are extrapolated.
The speedup is proportional to E[L], so the same share of the predicted speedup rests on the extrapolation.

Engines that count only the accepted total (SGLang: `positions_measured` False) measure
E[L](k) = 1 + m alone, m the mean accepted drafts. The estimator states the i.i.d. profile with that sum as the
point; gamma = k is exact, gamma > k extrapolates as above, and gamma < k is flagged extrapolated with a band that
holds for every drafter: a non-increasing r_1..r_k in [0, 1] summing to m has gamma m / k <= r_1 + ... + r_gamma
<= min(gamma, m). Example: m 1.54 exactly at k 3 (alpha 0.702), gamma 1 -> E[L] 1.70 in [1.51, 2.0]; its share resting
on the assumption is (1.70 - 1.51) / 1.70 = 11%.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from policies.types import AcceptanceEvidence, DraftMethod

EXTRAPOLATION_SHRINK = 0.90
EXTRAPOLATION_SHRINK_LOW = 0.75
EXTRAPOLATION_SHRINK_HIGH = 1.00
PRIOR_LOW_FACTOR = 0.6


@dataclass(frozen=True, slots=True)
class AcceptancePrior:
    """A per-method i.i.d. acceptance `alpha` in (0, 1) used when nothing is measured, with its source."""

    alpha: float
    source: str


# Each alpha solves 1 + alpha + ... + alpha^k = the published mean accepted length (AL) at the quoted k.
METHOD_PRIORS: Mapping[DraftMethod, AcceptancePrior] = {
    DraftMethod.EAGLE: AcceptancePrior(
        0.63,
        "vllm-eagle-k-sweep-bs1.csv: eagle1, Llama-3.1-8B, k=3, AL 2.29 -> 1 + .63 + .40 + .25 = 2.28",
    ),
    DraftMethod.EAGLE3: AcceptancePrior(
        0.76,
        "vllm-eagle-k-sweep-bs1.csv: eagle3, Llama-3.1-8B, k=3, AL 2.79 -> 1 + .76 + .58 + .44 = 2.78",
    ),
    DraftMethod.MTP: AcceptancePrior(
        0.75,
        "DeepSeek-V3 report (arXiv 2412.19437, sec. 5.4.3): 2nd-token acceptance 85-90% at k=1; lowered to 0.75 "
        "for deeper positions of a reused MTP head (assumption)",
    ),
    DraftMethod.NGRAM: AcceptancePrior(
        0.40,
        "specbench-batch1.csv: pld (prompt lookup) AL 1.55-1.74; long-chain i.i.d. AL = 1/(1-alpha) = 1.67",
    ),
    DraftMethod.SUFFIX: AcceptancePrior(
        0.40,
        "specbench-batch1.csv: host-side lookup methods (pld 1.55-1.74, rest 1.63-1.82); same prior as ngram",
    ),
    DraftMethod.DRAFT_MODEL: AcceptancePrior(
        0.55,
        "specbench-batch1.csv: sps (separate draft model) AL 2.01-2.29; alpha 0.55 gives AL(4) = 2.11",
    ),
}


@dataclass(frozen=True, slots=True)
class AcceptancePoint:
    """E[L] at one gamma with its band (tokens per verification, bonus included; gamma 0 -> exactly 1)."""

    gamma: int
    expected_length: float
    expected_length_low: float
    expected_length_high: float
    extrapolated: bool
    extrapolated_share: float = 0.0  # of expected_length, from unmeasured positions (module docstring)
    # Mean tokens the target verifies per sequence at this gamma (`acceptance_curve`); None = gamma + 1.
    verified_tokens: float | None = None


def expected_length(positions: Sequence[float], gamma: int) -> float:
    """E[L](gamma) = 1 + r_1 + ... + r_gamma for per-position acceptance `positions` = (r_1, r_2, ...).

    `gamma` in [0, len(positions)]; raises ValueError outside. Each r_i in [0, 1].
    Example: positions (0.8, 0.6, 0.4): gamma 0 -> 1.0, gamma 2 -> 2.4, gamma 3 -> 2.8.
    """
    if not 0 <= gamma <= len(positions):
        raise ValueError(f"gamma {gamma} outside 0..{len(positions)}")
    return 1.0 + sum(positions[:gamma])


def extrapolate_positions(positions: Sequence[float], *, length: int, shrink: float) -> tuple[float, ...]:
    """Extend measured r_1..r_k to `length` positions: r_{k+j} = r_k (shrink c_k)^j with c_k = r_k / r_{k-1}.

    `positions` non-empty, values in [0, 1], non-increasing; `shrink` in (0, 1] (1 = i.i.d. continuation);
    `length` >= 0 (shorter than k truncates). A zero r_{k-1} gives c_k = 0 (nothing further is accepted).
    Example: (0.8, 0.6), length 4, shrink 0.9: c_2 = 0.75, step 0.675 -> (0.8, 0.6, 0.405, 0.2734).
    """
    if not positions:
        raise ValueError("need at least one measured position to extrapolate")
    measured = tuple(positions[:length])
    if length <= len(positions):
        return measured
    last = positions[-1]
    previous = positions[-2] if len(positions) > 1 else 1.0
    conditional = last / previous if previous > 0 else 0.0
    step = min(max(shrink * conditional, 0.0), 1.0)
    extra = tuple(last * step**j for j in range(1, length - len(positions) + 1))
    return measured + extra


def _clean(values: Sequence[float]) -> tuple[float, ...]:
    # Clamp into [0, 1] and force non-increasing: the estimator already does, but the maths relies on it.
    out: list[float] = []
    ceiling = 1.0
    for value in values:
        ceiling = min(ceiling, max(0.0, min(1.0, float(value))))
        out.append(ceiling)
    return tuple(out)


def _iid(alpha: float, length: int) -> tuple[float, ...]:
    return tuple(alpha**i for i in range(1, length + 1))


def acceptance_curve(
    acceptance: AcceptanceEvidence | None,
    *,
    method: DraftMethod,
    gamma_max: int,
    prefix_stable: bool = True,
    full_length: bool = False,
) -> tuple[AcceptancePoint, ...]:
    """E[L](gamma) with its band for gamma = 0..gamma_max, from the measurement or the method's prior.

    Measured (acceptance with k >= 1 positions): gamma <= k is read off `per_position` exactly (band from
    `per_position_low/high`, widened to contain the point); gamma > k extrapolates (module docstring) and is
    flagged. Nothing measured (None or k = 0): i.i.d. prior `METHOD_PRIORS[method]`, all points extrapolated.
    `gamma_max` >= 0; raises ValueError when negative. Guarantees low <= point <= high and, along gamma,
    non-decreasing values.

    Example: per_position (0.8, 0.6, 0.4), gamma_max 4 -> E[L] 1, 1.8, 2.4, 2.8 (exact) and, at gamma 4,
    c_3 = 0.4 / 0.6, r_4 = 0.4 x 0.9 x 0.667 = 0.24 -> 3.04 (extrapolated).

    `full_length` (a model head or draft model, policies/model/drafter_semantics.py) with drafts counted per
    position (`per_position_given_drafted`, TensorRT-LLM): every gamma but the deployed k is priced from the
    acceptance among drafts that reached each position, each draft proposing all k, since a static k drafts all k
    where a schedule cut some short; the deployed k keeps the measured profile (what runs, schedule included).

    `prefix_stable` False (a drafter whose shorter draft is not a longer one's prefix,
    policies/model/drafter_semantics.py): every 0 < gamma < k is flagged extrapolated and wholly unmeasured
    (`extrapolated_share` (E[L] - 1) / E[L]); the point still reads the k-run's positions.

    Drafts that do not come every step, nor k tokens long (a measurement's `draft_coverage` c < 1 and
    `mean_proposed_length` m < k: n-gram and suffix drafters propose only where they find a match): per
    sequence-step the server emits E_c(gamma) = 1 + c (E[L](gamma) - 1) tokens (the r_i are conditional on a
    draft, so E[L] already reflects short drafts) and the target verifies V(gamma) = 1 + c P(gamma) tokens, with
    P(gamma) = min(gamma, m) for gamma <= k (a draft truncated to gamma tokens proposes at most both; the upper
    bound, so the verification is never under-priced) and gamma m / k above k. `verified_tokens` carries V; the
    prior (nothing measured) drafts every step, gamma tokens long. Example: c 0.58, per_position (0.65, 0.5, 0.39)
    (E[L](3) = 2.54), m 2.7 at k 3 -> E_c(3) = 1 + 0.58 x 1.54 = 1.89 tokens per sequence-step, V(3) = 1 + 0.58 x
    2.7 = 2.57.
    """
    if gamma_max < 0:
        raise ValueError(f"gamma_max must be >= 0, got {gamma_max}")
    static = _full_length_profile(acceptance) if full_length and acceptance is not None else acceptance
    if static is not acceptance:
        # Every gamma priced as a static k, but the deployed k as it runs (the schedule cutting drafts): the point the
        # decision keeps or leaves, and what an audit of the engine's schedule compares against.
        runs = acceptance_curve(acceptance, method=method, gamma_max=gamma_max, prefix_stable=prefix_stable)
        k = len(acceptance.per_position) if acceptance is not None else 0
        as_static = acceptance_curve(static, method=method, gamma_max=gamma_max, prefix_stable=prefix_stable)
        return tuple(runs[p.gamma] if p.gamma == k else p for p in as_static)
    measured = acceptance is not None and len(acceptance.per_position) > 0
    if acceptance is not None and measured:
        k = len(acceptance.per_position)
        point = _clean(acceptance.per_position)
        low_in = acceptance.per_position_low if len(acceptance.per_position_low) == k else point
        high_in = acceptance.per_position_high if len(acceptance.per_position_high) == k else point
        low = _clean([min(lo, p) for lo, p in zip(low_in, point, strict=True)])
        high = _clean([max(hi, p) for hi, p in zip(high_in, point, strict=True)])
        r = extrapolate_positions(point, length=gamma_max, shrink=EXTRAPOLATION_SHRINK)
        r_low = extrapolate_positions(low, length=gamma_max, shrink=EXTRAPOLATION_SHRINK_LOW)
        r_high = extrapolate_positions(high, length=gamma_max, shrink=EXTRAPOLATION_SHRINK_HIGH)
    else:
        k = 0
        alpha = METHOD_PRIORS[method].alpha
        r = _iid(alpha, gamma_max)
        r_low = _iid(alpha * PRIOR_LOW_FACTOR, gamma_max)
        r_high = _iid(1.0 - (1.0 - alpha) * PRIOR_LOW_FACTOR, gamma_max)
    coverage, proposed = _draft_yield(acceptance if measured else None)
    sums_only = acceptance is not None and measured and not acceptance.positions_measured
    points: list[AcceptancePoint] = []
    for gamma in range(gamma_max + 1):
        value = _covered(expected_length(r, gamma), coverage)
        unmeasured = coverage * sum(r[k:gamma]) if measured else value - 1.0
        # Extrapolated low/high could cross the point in pathological inputs; the band must contain it.
        band_low = min(_covered(expected_length(r_low, gamma), coverage), value)
        band_high = max(_covered(expected_length(r_high, gamma), coverage), value)
        extrapolated = gamma > k if measured else gamma > 0
        if sums_only and 0 < gamma < k:
            band_low, band_high = _shorter_than_measured(gamma, k, sum(r_low[:k]), sum(r_high[:k]), coverage, value)
            unmeasured = value - _covered(1.0 + gamma * sum(r[:k]) / k, coverage)
            extrapolated = True
        elif measured and not prefix_stable and 0 < gamma < k:
            unmeasured, extrapolated = value - 1.0, True  # a shorter run drafts other tokens
        points.append(
            AcceptancePoint(
                gamma=gamma,
                expected_length=value,
                expected_length_low=band_low,
                expected_length_high=band_high,
                extrapolated=extrapolated,
                extrapolated_share=max(0.0, unmeasured) / value,
                verified_tokens=1.0 + coverage * proposed(gamma),
            )
        )
    return tuple(points)


def _full_length_profile(acceptance: AcceptanceEvidence) -> AcceptanceEvidence:
    """For a drafter that drafts all k tokens unless the engine cuts it (`full_length`): where the engine counts
    drafts per position, the profile among drafts that reached each position (what a static k would see), each
    draft proposing all k. Example: per_position (0.8, 0.55, 0.15) under a schedule that drafted position 2 half
    as often, given-drafted (0.8, 0.55, 0.30) -> priced with (0.8, 0.55, 0.30), k tokens proposed."""
    given = acceptance.per_position_given_drafted
    k = len(acceptance.per_position)
    if len(given) != k or k == 0 or given == acceptance.per_position:
        return acceptance
    return replace(
        acceptance, per_position=given, per_position_low=acceptance.per_position_given_drafted_low,
        per_position_high=acceptance.per_position_given_drafted_high, mean_proposed_length=float(k),
    )


def _shorter_than_measured(
    gamma: int, k: int, mean_low: float, mean_high: float, coverage: float, value: float
) -> tuple[float, float]:
    """The band of E[L](gamma), 0 < gamma < k, when only the mean accepted drafts m at k is measured (module
    docstring): any non-increasing r_1..r_k in [0, 1] summing to m gives gamma m / k <= r_1 + ... + r_gamma <=
    min(gamma, m) (flat profile, then all-or-nothing), so with m in [mean_low, mean_high] the band is
    1 + gamma mean_low / k .. 1 + min(gamma, mean_high), whatever the drafter's profile. Widened to hold `value`.
    Example: m in [1.4, 1.7] at k 3, gamma 1 -> [1.467, 2.0]."""
    low = _covered(1.0 + gamma * mean_low / k, coverage)
    high = _covered(1.0 + min(float(gamma), mean_high), coverage)
    return min(low, value), max(high, value)


def _covered(length: float, coverage: float) -> float:
    return 1.0 + coverage * (length - 1.0)


def _draft_yield(acceptance: AcceptanceEvidence | None) -> tuple[float, Callable[[int], float]]:
    """(c, P): the share of sequence-steps that draft and the tokens a draft proposes at gamma (docstring above)."""
    if acceptance is None or not acceptance.per_position:
        return 1.0, float
    k = len(acceptance.per_position)
    c = acceptance.draft_coverage
    coverage = min(max(c, 1e-6), 1.0) if math.isfinite(c) else 1.0
    m = acceptance.mean_proposed_length
    mean = min(max(m, 0.0), float(k)) if math.isfinite(m) and m > 0 else float(k)

    def proposed(gamma: int) -> float:
        return min(float(gamma), mean) if gamma <= k else gamma * mean / k

    return coverage, proposed
