"""Does a (batch, context, gamma) fit in the GPU's memory? What a vLLM-style engine keeps resident per GPU.

vLLM sizes its KV cache once at start: it may use `gpu_memory_utilization` of the device memory (default 0.9,
vLLM EngineArgs), holds the weights, and gives what is left to KV blocks. A batch of B sequences at mean context
ctx with gamma draft tokens each needs, per GPU (tp = tensor-parallel degree):

    weights_bytes = (P_dense x dtype_bytes + P_experts x expert_dtype_bytes) / tp
                    + [gamma >= 1] P_drafter x drafter_dtype_bytes / tp_d
    kv_per_seq    = kv_target(ctx + gamma) + [gamma >= 1] kv_drafter(ctx)              bytes
                    (tp_d: the drafter's own degree, the target's unless a draft model runs on fewer GPUs; then
                    the first GPU holds its whole share, and that GPU is the one that fills first)
                    kv_target(n) = kv_elements(tp) x kv_dtype_bytes x n   (GQA: 2 x layers x max(kv_heads / tp, 1)
                    x head_dim; MLA: layers x (latent + rope), whole on every GPU: policies/model/profiles.py)
                    (speculation reserves KV slots for its gamma draft tokens in every running sequence; a draft
                    model or EAGLE head keeps its own cache over the context, an n-gram drafter none; speculation
                    off is a server without the drafter: `--speculative-config` removed, docs/actuation.md)
    budget_bytes  = memory_bytes x gpu_memory_utilization     (memory_bytes: the card's GiB, policies/model/profiles.py)
    max_batch     = max(0, budget_bytes - weights_bytes) / kv_per_seq      sequences (continuous)
    fits          = B <= max_batch

Ranges: memory_bytes > 0, utilization in (0, 1], B >= 1, ctx >= 0, gamma >= 0. An estimate, off both ways by a
few GB: it leaves out the activations of one max-size step and the CUDA graphs (vLLM measures them at start,
typically 1-4 GB: it may say fits where vLLM would not), and it counts EAGLE heads with the embedding and lm_head
they may share with the target, and sliding-window layers (gemma-2, mistral v0.1) over the whole context (it may
say does not fit where vLLM would). Points within a few GB of the budget either way are the uncertain ones.

Worked example (H100 SXM 80 GB = 80 x 2^30 bytes, Llama-3.1-8B bf16, EAGLE-3 head, tp 1, utilization 0.9):
budget 77.31 GB; weights 8.03e9 x 2 + 0.40e9 x 2 = 16.86 GB; KV 131072 B/token, the head's 1 layer x 8 x 128 x 2
x 2 = 4096 B/token; at ctx 4096, gamma 3: kv_per_seq = 131072 x 4099 + 4096 x 4096 = 554 MB -> max_batch =
60.45e9 / 554e6 = 109.1, so B = 64 fits and B = 128 does not. Speculation off: 77.31 - 16.06 = 61.25 GB over
131072 x 4096 = 537 MB -> 114.1.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.model.costmodel import ModelContext
from policies.model.roofline import kv_bytes_per_token_per_gpu

VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM EngineArgs.gpu_memory_utilization default


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """Per-GPU bytes a point needs and may use. `max_batch` 0 = the weights alone exceed the budget."""

    weights_bytes: float
    kv_bytes_per_seq: float
    budget_bytes: float
    max_batch: float
    fits: bool


def memory_fit(
    ctx: ModelContext,
    *,
    batch: float,
    context_tokens: float,
    gamma: int,
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
    tree_tokens: float | None = None,
) -> MemoryFit:
    """Whether `batch` sequences at `context_tokens` with `gamma` drafts fit in one GPU's budget (module docstring).
    A tree drafter (`tree_tokens` draft tokens per sequence) reserves a slot for every node when gamma >= 1.

    Example: H100 SXM, Llama-3.1-8B, EAGLE-3, ctx 4096, gamma 3 -> max_batch 109.1; batch 128 -> fits False.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if batch < 0 or context_tokens < 0 or gamma < 0:
        raise ValueError("batch, context_tokens and gamma must be >= 0")
    model, drafter, tp = ctx.model, ctx.drafter, float(ctx.tensor_parallel)
    drafting = gamma > 0  # off is a server without the drafter loaded
    experts = model.routed_expert_params
    target_bytes = (model.params - experts) * model.dtype_bytes + experts * model.expert_bytes_per_param
    draft_tp = float(drafter.degree(ctx.tensor_parallel))
    weights = target_bytes / tp + (drafter.params * drafter.dtype_bytes / draft_tp if drafting else 0.0)
    target_per_token = kv_bytes_per_token_per_gpu(model.attention, model.kv_dtype_bytes, tp)
    drafter_per_token = (
        kv_bytes_per_token_per_gpu(drafter.attention, drafter.kv_dtype_bytes, draft_tp)
        if drafting and drafter.layers > 0
        else 0.0
    )
    reserved = float(gamma) if tree_tokens is None or gamma == 0 else tree_tokens
    per_seq = target_per_token * (context_tokens + reserved) + drafter_per_token * context_tokens
    budget = ctx.hardware.memory_bytes * gpu_memory_utilization
    free = max(0.0, budget - weights)
    max_batch = free / per_seq if per_seq > 0 else (float("inf") if free > 0 else 0.0)
    return MemoryFit(
        weights_bytes=weights, kv_bytes_per_seq=per_seq, budget_bytes=budget, max_batch=max_batch,
        fits=free > 0 and batch <= max_batch,
    )
