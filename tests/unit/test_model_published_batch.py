"""The cost model against the published batch > 1 measurements (tests/fixtures/published/, issue 14 item 1), through
the same functions `benchmarks/published_reproduction.py` prints: tolerances are what the physics achieves on these
files, each stated with the figure measured when it was set (2026-12-04). In-sample: the model's terms were
written with these files in view, and some constants are fitted to them (policies/model/profiles.py: the per-token, per-
layer and per-request step costs, `published_reproduction --fit`); held-out data is run by others.

- GEMMs (gemm-efficiency-vs-m.csv): the step model's linear-layer term (`roofline.linear_layer_s`, H100 profile)
  against cuBLAS bf16 and vLLM's fp8 linear kernels at M = 1..256 (the decode sizes): median within 10% and
  15% (measured 4.5% and 7.8-14.1%). Not graded: the vLLM DeepGEMM/Triton/CUTLASS block-fp8 script's rows, timed
  from Python with a ~30-70 us floor per call that a CUDA-graphed step does not pay; DeepGEMM's own table and
  XLA's below ~10 us per GEMM, where one kernel's launch and tail latency (~4 us) dominate (the step model
  carries those latencies per layer, `per_layer_step_s`, not per GEMM).
- Plain decoding vs batch (plain-decode-vs-batch.csv and the speculative sources' baseline arms): the shape
  T(B) / T(B_first), which is what S depends on: median within 10%, worst within 30% (measured 4.4% and 20.1%),
  except S-LMSYS-AMD's plain arm (DeepSeek-V3, MI300X), a known gap marked as an expected failure (+99% at
  batch 64, 2026-12-06).
- Speculative vs plain by concurrency (specdec-vs-concurrency.csv): each series' acceptance anchored at its lowest
  load, the rest predicted: median |pred/meas - 1| within 20% (measured 13.7%), the sign of S - 1 right wherever
  |measured - 1| > 0.05 (29 of 29), the measured speedup inside the uncalibrated 90% band at 19 of 29 (the ten
  outside: DeepSeek-V3 MTP on MI300X, whose speedup falls with batch where weight streaming says it should hold,
  and the 64k-context MTP pair, both ~15% under).
"""

from __future__ import annotations

import statistics

import pytest

from benchmarks.published_reproduction import gemm_points, plain_points, shape_errors, spec_points, spec_summary


def test_decode_sized_gemms_follow_the_linear_layer_roofline() -> None:
    points = [g for g in gemm_points() if g.m <= 256]
    cublas = [abs(g.predicted_s / g.measured_s - 1) for g in points if g.kernel.startswith("torch-bf16")]
    fp8 = [abs(g.predicted_s / g.measured_s - 1) for g in points if g.kernel.startswith("vLLM fp8-")]
    assert len(cublas) == 9 and len(fp8) == 24
    assert statistics.median(cublas) < 0.10
    assert statistics.median(fp8) < 0.15


def test_plain_step_grows_with_batch_as_measured() -> None:
    errors = [abs(error) for point, error in shape_errors(plain_points()) if point.source != "S-LMSYS-AMD"]
    assert len(errors) >= 30
    assert statistics.median(errors) < 0.10
    assert max(errors) < 0.30


@pytest.mark.xfail(strict=True, reason="known gap (docs/accuracy.md section 2): DeepSeek-V3 on MI300X (SGLang, "
                   "ROCm) measures 16.9 ms at batch 1 and T(64)/T(1) = 2.5; the model prices 4.6 ms and 5.0")
def test_plain_step_on_mi300x_grows_as_measured() -> None:
    errors = [abs(error) for point, error in shape_errors(plain_points()) if point.source == "S-LMSYS-AMD"]
    assert len(errors) == 6
    assert max(errors) < 0.30


def test_speculative_speedup_follows_concurrency_with_the_right_sign_and_an_honest_band() -> None:
    points = spec_points()
    summary = spec_summary(points)
    assert summary.points >= 25
    assert summary.median_abs_error < 0.20
    assert summary.sign_right == summary.sign_counted > 0
    assert summary.inside_band >= 0.6 * summary.points
    # The band is the model's: every predicted point's band is wider than the point alone (an i.i.d. acceptance
    # given as a number has no acceptance band of its own, so the width is the cost model's uncertainty).
    assert all(p.low < p.predicted < p.high for p in points)


def test_speedup_falls_with_batch_where_the_measurements_do() -> None:
    # Dense and MoE targets on NVIDIA GPUs: from each series' anchor to its largest batch the measured speedup
    # falls, and so does the prediction (Qwen3-8B H100, Qwen3-32B TP2 H200, gpt-oss-20b B200, Kimi-K2.6 GB200).
    series: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for p in spec_points():
        if p.source in {"S-GIST", "S-LLMD", "S-PEAGLE", "S-KIMI"}:
            series.setdefault((p.source, p.series), []).append((p.batch, p.measured, p.predicted))
    assert len(series) >= 6
    for name, items in series.items():
        items.sort()
        (_, first_measured, first_predicted), (_, last_measured, last_predicted) = items[0], items[-1]
        if last_measured < first_measured:
            assert last_predicted < first_predicted, name
