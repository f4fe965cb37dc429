"""The decision's one-sentence summary and its structured causes, on decisions made by the real `decide`.

The curves are test_decide.py's, whose numbers are worked by hand there: GOOD (from off, gamma 3 gains 31% at its
low end), BAD (on at 2, S 0.85: off gains 10.6%), BAND (nothing clears the margin).
"""

from __future__ import annotations

from dataclasses import replace

from decide_builders import T0, make_curve, make_evidence
from test_decide import BAD, BAND, CFG, COST, GOOD, OFF, ON2, ON3, tick

from policies.decide.rule import DecideInputs, DecideState, Probe, decide, held
from policies.decide.summary import MAX_SUMMARY_CHARS, summarize
from policies.types import DataState, Decision, WhyCode


def _codes(decision: Decision) -> list[WhyCode]:
    return [why.code for why in decision.why]


def test_a_change_waiting_its_turn_says_where_to_and_when() -> None:
    d, s = tick(DecideState(), T0, GOOD)
    assert _codes(d) == [WhyCode.BASELINE, WhyCode.BEST, WhyCode.GAIN, WhyCode.WAITING]
    waiting = d.named(WhyCode.WAITING)
    assert waiting is not None and waiting.number("to_gamma") == 3 and waiting.number("left_s") == 30.0
    gain = d.named(WhyCode.GAIN)
    assert gain is not None and round(gain.number("gain"), 2) == 0.31  # S_low(3) - 1 = 1.31 - 1
    assert d.summary == (
        "Running speculation off; speculation on, k=3 is expected to gain +31%, due in 30 s if that holds."
    )
    d, _ = tick(s, T0 + 10.0, GOOD)
    assert "due in 20 s" in d.summary


def test_a_published_change_names_the_setting_it_left() -> None:
    _, s = tick(DecideState(), T0, GOOD)
    d, _ = tick(s, T0 + 30.0, GOOD)
    changed = d.named(WhyCode.CHANGED)
    assert changed is not None and (changed.number("from_gamma"), changed.number("to_gamma")) == (0, 3)
    # GOOD's S(3) = 1.42 [1.31..1.55]; the batch is the evidence's step batch (6).
    assert d.summary == (
        "Change to speculation on, k=3 (from speculation off): gains +31%; expected 1.42x (1.31-1.55x) at batch 6."
    )


def test_staying_says_why_nothing_else_is_worth_a_change() -> None:
    d, _ = tick(DecideState(), T0, BAND, ON2)
    assert WhyCode.BELOW_MARGIN in _codes(d)
    assert d.summary == "Keep speculation on, k=2: expected 1.03x (0.97-1.10x) at batch 6; no other setting does " \
        "clearly better."
    # With a 20 s restart over 600 s, off's 10.6% on BAD is worth 64 s > 20 s: a change; on BAND nothing pays.
    held, _ = tick(DecideState(), T0, make_curve(1.0, (1.00, 1.03, 1.06), 1.0), ON2, COST)
    assert held.named(WhyCode.BELOW_MARGIN) is not None or held.named(WhyCode.COST) is not None


def test_a_turn_off_that_pays_is_named_as_such() -> None:
    d, _ = tick(DecideState(), T0, BAD, ON2)
    gain = d.named(WhyCode.GAIN)
    assert gain is not None and gain.number("to_gamma") == 0
    assert d.summary.startswith("Running speculation on, k=2; speculation off is expected to gain +")


def test_a_turn_off_kept_measuring_says_so() -> None:
    # test_decide's case: on at 3 (S 0.80), off gains 18.8%, gamma 1 is expected as fast as off: the move goes there.
    s3 = (0.75, 0.80, 0.85)
    even = make_curve((0.90, 1.00, 1.10), (0.70, 0.75, 0.80), s3)
    even = (even[0], replace(even[1], gain_sd=0.15), *even[2:])
    d, s = tick(DecideState(), T0, even, ON3, COST)
    assert d.summary == (
        "Running speculation on, k=3; speculation on, k=1 instead of off in 80 s: as fast, and the acceptance stays "
        "measured."
    )
    d, _ = tick(s, T0 + 107.0, even, ON3, COST)
    assert d.summary == (
        "Change to speculation on, k=1 (from speculation on, k=3) rather than off: as fast, and the acceptance stays "
        "measured."
    )


def test_bad_data_keeps_the_last_advice_and_says_so() -> None:
    _, s = tick(DecideState(), T0, GOOD)
    stale = replace(OFF, state=DataState.STALE, reason="HTTP 503")
    d, _ = decide(stale, (), CFG, s, T0 + 12.0)
    assert d.summary == (
        "Keeping the last advice, speculation off, from 12 s ago: no fresh scrape (the last one failed, or the data is "
        "old)."
    )
    assert _codes(d) == [WhyCode.STALE]
    thin = make_evidence(speculation_on=True, deployed_k=3, acceptance=None, state=DataState.INSUFFICIENT_DATA)
    first, _ = decide(thin, (), CFG, DecideState(), T0)
    # Nothing published yet: the sentence does not name a deployment it may never have read.
    assert first.summary == "No advice yet: too few drafts measured in the window yet."


def test_every_summary_fits_one_line() -> None:
    for curve, evidence in ((GOOD, OFF), (BAD, ON2), (BAND, ON2), (GOOD, ON2)):
        state = DecideState()
        for t in (0.0, 10.0, 30.0, 200.0):
            d, state = tick(state, T0 + t, curve, evidence, COST)
            assert 0 < len(d.summary) <= MAX_SUMMARY_CHARS, d.summary


def test_a_probe_says_it_is_there_to_measure() -> None:
    probe = Probe(gamma=3, why="remembered profile is 2400s old")
    _, state = tick(DecideState(), T0, BAD, OFF)  # off, and off is right: nothing pending
    d, state = decide(OFF, BAD, CFG, state, T0 + 60.0, inputs=DecideInputs(probe=probe))
    # 60 s after the baseline (< dwell 120 s): the probe waits its spacing.
    assert d.named(WhyCode.SPACING) is not None
    assert d.summary == "Running speculation off; speculation on, k=3 to measure the acceptance again in 60 s."
    d, state = decide(OFF, BAD, CFG, state, T0 + 120.0, inputs=DecideInputs(probe=probe))
    assert d.summary == "Turn speculation on, k=3 to measure the acceptance again: nothing is measured while it is off."
    # Published, but the engine still runs off: the probe is held.
    d, _ = decide(OFF, BAD, CFG, state, T0 + 150.0, inputs=DecideInputs(probe=probe))
    held = d.named(WhyCode.PROBE_HELD)
    assert held is not None and held.number("held_s") == 30.0
    assert d.summary == (
        "Running speculation on, k=3 to measure the acceptance again; waiting for the engine to apply it."
    )


def test_a_running_k_past_the_curve_never_prints_an_infinite_gain() -> None:
    # Deployed k=9 with gamma_max 8: the running option is off the curve and its gain is unbounded (inf).
    curve = make_curve(1.10, 1.30, (1.31, 1.42, 1.55), 1.35)
    on9 = make_evidence(speculation_on=True, deployed_k=9)
    d, s = tick(DecideState(), T0, curve, on9)
    gain = d.named(WhyCode.GAIN)
    assert gain is not None and gain.number("gain") == float("inf") and d.named(WhyCode.OFF_CURVE) is not None
    assert d.summary == "Running speculation on, k=9; changing to speculation on, k=3 in 30 s if that holds."
    d, _ = tick(s, T0 + 30.0, curve, on9)
    assert "inf" not in d.summary and d.summary.startswith("Change to speculation on, k=3 (from speculation on, k=9)")


def test_a_long_sentence_is_cut_to_the_limit() -> None:
    d, _ = tick(DecideState(), T0, GOOD)
    long = replace(d, why=(*d.why,), target="t" * 300)
    assert summarize(long) == d.summary  # the sentence does not depend on names
    stretched = replace(d, num_speculative_tokens=10**150, enabled=True, why=())
    text = summarize(stretched)
    assert len(text) == MAX_SUMMARY_CHARS and text.endswith("...")


def test_an_internal_error_keeps_the_setting_and_says_so() -> None:
    _, s = tick(DecideState(), T0, GOOD)
    assert s.published is not None
    d = held(s.published, kind=DataState.ERROR, reason="internal error: ValueError: x", age_s=40.0)
    assert (d.state, d.enabled, d.reason) == (DataState.ERROR, False, "internal error: ValueError: x")
    assert _codes(d) == [WhyCode.ERROR]
    assert d.summary == "Keeping the last advice, speculation off, from 40 s ago: the server cannot be read or priced."
