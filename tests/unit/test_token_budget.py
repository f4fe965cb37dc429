"""The step's token budget: verified drafts take prompt tokens' place when every step is full."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
from costmodel_builders import make_context, make_evidence

from policies.model.acceptance import acceptance_curve
from policies.model.costmodel import ModelContext, curve_for
from policies.model.objectives import Objective, ObjectiveConfig, objective_curve, workload_from
from policies.model.roofline import Shape
from policies.model.token_budget import BudgetLoad, Regime, budget_limited, budget_load, capacity_tokens_per_s
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
    # 8 x 5 + 100 < 8192 at any gamma
    limited, note = budget_limited(curve, CTX, ACCEPTANCE, load, regime=Regime.LATENCY)
    assert limited == curve
    assert note == ""


def test_latency_counts_an_option_that_cannot_hold_the_load_at_what_it_serves() -> None:
    curve = _curve(30.0)
    probe = _load(served=1.0, tokens_per_step=440.0, batch=30.0, prefill=420.0, running=0)
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, probe, g) for g in range(5)]
    served = (caps[1] + caps[2]) / 2  # off and gamma 1 hold it; gamma 2..4 do not
    limited, note = budget_limited(curve, CTX, ACCEPTANCE, replace(probe, served_tokens_per_s=served),
                                   regime=Regime.LATENCY)
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
    limited, note = budget_limited(curve, CTX, ACCEPTANCE, load, regime=Regime.CAPACITY)
    assert curve[3].speedup > 1.0
    for g in range(1, 5):
        assert limited[g].speedup == pytest.approx(caps[g] / caps[0])
        assert limited[g].speedup_low <= limited[g].speedup <= limited[g].speedup_high
    assert max(p.speedup for p in limited) == limited[0].speedup == 1.0
    assert "every step full" in note


def test_a_queue_below_the_budget_keeps_the_held_batch_curve_until_a_cap_binds() -> None:
    curve = _curve(41.0)
    roomy = _load(served=300.0, tokens_per_step=300.0)  # steps not full; every cap far above 300 tokens/s
    limited, _ = budget_limited(curve, CTX, ACCEPTANCE, roomy, regime=Regime.CAPACITY)
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


def test_cap_is_the_full_budget_split_by_the_served_mix() -> None:
    # By hand: N 512, r 3, gamma 3 with E[L] 2.79: B = 512 / (3 x 2.79 + 4) = 41.39 sequences verifying 4 tokens
    # (165.6) and P = 512 x 8.37 / 12.37 = 346.4 prompt tokens; the step at that shape, drafting included.
    load = _load(served=1.0, tokens_per_step=512.0)
    e = ACCEPTANCE[3].expected_length
    batch = 512.0 / (3.0 * e + 4.0)
    prefill = 512.0 - 4.0 * batch
    assert batch == pytest.approx(41.39, abs=0.01) and prefill == pytest.approx(346.4, abs=0.1)
    step = curve_for(CTX, ACCEPTANCE[:4], Shape(batch=batch, context_tokens=800.0, prefill_tokens=prefill))[0][3]
    assert capacity_tokens_per_s(CTX, ACCEPTANCE, load, 3) == pytest.approx(batch * e / step.step_time_s)


def test_the_load_served_is_one_engines() -> None:
    # Four data-parallel engines summed on one page: the load one engine serves is a quarter of the page's rate;
    # with a measured step, the lesser of that and B x E[L] / T from the window's own steps.
    evidence = make_evidence(batch=110.0, speculation_on=False, deployed_k=0, prompt_tokens_per_s=13200.0,
                             generation_tokens_per_s=4400.0, engines=4)
    load = budget_load(512.0, evidence, tokens_per_seq=1.0, prefill_tokens=330.0, context_tokens=800.0)
    assert load is not None and load.step_time_s is None
    assert load.served_tokens_per_s == pytest.approx(1100.0) and load.served(1.0) == pytest.approx(1100.0)
    assert load.prompt_per_output == pytest.approx(3.0)
    timed = replace(load, step_time_s=0.2)
    assert timed.served(1.0) == pytest.approx(550.0)  # 110 sequences x 1 token / 0.2 s: less than 1100
    assert timed.served(2.79) == pytest.approx(1100.0)  # 1534 while stepping, 1100 on average


def test_an_option_the_model_underprices_is_anchored_on_what_runs() -> None:
    # Running gamma 1 without a queue at 1.5 x the capacity the model gives it: every cap is scaled by 1.5, so off
    # (more capacity than gamma 1) holds the load and gamma 2..4 (less) are counted at cap(g) / cap(1).
    curve = _curve(30.0)
    probe = _load(served=1.0, tokens_per_step=440.0, batch=30.0, prefill=380.0, running=1)
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, probe, g) for g in range(5)]
    assert caps[0] > caps[1] > caps[2]
    limited, note = budget_limited(curve, CTX, ACCEPTANCE, replace(probe, served_tokens_per_s=caps[1] * 1.5),
                                   regime=Regime.LATENCY)
    assert limited[1] == curve[1]
    for g in (2, 3, 4):
        assert limited[g].speedup == pytest.approx(min(curve[g].speedup, caps[g] / caps[1]))
    assert "gamma 2, 3, 4 cannot hold" in note


def test_the_running_option_always_holds_its_own_load() -> None:
    # D a hair above the running option's scaled cap (floating point): it still holds, its speedup stays.
    curve = _curve(30.0)
    probe = _load(served=1.0, tokens_per_step=440.0, batch=30.0, prefill=300.0, running=3)
    cap3 = capacity_tokens_per_s(CTX, ACCEPTANCE, probe, 3)
    for served in (cap3 * 1.7, cap3 * (1.7 + 1e-12), 4082.21):
        limited, note = budget_limited(curve, CTX, ACCEPTANCE, replace(probe, served_tokens_per_s=served),
                                       regime=Regime.LATENCY)
        assert limited[3] == curve[3]
        short = re.search(r"gamma ([\d, ]+) cannot hold", note)
        assert short is None or "3" not in short.group(1).split(", ")


def test_with_steps_full_while_off_runs_each_option_serves_its_cap() -> None:
    curve = _curve(120.0)
    load = _load(served=1500.0, tokens_per_step=500.0, batch=120.0, prefill=380.0, running=0)
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, load, g) for g in range(5)]
    limited, _ = budget_limited(curve, CTX, ACCEPTANCE, load, regime=Regime.CAPACITY)
    for g in range(1, 5):
        assert limited[g].speedup == pytest.approx(caps[g] / caps[0])


def test_a_kv_bound_queue_keeps_the_held_batch_as_a_limit() -> None:
    # The KV cache limits the held batch: each option serves min(its held-batch rate, its cap), off included,
    # where with the budget the only limit (test above) every option serves its cap.
    curve = _curve(41.0)
    load = _load(served=900.0, tokens_per_step=505.0)
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, load, g) for g in range(5)]
    scale = 900.0 / caps[3]
    kv, _ = budget_limited(curve, CTX, ACCEPTANCE, load, regime=Regime.CAPACITY_KV)
    plain = min(900.0 / curve[3].speedup, caps[0] * scale)
    for g in range(1, 5):
        rate = min(900.0 * curve[g].speedup / curve[3].speedup, caps[g] * scale)
        assert kv[g].speedup == pytest.approx(rate / plain)
    assert kv[1].speedup > 1.0 > budget_limited(curve, CTX, ACCEPTANCE, load, regime=Regime.CAPACITY)[0][1].speedup


def test_a_running_gamma_past_the_curve_leaves_it_alone() -> None:
    curve = _curve(41.0)
    load = _load(served=900.0, tokens_per_step=505.0, running=6)
    assert budget_limited(curve, CTX, ACCEPTANCE, load, regime=Regime.CAPACITY) == (curve, "")


def test_a_fleet_summed_page_prices_one_engines_load() -> None:
    # Ten replicas summed by Prometheus read as one engine with ten times the tokens: the load the budget is
    # weighed against is one engine's, B x E[L] / T from the window's steps, so the curve is the one engine's.
    curve = _curve(30.0)
    probe = _load(served=1.0, tokens_per_step=440.0, batch=30.0, prefill=420.0, running=0)
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, probe, g) for g in range(5)]
    one = (caps[1] + caps[2]) / 2
    engine, _ = budget_limited(curve, CTX, ACCEPTANCE, replace(probe, served_tokens_per_s=one), regime=Regime.LATENCY)
    fleet = replace(probe, served_tokens_per_s=10 * one, step_time_s=30.0 * 1.0 / one)
    assert fleet.served(1.0) == pytest.approx(one)
    summed, _ = budget_limited(curve, CTX, ACCEPTANCE, fleet, regime=Regime.LATENCY)
    assert [p.speedup for p in summed] == pytest.approx([p.speedup for p in engine])
    assert summed[1] == curve[1] and summed[2].speedup < 1.0
    # An engine idle half the window serves half its stepping rate: the average is the load.
    idle = replace(probe, served_tokens_per_s=one, step_time_s=30.0 * 1.0 / (2 * one))
    assert idle.served(1.0) == pytest.approx(one)


def test_the_objective_keeps_the_kv_limit_when_the_cache_is_full() -> None:
    evidence = make_evidence(batch=41.0, waiting=60.0, kv_cache_usage_ratio=0.95, context_tokens_per_seq=800.0,
                             prompt_tokens_per_s=2700.0, generation_tokens_per_s=900.0, prefill_tokens_per_step=390.0)
    ctx: ModelContext = replace(CTX, step_token_budget=512.0)
    workload = workload_from(evidence, context_tokens=800.0, prefill_tokens=390.0, tokens_per_seq=3.79,
                             budget_tokens=512.0)
    curve, objective, why = objective_curve(ctx, ACCEPTANCE, workload, config=ObjectiveConfig())
    assert objective is Objective.CAPACITY
    assert "KV 95%" in why and "token budget 512 per step (every step full" in why
    bare = workload_from(evidence, context_tokens=800.0, prefill_tokens=390.0, tokens_per_seq=3.79)
    held = objective_curve(CTX, ACCEPTANCE, bare, config=ObjectiveConfig())[0]
    # The budget only lowers what the KV-held batch serves, never raises it.
    assert all(p.speedup <= h.speedup * (1 + 1e-9) for p, h in zip(curve[1:], held[1:], strict=True))


def test_max_num_seqs_caps_the_batch_a_full_budget_would_hold() -> None:
    # N 8192, r 8: off's share is 8 + 1 = 9 tokens a sequence, so the budget alone would hold 910 sequences; with
    # max_num_seqs 256 it holds 256 and 256 x 8 = 2048 prompt tokens, the step no longer full.
    load = replace(_load(served=1.0, tokens_per_step=8192.0, budget=8192.0, batch=256.0), prompt_per_output=8.0)
    capped = replace(load, max_seqs=256.0)
    step = curve_for(CTX, ACCEPTANCE[:1], Shape(batch=256.0, context_tokens=800.0, prefill_tokens=2048.0))[0][0]
    assert capacity_tokens_per_s(CTX, ACCEPTANCE, capped, 0) == pytest.approx(256.0 / step.step_time_s)
    assert capacity_tokens_per_s(CTX, ACCEPTANCE, load, 0) > capacity_tokens_per_s(CTX, ACCEPTANCE, capped, 0)
    # A cap above what the budget holds changes nothing.
    roomy = replace(load, max_seqs=4096.0)
    assert capacity_tokens_per_s(CTX, ACCEPTANCE, roomy, 0) == capacity_tokens_per_s(CTX, ACCEPTANCE, load, 0)


def test_known_max_num_seqs_keeps_off_from_looking_like_it_admits_more() -> None:
    # Running gamma 4 at max_num_seqs 256 with a queue, N 2048, r 2: every step full. Unknown max_num_seqs credits
    # off with 2048 / 3 = 683 sequences a step; known, off runs at most 256 like every other option, so each
    # drafting option loses less to it (gamma 1: 0.92 -> 0.97 of off).
    evidence = make_evidence(batch=256.0, waiting=200.0, kv_cache_usage_ratio=0.3, context_tokens_per_seq=800.0,
                             prompt_tokens_per_s=16000.0, generation_tokens_per_s=8000.0,
                             prefill_tokens_per_step=1500.0, speculation_on=True, deployed_k=4)
    ctx: ModelContext = replace(CTX, step_token_budget=2048.0)

    def curve(max_seqs: float | None) -> tuple:  # type: ignore[type-arg]
        workload = workload_from(evidence, context_tokens=800.0, prefill_tokens=1500.0, tokens_per_seq=5.0,
                                 budget_tokens=2048.0, max_seqs=max_seqs)
        assert workload.budget is not None and workload.budget.full
        return objective_curve(ctx, ACCEPTANCE, workload, config=ObjectiveConfig())[0]

    blind, told = curve(None), curve(256.0)
    assert all(t.speedup >= b.speedup for t, b in zip(told[1:], blind[1:], strict=True))
    assert told[1].speedup > blind[1].speedup + 0.03


def test_max_num_seqs_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        replace(CTX, max_num_seqs=0.0)


def test_a_prompt_longer_than_the_step_spans_steps() -> None:
    # N 512, r 1000: a sequence and its prompt share (1001 tokens an output token) do not fit one step, so 512 /
    # 1001 = 0.51 sequences decode a step on average beside 511.5 prompt tokens: the step is priced with one
    # decoding sequence, the tokens served at 0.51 a step. Deeper drafts take more of the step and serve less.
    load = replace(_load(served=1.0, tokens_per_step=512.0), prompt_per_output=1000.0)
    step = curve_for(CTX, ACCEPTANCE[:1], Shape(batch=1.0, context_tokens=800.0, prefill_tokens=512.0 * 1000 / 1001))
    assert capacity_tokens_per_s(CTX, ACCEPTANCE, load, 0) == pytest.approx(512.0 / 1001 / step[0][0].step_time_s)
    caps = [capacity_tokens_per_s(CTX, ACCEPTANCE, load, g) for g in range(5)]
    assert caps == sorted(caps, reverse=True)
