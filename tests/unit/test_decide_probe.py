"""decide's handling of a re-measuring probe: when it publishes, how long it is held, the back-off."""

from __future__ import annotations

from decide_builders import T0, make_curve, make_evidence

from policies.decide.rule import DecideConfig, DecideInputs, DecideState, Probe, decide
from policies.types import DataState

CONFIG = DecideConfig(margin=0.05, dwell_s=120.0, gamma_max=8, change_cost_s=20.0, probe_timeout_s=600.0,
                      probe_backoff_s=1800.0)
OFF_CURVE = make_curve(0.8, 0.7, 0.6)  # the remembered profile says off
PROBE = Probe(gamma=3, why="memory is old")


def _off_state(changed_at_s: float) -> DecideState:
    # Published off by a change at `changed_at_s`: one tick with no probe makes the published decision.
    off = make_evidence(speculation_on=False, deployed_k=0, acceptance=None)
    decision, _ = decide(off, OFF_CURVE, CONFIG, DecideState(), changed_at_s)
    assert not decision.enabled
    return DecideState(published=decision, last_change_s=changed_at_s)


def test_a_probe_publishes_at_once_when_the_last_change_is_a_dwell_old() -> None:
    state = _off_state(T0)
    off = make_evidence(speculation_on=False, deployed_k=0, acceptance=None)
    # 300 s after the last change (>= 120 s dwell): published on the same tick.
    decision, after = decide(off, OFF_CURVE, CONFIG, state, T0 + 300.0, inputs=DecideInputs(probe=PROBE))
    assert decision.enabled and decision.num_speculative_tokens == 3
    assert after.probe_since_s == T0 + 300.0
    # 60 s after the last change (< 120 s dwell): it becomes the pending change and waits out a dwell.
    decision, pending = decide(off, OFF_CURVE, CONFIG, state, T0 + 60.0, inputs=DecideInputs(probe=PROBE))
    assert not decision.enabled and pending.pending_enabled is True


def test_a_held_probe_survives_bad_data_and_is_given_up_after_the_timeout_then_backs_off() -> None:
    off = make_evidence(speculation_on=False, deployed_k=0, acceptance=None)
    _, state = decide(off, OFF_CURVE, CONFIG, _off_state(T0), T0 + 300.0, inputs=DecideInputs(probe=PROBE))
    stale = make_evidence(speculation_on=False, deployed_k=0, acceptance=None, state=DataState.STALE,
                          reason="503")
    held, kept = decide(stale, (), CONFIG, state, T0 + 320.0)
    assert held.enabled and kept.probe_since_s == T0 + 300.0
    # Still not applied 599 s after publication: held (the curve says off, the probe stays published).
    decision, kept = decide(off, OFF_CURVE, CONFIG, kept, T0 + 899.0, inputs=DecideInputs(probe=PROBE))
    assert decision.enabled and kept.pending_enabled is None
    # 600 s: given up; off becomes the candidate (waits the dwell) and no probe until 900 + 1800 = 2700 s.
    decision, gave_up = decide(off, OFF_CURVE, CONFIG, kept, T0 + 900.0, inputs=DecideInputs(probe=PROBE))
    assert decision.enabled and gave_up.probe_since_s is None and gave_up.pending_enabled is False
    assert gave_up.probe_after_s == T0 + 900.0 + 1800.0
    decision, state = decide(off, OFF_CURVE, CONFIG, gave_up, T0 + 1020.0, inputs=DecideInputs(probe=PROBE))
    assert not decision.enabled
    decision, state = decide(off, OFF_CURVE, CONFIG, state, T0 + 2000.0, inputs=DecideInputs(probe=PROBE))
    assert not decision.enabled and "back-off" in decision.reason
    decision, state = decide(off, OFF_CURVE, CONFIG, state, T0 + 2700.0, inputs=DecideInputs(probe=PROBE))
    assert decision.enabled


def test_a_measured_window_releases_the_probe() -> None:
    off = make_evidence(speculation_on=False, deployed_k=0, acceptance=None)
    _, state = decide(off, OFF_CURVE, CONFIG, _off_state(T0), T0 + 300.0, inputs=DecideInputs(probe=PROBE))
    live = make_evidence(speculation_on=True, deployed_k=3)
    decision, after = decide(live, OFF_CURVE, CONFIG, state, T0 + 360.0)
    # Released: the live curve (S < 1) now argues off, which waits out the dwell.
    assert after.probe_since_s is None
    assert decision.enabled and after.pending_enabled is False


def test_a_sidecar_that_starts_off_does_not_probe_on_its_first_tick() -> None:
    # The baseline published on the first tick is not a change, but a probe is spaced from it: a restarted
    # sidecar (its memory and back-off are not kept) would otherwise probe at once, every restart.
    off = make_evidence(speculation_on=False, deployed_k=0, acceptance=None)
    first, state = decide(off, OFF_CURVE, CONFIG, DecideState(), T0, inputs=DecideInputs(probe=PROBE))
    assert not first.enabled and state.pending_enabled is True
    decision, state = decide(off, OFF_CURVE, CONFIG, state, T0 + 119.0, inputs=DecideInputs(probe=PROBE))
    assert not decision.enabled
    decision, state = decide(off, OFF_CURVE, CONFIG, state, T0 + 120.0, inputs=DecideInputs(probe=PROBE))
    assert decision.enabled and state.probe_since_s == T0 + 120.0
