"""The share meeting an ITL SLO from the window's per-request ITL histogram (policies/model/slo_share.py), and the
batch an
option holds under an open load (policies/model/objectives.py open_loop_batch), against independent computations."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
from costmodel_builders import make_context, make_evidence

from policies.model.acceptance import acceptance_curve
from policies.model.costmodel import curve_for
from policies.model.objectives import OPEN_LOOP_MAX_GROWTH, ObjectiveConfig, Workload, objective_curve, open_loop_batch
from policies.model.roofline import Shape
from policies.model.slo_share import fit_request_itl, modelled_share, shifted_share
from policies.types import DraftMethod, HistogramReading

# vLLM's buckets for request_time_per_output_token_seconds (tests/fixtures/vllm captures).
VLLM_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0, math.inf)
PHI = NormalDist().cdf
ACCEPTANCE = acceptance_curve(make_evidence().acceptance, method=DraftMethod.EAGLE3, gamma_max=4)


def log_normal_histogram(median_s: float, sigma: float, requests: float) -> HistogramReading:
    """The expected bucket counts of `requests` log-normal per-request ITLs, from the normal CDF directly."""
    mu = math.log(median_s)
    buckets = tuple((le, requests * (PHI((math.log(le) - mu) / sigma) if math.isfinite(le) else 1.0))
                    for le in VLLM_BOUNDS)
    return HistogramReading(sum=requests * math.exp(mu + sigma**2 / 2), count=requests, buckets=buckets)


@pytest.mark.parametrize(("median_s", "sigma"), [(0.03, 0.3), (0.012, 0.5), (0.08, 0.2)])
def test_a_spread_the_buckets_resolve_is_recovered(median_s: float, sigma: float) -> None:
    fitted = fit_request_itl(log_normal_histogram(median_s, sigma, 2000.0), prior_spread=0.10)
    assert fitted is not None
    assert fitted.sigma == pytest.approx(sigma, rel=0.1)
    assert math.exp(fitted.mu) == pytest.approx(median_s, rel=0.05)


def test_all_requests_in_one_bucket_leave_the_spread_near_the_prior_and_the_mean_places_them() -> None:
    # 100 requests, mean 33 ms, all in (25, 50] ms: the buckets only say the spread is small.
    histogram = HistogramReading(3.3, 100.0, tuple((le, 0.0 if le < 0.05 else 100.0) for le in VLLM_BOUNDS))
    fitted = fit_request_itl(histogram, prior_spread=0.10)
    assert fitted is not None
    assert 0.05 < fitted.sigma < 0.12
    # The mean anchors the location: exp(mu + sigma^2 / 2) = 33 ms.
    assert math.exp(fitted.mu + fitted.sigma**2 / 2) == pytest.approx(0.033, rel=1e-9)
    # A 30 ms SLO: the running option meets it for few requests, one 10% faster for about half.
    running = fitted.share_within(0.030)
    faster = shifted_share(fitted, slo_s=0.030, running_itl_s=0.040, itl_s=0.036, floor=0.01)
    assert running == pytest.approx(PHI((math.log(0.030) - fitted.mu) / fitted.sigma))
    assert running < 0.2 and faster is not None and 0.4 < faster < 0.7


def test_shifted_share_moves_every_request_by_the_ratio_and_keeps_the_floor() -> None:
    fitted = fit_request_itl(log_normal_histogram(0.03, 0.3, 2000.0), prior_spread=0.10)
    assert fitted is not None
    # Every request 20% faster (40 / 50 ms) meets a 30 ms SLO when it met 30 / 0.8 = 37.5 ms before.
    share = shifted_share(fitted, slo_s=0.030, running_itl_s=0.050, itl_s=0.040, floor=0.01)
    assert share == pytest.approx(PHI((math.log(0.0375) - math.log(0.03)) / 0.3), abs=0.02)
    # Far slower: the floor, not a vanishing number.
    assert shifted_share(fitted, slo_s=0.030, running_itl_s=0.010, itl_s=0.2, floor=0.01) == 0.01
    assert shifted_share(fitted, slo_s=0.030, running_itl_s=math.nan, itl_s=0.04, floor=0.01) is None


def test_an_empty_or_meaningless_histogram_is_not_fitted() -> None:
    empty = HistogramReading(0.0, 0.0, tuple((le, 0.0) for le in VLLM_BOUNDS))
    assert fit_request_itl(empty, prior_spread=0.1) is None
    assert fit_request_itl(HistogramReading(1.0, 10.0, ()), prior_spread=0.1) is None
    assert modelled_share(math.inf, slo_s=0.01, spread=0.1, floor=0.01) == 0.01


def test_open_loop_batch_solves_littles_law_for_an_affine_itl() -> None:
    # ITL(B) = a + b B; B = B_c ITL(B) / ITL_c  ->  B* = B_c a / (ITL_c - B_c b).
    a, b, batch, itl_c = 0.012, 0.00011, 200.0, 0.037
    expected = batch * a / (itl_c - batch * b)
    solved = open_loop_batch(batch, itl_c, lambda x: a + b * x, cap=800.0)
    assert solved == pytest.approx(expected, rel=0.01)
    # The running option itself holds the measured batch.
    assert open_loop_batch(batch, itl_c, lambda x: itl_c * (x / batch) ** 0.5, cap=800.0) == pytest.approx(batch)
    # An option whose ITL grows as fast as its batch cannot hold the load: it stops at the cap.
    assert open_loop_batch(batch, itl_c, lambda x: 0.0002 * x + 0.001, cap=800.0) == 800.0


def test_under_an_slo_a_faster_option_is_priced_at_the_smaller_batch_it_holds() -> None:
    ctx = make_context()
    # KV at 0.2: the cache holds 640 sequences, so no option's open-load batch meets that cap here.
    workload = Workload(128.0, 0.0, 512.0, kv_usage_ratio=0.2, deployed_k=1)
    config = ObjectiveConfig(itl_slo_s=0.02)
    curve, _, _ = objective_curve(ctx, ACCEPTANCE, workload, config=config)
    fixed, _ = curve_for(ctx, ACCEPTANCE, Shape(batch=128.0, context_tokens=512.0))
    running_itl = fixed[1].step_time_s / ACCEPTANCE[1].expected_length
    for gamma in (0, 2, 3):
        itl_fixed = fixed[gamma].step_time_s / ACCEPTANCE[gamma].expected_length
        # Find the batch this option's step was priced at, from its step time on the model's own curve.
        at = curve[gamma].step_time_s
        batches = [b / 4 for b in range(4, 4 * 640)]
        held = min(batches, key=lambda b: abs(curve_for(ctx, ACCEPTANCE, Shape(batch=b, context_tokens=512.0))[0][gamma]
                                                 .step_time_s - at))
        itl_held = at / ACCEPTANCE[gamma].expected_length
        # Little's law: the batch in proportion to the ITL, within the search's step, up to the open-load cap of
        # OPEN_LOOP_MAX_GROWTH x the measured batch (an option that would need more holds the cap, and its ITL there
        # is at least the ratio's).
        if itl_held / running_itl < OPEN_LOOP_MAX_GROWTH:
            assert held / 128.0 == pytest.approx(itl_held / running_itl, rel=0.02)
        else:
            assert held == pytest.approx(OPEN_LOOP_MAX_GROWTH * 128.0, rel=0.01)
        # ...so an option faster at the measured batch is faster still at its own, and a slower one slower.
        if itl_fixed < running_itl:
            assert held < 128.0 and itl_held < itl_fixed
        else:
            assert held > 128.0 and itl_held > itl_fixed


def test_the_running_options_share_is_the_measured_one_and_few_requests_fall_back_to_the_model() -> None:
    ctx = make_context()
    config = ObjectiveConfig(itl_slo_s=0.03)
    # Requests ran at a median 30 ms per token while the model prices the step far faster: the measured
    # distribution, not the model's level, says how many meet the SLO (about half).
    measured = Workload(16.0, 0.0, 512.0, kv_usage_ratio=0.2, deployed_k=1,
                        request_itl=log_normal_histogram(0.03, 0.3, 500.0))
    curve, _, _ = objective_curve(ctx, ACCEPTANCE, measured, config=config)
    plain = curve_for(ctx, ACCEPTANCE, Shape(batch=16.0, context_tokens=512.0))[0]
    assert plain[1].step_time_s / ACCEPTANCE[1].expected_length < 0.02  # the model alone would count every request
    assert curve[1].slo_share == pytest.approx(0.5, abs=0.03)
    # The options predicted faster meet it more often, the slower ones less: shares fall as the ITL rises.
    by_itl = sorted(curve, key=lambda p: p.step_time_s / max(p.expected_accepted_length, 1.0))
    shares = [p.slo_share or 0.0 for p in by_itl]
    assert shares == sorted(shares, reverse=True) and shares[0] > shares[-1]
    # 10 finished requests are too few (slo_min_requests 30): the modelled share.
    few = Workload(16.0, 0.0, 512.0, kv_usage_ratio=0.2, deployed_k=1,
                   request_itl=log_normal_histogram(0.03, 0.3, 10.0))
    assert objective_curve(ctx, ACCEPTANCE, few, config=config)[0][1].slo_share == pytest.approx(1.0)
