"""The step's token budget at one operating point (what-if, schedules): a step holds n = min(B, N / q) sequences."""

from __future__ import annotations

from dataclasses import replace

import pytest
from costmodel_builders import make_context, make_evidence

from policies.model.acceptance import acceptance_curve
from policies.model.costmodel import curve_for
from policies.model.roofline import Shape
from policies.model.token_budget import curve_within_budget
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


def test_chunked_prefill_gets_what_the_running_sequences_leave() -> None:
    # 64 sequences at gamma 4 take 320 of 512 tokens: 192 prompt tokens fit of the 300 offered, so that step is
    # priced with 192 (admissions slow down; the running sequences do not).
    ctx = replace(CTX, step_token_budget=512.0)
    at = Shape(batch=64.0, context_tokens=800.0, prefill_tokens=300.0)
    curve, base = curve_within_budget(ctx, ACCEPTANCE, at)
    assert base == curve_for(CTX, ACCEPTANCE, at)[1]  # off: 64 + 300 = 364 tokens fit
    squeezed = curve_for(CTX, ACCEPTANCE, replace(at, prefill_tokens=192.0))[0][4]
    assert curve[4].step_time_s == pytest.approx(squeezed.step_time_s, rel=1e-12)


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


@pytest.mark.parametrize("budget", [0, -5, 2_000_000])
def test_the_whatif_refuses_a_budget_out_of_range(budget: int) -> None:
    with pytest.raises(WhatIfInputError, match="max_num_batched_tokens"):
        evaluate_whatif(_whatif(budget))
