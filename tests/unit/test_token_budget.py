"""The step's token budget: verified drafts take prompt tokens' place when every step is full."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from costmodel_builders import make_context, make_evidence

from policies.model.acceptance import acceptance_curve
from policies.model.costmodel import ModelContext, curve_for
from policies.model.objectives import Objective, ObjectiveConfig, objective_curve, workload_from
from policies.model.roofline import Shape
from policies.model.token_budget import BudgetLoad, budget_limited, budget_load, capacity_tokens_per_s
from policies.types import DraftMethod

# E[L] = 1, 1.78, 2.36, 2.79, 3.08 at gamma 0..4.
ACCEPTANCE = acceptance_curve(make_evidence().acceptance, method=DraftMethod.EAGLE3, gamma_max=4)
CTX = make_context(hardware="a100-80gb-sxm", model="llama-3.1-8b")


def _load(*, served: float, tokens_per_step: float, budget: float = 512.0, batch: float = 41.0, prefill: float = 340.0,
          running: int = 3) -> BudgetLoad:
    return BudgetLoad(budget_tokens=budget, prompt_per_output=3.0, served_tokens_per_s=served,
                      tokens_per_step=tokens_per_step, context_tokens=800.0, batch=batch, prefill_tokens=prefill,
                      running=running)


def _curve(batch: float) -> tuple:  # type: ignore[type-arg]
    return curve_for(CTX, ACCEPTANCE, Shape(batch=batch, context_tokens=800.0))[0]


def test_budget_load_needs_a_budget_and_finite_rates() -> None:
    def load(budget: float | None, prompt: float | None, generation: float | None) -> BudgetLoad | None:
        evidence = make_evidence(batch=110.0, speculation_on=False, deployed_k=0, prompt_tokens_per_s=prompt,
                                 generation_tokens_per_s=generation)
        return budget_load(budget, evidence, tokens_per_seq=1.0, prefill_tokens=330.0, context_tokens=800.0)

    assert load(None, 3300.0, 1100.0) is None
    assert load(512.0, math.nan, 1100.0) is None
    assert load(512.0, 3300.0, 0.0) is None
    assert load(0.0, 3300.0, 1100.0) is None
    found = load(512.0, 3300.0, 1100.0)
    assert found is not None
    assert found.prompt_per_output == pytest.approx(3.0)
    assert found.served_tokens_per_s == 1100.0
    assert found.tokens_per_step == pytest.approx(440.0)
    assert not found.full  # 440 < 0.9 x 512
    assert replace(found, tokens_per_step=470.0).full


def test_deeper_drafts_serve_less_when_prompts_fill_the_budget() -> None:
    # r = 3: a request's budget per output token is 3 + (1 + gamma) / E[L]; gamma 4: 3 + 5 / 3.08 = 4.62 against
    # 4.0 off, so at equal step times cap(4) / cap(0) = 4.0 / 4.62 = 0.865; drafting only adds to gamma 4's step.
    load = _load(served=1000.0, tokens_per_step=512.0)
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, load, g) for g in range(5)]
    assert caps == sorted(caps, reverse=True)
    assert 0.6 < caps[4] / caps[0] < 0.865
    # Without prompts the budget holds N / (1 + gamma) sequences: off 512, gamma 4 102 emitting 3.08 each.
    bare = replace(load, prompt_per_output=0.0)
    ratio = capacity_tokens_per_s(CTX, ACCEPTANCE, bare, 4) / capacity_tokens_per_s(CTX, ACCEPTANCE, bare, 0)
    assert 0.5 < ratio < 0.62


def test_a_budget_that_cannot_fill_leaves_the_curve_alone() -> None:
    curve = _curve(8.0)
    load = _load(served=500.0, tokens_per_step=140.0, budget=8192.0, batch=8.0, prefill=100.0, running=0)
    limited, note = budget_limited(curve, CTX, ACCEPTANCE, load, queued=False)  # 8 x 5 + 100 < 8192 at any gamma
    assert limited == curve
    assert note == ""


def test_latency_counts_an_option_that_cannot_hold_the_load_at_what_it_serves() -> None:
    curve = _curve(30.0)
    probe = _load(served=1.0, tokens_per_step=440.0, batch=30.0, prefill=420.0, running=0)
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, probe, g) for g in range(5)]
    served = (caps[1] + caps[2]) / 2  # off and gamma 1 hold it; gamma 2..4 do not
    limited, note = budget_limited(curve, CTX, ACCEPTANCE, replace(probe, served_tokens_per_s=served), queued=False)
    assert limited[1] == curve[1]
    for g in (2, 3, 4):
        assert limited[g].speedup == pytest.approx(caps[g] / served)
        assert limited[g].speedup < 1.0 < curve[g].speedup
    assert "gamma 2, 3, 4 cannot hold" in note


def test_with_every_step_full_each_option_serves_its_budget_capacity() -> None:
    # Running gamma 3 with a queue and full steps: the held-batch curve says drafts pay, the budget says off
    # admits more (gamma 3 holds 512 / (3 x 2.79 + 4) = 41 sequences, off 128).
    curve = _curve(41.0)
    load = _load(served=900.0, tokens_per_step=505.0)
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, load, g) for g in range(5)]
    limited, note = budget_limited(curve, CTX, ACCEPTANCE, load, queued=True)
    assert curve[3].speedup > 1.0
    for g in range(1, 5):
        assert limited[g].speedup == pytest.approx(caps[g] / caps[0])
        assert limited[g].speedup_low <= limited[g].speedup <= limited[g].speedup_high
    assert max(p.speedup for p in limited) == limited[0].speedup == 1.0
    assert "every step full" in note


def test_a_queue_below_the_budget_keeps_the_held_batch_curve_until_a_cap_binds() -> None:
    curve = _curve(41.0)
    roomy = _load(served=300.0, tokens_per_step=300.0)  # steps not full; every cap far above 300 tokens/s
    limited, _ = budget_limited(curve, CTX, ACCEPTANCE, roomy, queued=True)
    assert [p.speedup for p in limited] == pytest.approx([p.speedup for p in curve])


def test_the_objective_prices_the_budget_from_the_evidence() -> None:
    # A queue, gamma 3 running at 41 sequences per step with 390 prompt tokens: 41 x 3.79 + 390 = 545 >= 0.9 x 512.
    evidence = make_evidence(batch=41.0, waiting=60.0, kv_cache_usage_ratio=0.1, context_tokens_per_seq=800.0,
                             prompt_tokens_per_s=2700.0, generation_tokens_per_s=900.0, prefill_tokens_per_step=390.0)
    ctx: ModelContext = replace(CTX, step_token_budget=512.0)
    workload = workload_from(evidence, context_tokens=800.0, prefill_tokens=390.0, tokens_per_seq=3.79,
                             budget_tokens=ctx.step_token_budget)
    assert workload.budget is not None and workload.budget.full
    curve, objective, why = objective_curve(ctx, ACCEPTANCE, workload, config=ObjectiveConfig())
    assert objective is Objective.CAPACITY
    assert "token budget 512 per step (every step full, prompt/output 3.0)" in why
    assert all(p.speedup < 1.0 for p in curve[1:])
    unknown = workload_from(evidence, context_tokens=800.0, prefill_tokens=390.0, tokens_per_seq=3.79)
    assert objective_curve(CTX, ACCEPTANCE, unknown, config=ObjectiveConfig())[0][3].speedup > 1.0


def test_a_budget_below_one_token_is_refused() -> None:
    with pytest.raises(ValueError, match="step_token_budget"):
        replace(CTX, step_token_budget=0.5)
