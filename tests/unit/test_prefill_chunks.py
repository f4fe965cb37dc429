"""Prompt tokens arrive in chunks: the window's prompt tokens per prefilled request, and a MoE's expert bytes over
steps of which only some carry a chunk (policies/model/roofline.py `_mean_weight_bytes`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from estimate_builders import FIXTURE_CREATED_S, FIXTURE_TAKEN_AT_S, advance, feed, make_snapshot

from policies.estimate.window import EstimatorConfig, estimate
from policies.model.calibrate import CalibrationConfig, observation_from
from policies.model.costmodel import ModelContext, prefill_chunk
from policies.model.measured_profile import FORMAT, ProfileError, observations, parse_profile
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.model.roofline import Shape, target_step_time
from policies.types import DataState, DraftMethod, EngineSnapshot, HistogramReading
from service.sources.vllm import parse_vllm_metrics

CONFIG = EstimatorConfig(window_s=60.0, min_drafts=0)
VLLM = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
H100 = hardware_by_name("h100-sxm")
IDENTITY = {"hardware": "h100-sxm", "model_profile": "qwen3-30b-a3b", "tensor_parallel": 1, "drafter_method": "eagle3",
            "drafter_params": 2.5e8, "engine": "vllm", "engine_version": "0.32.0", "served_model": "m"}
QWEN3_MOE = model_by_name("qwen3-30b-a3b")


def _first_tokens(count: float) -> HistogramReading:
    return HistogramReading(sum=0.1 * count, count=count)


def _per_request(snapshots: list[EngineSnapshot]) -> float | None:
    state = feed(snapshots, CONFIG)
    return estimate(state, target="t", config=CONFIG, now_s=snapshots[-1].taken_at_s).prompt_tokens_per_request


def test_real_vllm_capture_gives_prompt_tokens_per_prefilled_request() -> None:
    idle = parse_vllm_metrics((VLLM / "vllm-0.32.0-cpu-ngram-k3-idle.txt").read_text(),
                              taken_at_s=FIXTURE_CREATED_S + 10)["tiny"]
    after = parse_vllm_metrics((VLLM / "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt").read_text(),
                               taken_at_s=FIXTURE_TAKEN_AT_S)["tiny"]
    # Capture lines: vllm:prompt_tokens_total 0 -> 2945, vllm:time_to_first_token_seconds_count 0 -> 30.
    assert after.first_token_latency is not None and after.first_token_latency.count == 30.0
    assert _per_request([idle, after]) == pytest.approx(2945.0 / 30.0)


def test_window_ratio_and_its_absences() -> None:
    first = make_snapshot(prompt_tokens=1000.0, first_token_latency=_first_tokens(10.0))
    later = advance(first, dt_s=20.0, prompt_tokens=3000.0, first_token_latency=_first_tokens(15.0))
    assert _per_request([first, later]) == pytest.approx(2000.0 / 5.0)
    # No prompt finished prefilling in the window: no chunk to speak of.
    still = advance(first, dt_s=20.0, prompt_tokens=1400.0)
    assert _per_request([first, still]) is None
    # An engine without the time-to-first-token histogram.
    bare = make_snapshot(prompt_tokens=1000.0)
    assert _per_request([bare, advance(bare, dt_s=20.0, prompt_tokens=3000.0)]) is None


def _experts(tokens: float) -> float:
    """Qwen3-30B-A3B's expected distinct experts per layer for `tokens` tokens: 128 (1 - (120/128)^n)."""
    return 128.0 * (1.0 - math.pow(120.0 / 128.0, tokens))


def _weight_bytes(shape: Shape) -> float:
    return target_step_time(H100, QWEN3_MOE, shape).weight_bytes


def test_moe_expert_bytes_average_over_steps_with_and_without_a_chunk() -> None:
    # 4.6 sequences x 4 tokens = 18.4 decode tokens; 43.5 prompt tokens per step on average in chunks of 372:
    # 11.7% of the steps carry a chunk (18.4 + 372 tokens), the rest none.
    decode = Shape(batch=4.6, context_tokens=600, tokens_per_seq=4.0)
    chunked = Shape(batch=4.6, context_tokens=600, tokens_per_seq=4.0, prefill_tokens=43.5, prefill_chunk_tokens=372.0)
    every_step = Shape(batch=4.6, context_tokens=600, tokens_per_seq=4.0, prefill_tokens=43.5)
    # One expert index over the 48 MoE layers: 3 x 2048 x 768 parameters per layer, bf16 (its config.json).
    per_expert = 48 * 3 * 2048 * 768 * 2.0
    assert _weight_bytes(every_step) - _weight_bytes(decode) == pytest.approx(
        per_expert * (_experts(61.9) - _experts(18.4)), rel=1e-6)
    share = 43.5 / 372.0
    mixed = (1.0 - share) * _experts(18.4) + share * _experts(390.4)
    assert mixed == pytest.approx(93.5, abs=0.1)
    assert _weight_bytes(chunked) - _weight_bytes(decode) == pytest.approx(per_expert * (mixed - _experts(18.4)),
                                                                            rel=1e-6)
    # Far fewer expert bytes than the same mean prompt load spread over every step (125.6 experts per layer).
    assert _weight_bytes(chunked) < 0.85 * _weight_bytes(every_step)


def test_chunks_change_nothing_for_a_dense_model_or_a_chunk_no_larger_than_the_mean() -> None:
    llama = model_by_name("llama-3.1-8b")
    shape = Shape(batch=8, context_tokens=600, tokens_per_seq=4.0, prefill_tokens=60.0)
    dense = target_step_time(H100, llama, shape).weight_bytes
    assert target_step_time(H100, llama, Shape(batch=8, context_tokens=600, tokens_per_seq=4.0, prefill_tokens=60.0,
                                               prefill_chunk_tokens=500.0)).weight_bytes == dense
    # Every step carries the mean when the chunk is no larger than it.
    small = Shape(batch=8, context_tokens=600, tokens_per_seq=4.0, prefill_tokens=60.0, prefill_chunk_tokens=40.0)
    assert _weight_bytes(small) == _weight_bytes(shape)


def test_calibration_point_caps_the_chunk_at_the_step_token_budget() -> None:
    first = make_snapshot(prompt_tokens=0.0, first_token_latency=_first_tokens(0.0),
                          inter_token_latency=HistogramReading(sum=0.0, count=0.0),
                          iteration_tokens=HistogramReading(sum=0.0, count=0.0), spec=None)
    # 2 prompts of 20000 tokens each were prefilled over 1000 steps that decoded 8 sequences each.
    later = advance(first, dt_s=60.0, prompt_tokens=40000.0, first_token_latency=_first_tokens(2.0),
                    inter_token_latency=HistogramReading(sum=8000 * 0.02, count=8000.0),
                    iteration_tokens=HistogramReading(sum=48000.0, count=1000.0), num_requests_running=8.0)
    evidence = estimate(feed([first, later], CONFIG), target="t", config=CONFIG, now_s=later.taken_at_s)
    assert evidence.state is DataState.OK and evidence.prompt_tokens_per_request == pytest.approx(20000.0)
    drafter = drafter_for(DraftMethod.NGRAM, QWEN3_MOE)
    budgeted = ModelContext(hardware=H100, model=QWEN3_MOE, drafter=drafter, step_token_budget=8192)
    point = observation_from(evidence, budgeted, config=CalibrationConfig(min_step_samples=1))
    # The engine schedules the 8 decoding sequences first: a prompt chunk gets what the 8192-token budget leaves.
    assert point is not None and point.prefill_chunk_tokens == 8192.0 - 8.0
    unbudgeted = ModelContext(hardware=H100, model=QWEN3_MOE, drafter=drafter)
    point = observation_from(evidence, unbudgeted, config=CalibrationConfig(min_step_samples=1))
    assert point is not None and point.prefill_chunk_tokens == pytest.approx(20000.0)


def test_a_small_budget_leaves_prompts_what_the_decode_tokens_do_not_take() -> None:
    # Budget 512, 100 decode tokens: a 2000-token prompt arrives 412 tokens a step; never less than the mean per
    # step (300 here would be below 412; 450 is above it: a chunk in every step).
    assert prefill_chunk(2000.0, prefill_tokens=300.0, decode_tokens=100.0, budget=512.0) == 412.0
    assert prefill_chunk(2000.0, prefill_tokens=450.0, decode_tokens=100.0, budget=512.0) == 450.0
    assert prefill_chunk(2000.0, prefill_tokens=300.0, decode_tokens=100.0, budget=None) == 2000.0
    assert prefill_chunk(300.0, prefill_tokens=30.0, decode_tokens=100.0, budget=8192.0) == 300.0
    for unknown in (None, math.nan, math.inf, 0.0, -5.0):
        assert prefill_chunk(unknown, prefill_tokens=30.0, decode_tokens=100.0, budget=512.0) is None


@pytest.mark.parametrize("chunk", [math.nan, math.inf, 0.0, -1.0])
def test_an_unphysical_chunk_is_refused_by_the_step_model(chunk: float) -> None:
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        _weight_bytes(Shape(batch=4.0, context_tokens=600, prefill_tokens=40.0, prefill_chunk_tokens=chunk))


def test_a_counter_that_is_not_a_number_gives_no_chunk() -> None:
    first = make_snapshot(prompt_tokens=1000.0, first_token_latency=_first_tokens(10.0))
    later = advance(first, dt_s=20.0, prompt_tokens=math.nan, first_token_latency=_first_tokens(15.0))
    assert _per_request([first, later]) is None


def test_the_measured_profile_carries_the_chunk_into_its_anchors() -> None:
    item = {"concurrency": 8, "deployed_k": 3, "batch": 7.6, "tokens_per_seq": 4.0, "draft_passes": 3,
            "context_tokens": 412.0, "prefill_tokens": 31.0, "step_s": 0.0123, "step_samples": 2411}
    data = {"format": FORMAT, "created_at_s": 1.8e9, "identity": IDENTITY, "complete": True,
            "points": [{**item, "prefill_chunk_tokens": 396.0}, item]}
    profile = parse_profile(data)
    chunked, older = observations(profile, at_s=1.8e9)
    assert chunked.prefill_chunk_tokens == 396.0 and chunked.shape.prefill_chunk_tokens == 396.0
    assert older.prefill_chunk_tokens is None  # a file written before the field
    assert parse_profile(profile.to_json()) == profile
    with pytest.raises(ProfileError, match="prefill_chunk_tokens"):
        parse_profile({**data, "points": [{**item, "prefill_chunk_tokens": -3.0}]})


def test_a_budget_the_decode_tokens_fill_leaves_no_chunk_rather_than_a_zero_one() -> None:
    # No prompt token per step measured (P 0) and 600 decode tokens against a 512-token budget: a chunk of 0 tokens
    # is no chunk, and the step model refuses a chunk that is not > 0 (it would have raised on this point).
    assert prefill_chunk(400.0, prefill_tokens=0.0, decode_tokens=600.0, budget=512.0) is None
