"""Decide: the predicted speedup curve -> the published recommendation (DESIGN.md section 5).

The rule. Value every option o (off, or on at gamma) against the one that runs, c, over the payback horizon H:

    V(o) = H x g(o) - C          C = (change_cost_s + in-flight work + weighed queue) x cost_scale     (s)

g(o) is o's gain over c at the pessimistic end of its 90% band (a free move between gammas: its expected gain), per
delivered token (policies/value.py); C is what one change destroys in seconds of service (policies/change_cost.py; 0
for an engine that adapts per batch). The candidate is the option with the greatest V among those with g >= margin
(ties: the smaller gamma, off first); when none has V > 0, what runs stays. A turn-off goes to gamma* (the best
point speedup among measured gammas) instead when S(gamma*) >= 1: as much expected service, and the acceptance stays
measured. The candidate is published once some change has been worth making for

    wait = C / g, clipped to [confirm_s, dwell_s]

(the service forgone by waiting has then paid for the switch: the break-even rule, which unclipped loses at most
twice what hindsight would on a condition of any length), once the candidate has kept its side for confirm_s (off,
more drafts or fewer: one outlying window cannot publish a change), and never within dwell_s of the last published
change. What is published is the candidate of that tick: near the optimum, neighbouring gammas alternate within
noise. Hysteresis comes from the pessimistic band on both sides (to switch on, S's low end must clear 1 + margin; to
switch off, the running option's high end must fall short of 1 by margin x S(c)) and the cost; the wait from the
cost over the gain: a grossly wrong setting (g >= C / confirm_s) is corrected after confirm_s, a gain below C /
dwell_s waits the whole dwell. With no restart (C = 0) every change but a probe waits confirm_s: undoing it costs
nothing.

The options: off, and every gamma in 1..gamma_max; while on, no further than one gamma past the measured k
(`reachable_gamma_limit`): past it the acceptance is a guess, and each step up runs, gets its position measured
and the next is decided on data. With a plan (policies/plan.py) the options are valued on the plan's curve (the
recent load's mix: the forecast over the horizon) with C scaled to its units by `cost_scale`, and g there is a
ratio of planned values (the plan carries no SLO share); the wait's C / g is this window's (waiting forgoes the
gain at today's rate). The published speedups stay this window's. A running gamma off the curve (deployed k >
gamma_max) cannot be weighed: the best option against plain decoding is the move, after confirm_s.

Worked example (H 600 s, C 22.6 s, margin 0.02, confirm 30 s, dwell 120 s): running gamma 3 at S 1.40, gamma 2
priced at 1.48 with gain_sd 0.01: g = (1.48 x 0.984 - 1.40) / 1.40 = 4.0%, V = 23.9 - 22.6 = +1.3 s, wait 22.6 /
0.040 = 565 s -> 120 s. Running gamma 8 at S 0.70 at moderate load, gamma 2 at 1.30 (gain_sd 0.05): g = 71%, wait
32 s. Off, S(3) = 1.42 [1.31..1.55], C 0: g = 31%, V > 0, wait 30 s (the confirm).

Probe (value of information): while off on a remembered profile, `advise.probe_for` may ask to switch on to
measure again; it is the candidate when the rule would stay off, published at once when the last change (or the
first baseline) is a dwell old, then held until a live window is measured (or `probe_timeout_s` passes; then no
probe for `probe_backoff_s`). First decision: the current deployment is published as the baseline (not a
change). Evidence that is not ok never flips anything: the last decision stays with the new state and a reason,
and any pending change is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.change_cost import change_cost_of, inflight_work_s
from policies.costmodel import step_batch
from policies.types import CurvePoint, Decision, Evidence, TargetState
from policies.value import Key, Valued, best_on, pessimistic_gain, point_at, value_options


@dataclass(frozen=True, slots=True)
class DecideConfig:
    """The narrow policy config. Gains are dimensionless shares of the service; times are seconds."""

    margin: float = 0.02  # the least pessimistic gain g a change must promise (module docstring)
    dwell_s: float = 120.0  # the longest wait, and the least time between two published changes
    confirm_s: float = 30.0  # the shortest wait: one bad scrape or window cannot change a deployment
    gamma_max: int = 8
    # Seconds of service one change interrupts (~ the engine's restart time; 0 = the engine adapts per batch).
    change_cost_s: float = 0.0
    # Seconds over which a change must pay its cost back (how long a recommendation is expected to hold).
    payback_horizon_s: float = 600.0
    # Probe while off on a remembered profile (advise.probe_for); a probe runs at least `probe_min_s` (one
    # estimator window, 60 s by default, to measure the positions again) before it can be undone.
    explore: bool = True
    probe_min_s: float = 60.0
    # A published probe is held until a live window is measured, at most this long (s): long enough for an
    # actuator's own dwell and cooldown (300 s + 900 s by default in actuation) and a restart to apply it.
    probe_timeout_s: float = 1800.0
    # After a probe that was never applied, no new probe for this long (s): whoever did not apply the last one
    # is unlikely to apply the next a dwell later, and each unapplied probe is two published changes.
    probe_backoff_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class DecideState:
    """What `decide` carries between ticks: the published decision and the candidate waiting to be published."""

    published: Decision | None = None  # what is currently published (enabled, gamma)
    pending_enabled: bool | None = None  # the change waiting to be published
    pending_gamma: int | None = None  # the last candidate's gamma
    pending_since_s: float | None = None  # since when some change has been worth making (the wait's clock)
    candidate_since_s: float | None = None  # since when the candidate has kept its side (off, up or down)
    candidate_side: int | None = None  # that side: 0 off, +1 more drafts than run, -1 fewer
    probe_since_s: float | None = None  # when a probe was published; held until a live window is measured
    probe_after_s: float | None = None  # no probe before this time (back-off after a probe nobody applied)
    last_change_s: float | None = None  # when a change (not the first baseline) was last published


def best_point(curve: Sequence[CurvePoint], gamma_max: int) -> CurvePoint | None:
    """The point with the highest point speedup among gamma in 1..gamma_max; ties go to the smaller gamma.

    `curve` may be in any order and may be empty; returns None when no point has 1 <= gamma <= gamma_max.
    Example: S(1)=1.20, S(2)=1.35, S(3)=1.35, S(4)=1.30 -> the gamma=2 point.
    """
    return best_on(curve, [(True, gamma) for gamma in range(1, gamma_max + 1)])


@dataclass(frozen=True, slots=True)
class Probe:
    """A request to switch speculation on at `gamma` (>= 1) to re-measure acceptance, with `why` for the reason
    (made by `advise.probe_for` while off on a remembered profile)."""

    gamma: int
    why: str


def reachable_gamma_limit(*, current_gamma: int, measured_k: int, gamma_max: int) -> int:
    """The largest gamma one move may reach while on: max(measured_k + 1, current_gamma) clipped to
    1..gamma_max, so a published gamma above what runs is never pulled down by the cap.

    Example: measured k=3, current 3, gamma_max 8 -> 4; measured k=3, current 5 -> 5; measured 10, max 8 -> 8.
    """
    return max(1, min(gamma_max, max(measured_k + 1, current_gamma)))


def wait_s(*, cost_s: float, gain: float, confirm_s: float, dwell_s: float) -> float:
    """How long a change must stay worth making before it is published: C / g (s) clipped to [confirm_s,
    dwell_s]; a gain <= 0 (nothing forgone by waiting) waits the dwell. Example: C 22.6 s, g 0.04 -> 565 -> 120
    (dwell); g 0.70 -> 32.3; C 0 -> 30 (confirm)."""
    raw = cost_s / gain if gain > 0 else math.inf
    return min(dwell_s, max(confirm_s, raw))


def decide(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    config: DecideConfig,
    state: DecideState,
    now_s: float,
    *,
    probe: Probe | None = None,
    measured: bool | None = None,
    inflight_s: float | None = None,
    plan: Sequence[CurvePoint] | None = None,
    cost_scale: float = 1.0,
) -> tuple[Decision, DecideState]:
    """One decision tick (module docstring): returns the Decision to publish and the state for the next tick.

    `curve` holds one point per gamma 0..gamma_max (speedups vs plain decoding); `now_s` is epoch seconds from the
    caller's clock. `measured`: this tick's acceptance was measured live while speculating (None: ok, speculating
    and acceptance present); it releases a held probe. `inflight_s` (s): the in-flight and weighed queued work a
    restart loses (None: `inflight_work_s(evidence)`). `plan`: the curve options are valued on (same gammas);
    `cost_scale` (> 0) converts C into the plan's units. The Decision's band is the published option's on `curve`.
    """
    if evidence.state is not TargetState.OK:
        return _hold(evidence, curve, state, now_s, kind=evidence.state, why=_why_not_ok(evidence))
    choose = plan if plan else curve
    star = best_point(curve, config.gamma_max)
    if star is None:
        why = f"no predicted speedup for any gamma in 1..{config.gamma_max} (curve has {len(curve)} points)"
        return _hold(evidence, curve, state, now_s, kind=TargetState.ERROR, why=why)
    if measured is None:
        measured = evidence.speculation_on and evidence.acceptance is not None
    lost_s = inflight_work_s(evidence) if inflight_s is None else inflight_s
    today_s = change_cost_of(change_cost_s=config.change_cost_s, inflight_s=lost_s)  # C in this window's units
    cost_s = today_s * (_valid_scale(cost_scale) if plan else 1.0)  # C in the units options are valued in
    prefix, published = "", state.published
    if published is None:
        base = _deployment(evidence)
        published = _decision(evidence, curve, base, reason="", now_s=now_s, changed_at_s=now_s)
        prefix = f"first decision, baseline is the current deployment ({_describe(base)}); "
    current = _key(published)
    head = f"{_describe(current)}: best {_fmt_point(star)} at batch {max(step_batch(evidence), 1.0):.1f}"
    head += "; planned over the recent load" if plan else ""
    held, probe_since, probe_after, note = _probe_hold(state, current, measured=measured, config=config, now_s=now_s)
    options = _options(current, evidence, config)
    choice = _choose(choose, current, options, config, cost_s=cost_s)
    candidate, wait, probing, side = current, config.dwell_s, False, 0
    if held:
        head += note  # a published probe the engine has not run yet: the curve is still the remembered one
    elif choice is not None and choice.value_s > 0 and choice.gain >= config.margin:
        # Waiting forgoes the gain at this window's rate: the rent is paid now, whatever the plan forecasts.
        now_gain = pessimistic_gain(curve, current, choice.key, costly=cost_s > 0) if plan else choice.gain
        rent = choice.gain if now_gain is None else now_gain
        wait = wait_s(cost_s=today_s, gain=rent, confirm_s=config.confirm_s, dwell_s=config.dwell_s)
        worth = _worth(choice, config, cost_s, from_on=current[0])
        head += note + f"; {worth}, wait {wait:.0f}s (cost today {today_s:.1f}s / gain "
        head += f"now {rent:+.1%}, in {config.confirm_s:.0f}..{config.dwell_s:.0f}s)"
        side = _side(choice.key, current)  # the option valued: a turn-off kept measuring is still a turn-off
        candidate, kept = _keep_measuring(choice.key, choose, options)
        head += kept
    elif probe is not None and not current[0] and (probe_after is None or now_s >= probe_after):
        # The probe's own test priced its restarts (advise.probe_for); it rests on the memory's age, which only
        # grows, so it does not wait for confirmation, only for the spacing after the last change.
        candidate, wait, probing, side = (True, max(1, min(probe.gamma, config.gamma_max))), 0.0, True, 1
        head += note + f"; probing: {probe.why}"
    else:
        stays = _worth(choice, config, cost_s, from_on=current[0]) if choice is not None else ""
        head += note + (f"; stays: {stays}" if stays else "; stays")
        if probe is not None and probe_after is not None and now_s < probe_after:
            head += f"; no probe for another {probe_after - now_s:.0f}s (back-off after an unapplied probe)"
    return _publish(evidence, curve, state, published, now_s, candidate=candidate, wait=wait, config=config,
                    side=side, reason=prefix + head, probing=probing, probe_since_s=probe_since,
                    probe_after_s=probe_after)


def _side(option: Key, current: Key) -> int:
    """Which way a change goes: 0 off, +1 to more drafts than run (on from off included), -1 to fewer."""
    if not option[0]:
        return 0
    return 1 if not current[0] or option[1] > current[1] else -1


def _keep_measuring(key: Key, curve: Sequence[CurvePoint], options: Sequence[Key]) -> tuple[Key, str]:
    """A turn-off that pays goes to gamma* instead when gamma* is expected to do as well as plain decoding
    (S(gamma*) >= 1, gamma* among the measured gammas: an extrapolated one is a guess): the same expected service,
    and the acceptance stays measured (nothing is while off)."""
    star = best_on(curve, [o for o in options if (p := point_at(curve, o[1])) is not None and not p.extrapolated])
    if key[0] or star is None or star.speedup < 1.0:
        return key, ""
    return (True, star.gamma), f"; {_fmt_point(star)} is expected to do as well as off: gamma {star.gamma} instead"



def _options(current: Key, evidence: Evidence, config: DecideConfig) -> list[Key]:
    """Off and gamma 1..gamma_max; while on, no further than `reachable_gamma_limit`."""
    limit = config.gamma_max
    if current[0]:
        limit = reachable_gamma_limit(
            current_gamma=current[1], measured_k=_measured_k(evidence), gamma_max=config.gamma_max
        )
    return [(False, 0), *((True, g) for g in range(1, limit + 1))]


def _choose(
    curve: Sequence[CurvePoint], current: Key, options: Sequence[Key], config: DecideConfig, *, cost_s: float
) -> Valued | None:
    """The option with the greatest V (ties: the smaller gamma, off first), or None when none can be priced."""
    if current[0] and point_at(curve, current[1]) is None:
        # The running gamma is off the curve (deployed k > gamma_max): nothing to weigh against, so the best
        # option against plain decoding is the move, off when none clears the margin.
        plain = [v for v in value_options(curve, (False, 0), options=options, horizon_s=1.0, cost_s=0.0)
                 if v.gain >= config.margin]
        top = max(plain, key=lambda v: v.gain, default=None)
        key = top.key if top is not None else (False, 0)
        return Valued(key=key, gain=math.inf, value_s=math.inf, point=point_at(curve, key[1]) if key[0] else None)
    best: Valued | None = None
    for valued in value_options(curve, current, options=options, horizon_s=config.payback_horizon_s, cost_s=cost_s):
        if best is None or valued.value_s > best.value_s:
            best = valued
    return best


def _worth(choice: Valued, config: DecideConfig, cost_s: float, *, from_on: bool) -> str:
    """The numbers behind a candidate (or the best option that is not one), for the reason."""
    seen = f" {_fmt_point(choice.point)}" if choice.point is not None else ""
    if math.isinf(choice.gain):
        return f"{_describe(choice.key)}{seen}, the running gamma is not on the curve"
    # Off is priced against the running option at its best (its band's high end); a gamma at its own low end, or
    # on its expected value when it is a free move between gammas (policies/value.py).
    if not choice.key[0]:
        basis = "against the running option's band high end"
    elif not from_on or cost_s > 0 or choice.point is None or choice.point.extrapolated:
        basis = "at its band's low end"
    else:
        basis = "expected (a free move)"
    text = f"{_describe(choice.key)}{seen} gains {choice.gain:+.1%} {basis}"
    if choice.gain < config.margin:
        return text + f" < margin {config.margin:.0%}"
    if cost_s <= 0:
        return text
    won = config.payback_horizon_s * choice.gain
    text += f" x {config.payback_horizon_s:.0f}s = {won:.1f}s vs change cost {cost_s:.1f}s"
    return text if choice.value_s > 0 else text + ": held back by its cost"


def _publish(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    state: DecideState,
    published: Decision,
    now_s: float,
    *,
    candidate: Key,
    wait: float,
    side: int,
    config: DecideConfig,
    reason: str,
    probing: bool,
    probe_since_s: float | None,
    probe_after_s: float | None,
) -> tuple[Decision, DecideState]:
    """Run the wait clock (module docstring) and build the Decision and the next state. `side`: which way the
    valued change goes (`_side`); `probing`: the candidate is a probe; `probe_since_s`: when a held probe was
    published (None: none held)."""
    current, pending = _key(published), _pending(state)
    changed, since, steady, tail = False, None, None, ""
    if candidate == current:
        tail = f"; candidate {_describe(pending)} withdrawn" if pending is not None else ""
    else:
        since = state.pending_since_s if pending is not None and state.pending_since_s is not None else now_s
        same_side = pending is not None and state.candidate_side == side
        steady = state.candidate_since_s if same_side and state.candidate_since_s is not None else now_s
        waited, held_s = max(0.0, now_s - since), max(0.0, now_s - steady)
        # A probe rests on the memory's age; the first one is spaced from the baseline, so a restarted sidecar
        # does not probe on its first tick.
        last = state.last_change_s if state.last_change_s is not None or not probing else published.changed_at_s
        spacing = 0.0 if last is None else max(0.0, last + config.dwell_s - now_s)
        if waited >= wait and held_s >= min(wait, config.confirm_s) and spacing <= 0:
            changed, since, steady = True, None, None
            tail = f"; {_transition(current, candidate)} after {waited:.0f}s"
        else:
            tail = f"; waiting {waited:.0f}s of {wait:.0f}s before {_transition(current, candidate)}"
            if held_s < min(wait, config.confirm_s) <= waited:
                tail += f" (its side held {held_s:.0f}s of {config.confirm_s:.0f}s)"
            if last is not None and spacing > 0:
                tail += f" ({spacing:.0f}s more: last change {now_s - last:.0f}s ago)"
    publish = candidate if changed else current
    decision = _decision(evidence, curve, publish, reason=reason + tail, now_s=now_s,
                         changed_at_s=now_s if changed else published.changed_at_s)
    next_state = DecideState(
        published=decision,
        pending_enabled=None if changed or candidate == current else candidate[0],
        pending_gamma=None if changed or candidate == current else candidate[1],
        pending_since_s=since,
        candidate_since_s=steady,
        candidate_side=None if steady is None else side,
        # A probe published now is held until it is measured; any other change ends a hold.
        probe_since_s=now_s if probing and changed else (None if changed else probe_since_s),
        probe_after_s=probe_after_s,
        last_change_s=now_s if changed else state.last_change_s,
    )
    return decision, next_state


def _valid_scale(cost_scale: float) -> float:
    return cost_scale if math.isfinite(cost_scale) and cost_scale > 0 else 1.0


def _probe_hold(
    state: DecideState, current: Key, *, measured: bool, config: DecideConfig, now_s: float
) -> tuple[bool, float | None, float | None, str]:
    """(hold the published probe this tick, probe_since_s, probe_after_s, a note for the reason)."""
    since, after = state.probe_since_s, state.probe_after_s
    if since is None or not current[0]:
        return False, None, after, ""
    if measured:
        return False, None, after, f"; probe at gamma {current[1]} measured, deciding on live data"
    waited = max(0.0, now_s - since)
    if waited >= config.probe_timeout_s:
        after = now_s + config.probe_backoff_s
        note = (
            f"; probe at gamma {current[1]} not applied after {waited:.0f}s, given up "
            f"(no probe for {config.probe_backoff_s:.0f}s)"
        )
        return False, None, after, note
    note = (
        f"; probing at gamma {current[1]}: held until the engine speculates and a window is measured "
        f"({waited:.0f}s of at most {config.probe_timeout_s:.0f}s)"
    )
    return True, since, after, note


# ----------------------------------------------------------------------------------------------------------
# Holding on without good evidence
# ----------------------------------------------------------------------------------------------------------


def _hold(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    state: DecideState,
    now_s: float,
    *,
    kind: TargetState,
    why: str,
) -> tuple[Decision, DecideState]:
    dropped = "" if _pending(state) is None else "; pending change dropped, its wait restarts"
    published = state.published
    if published is None:
        shown = _deployment(evidence)
        reason = (
            f"{kind.value}: nothing published yet, showing the current deployment ({_describe(shown)}); {why}"
        )
        decision = Decision(
            target=evidence.target,
            model=evidence.model,
            state=kind,
            enabled=shown[0],
            num_speculative_tokens=shown[1],
            expected_speedup=1.0,
            expected_speedup_low=1.0,
            expected_speedup_high=1.0,
            reason=reason + dropped,
            evaluated_at_s=now_s,
            curve=tuple(curve),
            changed_at_s=None,
        )
        return decision, DecideState()
    age_s = now_s - published.evaluated_at_s
    kept = _describe(_key(published))
    reason = f"{kind.value}: keeping {kept} from the last good decision {age_s:.0f}s ago; {why}"
    # The last good decision's speedups and curve stay together: the band shown is the one it was decided on.
    decision = replace(published, state=kind, reason=reason + dropped, evaluated_at_s=now_s)
    # A held probe and its back-off outlive a spell of bad data (the engine restarting to apply the probe is one).
    kept_state = DecideState(
        published=published, probe_since_s=state.probe_since_s, probe_after_s=state.probe_after_s,
        last_change_s=state.last_change_s,
    )
    return decision, kept_state


def _why_not_ok(evidence: Evidence) -> str:
    told = _one_line(evidence.reason)
    if told:
        return told
    if evidence.state is TargetState.INSUFFICIENT_DATA:
        drafts = 0.0 if evidence.acceptance is None else evidence.acceptance.drafts
        return f"{drafts:.0f} drafts seen in the window"
    return f"evidence state {evidence.state.value}"


# ----------------------------------------------------------------------------------------------------------
# Small conversions and formatting
# ----------------------------------------------------------------------------------------------------------


def _measured_k(evidence: Evidence) -> int:
    # Positions 0..k-1 are measured only while the engine speculates at k.
    return evidence.deployed_k if evidence.speculation_on else 0


def _deployment(evidence: Evidence) -> Key:
    # "On with 0 drafts" is not a state the engine can be in for our purposes: normalise to off.
    if evidence.speculation_on and evidence.deployed_k >= 1:
        return True, evidence.deployed_k
    return False, 0


def _key(decision: Decision) -> Key:
    return decision.enabled, decision.num_speculative_tokens if decision.enabled else 0


def _pending(state: DecideState) -> Key | None:
    if state.pending_enabled is None or state.pending_gamma is None or state.pending_since_s is None:
        return None
    return state.pending_enabled, state.pending_gamma if state.pending_enabled else 0


def _decision(
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
        state=TargetState.OK,
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


def _fmt_point(point: CurvePoint) -> str:
    extrapolated = " extrapolated" if point.extrapolated else ""
    band = f"[{point.speedup_low:.2f}..{point.speedup_high:.2f}]"
    return f"S({point.gamma})={point.speedup:.2f} {band}{extrapolated}"


def _describe(key: Key) -> str:
    return f"on, gamma {key[1]}" if key[0] else "off"


def _transition(before: Key, after: Key) -> str:
    if before[0] and after[0]:
        return f"switching gamma {before[1]}->{after[1]}"
    if after[0]:
        return f"switching on at gamma {after[1]}"
    return f"switching off (from gamma {before[1]})"


def _one_line(text: str) -> str:
    return " ".join(text.split())
