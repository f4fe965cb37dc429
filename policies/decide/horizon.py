"""Planning a change that costs a restart over the load the server has recently run, not only this window's.

Why. Where a change is free (an engine that adapts per batch, `change_cost_s` = 0) the best gamma for this
window is the answer and the next window corrects it. Where it costs a restart, the change is a bet on the
next `payback_horizon_s`, and the best forecast of that is the recent past, not the last minute: a server whose
load swings between light (speculation pays in latency, little in tokens) and heavy (a smaller gamma buys
capacity) should not restart into the heavy phase's gamma two minutes into it, dropping hundreds of requests
for a gain that ends with the phase; it should move to the gamma that serves the mix best while the load is
light and a restart drops almost nothing (restarting at 28 requests/s with 830 queued errors those requests for a
phase that may end a minute later; at 1 request/s it drops almost nothing).

Units: everything in tokens/s of the objective (policies/model/objectives.py), so a light and a heavy moment weigh
what they are worth. A tick's value of option gamma, with c the option running and U the value rate it
delivers now (generated tokens/s; times its share meeting the SLO under an SLO), is

    V_t(gamma) = U_t x S_t(gamma) / S_t(c)         tokens/s (per-sequence speed x rate when latency-bound,
                                                   throughput when capacity-bound, SLO goodput under an SLO)

and the plan is the time-decayed mean over ticks, weight exp(-(now - t) / tau), tau = `tau_s` (the payback
horizon: the past that long is the forecast of the future that long):

    V(gamma) = sum_t w_t V_t(gamma) / sum_t w_t        S_plan(gamma) = V(gamma) / V(0)

`horizon_curve` returns S_plan with each point's band scaled as this tick's (S_low / S, S_high / S); decide then
runs its rules on it unchanged. The restart's cost is in seconds of service at today's delivered rate G_now
(generated tokens/s); a gain on the plan is a share of V(c): decide compares them in one unit by scaling the
cost by `cost_scale` = G_now / V(c) (cheap while light, dear while heavy). With one tick, or a steady load,
V = U_now x S / S(c) and the scale is G_now / U_now: 1 without an SLO, 1 / share(c) under one, which is
exactly decide's single-window rule (a gain counted per delivered token).

Worked example (gamma 3 running, a tick every 5 s, tau 600 s): 200 s at
300 tokens/s where S(1) / S(3) = 1.46 / 1.70 (V_t(1) - V_t(3) = -42), then 6000 tokens/s capacity-bound where
1.14 / 1.05 (+514). 120 s into the heavy phase V(1) - V(3) = +202 tokens/s over V(3) = 2800: a planned gain of
7.2% (43 s over 600 s) against a restart priced x 6000 / 2800 = 2.14: 20 s + in-flight ~6 s = 26 s becomes 56 s,
plus the queue (x 0.82, `queue_weight`): held. After 240 s of it and 60 s of light again, V(1) - V(3) = +251 over
V(3) = 3307, a 7.6% gain (46 s) against a restart x 300 / 3307 = 0.09: 20.8 s becomes 1.9 s, and it moves.

When the acceptance moves. Each tick's values are priced with that tick's acceptance: the plan averages the load,
but the drafter's acceptance is the model's, and old ticks priced on an acceptance that no longer holds say
nothing about what each gamma is worth now (60 s after a drafter's acceptance fell from 0.85 to 0.15, ticks from
before the fall would still hold up the gamma it had favoured). So the plan also keeps, for each gamma, the decayed
mean of its expected accepted length E_t[L](gamma) (`CurvePoint.expected_accepted_length`) over the ticks that
measured it (a live window while speculating at k measures gamma 1..k), and a measured tick at c restarts the plan
(keeping the capacity-bound seconds: the load history still holds) when

    |ln(E_now[L](c) / E_plan[L](c))| > max(margin, ln(S_high(c) / S_low(c)) / 2)

the running option's accepted length moved by more than its own 90% band's half width (the window's noise, and the
model's, so a jitter of the measurement does not restart it) and than decide's margin (a smaller move cannot make
any change worth it). Example: E_plan[L](3) = 3.2, this window 2.6 with S(3) = 1.40 [1.30..1.52]: |ln 0.8125| =
0.208 > max(0.02, 0.078): the plan restarts from this tick. A band without a finite, positive low and high end
(an SLO the low end misses) is noise without bound: no restart. Ticks that measured nothing (off, or a thin
window priced from a remembered profile) and gammas never measured (past the running k) neither restart the plan
nor enter the mean.

The queue. A restart errors the queued requests as well as the running ones. Whether that loses service depends
on whether the server would have caught up with them: in a persistent overload it is busy either way (the
queue it drops is replaced within seconds), in a transient one the queue is work it would have served once the
load fell. `queue_weight` = 1 - (decayed seconds capacity-bound) / tau is the estimate of the chance it catches
up (~0 after an hour of overload, 0.82 two minutes into one, 1 for a plan that has seen none), by which decide
weighs the queue's output tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.types import CurvePoint

# The most one tick may add to the capacity-bound seconds (s): a few estimator windows.
MAX_TICK_GAP_S = 60.0


@dataclass(frozen=True, slots=True)
class HorizonState:
    """The decayed sums the plan carries between ticks: `values[g]` = sum of w x V_t(g) (tokens/s), `weight` =
    sum of w, `capacity_s` = the decayed seconds spent capacity-bound (each tick counts the time since the one
    before, at most `MAX_TICK_GAP_S`), `accepted[g]` = sum of w x E_t[L](g) (tokens per verification) and
    `measured[g]` = sum of w over the ticks that measured gamma g, all decayed to `at_s` (Unix s; None: empty)."""

    values: tuple[float, ...] = ()
    weight: float = 0.0
    capacity_s: float = 0.0
    at_s: float | None = None
    accepted: tuple[float, ...] = ()
    measured: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class HorizonTick:
    """One tick as the plan sees it: `curve` its objective curve (gamma 0..n, contiguous), `running_gamma` the
    option running (0 = off), `value_rate` U_t (tokens/s; None, non-finite or <= 0: nothing is added, the sums
    only decay), `capacity_bound` whether the tick was, `measured` whether its acceptance was measured live while
    speculating (not remembered, not the prior's)."""

    curve: Sequence[CurvePoint]
    running_gamma: int
    value_rate: float | None
    capacity_bound: bool
    measured: bool = False


def observe(state: HorizonState, tick: HorizonTick, *, now_s: float, tau_s: float, margin: float) -> HorizonState:
    """Add this tick's values V_t(gamma) (module docstring) to the plan, decaying the sums over `tau_s` (s) to
    `now_s` (Unix s). A curve of another length than the plan's (the deployed k moved past gamma_max) restarts
    the plan, and so does a move of the running option's accepted length past its band and `margin` (decide's
    least gain, a share; module docstring "When the acceptance moves").

    Example: empty plan, curve S = (1.0, 1.46, 1.60, 1.70), gamma 3 running at 300 tokens/s -> values (176.5,
    257.6, 282.4, 300.0), weight 1.0.
    """
    curve, value_rate = tick.curve, tick.value_rate
    decay, gap = 1.0, 0.0
    if state.at_s is not None and tau_s > 0:
        gap = max(0.0, now_s - state.at_s)
        decay = math.exp(-gap / tau_s)
    values = tuple(v * decay for v in state.values)
    weight = state.weight * decay
    accepted = tuple(a * decay for a in state.accepted)
    measured = tuple(m * decay for m in state.measured)
    # A long gap (the sidecar was down, the target unreachable) says nothing about how long the overload lasted.
    capacity_s = state.capacity_s * decay + (min(gap, MAX_TICK_GAP_S) if tick.capacity_bound else 0.0)
    kept = HorizonState(values, weight, capacity_s, now_s, accepted, measured)  # a tick that teaches nothing
    running = _speed_of(curve, tick.running_gamma)
    if value_rate is None or not (math.isfinite(value_rate) and value_rate > 0):
        return kept
    if running is None or not (math.isfinite(running) and running > 0):
        return kept
    added = tuple(value_rate * p.speedup / running for p in curve)
    if not all(math.isfinite(t) and t >= 0 for t in added):
        return kept  # a broken curve point: teaches nothing
    n, seen = len(added), _measured_gammas(tick)
    moved = seen and _acceptance_moved(accepted, measured, curve, running_gamma=tick.running_gamma, margin=margin)
    if moved or len(values) != n or len(accepted) != n or len(measured) != n:
        values, weight, accepted, measured = (0.0,) * n, 0.0, (0.0,) * n, (0.0,) * n
    return HorizonState(
        values=tuple(v + t for v, t in zip(values, added, strict=True)),
        weight=weight + 1.0,
        capacity_s=capacity_s,
        at_s=now_s,
        accepted=tuple(a + (p.expected_accepted_length if p.gamma in seen else 0.0)
                       for a, p in zip(accepted, curve, strict=True)),
        measured=tuple(m + (1.0 if p.gamma in seen else 0.0) for m, p in zip(measured, curve, strict=True)),
    )


def _measured_gammas(tick: HorizonTick) -> frozenset[int]:
    """The gammas whose accepted length this tick measured: 1..k of a live window at k (finite, positive lengths),
    none otherwise."""
    if not tick.measured or tick.running_gamma < 1:
        return frozenset()
    return frozenset(
        p.gamma for p in tick.curve
        if 1 <= p.gamma <= tick.running_gamma
        and math.isfinite(p.expected_accepted_length) and p.expected_accepted_length > 0
    )


def _acceptance_moved(
    accepted: tuple[float, ...], measured: tuple[float, ...], curve: Sequence[CurvePoint], *, running_gamma: int,
    margin: float,
) -> bool:
    """|ln(E_now[L](c) / E_plan[L](c))| > max(margin, ln(S_high(c) / S_low(c)) / 2) for c = `running_gamma`
    (module docstring); False when the plan never measured c or the band has no finite, positive ends."""
    point = _point_of(curve, running_gamma)
    if point is None or not 1 <= running_gamma < min(len(accepted), len(measured)) or not measured[running_gamma] > 0:
        return False
    then, now = accepted[running_gamma] / measured[running_gamma], point.expected_accepted_length
    low, high = point.speedup_low, point.speedup_high
    if not (then > 0 and now > 0 and low > 0 and math.isfinite(then) and math.isfinite(high) and high >= low):
        return False
    return abs(math.log(now / then)) > max(margin, math.log(high / low) / 2.0)


def planned_rate(state: HorizonState, gamma: int) -> float | None:
    """V(gamma), tokens/s (module docstring); None when the plan is empty or has no such gamma."""
    if state.weight <= 0 or not 0 <= gamma < len(state.values):
        return None
    return state.values[gamma] / state.weight


def cost_scale(state: HorizonState, *, running_gamma: int, delivered_rate: float | None) -> float | None:
    """G_now / V(running): what converts a restart's cost (seconds of service at today's delivered rate,
    `delivered_rate` generated tokens/s) into the plan's units (module docstring); None when either is missing.

    Example: 300 tokens/s now, V(3) = 3400 -> 0.088; steady under an SLO with share(3) = 0.3 -> 1 / 0.3.
    """
    here = planned_rate(state, running_gamma)
    if delivered_rate is None or not (math.isfinite(delivered_rate) and delivered_rate > 0):
        return None
    if here is None or not here > 0:
        return None
    return delivered_rate / here


def queue_weight(state: HorizonState, *, tau_s: float) -> float:
    """1 - the decayed capacity-bound seconds over tau_s (0..1): the chance the server would have served a queue a
    restart drops (module docstring). The whole horizon is the denominator, so time not yet observed counts as
    not capacity-bound: a fresh plan (a restarted sidecar) does not take one overloaded tick for a persistent
    overload. Example: tau 600 s, capacity-bound for the last 120 s -> 1 - 600 x (1 - e^-0.2) / 600 = 0.82; for
    the last hour -> 0.0025."""
    if not tau_s > 0:
        return 1.0
    return max(0.0, min(1.0, 1.0 - state.capacity_s / tau_s))


def queue_cost_s(state: HorizonState, queued_s: float, *, tau_s: float) -> float:
    """Seconds of full service a restart loses by erroring the queue: `queue_weight` x min(queued_s, tau_s), with
    queued_s the queue's output in seconds of full service (decide.queued_work_s) and tau_s the payback horizon.

    Why the cap. The gain side is counted over the horizon (gain x tau_s), so the cost side may count only what
    the server could have served of the queue within it: tau_s seconds of full service at the most. Without
    the cap a queue that grows without bound (arrivals past the capacity at any gamma) became a cost that grew
    with it, and the advisor held a setting that cost 45% of the throughput for as long as the overload lasted
    (2000 requests/s on a poor drafter: queue_weight 0.37 x 2160 s of queue against a gain of 335 s, and rising).
    Example: tau 600 s, 120 s capacity-bound (weight 0.82): a queue of 10 s costs 8.2 s; one of 2160 s costs
    0.82 x 600 = 492 s, not 1771 s; after an hour of overload (weight 0.0025) 1.5 s.
    """
    if not (math.isfinite(queued_s) and queued_s > 0):
        return 0.0
    bounded = min(queued_s, tau_s) if tau_s > 0 else queued_s
    return queue_weight(state, tau_s=tau_s) * bounded


def horizon_curve(state: HorizonState, curve: Sequence[CurvePoint]) -> tuple[CurvePoint, ...] | None:
    """S_plan(gamma) = V(gamma) / V(0) for the gammas of `curve`, each band scaled as this tick's, `slo_share`
    cleared (the plan is in the objective's tokens already); None when the plan is empty or does not match the
    curve.

    Example: V = (2800, 3050, 3000, 2900) -> S_plan = (1.0, 1.089, 1.071, 1.036); a tick point S(1) = 1.46
    [1.40..1.52] gives S_plan(1) = 1.089 [1.044..1.134].
    """
    if state.weight <= 0 or len(state.values) != len(curve) or not curve:
        return None
    base = state.values[0]
    if not (math.isfinite(base) and base > 0):
        return None
    points: list[CurvePoint] = []
    for point, value in zip(curve, state.values, strict=True):
        s = value / base
        points.append(_rescaled(point, s))
    return tuple(points)


def _rescaled(point: CurvePoint, speedup: float) -> CurvePoint:
    """`point` moved to `speedup` with its band scaled as its own; `slo_share` cleared."""
    ratio = speedup / point.speedup if point.speedup > 0 else 0.0

    def scaled(value: float) -> float:
        return value * ratio if point.speedup > 0 else speedup

    return replace(
        point, speedup=speedup, speedup_low=scaled(point.speedup_low), speedup_high=scaled(point.speedup_high),
        slo_share=None,
    )


def _point_of(curve: Sequence[CurvePoint], gamma: int) -> CurvePoint | None:
    return next((point for point in curve if point.gamma == gamma), None)


def _speed_of(curve: Sequence[CurvePoint], gamma: int) -> float | None:
    point = _point_of(curve, gamma)
    return point.speedup if point is not None else None
