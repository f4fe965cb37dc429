"""Hardware, target-model and drafter profiles: the physical constants the cost model needs.

Units are base SI: FLOP/s, bytes/s, bytes, seconds; parameter counts are plain counts. Profiles come from the
catalog (`policies/model/catalog.py`, transcribed from datasheets and `config.json` files), from a model's own
`config.json` (`model_from_hf_config`, pure: the caller reads the file), or are configured by the operator.

Efficiency and overhead defaults on `HardwareProfile` (each one is calibrated online, see
`policies/model/costmodel.py`):
- `bandwidth_efficiency` 0.85: tests/fixtures/hardware.csv notes sustained HBM bandwidth is typically 80-90% of peak.
- `flops_efficiency` 0.60: the same note says achieved GEMM throughput is lower still; 0.6 of dense peak is the
  stated assumption for serving-sized GEMMs (large-shape cuBLAS runs reach ~0.7, decode shapes less).
- `step_fixed_s` 0.38 ms + `per_layer_step_s` 35 us per layer: a step's fixed time, host work plus every layer's
  kernel latencies (a layer runs ~10-15 kernels: the GEMMs each have a latency floor of ~2-5 us at decode sizes,
  the small-shape rows of tests/fixtures/published/gemm-efficiency-vs-m.csv, DeepGEMM's H800 table, measured minus the
  bandwidth time; norms, rotary, attention and the all-reduce add their own). Their sum at 32 layers is the 1.5 ms
  that vllm-eagle-k-sweep-bs1.csv leaves beside weight streaming: Llama-3.1-8B bs1 on H100 streams 7.5e9 params x
  2 B = 15.0 GB, 15.0e9 / (3.35e12 x 0.85) = 5.3 ms, against a measured plain TPOT of 7.07 ms. The split is fitted
  to the published batch > 1 data (benchmarks/published_reproduction.py --fit: the loss falls as the per-layer
  share grows, 0.048 at 0 us to 0.030 at 40 us with 20 us per request and 40 us per token; 35 us keeps 0.38 ms
  for the host's own per-step work): a
  61-layer model on 4-8 GPUs pays several ms per step at batch 1 that a 32-layer one does not (Kimi-K2.6 on GB200:
  6.35 ms measured, 3.8 ms priced with a flat 1.5 ms).
- `per_request_step_s` 20 us: host-side per-sequence work per step (assumption of the order of vLLM V1's 10-30 us;
  the published fit's best, benchmarks/published_reproduction.py --fit, among 10-60 us).
- `per_token_step_s` 40 us per verified draft token: what each draft token a speculative step verifies costs
  besides its roofline (rejection sampling over the vocabulary, the draft tokens' bookkeeping and the engine's
  per-token output handling, serial with the GPU unless the engine schedules asynchronously). Priced as
  per_token_step_s x B x (q - 1): a plain step pays none of it (its one token per sequence is in the per-request
  and roofline terms), so plain and speculative steps tell it apart. Fitted to the published batch > 1 sources
  (benchmarks/published_reproduction.py --fit; leaving any one source out moves it by at most 20 us): from
  ~20 us (async scheduling, B200) to ~100 us (async scheduling off, H100: the replay-oracle rows of S-GIST) per
  token, so its calibration prior is wide (policies/model/calibrate.py `per_token_sigma`) and the band says so until
  the server has been seen with and without drafts.
- `spec_step_overhead_s` 0.775 ms: the speculative machinery's own cost per step (rejection sampler launch,
  draft bookkeeping, the extra host round trip), from tests/fixtures/published/dynamic-sd-k0-overhead.csv (vLLM
  Dynamic SD at K=0 vs off, H100 NVL): TPOT +0.943 ms at concurrency 2 and +16.656 ms at 189, solved as
  a + 2 b = 0.943, a + 189 b = 16.656 -> a = 0.775 ms per step. Cross-check from an independent source: the eagle3
  k-sweep's step time (TPOT x AL) extrapolates to ~7.9 ms at k=0 vs 7.07 ms plain, i.e. ~0.85 ms at batch 1.
- `spec_per_request_overhead_s` 5 us (assumption, upper-bounded by data): host bookkeeping of each request's draft
  tokens in the scheduler and input preparation, plus the sampler's extra logits traffic (vocab x 4 bytes x ~3
  passes per verified token: 128256 x 12 B / 2.85 TB/s = 0.5 us per draft token). NOT the b = 84 us of the same
  two-point solve: that slope is what vLLM 0.27.1's Dynamic SD pays at K=0, a code path that keeps the drafter
  running on every request so it can raise K again (drafter pass over B tokens + its KV, CUDA-graph sizes for
  the speculative path). In a speculative step that drafter work is already priced by the draft passes
  (`drafting_time`), so charging 84 us/request on top would count it twice and, at B=256, add a 21 ms fixed cost
  to every gamma >= 1 whatever the drafter (even host-side n-gram, which has no drafter pass). The K=0 figure
  is kept where it applies, `roofline.dynamic_sd_k0_overhead_s` (engine-native schedule bands with K=0), and
  84 us is the ceiling for this constant; calibration fits its scale (`CostScales.per_request`) online.
- `draft_step_fixed_s` 0.5 ms: launch + sampling cost of one sequential draft step (EAGLE/MTP head or draft
  model). Bounded by the eagle3 k-sweep: each extra draft position costs ~1.1 ms of step time, of which ~0.3 ms is
  the head's own weight streaming; 0.5 ms is the middle of the remaining 0.3-0.8 ms (assumption).
- `gemm_fill_tokens` 64: the least math a decode step's linear layers cost, in tokens. A linear layer over N
  tokens is computed in row tiles of 64 (Hopper's wgmma instruction is m64nNk16, PTX ISA; Ampere kernels use
  64-128-row CTA tiles), so even one token pays for one tile. Beyond that tile the fill of the GPU's waves is what
  the kernels manage, not a floor: cuBLAS / CUTLASS pick split-K and stream-K schedules for skinny GEMMs so that
  a few row tiles still occupy every SM. A step's GEMMs therefore cost about smooth_max(N + t/2, 64 x fill)
  tokens, padded by half a tile t = min(64, gemm_fill_tokens) on average (a step's last tile is part-empty);
  `fill` (and the GEMM efficiency elasticity) is fitted online (policies/model/roofline.py,
  policies/model/calibrate.py), and 64 is the prior. Why not a larger, wave-filling floor (128 rows before 2026-12-03):
  at 60% of peak it made a
  batch-1 step compute-bound on GPUs with few FLOPs per byte (A100, 7B fp16: 9.05 ms of floor math against 7.8 ms
  of weight streaming; RTX 3090: 40 ms against 17 ms), where batch-1 decode is memory-bound (one tile halves
  both; the 3090, 76 FLOP per byte at peak, stays above: 20 ms against 17 ms); and it let a
  calibration started from a bandwidth profile 2x too fast explain the batch-1 step by math instead of
  bandwidth, so that the fitted memory scale depended on the prior rather than the data
  (tests/integration/test_model_sim_calibration.py, long-context sweep). At decode batch sizes this floor (65
  rows x 15 GFLOP / 0.59 PFLOP/s = 1.65 ms for an 8B model on H100) stays far under the weight streaming time
  (5.3 ms).
- `allreduce_latency_s` 8 us per all-reduce (vLLM custom all-reduce on NVLink; assumption).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from policies.model.catalog import HARDWARE_ALIASES, HARDWARE_ROWS, MODEL_ENTRIES, HardwareRow, ModelEntry
from policies.model.quantization import weight_bytes
from policies.types import DraftMethod

DEFAULT_EFFICIENCY_SOURCE = (
    "bandwidth 0.85 and GEMM 0.60 of peak (hardware.csv note); step fixed 0.38 ms + 35 us per layer "
    "(vllm-eagle-k-sweep-bs1.csv plain TPOT minus weight streaming, split by the published batch > 1 fit); "
    "40 us per verified draft token (same fit); speculative overhead 0.775 ms/step "
    "(dynamic-sd-k0-overhead.csv) + 5 us/request (assumption, <= the 84 us K=0 slope); see policies/model/profiles.py"
)


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One accelerator (per GPU). Peaks are vendor datasheet figures; the efficiency fields scale them to what a
    serving engine sustains, the overhead fields are the engine's per-step host costs (all calibrated online).

    `peak_flops_per_s`: dense bf16 tensor FLOP/s; `peak_fp8_flops_per_s`: dense fp8 (None where unsupported);
    `mem_bandwidth_bytes_per_s`: HBM peak; `memory_bytes`: memory size (the datasheet's "80 GB" of HBM or "24 GB"
    of GDDR is GiB: nvidia-smi shows an H100 80GB's 81559 MiB); `interconnect_bytes_per_s`: GPU-to-GPU link
    bandwidth per direction (tensor-parallel all-reduce). Efficiencies are in (0, 1].
    """

    name: str
    peak_flops_per_s: float
    peak_fp8_flops_per_s: float | None
    mem_bandwidth_bytes_per_s: float
    memory_bytes: float
    nvml_name_contains: str | None
    source: str
    interconnect_bytes_per_s: float = 32e9
    bandwidth_efficiency: float = 0.85
    flops_efficiency: float = 0.60
    step_fixed_s: float = 0.38e-3
    per_layer_step_s: float = 35e-6
    per_request_step_s: float = 20e-6
    per_token_step_s: float = 40e-6
    spec_step_overhead_s: float = 0.775e-3
    spec_per_request_overhead_s: float = 5e-6
    draft_step_fixed_s: float = 0.5e-3
    allreduce_latency_s: float = 8e-6
    gemm_fill_tokens: float = 64.0
    efficiency_source: str = DEFAULT_EFFICIENCY_SOURCE

    def __post_init__(self) -> None:
        if self.peak_flops_per_s <= 0 or self.mem_bandwidth_bytes_per_s <= 0:
            raise ValueError(f"hardware {self.name!r}: peak FLOP/s and bandwidth must be > 0")
        if not (0 < self.bandwidth_efficiency <= 1 and 0 < self.flops_efficiency <= 1):
            raise ValueError(f"hardware {self.name!r}: efficiencies must be in (0, 1]")

    def flops_for_dtype(self, dtype_bytes: float) -> float:
        """Dense peak FLOP/s for weights of `dtype_bytes` per parameter: fp8 (1 byte) uses the fp8 tensor peak
        where the GPU has one; everything else (bf16, and 4-bit weights that are dequantised to bf16) the bf16 peak.

        Example: H100 SXM, dtype_bytes=1 -> 1978.9e12; dtype_bytes=2 -> 989.4e12.
        """
        if dtype_bytes == 1 and self.peak_fp8_flops_per_s is not None:
            return self.peak_fp8_flops_per_s
        return self.peak_flops_per_s


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """What one token's attention stores and computes, for GQA/MHA or DeepSeek's multi-head latent attention (MLA).

    GQA (`kv_lora_rank` 0): each layer caches K and V for `num_kv_heads` heads of `head_dim`; tensor parallelism
    shards the KV heads (replicated once tp exceeds them). MLA (`kv_lora_rank` > 0, DeepSeek-V2/V3, Kimi-K2): each
    layer caches ONE latent vector of `kv_lora_rank` + `rope_head_dim` elements per token, shared by K and V and
    by every head, so tensor parallelism cannot shard it (vLLM keeps a full copy on every rank; data-parallel
    attention is the way around it). Decode FLOPs per (query token, context token) pair and layer:
        GQA:  4 x heads x head_dim                    (Q.K and P.V, 2 FLOPs per multiply-add)
        MLA:  heads x (4 x kv_lora_rank + 2 x rope)   (the absorbed form: scores against the latent plus the rope
                                                       part, and the weighted sum of the latent, per head)
    so MLA's decode attention does ~128x more math per byte of cache than a GQA-8 model: at long contexts it is
    compute, not bandwidth, and every verified token pays it in full. Prefill computes K and V from the latent and
    runs ordinary attention: 2 x heads x (qk_head_dim + v_head_dim) per pair (qk = `head_dim`).
    Example: DeepSeek-V3 (61 layers, 128 heads, latent 512, rope 64): 61 x 576 = 35136 cached elements per token
    (70 KB in bf16, vs 2 x 61 x 128 x 128 = 2.0M for the same heads as plain MHA); decode FLOPs per pair
    61 x 128 x (2048 + 128) = 16.99M. Llama-3.1-8B: 2 x 32 x 8 x 128 = 65536 elements, 4 x 32 x 32 x 128 =
    524288 FLOPs per pair.
    """

    layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def kv_elements_per_token(self, *, tp: float) -> float:
        """Cached elements per token of context on one GPU of `tp` (>= 1): MLA layers x (latent + rope), whole on
        every rank; GQA 2 x layers x max(kv_heads / tp, 1) x head_dim."""
        if self.is_mla:
            return float(self.layers * (self.kv_lora_rank + self.rope_head_dim))
        return 2.0 * self.layers * max(self.num_kv_heads / tp, 1.0) * self.head_dim

    @property
    def decode_flops_per_pair(self) -> float:
        """Decode attention FLOPs per (query token, context token) pair, all layers and heads (class docstring)."""
        if self.is_mla:
            return float(self.layers * self.num_heads * (4 * self.kv_lora_rank + 2 * self.rope_head_dim))
        return 4.0 * self.layers * self.num_heads * self.head_dim

    @property
    def prefill_flops_per_pair(self) -> float:
        """Prefill attention FLOPs per (prompt token, context token) pair: 2 x layers x heads x (qk + v dims)."""
        v_dim = self.v_head_dim or self.head_dim
        return 2.0 * self.layers * self.num_heads * (self.head_dim + v_dim)


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """A target (or draft) transformer's architecture, enough for a decode-step roofline.

    `params`: total parameter count (embeddings included, the number model cards quote); `active_params`: those
    used per token (MoE: shared weights + `experts_per_token` routed experts per layer). `dtype_bytes`: bytes per
    weight (bf16 2, fp8 1, 4-bit 0.5); `kv_dtype_bytes`: bytes per KV-cache element. MoE: `num_experts` routed
    experts per MoE layer (0 = dense model), `experts_per_token` routed per token, `expert_params` the parameters
    of ONE routed expert in ONE layer, `moe_layers` how many layers are MoE.
    """

    name: str
    params: float
    active_params: float
    layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: float
    kv_dtype_bytes: float
    source: str
    intermediate_size: int = 0
    vocab_size: int = 0
    tied_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    expert_params: float = 0.0
    moe_layers: int = 0
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0
    expert_dtype_bytes: float | None = None
    sliding_window: int = 0
    sliding_layers: int = 0

    def attended_context(self, context_tokens: float) -> float:
        """The context a decode token attends to, averaged over layers (tokens): layers with a sliding window of W
        read at most W cached tokens. (full x ctx + sliding x min(ctx, W)) / layers; ctx when no layer slides.

        Example: gpt-oss-20b (12 of 24 layers slide over 128 tokens) at ctx 4096 -> (12 x 4096 + 12 x 128) / 24
        = 2112.
        """
        return attended_context(context_tokens, layers=self.layers, window=self.sliding_window,
                                sliding_layers=self.sliding_layers)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.experts_per_token > 0

    @property
    def attention(self) -> AttentionShape:
        """The attention's shape (GQA, or MLA when `kv_lora_rank` > 0): what its KV cache and FLOPs are."""
        return AttentionShape(
            layers=self.layers, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            kv_lora_rank=self.kv_lora_rank, rope_head_dim=self.rope_head_dim, v_head_dim=self.v_head_dim,
        )

    @property
    def expert_bytes_per_param(self) -> float:
        """Bytes per routed-expert weight: `expert_dtype_bytes` where the experts alone are quantised (gpt-oss's
        MXFP4 experts beside bf16 attention), else `dtype_bytes`."""
        return self.dtype_bytes if self.expert_dtype_bytes is None else self.expert_dtype_bytes

    @property
    def input_embedding_params(self) -> float:
        """Parameters of an untied input-embedding table: a decode step reads only B rows of it, not the table, so
        it is left out of weight streaming and of matmul FLOPs. 0 when tied (the table is the lm_head, read whole).
        """
        return 0.0 if self.tied_embeddings else float(self.vocab_size * self.hidden)

    @property
    def routed_expert_params(self) -> float:
        """All routed-expert parameters, every MoE layer: moe_layers x num_experts x expert_params."""
        return float(self.moe_layers * self.num_experts) * self.expert_params

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes per token of context (all layers, all KV heads): `AttentionShape.kv_elements_per_token`
        x kv_dtype_bytes.

        Example: Llama-3.1-8B bf16: 2 x 32 x 8 x 128 x 2 = 131072 bytes (128 KiB) per token; DeepSeek-V3 (MLA,
        latent 512 + rope 64, bf16 cache): 61 x 576 x 2 = 70272 bytes.
        """
        return self.attention.kv_elements_per_token(tp=1.0) * self.kv_dtype_bytes


@dataclass(frozen=True, slots=True)
class DrafterProfile:
    """What produces the draft tokens and what one draft step costs.

    `params`: weights a draft step streams (EAGLE/MTP head incl. the lm_head it evaluates; a draft model's whole
    weights); 0 for host-side n-gram/suffix lookup. `layers`, `num_heads`, `num_kv_heads`, `head_dim`: the
    drafter's own attention (its KV cache); `host_time_per_request_s`: CPU time per request per step (n-gram).
    `tensor_parallel`: the degree its passes run at, 0 = the target's (a head always does; a draft model may run
    on one GPU: vLLM's `draft_tensor_parallel_size`). `sliding_window` / `sliding_layers`: a draft model's layers
    that attend to at most that many cached tokens (its KV reads are bounded there, as the target's are).
    """

    method: DraftMethod
    params: float = 0.0
    layers: int = 0
    hidden: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    dtype_bytes: float = 2.0
    kv_dtype_bytes: float = 2.0
    host_time_per_request_s: float = 0.0
    source: str = ""
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0
    # The k the deployment may run (policies/model/drafter_semantics.py); empty: any k >= 1.
    allowed_k: tuple[int, ...] = ()
    # Whether a shorter draft is a longer one's prefix; None: the method's (drafter_semantics.PREFIX_STABLE).
    prefix_stable: bool | None = None
    tensor_parallel: int = 0
    sliding_window: int = 0
    sliding_layers: int = 0

    def degree(self, target_tp: int) -> int:
        """The tensor-parallel degree the drafter's passes run at: its own, or the target's `target_tp` when 0."""
        return self.tensor_parallel if self.tensor_parallel > 0 else target_tp

    def attended_context(self, context_tokens: float) -> float:
        """The context one draft token attends to, averaged over the drafter's layers (tokens), bounded by its
        sliding layers' window: (full x ctx + sliding x min(ctx, W)) / layers. Example: a 24-layer draft model
        whose 12 sliding layers see 4096 tokens, at ctx 32768 -> (12 x 32768 + 12 x 4096) / 24 = 18432."""
        return attended_context(context_tokens, layers=self.layers, window=self.sliding_window,
                                sliding_layers=self.sliding_layers)

    @property
    def attention(self) -> AttentionShape:
        """The drafter's own attention (its KV cache and FLOPs; MLA for a DeepSeek-style MTP module)."""
        return AttentionShape(
            layers=self.layers, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            kv_lora_rank=self.kv_lora_rank, rope_head_dim=self.rope_head_dim, v_head_dim=self.v_head_dim,
        )


def attended_context(context_tokens: float, *, layers: int, window: int, sliding_layers: int) -> float:
    """The context one token attends to, averaged over `layers` (tokens), of which `sliding_layers` attend to at
    most `window` cached tokens: (full x ctx + sliding x min(ctx, W)) / layers; ctx when no layer slides.
    Example: 12 of 24 layers sliding over 128 tokens at ctx 4096 -> (12 x 4096 + 12 x 128) / 24 = 2112."""
    if window <= 0 or sliding_layers <= 0 or layers <= 0:
        return context_tokens
    sliding = min(sliding_layers, layers)
    return ((layers - sliding) * context_tokens + sliding * min(context_tokens, float(window))) / layers


# ----------------------------------------------------------------------------------------------------------------
# config.json -> ModelProfile
# ----------------------------------------------------------------------------------------------------------------

GIB = float(2**30)  # datasheet memory sizes are binary: an "80 GB" H100 holds 80 GiB (81559 MiB in nvidia-smi)



def _section(config: Mapping[str, object]) -> Mapping[str, object]:
    # Multimodal wrappers (Gemma 3, Llama 4, Qwen-VL) nest the language model's fields under text_config.
    text = config.get("text_config")
    if isinstance(text, Mapping) and "hidden_size" not in config:
        return {**config, **{str(k): v for k, v in text.items()}}
    return config


def _number(config: Mapping[str, object], *keys: str, default: float | None = None) -> float:
    for key in keys:
        value = config.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            return float(value)
    if default is None:
        raise ValueError(f"config.json lacks a numeric {' / '.join(keys)}")
    return default


def model_from_hf_config(
    config: Mapping[str, object],
    *,
    name: str,
    source: str | None = None,
    kv_dtype_bytes: float | None = None,
) -> ModelProfile:
    """Build a ModelProfile from a Hugging Face `config.json` (already parsed; this function does no I/O).

    Counts, for a gated-MLP decoder (Llama, Qwen, Mistral, Gemma, Mixtral, gpt-oss, DeepSeek, Kimi):
      attention/layer = hidden x (heads x head_dim) [q] + 2 x hidden x (kv_heads x head_dim) [k, v]
                        + (heads x head_dim) x hidden [o]
      MLA/layer       = (q_lora_rank ? hidden x q_lora + q_lora x heads x qk : hidden x heads x qk) [q]
                        + hidden x (kv_lora + rope) [kv_a] + kv_lora x heads x (nope + v) [kv_b]
                        + heads x v x hidden [o],   qk = nope + rope      (DeepSeek-V2/V3, Kimi-K2: kv_lora_rank)
      dense MLP/layer = 3 x hidden x intermediate_size            (gate, up, down)
      expert/layer    = 3 x hidden x moe_intermediate_size (or intermediate_size: Mixtral, gpt-oss); router
                        hidden x E; shared experts like a routed one (n_shared_experts) or their own size
      embeddings      = vocab x hidden, twice unless tie_word_embeddings; norms 2 x hidden per layer + hidden.
    `active_params` swaps the E routed experts of every MoE layer for `num_experts_per_tok` of them.
    Bytes per weight: policies/model/quantization.py (`quantization_config`, else `torch_dtype`/`dtype`; an unknown
    quantisation method or a missing dtype is a ValueError naming it, never a guess); routed experts may be
    quantised apart (`expert_dtype_bytes`). `kv_dtype_bytes` defaults to the weight dtype, or 2 (bf16) for
    quantized weights: the KV-cache dtype is a serving flag (`--kv-cache-dtype`), not part of config.json, so pass
    it when known. Limits: sliding-window layers are counted over the whole context (an upper bound on their
    KV reads).

    Raises ValueError when a required field (hidden_size, num_hidden_layers, num_attention_heads, vocab_size,
    intermediate_size for dense models) is missing.

    Example: Llama-3.1-8B (hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads, head_dim 128, vocab
    128256, untied): attention 41.94M + MLP 176.16M + norms 8192 = 218.1M per layer, x 32 = 6.979e9, + 2 x 525.3M
    embeddings + 4096 = 8.03e9 params (the model card says 8.03B). DeepSeek-V3 (MLA, 3 dense + 58 MoE layers of
    256 experts of 44.04M, one shared): 187.0M attention per layer, 671e9 params, 37.5e9 active.
    """
    cfg = _section(config)
    hidden = int(_number(cfg, "hidden_size", "d_model", "n_embd"))
    layers = int(_number(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = int(_number(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(_number(cfg, "num_key_value_heads", "num_kv_heads", default=float(heads)))
    vocab = int(_number(cfg, "vocab_size"))
    tied = bool(cfg.get("tie_word_embeddings", False))
    num_experts = int(_number(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0.0))
    experts_per_token = int(_number(cfg, "num_experts_per_tok", "moe_topk", default=0.0)) if num_experts else 0
    moe = num_experts > 0 and experts_per_token > 0
    intermediate = int(_number(cfg, "intermediate_size", "ffn_dim", default=0.0 if moe else None))
    weights = weight_bytes(cfg)
    if kv_dtype_bytes is None:
        kv_dtype_bytes = weights.dense if weights.dense >= 2 else 2.0

    window, sliding_layers = _sliding(cfg, layers)
    mla = _mla_shape(cfg)
    if mla is not None:
        kv_lora, rope, nope, v_dim, q_lora = mla
        head_dim, kv_heads = nope + rope, 1
        q_proj = hidden * q_lora + q_lora + q_lora * heads * head_dim if q_lora else hidden * heads * head_dim
        attention = q_proj + hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
        attention += heads * v_dim * hidden
    else:
        head_dim = int(_number(cfg, "head_dim", default=float(hidden // heads)))
        kv_lora = rope = v_dim = 0
        attention = hidden * heads * head_dim * 2 + 2 * hidden * kv_heads * head_dim
    norms = 2 * hidden
    dense_mlp = 3 * hidden * intermediate
    expert = 0.0
    moe_layers = 0
    total_layers = 0.0
    active_layers = 0.0
    if moe:
        moe_inter = int(_number(cfg, "moe_intermediate_size", default=float(intermediate)))
        expert = 3.0 * hidden * moe_inter
        shared = 3.0 * hidden * _number(cfg, "shared_expert_intermediate_size", default=0.0)
        shared += 3.0 * hidden * moe_inter * _number(cfg, "n_shared_experts", default=0.0)
        router = hidden * num_experts
        dense_first = min(int(_number(cfg, "first_k_dense_replace", default=0.0)), layers)
        moe_layers = layers - dense_first
        total_layers = dense_first * (attention + dense_mlp + norms) + moe_layers * (
            attention + norms + router + shared + num_experts * expert
        )
        active_layers = total_layers - moe_layers * (num_experts - experts_per_token) * expert
    else:
        total_layers = layers * float(attention + dense_mlp + norms)
        active_layers = total_layers
    embeddings = vocab * hidden * (1 if tied else 2)
    params = total_layers + embeddings + hidden
    active = active_layers + embeddings + hidden
    return ModelProfile(
        name=name,
        params=params,
        active_params=active,
        layers=layers,
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype_bytes=weights.dense,
        kv_dtype_bytes=kv_dtype_bytes,
        source=source or f"config.json of {name}",
        intermediate_size=intermediate,
        vocab_size=vocab,
        tied_embeddings=tied,
        num_experts=num_experts if moe else 0,
        experts_per_token=experts_per_token,
        expert_params=expert,
        moe_layers=moe_layers,
        kv_lora_rank=kv_lora,
        rope_head_dim=rope,
        v_head_dim=v_dim,
        expert_dtype_bytes=weights.experts if moe and weights.experts != weights.dense else None,
        sliding_window=window,
        sliding_layers=sliding_layers,
    )


def _sliding(cfg: Mapping[str, object], layers: int) -> tuple[int, int]:
    """(window, layers that slide) from `sliding_window` and `layer_types` (gpt-oss, Gemma-2/3: a list naming
    each layer "sliding_attention" or "full_attention"); (0, 0) when no layer's window is stated. A window without
    `layer_types` slides in every layer only when `use_sliding_window` is not false (Qwen2/3 configs carry a
    window they do not use)."""
    window = int(_number(cfg, "sliding_window", default=0.0))
    if window <= 0:
        return 0, 0
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return window, sum(1 for kind in types if "sliding" in str(kind))
    if "use_sliding_window" in cfg and not cfg.get("use_sliding_window"):
        return 0, 0
    return window, layers


def _mla_shape(cfg: Mapping[str, object]) -> tuple[int, int, int, int, int] | None:
    """(kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, q_lora_rank or 0) of an MLA config, or
    None for GQA/MHA (no positive `kv_lora_rank`). Raises ValueError when an MLA config lacks a head size."""
    kv_lora = int(_number(cfg, "kv_lora_rank", default=0.0))
    if kv_lora <= 0:
        return None
    rope = int(_number(cfg, "qk_rope_head_dim"))
    nope = int(_number(cfg, "qk_nope_head_dim"))
    v_dim = int(_number(cfg, "v_head_dim"))
    q_lora = int(_number(cfg, "q_lora_rank", default=0.0))
    return kv_lora, rope, nope, v_dim, max(q_lora, 0)


# ----------------------------------------------------------------------------------------------------------------
# Drafters
# ----------------------------------------------------------------------------------------------------------------

# EAGLE-3 heads predict over a reduced draft vocabulary (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json:
# draft_vocab_size 32000), EAGLE-1/MTP heads evaluate the target's full lm_head.
_EAGLE3_DRAFT_VOCAB = 32000
# n-gram / suffix proposers run on the host per request (vLLM: numba KMP over the request's tokens). Assumption:
# ~20 us per request per step at typical context lengths.
_HOST_LOOKUP_PER_REQUEST_S = 20e-6


def drafter_for(
    method: DraftMethod,
    target: ModelProfile,
    *,
    draft_model: ModelProfile | None = None,
    draft_tensor_parallel: int = 0,
) -> DrafterProfile:
    """The default drafter of `method` for `target`: the sizes a head or lookup of that kind has.

    - ngram / suffix: no weights, 20 us host time per request per step (assumption).
    - eagle: one decoder layer shaped like the target's (attention + dense MLP of `intermediate_size`), an
      fc 2h -> h fusing embedding and hidden state, and the target's full lm_head (vocab x hidden), read per step.
    - eagle3: the same layer, an fc 3h -> h fusing three hidden states, and a 32000-entry draft vocabulary.
    - mtp: one decoder layer + fc 2h -> h + the target's lm_head (DeepSeek-V3-style MTP module).
    - draft_model: the separate model `draft_model` (required), all of its weights per step, its own KV cache
      (over its sliding window where its layers slide), at `draft_tensor_parallel` GPUs (0: the target's degree).
    Raises ValueError for draft_model without `draft_model`, and for a `draft_tensor_parallel` on another method
    (a head or lookup runs where the target does).

    Example: eagle3 for Llama-3.1-8B: layer 218.1M + fc 3 x 4096 x 4096 = 50.3M + lm_head 32000 x 4096 = 131.1M
    -> params ~ 3.995e8 (0.8 GB of bf16 streamed per draft step).
    """
    if draft_tensor_parallel < 0 or (draft_tensor_parallel and method != DraftMethod.DRAFT_MODEL):
        raise ValueError(f"a drafter's own tensor_parallel applies to method draft_model only (>= 1), got "
                         f"{draft_tensor_parallel} for {method.value}")
    h = target.hidden
    layer = (
        h * target.num_heads * target.head_dim * 2
        + 2 * h * target.num_kv_heads * target.head_dim
        + 3 * h * max(target.intermediate_size, 1)
        + 2 * h
    )
    if method in (DraftMethod.NGRAM, DraftMethod.SUFFIX):
        return DrafterProfile(
            method=method,
            host_time_per_request_s=_HOST_LOOKUP_PER_REQUEST_S,
            source="host-side lookup, no weights; 20 us per request per step (assumption)",
        )
    if method == DraftMethod.EAGLE3:
        params = layer + 3 * h * h + min(target.vocab_size, _EAGLE3_DRAFT_VOCAB) * h
        return DrafterProfile(
            method=method, params=float(params), layers=1, hidden=h, num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads, head_dim=target.head_dim, dtype_bytes=target.dtype_bytes,
            kv_dtype_bytes=target.kv_dtype_bytes, kv_lora_rank=target.kv_lora_rank,
            rope_head_dim=target.rope_head_dim, v_head_dim=target.v_head_dim,
            source=f"EAGLE-3 head shaped like {target.name}: 1 layer + fc 3h->h + 32000-token draft lm_head",
        )
    if method in (DraftMethod.EAGLE, DraftMethod.MTP):
        params = layer + 2 * h * h + target.vocab_size * h
        return DrafterProfile(
            method=method, params=float(params), layers=1, hidden=h, num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads, head_dim=target.head_dim, dtype_bytes=target.dtype_bytes,
            kv_dtype_bytes=target.kv_dtype_bytes, kv_lora_rank=target.kv_lora_rank,
            rope_head_dim=target.rope_head_dim, v_head_dim=target.v_head_dim,
            source=f"{method.value} head shaped like {target.name}: 1 layer + fc 2h->h + the target lm_head",
        )
    if draft_model is None:
        raise ValueError("draft_model drafter needs the draft model's profile (draft_model=...)")
    return DrafterProfile(
        method=method,
        params=draft_model.params - draft_model.input_embedding_params,
        layers=draft_model.layers,
        hidden=draft_model.hidden,
        num_heads=draft_model.num_heads,
        num_kv_heads=draft_model.num_kv_heads,
        head_dim=draft_model.head_dim,
        dtype_bytes=draft_model.dtype_bytes,
        kv_dtype_bytes=draft_model.kv_dtype_bytes,
        kv_lora_rank=draft_model.kv_lora_rank,
        rope_head_dim=draft_model.rope_head_dim,
        v_head_dim=draft_model.v_head_dim,
        source=f"draft model {draft_model.name} ({draft_model.source})",
        tensor_parallel=draft_tensor_parallel,
        sliding_window=draft_model.sliding_window,
        sliding_layers=draft_model.sliding_layers,
    )


# ----------------------------------------------------------------------------------------------------------------
# Catalog lookups
# ----------------------------------------------------------------------------------------------------------------


def _hardware_from_row(row: HardwareRow) -> HardwareProfile:
    base = HardwareProfile(
        name=row["name"],
        peak_flops_per_s=row["bf16_dense_tflops"] * 1e12,
        peak_fp8_flops_per_s=None if row["fp8_dense_tflops"] is None else row["fp8_dense_tflops"] * 1e12,
        mem_bandwidth_bytes_per_s=row["mem_bandwidth_gbps"] * 1e9,
        memory_bytes=row["memory_gb"] * GIB,
        nvml_name_contains=row["nvml_name_contains"],
        source=f"{row['source']}; interconnect: {row['interconnect_source']}",
        interconnect_bytes_per_s=row["interconnect_gbps_per_direction"] * 1e9,
    )
    return replace(
        base,
        bandwidth_efficiency=row.get("bandwidth_efficiency", base.bandwidth_efficiency),
        flops_efficiency=row.get("flops_efficiency", base.flops_efficiency),
        step_fixed_s=row.get("step_fixed_s", base.step_fixed_s),
        per_layer_step_s=row.get("per_layer_step_s", base.per_layer_step_s),
        per_request_step_s=row.get("per_request_step_s", base.per_request_step_s),
        per_token_step_s=row.get("per_token_step_s", base.per_token_step_s),
        spec_step_overhead_s=row.get("spec_step_overhead_s", base.spec_step_overhead_s),
        spec_per_request_overhead_s=row.get("spec_per_request_overhead_s", base.spec_per_request_overhead_s),
        draft_step_fixed_s=row.get("draft_step_fixed_s", base.draft_step_fixed_s),
        allreduce_latency_s=row.get("allreduce_latency_s", base.allreduce_latency_s),
        gemm_fill_tokens=row.get("gemm_fill_tokens", base.gemm_fill_tokens),
        efficiency_source=row.get("efficiency_source", base.efficiency_source),
    )


def _model_from_entry(entry: ModelEntry) -> ModelProfile:
    return model_from_hf_config(entry.config, name=entry.name, source=entry.source)


HARDWARE: tuple[HardwareProfile, ...] = tuple(_hardware_from_row(row) for row in HARDWARE_ROWS)
MODELS: tuple[ModelProfile, ...] = tuple(_model_from_entry(entry) for entry in MODEL_ENTRIES)


# A word after the model number that names another card with other numbers: "RTX 3090 Ti" (1008 GB/s), "RTX 4090
# Laptop GPU" (16 GB, 576 GB/s), "RTX 4090 D", "H200 NVL" (~835 dense TFLOP/s), "SUPER", "Max-Q".
_VARIANT_AFTER = r"(?!\s+(?:Ti|Laptop|Mobile|D|NVL|SUPER|Max-Q)(?![A-Za-z0-9]))"


def hardware_for_device_name(name: str) -> HardwareProfile | None:
    """The catalog profile whose `nvml_name_contains` occurs in an NVML / DCGM device name, or None.

    Matching is case-insensitive on whole tokens (so "L4" does not match "NVIDIA L40S", "H200" not "GH200"); the
    longest matching needle wins. A variant word after the needle ("Ti", "Laptop", "D", "NVL", "SUPER", "Max-Q")
    names another card, and a MIG slice is a share of one: both match nothing, so the operator configures them.

    Example: "NVIDIA H100 80GB HBM3" -> h100-sxm; "NVIDIA L40S" -> l40s; "NVIDIA L40" -> l40; "NVIDIA GH200 480GB" ->
    None.
    """
    if re.search(r"(?<![A-Za-z0-9])MIG(?![A-Za-z0-9])", name, flags=re.IGNORECASE):
        return None  # a MIG slice has a share of the card's memory and bandwidth: no whole-card profile fits it
    best: HardwareProfile | None = None
    for profile in HARDWARE:
        needle = profile.nvml_name_contains
        if not needle:
            continue
        pattern = r"(?<![A-Za-z0-9])" + re.escape(needle) + r"(?![A-Za-z0-9])" + _VARIANT_AFTER
        if re.search(pattern, name, flags=re.IGNORECASE) and (
            best is None or len(needle) > len(best.nvml_name_contains or "")
        ):
            best = profile
    return best


HARDWARE_SPEC_KEYS = frozenset(
    {"name", "bf16_dense_tflops", "fp8_dense_tflops", "mem_bandwidth_gbps", "memory_gb",
     "interconnect_gbps_per_direction"}
)
_PCIE4_GBPS = 32.0  # PCIe Gen4 x16 per direction: the interconnect assumed when a spec does not give one


def hardware_from_spec(spec: Mapping[str, object]) -> HardwareProfile:
    """A profile for a GPU the catalog lacks, from its datasheet numbers as an operator gives them (units as the
    catalog's: TFLOP/s dense without sparsity, GB/s, GB of memory): `name`, `bf16_dense_tflops`,
    `mem_bandwidth_gbps`, `memory_gb` required; `fp8_dense_tflops` (none: fp8 runs at the bf16 rate) and
    `interconnect_gbps_per_direction` (default 32, PCIe Gen4) optional. Efficiencies and host overheads are the
    catalog GPUs' defaults, and the source says the numbers are the operator's. Raises ValueError naming the field.

    Example: {"name": "a10g", "bf16_dense_tflops": 70, "mem_bandwidth_gbps": 600, "memory_gb": 24} -> a profile
    streaming at 600e9 x 0.85 B/s with 24 GiB.
    """
    unknown = sorted(set(spec) - HARDWARE_SPEC_KEYS)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}; a hardware spec has {', '.join(sorted(HARDWARE_SPEC_KEYS))}")
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("name: a hardware spec needs a non-empty name")

    def number(key: str, *, required: bool, default: float | None = None) -> float | None:
        value = spec.get(key)
        if value is None:
            if required:
                raise ValueError(f"{key}: required in a hardware spec")
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{key}: must be a positive number, got {value!r}")
        return float(value)

    bf16 = number("bf16_dense_tflops", required=True)
    bandwidth = number("mem_bandwidth_gbps", required=True)
    memory = number("memory_gb", required=True)
    link = number("interconnect_gbps_per_direction", required=False, default=_PCIE4_GBPS)
    assert bf16 is not None and bandwidth is not None and memory is not None and link is not None  # checked above
    row: HardwareRow = {
        "name": name.strip(), "bf16_dense_tflops": bf16, "fp8_dense_tflops": number("fp8_dense_tflops", required=False),
        "mem_bandwidth_gbps": bandwidth, "memory_gb": memory, "nvml_name_contains": None,
        "interconnect_gbps_per_direction": link,
        "interconnect_source": "operator-supplied (default: PCIe Gen4 x16, 32 GB/s per direction)",
        "source": "operator-supplied datasheet numbers (hardware spec); efficiencies and overheads: catalog defaults",
    }
    return _hardware_from_row(row)


def hardware_by_name(name: str) -> HardwareProfile:
    """The catalog hardware profile called `name`: case-insensitive, spaces and underscores read as hyphens, an
    "NVIDIA" prefix dropped, aliases resolved ("h100" -> "h100-sxm", "A100 80GB" -> "a100-80gb-sxm"), and failing
    that a device name as NVML prints it ("NVIDIA H100 80GB HBM3").

    Raises ValueError naming the known profiles. Example: hardware_by_name("H100").mem_bandwidth_bytes_per_s
    = 3.35e12; hardware_by_name("NVIDIA GeForce RTX 3090").name = "rtx3090".
    """
    key = re.sub(r"[\s_-]+", "-", name.strip().lower()).removeprefix("nvidia-")
    key = HARDWARE_ALIASES.get(key, key)
    for profile in HARDWARE:
        if profile.name == key:
            return profile
    # A device name as NVML / DCGM / nvidia-smi print it ("NVIDIA H100 80GB HBM3") names its profile too.
    by_device = hardware_for_device_name(name)
    if by_device is not None:
        return by_device
    names = [p.name for p in HARDWARE]
    raise ValueError(f"unknown hardware {name!r}{_did_you_mean(name, [*names, *HARDWARE_ALIASES])}; known: "
                     f"{', '.join(names)} (aliases: {', '.join(HARDWARE_ALIASES)}), or give its datasheet numbers")


def model_by_name(name: str) -> ModelProfile:
    """The catalog model called `name`: its catalog name or a Hugging Face id, case-insensitive.

    Raises ValueError naming the known models. Example: model_by_name("meta-llama/Llama-3.1-8B-Instruct").params
    ~ 8.03e9.
    """
    key = name.strip().lower()
    for entry, profile in zip(MODEL_ENTRIES, MODELS, strict=True):
        if key == entry.name or key in (hf.lower() for hf in entry.hf_ids):
            return profile
    names = [entry.name for entry in MODEL_ENTRIES]
    raise ValueError(f"unknown model {name!r}{_did_you_mean(name, names)}; known: {', '.join(names)} (or their "
                     "Hugging Face ids), or describe it with its config.json (model_config_path)")


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    """' (did you mean X?)' for the closest known names (difflib's ratio >= 0.6), or ''."""
    close = difflib.get_close_matches(name.strip().lower(), known, n=2)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def model_for_served_name(name: str) -> ModelProfile | None:
    """Best-effort catalog match for a served model name (vLLM's `model_name` label), or None.

    Tries an exact catalog/HF-id match, then the name without its organisation and an "-instruct"/"-it"/"-chat"
    suffix. Example: "meta-llama/Llama-3.1-8B-Instruct" -> llama-3.1-8b; "my-finetune" -> None.
    """
    try:
        return model_by_name(name)
    except ValueError:
        pass
    base = name.strip().lower().rsplit("/", 1)[-1]
    base = re.sub(r"-(instruct|it|chat)(-v?[0-9.]+)?$", "", base)
    base = base.removeprefix("meta-")
    for entry, profile in zip(MODEL_ENTRIES, MODELS, strict=True):
        if base == entry.name:
            return profile
    return None
