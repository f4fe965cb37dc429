"""Bytes per weight from a Hugging Face `config.json`'s `quantization_config` (or its `torch_dtype`).

A decode step streams every weight it uses once, so bytes per parameter set the memory-bound step time outright:
a guessed precision would change the answer silently. Hence every quantisation method is read explicitly, and a
method this table does not know is an error that names it (never a fallback to `torch_dtype`).

Bytes per parameter, scales included (the scales are the format's own, per its specification):

    method (quant_method / quant_algo)          bytes per weight
    fp8, fbgemm_fp8, ptpc_fp8, modelopt FP8     1                       (block or channel scales: < 0.1%)
    mxfp4 (OCP microscaling)                    4/8 + 1/32 = 0.53125    (E2M1 values, one E8M0 scale per 32)
    modelopt NVFP4                              4/8 + 1/16 = 0.5625     (E2M1 values, one FP8 scale per 16)
    awq, gptq, *_marlin, compressed-tensors     bits/8 + 2/group_size   (an fp16 scale per group; no group: bits/8)
    bitsandbytes load_in_4bit / load_in_8bit    0.5 + 1/64 / 1          (NF4 with an fp8 absmax per 64; int8)

Which weights are quantised: all of them, unless the config lists modules left in `torch_dtype`
(`modules_to_not_convert`, `ignore`, `exclude_modules`). When that list names the attention (gpt-oss: self_attn,
router, embeddings and lm_head stay bf16 beside MXFP4 experts), only the routed experts take the quantised bytes
and the rest is read at `torch_dtype`; the two are returned apart (`WeightBytes`).

Example: gpt-oss-20b (`{"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", ...]}`,
torch_dtype bfloat16) -> dense 2.0, experts 0.53125; Llama-3.1-8B AWQ (bits 4, group_size 128) -> 0.5 + 2/128 =
0.515625 for every weight; `{"quant_method": "hqq"}` -> ValueError naming "hqq" and the known methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DTYPE_BYTES: Mapping[str, float] = {
    "float32": 4.0, "fp32": 4.0, "float": 4.0,
    "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "half": 2.0,
    "float8_e4m3fn": 1.0, "float8_e5m2": 1.0, "fp8": 1.0,
}
MXFP4_BYTES = 0.5 + 1.0 / 32.0
NVFP4_BYTES = 0.5 + 1.0 / 16.0
NF4_BYTES = 0.5 + 1.0 / 64.0
_FP8_METHODS = frozenset({"fp8", "fbgemm_fp8", "ptpc_fp8"})
_INTEGER_METHODS = frozenset({"awq", "gptq", "awq_marlin", "gptq_marlin", "marlin", "compressed-tensors",
                              "compressed_tensors"})
KNOWN_METHODS = tuple(sorted({*_FP8_METHODS, *_INTEGER_METHODS, "mxfp4", "modelopt", "bitsandbytes"}))
_NOT_CONVERTED_KEYS = ("modules_to_not_convert", "ignore", "exclude_modules")


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Bytes per parameter of the dense weights (attention, dense MLPs, embeddings, shared experts) and of the
    routed experts, and the method that set them ("" for plain `torch_dtype`)."""

    dense: float
    experts: float
    method: str = ""


def weight_bytes(config: Mapping[str, object]) -> WeightBytes:
    """The weights' bytes per parameter for a parsed `config.json` (module docstring). Raises ValueError naming
    the field when the precision cannot be read: no `torch_dtype`/`dtype` and no `quantization_config`, an unknown
    dtype, an unknown quantisation method, or a method without the bits it needs.

    Example: {"torch_dtype": "bfloat16"} -> WeightBytes(2.0, 2.0); {"torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8"}} -> WeightBytes(1.0, 1.0, "fp8").
    """
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        plain = _torch_dtype_bytes(config, required=True)
        assert plain is not None  # required
        return WeightBytes(plain, plain)
    method = str(quant.get("quant_method", "")).strip().lower()
    quantised = _quantised_bytes(quant, method)
    if _keeps_attention(quant):
        dense = _torch_dtype_bytes(config, required=False)
        if dense is not None:
            return WeightBytes(dense, quantised, method)
    return WeightBytes(quantised, quantised, method)


def _quantised_bytes(quant: Mapping[str, object], method: str) -> float:
    algo = str(quant.get("quant_algo", "")).strip().upper()
    if method in _FP8_METHODS or (method == "modelopt" and "FP8" in algo and "FP4" not in algo):
        return 1.0
    if method == "mxfp4":
        return MXFP4_BYTES
    if method == "modelopt" and "NVFP4" in algo:
        return NVFP4_BYTES
    if method == "bitsandbytes":
        if quant.get("load_in_4bit") is True:
            return NF4_BYTES
        if quant.get("load_in_8bit") is True:
            return 1.0
        raise ValueError("quantization_config: bitsandbytes without load_in_4bit or load_in_8bit")
    bits, group = _bits(quant)
    if bits is not None and (method in _INTEGER_METHODS or method in {"", "modelopt"}):
        return bits / 8.0 + (2.0 / group if group else 0.0)
    if method in _INTEGER_METHODS or method == "modelopt":
        raise ValueError(
            f"quantization_config: quant_method {method!r}"
            + (f" quant_algo {algo!r}" if algo else "")
            + " states no weight bits (bits, w_bit, or config_groups.*.weights.num_bits)"
        )
    raise ValueError(
        f"quantization_config: quant_method {method!r} is not one the cost model understands (known: "
        f"{', '.join(KNOWN_METHODS)}); its bytes per weight set the step time, so it is not guessed. Give the "
        "served weights' precision instead: torch_dtype, or a quantization_config with bits"
    )


def _bits(quant: Mapping[str, object]) -> tuple[float | None, float | None]:
    """(weight bits, group size) from `bits`/`w_bit` + `group_size`/`q_group_size`, or compressed-tensors'
    `config_groups.*.weights` (`num_bits`, `group_size`); (None, None) when absent."""
    bits = _int(quant.get("bits", quant.get("w_bit")))
    if bits is not None:
        return float(bits), _positive(quant.get("group_size", quant.get("q_group_size")))
    groups = quant.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping):
                nbits = _int(weights.get("num_bits"))
                if nbits is not None:
                    return float(nbits), _positive(weights.get("group_size"))
    return None, None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _positive(value: object) -> float | None:
    number = _int(value)
    return float(number) if number is not None else None


def _keeps_attention(quant: Mapping[str, object]) -> bool:
    """Whether the config leaves the attention weights unquantised (a not-converted list naming them)."""
    for key in _NOT_CONVERTED_KEYS:
        names = quant.get(key)
        if isinstance(names, list | tuple) and any("attn" in str(name).lower() for name in names):
            return True
    return False


def _torch_dtype_bytes(config: Mapping[str, object], *, required: bool) -> float | None:
    dtype = config.get("torch_dtype", config.get("dtype"))
    if dtype is None:
        if not required:
            return None
        raise ValueError(
            "config.json has no torch_dtype (or dtype) and no quantization_config: the weights' bytes per element "
            'are unknown; add the model\'s dtype, e.g. "torch_dtype": "bfloat16"'
        )
    known = DTYPE_BYTES.get(str(dtype).lower())
    if known is None:
        raise ValueError(f"config.json torch_dtype {dtype!r} is not one of {', '.join(sorted(DTYPE_BYTES))}")
    return known
