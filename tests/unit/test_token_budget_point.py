"""The step's token budget at one operating point (what-if, schedules): a step holds n = min(B, N / q) sequences."""

from __future__ import annotations

from dataclasses import replace

import pytest
from costmodel_builders import make_context, make_evidence

from policies.model.acceptance import acceptance_curve
from policies.model.costmodel import curve_for
from policies.model.roofline import Shape
from policies.model.token_budget import curve_within_budget, fitting_gammas
from policies.offline.schedule import ScheduleInputs, schedule_for
from policies.offline.whatif import AcceptanceSpec, WhatIfInput, WhatIfInputError, WhatIfResult, evaluate_whatif
from policies.types import DraftMethod

# E[L] = 1, 1.78, 2.36, 2.79, 3.08 at gamma 0..4.
ACCEPTANCE = acceptance_curve(make_evidence().acceptance, method=DraftMethod.EAGLE3, gamma_max=4)
CTX = make_context(hardware="a100-80gb-sxm", model="llama-3.1-8b")


def test_without_a_budget_or_where_it_holds_the_batch_the_curve_is_curve_for() -> None:
    at = Shape(batch=64.0, context_tokens=800.0, prefill_tokens=100.0)
    plain = curve_for(CTX, ACCEPTANCE, at)
    assert curve_within_budget(CTX, ACCEPTANCE, at) == plain
    # 64 x 5 + 100 = 420 tokens at gamma 4: a 512-token budget holds every gamma's step whole.
    assert curve_within_budget(replace(CTX, step_token_budget=512.0), ACCEPTANCE, at) == plain


def test_a_step_holds_n_of_b_sequences_and_each_steps_n_over_b_of_the_time() -> None:
    ctx = replace(CTX, step_token_budget=512.0)
    at = Shape(batch=128.0, context_tokens=800.0)
    curve, base = curve_within_budget(ctx, ACCEPTANCE, at)
    free, free_base = curve_for(CTX, ACCEPTANCE, at)
    assert base == free_base  # off: 128 tokens
    assert curve[1] == free[1]  # gamma 1: 256 tokens
    assert curve[3] == free[3]  # gamma 3: 512 tokens, exactly the budget
    # gamma 4 verifies 5 tokens a sequence: 512 / 5 = 102.4 sequences a step, each stepping 80% of the steps.
    step = curve_for(CTX, ACCEPTANCE, Shape(batch=102.4, context_tokens=800.0))[0][4].step_time_s / 0.8
    assert curve[4].step_time_s == pytest.approx(step, rel=1e-12)
    assert curve[4].speedup == pytest.approx(ACCEPTANCE[4].expected_length * base / step, rel=1e-12)
    assert curve[4].speedup_low == pytest.approx(ACCEPTANCE[4].expected_length_low * base / step, rel=1e-12)
    assert curve[4].speedup < free[4].speedup


def test_the_prompt_tokens_are_the_loads_and_the_sequences_share_the_rest() -> None:
    # 300 prompt tokens a step leave 212 of 512: off holds all 64 sequences (64 tokens), gamma 4 (5 tokens each)
    # 42.4 of them, so each steps 66.25% of the steps, at the same 300 prompt tokens. Deferring prompts would make
    # a step cheaper but not the load: speculation gains nothing from the budget.
    ctx = replace(CTX, step_token_budget=512.0)
    at = Shape(batch=64.0, context_tokens=800.0, prefill_tokens=300.0)
    curve, base = curve_within_budget(ctx, ACCEPTANCE, at)
    free, free_base = curve_for(CTX, ACCEPTANCE, at)
    assert base == free_base
    step = curve_for(CTX, ACCEPTANCE, replace(at, batch=42.4))[0][4].step_time_s / (42.4 / 64.0)
    assert curve[4].step_time_s == pytest.approx(step, rel=1e-12)
    assert curve[4].speedup < free[4].speedup


def test_a_budget_under_the_batch_slows_plain_decoding_too() -> None:
    # 600 sequences against 512 tokens: off holds 512 a step (each steps 85.3% of them), gamma 1 256.
    ctx = replace(CTX, step_token_budget=512.0)
    at = Shape(batch=600.0, context_tokens=800.0)
    curve, base = curve_within_budget(ctx, ACCEPTANCE, at)
    plain = curve_for(CTX, ACCEPTANCE[:1], replace(at, batch=512.0))[1] / (512.0 / 600.0)
    assert base == pytest.approx(plain, rel=1e-12)
    one = curve_for(CTX, ACCEPTANCE[:2], replace(at, batch=256.0))[0][1].step_time_s / (256.0 / 600.0)
    assert curve[1].speedup == pytest.approx(ACCEPTANCE[1].expected_length * plain / one, rel=1e-12)


def test_a_tree_takes_its_nodes_of_the_budget() -> None:
    # A 25-node tree verifies 26 tokens a sequence at every gamma >= 1: 512 / 26 = 19.7 of 32 sequences a step.
    ctx = replace(CTX, step_token_budget=512.0)
    at = Shape(batch=32.0, context_tokens=800.0)
    curve = curve_within_budget(ctx, ACCEPTANCE, at, tree_tokens=25.0)[0]
    share = 512.0 / 26.0 / 32.0
    step = curve_for(CTX, ACCEPTANCE[:3], replace(at, batch=share * 32.0), tree_tokens=25.0)[0][2].step_time_s
    assert curve[2].step_time_s == pytest.approx(step / share, rel=1e-12)


def test_a_budget_that_holds_no_whole_sequence_is_refused() -> None:
    ctx = replace(CTX, step_token_budget=8.0)
    at = Shape(batch=4.0, context_tokens=800.0, prefill_tokens=4.0)
    assert fitting_gammas(8.0, ACCEPTANCE, at) == 4  # 4 tokens left: gamma 0..3
    with pytest.raises(ValueError, match="no whole sequence at gamma 4"):
        curve_within_budget(ctx, ACCEPTANCE, at)
    assert len(curve_within_budget(ctx, ACCEPTANCE[:4], at)[0]) == 4


def test_a_small_budget_moves_the_schedule_to_fewer_drafts_at_high_batch() -> None:
    ctx = make_context(hardware="h100-sxm", model="llama-3.1-8b")

    def bands(budget: float | None) -> list[tuple[int, int, int]]:
        plan = ScheduleInputs(ctx=replace(ctx, step_token_budget=budget), acceptance=ACCEPTANCE, max_num_seqs=256,
                              context_tokens=1024.0)
        return [(band.lo, band.hi, band.gamma) for band in schedule_for(plan).bands]

    def gamma_at(table: list[tuple[int, int, int]], batch: int) -> int:
        return next(gamma for lo, hi, gamma in table if lo <= batch <= hi)

    free, tight = bands(None), bands(256.0)
    assert gamma_at(free, 4) == gamma_at(tight, 4)  # 4 x 5 = 20 tokens: nothing binds at low batch
    assert all(gamma_at(tight, b) <= gamma_at(free, b) for b in range(1, 257))
    # At batch 100 gamma 2 needs 300 tokens of the 256: it holds 85 sequences a step, gamma 1 (200) all of them.
    assert gamma_at(free, 100) == 2
    assert gamma_at(tight, 100) == 1


def _whatif(budget: int | None) -> WhatIfInput:
    return WhatIfInput(
        hardware="a100-80gb-sxm", target_model="llama-3.1-8b", drafter_method=DraftMethod.EAGLE3,
        acceptance=AcceptanceSpec(iid_rate=0.7), batch_sizes=(8.0, 256.0), context_lengths=(1024.0,),
        gammas=(0, 1, 4), max_num_batched_tokens=budget,
    )


def test_the_whatif_prices_the_budget_and_says_so() -> None:
    free, tight = evaluate_whatif(_whatif(None)), evaluate_whatif(_whatif(512))

    def speedup(result: WhatIfResult, batch: float, gamma: int) -> float:
        return next(p.speedup for p in result.points if p.batch == batch and p.gamma == gamma)

    assert speedup(tight, 8.0, 4) == speedup(free, 8.0, 4)
    assert speedup(tight, 256.0, 1) == speedup(free, 256.0, 1)  # 512 tokens: it fits
    assert speedup(tight, 256.0, 4) < speedup(free, 256.0, 4)
    assert any("max_num_batched_tokens" in note for note in tight.notes)
    assert not any("max_num_batched_tokens" in note for note in free.notes)


@pytest.mark.parametrize("budget", [0, -5, 2_000_000, 4])
def test_the_whatif_refuses_a_budget_out_of_range_or_too_small_for_one_sequence(budget: int) -> None:
    # 4 tokens cannot hold one sequence at gamma 4 (5 tokens).
    with pytest.raises(WhatIfInputError, match="max_num_batched_tokens") as error:
        evaluate_whatif(_whatif(budget))
    assert error.value.field == "max_num_batched_tokens"
