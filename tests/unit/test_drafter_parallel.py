"""A draft model's own tensor-parallel degree and sliding window: what its passes stream, all-reduce and hold."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import pytest

from policies.model.calibrate import log_step_and_slopes
from policies.model.costmodel import ModelContext
from policies.model.kv_capacity import memory_fit
from policies.model.profiles import DrafterProfile, drafter_for, hardware_by_name, model_by_name
from policies.model.roofline import CostScales, Shape, drafting_time, step_components, target_step_time
from policies.offline.whatif import AcceptanceSpec, WhatIfInput, WhatIfInputError, build_context
from policies.types import DraftMethod

H100 = hardware_by_name("h100-sxm")
TARGET = model_by_name("llama-3.1-70b")
DRAFT = model_by_name("llama-3.2-1b")


def _drafter(degree: int) -> DrafterProfile:
    return drafter_for(DraftMethod.DRAFT_MODEL, TARGET, draft_model=DRAFT, draft_tensor_parallel=degree)


def test_a_draft_model_on_one_gpu_streams_its_whole_weights_without_all_reduce() -> None:
    one = drafter_for(DraftMethod.DRAFT_MODEL, TARGET, draft_model=DRAFT, draft_tensor_parallel=1)
    shared = drafter_for(DraftMethod.DRAFT_MODEL, TARGET, draft_model=DRAFT)  # the target's degree, 4
    shape = Shape(batch=8.0, context_tokens=0.0)
    bandwidth = H100.mem_bandwidth_bytes_per_s * H100.bandwidth_efficiency
    weights = (DRAFT.params - DRAFT.input_embedding_params) * DRAFT.dtype_bytes
    alone = step_components(H100, TARGET, one, shape, draft_passes=1, tensor_parallel=4)
    sharded = step_components(H100, TARGET, shared, shape, draft_passes=1, tensor_parallel=4)
    # One GPU reads all of it; four read a quarter each.
    assert alone.draft_memory_s == pytest.approx(weights / bandwidth)
    assert sharded.draft_memory_s == pytest.approx(weights / 4 / bandwidth)
    # Each of the 16 draft layers all-reduces twice across 4 GPUs: latency plus the ring's share of 8 x 2048 x 2 B.
    ring = 2.0 * 3.0 / 4.0 * 8 * DRAFT.hidden * 2.0 / H100.interconnect_bytes_per_s
    assert alone.draft_allreduce_s == 0.0
    assert sharded.draft_allreduce_s == pytest.approx(2 * 16 * (H100.allreduce_latency_s + ring))
    assert alone.draft_fixed_s == sharded.draft_fixed_s == pytest.approx(H100.draft_step_fixed_s)
    # drafting_time prices the same passes.
    timed = drafting_time(H100, one, shape, gamma=1, tensor_parallel=4)
    assert timed.weight_bytes == pytest.approx(weights)


def test_a_draft_models_sliding_layers_read_at_most_their_window() -> None:
    windowed = dataclasses.replace(_drafter(1), sliding_window=4096, sliding_layers=8)
    full = _drafter(1)
    long = Shape(batch=4.0, context_tokens=32768.0)
    per_token = 16 * 8 * 64 * 2 * 2.0  # layers x KV heads x head_dim x (K, V) x bf16
    bandwidth = H100.mem_bandwidth_bytes_per_s * H100.bandwidth_efficiency
    gap = (
        step_components(H100, TARGET, full, long, draft_passes=1, tensor_parallel=4).draft_memory_s
        - step_components(H100, TARGET, windowed, long, draft_passes=1, tensor_parallel=4).draft_memory_s
    )
    # Half the layers read 4096 cached tokens instead of 32768: (32768 - 4096) / 2 fewer per sequence.
    assert gap == pytest.approx(4 * per_token * (32768 - 4096) / 2 / bandwidth)


def test_the_gpu_holding_a_one_gpu_draft_model_fills_first() -> None:
    one = ModelContext(hardware=H100, model=TARGET, drafter=_drafter(1), tensor_parallel=4)
    shared = dataclasses.replace(one, drafter=_drafter(0))
    weights = (DRAFT.params - DRAFT.input_embedding_params) * DRAFT.dtype_bytes
    alone = memory_fit(one, batch=8.0, context_tokens=4096.0, gamma=3)
    spread = memory_fit(shared, batch=8.0, context_tokens=4096.0, gamma=3)
    assert alone.weights_bytes - spread.weights_bytes == pytest.approx(weights * 3 / 4)
    assert alone.max_batch < spread.max_batch


def _input(**overrides: Any) -> WhatIfInput:
    base = WhatIfInput(
        hardware="h100-sxm", target_model="llama-3.1-70b", drafter_method=DraftMethod.DRAFT_MODEL,
        draft_model="llama-3.2-1b", acceptance=AcceptanceSpec(iid_rate=0.7), batch_sizes=(1.0,),
        context_lengths=(1024.0,), gammas=(0, 3), tensor_parallel=4,
    )
    return dataclasses.replace(base, **overrides)


@pytest.mark.parametrize("overrides", [
    {"draft_tensor_parallel": 8},  # more GPUs than the target has
    {"draft_tensor_parallel": 2},  # vLLM runs a draft model on 1 GPU or on the target's
    {"draft_tensor_parallel": 0},
    {"drafter_method": DraftMethod.EAGLE3, "draft_model": None, "draft_tensor_parallel": 1},  # a head: target's
])
def test_a_drafter_degree_the_deployment_cannot_have_names_its_field(overrides: dict[str, Any]) -> None:
    with pytest.raises(WhatIfInputError) as caught:
        build_context(_input(**overrides))
    assert caught.value.field == "drafter.tensor_parallel"


def test_a_whatif_draft_model_on_one_gpu_is_priced_there() -> None:
    assert build_context(_input(draft_tensor_parallel=1)).drafter.degree(4) == 1
    assert build_context(_input()).drafter.degree(4) == 4


@pytest.mark.parametrize("degree", [0, 1])
def test_the_fitters_jacobian_prices_the_draft_passes_comms(degree: int) -> None:
    # The draft all-reduce is its own term (the drafter's scale, no roofline side): the fitter's analytic
    # derivatives must still be those of StepComponents.total_s.
    components = step_components(H100, TARGET, _drafter(degree), Shape(batch=8.0, context_tokens=2048.0,
                                 tokens_per_seq=4.0), draft_passes=3, tensor_parallel=4)
    x = (-0.3, 0.1, 0.4, 0.2, -0.5, 0.3, 0.25, -0.2, 0.1)

    def scales(at: Sequence[float]) -> CostScales:
        e = [math.exp(v) for v in at[:8]]
        return CostScales(memory=e[0], compute=e[1], overhead=e[2], per_request=e[3], per_token=e[4], draft=e[5],
                          spec=e[6], fill=e[7], gemm_slope=at[8])

    shape = Shape(batch=8.0, context_tokens=2048.0, tokens_per_seq=4.0)
    whole = target_step_time(H100, TARGET, shape, tensor_parallel=4).total_s + drafting_time(
        H100, _drafter(degree), shape, gamma=3, tensor_parallel=4).total_s
    assert components.total_s() == pytest.approx(whole)
    log_t, slopes = log_step_and_slopes(components, x)
    assert log_t == pytest.approx(math.log(components.total_s(scales(x))), abs=1e-12)
    for j in range(9):
        moved = list(x)
        moved[j] += 1e-7
        assert slopes[j] == pytest.approx((math.log(components.total_s(scales(moved))) - log_t) / 1e-7, abs=1e-5)


def test_a_draft_models_window_comes_from_its_config_and_heads_refuse_a_degree() -> None:
    draft = model_by_name("gpt-oss-20b")  # 12 of its 24 layers slide over 128 tokens
    assert (draft.sliding_window, draft.sliding_layers) == (128, 12)
    drafter = drafter_for(DraftMethod.DRAFT_MODEL, TARGET, draft_model=draft)
    assert (drafter.sliding_window, drafter.sliding_layers) == (128, 12)
    assert drafter.attended_context(4096.0) == pytest.approx((12 * 4096 + 12 * 128) / 24)
    with pytest.raises(ValueError, match="draft_model only"):
        drafter_for(DraftMethod.EAGLE3, TARGET, draft_tensor_parallel=1)
    with pytest.raises(ValueError, match="tensor_parallel"):
        ModelContext(hardware=H100, model=TARGET, drafter=_drafter(8), tensor_parallel=4)


def test_a_head_at_the_targets_degree_all_reduces_like_one_of_its_layers() -> None:
    head = drafter_for(DraftMethod.EAGLE3, TARGET)  # one decoder layer, run where the target runs
    shape = Shape(batch=16.0, context_tokens=1024.0)
    ring = 2.0 * 7.0 / 8.0 * 16 * TARGET.hidden * 2.0 / H100.interconnect_bytes_per_s
    at_8 = step_components(H100, TARGET, head, shape, draft_passes=2, tensor_parallel=8)
    assert at_8.draft_allreduce_s == pytest.approx(2 * 1 * (H100.allreduce_latency_s + ring))
    assert step_components(H100, TARGET, head, shape, draft_passes=2, tensor_parallel=1).draft_allreduce_s == 0.0
