"""Shadow actuation: the actions the gate takes are recorded, not sent, and each is later compared with what the
load turned out to be.

A shadow deployment starts on what the engine runs (the evidence's deployed k) and from each shadow action on runs
the action's k (0 = off), as if the change had been applied at once. Each action is scored twice, with the
decision curves of the advisor itself (speedups over plain decoding, in the objective's units):

    predicted gain = S_t0(to) / S_t0(from)                         at the action's tick t0
    realised gain  = exp(mean over ok ticks t in (t0, t0 + H] of ln(S_t(to) / S_t(from)))

the geometric mean of the same ratio over the payback horizon H that followed, priced at each later tick's load,
acceptance and calibration: what the change was worth on the traffic that actually came. An action is evaluated
once its horizon has passed, or earlier when the next action replaces it (over the ticks it held). Example: off
-> k 3 predicted 1.40x at batch 4; the load then rose and the next ten minutes priced k 3 at 1.30, 1.10, 0.95 ...
-> a realised gain of ~1.1x: the change paid, less than promised. A realised gain below 1 says the move lost on
the load that came, which is what an operator wants to know before letting it act.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.types import CurvePoint


@dataclass(frozen=True, slots=True)
class ShadowAction:
    """One recorded action: at `at_s` (Unix s), from k `from_k` to `to_k` (0 = off), with its predicted gain (None
    when the curve lacked either option)."""

    at_s: float
    from_k: int
    to_k: int
    predicted_gain: float | None


@dataclass(frozen=True, slots=True)
class ShadowOutcome:
    """An evaluated action: its realised gain (None when no ok tick followed it) over `ticks` ticks."""

    action: ShadowAction
    realised_gain: float | None
    ticks: int


@dataclass(frozen=True, slots=True)
class ShadowLedger:
    """The shadow deployment's k (None until known), the action being evaluated with its running sum of log
    ratios, and the last evaluated outcome with how many have been evaluated."""

    running_k: int | None = None
    open_action: ShadowAction | None = None
    log_sum: float = 0.0
    ticks: int = 0
    last: ShadowOutcome | None = None
    evaluated: int = 0


def gain_on(curve: Sequence[CurvePoint], to_k: int, from_k: int) -> float | None:
    """S(to_k) / S(from_k) on `curve` (gamma 0 = off, S = 1), or None when either point is missing or not a
    positive finite number. Example: S(0) 1.0, S(3) 0.9 -> gain_on(curve, 0, 3) = 1.11."""
    by_gamma = {point.gamma: point.speedup for point in curve}
    new, old = by_gamma.get(to_k), by_gamma.get(from_k)
    if new is None or old is None or not (math.isfinite(new) and math.isfinite(old)) or new <= 0 or old <= 0:
        return None
    return new / old


def with_deployed(ledger: ShadowLedger, deployed_k: int | None) -> ShadowLedger:
    """The ledger with its k taken from the engine until the first shadow action sets it."""
    if ledger.running_k is not None or deployed_k is None:
        return ledger
    return replace(ledger, running_k=deployed_k)


def record_action(
    ledger: ShadowLedger, *, at_s: float, to_k: int, curve: Sequence[CurvePoint]
) -> tuple[ShadowLedger, ShadowOutcome | None]:
    """Open an action to `to_k` at `at_s` from the ledger's k (the open one, if any, is evaluated now); the shadow
    deployment runs `to_k` from here. Returns the ledger and the outcome closed by it (or None)."""
    closed = _close(ledger)
    ledger = _after_close(ledger, closed)
    from_k = ledger.running_k if ledger.running_k is not None else 0
    action = ShadowAction(at_s=at_s, from_k=from_k, to_k=to_k, predicted_gain=gain_on(curve, to_k, from_k))
    return replace(ledger, running_k=to_k, open_action=action, log_sum=0.0, ticks=0), closed


def observe_tick(
    ledger: ShadowLedger, *, now_s: float, curve: Sequence[CurvePoint] | None, horizon_s: float
) -> tuple[ShadowLedger, ShadowOutcome | None]:
    """Add one ok tick's curve (None: not an ok tick, nothing added) to the open action, and evaluate it once
    `horizon_s` has passed since it was taken. Returns the ledger and the outcome evaluated now (or None)."""
    action = ledger.open_action
    if action is None:
        return ledger, None
    if curve is not None and action.at_s < now_s <= action.at_s + horizon_s:
        ratio = gain_on(curve, action.to_k, action.from_k)
        if ratio is not None:
            ledger = replace(ledger, log_sum=ledger.log_sum + math.log(ratio), ticks=ledger.ticks + 1)
    if now_s < action.at_s + horizon_s:
        return ledger, None
    closed = _close(ledger)
    return _after_close(ledger, closed), closed


def _close(ledger: ShadowLedger) -> ShadowOutcome | None:
    if ledger.open_action is None:
        return None
    realised = math.exp(ledger.log_sum / ledger.ticks) if ledger.ticks else None
    return ShadowOutcome(action=ledger.open_action, realised_gain=realised, ticks=ledger.ticks)


def _after_close(ledger: ShadowLedger, closed: ShadowOutcome | None) -> ShadowLedger:
    if closed is None:
        return ledger
    return replace(ledger, open_action=None, log_sum=0.0, ticks=0, last=closed, evaluated=ledger.evaluated + 1)
