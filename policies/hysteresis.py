"""Small, separately tested pieces the decision's hysteresis is built from: bounds, minimum change, dwell.

Each helper is pure and knows nothing about speculative decoding: `decide.py` composes them. Keeping them
apart means each rule can be tested alone (STYLE.md habit 2) and a change to one cannot silently move another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

_FLOAT_SLACK = 1e-9


def hysteresis_on(*, currently_on: bool, low: float, high: float, margin: float) -> bool:
    """Whether a feature should be on after this observation, with a dead band between the two thresholds.

    `low`/`high` are the ends of the predicted speedup band (dimensionless ratio vs plain decoding, > 0, low
    <= high); `margin` >= 0 is the extra speedup demanded before switching on. Off -> on only when `low >= 1 +
    margin`; on -> off only when `high < 1`; anywhere between, the current state holds. The asymmetry is the
    point: a band straddling 1 says "we do not know", and not knowing must not flip a deployment either way.

    Example: margin 0.05, band 0.97..1.10: off stays off (0.97 < 1.05) and on stays on (1.10 >= 1).
    """
    if currently_on:
        return high >= 1.0
    return low >= 1.0 + margin


def clears_min_change(*, current: float, proposed: float, min_gain: float) -> bool:
    """Whether moving from `current` to `proposed` gains at least `min_gain` (absolute, in the inputs' units).

    Used on predicted speedups (dimensionless, > 0) with `min_gain` >= 0: a move that gains less than the
    model's noise floor is churn, not improvement. Equality counts as clearing so a `min_gain` of 0 allows any
    non-loss.

    Example: current 1.40, proposed 1.43, min_gain 0.02: gain 0.03 >= 0.02 -> True; proposed 1.41 -> False.
    """
    # Floats: 1.42 - 1.40 is 0.01999..., and a gain exactly at the bar should count as reaching it.
    return proposed - current >= min_gain - _FLOAT_SLACK


@dataclass(frozen=True, slots=True)
class DwellOutcome(Generic[T]):
    """Result of one dwell step.

    `publish` is the value to publish now (the old published value unless the candidate has waited long
    enough); `changed` says `publish` differs from the previously published value; `pending`/`pending_since_s`
    is the candidate still waiting (None when nothing waits); `waited_s` is how long the pending candidate has
    waited so far (0 when nothing waits or it was just published).
    """

    publish: T
    changed: bool
    pending: T | None
    pending_since_s: float | None
    waited_s: float


def apply_dwell(
    *,
    published: T,
    candidate: T,
    pending: T | None,
    pending_since_s: float | None,
    now_s: float,
    dwell_s: float,
) -> DwellOutcome[T]:
    """Publish `candidate` only after it has been the candidate continuously for `dwell_s` seconds.

    Times are epoch seconds supplied by the caller; `dwell_s` >= 0 (0 publishes a new candidate at once).
    Rules: a candidate equal to `published` clears any pending one; a candidate different from the pending one
    restarts the clock at `now_s`; the same pending candidate is published once `now_s - pending_since_s >=
    dwell_s`. A clock that runs backwards counts as no time waited (never as a negative wait that could never
    catch up).

    Example: dwell 120 s, published "off", candidate "on" first seen at t=1000: at t=1040 waited_s=40, still
    "off"; at t=1120 waited 120 >= 120 -> publish "on", changed=True, nothing pending.
    """
    if candidate == published:
        return DwellOutcome(
            publish=published, changed=False, pending=None, pending_since_s=None, waited_s=0.0
        )
    since = pending_since_s if (pending == candidate and pending_since_s is not None) else now_s
    waited = max(0.0, now_s - since)
    if waited >= dwell_s:
        return DwellOutcome(publish=candidate, changed=True, pending=None, pending_since_s=None, waited_s=0.0)
    return DwellOutcome(
        publish=published, changed=False, pending=candidate, pending_since_s=since, waited_s=waited
    )
