"""The re-measuring probe over many ticks (policies/decide/hold.py, the probe hold): held until measured, no
flip-flop."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from costmodel_builders import make_acceptance, make_context, make_evidence, make_off_evidence

from policies.advise import Advice, AdvisorConfig, AdvisorState, advise_target
from policies.decide.rule import DecideConfig
from policies.estimate.memory import AcceptanceMemory, MemoryConfig, RememberedAcceptance
from policies.types import DataState, DraftMethod, Evidence

NOW = 1_800_000_000.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CTX = make_context(method=DraftMethod.EAGLE3)
# The reviewer's case: a memory saying the drafter is useless, a 20 s restart, a 120 s dwell.
CONFIG = DecideConfig(margin=0.05, dwell_s=120.0, gamma_max=8, change_cost_s=20.0)
USELESS = (0.02, 0.005, 0.001)
GOOD = (0.8, 0.65, 0.5)
TICK_S = 15.0


def _memory(per_position: tuple[float, ...], *, measured_at_s: float) -> AcceptanceMemory:
    return AcceptanceMemory(entries=(RememberedAcceptance(
        model=MODEL, per_position=per_position, per_position_low=per_position, per_position_high=per_position,
        drafts=9000.0, mean_proposed_length=float(len(per_position)), measured_at_s=measured_at_s),))


def _tick(evidence: Evidence, advice: Advice | None, memory: AcceptanceMemory, now_s: float) -> Advice:
    state = advice.state if advice is not None else AdvisorState(memory=memory)
    return advise_target(
        replace(evidence, at_s=now_s), CTX, AdvisorConfig(decide=CONFIG, memory=MemoryConfig()),
        AdvisorState(decide=state.decide, calibration=state.calibration, memory=state.memory), now_s,
    )


def _batch(t_s: float) -> float:
    # A triangle wave between 1 and 256 running requests, 20 min period.
    phase = (t_s % 1200.0) / 1200.0
    return 1.0 + 255.0 * (1.0 - abs(2.0 * phase - 1.0))


def _published(advice: Advice) -> tuple[bool, int]:
    d = advice.decision
    return d.enabled, d.num_speculative_tokens if d.enabled else 0


def test_an_unapplied_probe_is_held_then_given_up_and_backed_off_not_flipped_every_dwell() -> None:
    # The engine never applies anything: it runs off for 4 h while the batch sweeps 1..256.
    memory = _memory(USELESS, measured_at_s=NOW - 600.0)
    advice: Advice | None = None
    changes: list[tuple[float, tuple[bool, int]]] = []
    probes: list[float] = []
    last = (False, 0)
    hours = 4.0
    for i in range(int(hours * 3600 / TICK_S)):
        now = NOW + i * TICK_S
        advice = _tick(make_off_evidence(batch=_batch(i * TICK_S)), advice, memory, now)
        key = _published(advice)
        if key != last:
            changes.append((now, key))
            if "probing" in advice.decision.reason:
                probes.append(now)
            last = key
    assert probes, "the memory is old and useless at batch 1: the advisor must look again at least once"
    # At most one change per dwell.
    times = [t for t, _ in changes]
    assert all(b - a >= CONFIG.dwell_s for a, b in itertools.pairwise(times))
    # A probe is held for the timeout, and the next waits out the back-off: probes are at least
    # timeout + back-off apart (1800 + 3600 s), so 4 h holds at most ceil(14400 / 5400) = 3 of them, 6 changes
    # (the reviewer saw 40-80 flips: one every ~135 s).
    # (Once the memory is too old to use, about 3 h in, nothing is known of the workload: probes go on, on the
    # prior's curve, with the same hold and back-off.)
    cycle_s = CONFIG.probe_timeout_s + CONFIG.probe_backoff_s
    assert all(b - a >= cycle_s for a, b in itertools.pairwise(probes))
    assert len(changes) <= 2 * math.ceil(hours * 3600 / cycle_s)
    # Each probe stayed published for its whole timeout: nothing withdrew it sooner. (A probe on the prior's curve,
    # past the memory's usable age, may stay published after that: the prior's band does not say off.)
    offs = [t for t, key in changes if not key[0]]
    assert all(not any(on < off < on + CONFIG.probe_timeout_s for off in offs) for on in probes)
    assert len(offs) >= 2  # the probes on the useless memory were given up


def test_a_probe_the_engine_applies_is_released_by_the_measured_window_and_decided_on_live_data() -> None:
    memory = _memory(USELESS, measured_at_s=NOW - 3600.0)
    advice = None
    now = NOW
    # Off at batch 1 on an hour-old useless memory: the probe is pending, then published a dwell after the baseline.
    while advice is None or not advice.decision.enabled:
        advice = _tick(make_off_evidence(batch=1.0), advice, memory, now)
        now += TICK_S
        assert now - NOW <= 600.0, "the probe should have been published within a few dwells"
    assert "probing" in advice.decision.reason
    assert advice.state.decide.probe_since_s is not None
    k = advice.decision.num_speculative_tokens
    # The engine restarts to apply it: a stale tick keeps the probe held.
    stale = make_off_evidence(batch=1.0, state=DataState.STALE, reason="503 while restarting")
    advice = _tick(stale, advice, memory, now)
    assert advice.state.decide.probe_since_s is not None and advice.decision.enabled
    # It runs at k and the first window shows the workload changed: the probe is released and on live data the
    # advisor keeps speculation on for as long as the test watches (10 dwells).
    live = make_evidence(deployed_k=k, batch=1.0, acceptance=make_acceptance(GOOD[:k], drafts=1000.0))
    for _ in range(int(10 * CONFIG.dwell_s / TICK_S)):
        now += TICK_S
        advice = _tick(live, advice, memory, now)
        assert advice.decision.enabled
        assert advice.state.decide.probe_since_s is None
    got = advice.state.memory.get(MODEL)
    assert got is not None and got.per_position == GOOD[:k]  # the fresh measurement replaced the memory


def test_a_measured_probe_that_confirms_the_memory_switches_off_one_dwell_later() -> None:
    memory = _memory(USELESS, measured_at_s=NOW - 3600.0)
    advice = None
    now = NOW
    while advice is None or not advice.decision.enabled:
        advice = _tick(make_off_evidence(batch=1.0), advice, memory, now)
        now += TICK_S
    k = advice.decision.num_speculative_tokens
    useless_live = make_evidence(deployed_k=k, batch=1.0, acceptance=make_acceptance(USELESS[:k], drafts=1000.0))
    measured_at = now
    changes: list[float] = []
    for _ in range(int(3600 / TICK_S)):
        before = advice.decision.enabled
        # The engine follows the advisor: it speculates while published on, runs off once published off.
        evidence = useless_live if before else make_off_evidence(batch=1.0)
        advice = _tick(evidence, advice, memory, now)
        if advice.decision.enabled != before:
            changes.append(now)
        now += TICK_S
    # The first live window releases the probe, and the live curve (S < 1, a large expected loss: its wait is the
    # confirm) switches off as soon as the probe, published one tick before, is a dwell old.
    assert changes and changes[0] == measured_at - TICK_S + CONFIG.dwell_s
    # Later probes are the probe's own economics on a fresh memory (probe.probe_for), each measured in turn:
    # never more than one change per dwell.
    assert all(b - a >= CONFIG.dwell_s for a, b in itertools.pairwise(changes))
