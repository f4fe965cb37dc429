"""The words and causes a decision carries (decide's rule, policies/decide/rule.py): the numbers behind a candidate or
the best option that is not one, the Decision built for an option, and the cause codes that
policies/decide/summary.py turns into its sentence."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from policies.decide.state import DecideConfig
from policies.decide.summary import summarize
from policies.decide.value import Key, Valued, point_at
from policies.types import CurvePoint, DataState, Decision, Evidence, Why, WhyCode


def worth_text(choice: Valued, config: DecideConfig, cost_s: float, *, from_on: bool) -> str:
    """The numbers behind a candidate (or the best option that is not one), for the reason."""
    seen = f" {fmt_point(choice.point)}" if choice.point is not None else ""
    if math.isinf(choice.gain):
        return f"{describe(choice.key)}{seen}, the running gamma is not on the curve"
    # Off is priced against the running option at its best (its band's high end); a gamma at its own low end, or
    # on its expected value when it is a free move between gammas (policies/decide/value.py).
    if not choice.key[0]:
        basis = "against the running option's band high end"
    elif not from_on or cost_s > 0 or choice.point is None or choice.point.extrapolated:
        basis = "at its band's low end"
    else:
        basis = "expected (a free move)"
    text = f"{describe(choice.key)}{seen} gains {choice.gain:+.1%} {basis}"
    if choice.gain < config.margin:
        return text + f" < margin {config.margin:.0%}"
    if cost_s <= 0:
        return text
    won = config.payback_horizon_s * choice.gain
    text += f" x {config.payback_horizon_s:.0f}s = {won:.1f}s vs change cost {cost_s:.1f}s"
    return text if choice.value_s > 0 else text + ": held back by its cost"


def why_stays(choice: Valued | None, config: DecideConfig, *, cost_s: float) -> tuple[Why, ...]:
    """Why the best alternative is not a change: it gains less than the margin, or not what it costs."""
    if choice is None or math.isinf(choice.gain):
        return ()
    to_gamma = choice.key[1]  # an off key is (False, 0)
    if choice.gain < config.margin or cost_s <= 0:
        return (cause(WhyCode.BELOW_MARGIN, to_gamma=to_gamma, gain=choice.gain, margin=config.margin),)
    return (cause(WhyCode.COST, to_gamma=to_gamma, gain=choice.gain, cost_s=cost_s),)


def why_not_ok(evidence: Evidence) -> str:
    told = one_line(evidence.reason)
    if told:
        return told
    if evidence.state is DataState.INSUFFICIENT_DATA:
        drafts = 0.0 if evidence.acceptance is None else evidence.acceptance.drafts
        return f"{drafts:.0f} drafts seen in the window"
    return f"evidence state {evidence.state.value}"


def decision_for(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    key: Key,
    *,
    reason: str,
    now_s: float,
    changed_at_s: float | None,
) -> Decision:
    enabled, gamma = key
    point = point_at(curve, gamma) if enabled else None
    # Disabled is plain decoding: 1.0 by definition. Enabled but off the curve: no prediction, claim no gain.
    speedups = (
        (point.speedup, point.speedup_low, point.speedup_high) if point is not None else (1.0, 1.0, 1.0)
    )
    return Decision(
        target=evidence.target,
        model=evidence.model,
        state=DataState.OK,
        enabled=enabled,
        num_speculative_tokens=gamma,
        expected_speedup=speedups[0],
        expected_speedup_low=speedups[1],
        expected_speedup_high=speedups[2],
        reason=reason,
        evaluated_at_s=now_s,
        curve=tuple(curve),
        changed_at_s=changed_at_s,
    )


def cause(code: WhyCode, **numbers: float) -> Why:
    return Why(code=code, numbers=tuple(numbers.items()))


def explained(decision: Decision, whys: Sequence[Why]) -> Decision:
    """The decision with its causes and the sentence made of them (policies/decide/summary.py)."""
    decision = replace(decision, why=tuple(whys))
    return replace(decision, summary=summarize(decision))


def fmt_point(point: CurvePoint) -> str:
    extrapolated = " extrapolated" if point.extrapolated else ""
    band = f"[{point.speedup_low:.2f}..{point.speedup_high:.2f}]"
    return f"S({point.gamma})={point.speedup:.2f} {band}{extrapolated}"


def describe(key: Key) -> str:
    return f"on, gamma {key[1]}" if key[0] else "off"


def transition(before: Key, after: Key) -> str:
    if before[0] and after[0]:
        return f"switching gamma {before[1]}->{after[1]}"
    if after[0]:
        return f"switching on at gamma {after[1]}"
    return f"switching off (from gamma {before[1]})"


def one_line(text: str) -> str:
    return " ".join(text.split())
