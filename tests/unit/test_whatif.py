"""What-if evaluation (policies/offline/whatif.py): acceptance forms, profiles, bounds, and the physics it must show."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from policies.iid import mean_length_iid
from policies.model.acceptance import acceptance_curve
from policies.model.catalog import MODEL_ENTRIES
from policies.model.costmodel import ModelContext, curve_for
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.model.roofline import Shape
from policies.offline.schedule import schedule_for
from policies.offline.whatif import (
    GAMMA_LIMIT,
    MAX_POINTS,
    AcceptanceSpec,
    WhatIfInput,
    WhatIfInputError,
    WhatIfResult,
    acceptance_evidence,
    acceptance_positions,
    build_context,
    evaluate_whatif,
    iid_rate_for_mean_length,
    resolve_model,
    whatif_schedule_plan,
)
from policies.types import DraftMethod

R_EAGLE3 = (0.78, 0.58, 0.43)


def make_input(**overrides: Any) -> WhatIfInput:
    base = WhatIfInput(
        hardware="h100-sxm",
        target_model="llama-3.1-8b",
        drafter_method=DraftMethod.EAGLE3,
        acceptance=AcceptanceSpec(per_position=R_EAGLE3),
        batch_sizes=(1.0, 16.0, 256.0),
        context_lengths=(512.0, 8192.0),
        gammas=(0, 1, 3, 5),
    )
    return dataclasses.replace(base, **overrides)


def field_of(call: Any) -> str:
    with pytest.raises(WhatIfInputError) as caught:
        call()
    return caught.value.field


# ------------------------------------------------------------------------------------------------------------
# Acceptance forms
# ------------------------------------------------------------------------------------------------------------


def test_mean_length_inverts_to_the_iid_rate() -> None:
    # alpha 0.8 at k=3: 1 + 0.8 + 0.64 + 0.512 = 2.952.
    assert mean_length_iid(0.8, 3) == pytest.approx(2.952)
    assert iid_rate_for_mean_length(2.952, 3) == pytest.approx(0.8, abs=1e-9)
    # The ends: L = 1 accepts nothing (alpha 0), L = k + 1 accepts everything (alpha 1).
    assert iid_rate_for_mean_length(1.0, 4) == pytest.approx(0.0, abs=1e-9)
    assert iid_rate_for_mean_length(5.0, 4) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("length", [0.99, 4.01, float("nan")])
def test_mean_length_outside_one_to_k_plus_one_is_refused(length: float) -> None:
    assert field_of(lambda: iid_rate_for_mean_length(length, 3)) == "acceptance.mean_acceptance_length"


def test_mean_length_positions_are_iid_up_to_the_measured_k() -> None:
    spec = AcceptanceSpec(mean_acceptance_length=2.952, measured_at_k=3)
    positions = acceptance_positions(spec, gamma_max=6)
    # Only the measured k positions are stated (alpha^1..alpha^3); deeper ones are the extrapolation's job.
    assert positions == pytest.approx((0.8, 0.64, 0.512), abs=1e-9)


def test_iid_rate_states_every_position_asked() -> None:
    positions = acceptance_positions(AcceptanceSpec(iid_rate=0.5), gamma_max=4)
    assert positions == pytest.approx((0.5, 0.25, 0.125, 0.0625))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (AcceptanceSpec(), "acceptance"),
        (AcceptanceSpec(per_position=(0.5,), iid_rate=0.5), "acceptance"),
        (AcceptanceSpec(per_position=(1.2,)), "acceptance.per_position"),
        (AcceptanceSpec(per_position=(-0.1,)), "acceptance.per_position"),
        (AcceptanceSpec(per_position=(0.4, 0.6)), "acceptance.per_position"),
        (AcceptanceSpec(per_position=()), "acceptance.per_position"),
        (AcceptanceSpec(per_position=(0.5,) * (GAMMA_LIMIT + 1)), "acceptance.per_position"),
        (AcceptanceSpec(iid_rate=1.5), "acceptance.iid_rate"),
        (AcceptanceSpec(mean_acceptance_length=2.0), "acceptance.measured_at_k"),
        (AcceptanceSpec(mean_acceptance_length=2.0, measured_at_k=0), "acceptance.measured_at_k"),
        (AcceptanceSpec(mean_acceptance_length=5.0, measured_at_k=3), "acceptance.mean_acceptance_length"),
    ],
)
def test_impossible_acceptance_names_its_field(spec: AcceptanceSpec, field: str) -> None:
    assert field_of(lambda: acceptance_positions(spec, gamma_max=4)) == field


@pytest.mark.parametrize("coverage", [0.0, -0.2, 1.5, float("nan")])
def test_a_draft_coverage_outside_zero_to_one_names_its_field(coverage: float) -> None:
    inp = make_input(acceptance=AcceptanceSpec(per_position=R_EAGLE3, draft_coverage=coverage))
    assert field_of(lambda: evaluate_whatif(inp)) == "acceptance.draft_coverage"


def test_drafts_on_part_of_the_steps_shrink_both_the_gain_and_the_verified_tokens() -> None:
    # An n-gram drafter matching on 58% of sequence-steps (the untied CPU model's measured share): each step emits
    # 1 + 0.58 (E[L] - 1) tokens per sequence and verifies 1 + 0.58 gamma; at batch 1 (memory-bound: verification
    # nearly free) the speedup is then mostly the lost acceptance.
    full = make_input(drafter_method=DraftMethod.NGRAM, batch_sizes=(1.0,), context_lengths=(512.0,), gammas=(0, 3))
    part = dataclasses.replace(full, acceptance=AcceptanceSpec(per_position=R_EAGLE3, draft_coverage=0.58))
    every, some = evaluate_whatif(full), evaluate_whatif(part)
    [every3] = [p for p in every.points if p.gamma == 3]
    [some3] = [p for p in some.points if p.gamma == 3]
    assert every3.expected_accepted_length == pytest.approx(1 + sum(R_EAGLE3))
    assert some3.expected_accepted_length == pytest.approx(1 + 0.58 * sum(R_EAGLE3))
    assert some3.step_time_s < every3.step_time_s  # fewer tokens verified per step
    assert 1.0 < some3.speedup < every3.speedup


def test_stated_positions_become_evidence_with_a_zero_width_band() -> None:
    evidence = acceptance_evidence((0.8, 0.6))
    assert evidence.per_position_low == evidence.per_position == evidence.per_position_high == (0.8, 0.6)
    assert evidence.mean_acceptance_length == pytest.approx(2.4)  # 1 + 0.8 + 0.6


# ------------------------------------------------------------------------------------------------------------
# Profiles
# ------------------------------------------------------------------------------------------------------------


def test_unknown_hardware_and_model_name_the_field_and_the_known_names() -> None:
    with pytest.raises(WhatIfInputError) as hardware:
        build_context(make_input(hardware="h900"))
    assert hardware.value.field == "hardware" and "h100-sxm" in hardware.value.message
    with pytest.raises(WhatIfInputError) as model:
        build_context(make_input(target_model="llama-9-1t"))
    assert model.value.field == "target_model" and "llama-3.1-8b" in model.value.message


def test_a_gpu_given_by_its_numbers_prices_like_the_catalog_entry_with_them() -> None:
    numbers = {"name": "my-h100", "bf16_dense_tflops": 989.4, "fp8_dense_tflops": 1978.9, "mem_bandwidth_gbps": 3350,
               "memory_gb": 80, "interconnect_gbps_per_direction": 450}
    catalog = evaluate_whatif(make_input())
    mine = evaluate_whatif(make_input(hardware=numbers))
    assert [p.step_time_s for p in mine.points] == pytest.approx([p.step_time_s for p in catalog.points])
    assert mine.context.hardware.name == "my-h100"
    assert field_of(lambda: evaluate_whatif(make_input(hardware={**numbers, "memory_gb": 0}))) == "hardware"


def test_an_inline_config_prices_like_the_catalog_entry_it_copies() -> None:
    entry = next(e for e in MODEL_ENTRIES if e.name == "llama-3.1-8b")
    inline = evaluate_whatif(make_input(target_model=dict(entry.config)))
    named = evaluate_whatif(make_input())
    assert inline.context.model.params == named.context.model.params
    assert [p.speedup for p in inline.points] == [p.speedup for p in named.points]


@pytest.mark.parametrize(
    "config",
    [
        {"hidden_size": 4096},  # most fields missing
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 0, "vocab_size": 10,
         "intermediate_size": 8},  # zero heads
        {"hidden_size": -64, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10,
         "intermediate_size": 8},  # negative size
        {"hidden_size": "big", "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10,
         "intermediate_size": 8},  # a string where a number belongs
        {"hidden_size": 10**9, "num_hidden_layers": 10**6, "num_attention_heads": 1, "vocab_size": 10,
         "intermediate_size": 8},  # absurd sizes
    ],
)
def test_a_config_that_is_not_a_decoder_names_the_field(config: dict[str, object]) -> None:
    assert field_of(lambda: resolve_model(config, field="target_model")) == "target_model"


def test_draft_model_is_required_for_draft_model_and_refused_otherwise() -> None:
    assert field_of(lambda: build_context(make_input(drafter_method=DraftMethod.DRAFT_MODEL))) == "drafter.draft_model"
    assert field_of(lambda: build_context(make_input(draft_model="llama-3.2-1b"))) == "drafter.draft_model"
    ctx = build_context(make_input(drafter_method=DraftMethod.DRAFT_MODEL, draft_model="llama-3.2-1b"))
    draft = model_by_name("llama-3.2-1b")
    # The drafter streams the draft model's weights minus an untied input-embedding table.
    assert ctx.drafter.params == pytest.approx(draft.params - draft.input_embedding_params)


# ------------------------------------------------------------------------------------------------------------
# Bounds
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"gammas": (0, GAMMA_LIMIT + 1)}, "gammas"),
        ({"gammas": (-1,)}, "gammas"),
        ({"gammas": (2, 2)}, "gammas"),
        ({"gammas": ()}, "gammas"),
        ({"batch_sizes": (0.5,)}, "batch_sizes"),
        ({"batch_sizes": (-4.0,)}, "batch_sizes"),
        ({"batch_sizes": (float("inf"),)}, "batch_sizes"),
        ({"context_lengths": (-1.0,)}, "context_lengths"),
        ({"context_lengths": ()}, "context_lengths"),
        ({"tensor_parallel": 0}, "tensor_parallel"),
        ({"prefill_tokens_per_step": -1.0}, "prefill_tokens_per_step"),
        ({"prefill_tokens_per_step": 100.0, "prompt_tokens": 0.0}, "prompt_tokens"),
        ({"prefill_tokens_per_step": 100.0, "prompt_tokens": float("nan")}, "prompt_tokens"),
        ({"prompt_tokens": 2000.0}, "prompt_tokens"),  # no prompt tokens in the steps: nothing to chunk
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": float("nan")}, "gpu_memory_utilization"),
        ({"tree_tokens": 0}, "drafter.tree_tokens"),
        ({"tree_tokens": 257}, "drafter.tree_tokens"),
        ({"tree_tokens": 4}, "drafter.tree_tokens"),  # gammas go to 5: a 4-node tree cannot be 5 deep
        ({"tree_tokens": 25, "drafter_method": DraftMethod.NGRAM}, "drafter.tree_tokens"),
    ],
)
def test_out_of_range_inputs_name_their_field(overrides: dict[str, Any], field: str) -> None:
    assert field_of(lambda: evaluate_whatif(make_input(**overrides))) == field


def test_the_work_one_request_may_ask_for_is_bounded_and_the_error_says_so() -> None:
    # 64 batch sizes x 8 contexts x 5 gammas = 2560 points > MAX_POINTS (2048).
    too_many = make_input(
        batch_sizes=tuple(float(b) for b in range(1, 65)),
        context_lengths=tuple(float(c) for c in range(100, 900, 100)),
        gammas=(0, 1, 2, 3, 4),
    )
    with pytest.raises(WhatIfInputError) as caught:
        evaluate_whatif(too_many)
    assert "2560 points" in caught.value.message and str(MAX_POINTS) in caught.value.message


# ------------------------------------------------------------------------------------------------------------
# What it answers
# ------------------------------------------------------------------------------------------------------------


def test_every_point_is_priced_consistently() -> None:
    inp = make_input()
    result = evaluate_whatif(inp)
    assert len(result.points) == 3 * 2 * 4  # batches x contexts x gammas
    plain = {(p.batch, p.context_tokens): p for p in result.points if p.gamma == 0}
    for point in result.points:
        # tokens/s per sequence = E[L] / step; total = batch x that; speedup = ratio to gamma 0 at the same point.
        assert point.tokens_per_s_per_seq == pytest.approx(point.expected_accepted_length / point.step_time_s)
        assert point.tokens_per_s_total == pytest.approx(point.batch * point.tokens_per_s_per_seq)
        base = plain[(point.batch, point.context_tokens)]
        assert point.speedup == pytest.approx(point.tokens_per_s_per_seq / base.tokens_per_s_per_seq)
    assert all(p.speedup == 1.0 for p in plain.values())


def test_points_match_the_cost_model_at_the_same_operating_point() -> None:
    result = evaluate_whatif(make_input())
    target = model_by_name("llama-3.1-8b")
    drafter = drafter_for(DraftMethod.EAGLE3, target)
    ctx = ModelContext(hardware=hardware_by_name("h100-sxm"), model=target, drafter=drafter)
    acceptance = acceptance_curve(acceptance_evidence(R_EAGLE3), method=DraftMethod.EAGLE3, gamma_max=5)
    curve, _ = curve_for(ctx, acceptance, Shape(batch=16.0, context_tokens=8192.0))
    point = next(p for p in result.points if (p.batch, p.context_tokens, p.gamma) == (16.0, 8192.0, 3))
    assert point.speedup == pytest.approx(curve[3].speedup)
    assert point.step_time_s == pytest.approx(curve[3].step_time_s)


def test_extrapolation_is_flagged_beyond_the_stated_positions_only() -> None:
    measured = evaluate_whatif(make_input())
    flags = {p.gamma: p.extrapolated for p in measured.points}
    assert flags == {0: False, 1: False, 3: False, 5: True}  # k = 3 stated
    iid = evaluate_whatif(make_input(acceptance=AcceptanceSpec(iid_rate=0.7)))
    assert not any(p.extrapolated for p in iid.points)


def test_best_gamma_is_the_argmax_with_off_as_a_candidate() -> None:
    result = evaluate_whatif(make_input())
    for best in result.best:
        here = [p for p in result.points if (p.batch, p.context_tokens) == (best.batch, best.context_tokens)]
        top = max([1.0, *(p.speedup for p in here)])
        assert best.speedup == pytest.approx(top)
    # Almost nothing accepted: no gamma pays for itself, so the best is to leave speculation off.
    hopeless = evaluate_whatif(make_input(acceptance=AcceptanceSpec(iid_rate=0.01)))
    assert {b.gamma for b in hopeless.best} == {0}


def test_points_whose_kv_does_not_fit_are_flagged_and_never_the_best() -> None:
    # H100 SXM 80 GiB x 0.9 = 77.31 GB; weights 8.03e9 x 2 = 16.06 GB off, + EAGLE-3 head 0.40e9 x 2 = 16.86 GB on;
    # KV 131072 B/token (target over context + gamma) + 4096 B/token (head, context only, on only). At ctx 4096:
    # off 61.25e9 / 536.9 MB = 114.08 sequences; gamma 1: 60.45e9 / (131072 x 4097 + 4096 x 4096) = 109.16;
    # gamma 3: 109.11; gamma 5: 109.06. So 109.13 sequences fit off and with gamma 1, not with 3 or 5.
    result = evaluate_whatif(make_input(batch_sizes=(109.13,), context_lengths=(4096.0,), gammas=(0, 1, 3, 5)))
    fits = {p.gamma: p.fits_in_memory for p in result.points}
    assert fits == {0: True, 1: True, 3: False, 5: False}
    room = {p.gamma: p.max_batch_in_memory for p in result.points}
    on_budget = 0.9 * 80 * 2**30 - (8.030261248e9 + 0.399515648e9) * 2
    assert room[0] == pytest.approx((0.9 * 80 * 2**30 - 8.030261248e9 * 2) / (131072 * 4096), rel=1e-4)
    assert room[3] == pytest.approx(on_budget / (131072 * 4099 + 4096 * 4096), rel=1e-4)
    (best,) = result.best
    assert best.gamma in {0, 1} and best.fits_in_memory
    speedups = {p.gamma: p.speedup for p in result.points}
    assert speedups[3] > speedups[1]  # the better-priced option is the one that does not fit
    assert any("2 of 4 points do not fit in memory" in note for note in result.notes)
    # A batch nothing fits (not even speculation off): still priced, best among all, and flagged.
    huge = evaluate_whatif(make_input(batch_sizes=(1024.0,), context_lengths=(8192.0,)))
    assert not any(p.fits_in_memory for p in huge.points)
    assert not huge.best[0].fits_in_memory
    assert any("none fits" in note for note in huge.notes)
    # Everything fits: no note. A lower memory budget (gpu_memory_utilization) holds fewer sequences.
    small = evaluate_whatif(make_input(batch_sizes=(1.0, 16.0), context_lengths=(512.0,)))
    assert all(p.fits_in_memory for p in small.points)
    assert not any("do not fit" in note for note in small.notes)
    half = evaluate_whatif(
        make_input(batch_sizes=(99.55,), context_lengths=(4096.0,), gammas=(0,), gpu_memory_utilization=0.45)
    )
    assert half.points[0].max_batch_in_memory == pytest.approx(
        (0.45 * 80 * 2**30 - 8.03e9 * 2) / (131072 * 4096), rel=2e-3
    )


def test_a_tree_is_nearly_free_at_batch_1_and_real_compute_at_batch_64() -> None:
    # EAGLE-1's default tree: 25 draft tokens, 5 levels (Spec-Bench's EAGLE rows), against a 5-draft chain with the
    # same tokens per step. At batch 1 both verify steps are weight streaming (26 vs 6 rows of math, each under the
    # one-tile floor), so the tree costs only its 20 more draft tokens' own cost, 20 x 40 us = 0.8 ms (~7% of an
    # 11.7 ms step); at batch 64 the tree verifies 64 x 26 = 1664 tokens
    # where the chain verifies 384: well past the H100's ridge, so the tree's step is much longer, and its speedup
    # falls below 1 at a smaller batch.
    grid = {"acceptance": AcceptanceSpec(mean_acceptance_length=3.6, measured_at_k=5), "gammas": (0, 5),
            "batch_sizes": (1.0, 64.0), "context_lengths": (512.0,)}
    chain = evaluate_whatif(make_input(**grid))
    tree = evaluate_whatif(make_input(**grid, tree_tokens=25))

    def step(result: WhatIfResult, batch: float) -> float:
        return next(p.step_time_s for p in result.points if p.batch == batch and p.gamma == 5)

    assert step(tree, 1.0) - step(chain, 1.0) == pytest.approx(20 * 40e-6, rel=0.1)
    assert step(tree, 64.0) > 1.5 * step(chain, 64.0)
    plain = {p.batch: p.step_time_s for p in tree.points if p.gamma == 0}
    assert plain == {p.batch: p.step_time_s for p in chain.points if p.gamma == 0}  # off is off
    assert crossover_of(tree, gamma=5, context=512.0).batch < crossover_of(chain, gamma=5, context=512.0).batch
    # Every node holds a KV slot while it is verified: 25 per sequence instead of 5, 131072 B each (Llama-3.1-8B).
    room = {r: next(p.max_batch_in_memory for p in r.points if p.batch == 1.0 and p.gamma == 5) for r in (chain, tree)}
    budget = 0.9 * 80 * 2**30 - 16.86e9
    head_kv = 4096 * 512
    assert room[chain] == pytest.approx(budget / (131072 * 517 + head_kv), rel=2e-3)
    assert room[tree] == pytest.approx(budget / (131072 * 537 + head_kv), rel=2e-3)
    assert any("tree drafting" in note for note in tree.notes)
    # Engine schedules are per-batch K for a chain: a tree has no such knob, and saying so beats a wrong schedule.
    assert field_of(lambda: whatif_schedule_plan(make_input(tree_tokens=25), max_num_seqs=64)) == "drafter.tree_tokens"


def crossover_of(result: Any, *, gamma: int, context: float) -> Any:
    return next(c for c in result.crossovers if c.gamma == gamma and c.context_tokens == context)


def test_the_crossover_is_where_the_speedup_falls_to_one() -> None:
    inp = make_input(drafter_method=DraftMethod.NGRAM, acceptance=AcceptanceSpec(iid_rate=0.5),
                     context_lengths=(128.0,), gammas=(0, 2))
    result = evaluate_whatif(inp)
    crossing = crossover_of(result, gamma=2, context=128.0)
    assert crossing.helps_at_batch_1 and crossing.batch is not None
    probe = evaluate_whatif(dataclasses.replace(inp, batch_sizes=(crossing.batch * 0.99, crossing.batch)))
    below, at = (p.speedup for p in probe.points if p.gamma == 2)
    assert below > 1.0 >= at  # bisected to 0.5% of the batch


def test_a_better_drafter_and_a_longer_context_move_the_crossover_up() -> None:
    base = make_input(drafter_method=DraftMethod.NGRAM, context_lengths=(128.0, 1024.0), gammas=(0, 2))
    weak = evaluate_whatif(dataclasses.replace(base, acceptance=AcceptanceSpec(iid_rate=0.4)))
    strong = evaluate_whatif(dataclasses.replace(base, acceptance=AcceptanceSpec(iid_rate=0.6)))
    weak_short = crossover_of(weak, gamma=2, context=128.0).batch
    strong_short = crossover_of(strong, gamma=2, context=128.0).batch
    weak_long = crossover_of(weak, gamma=2, context=1024.0).batch
    assert weak_short is not None and strong_short is not None
    assert strong_short > weak_short
    # KV reads grow with B x ctx and keep decode memory-bound: the crossover rises (or leaves the search range).
    assert weak_long is None or weak_long > weak_short


def test_speculation_that_never_helps_reports_crossover_at_one() -> None:
    result = evaluate_whatif(make_input(acceptance=AcceptanceSpec(iid_rate=0.01), gammas=(0, 4)))
    for crossing in result.crossovers:
        assert not crossing.helps_at_batch_1 and crossing.batch == 1.0


def test_schedule_plan_from_a_whatif_input() -> None:
    plan = whatif_schedule_plan(make_input(), max_num_seqs=64)
    assert plan.context_tokens == 512.0  # the first context length
    assert len(plan.acceptance) == 6  # gamma 0..5
    assert whatif_schedule_plan(make_input(), max_num_seqs=64, context_tokens=2048.0).context_tokens == 2048.0
    assert field_of(lambda: whatif_schedule_plan(make_input(gammas=(0,)), max_num_seqs=64)) == "gammas"


def test_a_gamma_that_loses_at_batch_1_but_wins_at_long_context_later_is_not_never() -> None:
    # 64k tokens per sequence with a 1B draft model at alpha 0.28: at batch 1 the draft model's own passes cost
    # more than E[L](1) = 1.28 returns (S(1) = 0.985); every sequence added streams another 8 GB of KV while the
    # drafter's weights are shared, so S rises with the batch and passes 1 near batch 5. The crossover must say
    # where it helps, not "never".
    inp = make_input(
        target_model="llama-3.1-8b", drafter_method=DraftMethod.DRAFT_MODEL, draft_model="llama-3.2-1b",
        acceptance=AcceptanceSpec(iid_rate=0.28), batch_sizes=(1.0, 16.0), context_lengths=(65536.0,), gammas=(0, 1),
    )
    result = evaluate_whatif(inp)
    (crossing,) = result.crossovers
    assert not crossing.helps_at_batch_1 and crossing.batch == 1.0
    ((start, end),) = crossing.helps_between
    assert 1.0 < start < 16.0 and end is None
    at = {p.batch: p.speedup for p in result.points if p.gamma == 1}
    assert at[1.0] < 1.0 < at[16.0]


def test_crossover_ranges_close_where_the_speedup_falls_back_to_1() -> None:
    inp = make_input(acceptance=AcceptanceSpec(iid_rate=0.7), gammas=(0, 3), context_lengths=(512.0,))
    (crossing,) = evaluate_whatif(inp).crossovers
    assert crossing.helps_at_batch_1 and crossing.batch is not None
    assert crossing.helps_between == ((1.0, crossing.batch),)


# ------------------------------------------------------------------------------------------------------------
# What the model does not price, said in the answer
# ------------------------------------------------------------------------------------------------------------


def _graph_notes(result: WhatIfResult) -> list[str]:
    return [n for n in result.notes if "CUDA graphs" in n]


def test_speculative_steps_past_vllms_default_graph_capture_are_noted() -> None:
    # vLLM's default capture stops at 512 tokens: batch 256 at gamma 3 verifies 1024 per step, its plain step 256.
    noted = _graph_notes(evaluate_whatif(make_input(batch_sizes=(64.0, 256.0), context_lengths=(512.0,),
                                                    gammas=(0, 3))))
    assert len(noted) == 1
    assert "1 of 2 speculative points" in noted[0] and "batch 256 at gamma 3, 1024 tokens" in noted[0]
    # Batch 64 at gamma 3 is 256 tokens: inside the limit, nothing to say.
    assert _graph_notes(evaluate_whatif(make_input(batch_sizes=(1.0, 64.0), gammas=(0, 3)))) == []


def test_the_graph_limit_follows_the_step_budget_and_the_drafts_actually_verified() -> None:
    # A 256-token step budget caps the capture too: batch 64 at gamma 3 (256 tokens) fits, gamma 5 (384) does not.
    budget = make_input(batch_sizes=(64.0,), context_lengths=(512.0,), gammas=(0, 3, 5), max_num_batched_tokens=256)
    noted = _graph_notes(evaluate_whatif(budget))
    assert len(noted) == 1 and "1 of 2 speculative points" in noted[0] and "gamma 5, 384 tokens" in noted[0]
    # Drafts on half the sequence-steps verify 1 + 0.5 x 3 = 2.5 tokens per sequence: 640 at batch 256.
    half = make_input(batch_sizes=(256.0,), gammas=(0, 3),
                      acceptance=AcceptanceSpec(per_position=R_EAGLE3, draft_coverage=0.5))
    assert "640 tokens" in _graph_notes(evaluate_whatif(half))[0]
    # A plain step already past the limit runs without a graph too: the comparison is not skewed, no note.
    assert _graph_notes(evaluate_whatif(make_input(batch_sizes=(600.0,), gammas=(0, 1)))) == []


# ------------------------------------------------------------------------------------------------------------
# Prompt tokens in chunks
# ------------------------------------------------------------------------------------------------------------


def _plain_steps(inp: WhatIfInput) -> dict[float, float]:
    return {p.batch: p.step_time_s for p in evaluate_whatif(inp).points if p.gamma == 0}


def test_a_moe_step_with_prompts_in_chunks_touches_fewer_experts_than_one_with_prompt_tokens_in_every_step() -> None:
    # Qwen3-30B-A3B routes each token to 8 of 128 experts per layer: 200 prompt tokens in every step touch nearly
    # all of them, while whole 2000-token prompts in a tenth of the steps leave the other steps' few decode tokens
    # touching a few dozen. The mean step lies between the decode-only step and prompt tokens in every step.
    moe = make_input(target_model="qwen3-30b-a3b", batch_sizes=(4.0,), context_lengths=(1024.0,), gammas=(0, 3))
    every = _plain_steps(dataclasses.replace(moe, prefill_tokens_per_step=200.0))[4.0]
    chunked = _plain_steps(dataclasses.replace(moe, prefill_tokens_per_step=200.0, prompt_tokens=2000.0))[4.0]
    decode_only = _plain_steps(moe)[4.0]
    assert decode_only < chunked < every


def test_a_dense_step_is_the_same_whether_prompts_come_in_chunks_or_in_every_step() -> None:
    dense = make_input(prefill_tokens_per_step=200.0)
    assert _plain_steps(dataclasses.replace(dense, prompt_tokens=2000.0)) == pytest.approx(_plain_steps(dense))


def test_the_step_budget_caps_the_chunk_a_prompt_arrives_in() -> None:
    # Budget 1024 at batch 4: a prompt of any length arrives in chunks of 1024 - 4 = 1020 tokens.
    moe = make_input(target_model="qwen3-30b-a3b", batch_sizes=(4.0,), context_lengths=(1024.0,), gammas=(0, 1),
                     prefill_tokens_per_step=200.0, max_num_batched_tokens=1024)
    long_prompt = _plain_steps(dataclasses.replace(moe, prompt_tokens=50_000.0))
    budget_chunk = _plain_steps(dataclasses.replace(moe, prompt_tokens=1020.0))
    assert long_prompt == pytest.approx(budget_chunk)
    # A prompt shorter than the room is carried whole, in more steps.
    assert long_prompt != pytest.approx(_plain_steps(dataclasses.replace(moe, prompt_tokens=500.0)))


def test_a_step_the_budget_fills_carries_the_mean_prefill_whatever_the_prompt() -> None:
    # Budget 512 at batch 256: gamma 3 verifies 1024 tokens, so its steps are full (312 decode tokens beside 200
    # prompt tokens) and carry exactly P; the plain step (256 + 200 < 512) carries whole prompts now and then.
    moe = make_input(target_model="qwen3-30b-a3b", batch_sizes=(256.0,), context_lengths=(1024.0,), gammas=(0, 3),
                     prefill_tokens_per_step=200.0, max_num_batched_tokens=512)

    def steps(inp: WhatIfInput) -> dict[int, float]:
        return {p.gamma: p.step_time_s for p in evaluate_whatif(inp).points}

    every, chunked = steps(moe), steps(dataclasses.replace(moe, prompt_tokens=2000.0))
    assert chunked[3] == pytest.approx(every[3])
    assert chunked[0] < every[0]


def test_the_notes_say_how_prompt_tokens_were_priced() -> None:
    every = evaluate_whatif(make_input(prefill_tokens_per_step=200.0))
    chunked = evaluate_whatif(make_input(prefill_tokens_per_step=200.0, prompt_tokens=2000.0))
    assert any("priced into every step" in note and "prompt_tokens" in note for note in every.notes)
    assert any("whole prompts of 2000 tokens" in note for note in chunked.notes)
    assert not any("priced into every step" in note for note in chunked.notes)


def test_a_schedule_from_a_whatif_prices_prompts_in_the_same_chunks() -> None:
    # The schedule plan built from a what-if carries the prompt length: its bands price the same chunked steps.
    moe = make_input(target_model="qwen3-30b-a3b", context_lengths=(1024.0,), gammas=(0, 1, 2, 3),
                     prefill_tokens_per_step=200.0)
    chunked = schedule_for(whatif_schedule_plan(dataclasses.replace(moe, prompt_tokens=2000.0), max_num_seqs=64))
    every = schedule_for(whatif_schedule_plan(moe, max_num_seqs=64))
    result = evaluate_whatif(dataclasses.replace(moe, prompt_tokens=2000.0, batch_sizes=(1.0,)))
    best_at_1 = max((p for p in result.points if p.batch == 1.0), key=lambda p: p.speedup)
    assert chunked.bands[0].speedup_at_lo == pytest.approx(best_at_1.speedup)
    assert chunked.bands[0].speedup_at_lo != pytest.approx(every.bands[0].speedup_at_lo)
