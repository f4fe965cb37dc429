"""Roofline step time: the physics shape (memory- vs compute-bound, context, MoE, TP) with the arithmetic spelt out.

Shared numbers, H100 SXM + Llama-3.1-8B (bf16): streamed weights = 8.030e9 - 128256 x 4096 (untied input table)
= 7.505e9 params x 2 B = 15.01 GB; effective bandwidth 3.35e12 x 0.85 = 2.8475e12 B/s; effective compute
989.4e12 x 0.6 = 5.936e14 FLOP/s; KV 131072 B per token of context.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.model.roofline import (
    CostScales,
    Shape,
    crossover_batch,
    drafting_time,
    dynamic_sd_k0_overhead_s,
    expected_experts_touched,
    gemm_efficiency_factor,
    gemm_rows,
    gemm_tile_tokens,
    smooth_max,
    step_components,
    target_step_time,
)
from policies.types import DraftMethod

H100 = hardware_by_name("h100-sxm")
LLAMA8B = model_by_name("llama-3.1-8b")


def test_smooth_max_bounds() -> None:
    # (3^4 + 4^4)^(1/4) = 337^(1/4) = 4.2846.
    assert smooth_max(3.0, 4.0) == pytest.approx(337 ** 0.25)
    assert smooth_max(5.0, 0.0) == 5.0
    assert smooth_max(0.0, 0.0) == 0.0
    # At the crossover it is 2^(1/4) x the max; with one term twice the other, within 1.6%.
    assert smooth_max(1.0, 1.0) == pytest.approx(2 ** 0.25)
    assert smooth_max(2.0, 1.0) < 2.0 * 1.016
    assert math.isfinite(smooth_max(1e200, 1e200))


def test_batch1_step_is_weight_streaming() -> None:
    step = target_step_time(H100, LLAMA8B, Shape(batch=1, context_tokens=512, tokens_per_seq=1))
    # Weights 15.01 GB + KV 131072 x 512 = 67.1 MB -> 15.077e9 / 2.8475e12 = 5.295 ms.
    assert step.memory_s == pytest.approx(15.077e9 / 2.8475e12, rel=0.002)
    # One token is computed as one 64-row tile: the linear layers cost smooth_max(1 + 32, 64) = 65.10 tokens'
    # math, 2 x 7.505e9 x 65.10 = 9.772e11 FLOPs, + attention 4 x 32 x 32 x 128 x 512 = 2.68e8 -> 9.775e11 /
    # 5.936e14 = 1.647 ms, far under the 5.3 ms of memory time.
    assert step.compute_s == pytest.approx(9.775e11 / 5.936e14, rel=0.01)
    assert step.memory_bound
    # smooth_max(5.295, 1.647) = 5.295 x (1 + (1.647 / 5.295)^4)^(1/4) = 5.307 ms, + 1.5 ms fixed + 20 us per
    # request = 6.827 ms (vLLM measured 7.07 ms, vllm-eagle-k-sweep-bs1.csv).
    assert step.total_s == pytest.approx(6.827e-3, rel=0.003)


def test_verifying_4_tokens_at_batch1_costs_barely_more_than_1() -> None:
    one = target_step_time(H100, LLAMA8B, Shape(batch=1, context_tokens=512, tokens_per_seq=1))
    four = target_step_time(H100, LLAMA8B, Shape(batch=1, context_tokens=512, tokens_per_seq=4))
    # Bytes are the same; the GEMM rows grow 65.1 -> 68.1 (33 -> 36 rows above the 64-row floor), still ~3x below
    # the 5.3 ms of memory time, so the roofline barely moves; what grows is the three draft tokens' own cost,
    # 3 x 40 us = 0.12 ms: 6.827 -> 6.947 ms, +1.8%.
    assert four.weight_bytes == one.weight_bytes
    assert four.physics_s / one.physics_s < 1.001
    assert four.total_s - one.total_s == pytest.approx(3 * 40e-6, rel=0.05)


def test_verifying_4_tokens_at_batch256_costs_about_4x() -> None:
    one = target_step_time(H100, LLAMA8B, Shape(batch=256, context_tokens=64, tokens_per_seq=1))
    four = target_step_time(H100, LLAMA8B, Shape(batch=256, context_tokens=64, tokens_per_seq=4))
    # q=1: compute 2 x 7.505e9 x 256 = 3.84e12 FLOPs / 5.936e14 = 6.5 ms vs memory (15.01 GB + 256 x 64 x
    # 131072 = 2.15 GB) / 2.8475e12 = 6.0 ms: near the ridge. q=4: compute 25.9 ms >> 6.0 ms memory.
    # Physics ratio ~ 25.9 / smooth_max(6.0, 6.5) = 25.9 / 7.6 = 3.4 (the smooth max inflates the ridge point).
    assert not four.memory_bound
    assert 3.0 < four.physics_s / one.physics_s < 4.0
    # With half a 64-row tile of mean padding the GEMMs compute smooth_max(256 + 32, 64) = 288 x (1 +
    # (64/288)^4)^(1/4) = 288.2 rows vs smooth_max(1024 + 32, 64) = 1056.0 at q=4 (attention at ctx 64 adds under
    # 1%): a ratio of 3.66, not quite 4.
    assert four.compute_s / one.compute_s == pytest.approx(1056.0 / 288.2, rel=0.005)


def test_long_context_keeps_the_step_memory_bound_longer() -> None:
    # Per sequence, memory grows 46 ns x ctx (131072 B / 2.8475e12) and compute 25.3 us + 0.88 ns x ctx, on top
    # of 5.27 ms of weights vs 32 rows (half a tile) of padding = 0.81 ms of math:
    # crossover B* = (5.27 - 0.81) ms / (compute slope - memory slope): ctx 128 -> 4.46 / (25.4 - 5.9) us ~ 230;
    # ctx 256 -> 4.46 / (25.5 - 11.8) ~ 325; ctx 512 -> 4.46 / (25.7 - 23.6) ~ 2100;
    # ctx 1024: 47 us of memory per sequence > 26 us of compute: never compute-bound.
    b128 = crossover_batch(H100, LLAMA8B, context_tokens=128)
    b256 = crossover_batch(H100, LLAMA8B, context_tokens=256)
    b512 = crossover_batch(H100, LLAMA8B, context_tokens=512)
    assert b128 is not None and b256 is not None and b512 is not None
    assert 200 < b128 < b256 < b512
    assert crossover_batch(H100, LLAMA8B, context_tokens=1024) is None
    # Verifying 4 tokens per sequence reaches the ridge ~4x sooner: 4.46 ms / (4 x 25.4 - 5.9) us ~ 47.
    b128_q4 = crossover_batch(H100, LLAMA8B, context_tokens=128, tokens_per_seq=4)
    assert b128_q4 is not None and 35 < b128_q4 < 60


def test_expected_experts_touched() -> None:
    # E=128, k=8: one token hits exactly 8; 4 tokens 128 (1 - (120/128)^4) = 28.6; many tokens -> all 128.
    assert expected_experts_touched(128, 8, 1) == pytest.approx(8.0)
    assert expected_experts_touched(128, 8, 4) == pytest.approx(128 * (1 - (120 / 128) ** 4))
    assert expected_experts_touched(128, 8, 2000) == pytest.approx(128.0)
    assert expected_experts_touched(0, 0, 100) == 0.0


def test_moe_weight_bytes_grow_with_batch() -> None:
    moe = model_by_name("qwen3-30b-a3b")
    sizes = [
        target_step_time(H100, moe, Shape(batch=b, context_tokens=0, tokens_per_seq=1)).weight_bytes
        for b in (1, 4, 16, 64, 4096)
    ]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] / 5
    # Batch 1: only the 8 active experts -> (active - untied input table) x 2 bytes.
    assert sizes[0] == pytest.approx((moe.active_params - moe.input_embedding_params) * 2.0)
    # Batch 4096: every expert -> (params - input table) x 2 bytes.
    assert sizes[-1] == pytest.approx((moe.params - moe.input_embedding_params) * 2.0, rel=1e-6)
    # Dense weight bytes do not depend on batch.
    dense = {target_step_time(H100, LLAMA8B, Shape(batch=b, context_tokens=0, tokens_per_seq=1)).weight_bytes
             for b in (1, 64)}
    assert len(dense) == 1


def test_tensor_parallel_shards_bytes_and_adds_allreduce() -> None:
    llama70 = model_by_name("llama-3.1-70b")
    tp1 = target_step_time(H100, llama70, Shape(batch=1, context_tokens=1024, tokens_per_seq=1))
    tp4 = target_step_time(H100, llama70, Shape(batch=1, context_tokens=1024, tokens_per_seq=1), tensor_parallel=4)
    assert tp4.weight_bytes == pytest.approx(tp1.weight_bytes / 4)
    assert tp4.kv_bytes == pytest.approx(tp1.kv_bytes / 4)  # 8 KV heads over 4 GPUs: 2 each
    # All-reduce: 2 x 80 layers x (8 us + 2 x 3/4 x 8192 x 2 B / 450e9) = 160 x 8.055 us = 1.29 ms.
    allreduce = tp4.physics_s - smooth_max(tp4.memory_s, tp4.compute_s)
    assert allreduce == pytest.approx(160 * (8e-6 + 1.5 * 8192 * 2 / 450e9), rel=1e-6)
    # With more GPUs than KV heads the heads are replicated, not split below one per GPU.
    tp16 = target_step_time(H100, llama70, Shape(batch=1, context_tokens=1024, tokens_per_seq=1), tensor_parallel=16)
    assert tp16.kv_bytes == pytest.approx(tp1.kv_bytes / 8)


def test_fp8_weights_halve_bytes_and_use_the_fp8_peak() -> None:
    fp8 = replace(LLAMA8B, dtype_bytes=1.0)
    b16 = target_step_time(H100, LLAMA8B, Shape(batch=512, context_tokens=0, tokens_per_seq=1))
    b8 = target_step_time(H100, fp8, Shape(batch=512, context_tokens=0, tokens_per_seq=1))
    assert b8.weight_bytes == pytest.approx(b16.weight_bytes / 2)
    # Same FLOPs on a 1978.9 vs 989.4 TFLOP/s peak.
    assert b8.compute_s == pytest.approx(b16.compute_s * 989.4 / 1978.9)


def test_cost_scales_multiply_their_parts() -> None:
    base = target_step_time(H100, LLAMA8B, Shape(batch=8, context_tokens=256, tokens_per_seq=2))
    scaled = target_step_time(
        H100, LLAMA8B, Shape(batch=8, context_tokens=256, tokens_per_seq=2),
        scales=CostScales(overhead=3, roofline=0.5),
    )
    assert scaled.overhead_s == pytest.approx(3 * base.overhead_s)
    assert scaled.physics_s == pytest.approx(0.5 * base.physics_s)


def test_drafting_cost_by_method() -> None:
    eagle3 = drafter_for(DraftMethod.EAGLE3, LLAMA8B)
    ngram = drafter_for(DraftMethod.NGRAM, LLAMA8B)
    assert drafting_time(H100, eagle3, Shape(batch=4, context_tokens=512), gamma=0).total_s == 0.0
    one = drafting_time(H100, eagle3, Shape(batch=1, context_tokens=512), gamma=1)
    three = drafting_time(H100, eagle3, Shape(batch=1, context_tokens=512), gamma=3)
    # Per head step: 0.5 ms launch + (3.995e8 x 2 B + 1 layer KV 2 x 8 x 128 x 2 x 512 = 2.1 MB) / 2.8475e12
    # = 0.281 ms; plus one speculative overhead 0.775 + 0.005 ms. Three steps add 2 x 0.781 ms.
    assert one.total_s == pytest.approx(0.5e-3 + 0.281e-3 + 0.780e-3, rel=0.01)
    assert three.total_s - one.total_s == pytest.approx(2 * 0.781e-3, rel=0.01)
    # n-gram: host lookup 20 us per request, independent of gamma; + overhead 0.775 + 0.005 x 4 ms at B=4.
    ng1 = drafting_time(H100, ngram, Shape(batch=4, context_tokens=512), gamma=1)
    ng5 = drafting_time(H100, ngram, Shape(batch=4, context_tokens=512), gamma=5)
    assert ng1.total_s == ng5.total_s == pytest.approx(4 * 20e-6 + 0.775e-3 + 4 * 5e-6)


def test_draft_model_pays_its_own_kv() -> None:
    draft = drafter_for(DraftMethod.DRAFT_MODEL, LLAMA8B, draft_model=model_by_name("llama-3.2-1b"))
    short = drafting_time(H100, draft, Shape(batch=16, context_tokens=128), gamma=2)
    long = drafting_time(H100, draft, Shape(batch=16, context_tokens=8192), gamma=2)
    # KV per step: 2 x 16 layers x 8 heads x 64 x 2 B = 32768 B per token x 16 seqs x ctx, two steps.
    assert long.kv_bytes - short.kv_bytes == pytest.approx(2 * 32768 * 16 * (8192 - 128))
    assert long.total_s > short.total_s


@pytest.mark.parametrize(
    ("batch", "tokens_per_seq", "context_tokens"),
    [(0.5, 1.0, 0.0), (1.0, 0.0, 0.0), (1.0, 1.0, -1.0), (float("nan"), 1.0, 0.0)],
)
def test_invalid_operating_points_raise(batch: float, tokens_per_seq: float, context_tokens: float) -> None:
    with pytest.raises(ValueError):
        shape = Shape(batch=batch, context_tokens=context_tokens, tokens_per_seq=tokens_per_seq)
        target_step_time(H100, LLAMA8B, shape)


def test_prefill_adds_its_math_to_every_gamma_alike() -> None:
    plain = target_step_time(H100, LLAMA8B, Shape(batch=16, context_tokens=512, tokens_per_seq=1))
    mixed = target_step_time(H100, LLAMA8B, Shape(batch=16, context_tokens=512, tokens_per_seq=1, prefill_tokens=512))
    spec = target_step_time(H100, LLAMA8B, Shape(batch=16, context_tokens=512, tokens_per_seq=4, prefill_tokens=512))
    spec_plain = target_step_time(H100, LLAMA8B, Shape(batch=16, context_tokens=512, tokens_per_seq=4))
    # 512 prompt tokens attending to 256 on average: (2 x 7.505e9 + 4 x 32 x 32 x 128 x 256) x 512 = 7.70e12 FLOPs
    # / 5.936e14 = 12.97 ms, added outside the smooth max (compute-bound chunks), the same with and without drafts.
    extra = (2 * 7.505e9 + 4 * 32 * 32 * 128 * 256) * 512 / 5.936e14
    assert mixed.total_s - plain.total_s == pytest.approx(extra, rel=0.01)
    assert spec.total_s - spec_plain.total_s == pytest.approx(extra, rel=0.01)
    with pytest.raises(ValueError):
        target_step_time(H100, LLAMA8B, Shape(batch=1, context_tokens=1, tokens_per_seq=1, prefill_tokens=-1))


def test_step_components_price_like_the_two_functions() -> None:
    eagle3 = drafter_for(DraftMethod.EAGLE3, LLAMA8B)
    scales = CostScales(overhead=1.3, memory=1.7, compute=0.8, per_request=2.0, draft=0.6, fill=0.7, gemm_slope=0.25)
    parts = step_components(
        H100, LLAMA8B, eagle3, Shape(batch=48, context_tokens=900, tokens_per_seq=4, prefill_tokens=200),
        draft_passes=3,
    )
    target = target_step_time(
        H100, LLAMA8B, Shape(batch=48, context_tokens=900, tokens_per_seq=4, prefill_tokens=200), scales=scales,
    )
    draft = drafting_time(H100, eagle3, Shape(batch=48, context_tokens=900), gamma=3, scales=scales)
    assert parts.total_s(scales) == pytest.approx(target.total_s + draft.total_s, rel=1e-9)


def test_dynamic_sd_k0_overhead_reproduces_its_two_points() -> None:
    # dynamic-sd-k0-overhead.csv: +0.943 ms at concurrency 2, +16.656 ms at 189 (a + b B through both points).
    assert dynamic_sd_k0_overhead_s(2) == pytest.approx(0.943e-3)
    assert dynamic_sd_k0_overhead_s(189) == pytest.approx(16.656e-3)
    with pytest.raises(ValueError):
        dynamic_sd_k0_overhead_s(0.5)


def test_gemm_rows_pad_half_a_tile_above_a_fill_floor() -> None:
    # H100: tiles of 64 rows (wgmma m64), a one-tile floor; the CPU profile tiles nothing.
    assert gemm_tile_tokens(H100) == 64.0
    assert H100.gemm_fill_tokens == 64.0
    assert gemm_tile_tokens(hardware_by_name("cpu")) == 1.0
    # 1 token: smooth_max(1 + 32, 128) = 128 x (1 + (33/128)^4)^(1/4) = 128.14 rows.
    assert gemm_rows(1.0, pad=32.0, fill=128.0) == pytest.approx(128.0 * (1 + (33 / 128) ** 4) ** 0.25)
    # 256 tokens: 288 x (1 + (128/288)^4)^(1/4) = 290.8 rows; a floor halved to one tile barely moves it.
    assert gemm_rows(256.0, pad=32.0, fill=128.0) == pytest.approx(290.8, rel=1e-3)
    assert gemm_rows(256.0, pad=32.0, fill=64.0) == pytest.approx(288.0 * (1 + (64 / 288) ** 4) ** 0.25)


def test_gemm_efficiency_factor_is_a_power_of_the_size_below_2048_rows() -> None:
    # (2048 / 288)^0.4 = 2.193; at or above 2048 rows, or at slope 0, the large-GEMM rate applies (factor 1).
    assert gemm_efficiency_factor(288.0, 0.4) == pytest.approx((2048 / 288) ** 0.4)
    assert gemm_efficiency_factor(4096.0, 0.4) == 1.0
    assert gemm_efficiency_factor(288.0, 0.0) == 1.0


def test_fill_and_elasticity_reprice_the_linear_layers_only() -> None:
    step = target_step_time(H100, LLAMA8B, Shape(batch=64, context_tokens=512, tokens_per_seq=4))
    scaled = target_step_time(
        H100, LLAMA8B, Shape(batch=64, context_tokens=512, tokens_per_seq=4),
        scales=CostScales(fill=0.5, gemm_slope=0.3),
    )
    # 256 decode tokens: rows smooth_max(288, 64) = 288.2 -> smooth_max(288, 32) = 288.0 under fill 0.5, each at
    # 2 x 7.505e9 / 5.936e14 = 25.29 us, x (2048 / 288.0)^0.3 = 1.80; attention (4 x 32 x 32 x 128 x 512 x 256
    # = 6.9e10 FLOPs = 0.116 ms) and the memory time are untouched.
    row_s = 2 * 7.505e9 / 5.936e14
    attention_s = 4 * 32 * 32 * 128 * 512 * 256 / 5.936e14
    assert step.compute_s == pytest.approx(row_s * 288.2 + attention_s, rel=1e-3)
    rows = 288.0 * (1 + (32 / 288) ** 4) ** 0.25
    assert scaled.compute_s == pytest.approx(row_s * rows * (2048 / rows) ** 0.3 + attention_s, rel=1e-3)
    assert scaled.memory_s == step.memory_s
    # A bigger GEMM runs closer to the large-GEMM rate: with elasticity, verifying 4 tokens at batch 256 costs
    # less than the 1056 / 288.2 = 3.66x more linear-layer math it does (ctx 64: attention is under 1%).
    elastic = CostScales(gemm_slope=0.3)
    one = target_step_time(H100, LLAMA8B, Shape(batch=256, context_tokens=64, tokens_per_seq=1), scales=elastic)
    four = target_step_time(H100, LLAMA8B, Shape(batch=256, context_tokens=64, tokens_per_seq=4), scales=elastic)
    # (1056 / 288.2) x ((2048 / 1056) / (2048 / 288.2))^0.3 = 3.66 x 0.677 = 2.48.
    assert four.compute_s / one.compute_s == pytest.approx(1056.0 / 288.2 * (288.2 / 1056.0) ** 0.3, rel=0.01)
