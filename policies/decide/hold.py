"""Holding on: evidence that is not ok never flips anything (the last good decision stays, with a reason), and a
published probe is held until the engine runs it and a window measures it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from policies.decide.explain import cause, describe, explained
from policies.decide.state import DecideConfig, DecideState, ProbeHold, deployment_of, key_of, pending_of
from policies.decide.value import Key
from policies.types import CurvePoint, DataState, Decision, Evidence, WhyCode


def probe_hold(state: DecideState, current: Key, *, measured: bool, config: DecideConfig, now_s: float) -> ProbeHold:
    """Whether a published probe is held this tick (the engine has not run it yet), with a note for the reason.

    While off on a remembered profile, `probe.probe_for` may ask to switch on to measure again; it is the candidate
    when the rule would stay off, published at once when the last change (or the first baseline) is a dwell old,
    then held until a live window is measured, or `probe_timeout_s` passes (then no probe for `probe_backoff_s`)."""
    since, after = state.probe_since_s, state.probe_after_s
    if since is None or not current[0]:
        return ProbeHold(after_s=after)
    if measured:
        return ProbeHold(after_s=after, note=f"; probe at gamma {current[1]} measured, deciding on live data")
    waited = max(0.0, now_s - since)
    if waited >= config.probe_timeout_s:
        note = (
            f"; probe at gamma {current[1]} not applied after {waited:.0f}s, given up "
            f"(no probe for {config.probe_backoff_s:.0f}s)"
        )
        return ProbeHold(after_s=now_s + config.probe_backoff_s, note=note)
    note = (
        f"; probing at gamma {current[1]}: held until the engine speculates and a window is measured "
        f"({waited:.0f}s of at most {config.probe_timeout_s:.0f}s)"
    )
    return ProbeHold(held=True, since_s=since, after_s=after, note=note)


def hold_last(
    evidence: Evidence,
    curve: Sequence[CurvePoint],
    state: DecideState,
    now_s: float,
    *,
    kind: DataState,
    why: str,
) -> tuple[Decision, DecideState]:
    """Evidence that is not ok (`kind`, `why`) never flips anything: the last published decision stays, with the
    new state and a reason, and any pending change is dropped (its wait restarts on the next ok tick)."""
    dropped = "" if pending_of(state) is None else "; pending change dropped, its wait restarts"
    published = state.published
    if published is None:
        shown = deployment_of(evidence)
        reason = (
            f"{kind.value}: nothing published yet, showing the current deployment ({describe(shown)}); {why}"
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
        return explained(decision, (cause(WhyCode(kind.value)),)), DecideState()
    age_s = now_s - published.evaluated_at_s
    kept = describe(key_of(published))
    reason = f"{kind.value}: keeping {kept} from the last good decision {age_s:.0f}s ago; {why}"
    # The last good decision's speedups and curve stay together: the band shown is the one it was decided on.
    decision = held(replace(published, evaluated_at_s=now_s), kind=kind, reason=reason + dropped, age_s=age_s)
    # A held probe and its back-off outlive a spell of bad data (the engine restarting to apply the probe is one).
    kept_state = DecideState(
        published=published, probe_since_s=state.probe_since_s, probe_after_s=state.probe_after_s,
        last_change_s=state.last_change_s, tried_s=state.tried_s, tried_gamma=state.tried_gamma,
        trial_left_s=state.trial_left_s,
    )
    return decision, kept_state


def held(decision: Decision, *, kind: DataState, reason: str, age_s: float) -> Decision:
    """`decision` kept through data that cannot be trusted: its setting, speedups and curve stay (the band shown is
    the one it was decided on), with `kind` (not ok) as its state, `reason`, and the cause and sentence saying it
    is kept, `age_s` (s) after it last rested on good data."""
    return explained(replace(decision, state=kind, reason=reason), (cause(WhyCode(kind.value), age_s=age_s),))
