"""Memory fit of a (batch, context, gamma) on one GPU (policies/model/kv_capacity.py): every expectation by hand."""

from __future__ import annotations

import pytest

from policies.model.costmodel import ModelContext
from policies.model.kv_capacity import memory_fit
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.types import DraftMethod

LLAMA8B = model_by_name("llama-3.1-8b")  # 8.03e9 params bf16; 32 layers x 8 KV heads x 128 x 2 x 2 = 131072 B/token


def context(hardware: str, method: DraftMethod, *, tp: int = 1, model: str = "llama-3.1-8b") -> ModelContext:
    target = model_by_name(model)
    return ModelContext(hardware_by_name(hardware), target, drafter_for(method, target), tensor_parallel=tp)


GIB = 2**30


def test_the_worked_example() -> None:
    fit = memory_fit(context("h100-sxm", DraftMethod.EAGLE3), batch=128, context_tokens=4096, gamma=3)
    head = drafter_for(DraftMethod.EAGLE3, LLAMA8B)
    assert fit.budget_bytes == pytest.approx(80 * GIB * 0.9)
    assert fit.weights_bytes == pytest.approx(LLAMA8B.params * 2 + head.params * 2)
    # 131072 B per target token over ctx + gamma; the head's one layer, 8 KV heads x 128 x 2 bytes x 2 = 4096 B per
    # context token.
    assert fit.kv_bytes_per_seq == pytest.approx(131072 * 4099 + 4096 * 4096)
    assert fit.max_batch == pytest.approx((80 * GIB * 0.9 - fit.weights_bytes) / fit.kv_bytes_per_seq)
    assert fit.max_batch == pytest.approx(109.1, abs=0.05)
    assert not fit.fits
    assert memory_fit(context("h100-sxm", DraftMethod.EAGLE3), batch=64, context_tokens=4096, gamma=3).fits


def test_speculation_off_holds_no_drafter() -> None:
    # Off is a server without the drafter (--speculative-config removed): neither its weights nor its cache. With a
    # Llama-3.2-1B draft model on a 24 GB L4 at ctx 4096: off holds (0.9 x 24 GiB - 16.06 GB) / 537 MB = 10.3
    # sequences; drafting adds 2.47 GB of draft weights and 32768 B/token of its own KV.
    target = LLAMA8B
    draft = model_by_name("llama-3.2-1b")
    ctx = ModelContext(hardware_by_name("l4"), target, drafter_for(DraftMethod.DRAFT_MODEL, target, draft_model=draft))
    off = memory_fit(ctx, batch=8, context_tokens=4096, gamma=0)
    on = memory_fit(ctx, batch=8, context_tokens=4096, gamma=3)
    assert off.weights_bytes == pytest.approx(target.params * 2)
    assert off.kv_bytes_per_seq == pytest.approx(131072 * 4096)
    assert off.max_batch == pytest.approx((0.9 * 24 * GIB - target.params * 2) / (131072 * 4096), rel=1e-6)
    assert off.fits
    assert on.weights_bytes == pytest.approx((target.params + draft.params) * 2)
    assert on.kv_bytes_per_seq == pytest.approx(131072 * 4099 + 32768 * 4096)
    assert not on.fits


def test_an_ngram_drafter_keeps_no_cache_and_no_weights() -> None:
    fit = memory_fit(context("h100-sxm", DraftMethod.NGRAM), batch=1, context_tokens=1000, gamma=4)
    assert fit.weights_bytes == pytest.approx(LLAMA8B.params * 2)
    assert fit.kv_bytes_per_seq == pytest.approx(131072 * 1004)


def test_tensor_parallel_shards_weights_and_kv_heads_until_they_run_out() -> None:
    one = memory_fit(context("h100-sxm", DraftMethod.NGRAM), batch=1, context_tokens=1000, gamma=0)
    eight = memory_fit(context("h100-sxm", DraftMethod.NGRAM, tp=8), batch=1, context_tokens=1000, gamma=0)
    sixteen = memory_fit(context("h100-sxm", DraftMethod.NGRAM, tp=16), batch=1, context_tokens=1000, gamma=0)
    assert eight.weights_bytes == pytest.approx(one.weights_bytes / 8)
    assert eight.kv_bytes_per_seq == pytest.approx(one.kv_bytes_per_seq / 8)
    # 8 KV heads over 16 GPUs: each GPU still holds one head (replicated), so KV per GPU stops shrinking.
    assert sixteen.kv_bytes_per_seq == pytest.approx(eight.kv_bytes_per_seq)
    assert sixteen.weights_bytes == pytest.approx(one.weights_bytes / 16)


def test_weights_that_do_not_fit_leave_no_batch() -> None:
    # Llama-3.1-70B in bf16 is ~141 GB: more than a 24 GiB L4 at 0.9, whatever the batch.
    fit = memory_fit(context("l4", DraftMethod.NGRAM, model="llama-3.1-70b"), batch=1, context_tokens=128, gamma=0)
    assert fit.weights_bytes > fit.budget_bytes
    assert fit.max_batch == 0.0
    assert not fit.fits


@pytest.mark.parametrize("utilization", [0.0, -0.1, 1.01])
def test_the_utilization_must_be_a_share(utilization: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        memory_fit(context("h100-sxm", DraftMethod.NGRAM), batch=1, context_tokens=1, gamma=0,
                   gpu_memory_utilization=utilization)
