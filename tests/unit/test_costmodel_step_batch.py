"""The batch the model prices is the batch a step verified (`Evidence.decode_seqs_per_step`) when measured, and the
step time it calibrates against describes those same steps (`costmodel.observed_step_s`). Covers the three users:
costmodel.operating_point / calibrate, calibrate.observation_from and objectives.workload_from."""

from __future__ import annotations

from dataclasses import replace

import pytest
from costmodel_builders import make_context, make_evidence

from policies.model.calibrate import CalibrationConfig, observation_from
from policies.model.costmodel import calibrate, observed_step_s, operating_point, step_batch
from policies.model.objectives import workload_from


def test_the_per_step_batch_wins_over_the_running_gauge() -> None:
    # A load ramp on the simulator: 131.9 running on average over the scrapes, 70.0 decoding per step.
    evidence = make_evidence(batch=131.9, decode_seqs_per_step=70.0)
    assert step_batch(evidence) == 70.0
    assert operating_point(evidence).batch == 70.0


def test_without_a_per_step_batch_the_running_gauge_is_used() -> None:
    assert operating_point(make_evidence(batch=12.5, decode_seqs_per_step=None)).batch == 12.5
    # Not a number is not a measurement either.
    assert operating_point(make_evidence(batch=12.5, decode_seqs_per_step=float("nan"))).batch == 12.5


def test_the_per_step_batch_is_floored_at_one_sequence_like_the_gauge() -> None:
    # 0.75 sequences per step (a quarter of the steps only finished prefills) prices a one-sequence step.
    assert operating_point(make_evidence(batch=3.0, decode_seqs_per_step=0.75)).batch == 1.0


def test_observed_step_on_a_busy_window_is_the_wall_clock_per_step() -> None:
    # ITL mean 23.6 ms (weights each step by its sequences); 30 s window, 26,700 ITL samples at 17.8 per step ->
    # N = 26,700 / 17.8 = 1,500 steps; busy engine: 30 s / 1,500 = 20.0 ms per step < 23.6 ms.
    evidence = make_evidence(step_time_s=0.0236, window_s=30.0, step_samples=26_700.0, decode_seqs_per_step=17.8)
    assert observed_step_s(evidence) == pytest.approx(0.020)
    # Two data-parallel engines share the window: 2 x 30 s / 1,500 = 40 ms > 23.6 ms, the ITL mean bounds it.
    assert observed_step_s(replace(evidence, engines=2)) == pytest.approx(0.0236)


def test_counters_that_outrun_the_scrape_clock_void_the_wall_clock_bound() -> None:
    # The sidecar test's simulator at time x20: 1 s between scrapes holds 20 simulated seconds of steps. Batch ~2:
    # ITL mean 13.6 ms over 1,936 samples = 26.3 sequence-seconds of decoding in a 1 s window with 2 running,
    # where one clock allows at most 1 s x 2 (x 2 slack for the gauge's scrape mean) = 4. The wall-clock bound
    # would say 1 s x 1.9 / 1,936 = 0.98 ms per step, 14x below the ITL mean: the ITL mean is returned instead.
    light = make_evidence(
        batch=2.0, decode_seqs_per_step=1.9, step_time_s=0.0136, window_s=1.0, step_samples=1_936.0
    )
    assert observed_step_s(light) == 0.0136
    # Saturated: 105.8 ms x 47,102 samples = 4,983 sequence-seconds in 1 s at 256 running (limit 2 x 256 = 512).
    busy = make_evidence(
        batch=256.0, decode_seqs_per_step=250.5, step_time_s=0.1058, window_s=1.0, step_samples=47_102.0
    )
    assert observed_step_s(busy) == 0.1058
    # The same counters over a 20 s window of one clock (4,983 <= 2 x 20 x 256): the bound applies again,
    # 20 s x 250.5 / 47,102 = 106.4 ms, here above the ITL mean, which stays the tighter bound.
    assert observed_step_s(replace(busy, window_s=20.0)) == 0.1058
    # A busy window of one clock whose ITL sum is 1.2x window x running (the gauge's scrape mean missed a peak):
    # 36 ms x 20,000 samples = 720 sequence-seconds, 30 s x 20 running = 600; bound 30 s x 20 / 20,000 = 30 ms.
    ramp = make_evidence(batch=20.0, decode_seqs_per_step=20.0, step_time_s=0.036, window_s=30.0, step_samples=20_000.0)
    assert observed_step_s(ramp) == pytest.approx(0.030)


def test_observed_step_on_an_idle_window_is_the_itl_mean() -> None:
    # 1,500 samples at 17.8 per step -> N = 84.3 steps in 30 s: 356 ms per step of wall clock, mostly idle, so the
    # ITL mean (23.6 ms) is the tighter bound.
    evidence = make_evidence(step_time_s=0.0236, window_s=30.0, step_samples=1_500.0, decode_seqs_per_step=17.8)
    assert observed_step_s(evidence) == pytest.approx(0.0236)


def test_observed_step_without_a_per_step_batch_is_the_itl_mean_and_none_without_one() -> None:
    assert observed_step_s(make_evidence(step_time_s=0.0236, window_s=30.0, step_samples=26_700.0)) == 0.0236
    assert observed_step_s(make_evidence(step_time_s=None)) is None
    assert observed_step_s(make_evidence(step_time_s=float("nan"))) is None


def test_one_point_calibration_fits_the_per_step_pair() -> None:
    ctx = make_context()
    evidence = make_evidence(
        batch=131.9, decode_seqs_per_step=70.0, step_time_s=0.05, window_s=30.0, step_samples=42_000.0
    )
    # N = 42,000 / 70 = 600 steps in 30 s -> 50 ms per step, equal to the ITL mean: observed 50 ms at B = 70.
    result = calibrate(evidence, ctx)
    assert result.point.batch == 70.0
    assert result.observed_step_s == pytest.approx(0.05)


def test_calibration_points_carry_the_per_step_batch_and_step() -> None:
    ctx = make_context()
    evidence = make_evidence(
        batch=131.9, decode_seqs_per_step=70.0, step_time_s=0.06, window_s=30.0, step_samples=42_000.0
    )
    point = observation_from(evidence, ctx, config=CalibrationConfig())
    assert point is not None
    # Batch 70 (per step, not the 131.9 gauge); step min(60 ms ITL mean, 30 s / 600 steps = 50 ms) = 50 ms.
    assert point.batch == 70.0
    assert point.step_s == pytest.approx(0.05)


def test_an_engine_that_decoded_nothing_per_step_gives_no_calibration_point() -> None:
    # 0.2 sequences per step (< 0.5): mostly prefill-only steps; their ITL mean says little about a decode step,
    # even though the running gauge reads 4.
    evidence = make_evidence(batch=4.0, decode_seqs_per_step=0.2, step_time_s=0.01, window_s=30.0, step_samples=100.0)
    assert observation_from(evidence, make_context(), config=CalibrationConfig()) is None


def test_objective_workload_uses_the_per_step_batch() -> None:
    evidence = make_evidence(batch=256.0, decode_seqs_per_step=240.0, waiting=50.0)
    assert workload_from(evidence, context_tokens=600.0, prefill_tokens=0.0).batch == 240.0
    fallback = make_evidence(batch=256.0, decode_seqs_per_step=None, waiting=50.0)
    assert workload_from(fallback, context_tokens=600.0, prefill_tokens=0.0).batch == 256.0
