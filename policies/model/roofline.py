"""Step time of a decode/verify step: a roofline of bytes against FLOPs, plus host, per-layer and per-token costs.

For B sequences each verifying q tokens at mean context ctx, with P prompt (prefill) tokens sharing the step
(chunked prefill) at mean attention span ctx_p, on tensor-parallel degree tp (per GPU):

    N            = B q + P                                   tokens the forward pass computes
    weight_bytes = (P_stream - P_experts) x b_dense / tp + L_moe x E_touched(N) x P_expert x b_expert / tp
                   P_stream = params minus an untied input-embedding table (a step reads N rows, not the table)
                   b_dense, b_expert: bytes per weight (policies/model/quantization.py; experts may be quantised apart)
                   E_touched(n) = E (1 - (1 - k/E)^n): expected distinct experts per layer hit by n tokens routed
                   uniformly at random (real routers are skewed, so this is an upper bound on expert bytes);
                   for a MoE, N is taken per step: a window's mean P arrives in chunks of c tokens (a whole prompt,
                   Shape.prefill_chunk_tokens), so a share f = P / c of its steps touch E_touched(B q + c) and the
                   rest E_touched(B q): weight bytes (1 - f) W(B q) + f W(B q + c), linear in P (below)
    kv_bytes     = kv_elements(tp) x kv_dtype_bytes x (B x ctx + P_req x ctx_p)
                   kv_elements: GQA 2 x layers x max(kv_heads / tp, 1) x head_dim; MLA layers x (latent + rope),
                   whole on every GPU (policies/model/profiles.py `AttentionShape`); P_req = 1 when P > 0; ctx is the
                   attended context (layers with a sliding window read at most the window: `attended_context`)
    forward_s    = smooth_max(memory x (weight_bytes + kv_bytes) / BW,
                              compute x (2 P_matmul x G(B q) x (N_ref / G)^beta + pair_flops x ctx x B q) / tp / F)
                   pair_flops: decode attention FLOPs per (query, cached token) pair, all layers (GQA 4 L H d; MLA
                   L H (4 latent + 2 rope): the absorbed form does ~128x more math per cached byte)
    BW           = BW_peak x bandwidth_efficiency;   F = F_peak(dtype) x flops_efficiency (a large GEMM's rate)
                   G(n) = smooth_max(n + t/2, N_fill x fill): the GEMM rows a step of n tokens computes.
                          Rows run in whole tiles of t = min(64, N_fill) tokens (Hopper's wgmma instruction is
                          m64nNk16, PTX ISA), and a window's batch fluctuates by more than a tile, so on average
                          half a tile is padding. N_fill = hardware.gemm_fill_tokens (64 on GPUs: one tile, 1 on
                          CPU; policies/model/profiles.py says why not a wave): a step's linear layers cost at least
                          about N_fill tokens' worth of math. (t = 1 pads nothing.)
                   beta (gemm_slope, 0 uncalibrated): GEMM efficiency elasticity: the rate at n rows is
                          F x (n / N_ref)^beta below N_ref = 2048 rows (a prefill chunk) and F above it; fill and
                          beta are fitted online (policies/model/calibrate.py): the profile cannot know a
                          kernel's tiles.
    prefill_s    = compute x (2 P_matmul x P x (N_ref / G(B q + P))^beta + prefill_pair_flops x ctx_p x P) / tp / F
                   (the prompt tokens are rows of the same GEMMs as the decode tokens: at the step's whole row count's
                   efficiency, which is F for a prefill-sized chunk of N_ref rows or more)
    allreduce_s  = tp > 1: 2 x layers x (latency + 2 (tp - 1)/tp x N hidden x 2 bytes / link_bytes_per_s)
    overhead_s   = overhead x (step_fixed_s + layers x per_layer_step_s + per_request x per_request_step_s x B
                               + per_token x per_token_step_s x B (q - 1))
                   the last term: each verified draft token's own cost (rejection sampling over the vocabulary,
                   the drafts' bookkeeping and per-token output handling); a plain step's one token per sequence
                   is in the per-request and roofline terms
    T_target     = overhead_s + roofline x (forward_s + prefill_s + allreduce_s)

Why a per-token term: the roofline terms leave out every cost that grows with the tokens verified but is neither
weight streaming nor GEMM math, and on published servers it is the larger part of a verified token's cost at
decode batch sizes (policies/model/profiles.py `per_token_step_s`, its derivation from the published batch > 1 data).
Why per layer: each layer's kernels have latency floors that no byte or FLOP count shows (policies/model/profiles.py).

Ranges: B >= 1 (continuous: a window mean), q >= 1, ctx >= 0, P >= 0 tokens, tp >= 1. Worked example (H100 SXM,
Llama-3.1-8B bf16, B=1, q=1, ctx=512, P=0): weights 15.01 GB + 67 MB of KV over 2.85 TB/s = 5.29 ms against
G(1) = 65.1 rows x 15.0 GFLOP / 5.936e14 FLOP/s = 1.65 ms -> 5.31 ms; + 0.38 ms host + 32 x 35 us of layer
latencies + 20 us per request = 1.52 ms -> 6.83 ms (vLLM measured 7.07 ms plain TPOT, vllm-eagle-k-sweep-bs1.csv).
No draft tokens, so no per-token term; at q = 4 it adds 3 x 40 us.

Why prefill is added outside the smooth maxes: prompts arrive in chunks of hundreds to thousands of tokens (up to
the token budget, e.g. 8192), which are compute-bound, so each prompt token costs its full math whichever step
carries it; P is a window mean over bursty steps (most carry 0, a few carry a big chunk), and only a term linear
in P averages correctly (E[T(P)] = T(E[P]) needs T linear in P). The same holds for a MoE's expert bytes, which
are concave in a step's tokens: a mean of 43.5 prompt tokens in every step of 18.4 decode tokens would touch 125.6
of Qwen3-30B-A3B's 128 experts per layer, while the window's steps touch 89 without a prompt chunk and 128 with
one (11.7% of them), 93.5 on average; hence the chunk mixture above. Prompts that arrive within one step share it
(vLLM schedules every waiting prompt the budget holds), so a whole prompt per chunk is the smallest chunk: the
share of steps carrying one, and the expert bytes priced, are upper bounds. Why prefill is in T at all (chunked prefill,
vLLM V1's default): the server's measured step time includes it, so calibration must price it. (In S itself a
rate-bound prompt load cancels: see policies/model/costmodel.py.)

Why a 4-norm smooth max: memory traffic and math overlap imperfectly near the ridge point; the 4-norm is at most
2^(1/4) = 1.19x the larger term (at the crossover) and within 1.6% of it once one term is twice the other. The
published GEMM measurements agree (tests/fixtures/published/gemm-efficiency-vs-m.csv: cuBLAS bf16 on H100 from
M = 1 to 256 is fitted best by p = 4-5, benchmarks/published_reproduction.py). The `CostScales` are what online
calibration fits (policies/model/calibrate.py); the multipliers default to 1 and the elasticity to 0 (the physics as the
profile states it). Activations (a few MB per step) are left out of the bytes: below 1% of the weight bytes at
decode batch sizes.

Drafting (what a speculative step adds besides verifying more tokens), for gamma >= 1 drafts:
    ngram / suffix : host_time_per_request x B                                  (one host lookup per step)
    eagle/eagle3/mtp/draft_model: gamma x (draft_step_fixed_s + roofline of the drafter at B tokens: drafter
                     weights + its own KV cache at its attended ctx + its all-reduces), per GPU of the drafter's
                     own tensor-parallel degree (`_draft_pass`; a head runs at the target's, so at TP > 1 each of
                     its layers all-reduces twice too)
    plus           : overhead x spec x (spec_step_overhead_s + per_request x spec_per_request_overhead_s x B)
                     (rejection sampling, bookkeeping: the speculative machinery's own cost, whatever gamma;
                     `spec` is its calibration scale, identified only beside plain steps)
The per-request speculative term is host/sampler bookkeeping only (see policies/model/profiles.py for why it is not
the 84 us/request of vLLM Dynamic SD at K=0); `dynamic_sd_k0_overhead_s` prices that code path separately.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from policies.model.profiles import AttentionShape, DrafterProfile, HardwareProfile, ModelProfile
from policies.types import DraftMethod

SMOOTH_MAX_P = 4.0
GEMM_TILE_TOKENS = 64.0  # rows of one Hopper wgmma tile (m64nNk16), PTX ISA
GEMM_REFERENCE_TOKENS = 2048.0  # rows of a prefill-sized GEMM: where the rate F applies (module docstring)
ACTIVATION_BYTES = 2.0  # bf16 activations in the tensor-parallel all-reduce
HOST_DRAFT_METHODS = frozenset({DraftMethod.NGRAM, DraftMethod.SUFFIX})
# dynamic-sd-k0-overhead.csv: (15.317 - 14.374) = 0.943 ms at concurrency 2, (93.820 - 77.164) = 16.656 ms at 189.
DYNAMIC_SD_K0_PER_REQUEST_S = (16.656e-3 - 0.943e-3) / (189 - 2)
DYNAMIC_SD_K0_STEP_S = 0.943e-3 - 2 * DYNAMIC_SD_K0_PER_REQUEST_S


@dataclass(frozen=True, slots=True)
class CostScales:
    """Calibration multipliers, all > 0 and 1 for the uncalibrated physics.

    `overhead` scales every fixed/host term and `roofline` every physics term (the one-point calibration in
    policies/model/costmodel.py fits these two); `memory` scales memory time (1 / effective-bandwidth error), `compute`
    compute time (1 / effective-FLOP/s error), `per_request` the per-running-request host terms on top of
    `overhead`, `per_token` the per-verified-token term (the marginal cost of a token besides its roofline:
    what speculation's extra tokens pay), `draft` every drafting pass (its launch and its roofline: drafter
    profiles are the least certain numbers; EAGLE heads differ in layers and in whether they own an lm_head),
    `spec` the speculative machinery's own per-step cost whatever gamma (spec_step_overhead_s and
    spec_per_request_overhead_s x B, on top of `overhead` and, for the per-request part, `per_request`).
    `fill` scales the GEMM tile
    floor N_fill and `gemm_slope` is the GEMM efficiency elasticity beta (not a multiplier: 0 uncalibrated,
    valid in [0, 1]); module docstring. The online fitter in policies/model/calibrate.py fits all but `roofline`.
    Example: memory 2.0 means the server streams bytes at half the bandwidth the profile assumed; fill 0.5
    halves the H100's 64-row floor to 32 rows; gemm_slope 0.4 prices a 256-token decode step's linear layers
    (288.2 rows) at (2048 / 288.2)^0.4 = 2.19x the math time of the same rows at the large-GEMM rate.
    """

    overhead: float = 1.0
    roofline: float = 1.0
    memory: float = 1.0
    compute: float = 1.0
    per_request: float = 1.0
    per_token: float = 1.0
    draft: float = 1.0
    spec: float = 1.0
    fill: float = 1.0
    gemm_slope: float = 0.0


@dataclass(frozen=True, slots=True)
class Shape:
    """What one step works on: `batch` sequences (>= 1) each verifying `tokens_per_seq` tokens (>= 1; gamma + 1
    with gamma drafts) at `context_tokens` (>= 0) mean context, plus `prefill_tokens` (>= 0) prompt tokens of
    chunked prefill attending to `prefill_context_tokens` on average (None: ctx / 2, a chunk of a prompt attends to
    about half the prompt), carried in chunks of `prefill_chunk_tokens` (None: every step carries all P; a mean P
    below the chunk means a share P / chunk of the steps carry one, which a MoE's expert bytes tell apart: module
    docstring). Drafting reads only `batch` and `context_tokens`. Ranges are checked where it is priced.
    Example: Shape(batch=8, tokens_per_seq=4, context_tokens=512): 8 sequences verifying 3 drafts + 1 at 512 tokens.
    """

    batch: float
    context_tokens: float
    tokens_per_seq: float = 1.0
    prefill_tokens: float = 0.0
    prefill_context_tokens: float | None = None
    prefill_chunk_tokens: float | None = None


@dataclass(frozen=True, slots=True)
class StepTime:
    """One priced step (seconds, bytes, FLOPs per GPU). `total_s` = `overhead_s` + `physics_s`, both scaled;
    `overhead_s` holds the host terms and the per-token term; `memory_s` / `compute_s` are the whole step's memory
    and math times (weights + KV; linear layers + attention) with their own calibration scales (memory, compute)
    but not `roofline` (`physics_s` blends them per kernel class, module docstring)."""

    weight_bytes: float
    kv_bytes: float
    flops: float
    memory_s: float
    compute_s: float
    overhead_s: float
    physics_s: float

    @property
    def total_s(self) -> float:
        return self.overhead_s + self.physics_s

    @property
    def memory_bound(self) -> bool:
        return self.memory_s >= self.compute_s


def smooth_max(a: float, b: float, *, p: float = SMOOTH_MAX_P) -> float:
    """The p-norm (a^p + b^p)^(1/p) of two non-negative times: >= max(a, b), <= 2^(1/p) max(a, b).

    Example: smooth_max(3, 4) = (81 + 256)^(1/4) = 4.285; smooth_max(5, 0) = 5.
    """
    top = max(a, b)
    if top <= 0:
        return 0.0
    # Normalise by the larger term so the powers cannot overflow.
    return top * math.pow(math.pow(a / top, p) + math.pow(b / top, p), 1.0 / p)


def expected_experts_touched(num_experts: int, experts_per_token: int, tokens: float) -> float:
    """Expected distinct experts in one MoE layer hit by `tokens` tokens, each routed to `experts_per_token` of
    `num_experts` uniformly: E (1 - (1 - k/E)^tokens). In [k, E] for tokens >= 1; 0 for a dense model.

    Example: E=128, k=8: 1 token -> 8; 4 tokens -> 128 (1 - (120/128)^4) = 28.6; 256 tokens -> ~128.
    """
    if num_experts <= 0 or experts_per_token <= 0:
        return 0.0
    tokens = max(tokens, 1.0)
    return num_experts * (1.0 - math.pow(1.0 - experts_per_token / num_experts, tokens))


def gemm_tile_tokens(hardware: HardwareProfile) -> float:
    """Rows t of one GEMM tile (tokens): min(64, `hardware.gemm_fill_tokens`), at least 1 (1: no tiling).

    Example: H100 (fill 64) -> 64; the CPU profile (fill 1) -> 1.
    """
    return max(1.0, min(GEMM_TILE_TOKENS, hardware.gemm_fill_tokens))


def gemm_rows(tokens: float, *, pad: float, fill: float) -> float:
    """G(n): GEMM rows (tokens' worth of linear-layer math) a step of `tokens` (>= 0) computes, with `pad` (>= 0,
    half a tile) of mean padding and a floor of `fill` (>= 0) rows: smooth_max(tokens + pad, fill).

    Example: pad 32, fill 64: 1 token -> smooth_max(33, 64) = 65.1; 256 -> 288.0 x (1 + (64/288)^4)^(1/4)
    = 288.2; fill 32 (calibrated 0.5): 64 tokens -> 96 x (1 + (32/96)^4)^(1/4) = 96.3.
    """
    return smooth_max(tokens + pad, fill)


def gemm_efficiency_factor(rows: float, slope: float) -> float:
    """How much longer `rows` (>= 0) GEMM rows take than at the large-GEMM rate, for elasticity `slope` (beta,
    0..1): (N_ref / clamp(rows, 1, N_ref))^slope, >= 1, 1 at or above N_ref = 2048 rows or at slope 0.

    Example: 288 rows, beta 0.4 -> (2048 / 288)^0.4 = 2.19; 4096 rows -> 1.0.
    """
    if slope == 0.0:
        return 1.0
    return math.exp(slope * math.log(GEMM_REFERENCE_TOKENS / min(max(rows, 1.0), GEMM_REFERENCE_TOKENS)))


def step_fixed_s(hardware: HardwareProfile, model: ModelProfile) -> float:
    """A step's fixed time (s, whatever its tokens): the engine's host work per step plus every layer's kernel
    latencies, step_fixed_s + layers x per_layer_step_s (policies/model/profiles.py for both constants' sources).

    Example: H100 profile, Llama-3.1-8B (32 layers): 0.7 ms + 32 x 25 us = 1.5 ms; DeepSeek-V3 (61): 2.23 ms.
    """
    return hardware.step_fixed_s + model.layers * hardware.per_layer_step_s


def linear_layer_s(
    hardware: HardwareProfile, *, rows: float, out_features: float, in_features: float, dtype_bytes: float
) -> float:
    """One linear layer (a GEMM of `rows` tokens x `in_features` -> `out_features`) as the step model prices its
    linear layers (seconds): smooth_max(weight bytes / BW, 2 x G(rows) x out x in / F), with the profile's
    efficiencies, tile padding and floor. The published GEMM measurements check this shape
    (benchmarks/published_reproduction.py). Example: H100 SXM, bf16, 12288 x 5376 at 64 rows: 132.1 MB /
    2.85 TB/s = 46.4 us against G(64) = 100.4 rows x 132.1 MFLOP / 5.936e14 = 22.3 us -> 47.0 us (cuBLAS measured
    46.3 us, gemm-efficiency-vs-m.csv).
    """
    weights = out_features * in_features * dtype_bytes
    memory = weights / (hardware.mem_bandwidth_bytes_per_s * hardware.bandwidth_efficiency)
    tile = gemm_tile_tokens(hardware)
    grid = gemm_rows(rows, pad=0.5 * tile if tile > 1.0 else 0.0, fill=hardware.gemm_fill_tokens)
    rate = hardware.flops_for_dtype(dtype_bytes) * hardware.flops_efficiency
    compute = 2.0 * grid * out_features * in_features / rate
    return smooth_max(memory, compute)


@dataclass(frozen=True, slots=True)
class StepComponents:
    """One step's unscaled parts (seconds per GPU), priced by `total_s(scales)`: what calibration refits.

    `fixed_s`: the step's fixed host and per-layer costs; `spec_fixed_s` / `spec_per_request_s`: the speculative
    machinery's per-step and per-request bookkeeping (0 for a plain step); `draft_fixed_s`: draft-pass launches;
    `per_request_s`: every other per-running-request host term (plain, n-gram lookup); `per_token_s`: the verified
    tokens' own cost (per_token_step_s x B q); `memory_s`/`compute_s`: the linear layers' weight streaming and
    math, of which `gemm_row_s` x G(`gemm_tokens`) is repriced under the fill scale and elasticity (G with
    `gemm_pad` and `gemm_fill`: `gemm_rows`); `kv_memory_s`/`attention_s`: the attention kernels' KV streaming
    and math; `prefill_s`: the prompt tokens' math, added outside the smooth maxes (module docstring), of which
    `prefill_gemm_s` is linear layers, priced at the elasticity of the step's whole rows G(`gemm_tokens` +
    `prefill_tokens`);
    `draft_memory_s`/`draft_compute_s`/`draft_allreduce_s`: ONE draft pass (its roofline sides and its TP comms),
    run `draft_passes` times; `allreduce_s`: the target's TP comms.
    """

    fixed_s: float
    per_request_s: float
    memory_s: float
    compute_s: float
    allreduce_s: float = 0.0
    prefill_s: float = 0.0
    prefill_gemm_s: float = 0.0
    draft_fixed_s: float = 0.0
    draft_memory_s: float = 0.0
    draft_compute_s: float = 0.0
    draft_allreduce_s: float = 0.0
    draft_passes: int = 0
    gemm_row_s: float = 0.0
    gemm_tokens: float = 0.0
    gemm_pad: float = 0.0
    gemm_fill: float = 0.0
    kv_memory_s: float = 0.0
    attention_s: float = 0.0
    per_token_s: float = 0.0
    prefill_tokens: float = 0.0
    spec_fixed_s: float = 0.0
    spec_per_request_s: float = 0.0

    def prefill_at(self, scales: CostScales | None = None) -> float:
        """The prompt tokens' math (s, before the compute scale) under the elasticity of the step's whole rows:
        prefill_s - prefill_gemm_s + prefill_gemm_s x (N_ref / G(gemm_tokens + prefill_tokens))^gemm_slope."""
        s = scales or CostScales()
        if s.gemm_slope == 0.0 or self.prefill_gemm_s <= 0.0:
            return self.prefill_s
        rows = gemm_rows(self.gemm_tokens + self.prefill_tokens, pad=self.gemm_pad, fill=self.gemm_fill * s.fill)
        return self.prefill_s + self.prefill_gemm_s * (gemm_efficiency_factor(rows, s.gemm_slope) - 1.0)

    def gemm_s(self, scales: CostScales | None = None) -> float:
        """The linear layers' math time (s, before the compute scale) under `scales`' fill and elasticity:
        gemm_row_s x G x (N_ref / G)^gemm_slope, G = gemm_rows(gemm_tokens, pad, gemm_fill x fill).

        Example: 25.3 us per row, 256 tokens, pad 32, fill 64 -> G = 288.2 -> 7.29 ms at unit scales.
        """
        s = scales or CostScales()
        rows = gemm_rows(self.gemm_tokens, pad=self.gemm_pad, fill=self.gemm_fill * s.fill)
        return self.gemm_row_s * rows * gemm_efficiency_factor(rows, s.gemm_slope)

    def total_s(self, scales: CostScales | None = None) -> float:
        """overhead x (fixed + per_request x per-request + per_token x per-token + draft x draft_fixed
        + spec x (spec_fixed + per_request x spec_per_request))
        + roofline x (smooth_max(memory x (M + K), compute x (C + A)) + compute x prefill
        + allreduce + draft x passes x (smooth_max(memory x M_d, compute x C_d) + allreduce_d)),
        C = compute_s - gemm_s(unit scales) + gemm_s(scales).

        Example: fixed 1.5 ms, per-request 0.02 ms, per-token 0.02 ms, M 5.3 ms, C 0.025 ms, no KV, no draft, unit
        scales -> 6.84 ms; memory 2.0 -> 1.54 + 10.6 = 12.14 ms.
        """
        s = scales or CostScales()
        spec = s.spec * (self.spec_fixed_s + s.per_request * self.spec_per_request_s)
        overhead = s.overhead * (
            self.fixed_s + s.per_request * self.per_request_s + s.per_token * self.per_token_s + spec
        )
        compute_s = self.compute_s
        if (s.fill != 1.0 or s.gemm_slope != 0.0) and self.gemm_row_s > 0.0:
            compute_s += self.gemm_s(s) - self.gemm_s()
        forward = smooth_max(s.memory * (self.memory_s + self.kv_memory_s), s.compute * (compute_s + self.attention_s))
        target = forward + s.compute * self.prefill_at(s) + self.allreduce_s
        draft = self.draft_passes * (
            smooth_max(s.memory * self.draft_memory_s, s.compute * self.draft_compute_s) + self.draft_allreduce_s
        )
        return overhead + s.draft * s.overhead * self.draft_fixed_s + s.roofline * (target + s.draft * draft)


def kv_bytes_per_token_per_gpu(attention: AttentionShape, kv_dtype_bytes: float, tp: float) -> float:
    """KV-cache bytes per token of context on one GPU (`AttentionShape.kv_elements_per_token` x bytes): GQA heads
    are sharded by tensor parallelism (and replicated once tp exceeds them); an MLA latent is whole on every GPU.

    Example: Llama-3.1-8B bf16 (32 layers, 8 KV heads, head_dim 128): tp 1 -> 131072; tp 8 -> 16384; tp 16 ->
    16384. DeepSeek-V3 (latent 512 + rope 64, bf16): 70272 at any tp.
    """
    return attention.kv_elements_per_token(tp=tp) * kv_dtype_bytes


@dataclass(frozen=True, slots=True)
class _TargetParts:
    """One target forward's unscaled parts (see `_target_parts`)."""

    weight_bytes: float
    kv_bytes: float
    flops: float
    memory_s: float  # weight streaming
    kv_memory_s: float
    attention_s: float
    gemm_row_s: float  # seconds of linear-layer math per GEMM row (token)
    gemm_tokens: float
    gemm_pad: float
    gemm_fill: float
    allreduce_s: float
    prefill_s: float
    prefill_gemm_s: float
    prefill_tokens: float
    per_token_s: float

    @property
    def gemm_s(self) -> float:
        """Linear-layer math at unit scales (s)."""
        return self.gemm_row_s * gemm_rows(self.gemm_tokens, pad=self.gemm_pad, fill=self.gemm_fill)


def _weight_bytes_per_gpu(model: ModelProfile, tokens: float, tp: float) -> float:
    """Bytes of weights one forward over `tokens` tokens streams per GPU (module docstring)."""
    dense_params = model.params - model.input_embedding_params - model.routed_expert_params
    dense = dense_params * model.dtype_bytes
    if not model.is_moe:
        return dense / tp
    touched = expected_experts_touched(model.num_experts, model.experts_per_token, tokens)
    return (dense + model.moe_layers * touched * model.expert_params * model.expert_bytes_per_param) / tp


def _mean_weight_bytes(model: ModelProfile, decode_tokens: float, shape: Shape, tp: float) -> float:
    """Weight bytes per GPU of the mean step over a window whose steps carry P prompt tokens on average in chunks
    of c = max(P, chunk) tokens: (1 - P / c) W(n) + (P / c) W(n + c), n = B q decode tokens (module docstring).
    Example: 4.6 sequences x 4 tokens, P 43.5, chunk 372 on Qwen3-30B-A3B (128 experts, top-8): 11.7% of the
    steps carry a chunk and touch all 128 experts, the rest 89: 93.5 experts on average, not the 125.6 that
    61.9 tokens in every step would touch."""
    prefill = shape.prefill_tokens
    chunk = max(prefill, shape.prefill_chunk_tokens or 0.0)
    if not model.is_moe or prefill <= 0.0 or chunk <= prefill:
        return _weight_bytes_per_gpu(model, decode_tokens + prefill, tp)
    share = prefill / chunk
    return ((1.0 - share) * _weight_bytes_per_gpu(model, decode_tokens, tp)
            + share * _weight_bytes_per_gpu(model, decode_tokens + chunk, tp))


def _target_parts(
    hardware: HardwareProfile, model: ModelProfile, shape: Shape, *, prefill_context_tokens: float, tensor_parallel: int
) -> _TargetParts:
    """The unscaled parts of one target forward: the linear layers' bytes and rows, the attention's KV bytes and
    math (decode tokens), prefill_s the prompt tokens' math; flops are the real ones."""
    tp = float(tensor_parallel)
    batch, tokens_per_seq, context_tokens = shape.batch, shape.tokens_per_seq, shape.context_tokens
    prefill_tokens = shape.prefill_tokens
    decode_tokens = batch * tokens_per_seq
    tokens = decode_tokens + prefill_tokens
    weight_bytes = _mean_weight_bytes(model, decode_tokens, shape, tp)
    attention = model.attention
    per_token = kv_bytes_per_token_per_gpu(attention, model.kv_dtype_bytes, tp)
    attended = model.attended_context(context_tokens)
    prefix_read = model.attended_context(prefill_context_tokens) if prefill_tokens > 0 else 0.0
    kv_bytes = per_token * (batch * attended + prefix_read)
    matmul_params = model.active_params - model.input_embedding_params
    attention_flops = attention.decode_flops_per_pair * attended * decode_tokens / tp
    prefill_flops = (
        (2.0 * matmul_params + attention.prefill_flops_per_pair * prefill_context_tokens) * prefill_tokens / tp
    )
    flops = 2.0 * matmul_params * decode_tokens / tp + attention_flops + prefill_flops
    bandwidth = hardware.mem_bandwidth_bytes_per_s * hardware.bandwidth_efficiency
    flops_per_s = hardware.flops_for_dtype(model.dtype_bytes) * hardware.flops_efficiency
    tile = gemm_tile_tokens(hardware)
    allreduce_s = allreduce_time_s(hardware, layers=model.layers, tokens=tokens, hidden=model.hidden, tp=tp)
    return _TargetParts(
        weight_bytes=weight_bytes, kv_bytes=kv_bytes, flops=flops, memory_s=weight_bytes / bandwidth,
        kv_memory_s=kv_bytes / bandwidth, attention_s=attention_flops / flops_per_s,
        gemm_row_s=2.0 * matmul_params / tp / flops_per_s, gemm_tokens=decode_tokens,
        gemm_pad=0.5 * tile if tile > 1.0 else 0.0, gemm_fill=hardware.gemm_fill_tokens, allreduce_s=allreduce_s,
        prefill_s=prefill_flops / flops_per_s, prefill_gemm_s=2.0 * matmul_params * prefill_tokens / tp / flops_per_s,
        prefill_tokens=prefill_tokens, per_token_s=hardware.per_token_step_s * batch * (tokens_per_seq - 1.0),
    )


def _prefill_s(parts: _TargetParts, scales: CostScales) -> float:
    """The prompt tokens' math (s) under the elasticity of the step's whole rows, before the compute scale."""
    if scales.gemm_slope == 0.0 or parts.prefill_gemm_s <= 0.0:
        return parts.prefill_s
    rows = gemm_rows(parts.gemm_tokens + parts.prefill_tokens, pad=parts.gemm_pad, fill=parts.gemm_fill * scales.fill)
    return parts.prefill_s + parts.prefill_gemm_s * (gemm_efficiency_factor(rows, scales.gemm_slope) - 1.0)


def _decode_gemm_s(parts: _TargetParts, scales: CostScales) -> float:
    """The linear layers' decode math (s) under the fill scale and elasticity, before the compute scale."""
    if scales.fill == 1.0 and scales.gemm_slope == 0.0:
        return parts.gemm_s
    rows = gemm_rows(parts.gemm_tokens, pad=parts.gemm_pad, fill=parts.gemm_fill * scales.fill)
    return parts.gemm_row_s * rows * gemm_efficiency_factor(rows, scales.gemm_slope)


def target_step_time(
    hardware: HardwareProfile,
    model: ModelProfile,
    shape: Shape,
    *,
    tensor_parallel: int = 1,
    scales: CostScales | None = None,
) -> StepTime:
    """Price one target forward of `shape` (its ranges: `Shape`), sharded over `tensor_parallel` GPUs (>= 1).
    Formulas in the module docstring. Raises ValueError outside those ranges.

    Example: H100 SXM, Llama-3.1-8B, B=1, q=1, ctx=512: weights 7.505e9 x 2 = 15.01 GB + KV 131072 x 512 = 67 MB
    -> 5.29 ms; smooth_max(5.29, 1.65) = 5.31 ms; overhead 0.38 + 32 x 0.035 + 0.02 = 1.52 ms -> total ~ 6.83 ms
    (vLLM measured 7.07 ms, vllm-eagle-k-sweep-bs1.csv). With 512 prefill tokens added: 512 x 15.0 GFLOP at
    (2048 / 578)^0 x 5.936e14 = 13.0 ms of prompt math outside the smooth max -> ~19.9 ms.
    """
    _check(shape, tp=tensor_parallel)
    prefill_ctx = _check_prefill(shape)
    scales = scales or CostScales()
    parts = _target_parts(hardware, model, shape, prefill_context_tokens=prefill_ctx, tensor_parallel=tensor_parallel)
    gemm_s = scales.compute * _decode_gemm_s(parts, scales)
    attention_s = scales.compute * parts.attention_s
    weights_s, kv_s = scales.memory * parts.memory_s, scales.memory * parts.kv_memory_s
    overhead = step_fixed_s(hardware, model) + scales.per_request * hardware.per_request_step_s * shape.batch
    physics = (
        smooth_max(weights_s + kv_s, gemm_s + attention_s) + scales.compute * _prefill_s(parts, scales)
        + parts.allreduce_s
    )
    host = scales.overhead * (overhead + scales.per_token * parts.per_token_s)
    return StepTime(
        weight_bytes=parts.weight_bytes,
        kv_bytes=parts.kv_bytes,
        flops=parts.flops,
        memory_s=weights_s + kv_s,
        compute_s=gemm_s + attention_s,
        overhead_s=max(0.0, host),
        physics_s=scales.roofline * physics,
    )


def _draft_pass(
    hardware: HardwareProfile, drafter: DrafterProfile, *, batch: float, context_tokens: float, tp: int
) -> tuple[float, float, float, float, float]:
    """(bytes moved, flops, memory_s, compute_s, allreduce_s) of ONE draft pass at `batch` tokens, unscaled, per
    GPU of the drafter's own degree tp_d = `drafter.degree(tp)` (`tp` the target's). A head of one or two layers
    is one kernel chain whose weights, KV and math are blended by one smooth max. KV is read over the drafter's
    attended context (its sliding layers' window). At tp_d > 1 each drafter layer all-reduces twice, as the
    target's do: 2 x layers x (latency + 2 (tp_d - 1) / tp_d x batch x hidden x 2 bytes / link); at tp_d = 1 the
    pass runs on one GPU whole (weights / 1), the other GPUs waiting.

    Example: a 1B draft model (16 layers, hidden 2048, 1.0e9 streamed params, bf16) on H100s at batch 8: tp_d 1 ->
    2.0 GB / 2.85 TB/s = 0.70 ms, no all-reduce; tp_d 4 -> 0.18 ms + 32 x (8 us + 1.5 x 32 KB / 450 GB/s) = 0.44 ms
    (KV left out of the example).
    """
    degree = float(drafter.degree(tp))
    weight_bytes = drafter.params * drafter.dtype_bytes / degree
    shape = drafter.attention
    attended = drafter.attended_context(context_tokens)
    kv_bytes = kv_bytes_per_token_per_gpu(shape, drafter.kv_dtype_bytes, degree) * batch * attended
    attention_flops = shape.decode_flops_per_pair * batch * attended
    flops = (2.0 * drafter.params * batch + attention_flops) / degree
    memory_s = (weight_bytes + kv_bytes) / (hardware.mem_bandwidth_bytes_per_s * hardware.bandwidth_efficiency)
    compute_s = flops / (hardware.flops_for_dtype(drafter.dtype_bytes) * hardware.flops_efficiency)
    allreduce_s = allreduce_time_s(hardware, layers=drafter.layers, tokens=batch, hidden=drafter.hidden, tp=degree)
    return weight_bytes + kv_bytes, flops, memory_s, compute_s, allreduce_s


def allreduce_time_s(hardware: HardwareProfile, *, layers: int, tokens: float, hidden: int, tp: float) -> float:
    """Tensor-parallel comms of one forward (s): two ring all-reduces per layer of the `tokens` x `hidden` bf16
    activations, 2 x layers x (latency + 2 (tp - 1) / tp x tokens x hidden x 2 bytes / link); 0 at tp = 1.
    Example: H100 NVLink (450 GB/s, 8 us), 32 layers, 8 tokens x 2048 at tp 4 -> 64 x (8 us + 0.11 us) = 0.52 ms."""
    if tp <= 1.0:
        return 0.0
    ring = 2.0 * (tp - 1.0) / tp * tokens * hidden * ACTIVATION_BYTES / hardware.interconnect_bytes_per_s
    return 2.0 * layers * (hardware.allreduce_latency_s + ring)


def drafting_time(
    hardware: HardwareProfile,
    drafter: DrafterProfile,
    shape: Shape,
    *,
    gamma: int,
    tensor_parallel: int = 1,
    scales: CostScales | None = None,
) -> StepTime:
    """Everything one speculative step costs besides verifying gamma+1 tokens: proposing `gamma` drafts for
    `shape.batch` sequences at `shape.context_tokens` plus the speculative bookkeeping overhead. gamma 0 costs
    nothing (speculation off). `gamma` >= 0, `batch` >= 1, `context_tokens` >= 0, `tensor_parallel` >= 1.
    Bytes/FLOPs are for all gamma sequential draft steps together.

    Example: H100, EAGLE-3 head for Llama-3.1-8B (3.995e8 params), gamma 3, B=1, ctx 512: per step
    0.5 ms + 0.80 GB / 2.8475e12 = 0.28 ms -> 2.34 ms for three, + 0.775 + 0.005 ms bookkeeping -> 3.12 ms.
    """
    _check(replace(shape, tokens_per_seq=1.0), tp=tensor_parallel)
    batch = shape.batch
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    scales = scales or CostScales()
    if gamma == 0:
        return StepTime(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    spec = scales.spec * (
        hardware.spec_step_overhead_s + scales.per_request * hardware.spec_per_request_overhead_s * batch
    )
    if drafter.method in HOST_DRAFT_METHODS or drafter.params <= 0:
        overhead = spec + scales.per_request * drafter.host_time_per_request_s * batch
        return StepTime(0.0, 0.0, 0.0, 0.0, 0.0, scales.overhead * overhead, 0.0)
    moved, flops, memory_s, compute_s, allreduce_s = _draft_pass(
        hardware, drafter, batch=batch, context_tokens=shape.context_tokens, tp=tensor_parallel
    )
    memory_s *= scales.memory
    compute_s *= scales.compute
    weight_bytes = drafter.params * drafter.dtype_bytes / float(drafter.degree(tensor_parallel))
    fixed = spec + scales.draft * gamma * hardware.draft_step_fixed_s
    return StepTime(
        weight_bytes=gamma * weight_bytes,
        kv_bytes=gamma * (moved - weight_bytes),
        flops=gamma * flops,
        memory_s=gamma * memory_s,
        compute_s=gamma * compute_s,
        overhead_s=scales.overhead * fixed,
        physics_s=scales.roofline * scales.draft * gamma * (smooth_max(memory_s, compute_s) + allreduce_s),
    )


def step_components(
    hardware: HardwareProfile,
    model: ModelProfile,
    drafter: DrafterProfile,
    shape: Shape,
    *,
    draft_passes: int,
    tensor_parallel: int = 1,
) -> StepComponents:
    """The unscaled parts of a whole step (target verify of `shape` + `draft_passes` drafting
    passes, 0 = speculation off) so a fitter can reprice it under many `CostScales` without redoing the physics.
    Ranges as `target_step_time` / `drafting_time`. Invariant: `total_s(scales)` equals
    `target_step_time(..., scales).total_s + drafting_time(..., scales).total_s`.

    Example: H100, Llama-3.1-8B, EAGLE-3, B=1, q=4, 3 passes, ctx 512: fixed 1.5 ms, speculative bookkeeping
    0.775 + 0.005 ms (`spec_fixed_s`, `spec_per_request_s`), draft launches 3 x 0.5 ms, per-request 0.02 ms,
    per-token 3 x 0.04 ms, linear 5.27 ms, three draft passes of 0.28 ms -> 10.07 ms at unit scales.
    """
    _check(shape, tp=tensor_parallel)
    if draft_passes < 0:
        raise ValueError(f"draft_passes must be >= 0, got {draft_passes}")
    prefill_ctx = _check_prefill(shape)
    batch = shape.batch
    parts = _target_parts(hardware, model, shape, prefill_context_tokens=prefill_ctx, tensor_parallel=tensor_parallel)
    fixed = step_fixed_s(hardware, model)
    per_request = hardware.per_request_step_s * batch
    draft_memory = draft_compute = draft_fixed = draft_allreduce = spec_fixed = spec_per_request = 0.0
    passes = 0
    if draft_passes > 0:
        spec_fixed = hardware.spec_step_overhead_s
        spec_per_request = hardware.spec_per_request_overhead_s * batch
        if drafter.method in HOST_DRAFT_METHODS or drafter.params <= 0:
            per_request += drafter.host_time_per_request_s * batch
        else:
            _, _, draft_memory, draft_compute, draft_allreduce = _draft_pass(
                hardware, drafter, batch=batch, context_tokens=shape.context_tokens, tp=tensor_parallel
            )
            draft_fixed = draft_passes * hardware.draft_step_fixed_s
            passes = draft_passes
    return StepComponents(
        fixed_s=fixed,
        per_request_s=per_request,
        memory_s=parts.memory_s,
        compute_s=parts.gemm_s,
        allreduce_s=parts.allreduce_s,
        prefill_s=parts.prefill_s,
        prefill_gemm_s=parts.prefill_gemm_s,
        prefill_tokens=parts.prefill_tokens,
        draft_fixed_s=draft_fixed,
        draft_memory_s=draft_memory,
        draft_compute_s=draft_compute,
        draft_allreduce_s=draft_allreduce,
        draft_passes=passes,
        gemm_row_s=parts.gemm_row_s,
        gemm_tokens=parts.gemm_tokens,
        gemm_pad=parts.gemm_pad,
        gemm_fill=parts.gemm_fill,
        kv_memory_s=parts.kv_memory_s,
        attention_s=parts.attention_s,
        per_token_s=parts.per_token_s,
        spec_fixed_s=spec_fixed,
        spec_per_request_s=spec_per_request,
    )


def dynamic_sd_k0_overhead_s(batch: float) -> float:
    """Extra time per step of vLLM Dynamic SD when its schedule picks K=0, vs speculation truly off (seconds).

    a + b x B with a = 0.775 ms, b = 84 us, solved from tests/fixtures/published/dynamic-sd-k0-overhead.csv (vLLM
    0.27.1, H100 NVL, gemma-4-31B FP8 + drafter): a + 2 b = 0.943 ms, a + 189 b = 16.656 ms. It prices the
    K=0 band of an engine-native schedule (a band that keeps speculation configured but drafts nothing), not a
    speculative step: see policies/model/profiles.py. Valid for B >= 1 (measured at 2 and 189; linear in between,
    extrapolated beyond). Example: B=64 -> 0.775 + 64 x 0.084 = 6.15 ms.
    """
    if not (math.isfinite(batch) and batch >= 1.0):
        raise ValueError(f"batch must be a finite number >= 1, got {batch}")
    return DYNAMIC_SD_K0_STEP_S + DYNAMIC_SD_K0_PER_REQUEST_S * batch


def crossover_batch(
    hardware: HardwareProfile,
    model: ModelProfile,
    *,
    context_tokens: float,
    tokens_per_seq: float = 1.0,
    tensor_parallel: int = 1,
    max_batch: float = 65536.0,
) -> float | None:
    """The smallest batch (>= 1, continuous) at which the target step is compute-bound (compute_s >= memory_s),
    or None when it stays memory-bound up to `max_batch` (long contexts: each sequence adds KV bytes faster than
    FLOPs). Found by doubling then bisection to 1e-6 relative.

    Example: H100, Llama-3.1-8B, q=1: memory_s = 5.27 ms + B x 46 ns x ctx, compute_s = 0.81 ms (32 rows of
    tile padding) + B x (25.3 us + 0.88 ns x ctx); ctx 128 -> B ~ 228; ctx 512 -> B ~ 2060; ctx >= ~560 -> None
    (the KV slope exceeds the FLOP slope).
    """

    def compute_bound(batch: float) -> bool:
        shape = Shape(batch=batch, context_tokens=context_tokens, tokens_per_seq=tokens_per_seq)
        step = target_step_time(hardware, model, shape, tensor_parallel=tensor_parallel)
        return not step.memory_bound or step.compute_s == step.memory_s

    if compute_bound(1.0):
        return 1.0
    low, high = 1.0, 2.0
    while not compute_bound(high):
        if high >= max_batch:
            return None
        low, high = high, min(high * 2.0, max_batch)
    while high - low > 1e-6 * high:
        middle = 0.5 * (low + high)
        if compute_bound(middle):
            high = middle
        else:
            low = middle
    return high


def _check(shape: Shape, *, tp: int) -> None:
    batch, tokens_per_seq, context_tokens = shape.batch, shape.tokens_per_seq, shape.context_tokens
    if not (math.isfinite(batch) and batch >= 1.0):
        raise ValueError(f"batch must be a finite number >= 1, got {batch}")
    if not (math.isfinite(tokens_per_seq) and tokens_per_seq >= 1.0):
        raise ValueError(f"tokens_per_seq must be >= 1, got {tokens_per_seq}")
    if not (math.isfinite(context_tokens) and context_tokens >= 0.0):
        raise ValueError(f"context_tokens must be >= 0, got {context_tokens}")
    if tp < 1:
        raise ValueError(f"tensor_parallel must be >= 1, got {tp}")


def _check_prefill(shape: Shape) -> float:
    """The prompt tokens' mean attended context (see `Shape`), after checking the prefill fields."""
    prefill_tokens, prefill_context_tokens = shape.prefill_tokens, shape.prefill_context_tokens
    if not (math.isfinite(prefill_tokens) and prefill_tokens >= 0.0):
        raise ValueError(f"prefill_tokens must be a finite number >= 0, got {prefill_tokens}")
    chunk = shape.prefill_chunk_tokens
    if chunk is not None and not (math.isfinite(chunk) and chunk > 0.0):
        raise ValueError(f"prefill_chunk_tokens must be None or a finite number > 0, got {chunk}")
    if prefill_context_tokens is None:
        return 0.5 * shape.context_tokens
    if not (math.isfinite(prefill_context_tokens) and prefill_context_tokens >= 0.0):
        raise ValueError(f"prefill_context_tokens must be >= 0, got {prefill_context_tokens}")
    return prefill_context_tokens
