"""The step's token budget under an ITL SLO: an option the budget caps serves its cap, at a full step's ITL."""

from __future__ import annotations

from dataclasses import replace

import pytest
from costmodel_builders import make_context, make_evidence

from policies.model.acceptance import acceptance_curve
from policies.model.costmodel import ModelContext, curve_for
from policies.model.objectives import (
    Objective,
    ObjectiveConfig,
    Workload,
    objective_curve,
    slo_share,
    workload_from,
)
from policies.model.roofline import Shape
from policies.model.token_budget import capacity_tokens_per_s
from policies.types import DraftMethod

# E[L] = 1, 1.78, 2.36, 2.79, 3.08 at gamma 0..4.
ACCEPTANCE = acceptance_curve(make_evidence().acceptance, method=DraftMethod.EAGLE3, gamma_max=4)
CTX: ModelContext = replace(make_context(hardware="a100-80gb-sxm", model="llama-3.1-8b"), step_token_budget=512.0)
LOOSE = ObjectiveConfig(itl_slo_s=10.0)  # every option meets it: the SLO's goodput is the throughput


def _queued(*, k: int = 3, on: bool = True, batch: float = 41.0) -> Workload:
    """A queue at gamma k with `batch` sequences and 390 prompt tokens a step: at k 3, 41 x 4 + 390 = 554 >= 0.9 x
    512, every step full (test_token_budget's own workload)."""
    evidence = make_evidence(batch=batch, waiting=60.0, kv_cache_usage_ratio=0.1, context_tokens_per_seq=800.0,
                             prompt_tokens_per_s=2700.0, generation_tokens_per_s=900.0, prefill_tokens_per_step=390.0,
                             speculation_on=on, deployed_k=k)
    return workload_from(evidence, context_tokens=800.0, prefill_tokens=390.0, tokens_per_seq=1.0 + k if on else 1.0,
                         budget_tokens=CTX.step_token_budget)


def _unqueued() -> Workload:
    """No queue, k=3 running 41 sequences with 390 prompt tokens a step at 2100 tokens/s (r 3): every step full."""
    evidence = make_evidence(batch=41.0, waiting=0.0, kv_cache_usage_ratio=0.1, context_tokens_per_seq=800.0,
                             prompt_tokens_per_s=6300.0, generation_tokens_per_s=2100.0, prefill_tokens_per_step=390.0)
    return workload_from(evidence, context_tokens=800.0, prefill_tokens=390.0, tokens_per_seq=3.79,
                         budget_tokens=CTX.step_token_budget)


def test_a_full_budget_under_a_loose_slo_prices_as_throughput_does() -> None:
    # Every option meets a 10 s SLO, so the tokens meeting it are the tokens served: each option serves its cap,
    # S(gamma) = cap(gamma) / cap(0), the same curve the capacity objective gives under the same budget.
    workload = _queued()
    assert workload.budget is not None and workload.budget.full
    slo, objective, why = objective_curve(CTX, ACCEPTANCE, workload, config=LOOSE)
    throughput, plain_objective, _ = objective_curve(CTX, ACCEPTANCE, workload, config=ObjectiveConfig())
    assert objective is Objective.GOODPUT_SLO and plain_objective is Objective.CAPACITY
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, workload.budget, g) for g in range(5)]
    for point in slo[1:]:
        assert point.speedup == pytest.approx(caps[point.gamma] / caps[0], rel=1e-9)
    for ours, theirs in zip(slo, throughput, strict=True):
        assert (ours.speedup, ours.speedup_low, ours.speedup_high) == pytest.approx(
            (theirs.speedup, theirs.speedup_low, theirs.speedup_high), rel=1e-9)
    assert "token budget 512 per step (every step full, prompt/output 3.0)" in why


def test_without_a_budget_the_slo_curve_ignores_it() -> None:
    # The same queue with the budget unknown: every option holds the batch, and drafts serve more; with it, less.
    workload = _queued()
    curve, _, why = objective_curve(CTX, ACCEPTANCE, replace(workload, budget=None), config=LOOSE)
    assert curve[3].speedup > 1.0 > objective_curve(CTX, ACCEPTANCE, workload, config=LOOSE)[0][3].speedup
    assert "token budget" not in why


def test_an_option_the_budget_caps_is_priced_at_a_full_steps_itl() -> None:
    # Off running 120 sequences with a queue and full steps (120 + 390 = 510 tokens): every option but off serves
    # its cap, with fewer sequences a step than the 120 held (gamma 1: 512 / (3 x 1.78 + 2) = 70), so the
    # requests it runs step sooner: its share meeting an ITL SLO is at least the held batch's, its tokens fewer.
    workload = _queued(k=0, on=False, batch=120.0)
    assert workload.budget is not None and workload.budget.full

    def curve(slo_s: float, *, budget: bool) -> tuple:  # type: ignore[type-arg]
        at = workload if budget else replace(workload, budget=None)
        return objective_curve(CTX, ACCEPTANCE, at, config=ObjectiveConfig(itl_slo_s=slo_s))[0]

    budgeted, bare = curve(0.060, budget=True), curve(0.060, budget=False)
    for ours, held in zip(budgeted[1:], bare[1:], strict=True):
        assert ours.slo_share is not None and held.slo_share is not None
        assert ours.slo_share >= held.slo_share
    assert budgeted[1].speedup < bare[1].speedup  # every option meets 60 ms at gamma 1: tokens decide
    assert budgeted[0].slo_share == bare[0].slo_share  # what runs keeps its own ITL
    # At 40 ms no option meets the SLO at the held batch; with the budget, the drafting options' full steps do.
    tight, loose = curve(0.040, budget=True), curve(0.040, budget=False)
    assert all(p.slo_share is not None and p.slo_share < 0.05 for p in loose)
    assert all(p.slo_share is not None and p.slo_share > 0.95 for p in tight[1:])


def test_latency_bound_an_option_that_cannot_hold_the_load_serves_its_cap() -> None:
    # No queue, k=3 running with every step full at 2100 tokens/s, past the model's cap(3) of ~2040: the caps are
    # scaled up to it, and gamma 4's is still under the load. Under a loose SLO it serves cap(4) x scale of the
    # 2100 tokens/s offered, and the reason says it cannot hold the load.
    workload = _unqueued()
    assert workload.budget is not None
    curve, _, why = objective_curve(CTX, ACCEPTANCE, workload, config=LOOSE)
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, workload.budget, g) for g in range(5)]
    scale = max(1.0, workload.budget.served(ACCEPTANCE[3].expected_length) / caps[3])
    short = [g for g in range(1, 5) if g != 3 and caps[g] * scale < 2100.0]
    assert short, "the example needs an option the budget cannot let hold the load"
    for gamma in short:
        assert curve[gamma].speedup == pytest.approx(caps[gamma] * scale / 2100.0, rel=1e-6)
    assert f"gamma {', '.join(map(str, short))} cannot hold 2100 tokens/s" in why
    assert curve[3].speedup == pytest.approx(1.0)  # what runs holds its load; every option meets the SLO


def test_latency_bound_an_option_that_cannot_hold_the_load_meets_the_slo_at_its_full_step() -> None:
    # The workload above under a 19.5 ms SLO: gamma 4 cannot hold the load, so it runs full steps: N 512, r 3, E[L]
    # 3.08: B_4 = 512 / (3 x 3.08 + 5) = 36.0 sequences and P_4 = 36.0 x 9.24 = 332.1 prompt tokens a step; its
    # share meeting the SLO is the modelled share at that step / E[L], the step priced by hand here.
    workload = _unqueued()
    config = ObjectiveConfig(itl_slo_s=0.0195)  # gamma 4's full step: 58 ms / 3.08 = 18.9 ms per token
    curve = objective_curve(CTX, ACCEPTANCE, workload, config=config)[0]
    e = ACCEPTANCE[4].expected_length
    batch = 512.0 / (3.0 * e + 5.0)
    full = curve_for(CTX, ACCEPTANCE, Shape(batch=batch, context_tokens=800.0, prefill_tokens=batch * 3.0 * e))[0]
    share = curve[4].slo_share
    assert share is not None and 0.02 < share < 0.98  # the example is one where the step decides the share
    assert share == pytest.approx(slo_share(full[4].step_time_s / e, config), rel=1e-6)
