"""Step time of a decode/verify step from a roofline: bytes streamed vs FLOPs, plus fixed host overheads.

For B sequences each verifying q tokens at mean context ctx, on tensor-parallel degree tp (per GPU):

    weight_bytes = (P_stream - P_experts + L_moe x E_touched(B q) x P_expert) x dtype_bytes / tp
                   P_stream = params minus an untied input-embedding table (a step reads B rows, not the table)
                   E_touched(n) = E (1 - (1 - k/E)^n): expected distinct experts per layer hit by n tokens routed
                   uniformly at random (real routers are skewed, so this is an upper bound on expert bytes)
    kv_bytes     = 2 x layers x max(kv_heads / tp, 1) x head_dim x kv_dtype_bytes x B x ctx
    flops        = 2 x P_active_matmul x B q / tp  +  4 x layers x heads x head_dim x B q ctx / tp
    memory_s     = (weight_bytes + kv_bytes) / (BW_peak x bandwidth_efficiency)
    compute_s    = flops / (F_peak(dtype) x flops_efficiency)
    roofline_s   = smooth_max(memory_s, compute_s) = (memory_s^4 + compute_s^4)^(1/4)
    allreduce_s  = tp > 1: 2 x layers x (latency + 2 (tp - 1)/tp x B q hidden x 2 bytes / link_bytes_per_s)
    overhead_s   = step_fixed_s + per_request_step_s x B
    T_target     = overhead_scale x overhead_s + roofline_scale x (roofline_s + allreduce_s)

Why a 4-norm smooth max: memory traffic and math overlap imperfectly near the ridge point; the 4-norm is at most
2^(1/4) = 1.19x the larger term (at the crossover) and within 1.6% of it once one term is twice the other.
The two `CostScales` are what online calibration fits (policies/costmodel.py); both default to 1.

Drafting (what a speculative step adds besides verifying more tokens), for gamma >= 1 drafts:
    ngram / suffix : host_time_per_request x B                                  (one host lookup per step)
    eagle/eagle3/mtp/draft_model: gamma x (draft_step_fixed_s + roofline of the drafter at B tokens:
                     drafter weights + its own KV cache (layers x kv_heads x head_dim) at ctx)
    plus           : spec_step_overhead_s + spec_per_request_overhead_s x B   (rejection sampling, bookkeeping)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.profiles import DrafterProfile, HardwareProfile, ModelProfile
from policies.types import DraftMethod

SMOOTH_MAX_P = 4.0
ACTIVATION_BYTES = 2.0  # bf16 activations in the tensor-parallel all-reduce
HOST_DRAFT_METHODS = frozenset({DraftMethod.NGRAM, DraftMethod.SUFFIX})


@dataclass(frozen=True, slots=True)
class CostScales:
    """Calibration multipliers: `overhead` scales every fixed/host term, `roofline` every physics term. > 0."""

    overhead: float = 1.0
    roofline: float = 1.0


@dataclass(frozen=True, slots=True)
class StepTime:
    """One priced step (seconds, bytes, FLOPs per GPU). `total_s` = `overhead_s` + `physics_s`, both scaled."""

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


def target_step_time(
    hardware: HardwareProfile,
    model: ModelProfile,
    *,
    batch: float,
    tokens_per_seq: float,
    context_tokens: float,
    tensor_parallel: int = 1,
    scales: CostScales | None = None,
) -> StepTime:
    """Price one target forward: `batch` sequences (>= 1) each verifying `tokens_per_seq` tokens (>= 1; gamma+1
    with gamma drafts) at `context_tokens` (>= 0) mean context, sharded over `tensor_parallel` GPUs (>= 1).
    Formulas in the module docstring. Raises ValueError outside those ranges.

    Example: H100 SXM, Llama-3.1-8B, B=1, q=1, ctx=512: weights 7.505e9 x 2 = 15.01 GB, KV 131072 x 512 = 67 MB,
    memory_s = 15.08e9 / 2.8475e12 = 5.30 ms; compute_s = 2 x 7.505e9 / 5.936e14 = 0.025 ms; overhead
    1.5 + 0.02 ms -> total ~ 6.82 ms (vLLM measured 7.07 ms, vllm-eagle-k-sweep-bs1.csv).
    """
    _check(batch=batch, tokens_per_seq=tokens_per_seq, context_tokens=context_tokens, tp=tensor_parallel)
    scales = scales or CostScales()
    tp = float(tensor_parallel)
    tokens = batch * tokens_per_seq
    touched = expected_experts_touched(model.num_experts, model.experts_per_token, tokens)
    dense_params = model.params - model.input_embedding_params - model.routed_expert_params
    expert_params = model.moe_layers * touched * model.expert_params if model.is_moe else 0.0
    weight_bytes = (dense_params + expert_params) * model.dtype_bytes / tp
    kv_heads_per_gpu = max(model.num_kv_heads / tp, 1.0)
    kv_bytes = 2.0 * model.layers * kv_heads_per_gpu * model.head_dim * model.kv_dtype_bytes * batch * context_tokens
    matmul_params = model.active_params - model.input_embedding_params
    attention_flops = 4.0 * model.layers * model.num_heads * model.head_dim * tokens * context_tokens
    flops = (2.0 * matmul_params * tokens + attention_flops) / tp
    memory_s = (weight_bytes + kv_bytes) / (hardware.mem_bandwidth_bytes_per_s * hardware.bandwidth_efficiency)
    compute_s = flops / (hardware.flops_for_dtype(model.dtype_bytes) * hardware.flops_efficiency)
    allreduce_s = 0.0
    if tensor_parallel > 1:
        message = tokens * model.hidden * ACTIVATION_BYTES
        ring = 2.0 * (tp - 1.0) / tp * message / hardware.interconnect_bytes_per_s
        allreduce_s = 2.0 * model.layers * (hardware.allreduce_latency_s + ring)
    overhead = hardware.step_fixed_s + hardware.per_request_step_s * batch
    return StepTime(
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        flops=flops,
        memory_s=memory_s,
        compute_s=compute_s,
        overhead_s=scales.overhead * overhead,
        physics_s=scales.roofline * (smooth_max(memory_s, compute_s) + allreduce_s),
    )


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
    0.5 ms + 0.80 GB / 2.8475e12 = 0.28 ms -> 2.34 ms for three, + 0.775 + 0.084 ms overhead -> ~3.2 ms.
    """
    _check(batch=batch, tokens_per_seq=1.0, context_tokens=context_tokens, tp=tensor_parallel)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    scales = scales or CostScales()
    if gamma == 0:
        return StepTime(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    spec_overhead = hardware.spec_step_overhead_s + hardware.spec_per_request_overhead_s * batch
    if drafter.method in HOST_DRAFT_METHODS or drafter.params <= 0:
        host = drafter.host_time_per_request_s * batch
        return StepTime(0.0, 0.0, 0.0, 0.0, 0.0, scales.overhead * (host + spec_overhead), 0.0)
    tp = float(tensor_parallel)
    weight_bytes = drafter.params * drafter.dtype_bytes / tp
    kv_heads_per_gpu = max(drafter.num_kv_heads / tp, 1.0)
    kv_bytes = 2.0 * drafter.layers * kv_heads_per_gpu * drafter.head_dim * drafter.kv_dtype_bytes * batch
    kv_bytes *= context_tokens
    attention_flops = 4.0 * drafter.layers * drafter.num_heads * drafter.head_dim * batch * context_tokens
    flops = (2.0 * drafter.params * batch + attention_flops) / tp
    memory_s = (weight_bytes + kv_bytes) / (hardware.mem_bandwidth_bytes_per_s * hardware.bandwidth_efficiency)
    compute_s = flops / (hardware.flops_for_dtype(drafter.dtype_bytes) * hardware.flops_efficiency)
    return StepTime(
        weight_bytes=gamma * weight_bytes,
        kv_bytes=gamma * kv_bytes,
        flops=gamma * flops,
        memory_s=gamma * memory_s,
        compute_s=gamma * compute_s,
        overhead_s=scales.overhead * (gamma * hardware.draft_step_fixed_s + spec_overhead),
        physics_s=scales.roofline * gamma * smooth_max(memory_s, compute_s),
    )


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

    Example: H100, Llama-3.1-8B, q=1: memory_s = 5.27 ms + B x 46 ns x ctx, compute_s = B x (25.3 us + 0.88 ns x
    ctx); ctx 128 -> B ~ 270; ctx 512 -> B ~ 2450; ctx >= ~560 -> None (the KV slope exceeds the FLOP slope).
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
