"""The cost model's own uncertainty in the bands (policies/model/uncertainty.py): the arithmetic, what identifies it,
and
what the decision does with it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from costmodel_builders import make_acceptance, make_context, make_evidence

from policies.advise import AdvisorConfig, AdvisorState, advise_target
from policies.decide.rule import DecideConfig, DecideState, decide
from policies.model.acceptance import acceptance_curve
from policies.model.calibrate import PARAMS, CalibrationConfig, CalibrationState, StepObservation, prior_covariance
from policies.model.costmodel import curve_for
from policies.model.roofline import CostScales, Shape
from policies.model.uncertainty import Z_90, Spread, banded, model_sd, shifted, widen
from policies.offline.whatif import acceptance_evidence
from policies.types import CurvePoint, Decision, DraftMethod, WhyCode

CTX = make_context(method=DraftMethod.EAGLE3)
NOW = 1_800_000_000.0


def test_the_model_part_joins_the_acceptance_band_in_quadrature() -> None:
    # The module docstring's example: S 1.50 with an acceptance band [1.44, 1.56] and a model sd of 0.171 in log
    # space: low = 1.5 exp(-sqrt(ln(1.5/1.44)^2 + (1.645 x 0.171)^2)) = 1.13, high = 1.5 exp(+sqrt(ln(1.56/1.5)^2
    # + 0.282^2)) = 1.99. Gamma 0 (plain decoding, S = 1 by definition) keeps its band.
    points = (CurvePoint(0, 1.0, 1.0, 1.0, 1.0, 0.01), CurvePoint(3, 1.5, 1.44, 1.56, 2.8, 0.012))
    plain, spec = widen(points, (0.5, math.sqrt(0.0293)))
    assert plain == points[0]
    assert spec.speedup == 1.5
    assert spec.speedup_low == pytest.approx(1.13, abs=0.005)
    assert spec.speedup_high == pytest.approx(1.99, abs=0.005)


def test_shifted_moves_one_fitted_coordinate() -> None:
    base = CostScales(per_token=2.0, gemm_slope=0.2)
    assert shifted(base, PARAMS.index("per_token"), 0.1).per_token == pytest.approx(2.0 * math.exp(0.1))
    assert shifted(base, PARAMS.index("gemm_slope"), 0.1).gemm_slope == pytest.approx(0.3)
    assert shifted(base, PARAMS.index("memory"), 0.1).per_token == 2.0  # nothing else moves


def _acceptance(k: int = 5) -> tuple[object, ...]:
    return acceptance_curve(acceptance_evidence((0.8, 0.65, 0.5)), method=DraftMethod.EAGLE3, gamma_max=k)


def test_an_uncalibrated_band_covers_a_verification_at_the_per_token_priors_far_end() -> None:
    # Nothing measured: the prior's covariance (per_token sd 0.8 in log space) propagated to S. At batch 64 the
    # draft tokens' own cost is a large share of the step, so the 90% band must hold S priced with the per-token
    # cost at its prior's 90% ends, x exp(+-1.645 x 0.8) = x3.7 and x0.27 (within 2%: the band is the linearised
    # propagation, and S is not quite linear in log per-token cost that far out).
    acceptance = _acceptance()

    def at(scales: CostScales) -> tuple[CurvePoint, ...]:
        return curve_for(CTX, acceptance, Shape(batch=64.0, context_tokens=1024.0), scales=scales)[0]  # type: ignore[arg-type]

    prior = prior_covariance(CalibrationConfig())
    curve = banded(at, CostScales(), Spread(prior))
    dear = at(CostScales(per_token=math.exp(Z_90 * 0.8)))
    cheap = at(CostScales(per_token=math.exp(-Z_90 * 0.8)))
    for point, hi_cost, lo_cost in zip(curve[1:], dear[1:], cheap[1:], strict=True):
        assert point.speedup_low <= 1.02 * hi_cost.speedup
        assert hi_cost.speedup < point.speedup < lo_cost.speedup
        assert lo_cost.speedup <= 1.02 * point.speedup_high


def test_the_band_reaches_the_other_split_of_the_same_steps() -> None:
    # A fit at one k whose other split (`CalibrationFit.split_alternative`) prices verified tokens 3x dearer: the
    # band must hold that curve's S at every gamma, on its side only (the high end stays where the fit put it), and
    # the ratio against the running option is less sure.
    acceptance = _acceptance()

    def at(scales: CostScales) -> tuple[CurvePoint, ...]:
        return curve_for(CTX, acceptance, Shape(batch=64.0, context_tokens=1024.0), scales=scales)[0]  # type: ignore[arg-type]

    covariance = [[0.01 if i == j else 0.0 for j in range(len(PARAMS))] for i in range(len(PARAMS))]
    alternative = CostScales(per_token=3.0)
    alone = banded(at, CostScales(), Spread(covariance), reference_gamma=0)
    both = banded(at, CostScales(), Spread(covariance, alternative=alternative), reference_gamma=0)
    other = at(alternative)
    assert both[0] == alone[0]
    for with_other, without, dear in zip(both[1:], alone[1:], other[1:], strict=True):
        assert dear.speedup < without.speedup_low  # outside the fit's own band...
        assert with_other.speedup_low <= dear.speedup  # ...inside the joined one
        assert with_other.speedup == without.speedup and with_other.speedup_high == without.speedup_high
        assert with_other.gain_sd > without.gain_sd
    # A cheaper other split reaches the high end instead, and leaves how sure a move's gain is alone (decide
    # discounts a gain by that sd: a split under which moving gains more is no reason to doubt the move).
    cheap = banded(at, CostScales(), Spread(covariance, alternative=CostScales(per_token=1.0 / 3.0)), reference_gamma=0)
    for with_other, without, gainful in zip(cheap[1:], alone[1:], at(CostScales(per_token=1.0 / 3.0))[1:], strict=True):
        assert with_other.speedup_high >= gainful.speedup > without.speedup_high
        assert with_other.speedup_low == without.speedup_low and with_other.gain_sd == without.gain_sd


def test_relative_sd_is_zero_at_the_reference_and_smaller_than_the_absolute_one_nearby() -> None:
    # S(2) and S(3) move together with the per-token cost: how sure the model is that one beats the other is
    # narrower than either band.
    acceptance = _acceptance()

    def at(scales: CostScales) -> tuple[CurvePoint, ...]:
        return curve_for(CTX, acceptance, Shape(batch=32.0, context_tokens=1024.0), scales=scales)[0]  # type: ignore[arg-type]

    absolute, relative = model_sd(at, CostScales(), prior_covariance(CalibrationConfig()), reference_gamma=3)
    assert relative[3] == 0.0
    assert 0.0 < relative[2] < absolute[2]
    assert relative[0] == pytest.approx(absolute[3])  # log(S(0) / S(3)) = -log S(3)


def _observed(passes: int, step_s: float, *, batch: float = 4.0) -> StepObservation:
    return StepObservation(at_s=NOW - 60.0 + passes, batch=batch, tokens_per_seq=1.0 + passes, draft_passes=passes,
                           context_tokens=600.0, prefill_tokens=0.0, step_s=step_s)


def test_the_band_narrows_once_plain_steps_are_seen_and_the_reason_says_what_would_settle_it() -> None:
    evidence = make_evidence(batch=4.0, acceptance=make_acceptance((0.8, 0.6, 0.45)))
    config = DecideConfig(dwell_s=0.0)

    def first(points: tuple[StepObservation, ...]) -> tuple[tuple[CurvePoint, ...], str]:
        advice = advise_target(evidence, CTX, AdvisorConfig(decide=config),
                               AdvisorState(calibration=CalibrationState(points=points)), NOW)
        unmeasured = advice.decision.named(WhyCode.VERIFICATION_UNMEASURED) is not None
        assert unmeasured == ("verification cost not measured yet" in advice.decision.reason)
        return advice.decision.curve, advice.decision.reason

    only_spec, reason = first((_observed(3, 0.0110),))
    assert "verification cost not measured yet (no plain steps seen, nor another k)" in reason
    assert "a window with speculation off or at another k measures them" in reason
    both, reason = first((_observed(0, 0.0075), _observed(3, 0.0110)))
    assert "not measured yet" not in reason
    for wide, narrow in zip(only_spec[1:], both[1:], strict=True):
        assert wide.speedup_high / wide.speedup_low > narrow.speedup_high / narrow.speedup_low
    assert all(p.gain_sd == 0.0 for p in both if p.gamma == 3)  # the running option against itself


def test_two_k_without_a_plain_step_keep_the_bookkeepings_spread_and_the_reason_says_so() -> None:
    # Steps at k=1 and k=3 measure a draft pass and its tokens, not the speculative bookkeeping both pay: what a
    # plain step saves stays the prior's, so every S keeps that spread until plain steps are seen.
    evidence = make_evidence(batch=4.0, acceptance=make_acceptance((0.8, 0.6, 0.45)))

    def first(
        points: tuple[StepObservation, ...], calibration: CalibrationConfig | None = None
    ) -> tuple[tuple[CurvePoint, ...], Decision]:
        config = AdvisorConfig(decide=DecideConfig(dwell_s=0.0), calibration=calibration or CalibrationConfig())
        advice = advise_target(evidence, CTX, config, AdvisorState(calibration=CalibrationState(points=points)), NOW)
        return advice.decision.curve, advice.decision

    two_k, decision = first((_observed(1, 0.0092), _observed(3, 0.0110)))
    assert "plain step not measured yet (speculative steps only, at two k)" in decision.reason
    assert "a window with speculation off measures it" in decision.reason
    assert decision.named(WhyCode.PLAIN_UNMEASURED) is not None
    assert decision.named(WhyCode.VERIFICATION_UNMEASURED) is None
    with_plain, decision = first((_observed(0, 0.0075), _observed(1, 0.0092), _observed(3, 0.0110)))
    assert "not measured yet" not in decision.reason and decision.named(WhyCode.PLAIN_UNMEASURED) is None
    for wide, narrow in zip(two_k[1:], with_plain[1:], strict=True):
        assert wide.speedup_high / wide.speedup_low > narrow.speedup_high / narrow.speedup_low
    # The widening is the bookkeeping's: the same two k with its prior made certain give narrower bands.
    sure, _ = first((_observed(1, 0.0092), _observed(3, 0.0110)), CalibrationConfig(spec_sigma=0.01))
    for wide, narrow in zip(two_k[1:], sure[1:], strict=True):
        assert wide.speedup_high / wide.speedup_low > narrow.speedup_high / narrow.speedup_low


def _running_three(gain_sd: float) -> tuple[CurvePoint, ...]:
    return (
        CurvePoint(0, 1.0, 1.0, 1.0, 1.0, 0.010),
        CurvePoint(1, 1.35, 1.30, 1.40, 1.6, 0.012, gain_sd=gain_sd),
        CurvePoint(2, 1.25, 1.20, 1.30, 2.0, 0.013, gain_sd=gain_sd),
        CurvePoint(3, 1.20, 1.15, 1.25, 2.4, 0.014),
    )


def test_a_restart_is_paid_only_by_a_gain_the_model_is_sure_of() -> None:
    # Running gamma 3 at S 1.20; gamma 1 at 1.35 is +12.5% on the point. A restart costs 20 s + the in-flight work
    # against a 600 s horizon (policies/decide/rule.py): at gain_sd 0.02 the gain's low end,
    # 1.35 exp(-1.645 x 0.02) / 1.20 - 1 = +8.8%, pays (53 s > ~20 s); at gain_sd 0.06, 1.35 exp(-0.099) / 1.20 - 1
    # = +1.9% (11 s) does not.
    evidence = replace(make_evidence(batch=4.0), deployed_k=3)
    config = DecideConfig(margin=0.0, dwell_s=0.0, confirm_s=0.0, change_cost_s=20.0, gamma_max=3)
    # The first tick publishes what runs as its baseline (no move is priced as sure at gain_sd 1).
    _, state = decide(evidence, _running_three(1.0), config, DecideState(), NOW)
    sure, _ = decide(evidence, _running_three(0.02), config, state, NOW + 5.0)
    unsure, _ = decide(evidence, _running_three(0.06), config, state, NOW + 5.0)
    assert sure.num_speculative_tokens == 1
    assert unsure.num_speculative_tokens == 3 and "held back by its cost" in unsure.reason
