"""The wait clock of decide's rule (policies/decide/rule.py): a candidate is published once it has been worth a
change for its wait, C / r clipped to [confirm_s, dwell_s], has kept its side for min(wait, confirm_s), and the last
change is dwell_s old; then the Decision and the state for the next tick, including whether the change leaves the
last trial (`left_trial`; trials themselves are valued in policies/decide/trial.py)."""

from __future__ import annotations

import math

from policies.decide.explain import cause, decision_for, describe, explained, transition
from policies.decide.state import Candidate, DecideState, ProbeHold, Tick, deployment_of, key_of, pending_of, side_of
from policies.decide.value import Key
from policies.types import Decision, Why, WhyCode


def wait_s(*, cost_s: float, gain: float, confirm_s: float, dwell_s: float) -> float:
    """How long a change must stay worth making before it is published: C / r (s) clipped to [confirm_s,
    dwell_s], r the expected gain now (`gain`); r <= 0 (nothing forgone by waiting) waits the dwell. The service
    forgone by waiting has then paid for the switch (the break-even rule; unclipped, it loses at most twice what
    hindsight would on a condition of any length). With no restart (C = 0) every change but a probe waits
    confirm_s: undoing it costs nothing. Example: C 22.6 s, r 0.057 -> 396 -> 120 (dwell); r 0.86 -> 26.3 -> 30
    (confirm); C 0 -> 30 (confirm)."""
    raw = cost_s / gain if gain > 0 else math.inf
    return min(dwell_s, max(confirm_s, raw))


def publish_tick(
    tick: Tick, state: DecideState, published: Decision, candidate: Candidate, *, reason: str, hold: ProbeHold
) -> tuple[Decision, DecideState]:
    """Run the wait clock (module docstring) and build the Decision and the next state. `hold.since_s`: when a
    held probe was published (None: none held). What is published is the candidate of the tick the wait ends on:
    near the optimum, neighbouring gammas alternate within noise, and the side, not the gamma, must hold."""
    now_s, key = tick.now_s, candidate.key
    current, pending = key_of(published), pending_of(state)
    changed, since, steady, tail, whys = False, None, None, "", candidate.why
    confirm_s = tick.config.confirm_s
    not_worth_since = state.not_worth_since_s if state.not_worth_since_s is not None else now_s
    not_worth: float | None = None  # since when the waiting candidate has not been worth a change
    if key == current and pending is not None and now_s - not_worth_since < confirm_s:
        # One outlying window can no more withdraw a waiting change than publish one: the wait is held, not lost.
        not_worth, key = not_worth_since, pending
        since, steady = state.pending_since_s, state.candidate_since_s
        tail = (f"; candidate {describe(pending)} not worth a change this window, withdrawn after "
                f"{confirm_s:.0f}s of it ({now_s - not_worth:.0f}s so far)")
    elif key == current:
        tail = f"; candidate {describe(pending)} withdrawn" if pending is not None else ""
        if pending is not None:
            whys += (cause(WhyCode.WITHDRAWN, to_gamma=pending[1]),)
    else:
        # Back after a spell without being worth a change: the clocks resume where they stood (they count only
        # time the change was worth making), or, after confirm_s or more of it, a new wait begins.
        spell = now_s - state.not_worth_since_s if state.not_worth_since_s is not None else 0.0
        if pending is not None and state.not_worth_since_s is not None and spell >= confirm_s:
            whys += (cause(WhyCode.WITHDRAWN, to_gamma=pending[1]),)  # withdrawn in the gap between two ticks
            pending, spell = None, 0.0
        since = state.pending_since_s + spell if pending is not None and state.pending_since_s is not None else now_s
        same_side = pending is not None and state.candidate_side == candidate.side
        steady = state.candidate_since_s + spell if same_side and state.candidate_since_s is not None else now_s
        changed, tail, clock = _clock(tick, state, published, candidate, since_s=since, steady_s=steady)
        whys += clock
        if changed:
            since, steady = None, None
    publish = key if changed else current
    decision = decision_for(tick.evidence, tick.curve, publish, reason=reason + tail, now_s=now_s,
                         changed_at_s=now_s if changed else published.changed_at_s)
    decision = explained(decision, whys)
    waiting = None if changed or key == current else key
    next_state = DecideState(
        published=decision,
        pending_enabled=None if waiting is None else waiting[0],
        pending_gamma=None if waiting is None else waiting[1],
        pending_since_s=since,
        candidate_since_s=steady,
        candidate_side=None if steady is None else (state.candidate_side if not_worth is not None else candidate.side),
        not_worth_since_s=not_worth,
        # A probe published now is held until it is measured; any other change ends a hold.
        probe_since_s=now_s if candidate.probing and changed else (None if changed else hold.since_s),
        probe_after_s=hold.after_s,
        last_change_s=now_s if changed else state.last_change_s,
        tried_s=now_s if changed and candidate.trying else state.tried_s,
        tried_gamma=(key[1] if candidate.trying else None) if changed else state.tried_gamma,
        trial_left_s=now_s if changed and left_trial(tick, state, current, key) else state.trial_left_s,
    )
    return decision, next_state


def _clock(
    tick: Tick, state: DecideState, published: Decision, candidate: Candidate, *, since_s: float, steady_s: float
) -> tuple[bool, str, tuple[Why, ...]]:
    """Whether the candidate is published now, the reason's tail and its causes: it has been worth a change for its
    wait, has held its side for min(wait, confirm_s), and the last change is dwell_s old."""
    config, now_s = tick.config, tick.now_s
    current, wait = key_of(published), candidate.wait_s
    waited, held_s = max(0.0, now_s - since_s), max(0.0, now_s - steady_s)
    # A probe rests on the memory's age; the first one is spaced from the baseline, so a restarted sidecar
    # does not probe on its first tick.
    last = state.last_change_s if state.last_change_s is not None or not candidate.probing else published.changed_at_s
    spacing = 0.0 if last is None else max(0.0, last + config.dwell_s - now_s)
    move = transition(current, candidate.key)
    to_gamma = candidate.key[1]
    if waited >= wait and held_s >= min(wait, config.confirm_s) and spacing <= 0:
        changed = cause(WhyCode.CHANGED, from_gamma=current[1], to_gamma=to_gamma, waited_s=waited)
        return True, f"; {move} after {waited:.0f}s", (changed,)
    tail = f"; waiting {waited:.0f}s of {wait:.0f}s before {move}"
    if held_s < min(wait, config.confirm_s) <= waited:
        tail += f" (its side held {held_s:.0f}s of {config.confirm_s:.0f}s)"
    left_s = max(wait - waited, min(wait, config.confirm_s) - held_s, spacing)
    whys = [cause(WhyCode.WAITING, to_gamma=to_gamma, waited_s=waited, wait_s=wait, left_s=left_s)]
    if last is not None and spacing > 0:
        tail += f" ({spacing:.0f}s more: last change {now_s - last:.0f}s ago)"
        whys.append(cause(WhyCode.SPACING, left_s=spacing))
    return False, tail, tuple(whys)


def left_trial(tick: Tick, state: DecideState, current: Key, published: Key) -> bool:
    """Whether publishing `published` over `current` leaves the last trial: the first change after it, a move down
    from the gamma it tried, which the engine ran, within H of the trial (a later move down is the load's). A
    trial starts from the k the engine runs, not from a published change it has not applied; no second one comes
    within H of the last, nor within probe_backoff_s of leaving one (the guess was wrong for this traffic)."""
    tried, at = state.tried_gamma, state.tried_s
    if tried is None or at is None or current != (True, tried) or deployment_of(tick.evidence) != current:
        return False
    return side_of(published, current) < 0 and tick.now_s - at <= tick.config.payback_horizon_s
