"""advise_target with an acceptance memory: pricing a return to speculation while nothing is measured."""

from __future__ import annotations

from dataclasses import replace

from costmodel_builders import make_acceptance, make_context, make_evidence, make_off_evidence

from policies.advise import Advice, AdvisorConfig, AdvisorState, advise_target
from policies.decide.rule import DecideConfig, DecideInputs, DecideState, best_point, decide
from policies.estimate.memory import (
    AcceptanceInUse,
    AcceptanceMemory,
    MemoryConfig,
    RememberedAcceptance,
    acceptance_in_use,
)
from policies.model.calibrate import CalibrationState
from policies.types import DataState, DraftMethod, Evidence, WhyCode

NOW = 1_800_000_000.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CTX = make_context(method=DraftMethod.NGRAM)
DWELL = DecideConfig(margin=0.05, dwell_s=120.0, confirm_s=120.0, gamma_max=8)  # every change waits 120 s
POOR = (0.3, 0.1, 0.03)  # a lookup drafter that rarely matches
GOOD = (0.78, 0.58, 0.43)


def remembered(per_position: tuple[float, ...], *, age_s: float, drafts: float = 9000.0) -> AcceptanceMemory:
    return AcceptanceMemory(
        entries=(
            RememberedAcceptance(
                model=MODEL,
                per_position=per_position,
                per_position_low=per_position,
                per_position_high=per_position,
                drafts=drafts,
                mean_proposed_length=float(len(per_position)),
                measured_at_s=NOW - age_s,
            ),
        )
    )


def tick(
    evidence: Evidence,
    state: DecideState,
    memory: AcceptanceMemory | None,
    *,
    now_s: float,
    config: DecideConfig = DWELL,
) -> Advice:
    return advise_target(
        replace(evidence, at_s=now_s),
        CTX,
        AdvisorConfig(decide=config, memory=MemoryConfig()),
        AdvisorState(decide=state, calibration=CalibrationState(), memory=memory or AcceptanceMemory()),
        now_s,
    )


def test_off_and_a_fresh_memory_turns_on_after_the_dwell_once_the_batch_drops() -> None:
    memory = remembered(POOR, age_s=60.0)
    # Batch 128: with the remembered poor acceptance speculation does not pay; it stays off.
    advice = tick(make_off_evidence(batch=128.0), DecideState(), memory, now_s=NOW)
    assert not advice.decision.enabled and advice.state.decide.pending_enabled is None
    assert "remembered acceptance from 60 s ago" in advice.decision.reason
    remembered_why = advice.decision.named(WhyCode.REMEMBERED)
    assert remembered_why is not None and remembered_why.number("age_s") == 60.0
    # The batch drops to 1 while off: the same memory now argues for speculation (low end >= 1.05)...
    low = make_off_evidence(batch=1.0)
    advice = tick(low, advice.state.decide, advice.state.memory, now_s=NOW + 60.0)
    assert max(p.speedup_low for p in advice.decision.curve) >= 1.0 + DWELL.margin
    assert not advice.decision.enabled and advice.state.decide.pending_enabled is True
    # ...and after the 120 s dwell it is published, the reason saying what it rests on.
    advice = tick(low, advice.state.decide, advice.state.memory, now_s=NOW + 120.0)
    assert not advice.decision.enabled
    advice = tick(low, advice.state.decide, advice.state.memory, now_s=NOW + 180.0)
    assert advice.decision.enabled and advice.decision.state == DataState.OK
    assert advice.decision.changed_at_s == NOW + 180.0
    assert "remembered acceptance from 4 min ago (k=3, 9000 drafts" in advice.decision.reason
    assert advice.recalled is not None and advice.recalled.usable


def test_off_with_a_memory_too_old_to_use_probes_on_the_prior_and_says_why() -> None:
    # Batch 8 with the ngram drafter: the method prior's low end does not clear 1.05, the good profile would.
    evidence = make_off_evidence(batch=8.0)
    fresh = tick(evidence, DecideState(), remembered(GOOD, age_s=60.0), now_s=NOW, config=replace(DWELL, dwell_s=0))
    assert fresh.decision.enabled
    stale = tick(evidence, DecideState(), remembered(GOOD, age_s=7 * 3600.0), now_s=NOW,
                 config=replace(DWELL, dwell_s=0))
    assert stale.recalled is None
    # Too old to use is as good as never measured: the rules alone keep it off (the prior's band), but the prior
    # promises a gain and nothing rules it out, so it turns on to measure, at the prior's best gamma.
    star = best_point(stale.decision.curve, DWELL.gamma_max)
    assert star is not None and star.speedup_low < 1.05 < star.speedup
    assert stale.decision.enabled and stale.decision.num_speculative_tokens == star.gamma
    assert "probing: no usable measured profile, P(workload moved) 100.0%" in stale.decision.reason
    reason = stale.decision.reason
    assert "remembered acceptance from 7.0 h ago" in reason
    assert "not used: 7.0 h old, past the 6.0 h limit" in reason
    assert stale.decision.named(WhyCode.REMEMBERED) is None  # named in the reason, but not what the curve rests on
    assert "priced from the drafter's prior" in reason
    # Without any memory the same curve comes from the prior: the stale memory changed nothing but the words.
    bare = tick(evidence, DecideState(), None, now_s=NOW, config=replace(DWELL, dwell_s=0))
    assert bare.decision.curve == stale.decision.curve
    assert bare.decision.enabled and "probing: no usable measured profile" in bare.decision.reason
    # With exploring switched off it stays off.
    kept = tick(evidence, DecideState(), None, now_s=NOW, config=replace(DWELL, dwell_s=0, explore=False))
    assert not kept.decision.enabled


def test_the_aged_band_clears_the_margin_only_while_the_memory_is_fresh() -> None:
    evidence = make_off_evidence(batch=1.0)
    config = replace(DWELL, dwell_s=0.0)

    def best(age_s: float) -> tuple[float, float]:
        # The best point's speedup, and the highest low end of any gamma (what the rule weighs a turn-on by).
        advice = tick(evidence, DecideState(), remembered(POOR, age_s=age_s), now_s=NOW, config=config)
        star = best_point(advice.decision.curve, config.gamma_max)
        assert star is not None and advice.recalled is not None  # both ages are still usable
        return star.speedup, max(p.speedup_low for p in advice.decision.curve if p.gamma > 0)

    fresh_point, fresh_low = best(0.0)
    aged_point, aged_low = best(7200.0)  # n_eff = 2000 / 16 = 125
    # Ageing widens the band and keeps the point: the same prediction, less sure of it.
    assert aged_point == fresh_point
    assert aged_low < fresh_low
    assert fresh_point > 1.0  # the remembered profile does predict a gain at this batch
    # A margin between the two low ends: the fresh memory clears it, the aged one does not.
    bar = (fresh_low + aged_low) / 2.0
    # Probing (probe.probe_for) would switch on to look again after 2 h; this test is about the aged band alone.
    margin = replace(config, margin=bar - 1.0, explore=False)
    on = tick(evidence, DecideState(), remembered(POOR, age_s=0.0), now_s=NOW, config=margin)
    off = tick(evidence, DecideState(), remembered(POOR, age_s=7200.0), now_s=NOW, config=margin)
    assert on.decision.enabled
    assert not off.decision.enabled
    assert "low end" in off.decision.reason and "remembered acceptance from 2.0 h ago" in off.decision.reason


def test_live_evidence_replaces_the_memory_and_is_priced_from_itself() -> None:
    memory = remembered(POOR, age_s=600.0)
    live = make_evidence(acceptance=make_acceptance(GOOD, drafts=800.0), batch=4.0)
    advice = tick(live, DecideState(), memory, now_s=NOW)
    got = advice.state.memory.get(MODEL)
    assert got is not None and got.per_position == GOOD and got.measured_at_s == NOW and got.drafts == 800.0
    assert advice.recalled is None
    assert "remembered" not in advice.decision.reason


def test_a_thin_live_window_is_priced_from_a_usable_memory_instead_of_being_held() -> None:
    thin = make_evidence(
        state=DataState.INSUFFICIENT_DATA,
        acceptance=make_acceptance(GOOD, drafts=40.0),
        batch=2.0,
        reason="40 drafts in 10s, need 200",
    )
    without = tick(thin, DecideState(), None, now_s=NOW)
    assert without.decision.state == DataState.INSUFFICIENT_DATA
    with_memory = tick(thin, DecideState(), remembered(GOOD, age_s=300.0), now_s=NOW)
    assert with_memory.decision.state == DataState.OK
    assert with_memory.decision.curve  # a curve was priced
    assert "in place of a thin live window (40 drafts in 10s, need 200)" in with_memory.decision.reason
    # The thin window itself is not remembered (40 < 200 drafts): the older profile stays.
    kept = with_memory.state.memory.get(MODEL)
    assert kept is not None and kept.measured_at_s == NOW - 300.0


def test_a_memory_of_another_model_is_not_used() -> None:
    memory = remembered(GOOD, age_s=60.0)
    evidence = make_off_evidence(batch=64.0, model="another/model")
    advice = tick(evidence, DecideState(), memory, now_s=NOW, config=replace(DWELL, dwell_s=0))
    assert advice.recalled is None
    assert "remembered" not in advice.decision.reason


def test_the_acceptance_in_use_stands_beside_the_evidence_and_never_rewrites_it() -> None:
    thin = make_evidence(
        state=DataState.INSUFFICIENT_DATA, acceptance=make_acceptance(POOR, drafts=40.0), batch=2.0,
        reason="40 drafts in 10s, need 200",
    )
    memory = remembered(GOOD, age_s=300.0)
    in_use = acceptance_in_use(thin, memory, config=MemoryConfig(), now_s=NOW)
    assert in_use.stands_in
    assert in_use.acceptance is not None and in_use.acceptance.per_position[0] == GOOD[0]
    # An ok window while on is priced from itself, whatever is remembered; nothing is said about memory.
    live = make_evidence(acceptance=make_acceptance(POOR, drafts=5000.0), batch=2.0)
    own = acceptance_in_use(live, memory, config=MemoryConfig(), now_s=NOW)
    assert own == AcceptanceInUse(acceptance=live.acceptance)
    # Off with a memory too old to use: the prior prices the curve, and the note says why.
    off = acceptance_in_use(make_off_evidence(batch=2.0), remembered(GOOD, age_s=7 * 3600.0), config=MemoryConfig(),
                            now_s=NOW)
    assert off.acceptance is None and not off.stands_in
    assert off.recalled is not None and not off.recalled.usable
    assert off.note.endswith("priced from the drafter's prior")


def test_decide_acts_on_a_thin_window_only_when_a_remembered_profile_stands_in() -> None:
    priced = tick(make_evidence(acceptance=make_acceptance(GOOD, drafts=5000.0), batch=2.0), DecideState(), None,
                  now_s=NOW)
    thin = make_evidence(state=DataState.INSUFFICIENT_DATA, acceptance=make_acceptance(GOOD, drafts=40.0),
                         batch=2.0)
    held = decide(thin, priced.decision.curve, DWELL, priced.state.decide, NOW + 5.0)[0]
    assert held.state is DataState.INSUFFICIENT_DATA
    stood_in = decide(thin, priced.decision.curve, DWELL, priced.state.decide, NOW + 5.0,
                      inputs=DecideInputs(acceptance_stands_in=True))[0]
    assert stood_in.state is DataState.OK
    # The flag is about a thin window: stale evidence is held whatever it says.
    stale = replace(thin, state=DataState.STALE)
    assert decide(stale, priced.decision.curve, DWELL, priced.state.decide, NOW + 5.0,
                  inputs=DecideInputs(acceptance_stands_in=True))[0].state is DataState.STALE
