"""I.i.d. acceptance: the mean accepted length of a chain of k drafts each accepted with probability alpha, and
its inverse. Shared by the estimator (engines that count only the accepted total) and the what-if (a stated mean).

    E[L](alpha, k) = 1 + alpha + alpha^2 + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)   (tokens per verification)

E[L] rises strictly with alpha on [0, 1] from 1 to k + 1, so each mean length in that range has one alpha.
"""

from __future__ import annotations

import math

_TOLERANCE = 1e-12


def mean_length_iid(alpha: float, k: int) -> float:
    """E[L] at k drafts for i.i.d. acceptance alpha: 1 + alpha + ... + alpha^k.

    alpha in [0, 1], k >= 0. Example: alpha 0.8, k 3 -> 1 + 0.8 + 0.64 + 0.512 = 2.952.
    """
    return sum(alpha**i for i in range(k + 1))


def iid_rate_for_mean_length(mean_length: float, k: int) -> float:
    """The i.i.d. alpha in [0, 1] whose mean accepted length at k >= 1 drafts is `mean_length` in [1, k + 1].

    Bisection to 1e-12. Raises ValueError outside the ranges (callers check and name their own input).
    Example: mean_length 2.952, k 3 -> 0.8 (1 + 0.8 + 0.64 + 0.512 = 2.952).
    """
    if k < 1 or not (math.isfinite(mean_length) and 1.0 <= mean_length <= k + 1.0):
        raise ValueError(f"mean length {mean_length} at k={k}: need k >= 1 and a length in [1, k + 1]")
    low, high = 0.0, 1.0
    while high - low > _TOLERANCE:
        middle = 0.5 * (low + high)
        if mean_length_iid(middle, k) < mean_length:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def iid_positions(alpha: float, length: int) -> tuple[float, ...]:
    """r_i = alpha^i for i = 1..length. Example: alpha 0.5, length 3 -> (0.5, 0.25, 0.125)."""
    return tuple(alpha**i for i in range(1, length + 1))
