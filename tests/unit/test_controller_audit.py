"""Auditing an engine's own speculation controller (policies/decide/audit.py): the verdict, the observable
budget and the actions, on hand-built curves whose gains are worked in each test."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from costmodel_builders import make_acceptance, make_context, make_evidence

from policies.decide.audit import (
    AuditVerdict,
    MethodOption,
    SpeculationController,
    audit_controller,
    with_mixed_note,
)
from policies.types import CurvePoint, DataState, Decision, DraftMethod


def curve(*speedups: float, sd: float = 0.06) -> tuple[CurvePoint, ...]:
    return tuple(CurvePoint(g, s, s * 0.9, s * 1.1, 1.0 + g, 0.01, gain_sd=0.0 if g == 4 else sd)
                 for g, s in enumerate(speedups))


def decision(points: tuple[CurvePoint, ...], state: DataState = DataState.OK) -> Decision:
    return decision_at(points, 4, state)


def decision_at(points: tuple[CurvePoint, ...], k: int, state: DataState = DataState.OK) -> Decision:
    return Decision(target="t", model="m", state=state, enabled=True, num_speculative_tokens=k,
                    expected_speedup=points[k].speedup, expected_speedup_low=1.0, expected_speedup_high=1.2,
                    reason="", evaluated_at_s=100.0, curve=points, calibration_error_ratio=0.07)


def test_a_static_k_measurably_better_than_dynamic_sd_is_worse_and_capped() -> None:
    # Running k 4 (Dynamic SD) at S 1.05; static k 2 at S 1.30, gain sd 0.06:
    # gain 1.30 / 1.05 = 1.238, low 1.238 / exp(1.645 x 0.06) = 1.122 > 1.03 -> worse, cap k at 2.
    evidence = make_evidence(deployed_k=4, acceptance=make_acceptance((0.8, 0.6, 0.4, 0.3), mean_proposed_length=2.5))
    audit = audit_controller(evidence, decision(curve(1.0, 1.2, 1.30, 1.25, 1.05)), make_context(),
                             controller=SpeculationController.DYNAMIC_SD)
    assert audit.verdict is AuditVerdict.WORSE
    assert audit.best_gamma == 2 and audit.gain_ratio == pytest.approx(1.30 / 1.05)
    assert audit.gain_low_ratio == pytest.approx(1.30 / 1.05 / math.exp(1.645 * 0.06))
    assert [(a.code, a.gamma) for a in audit.actions] == [("cap_k", 2)]
    assert audit.drafted_per_draft == 2.5 and audit.verified_per_step == pytest.approx(1 + 1.0 * 2.5)
    assert audit.calibration_error_ratio == 0.07


def test_a_gain_inside_the_noise_is_not_worse() -> None:
    # gain 1.10 / 1.05 = 1.048, low 1.048 / 1.104 = 0.949 < 1.03 -> not worse, no action
    evidence = make_evidence(deployed_k=4, acceptance=make_acceptance((0.8, 0.6, 0.4, 0.3)))
    audit = audit_controller(evidence, decision(curve(1.0, 1.1, 1.08, 1.06, 1.05)), make_context(),
                             controller=SpeculationController.DYNAMIC_SD)
    assert audit.verdict is AuditVerdict.NOT_WORSE and audit.actions == ()


def test_off_best_means_unload_the_drafter_and_names_the_kv_it_frees() -> None:
    # EAGLE-3 head for Llama-3.1-8B: ~4.0e8 bf16 params over 131072 KV bytes a token -> ~6100 tokens.
    evidence = make_evidence(deployed_k=4, acceptance=make_acceptance((0.5, 0.3, 0.2, 0.1)))
    audit = audit_controller(evidence, decision(curve(1.0, 0.9, 0.85, 0.8, 0.7)), make_context(),
                             controller=SpeculationController.DYNAMIC_SD)
    assert audit.verdict is AuditVerdict.WORSE
    [action] = audit.actions
    assert action.code == "unload_drafter"
    assert action.kv_tokens_freed == pytest.approx(6100, rel=0.05)


def test_under_adaptive_verification_the_budget_is_not_observable_and_the_reason_says_why() -> None:
    evidence = make_evidence(deployed_k=4, acceptance=make_acceptance((0.8, 0.6, 0.4, 0.3)))
    audit = audit_controller(evidence, decision(curve(1.0, 1.2, 1.30, 1.25, 1.05)), make_context(),
                             controller=SpeculationController.ADAPTIVE_VERIFICATION)
    assert not audit.budget_observable and audit.verified_per_step is None
    assert "trimmed slots count as rejections" in audit.reason


def test_without_a_controller_a_full_length_drafter_drafting_short_is_suspected() -> None:
    short = make_evidence(deployed_k=4, acceptance=make_acceptance((0.8, 0.6, 0.4, 0.3), mean_proposed_length=3.0))
    audit = audit_controller(short, decision(curve(1.0, 1.2, 1.3, 1.25, 1.05)), make_context(),
                             controller=SpeculationController.NONE)
    assert audit.controller == "suspected_dynamic" and not audit.declared
    assert audit.verdict is AuditVerdict.WORSE
    # An n-gram drafter drafts short by nature: no suspicion, no verdict.
    ngram = audit_controller(short, decision(curve(1.0, 1.2, 1.3, 1.25, 1.05)),
                             make_context(method=DraftMethod.NGRAM), controller=SpeculationController.NONE)
    assert ngram.verdict is AuditVerdict.NO_CONTROLLER


def test_no_verdict_without_ok_data() -> None:
    evidence = make_evidence(deployed_k=4, state=DataState.STALE, acceptance=make_acceptance((0.8, 0.6, 0.4, 0.3)))
    audit = audit_controller(evidence, decision(curve(1.0, 1.2, 1.3, 1.25, 1.05), DataState.STALE), make_context(),
                             controller=SpeculationController.DYNAMIC_SD)
    assert audit.verdict is AuditVerdict.UNKNOWN


def test_a_declared_controller_marks_the_measured_acceptance_as_mixed() -> None:
    evidence = make_evidence(deployed_k=4, acceptance=make_acceptance((0.8, 0.6, 0.4, 0.3)), reason="900 drafts")
    noted = with_mixed_note(evidence, SpeculationController.ADAPTIVE_VERIFICATION)
    assert noted.reason.startswith("900 drafts; acceptance mixed: ") and "trimmed slots" in noted.reason
    assert with_mixed_note(evidence, SpeculationController.NONE) == evidence
    assert with_mixed_note(make_evidence(acceptance=None), SpeculationController.DYNAMIC_SD).reason == ""


def test_a_better_deeper_static_k_is_an_action_too() -> None:
    # Running k 2 under a schedule at S 1.05; static k 4 at 1.40 (gain 1.333, low 1.333 / 1.104 = 1.208) -> set_k 4.
    evidence = make_evidence(deployed_k=2, acceptance=make_acceptance((0.9, 0.8)))
    points = curve(1.0, 1.1, 1.05, 1.3, 1.40)
    points = tuple(replace(p, gain_sd=0.0 if p.gamma == 2 else 0.06) for p in points)
    audit = audit_controller(evidence, decision_at(points, 2), make_context(),
                             controller=SpeculationController.DRAFT_LEN_SCHEDULE)
    assert audit.verdict is AuditVerdict.WORSE
    assert [(a.code, a.gamma) for a in audit.actions] == [("set_k", 4)]


def test_a_method_that_wins_even_at_its_prior_band_low_end_is_a_switch() -> None:
    # Best static of the deployed method 1.30 (what runs 1.05): eagle3's prior band [1.40, 2.2] clears 1.30 x 1.03 =
    # 1.339 -> switch_method to eagle3 at its k; ngram's [1.1, 1.6] does not.
    evidence = make_evidence(deployed_k=4, acceptance=make_acceptance((0.8, 0.6, 0.4, 0.3)))
    alternatives = (MethodOption("ngram", 3, 1.3, 1.1, 1.6), MethodOption("eagle3", 5, 1.8, 1.40, 2.2))
    audit = audit_controller(evidence, decision(curve(1.0, 1.2, 1.30, 1.25, 1.05)), make_context(),
                             controller=SpeculationController.DYNAMIC_SD, alternatives=alternatives)
    assert [a.method for a in audit.actions if a.code == "switch_method"] == ["eagle3"]
    assert [o.method for o in audit.alternatives] == ["eagle3", "ngram"]  # best first
    unsure = audit_controller(evidence, decision(curve(1.0, 1.2, 1.30, 1.25, 1.05)), make_context(),
                              controller=SpeculationController.DYNAMIC_SD, alternatives=alternatives[:1])
    assert not any(a.code == "switch_method" for a in unsure.actions)
