"""The drafting vs target split of a speculative step while only one kind of step was seen (policies/split.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from costmodel_builders import make_acceptance, make_evidence

from policies.advise import advise_target
from policies.calibrate import CalibrationState, StepObservation
from policies.costmodel import ModelContext, OperatingPoint, step_time_at
from policies.decide import DecideConfig, DecideState
from policies.profiles import drafter_for, hardware_by_name, model_by_name
from policies.roofline import CostScales, drafting_time, target_step_time
from policies.split import DRAFT_RANGE, alternatives, envelope, split_observed
from policies.types import CurvePoint, DraftMethod

MODEL = model_by_name("llama-3.1-8b")
CTX = ModelContext(hardware=hardware_by_name("h100-sxm"), model=MODEL, drafter=drafter_for(DraftMethod.EAGLE, MODEL))
SPEC = OperatingPoint(batch=5.0, context_tokens=768.0, tokens_per_seq=4.0, draft_steps=3, prefill_tokens=0.0)
PLAIN = replace(SPEC, tokens_per_seq=1.0, draft_steps=0)


def _drafting(scales: CostScales) -> float:
    return drafting_time(CTX.hardware, CTX.drafter, gamma=3, batch=5.0, context_tokens=768.0, scales=scales).total_s


def test_cheaper_drafting_gives_the_target_what_it_gives_up_and_still_explains_the_observed_step() -> None:
    fitted = CostScales()
    part = _drafting(fitted) - _drafting(replace(fitted, draft=0.0))  # what the draft scale multiplies
    cheaper, dearer = alternatives(CTX, fitted, SPEC)
    assert cheaper.draft == DRAFT_RANGE[0]
    # x0.5: the observed k=3 step is unchanged and plain decoding is slower by half that part.
    assert step_time_at(CTX, SPEC, scales=cheaper) == pytest.approx(step_time_at(CTX, SPEC, scales=fitted))
    plain = step_time_at(CTX, PLAIN, scales=fitted)
    assert step_time_at(CTX, PLAIN, scales=cheaper) == pytest.approx(plain + 0.5 * part)
    # x2: the target cannot give up the whole part (more than its fixed term): at most 90% of that term, and
    # drafting grows by only as much, so the observed step is still explained.
    fixed = target_step_time(CTX.hardware, CTX.model, batch=5.0, tokens_per_seq=1.0, context_tokens=768.0).overhead_s
    assert part > 0.9 * fixed
    assert step_time_at(CTX, PLAIN, scales=dearer) == pytest.approx(plain - 0.9 * fixed)
    assert step_time_at(CTX, SPEC, scales=dearer) == pytest.approx(step_time_at(CTX, SPEC, scales=fitted))
    assert 1.0 < dearer.draft < DRAFT_RANGE[1]


def test_at_a_plain_point_nothing_moves_to_the_target() -> None:
    cheaper, dearer = alternatives(CTX, CostScales(), PLAIN)
    for alt in (cheaper, dearer):
        assert alt.target_offset_s == 0.0
        assert step_time_at(CTX, PLAIN, scales=alt) == pytest.approx(step_time_at(CTX, PLAIN, scales=CostScales()))


def test_the_split_is_observed_once_both_kinds_of_step_were_seen() -> None:
    def obs(passes: int) -> StepObservation:
        return StepObservation(at_s=0.0, batch=4.0, tokens_per_seq=1.0 + passes, draft_passes=passes,
                               context_tokens=600.0, prefill_tokens=0.0, step_s=0.01)

    assert not split_observed([])
    assert not split_observed([obs(3), obs(3)])
    assert not split_observed([obs(0)])
    assert split_observed([obs(3), obs(0)])


def test_the_envelope_widens_bands_and_keeps_the_fitted_points() -> None:
    def point(s: float, low: float, high: float) -> CurvePoint:
        return CurvePoint(gamma=1, speedup=s, speedup_low=low, speedup_high=high, expected_accepted_length=1.5,
                          step_time_s=0.01)

    fitted = (point(0.03, 0.03, 0.03),)
    widened = envelope(fitted, [(point(1.0, 1.0, 1.0),), (point(0.01, 0.01, 0.02),), ()])
    assert widened == (point(0.03, 0.01, 1.0),)


def test_advise_widens_the_bands_until_plain_steps_are_seen() -> None:
    evidence = make_evidence(batch=4.0, acceptance=make_acceptance((0.8, 0.6, 0.45)))
    config = DecideConfig(dwell_s=0.0)

    def first_curve(state: CalibrationState) -> tuple[tuple[CurvePoint, ...], str]:
        advice = advise_target(evidence, CTX, decide_config=config, decide_state=DecideState(),
                               calibration_state=state, now_s=1_800_000_000.0)
        return advice.decision.curve, advice.decision.reason

    def seen(passes: int, step_s: float) -> StepObservation:
        return StepObservation(at_s=evidence.at_s - 30.0 + passes, batch=4.0, tokens_per_seq=1.0 + passes,
                               draft_passes=passes, context_tokens=600.0, prefill_tokens=0.0, step_s=step_s)

    only_spec, reason = first_curve(CalibrationState(points=(seen(3, 0.0110),)))
    assert "drafting vs target split not measured yet (no plain steps seen)" in reason
    measured, reason = first_curve(CalibrationState(points=(seen(0, 0.0075), seen(3, 0.0110))))
    assert "split not measured" not in reason
    # Unobserved split: plain decoding might be slower than the fit says (cheaper drafting), so the speculative
    # options' bands reach higher; with the split seen they are the acceptance bands alone (the same acceptance,
    # so the same width relative to the point).
    for wide, narrow in zip(only_spec[1:], measured[1:], strict=True):
        assert wide.speedup_high / wide.speedup > narrow.speedup_high / narrow.speedup + 0.02
        assert wide.speedup_low / wide.speedup < narrow.speedup_low / narrow.speedup - 0.02


def test_the_target_offset_adds_to_the_fixed_term_and_never_makes_it_negative() -> None:
    plain = target_step_time(CTX.hardware, CTX.model, batch=5.0, tokens_per_seq=1.0, context_tokens=768.0)
    later = target_step_time(CTX.hardware, CTX.model, batch=5.0, tokens_per_seq=1.0, context_tokens=768.0,
                             scales=CostScales(target_offset_s=0.001))
    assert later.overhead_s == pytest.approx(plain.overhead_s + 0.001)
    floor = target_step_time(CTX.hardware, CTX.model, batch=5.0, tokens_per_seq=1.0, context_tokens=768.0,
                             scales=CostScales(target_offset_s=-1.0))
    assert floor.overhead_s == 0.0 and floor.total_s == pytest.approx(plain.physics_s)
