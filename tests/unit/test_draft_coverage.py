"""Drafts that do not come every step: the share of sequence-steps that drafted (draft coverage), measured by the
estimator and carried into E[L] and the tokens verified, checked against a real vLLM CPU server's counters.

tests/fixtures/cpu-crossover/engine-levels-2026-12-04.json holds, per closed-loop level, the deltas of the server's
own counters (benchmarks/cpu_crossover.py on the 2-core dev box): an untied tiny model whose n-gram drafts came on
only ~58% of sequence-steps, and a tied one at ~98%.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from estimate_builders import advance, feed, itl, make_snapshot

from policies.estimate.window import EstimatorConfig, estimate
from policies.model.acceptance import acceptance_curve
from policies.model.costmodel import operating_point
from policies.types import AcceptanceEvidence, DraftMethod

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cpu-crossover" / "engine-levels-2026-12-04.json"
CONFIG = EstimatorConfig(window_s=60.0, min_drafts=100, stale_after_s=60.0)


def _runs(arm: str) -> list[dict[str, Any]]:
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return [run for run in data["runs"] if run["arm"] == arm]


def _evidence_acceptance(**overrides: Any) -> AcceptanceEvidence:
    base: dict[str, Any] = {
        "per_position": (0.65, 0.5, 0.39), "per_position_low": (0.65, 0.5, 0.39),
        "per_position_high": (0.65, 0.5, 0.39), "drafts": 1000.0, "draft_tokens": 2700.0, "accepted_tokens": 1540.0,
        "mean_acceptance_length": 2.54, "acceptance_rate": 0.57, "mean_proposed_length": 2.7, "window_s": 60.0,
    }
    base.update(overrides)
    return AcceptanceEvidence(**base)


def test_the_estimator_measures_the_share_of_sequence_steps_that_drafted() -> None:
    first = make_snapshot(inter_token_latency=itl(1.0, 1000.0))
    second = advance(first, dt_s=10.0, drafts=580, draft_tokens=1566, accepted=893, per_position=(377, 290, 226),
                     inter_token_latency=itl(3.0, 2000.0))
    evidence = estimate(feed([first, second], CONFIG), target="t", config=CONFIG, now_s=second.taken_at_s)
    assert evidence.acceptance is not None
    assert evidence.acceptance.draft_coverage == pytest.approx(580 / 1000)


def test_without_inter_token_samples_every_step_is_taken_to_draft() -> None:
    first = make_snapshot()
    second = advance(first, dt_s=10.0, drafts=580, draft_tokens=1566, accepted=893, per_position=(377, 290, 226))
    evidence = estimate(feed([first, second], CONFIG), target="t", config=CONFIG, now_s=second.taken_at_s)
    assert evidence.acceptance is not None and evidence.acceptance.draft_coverage == 1.0


def test_counter_skew_never_reports_more_than_every_step() -> None:
    first = make_snapshot(inter_token_latency=itl(1.0, 1000.0))
    second = advance(first, dt_s=10.0, drafts=600, draft_tokens=1800, accepted=900, per_position=(400, 300, 200),
                     inter_token_latency=itl(2.0, 1590.0))
    evidence = estimate(feed([first, second], CONFIG), target="t", config=CONFIG, now_s=second.taken_at_s)
    assert evidence.acceptance is not None and evidence.acceptance.draft_coverage == 1.0


def test_coverage_scales_the_tokens_emitted_and_verified() -> None:
    # The docstring's example: c 0.58, r = (0.65, 0.5, 0.39) (E[L](3) = 2.54), 2.7 tokens per draft at k 3.
    curve = acceptance_curve(_evidence_acceptance(draft_coverage=0.58), method=DraftMethod.NGRAM, gamma_max=5)
    assert curve[3].expected_length == pytest.approx(1 + 0.58 * 1.54)
    assert curve[3].verified_tokens == pytest.approx(1 + 0.58 * 2.7)
    assert curve[1].verified_tokens == pytest.approx(1 + 0.58 * 1.0)  # a draft cut to 1 token proposes 1
    assert curve[5].verified_tokens == pytest.approx(1 + 0.58 * 5 * 2.7 / 3)  # above k: the measured fill
    assert curve[0].expected_length == 1.0 and curve[0].verified_tokens == 1.0
    for point in curve:
        assert point.expected_length_low <= point.expected_length <= point.expected_length_high
    every_step = acceptance_curve(_evidence_acceptance(), method=DraftMethod.NGRAM, gamma_max=3)
    assert every_step[3].expected_length == pytest.approx(2.54)


def test_the_operating_point_verifies_the_tokens_proposed_per_sequence_step() -> None:
    first = make_snapshot(inter_token_latency=itl(1.0, 1000.0))
    second = advance(first, dt_s=10.0, drafts=580, draft_tokens=1566, accepted=893, per_position=(377, 290, 226),
                     inter_token_latency=itl(3.0, 2000.0))
    evidence = estimate(feed([first, second], CONFIG), target="t", config=CONFIG, now_s=second.taken_at_s)
    assert operating_point(evidence).tokens_per_seq == pytest.approx(1 + 1566 / 1000)


@pytest.mark.parametrize("model", ["tied", "untied"])
def test_tokens_per_sequence_step_on_a_real_server_are_what_coverage_predicts(model: str) -> None:
    runs = [run for run in _runs("on") if run["model"] == model]
    assert len(runs) == 14
    for run in runs:
        e = run["engine"]
        coverage = e["drafts"] / e["itl_count"]
        per_position = [count / e["drafts"] for count in e["accepted_per_position"]]
        acceptance = _evidence_acceptance(
            per_position=tuple(per_position), per_position_low=tuple(per_position),
            per_position_high=tuple(per_position), draft_coverage=coverage,
            mean_proposed_length=e["draft_tokens"] / e["drafts"],
        )
        predicted = acceptance_curve(acceptance, method=DraftMethod.NGRAM, gamma_max=3)[3].expected_length
        # Measured: tokens the server generated per decoding sequence-step (the first token of each request, from
        # its prefill step, is in the numerator but has no ITL sample: ~1% of 128-token requests).
        measured = e["generation_tokens"] / e["itl_count"]
        assert predicted == pytest.approx(measured, rel=0.02), (run["concurrency"], predicted, measured)
        # Without coverage the tokens per step were E[L]: 34% too many for the untied model.
        if model == "untied":
            assert e["mean_acceptance_length"] / measured - 1 > 0.25


def test_the_cpu_profile_prices_the_measured_steps_of_both_arms() -> None:
    # The catalog's `cpu` row (policies/model/catalog.py) against every level of both arms and both models: the mean
    # step (span / steps, the per-step duration the calibration pairs with sequences per step) at the batch and
    # tokens per sequence each level ran. The box was shared (load 1-7), so single levels scatter by ~10%.
    # In-sample: the row's host costs were fitted to these levels; this guards the fit, it does not validate it.
    from policies.model.costmodel import ModelContext, OperatingPoint, step_time_at  # noqa: PLC0415
    from policies.model.profiles import drafter_for, hardware_by_name, model_by_name  # noqa: PLC0415

    model = model_by_name("tiny-llama")
    ctx = ModelContext(hardware_by_name("cpu"), model, drafter_for(DraftMethod.NGRAM, model))
    errors = []
    for run in _runs("on") + _runs("off"):
        e = run["engine"]
        speculating = run["arm"] == "on"
        point = OperatingPoint(
            batch=max(e["decode_seqs_per_step"], 1.0), context_tokens=200.0,
            tokens_per_seq=1.0 + (e["draft_tokens"] / e["itl_count"] if speculating else 0.0),
            draft_steps=3 if speculating else 0, prefill_tokens=e["prefill_tokens_per_step"],
        )
        errors.append(abs(step_time_at(ctx, point) / (e["span_s"] / e["steps"]) - 1))
    errors.sort()
    assert len(errors) == 56
    assert errors[len(errors) // 2] < 0.10
    assert errors[int(0.9 * len(errors))] < 0.25


def _cpu_observations(model: str, arms: tuple[str, ...]) -> list[Any]:
    from policies.model.calibrate import StepObservation  # noqa: PLC0415

    points = []
    for index, run in enumerate(r for arm in arms for r in _runs(arm) if r["model"] == model):
        e = run["engine"]
        speculating = run["arm"] == "on"
        points.append(StepObservation(
            at_s=1000.0 + index, batch=max(e["decode_seqs_per_step"], 1.0),
            tokens_per_seq=1.0 + (e["draft_tokens"] / e["itl_count"] if speculating else 0.0),
            draft_passes=3 if speculating else 0, context_tokens=200.0,
            prefill_tokens=e["prefill_tokens_per_step"], step_s=e["span_s"] / e["steps"],
        ))
    return points


def test_speculative_steps_alone_leave_the_verified_tokens_cost_at_the_prior() -> None:
    # The CPU server's speculative levels only (one q): per_token moves the step exactly as per_request does, so
    # the fit holds it at the prior, with the prior's variance (policies/model/calibrate.py); both kinds identify it.
    from policies.model.calibrate import PARAMS, CalibrationConfig, CalibrationState, fit, prior_covariance  # noqa: PLC0415
    from policies.model.costmodel import ModelContext  # noqa: PLC0415
    from policies.model.profiles import drafter_for, hardware_by_name, model_by_name  # noqa: PLC0415

    model = model_by_name("tiny-llama")
    ctx = ModelContext(hardware_by_name("cpu"), model, drafter_for(DraftMethod.NGRAM, model))
    config = CalibrationConfig()
    token = PARAMS.index("per_token")
    one_kind = CalibrationState(points=tuple(_cpu_observations("untied", ("on",))))
    _, alone = fit(one_kind, ctx, now_s=1100.0, config=config)
    assert alone.scales.per_token == 1.0
    assert alone.covariance is not None
    assert alone.covariance[token][token] == pytest.approx(prior_covariance(config)[token][token])
    both = CalibrationState(points=tuple(_cpu_observations("untied", ("on", "off"))))
    _, together = fit(both, ctx, now_s=1100.0, config=config)
    assert together.covariance is not None
    assert together.covariance[token][token] < 0.5 * prior_covariance(config)[token][token]
    assert together.error_ratio is not None and together.error_ratio < 0.12
