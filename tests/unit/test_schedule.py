"""Engine-native schedules (policies/offline/schedule.py): band shape, exact boundaries, the K=0 cost, both engines'
formats."""

from __future__ import annotations

import itertools

import pytest
from costmodel_builders import make_context, make_evidence, make_off_evidence

from policies.advise import AdvisorConfig, AdvisorState, advise_target
from policies.decide.rule import DecideConfig
from policies.model.acceptance import acceptance_curve
from policies.model.costmodel import curve_for
from policies.model.roofline import CostScales, Shape, dynamic_sd_k0_overhead_s
from policies.offline.schedule import (
    BatchSchedule,
    ScheduleAsk,
    ScheduleBand,
    ScheduleInputs,
    best_choice,
    inputs_from_evidence,
    schedule_for,
    sglang_adaptive_config,
    trtllm_schedule,
    vllm_bands,
    vllm_speculative_config,
)
from policies.offline.whatif import acceptance_evidence
from policies.types import DraftMethod


def make_plan(
    *,
    method: DraftMethod = DraftMethod.EAGLE3,
    positions: tuple[float, ...] | None = None,
    gamma_max: int = 6,
    max_num_seqs: int = 300,
    context_tokens: float = 512.0,
    margin: float = 0.0,
) -> ScheduleInputs:
    evidence = acceptance_evidence(positions) if positions is not None else None
    return ScheduleInputs(
        ctx=make_context(method=method),
        acceptance=acceptance_curve(evidence, method=method, gamma_max=gamma_max),
        max_num_seqs=max_num_seqs,
        context_tokens=context_tokens,
        margin=margin,
    )


def k_at(schedule: BatchSchedule, batch: int) -> int:
    """vLLM's reading of num_speculative_tokens_per_batch_size: the band whose [lo, hi] holds the batch."""
    return next(k for lo, hi, k in vllm_bands(schedule) if lo <= batch <= hi)


def trt_draft_len(schedule: dict[int, int], batch: int) -> int:
    """TensorRT-LLM's documented lookup: the first key >= batch gives the draft length; above every key, 0."""
    for key in sorted(schedule):
        if batch <= key:
            return schedule[key]
    return 0


def test_bands_are_contiguous_merged_and_cover_one_to_max_num_seqs() -> None:
    schedule = schedule_for(make_plan())
    bands = vllm_bands(schedule)
    assert bands[0][0] == 1 and bands[-1][1] == 300
    for (_, hi, k), (lo, _, k_next) in itertools.pairwise(bands):
        assert lo == hi + 1 and k != k_next  # no gap, no overlap, equal neighbours merged
    assert all(0 <= k <= 6 for _, _, k in bands)


@pytest.mark.parametrize(
    ("method", "positions", "context"),
    [
        (DraftMethod.EAGLE3, None, 512.0),
        (DraftMethod.NGRAM, (0.5, 0.3, 0.2), 128.0),
        (DraftMethod.EAGLE3, (0.78, 0.58, 0.43), 8192.0),
    ],
)
def test_every_batch_gets_its_best_k(method: DraftMethod, positions: tuple[float, ...] | None, context: float) -> None:
    plan = make_plan(method=method, positions=positions, context_tokens=context)
    schedule = schedule_for(plan)
    for batch in range(1, plan.max_num_seqs + 1):
        # The oracle: the per-batch choice evaluated at every batch, no grid, no bisection.
        oracle = best_choice(plan.ctx, plan.acceptance, Shape(batch=batch, context_tokens=context))
        assert k_at(schedule, batch) == oracle.gamma, batch


def test_best_choice_compares_drafting_with_a_k0_that_costs_time() -> None:
    plan = make_plan()
    curve, base = curve_for(plan.ctx, plan.acceptance, Shape(batch=8.0, context_tokens=512.0))
    choice = best_choice(plan.ctx, plan.acceptance, Shape(batch=8, context_tokens=512.0))
    top = max(curve[1:], key=lambda p: p.speedup)
    assert choice.gamma == top.gamma and choice.speedup == pytest.approx(top.speedup)
    # Nothing accepted: K=0 wins, and it runs slower than off by the Dynamic SD overhead:
    # S0 = T / (T + k0(B)), k0(8) = 0.775 ms + 8 x 84 us (dynamic-sd-k0-overhead.csv).
    hopeless = make_plan(positions=(0.0,))
    off = best_choice(hopeless.ctx, hopeless.acceptance, Shape(batch=8, context_tokens=512.0))
    assert off.gamma == 0
    assert off.speedup == pytest.approx(base / (base + dynamic_sd_k0_overhead_s(8.0)))
    assert off.speedup < 1.0
    # At batch 200 the measured K=0 overhead (0.775 + 200 x 0.084 = 17.6 ms) exceeds what a whole K=1 step adds,
    # and K=0 does a subset of a K=1 step's work: it is priced as the K=1 step, and the tie keeps K=0.
    curve_200, base_200 = curve_for(hopeless.ctx, hopeless.acceptance, Shape(batch=200.0, context_tokens=512.0))
    assert dynamic_sd_k0_overhead_s(200.0) > curve_200[1].step_time_s - base_200
    capped = best_choice(hopeless.ctx, hopeless.acceptance, Shape(batch=200, context_tokens=512.0))
    assert capped.gamma == 0
    assert capped.speedup == pytest.approx(base_200 / curve_200[1].step_time_s)


def test_a_schedule_that_never_drafts_says_turn_speculation_off() -> None:
    schedule = schedule_for(make_plan(positions=(0.0,)))
    assert vllm_bands(schedule) == [[1, 300, 0]]
    assert not schedule.speculation_useful
    assert vllm_speculative_config(schedule, method=DraftMethod.EAGLE3) is None
    assert trtllm_schedule(make_plan(positions=(0.0,)), schedule) is None


def test_margin_keeps_k0_unless_drafting_clears_it() -> None:
    # A 10x margin cannot be cleared (speedups are ~2 at best), so every band is K=0.
    assert vllm_bands(schedule_for(make_plan(margin=10.0))) == [[1, 300, 0]]
    with pytest.raises(ValueError, match="margin"):
        schedule_for(make_plan(margin=-0.1))


def test_range_checks() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        schedule_for(make_plan(max_num_seqs=0))
    with pytest.raises(ValueError, match="context_tokens"):
        schedule_for(make_plan(context_tokens=-1.0))


def test_vllm_fragment_has_the_documented_shape() -> None:
    schedule = schedule_for(make_plan())
    config = vllm_speculative_config(schedule, method=DraftMethod.EAGLE3)
    assert config is not None
    assert config["method"] == "eagle3"
    assert config["num_speculative_tokens_per_batch_size"] == vllm_bands(schedule)
    # num_speculative_tokens is the largest K any band uses.
    assert config["num_speculative_tokens"] == max(k for _, _, k in vllm_bands(schedule))


def synthetic(plan: ScheduleInputs, bands: list[tuple[int, int, int]]) -> BatchSchedule:
    return BatchSchedule(
        bands=tuple(ScheduleBand(lo, hi, k, 1.5, 1.2, extrapolated=False) for lo, hi, k in bands),
        max_num_seqs=bands[-1][1], gamma_max=6, context_tokens=plan.context_tokens, margin=0.0,
    )


def test_trtllm_schedule_reads_back_as_the_same_k_per_batch() -> None:
    plan = make_plan(max_num_seqs=256)
    schedule = synthetic(plan, [(1, 8, 4), (9, 64, 2), (65, 100, 0), (101, 200, 1), (201, 256, 0)])
    trt = trtllm_schedule(plan, schedule)
    assert trt is not None and trt.draft_len_schedule is not None
    assert trt.max_draft_len == 4 and trt.max_concurrency is None
    table = dict(trt.draft_len_schedule)
    assert table == {8: 4, 64: 2, 100: 0, 200: 1}  # the trailing K=0 band is implicit
    for batch in range(1, 257):
        assert trt_draft_len(table, batch) == k_at(schedule, batch)
    assert trt.cuda_graph_batch_sizes == (8, 64, 100, 200)


def test_trtllm_single_band_is_max_concurrency_or_nothing() -> None:
    plan = make_plan(max_num_seqs=256)
    cutoff = trtllm_schedule(plan, synthetic(plan, [(1, 100, 3), (101, 256, 0)]))
    assert cutoff is not None
    assert (cutoff.max_draft_len, cutoff.max_concurrency, cutoff.draft_len_schedule) == (3, 100, None)
    always = trtllm_schedule(plan, synthetic(plan, [(1, 256, 3)]))
    assert always is not None and (always.max_concurrency, always.draft_len_schedule) == (None, None)
    # Off at batch 1 but drafting later: TRT-LLM's smallest key must carry max_draft_len > 0.
    assert trtllm_schedule(plan, synthetic(plan, [(1, 4, 0), (5, 256, 2)])) is None


def test_trtllm_rechooses_with_k_capped_at_batch_one_when_larger_batches_go_deeper() -> None:
    # At 32k context, KV reads keep decode memory-bound and deeper K pays off at larger batches (K=4 up to batch 3,
    # K=5 beyond: the drafts' own cost is a smaller share of a step that streams 4 GB of KV per sequence).
    plan = make_plan(positions=(0.78, 0.58, 0.43), context_tokens=32768.0, max_num_seqs=512)
    schedule = schedule_for(plan)
    first = schedule.bands[0].gamma
    assert schedule.max_gamma > first  # the premise of this test
    trt = trtllm_schedule(plan, schedule)
    assert trt is not None and trt.max_draft_len == first
    capped = schedule_for(plan.capped(first))
    table = dict(trt.draft_len_schedule or ((512, first),))
    for batch in range(1, 513):
        assert trt_draft_len(table, batch) == k_at(capped, batch) <= first
    assert any("re-chosen" in note for note in trt.notes)


def test_inputs_from_evidence_use_its_acceptance_the_given_calibration_and_context() -> None:
    evidence = make_evidence(batch=12.0, step_time_s=0.012, context_tokens_per_seq=700.0)
    ctx = make_context()
    fitted = CostScales(memory=1.3, per_token=0.5)  # what the online fit found (carried on the board)
    plan = inputs_from_evidence(evidence, ctx, ScheduleAsk(max_num_seqs=128, gamma_max=5), scales=fitted)
    # E[L](3) = 1 + 0.78 + 0.58 + 0.43 = 2.79, read off the measured positions.
    assert plan.acceptance[3].expected_length == pytest.approx(2.79)
    # The one calibration: the scales given, not a refit of this window's step time.
    assert plan.scales == fitted
    assert plan.context_tokens == 700.0
    ask = ScheduleAsk(max_num_seqs=128, gamma_max=5, context_tokens=64.0)
    again = inputs_from_evidence(evidence, ctx, ask, scales=fitted)
    assert again.context_tokens == 64.0
    # Speculation off, nothing measured: the method's prior stands in and every K is extrapolated.
    ask = ScheduleAsk(max_num_seqs=64, gamma_max=4)
    prior = inputs_from_evidence(make_off_evidence(), ctx, ask, scales=CostScales())
    assert all(point.extrapolated for point in prior.acceptance[1:])
    with pytest.raises(ValueError, match="gamma_max"):
        inputs_from_evidence(evidence, ctx, ScheduleAsk(max_num_seqs=64, gamma_max=0), scales=fitted)


def test_the_schedule_and_the_recommendation_price_the_running_batch_alike() -> None:
    # One model, one calibration (issue 14 item 4): the schedule built from a target's evidence and the scales its
    # decision priced with gives, at the batch the target runs, the same S(gamma) as the decision's curve.
    evidence = make_evidence(batch=12.0, step_time_s=0.014, context_tokens_per_seq=700.0)
    ctx = make_context()
    advice = advise_target(evidence, ctx, AdvisorConfig(decide=DecideConfig(gamma_max=5)), AdvisorState(),
                           evidence.at_s)
    assert advice.calibration is not None and advice.decision.objective == "latency"
    ask = ScheduleAsk(max_num_seqs=64, gamma_max=5)
    plan = inputs_from_evidence(evidence, ctx, ask, scales=advice.calibration.scales)
    priced, _ = curve_for(
        plan.ctx, plan.acceptance,
        Shape(batch=12.0, context_tokens=plan.context_tokens, prefill_tokens=plan.prefill_tokens), scales=plan.scales,
    )
    for decided, scheduled in zip(advice.decision.curve, priced, strict=True):
        assert scheduled.speedup == pytest.approx(decided.speedup, rel=1e-9), decided.gamma


def sglang_tier(config: dict[str, object], batch: int) -> int:
    """SGLang's routing (adaptive_spec_params.py `_route`, CUDA-graph padding aside): the largest key <= batch."""
    key = max(int(k) for k in config if int(k) <= batch)
    tier = config[str(key)]
    assert isinstance(tier, dict)
    [steps] = tier["candidate_steps"]
    return int(steps)


def test_sglang_adaptive_config_reads_back_as_the_same_k_per_batch() -> None:
    plan = make_plan(max_num_seqs=256)
    schedule = synthetic(plan, [(1, 8, 4), (9, 64, 2), (65, 100, 0), (101, 200, 1), (201, 256, 0)])
    config = sglang_adaptive_config(schedule)
    assert config == {"1": {"candidate_steps": [4]}, "9": {"candidate_steps": [2]}, "65": {"candidate_steps": [0]},
                      "101": {"candidate_steps": [1]}, "201": {"candidate_steps": [0]}}
    for batch in range(1, 257):
        assert sglang_tier(config, batch) == k_at(schedule, batch)
    assert sglang_adaptive_config(schedule_for(make_plan(positions=(0.0,)))) is None
