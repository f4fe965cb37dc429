"""Step time of a decode/verify step from a roofline: bytes streamed vs FLOPs, plus fixed host overheads.

For B sequences each verifying q tokens at mean context ctx, with P prompt (prefill) tokens sharing the step
(chunked prefill) at mean attention span ctx_p, on tensor-parallel degree tp (per GPU):

    N            = B q + P                                   tokens the forward pass computes
    weight_bytes = (P_stream - P_experts + L_moe x E_touched(N) x P_expert) x dtype_bytes / tp
                   P_stream = params minus an untied input-embedding table (a step reads N rows, not the table)
                   E_touched(n) = E (1 - (1 - k/E)^n): expected distinct experts per layer hit by n tokens routed
                   uniformly at random (real routers are skewed, so this is an upper bound on expert bytes)
    kv_bytes     = 2 x layers x max(kv_heads / tp, 1) x head_dim x kv_dtype_bytes x (B x ctx + P_req x ctx_p)
                   (each prefilling request reads its cached prefix once per chunk; P_req = 1 when P > 0)
    flops        = 2 x P_active_matmul x N / tp  +  4 x layers x heads x head_dim x (B q ctx + P ctx_p) / tp
    memory_s     = memory_scale x (weight_bytes + kv_bytes) / (BW_peak x bandwidth_efficiency)
    F            = F_peak(dtype) x flops_efficiency            (the rate of a large, prefill-sized GEMM)
    compute_s    = compute_scale x (2 P_active_matmul x G(B q) x (N_ref / clamp(G(B q), 1, N_ref))^beta
                                    + 4 layers heads head_dim ctx B q) / tp / F
                   G(n) = smooth_max(n + t/2, N_fill x fill_scale): the GEMM rows a step of n tokens computes.
                          Rows run in whole tiles of t = min(64, N_fill) tokens (Hopper's wgmma instruction is
                          m64nNk16, PTX ISA), and a window's batch fluctuates by more than a tile, so on average
                          half a tile is padding. N_fill = hardware.gemm_fill_tokens (64 on GPUs: one tile, 1 on
                          CPU; policies/profiles.py says why not a wave): a step's linear layers cost at least
                          about N_fill tokens' worth of math. (t = 1 pads nothing.)
                   beta (gemm_slope, 0 uncalibrated): GEMM efficiency elasticity. Small-M GEMMs reach less of
                          the large-GEMM rate (fewer tiles than SMs leave a wave part empty; less operand reuse):
                          the rate at n rows is F x (n / N_ref)^beta below N_ref = 2048 rows (a prefill chunk:
                          vLLM's token budget is 2048-8192) and F above it. fill_scale and beta are fitted
                          online (policies/calibrate.py): the profile cannot know a kernel's tiles.
    prefill_s    = compute_scale x (2 P_active_matmul + 4 layers heads head_dim ctx_p) x P / tp / F
                   (prompt chunks are GEMMs of hundreds to thousands of rows: priced at F, no elasticity)
    roofline_s   = smooth_max(memory_s, compute_s) + prefill_s,   smooth_max(a, b) = (a^4 + b^4)^(1/4)
    allreduce_s  = tp > 1: 2 x layers x (latency + 2 (tp - 1)/tp x N hidden x 2 bytes / link_bytes_per_s)
    overhead_s   = overhead_scale x (step_fixed_s + per_request_scale x per_request_step_s x B)
    T_target     = overhead_s + roofline_scale x (roofline_s + allreduce_s)

Ranges: B >= 1 (continuous: a window mean), q >= 1, ctx >= 0, P >= 0 tokens, tp >= 1. Worked example (H100 SXM,
Llama-3.1-8B bf16, B=1, q=1, ctx=512, P=0): 15.08 GB / 2.85 TB/s = 5.30 ms memory; G(1) = smooth_max(33, 64)
= 65.1 rows x 15.0 GFLOP / 5.936e14 FLOP/s = 1.65 ms compute; smooth_max -> 5.31 ms; + 1.52 ms overhead
-> 6.83 ms (vLLM measured 7.07 ms plain TPOT, vllm-eagle-k-sweep-bs1.csv).

Why an elasticity, a fitted fill and half-tile padding: on the simulator (service/sim, whose tensor cores run
whole 64-token tiles and reach a step-size-dependent fraction of peak) one fixed rate with a fixed 128-token
floor missed pure-decode step times by up to 18-27% after calibration, either over-pricing small decode steps
or under-pricing large ones, whichever way the fit leaned; with the three terms, within 8.4% over a steady
load sweep (tests/integration/test_model_sim_calibration.py: the fit finds fill 1.0 x 64 = 64 rows, the
world's 64-token tile, and beta 0.37-0.40; from the earlier 128-row prior it found the same 63 rows). Why the
elasticity is on the linear layers only: attention is its own kernel (FlashAttention) whose work grows with
B x ctx and keeps the GPU busy even at batch 1 with a long context.

Why prefill is added outside the smooth max: prompts arrive in chunks of hundreds to thousands of tokens (up to
the token budget, e.g. 8192), which are compute-bound, so each prompt token costs its full math whichever step
carries it; P is a window mean over bursty steps (most carry 0, a few carry a big chunk), and only a term linear
in P averages correctly (E[T(P)] = T(E[P]) needs T linear in P). Blending the mean P under the memory time would
hide prefill that the bursty steps really pay.

Why prefill is in T (chunked prefill, vLLM V1's default): a step that also computes P prompt tokens spends
2 P_active P FLOPs on them; at B=256 with a 2048-token chunk on an 8B model that is 31 TFLOP, ~52 ms at 0.6 of
an H100's peak, far more than the decode work. The server's measured step time includes it, so calibration must
price it: leaving it out made a one-point calibration at batch 256 with a queue read the prefill time as host
overhead (x2.4) and predict S(1) = 0.57 where the simulator's truth was ~1.04. (In S itself a rate-bound prompt
load cancels: see policies/costmodel.py.)

Why a 4-norm smooth max: memory traffic and math overlap imperfectly near the ridge point; the 4-norm is at most
2^(1/4) = 1.19x the larger term (at the crossover) and within 1.6% of it once one term is twice the other.
The `CostScales` are what online calibration fits (policies/calibrate.py); the multipliers default to 1 and
the elasticity to 0 (the physics as the profile states it). Activations
(a few MB per step) are left out of the bytes: below 1% of the weight bytes at decode batch sizes.

Drafting (what a speculative step adds besides verifying more tokens), for gamma >= 1 drafts:
    ngram / suffix : host_time_per_request x B                                  (one host lookup per step)
    eagle/eagle3/mtp/draft_model: gamma x (draft_step_fixed_s + roofline of the drafter at B tokens:
                     drafter weights + its own KV cache (layers x kv_heads x head_dim) at ctx)
    plus           : spec_step_overhead_s + spec_per_request_overhead_s x B   (rejection sampling, bookkeeping)
The per-request speculative term is host/sampler bookkeeping only (see policies/profiles.py for why it is not
the 84 us/request of vLLM Dynamic SD at K=0); `dynamic_sd_k0_overhead_s` prices that code path separately.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.profiles import DrafterProfile, HardwareProfile, ModelProfile
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
    policies/costmodel.py fits these two); `memory` scales memory time (1 / effective-bandwidth error), `compute`
    compute time (1 / effective-FLOP/s error), `per_request` the per-running-request host terms on top of
    `overhead`, `draft` every drafting pass (its launch and its roofline: drafter profiles are the least certain
    numbers; EAGLE heads differ in layers and in whether they own an lm_head). `fill` scales the GEMM tile
    floor N_fill and `gemm_slope` is the GEMM efficiency elasticity beta (not a multiplier: 0 uncalibrated,
    valid in [0, 1]); module docstring. The online fitter in policies/calibrate.py fits all but `roofline`.
    Example: memory 2.0 means the server streams bytes at half the bandwidth the profile assumed; fill 0.5
    halves the H100's 64-row floor to 32 rows; gemm_slope 0.4 prices a 256-token decode step's linear layers
    (288.2 rows) at (2048 / 288.2)^0.4 = 2.19x the math time of the same rows at the large-GEMM rate.
    """

    overhead: float = 1.0
    roofline: float = 1.0
    memory: float = 1.0
    compute: float = 1.0
    per_request: float = 1.0
    draft: float = 1.0
    fill: float = 1.0
    gemm_slope: float = 0.0
    # Seconds added to every target forward (may be negative; not fitted): policies/split.py moves time between
    # drafting and the target with it, so that an alternative split still explains the observed step.
    target_offset_s: float = 0.0


@dataclass(frozen=True, slots=True)
class StepTime:
    """One priced step (seconds, bytes, FLOPs per GPU). `total_s` = `overhead_s` + `physics_s`, both scaled;
    `memory_s` / `compute_s` carry their own calibration scales (memory, compute) but not `roofline`."""

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


@dataclass(frozen=True, slots=True)
class StepComponents:
    """One step's unscaled parts (seconds per GPU), priced by `total_s(scales)`: what calibration refits.

    `fixed_s`: step fixed + speculative per-step; `draft_fixed_s`: draft-pass launches; `per_request_s`: every
    per-running-request host term (plain, speculative bookkeeping, n-gram lookup); `memory_s`/`compute_s`: the
    target forward's decode part at unit scales, of which `gemm_row_s` x G(`gemm_tokens`) is the linear layers
    (G with `gemm_pad` and `gemm_fill`: `gemm_rows`; repriced under the fill scale and elasticity);
    `prefill_s`: the prompt tokens' math, added outside the smooth max (module docstring);
    `draft_memory_s`/`draft_compute_s`: ONE draft pass, run `draft_passes` times; `allreduce_s`: TP comms.
    """

    fixed_s: float
    per_request_s: float
    memory_s: float
    compute_s: float
    allreduce_s: float = 0.0
    prefill_s: float = 0.0
    draft_fixed_s: float = 0.0
    draft_memory_s: float = 0.0
    draft_compute_s: float = 0.0
    draft_passes: int = 0
    gemm_row_s: float = 0.0
    gemm_tokens: float = 0.0
    gemm_pad: float = 0.0
    gemm_fill: float = 0.0

    def gemm_s(self, scales: CostScales | None = None) -> float:
        """The linear layers' math time (s, before the compute scale) under `scales`' fill and elasticity:
        gemm_row_s x G x (N_ref / G)^gemm_slope, G = gemm_rows(gemm_tokens, pad, gemm_fill x fill).

        Example: 25.3 us per row, 256 tokens, pad 32, fill 64 -> G = 288.2 -> 7.29 ms at unit scales.
        """
        s = scales or CostScales()
        rows = gemm_rows(self.gemm_tokens, pad=self.gemm_pad, fill=self.gemm_fill * s.fill)
        return self.gemm_row_s * rows * gemm_efficiency_factor(rows, s.gemm_slope)

    def total_s(self, scales: CostScales | None = None) -> float:
        """overhead x (fixed + per_request x per-request + draft x draft_fixed) + roofline x (smooth_max(memory x
        M, compute x C) + compute x prefill + allreduce + draft x passes x smooth_max(memory x M_d, compute x C_d)),
        C = compute_s - gemm_s(unit scales) + gemm_s(scales).

        Example: fixed 1.5 ms, per-request 0.02 ms, M 5.3 ms, C 0.025 ms, no draft, unit scales -> 6.82 ms;
        memory 2.0 -> 1.52 + 10.6 = 12.12 ms.
        """
        s = scales or CostScales()
        overhead = s.overhead * (self.fixed_s + s.per_request * self.per_request_s)
        compute_s = self.compute_s
        if (s.fill != 1.0 or s.gemm_slope != 0.0) and self.gemm_row_s > 0.0:
            compute_s += self.gemm_s(s) - self.gemm_s()
        compute = s.compute * compute_s
        target = smooth_max(s.memory * self.memory_s, compute) + s.compute * self.prefill_s + self.allreduce_s
        draft = self.draft_passes * smooth_max(s.memory * self.draft_memory_s, s.compute * self.draft_compute_s)
        return overhead + s.draft * s.overhead * self.draft_fixed_s + s.roofline * (target + s.draft * draft)


def kv_bytes_per_token_per_gpu(layers: int, kv_heads: int, head_dim: int, kv_dtype_bytes: float, tp: float) -> float:
    """KV-cache bytes per token of context on one GPU: 2 x layers x max(kv_heads / tp, 1) x head_dim x bytes (KV
    heads are sharded by tensor parallelism, and replicated once tp exceeds them).

    Example: Llama-3.1-8B bf16 (32 layers, 8 KV heads, head_dim 128): tp 1 -> 131072; tp 8 -> 16384; tp 16 -> 16384.
    """
    return 2.0 * layers * max(kv_heads / tp, 1.0) * head_dim * kv_dtype_bytes


@dataclass(frozen=True, slots=True)
class _TargetParts:
    """One target forward's unscaled parts (see `_target_parts`)."""

    weight_bytes: float
    kv_bytes: float
    flops: float
    memory_s: float
    compute_s: float  # decode math at unit scales: linear layers (gemm_row_s x G) + attention
    attention_s: float
    gemm_row_s: float  # seconds of linear-layer math per GEMM row (token)
    gemm_tokens: float
    gemm_pad: float
    gemm_fill: float
    allreduce_s: float
    prefill_s: float


def _target_parts(
    hardware: HardwareProfile,
    model: ModelProfile,
    *,
    batch: float,
    tokens_per_seq: float,
    context_tokens: float,
    prefill_tokens: float,
    prefill_context_tokens: float,
    tensor_parallel: int,
) -> _TargetParts:
    """The unscaled parts of one target forward: compute_s is the decode tokens' math (GEMM rows G(B q) plus
    attention), prefill_s the prompt tokens' math; flops are the real ones."""
    tp = float(tensor_parallel)
    decode_tokens = batch * tokens_per_seq
    tokens = decode_tokens + prefill_tokens
    touched = expected_experts_touched(model.num_experts, model.experts_per_token, tokens)
    dense_params = model.params - model.input_embedding_params - model.routed_expert_params
    expert_params = model.moe_layers * touched * model.expert_params if model.is_moe else 0.0
    weight_bytes = (dense_params + expert_params) * model.dtype_bytes / tp
    per_token = kv_bytes_per_token_per_gpu(model.layers, model.num_kv_heads, model.head_dim, model.kv_dtype_bytes, tp)
    prefix_read = prefill_context_tokens if prefill_tokens > 0 else 0.0
    kv_bytes = per_token * (batch * context_tokens + prefix_read)
    matmul_params = model.active_params - model.input_embedding_params
    attention_per_pair = 4.0 * model.layers * model.num_heads * model.head_dim
    attention_flops = attention_per_pair * context_tokens * decode_tokens / tp
    prefill_flops = (2.0 * matmul_params + attention_per_pair * prefill_context_tokens) * prefill_tokens / tp
    flops = 2.0 * matmul_params * decode_tokens / tp + attention_flops + prefill_flops
    memory_s = (weight_bytes + kv_bytes) / (hardware.mem_bandwidth_bytes_per_s * hardware.bandwidth_efficiency)
    flops_per_s = hardware.flops_for_dtype(model.dtype_bytes) * hardware.flops_efficiency
    tile = gemm_tile_tokens(hardware)
    pad = 0.5 * tile if tile > 1.0 else 0.0
    row_s = 2.0 * matmul_params / tp / flops_per_s
    attention_s = attention_flops / flops_per_s
    compute_s = row_s * gemm_rows(decode_tokens, pad=pad, fill=hardware.gemm_fill_tokens) + attention_s
    allreduce_s = 0.0
    if tensor_parallel > 1:
        message = tokens * model.hidden * ACTIVATION_BYTES
        ring = 2.0 * (tp - 1.0) / tp * message / hardware.interconnect_bytes_per_s
        allreduce_s = 2.0 * model.layers * (hardware.allreduce_latency_s + ring)
    return _TargetParts(
        weight_bytes=weight_bytes, kv_bytes=kv_bytes, flops=flops, memory_s=memory_s, compute_s=compute_s,
        attention_s=attention_s, gemm_row_s=row_s, gemm_tokens=decode_tokens, gemm_pad=pad,
        gemm_fill=hardware.gemm_fill_tokens, allreduce_s=allreduce_s, prefill_s=prefill_flops / flops_per_s,
    )


def _decode_compute_s(parts: _TargetParts, scales: CostScales) -> float:
    """The decode math (s) under the fill scale and elasticity, before the compute scale."""
    if scales.fill == 1.0 and scales.gemm_slope == 0.0:
        return parts.compute_s
    rows = gemm_rows(parts.gemm_tokens, pad=parts.gemm_pad, fill=parts.gemm_fill * scales.fill)
    return parts.gemm_row_s * rows * gemm_efficiency_factor(rows, scales.gemm_slope) + parts.attention_s


def target_step_time(
    hardware: HardwareProfile,
    model: ModelProfile,
    *,
    batch: float,
    tokens_per_seq: float,
    context_tokens: float,
    tensor_parallel: int = 1,
    scales: CostScales | None = None,
    prefill_tokens: float = 0.0,
    prefill_context_tokens: float | None = None,
) -> StepTime:
    """Price one target forward: `batch` sequences (>= 1) each verifying `tokens_per_seq` tokens (>= 1; gamma+1
    with gamma drafts) at `context_tokens` (>= 0) mean context, plus `prefill_tokens` (>= 0) prompt tokens of
    chunked prefill attending to `prefill_context_tokens` on average (default ctx / 2: a chunk of a prompt
    attends to about half the prompt), sharded over `tensor_parallel` GPUs (>= 1).
    Formulas in the module docstring. Raises ValueError outside those ranges.

    Example: H100 SXM, Llama-3.1-8B, B=1, q=1, ctx=512: weights 7.505e9 x 2 = 15.01 GB, KV 131072 x 512 = 67 MB,
    memory_s = 15.08e9 / 2.8475e12 = 5.30 ms; compute_s = 2 x 7.505e9 / 5.936e14 = 0.025 ms; overhead
    1.5 + 0.02 ms -> total ~ 6.82 ms (vLLM measured 7.07 ms, vllm-eagle-k-sweep-bs1.csv). With 512 prefill
    tokens added: compute 513 x 15.0 GFLOP / 5.936e14 = 13.0 ms -> the step is compute-bound, ~14.6 ms.
    """
    _check(batch=batch, tokens_per_seq=tokens_per_seq, context_tokens=context_tokens, tp=tensor_parallel)
    prefill_ctx = _check_prefill(prefill_tokens, prefill_context_tokens, context_tokens)
    scales = scales or CostScales()
    parts = _target_parts(
        hardware, model, batch=batch, tokens_per_seq=tokens_per_seq, context_tokens=context_tokens,
        prefill_tokens=prefill_tokens, prefill_context_tokens=prefill_ctx, tensor_parallel=tensor_parallel,
    )
    memory_s = scales.memory * parts.memory_s
    compute_s = scales.compute * _decode_compute_s(parts, scales)
    overhead = hardware.step_fixed_s + scales.per_request * hardware.per_request_step_s * batch
    physics = smooth_max(memory_s, compute_s) + scales.compute * parts.prefill_s + parts.allreduce_s
    return StepTime(
        weight_bytes=parts.weight_bytes,
        kv_bytes=parts.kv_bytes,
        flops=parts.flops,
        memory_s=memory_s,
        compute_s=compute_s,
        overhead_s=max(0.0, scales.overhead * overhead + scales.target_offset_s),
        physics_s=scales.roofline * physics,
    )


def _draft_pass(
    hardware: HardwareProfile, drafter: DrafterProfile, *, batch: float, context_tokens: float, tp: float
) -> tuple[float, float, float, float]:
    """(bytes moved, flops, memory_s, compute_s) of ONE draft pass at `batch` tokens, unscaled."""
    weight_bytes = drafter.params * drafter.dtype_bytes / tp
    per_token = kv_bytes_per_token_per_gpu(
        drafter.layers, drafter.num_kv_heads, drafter.head_dim, drafter.kv_dtype_bytes, tp
    )
    kv_bytes = per_token * batch * context_tokens
    attention_flops = 4.0 * drafter.layers * drafter.num_heads * drafter.head_dim * batch * context_tokens
    flops = (2.0 * drafter.params * batch + attention_flops) / tp
    memory_s = (weight_bytes + kv_bytes) / (hardware.mem_bandwidth_bytes_per_s * hardware.bandwidth_efficiency)
    compute_s = flops / (hardware.flops_for_dtype(drafter.dtype_bytes) * hardware.flops_efficiency)
    return weight_bytes + kv_bytes, flops, memory_s, compute_s


def drafting_time(
    hardware: HardwareProfile,
    drafter: DrafterProfile,
    *,
    gamma: int,
    batch: float,
    context_tokens: float,
    tensor_parallel: int = 1,
    scales: CostScales | None = None,
) -> StepTime:
    """Everything one speculative step costs besides verifying gamma+1 tokens: proposing `gamma` drafts for
    `batch` sequences plus the speculative bookkeeping overhead. gamma 0 costs nothing (speculation off).
    `gamma` >= 0, `batch` >= 1, `context_tokens` >= 0, `tensor_parallel` >= 1. Bytes/FLOPs are for all gamma
    sequential draft steps together.

    Example: H100, EAGLE-3 head for Llama-3.1-8B (3.995e8 params), gamma 3, B=1, ctx 512: per step
    0.5 ms + 0.80 GB / 2.8475e12 = 0.28 ms -> 2.34 ms for three, + 0.775 + 0.010 ms overhead -> ~3.1 ms.
    """
    _check(batch=batch, tokens_per_seq=1.0, context_tokens=context_tokens, tp=tensor_parallel)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    scales = scales or CostScales()
    if gamma == 0:
        return StepTime(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    per_request = hardware.spec_per_request_overhead_s * batch
    if drafter.method in HOST_DRAFT_METHODS or drafter.params <= 0:
        per_request += drafter.host_time_per_request_s * batch
        overhead = hardware.spec_step_overhead_s + scales.per_request * per_request
        return StepTime(0.0, 0.0, 0.0, 0.0, 0.0, scales.overhead * overhead, 0.0)
    moved, flops, memory_s, compute_s = _draft_pass(
        hardware, drafter, batch=batch, context_tokens=context_tokens, tp=float(tensor_parallel)
    )
    memory_s *= scales.memory
    compute_s *= scales.compute
    weight_bytes = drafter.params * drafter.dtype_bytes / float(tensor_parallel)
    fixed = hardware.spec_step_overhead_s + scales.draft * gamma * hardware.draft_step_fixed_s
    return StepTime(
        weight_bytes=gamma * weight_bytes,
        kv_bytes=gamma * (moved - weight_bytes),
        flops=gamma * flops,
        memory_s=gamma * memory_s,
        compute_s=gamma * compute_s,
        overhead_s=scales.overhead * (fixed + scales.per_request * per_request),
        physics_s=scales.roofline * scales.draft * gamma * smooth_max(memory_s, compute_s),
    )


def step_components(
    hardware: HardwareProfile,
    model: ModelProfile,
    drafter: DrafterProfile,
    *,
    batch: float,
    tokens_per_seq: float,
    draft_passes: int,
    context_tokens: float,
    prefill_tokens: float = 0.0,
    tensor_parallel: int = 1,
) -> StepComponents:
    """The unscaled parts of a whole step (target verify of `tokens_per_seq` tokens + `draft_passes` drafting
    passes, 0 = speculation off) so a fitter can reprice it under many `CostScales` without redoing the physics.
    Ranges as `target_step_time` / `drafting_time`. Invariant: `total_s(scales)` equals
    `target_step_time(..., scales).total_s + drafting_time(..., scales).total_s`.

    Example: H100, Llama-3.1-8B, EAGLE-3, B=1, q=4, 3 passes, ctx 512: fixed 1.5 + 0.775 + 3 x 0.5 = 3.775 ms,
    per-request 0.02 + 0.010 ms, memory 5.30 ms, one draft pass 0.28 ms -> total ~ 9.95 ms.
    """
    _check(batch=batch, tokens_per_seq=tokens_per_seq, context_tokens=context_tokens, tp=tensor_parallel)
    if draft_passes < 0:
        raise ValueError(f"draft_passes must be >= 0, got {draft_passes}")
    prefill_ctx = _check_prefill(prefill_tokens, None, context_tokens)
    tp = float(tensor_parallel)
    parts = _target_parts(
        hardware, model, batch=batch, tokens_per_seq=tokens_per_seq, context_tokens=context_tokens,
        prefill_tokens=prefill_tokens, prefill_context_tokens=prefill_ctx, tensor_parallel=tensor_parallel,
    )
    fixed = hardware.step_fixed_s
    per_request = hardware.per_request_step_s * batch
    draft_memory = draft_compute = draft_fixed = 0.0
    passes = 0
    if draft_passes > 0:
        fixed += hardware.spec_step_overhead_s
        per_request += hardware.spec_per_request_overhead_s * batch
        if drafter.method in HOST_DRAFT_METHODS or drafter.params <= 0:
            per_request += drafter.host_time_per_request_s * batch
        else:
            draft_fixed = draft_passes * hardware.draft_step_fixed_s
            _, _, draft_memory, draft_compute = _draft_pass(
                hardware, drafter, batch=batch, context_tokens=context_tokens, tp=tp
            )
            passes = draft_passes
    return StepComponents(
        fixed_s=fixed,
        per_request_s=per_request,
        memory_s=parts.memory_s,
        compute_s=parts.compute_s,
        allreduce_s=parts.allreduce_s,
        prefill_s=parts.prefill_s,
        draft_fixed_s=draft_fixed,
        draft_memory_s=draft_memory,
        draft_compute_s=draft_compute,
        draft_passes=passes,
        gemm_row_s=parts.gemm_row_s,
        gemm_tokens=parts.gemm_tokens,
        gemm_pad=parts.gemm_pad,
        gemm_fill=parts.gemm_fill,
    )


def dynamic_sd_k0_overhead_s(batch: float) -> float:
    """Extra time per step of vLLM Dynamic SD when its schedule picks K=0, vs speculation truly off (seconds).

    a + b x B with a = 0.775 ms, b = 84 us, solved from shared/data/published/dynamic-sd-k0-overhead.csv (vLLM
    0.27.1, H100 NVL, gemma-4-31B FP8 + drafter): a + 2 b = 0.943 ms, a + 189 b = 16.656 ms. It prices the
    K=0 band of an engine-native schedule (a band that keeps speculation configured but drafts nothing), not a
    speculative step: see policies/profiles.py. Valid for B >= 1 (measured at 2 and 189; linear in between,
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
        step = target_step_time(
            hardware, model, batch=batch, tokens_per_seq=tokens_per_seq,
            context_tokens=context_tokens, tensor_parallel=tensor_parallel,
        )
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


def _check(*, batch: float, tokens_per_seq: float, context_tokens: float, tp: int) -> None:
    if not (math.isfinite(batch) and batch >= 1.0):
        raise ValueError(f"batch must be a finite number >= 1, got {batch}")
    if not (math.isfinite(tokens_per_seq) and tokens_per_seq >= 1.0):
        raise ValueError(f"tokens_per_seq must be >= 1, got {tokens_per_seq}")
    if not (math.isfinite(context_tokens) and context_tokens >= 0.0):
        raise ValueError(f"context_tokens must be >= 0, got {context_tokens}")
    if tp < 1:
        raise ValueError(f"tensor_parallel must be >= 1, got {tp}")


def _check_prefill(prefill_tokens: float, prefill_context_tokens: float | None, context_tokens: float) -> float:
    if not (math.isfinite(prefill_tokens) and prefill_tokens >= 0.0):
        raise ValueError(f"prefill_tokens must be a finite number >= 0, got {prefill_tokens}")
    if prefill_context_tokens is None:
        return 0.5 * context_tokens
    if not (math.isfinite(prefill_context_tokens) and prefill_context_tokens >= 0.0):
        raise ValueError(f"prefill_context_tokens must be >= 0, got {prefill_context_tokens}")
    return prefill_context_tokens
