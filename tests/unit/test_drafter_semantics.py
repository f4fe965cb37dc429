"""Drafter semantics: which k a deployment may run, and where a shorter draft is not the prefix of a longer one
(policies/model/drafter_semantics.py), through the curve advise_target publishes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from costmodel_builders import make_acceptance, make_context, make_evidence

from policies.advise import AdvisorConfig, AdvisorState, advise_target, method_options
from policies.decide.rule import DecideConfig
from policies.model.acceptance import acceptance_curve
from policies.model.drafter_semantics import allowed_curve, prefix_stable
from policies.types import CurvePoint, DataState, DraftMethod

NOW = 1_800_000_000.0
CONFIG = AdvisorConfig(decide=DecideConfig(gamma_max=6, dwell_s=0.0))


def test_allowed_k_keeps_off_the_running_k_and_the_listed_ones() -> None:
    curve = tuple(CurvePoint(g, 1.0 + g / 10, 1.0, 2.0, 1.0 + g, 0.01) for g in range(7))
    assert [p.gamma for p in allowed_curve(curve, (2, 4), running=3)] == [0, 2, 3, 4]
    assert allowed_curve(curve, (), running=3) == curve


def test_a_restricted_drafter_is_only_ever_offered_its_allowed_k() -> None:
    ctx = make_context(method=DraftMethod.EAGLE3)
    ctx = replace(ctx, drafter=replace(ctx.drafter, allowed_k=(4,)))
    evidence = make_evidence(deployed_k=4, acceptance=make_acceptance((0.8, 0.64, 0.51, 0.41)), batch=2.0)
    decision = advise_target(evidence, ctx, CONFIG, AdvisorState(), NOW).decision
    assert decision.state is DataState.OK
    assert [p.gamma for p in decision.curve] == [0, 4]
    assert decision.num_speculative_tokens in (0, 4)


def test_suffix_drafts_below_k_are_extrapolated_where_ngram_ones_are_read() -> None:
    acceptance = make_acceptance((0.8, 0.6, 0.45))
    assert prefix_stable(DraftMethod.NGRAM) and not prefix_stable(DraftMethod.SUFFIX)
    read = acceptance_curve(acceptance, method=DraftMethod.NGRAM, gamma_max=3, prefix_stable=True)
    guessed = acceptance_curve(acceptance, method=DraftMethod.SUFFIX, gamma_max=3, prefix_stable=False)
    assert not read[1].extrapolated and not read[2].extrapolated
    assert guessed[1].extrapolated and guessed[2].extrapolated and not guessed[3].extrapolated
    # Same point (the k-run's positions), but nothing of it is measured for the shorter configuration.
    assert guessed[2].expected_length == pytest.approx(read[2].expected_length)
    assert guessed[2].extrapolated_share == pytest.approx((read[2].expected_length - 1) / read[2].expected_length)


def test_a_deployment_can_declare_its_drafter_not_prefix_stable() -> None:
    ctx = make_context(method=DraftMethod.MTP)
    evidence = make_evidence(deployed_k=3, acceptance=make_acceptance((0.8, 0.6, 0.45)), batch=2.0)
    read = advise_target(evidence, ctx, CONFIG, AdvisorState(), NOW).decision
    declared = replace(ctx, drafter=replace(ctx.drafter, prefix_stable=False))
    guessed = advise_target(evidence, declared, CONFIG, AdvisorState(), NOW).decision
    assert not any(p.extrapolated for p in read.curve if p.gamma <= 3)
    assert all(p.extrapolated for p in guessed.curve if 0 < p.gamma < 3)
    assert prefix_stable(DraftMethod.MTP) and not prefix_stable(DraftMethod.MTP, False)


def test_other_methods_are_priced_from_their_priors_at_the_same_point() -> None:
    ctx = make_context(method=DraftMethod.NGRAM)
    evidence = make_evidence(deployed_k=3, acceptance=make_acceptance((0.5, 0.3, 0.15)), batch=1.0)
    advice = advise_target(evidence, ctx, CONFIG, AdvisorState(), NOW)
    options = {o.method: o for o in method_options(evidence, ctx, advice, CONFIG)}
    # Not the deployed method, not draft_model (it needs its own model's profile).
    assert set(options) == {"suffix", "eagle", "eagle3", "mtp"}
    for option in options.values():
        assert 1 <= option.gamma <= 6 and option.speedup_low <= option.speedup <= option.speedup_high
    # At batch 1 a memory-bound step verifies extra tokens nearly free, so the method accepting more wins:
    # EAGLE-3's prior alpha 0.76 over suffix decoding's 0.40.
    assert options["eagle3"].speedup > options["suffix"].speedup
