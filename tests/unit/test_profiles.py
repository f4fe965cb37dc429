"""Profiles and catalog: config.json parsing against published sizes, device-name matching, lookups, drafters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.model.catalog import MODEL_ENTRIES, ModelEntry
from policies.model.profiles import (
    HARDWARE,
    drafter_for,
    hardware_by_name,
    hardware_for_device_name,
    hardware_from_spec,
    model_by_name,
    model_for_served_name,
    model_from_hf_config,
)
from policies.types import DraftMethod


@pytest.mark.parametrize("entry", MODEL_ENTRIES, ids=lambda e: e.name)
def test_catalog_param_counts_match_the_published_sizes(entry: ModelEntry) -> None:
    # The published totals (model cards: 8.03B, 70.6B, 1.24B, 8.2B, 30.5B/3.3B active, 46.7B/12.9B active,
    # 9.24B, 590k, 671B/37B active, 1T/32B active) are independent of the counting formula; 2% covers their
    # rounding (5% for a one-figure "1T"). gpt-oss's card counts 3.6B active without the input embedding table.
    profile = model_by_name(entry.name)
    assert profile.params == pytest.approx(entry.published_params, rel=entry.published_rounding)
    expected_active = entry.published_active_params or entry.published_params
    active = profile.active_params
    if not entry.active_counts_input_embedding:
        active -= profile.input_embedding_params
    assert active == pytest.approx(expected_active, rel=entry.published_rounding)


def test_llama_8b_fields_come_from_its_config() -> None:
    model = model_by_name("llama-3.1-8b")
    assert (model.layers, model.hidden, model.num_heads, model.num_kv_heads, model.head_dim) == (32, 4096, 32, 8, 128)
    assert model.dtype_bytes == 2.0 and model.kv_dtype_bytes == 2.0
    assert not model.is_moe and not model.tied_embeddings
    # 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes = 131072 bytes per token.
    assert model.kv_bytes_per_token == 131072.0
    # Untied: the 128256 x 4096 input table is not streamed per step.
    assert model.input_embedding_params == 128256 * 4096


def test_tiny_llama_is_the_590k_test_model() -> None:
    model = model_by_name("tiny")  # the served name in the CPU capture
    # Tied: 2048 x 128 = 262144 embeddings; per layer attention 4 x 128 x 128 = 65536, MLP 3 x 128 x 256 = 98304,
    # norms 256 -> 164096 x 2 = 328192; + final norm 128 -> 590464.
    assert model.params == 590464
    assert model.tied_embeddings and model.input_embedding_params == 0


def test_moe_config_counts_experts_and_active_params() -> None:
    model = model_by_name("Qwen/Qwen3-30B-A3B")
    assert model.is_moe
    assert (model.num_experts, model.experts_per_token, model.moe_layers) == (128, 8, 48)
    # One expert: 3 x 2048 x 768 = 4718592 parameters per layer.
    assert model.expert_params == 3 * 2048 * 768
    # Active = total - 48 layers x (128 - 8) experts x 4718592.
    assert model.active_params == model.params - 48 * 120 * 3 * 2048 * 768


def test_fp8_and_4bit_quantization_set_weight_bytes_and_keep_bf16_kv() -> None:
    base = dict(MODEL_ENTRIES[0].config)
    fp8 = model_from_hf_config({**base, "quantization_config": {"quant_method": "fp8"}}, name="l8-fp8")
    awq = model_from_hf_config({**base, "quantization_config": {"quant_method": "awq", "bits": 4}}, name="l8-awq")
    ct = model_from_hf_config(
        {**base, "quantization_config": {"quant_method": "compressed-tensors",
                                         "config_groups": {"group_0": {"weights": {"num_bits": 8}}}}},
        name="l8-w8",
    )
    assert (fp8.dtype_bytes, awq.dtype_bytes, ct.dtype_bytes) == (1.0, 0.5, 1.0)
    assert fp8.kv_dtype_bytes == 2.0 and awq.kv_dtype_bytes == 2.0
    assert model_from_hf_config(base, name="x", kv_dtype_bytes=1.0).kv_dtype_bytes == 1.0


def test_nested_text_config_and_defaults() -> None:
    # Multimodal wrappers nest the LM under text_config; head_dim defaults to hidden / heads = 64,
    # KV heads to the attention heads.
    config = {
        "architectures": ["SomeVLM"],
        "text_config": {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
                        "num_attention_heads": 8, "vocab_size": 1000, "torch_dtype": "float32"},
    }
    model = model_from_hf_config(config, name="vlm")
    assert (model.hidden, model.head_dim, model.num_kv_heads, model.dtype_bytes) == (512, 64, 8, 4.0)


def test_missing_required_field_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="num_hidden_layers"):
        model_from_hf_config({"hidden_size": 64, "num_attention_heads": 2, "vocab_size": 10}, name="broken")


def test_the_weight_dtype_is_never_guessed() -> None:
    # bf16 vs fp32 doubles the bytes streamed per step: a missing or unknown dtype is an error, not a default.
    base = {key: value for key, value in MODEL_ENTRIES[0].config.items() if key != "torch_dtype"}
    with pytest.raises(ValueError, match="no torch_dtype"):
        model_from_hf_config(base, name="no-dtype")
    with pytest.raises(ValueError, match="'int3' is not one of"):
        model_from_hf_config({**base, "torch_dtype": "int3"}, name="odd-dtype")
    assert model_from_hf_config({**base, "dtype": "float32"}, name="newer-key").dtype_bytes == 4.0
    # A quantization_config says the bytes itself.
    assert model_from_hf_config({**base, "quantization_config": {"quant_method": "fp8"}}, name="q").dtype_bytes == 1.0


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
        ("NVIDIA L40S", "l40s"),  # must not match the shorter "L4"
        ("NVIDIA L4", "l4"),
        ("nvidia l4", "l4"),
        ("NVIDIA GH200 480GB", None),  # "H200" inside a longer token is another product
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA L40", "l40"),  # whole tokens: "L40" is not "L40S", nor "L4"
        ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb-pcie"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("NVIDIA B200", "b200"),
        ("Tesla T4", None),
        # Other cards whose names extend a catalog one, and a MIG slice: none of them is the catalog card.
        ("NVIDIA GeForce RTX 3090 Ti", None),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", None),
    ],
)
def test_hardware_for_device_name(device: str, expected: str | None) -> None:
    found = hardware_for_device_name(device)
    assert (found.name if found else None) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("A100 80GB", "a100-80gb-sxm"),  # Spec-Bench's column, as papers write it
        ("a100-80gb", "a100-80gb-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),  # nvidia-smi's name: matched as a device name
        ("RTX 3090", "rtx3090"),
        ("nvidia_l40s", "l40s"),
        ("H100-SXM5", "h100-sxm"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"),
        ("GeForce RTX 4090", "rtx4090"),
    ],
)
def test_hardware_names_as_people_and_tools_write_them(name: str, expected: str) -> None:
    assert hardware_by_name(name).name == expected


def test_an_unknown_gpu_is_an_error_listing_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown hardware 'Tesla T4'; known: .*rtx3090"):
        hardware_by_name("Tesla T4")


def test_a_gpu_the_catalog_lacks_is_given_by_its_datasheet_numbers() -> None:
    spec = {"name": "a10g", "bf16_dense_tflops": 70, "mem_bandwidth_gbps": 600, "memory_gb": 24}
    a10g = hardware_from_spec(spec)
    assert (a10g.name, a10g.peak_flops_per_s, a10g.mem_bandwidth_bytes_per_s) == ("a10g", 70e12, 600e9)
    assert a10g.memory_bytes == pytest.approx(24 * 2**30)
    assert a10g.flops_for_dtype(1.0) == pytest.approx(70e12)  # no fp8 rate given: fp8 runs at the bf16 rate
    assert a10g.interconnect_bytes_per_s == pytest.approx(32e9)  # PCIe Gen4 x16 unless told
    assert "operator-supplied" in a10g.source
    # The catalog's own numbers give the catalog's profile, efficiencies and overheads included.
    h100 = hardware_by_name("h100-sxm")
    same = hardware_from_spec({"name": "my-h100", "bf16_dense_tflops": 989.4, "fp8_dense_tflops": 1978.9,
                               "mem_bandwidth_gbps": 3350, "memory_gb": 80, "interconnect_gbps_per_direction": 450})
    assert same == replace(h100, name="my-h100", nvml_name_contains=None, source=same.source)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"bf16_dense_tflops": 70, "mem_bandwidth_gbps": 600, "memory_gb": 24}, "name"),
        ({"name": "x", "mem_bandwidth_gbps": 600, "memory_gb": 24}, "bf16_dense_tflops"),
        ({"name": "x", "bf16_dense_tflops": -1, "mem_bandwidth_gbps": 600, "memory_gb": 24}, "bf16_dense_tflops"),
        ({"name": "x", "bf16_dense_tflops": 70, "mem_bandwidth_gbps": True, "memory_gb": 24}, "mem_bandwidth_gbps"),
        ({"name": "x", "bf16_dense_tflops": 70, "mem_bandwidth_gbps": 600, "memory_gb": float("nan")}, "memory_gb"),
        ({"name": "x", "bf16_dense_tflops": 70, "mem_bandwidth_gbps": 600, "memory_gb": 24, "tflops": 1}, "'tflops'"),
    ],
)
def test_a_hardware_spec_names_what_is_wrong(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        hardware_from_spec(spec)


def test_hardware_units_are_converted_from_the_datasheet() -> None:
    h100 = hardware_by_name("H100")  # alias
    # hardware.csv: 989.4 TFLOP/s bf16, 1978.9 fp8, 3350 GB/s, 80 GB (of memory: GiB).
    assert h100.peak_flops_per_s == pytest.approx(989.4e12)
    assert h100.flops_for_dtype(1.0) == pytest.approx(1978.9e12)
    assert h100.flops_for_dtype(2.0) == pytest.approx(989.4e12)
    assert h100.mem_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert h100.memory_bytes == pytest.approx(80 * 2**30)  # datasheet GB of memory are GiB
    # A100 has no fp8 tensor peak: fp8 weights run at the bf16 peak.
    assert hardware_by_name("a100-80gb-sxm").flops_for_dtype(1.0) == pytest.approx(312e12)
    # GeForce tensor math with fp32 accumulation: half the fp16-accumulate rate (GA102 whitepaper: 71 vs 142).
    assert hardware_by_name("3090").peak_flops_per_s == pytest.approx(71e12)
    assert hardware_by_name("rtx3090").mem_bandwidth_bytes_per_s == pytest.approx(936e9)
    assert {p.name for p in HARDWARE} >= {"h100-sxm", "h200", "l4", "l40s", "mi300x", "cpu"}
    assert all(p.source for p in HARDWARE)


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ValueError, match="h100-sxm"):
        hardware_by_name("tpu-v5")
    with pytest.raises(ValueError, match=r"llama-3\.1-8b"):
        model_by_name("gpt-5")


def test_served_name_matching() -> None:
    assert model_for_served_name("meta-llama/Llama-3.1-70B-Instruct") == model_by_name("llama-3.1-70b")
    assert model_for_served_name("someorg/Qwen3-8B-Instruct") == model_by_name("qwen3-8b")
    assert model_for_served_name("my-finetune") is None


def test_drafters_by_method() -> None:
    target = model_by_name("llama-3.1-8b")
    # EAGLE-3: one llama layer (41.94M attention + 176.16M MLP + 8192 norms) + fc 3 x 4096^2 + 32000 x 4096.
    layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    eagle3 = drafter_for(DraftMethod.EAGLE3, target)
    assert eagle3.params == layer + 3 * 4096 * 4096 + 32000 * 4096
    assert eagle3.layers == 1 and eagle3.num_kv_heads == 8
    # EAGLE-1 evaluates the full 128256-token lm_head.
    assert drafter_for(DraftMethod.EAGLE, target).params == layer + 2 * 4096 * 4096 + 128256 * 4096
    ngram = drafter_for(DraftMethod.NGRAM, target)
    assert ngram.params == 0 and ngram.host_time_per_request_s > 0
    small = model_by_name("llama-3.2-1b")
    draft = drafter_for(DraftMethod.DRAFT_MODEL, target, draft_model=small)
    # Tied embeddings: every parameter is streamed, the 16 layers carry their own KV cache.
    assert draft.params == small.params and draft.layers == 16
    with pytest.raises(ValueError, match="draft_model"):
        drafter_for(DraftMethod.DRAFT_MODEL, target)
