"""Binomial confidence intervals for acceptance counts.

Each speculative verification is one Bernoulli trial per draft position ("were at least i+1 drafts
accepted?"), so a per-position acceptance `r_i = successes / trials` is a binomial proportion. We use the
Wilson score interval: unlike the normal (Wald) interval it never leaves [0, 1], it is not degenerate at p =
0 or p = 1 (n-gram drafts on repetitive text often reach r ~ 0.95+), and its coverage stays close to nominal
at the few hundred trials a 60-second window holds. It is also monotone in `successes` at fixed `trials`, so
a non-increasing sequence of per-position counts yields non-increasing lower and upper bounds.
"""

from __future__ import annotations

import math


def wilson_interval(successes: float, trials: float, *, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion `successes / trials`.

    Units: counts (floats, because Prometheus counters are floats; they need not be integers). Valid ranges:
    `trials > 0`, `0 <= successes <= trials`, `z >= 0` (1.96 ~ two-sided 95 %). Returns `(low, high)` with
    `0 <= low <= successes/trials <= high <= 1`.

    With p = successes/trials, n = trials:
        centre = (p + z²/2n) / (1 + z²/n)
        half   = z / (1 + z²/n) * sqrt(p(1-p)/n + z²/4n²)

    Worked example: 515 of 540 drafts accepted at position 0, z = 1.96:
    p = 0.95370, z²/n = 3.8416/540 = 0.0071141, centre = (0.95370 + 0.0035570) / 1.0071141 = 0.95050,
    half = 1.96 / 1.0071141 * sqrt(0.95370*0.04630/540 + 3.8416/1166400) = 1.94615 * 0.0092227 = 0.017949,
    so the interval is about (0.9326, 0.9684).
    """
    if not trials > 0:
        raise ValueError(f"trials must be > 0, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, trials={trials}], got {successes}")
    if not z >= 0:
        raise ValueError(f"z must be >= 0, got {z}")
    p = successes / trials
    z2_n = z * z / trials
    denominator = 1.0 + z2_n
    centre = (p + z2_n / 2.0) / denominator
    half = z / denominator * math.sqrt(p * (1.0 - p) / trials + z2_n / (4.0 * trials))
    # Clip against float rounding at p = 0 or 1, and keep the point inside its own interval.
    low = min(max(0.0, centre - half), p)
    high = max(min(1.0, centre + half), p)
    return low, high
