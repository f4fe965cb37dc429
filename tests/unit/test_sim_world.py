"""The simulated world: determinism, conservation of the spec-decode counters, acceptance truth, load physics,
restarts, that its /metrics page has the shape of a real vLLM 0.32 page, and the pure physics it delegates to."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.sim import physics
from service.sim import world as world_module
from service.sim.scenario import Scenario, scenario_from_mapping
from service.sim.world import EngineUnavailableError, World, expected_step_time_s

CAPTURE = Path(__file__).parents[1] / "fixtures" / "vllm" / "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt"
T0 = 1_800_000_000.0

BASE: dict[str, Any] = {
    "model_name": "sim-test",
    "seed": 3,
    "hardware": {
        "memory_bandwidth_bytes_per_s": 2.0e12,
        "achieved_bandwidth_ratio": 0.8,
        "dense_flops_per_s": 4.0e14,
        "achieved_flops_ratio": 0.5,
        "step_overhead_s": 0.003,
        "jitter_ratio": 0.02,
    },
    "model": {"weight_bytes": 8.0e9, "active_params": 4.0e9, "kv_bytes_per_token": 65536},
    "drafter": {"method": "eagle", "num_speculative_tokens": 3, "conditional_acceptance": [0.8, 0.6, 0.5]},
    "engine": {
        "max_num_seqs": 128,
        "max_num_batched_tokens": 4096,
        "kv_capacity_tokens": 200_000,
        "block_size": 16,
        "max_model_len": 4096,
        "restart_delay_s": 10,
    },
    "workload": {
        "period_s": 60,
        "arrival_rate": [{"t_s": 0, "requests_per_s": 5.0}],
        "prompt_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 300},
        "output_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 200},
    },
}


def make_scenario(**overrides: Any) -> Scenario:
    """BASE with section-level overrides merged in, e.g. make_scenario(drafter={"num_speculative_tokens": 0})."""
    data = copy.deepcopy(BASE)
    for section, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(section), dict):
            data[section].update(value)
        else:
            data[section] = value
    return scenario_from_mapping(data)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"engine": "0", "model_name": "sim-test", **labels}.items())))
    return samples(text)[key]


def per_pos(text: str, k: int) -> list[float]:
    return [value(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(k)]


def run(scenario: Scenario, seconds: float, *, seed: int = 0) -> World:
    world = World(scenario, seed=seed, start_s=T0)
    world.advance_to(T0 + seconds)
    return world


# -- determinism ---------------------------------------------------------------------------------------------


def test_same_seed_same_page_regardless_of_how_time_is_advanced() -> None:
    scenario = make_scenario()
    one_jump = run(scenario, 120.0, seed=5)
    small_steps = World(scenario, seed=5, start_s=T0)
    t = T0
    while t < T0 + 120.0:
        t += 0.37
        small_steps.advance_to(min(t, T0 + 120.0))
    assert one_jump.exposition() == small_steps.exposition()


def test_different_seed_different_history() -> None:
    scenario = make_scenario()
    a = run(scenario, 60.0, seed=1).exposition()
    b = run(scenario, 60.0, seed=2).exposition()
    assert value(a, "vllm:generation_tokens_total") != value(b, "vllm:generation_tokens_total")


def test_time_never_moves_backwards() -> None:
    world = run(make_scenario(), 30.0)
    before = world.exposition()
    world.advance_to(T0 + 10.0)
    assert world.now_s == T0 + 30.0
    assert world.exposition() == before


# -- spec-decode counters ------------------------------------------------------------------------------------


def test_counters_are_conserved() -> None:
    text = run(make_scenario(), 90.0).exposition()
    drafts = value(text, "vllm:spec_decode_num_drafts_total")
    accepted = value(text, "vllm:spec_decode_num_accepted_tokens_total")
    positions = per_pos(text, 3)
    assert drafts > 0
    # vLLM's invariant: per_pos[i] counts drafts with at least i+1 accepted, so their sum is the accepted total.
    assert sum(positions) == accepted
    assert positions[0] >= positions[1] >= positions[2]
    # EAGLE always proposes k: draft tokens = 3 x drafts.
    assert value(text, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts
    # One verification per decoding request per step, and one inter-token observation for each.
    assert value(text, "vllm:inter_token_latency_seconds_count") == drafts


def test_acceptance_from_counters_approaches_the_configured_profile() -> None:
    text = run(make_scenario(), 240.0).exposition()
    drafts = value(text, "vllm:spec_decode_num_drafts_total")
    r = [p / drafts for p in per_pos(text, 3)]
    assert drafts > 50_000
    # r_i = P(at least i+1 accepted) = c_0 x ... x c_i: 0.8, 0.8 x 0.6 = 0.48, 0.48 x 0.5 = 0.24.
    assert r == pytest.approx([0.8, 0.48, 0.24], abs=0.01)
    conditional = [r[0], r[1] / r[0], r[2] / r[1]]
    assert conditional == pytest.approx([0.8, 0.6, 0.5], abs=0.02)


def test_acceptance_drifts_to_the_second_profile() -> None:
    scenario = make_scenario(
        drafter={"conditional_acceptance_drift_to": [0.4, 0.3, 0.2], "drift_start_s": 30, "drift_end_s": 60}
    )
    world = World(scenario, start_s=T0)
    world.advance_to(T0 + 90.0)
    early = world.exposition()
    world.advance_to(T0 + 330.0)
    late = world.exposition()
    drafts = value(late, "vllm:spec_decode_num_drafts_total") - value(early, "vllm:spec_decode_num_drafts_total")
    first = per_pos(late, 3)[0] - per_pos(early, 3)[0]
    # After the drift ends only the second profile holds: r_0 = c_0 = 0.4.
    assert first / drafts == pytest.approx(0.4, abs=0.02)
    assert world.conditional_acceptance == (0.4, 0.3, 0.2)


def test_requests_that_differ_show_rising_conditional_acceptance_in_the_counters() -> None:
    # Every position 0.6, but each quarter of the requests at 0.6 x exp(0.5 z), z the mean of its quartile of a
    # standard normal. vLLM sums the counters over requests: the requests still accepted at position 2 are mostly
    # the well-predicted ones, so the counters' conditional rate rises with the position though no request's does.
    # A class that emits fewer tokens per step runs longer: its share of verifications is proportional to 1 / E_c.
    scenario = make_scenario(drafter={"conditional_acceptance": [0.6], "request_acceptance_spread": 0.5})
    text = run(scenario, 300.0).exposition()
    normal = NormalDist()
    edge = normal.inv_cdf(0.75)
    z = [-normal.pdf(edge) / 0.25, -(normal.pdf(0) - normal.pdf(edge)) / 0.25,
         (normal.pdf(0) - normal.pdf(edge)) / 0.25, normal.pdf(edge) / 0.25]
    reach = []  # per class: P(at least i+1 accepted), i = 0..2
    for zc in z:
        c = min(0.98, 0.6 * math.exp(0.5 * zc))
        reach.append([c, c * c, c * c * c])
    weights = [1.0 / (1.0 + sum(r)) for r in reach]
    expected = [sum(w * r[i] for w, r in zip(weights, reach, strict=True)) / sum(weights) for i in range(3)]
    drafts = value(text, "vllm:spec_decode_num_drafts_total")
    measured = [p / drafts for p in per_pos(text, 3)]
    assert measured == pytest.approx(expected, abs=0.015)
    conditional = [measured[0], measured[1] / measured[0], measured[2] / measured[1]]
    assert conditional[0] < 0.6 < conditional[1] < conditional[2]
    # The model-facing mean matches: tokens per step averaged over the classes.
    mean = physics.mean_tokens_per_verification(scenario.drafter, 3, (0.6, 0.6, 0.6))
    assert mean == pytest.approx(sum(1.0 + sum(r) for r in reach) / 4, rel=1e-4)  # z to 4 decimals there


def test_alike_requests_keep_the_world_as_it_was() -> None:
    # Spread 0 draws nothing more: the same seed gives the same page as a scenario that never heard of it.
    plain = run(make_scenario(), 60.0).exposition()
    alike = run(make_scenario(drafter={"request_acceptance_spread": 0.0}), 60.0).exposition()
    assert plain == alike


def test_ngram_proposes_fewer_and_sometimes_nothing() -> None:
    scenario = make_scenario(
        drafter={
            "method": "ngram",
            "num_speculative_tokens": 4,
            "conditional_acceptance": [0.7],
            "lookup_match_ratio": 0.6,
            "lookup_full_length_ratio": 0.5,
            "host_s_per_request": 1e-5,
        }
    )
    text = run(scenario, 90.0).exposition()
    drafts = value(text, "vllm:spec_decode_num_drafts_total")
    verifications = value(text, "vllm:inter_token_latency_seconds_count")
    # A lookup that finds nothing is no draft: about 60% of verifications are drafts.
    assert drafts / verifications == pytest.approx(0.6, abs=0.02)
    # Half the drafts propose all 4, the rest 1..3 uniformly (mean 2): 0.5 x 4 + 0.5 x 2 = 3 tokens per draft.
    assert value(text, "vllm:spec_decode_num_draft_tokens_total") / drafts == pytest.approx(3.0, abs=0.05)
    positions = per_pos(text, 4)
    assert sum(positions) == value(text, "vllm:spec_decode_num_accepted_tokens_total")


def test_speculation_off_means_the_families_are_absent() -> None:
    text = run(make_scenario(drafter={"num_speculative_tokens": 0}), 30.0).exposition()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert not any(name.startswith("vllm:spec_decode") for name in names)
    assert value(text, "vllm:generation_tokens_total") > 0


# -- load physics ----------------------------------------------------------------------------------------------


def _mean_batch_and_step(rate: float) -> tuple[float, float]:
    scenario = make_scenario(workload={"arrival_rate": [{"t_s": 0, "requests_per_s": rate}]})
    world = World(scenario, start_s=T0)
    world.advance_to(T0 + 30.0)  # warm up
    start = world.exposition()
    batches = []
    for i in range(1, 61):
        world.advance_to(T0 + 30.0 + i)
        batches.append(world.num_running)
    end = world.exposition()
    itl_sum = value(end, "vllm:inter_token_latency_seconds_sum") - value(start, "vllm:inter_token_latency_seconds_sum")
    itl_n = value(end, "vllm:inter_token_latency_seconds_count") - value(
        start, "vllm:inter_token_latency_seconds_count"
    )
    return sum(batches) / len(batches), itl_sum / itl_n


def test_more_load_means_bigger_batches_and_slower_steps() -> None:
    low_batch, low_step = _mean_batch_and_step(2.0)
    high_batch, high_step = _mean_batch_and_step(40.0)
    assert high_batch > 2 * low_batch
    assert high_step > low_step


def test_requests_still_prefilling_run_but_do_not_decode() -> None:
    """Long prompts through a small token budget take several steps to prefill: those requests are running (vLLM's
    gauge counts them) but a step verifies only the others. Sampled every 0.5 s for a minute, the decoding count
    matches the sequences per step the page's own counters give (inter-token latencies over steps: a time average
    weighs the fewer, longer large-batch steps more, so a little over), while the running count is far above it."""
    scenario = make_scenario(
        engine={"max_num_batched_tokens": 512},
        workload={"arrival_rate": [{"t_s": 0, "requests_per_s": 4.0}],
                  "prompt_tokens": {"kind": "uniform", "min_tokens": 2000, "max_tokens": 3000}},
    )
    world = World(scenario, start_s=T0)
    world.advance_to(T0 + 30.0)  # warm up
    start = world.exposition()
    samples = []
    for i in range(1, 121):
        world.advance_to(T0 + 30.0 + 0.5 * i)
        samples.append((world.num_running, world.num_decoding, world.mean_decode_context_tokens))
    end = world.exposition()
    itl = value(end, "vllm:inter_token_latency_seconds_count") - value(start, "vllm:inter_token_latency_seconds_count")
    steps = value(end, "vllm:iteration_tokens_total_count") - value(start, "vllm:iteration_tokens_total_count")
    per_step = itl / steps
    running = sum(r for r, _, _ in samples) / len(samples)
    decoding = sum(d for _, d, _ in samples) / len(samples)
    assert all(0 <= d <= r for r, d, _ in samples)
    assert per_step <= decoding <= 1.15 * per_step
    assert running > 1.3 * per_step
    assert all(ctx == 0.0 for _, d, ctx in samples if d == 0)
    assert all(ctx >= 2000 for _, d, ctx in samples if d > 0)  # a decoding request has its whole prompt computed


def test_truth_step_time_grows_with_batch_and_with_k() -> None:
    scenario = make_scenario()
    times = [
        expected_step_time_s(scenario, num_seqs=b, num_speculative_tokens=3, mean_context_tokens=500)
        for b in (1, 16, 64, 256)
    ]
    assert times == sorted(times)
    off = expected_step_time_s(scenario, num_seqs=64, num_speculative_tokens=0, mean_context_tokens=500)
    assert off < times[2]


def test_small_kv_cache_preempts_and_still_completes_requests() -> None:
    scenario = make_scenario(
        engine={"kv_capacity_tokens": 6000},
        workload={"arrival_rate": [{"t_s": 0, "requests_per_s": 20.0}]},
    )
    world = run(scenario, 60.0)
    text = world.exposition()
    assert value(text, "vllm:num_preemptions_total") > 0
    assert value(text, "vllm:request_success_total", finished_reason="length") > 0
    assert 0.0 <= world.kv_cache_usage_ratio <= 1.0


def test_no_arrivals_no_work() -> None:
    world = run(make_scenario(workload={"arrival_rate": [{"t_s": 0, "requests_per_s": 0.0}]}), 3600.0)
    text = world.exposition()
    assert value(text, "vllm:generation_tokens_total") == 0
    assert value(text, "vllm:spec_decode_num_drafts_total") == 0
    assert per_pos(text, 3) == [0, 0, 0]  # all k positions exist from start-up, at 0


def test_arrival_rate_profile_is_periodic_and_piecewise_linear() -> None:
    scenario = make_scenario(
        workload={
            "period_s": 100,
            "arrival_rate": [{"t_s": 0, "requests_per_s": 2.0}, {"t_s": 50, "requests_per_s": 12.0}],
        }
    )
    world = World(scenario, start_s=T0)
    # Halfway up the first segment: 2 + (12 - 2) x 25/50 = 7; on the way back at 75 s: 12 + (2 - 12) x 25/50 = 7.
    world.advance_to(T0 + 25.0)
    assert world.arrival_rate_per_s == pytest.approx(7.0)
    world.advance_to(T0 + 175.0)
    assert world.arrival_rate_per_s == pytest.approx(7.0)


# -- restarts ------------------------------------------------------------------------------------------------


def test_speculation_change_restarts_with_fresh_counters() -> None:
    world = run(make_scenario(), 60.0)
    before = world.exposition()
    assert value(before, "vllm:generation_tokens_total") > 0
    world.set_speculation(2, now_s=T0 + 60.0)
    assert not world.serving
    world.advance_to(T0 + 65.0)
    with pytest.raises(EngineUnavailableError):
        world.exposition()
    world.advance_to(T0 + 70.0)  # restart_delay_s = 10
    after = world.exposition()
    assert value(after, "vllm:generation_tokens_created") == T0 + 70.0
    assert value(before, "vllm:generation_tokens_created") == T0
    assert value(after, "vllm:spec_decode_num_drafts_total") == 0
    assert value(after, "vllm:generation_tokens_total") == 0
    assert per_pos(after, 2) == [0, 0]
    assert (
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        (("engine", "0"), ("model_name", "sim-test"), ("position", "2")),
    ) not in samples(after)
    assert world.lifetime.lost_requests > 0


def test_same_k_is_not_a_restart() -> None:
    world = run(make_scenario(), 20.0)
    world.set_speculation(3, now_s=T0 + 20.0)
    assert world.serving
    world.exposition()


def test_repeating_the_change_during_a_restart_does_not_prolong_it() -> None:
    world = run(make_scenario(), 20.0)
    world.set_speculation(1, now_s=T0 + 20.0)
    world.set_speculation(1, now_s=T0 + 25.0)
    # The restart began at 20 s and lasts restart_delay_s = 10 s, so it is over at 30 s whatever the retry did.
    world.advance_to(T0 + 30.0)
    assert world.serving
    assert value(world.exposition(), "vllm:spec_decode_num_drafts_created") == T0 + 30.0


def test_turning_speculation_off_removes_the_families_after_the_restart() -> None:
    world = run(make_scenario(), 20.0)
    world.set_speculation(0, now_s=T0 + 20.0)
    world.advance_to(T0 + 40.0)
    names = {f.name for f in text_string_to_metric_families(world.exposition())}
    assert "vllm:spec_decode_num_drafts" not in names
    assert world.num_speculative_tokens == 0


def test_out_of_range_k_is_refused() -> None:
    world = World(make_scenario(), start_s=T0)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        world.set_speculation(17, now_s=T0)


# -- shape of the page -----------------------------------------------------------------------------------------


def _vllm_shape(text: str) -> dict[str, tuple[str, frozenset[frozenset[str]]]]:
    """Family name -> (type, the label-name sets its samples use), vLLM families only."""
    shape = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:"):
            label_sets = frozenset(frozenset(s.labels) for s in family.samples)
            shape[family.name] = (family.type, label_sets)
    return shape


def _buckets(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for family in text_string_to_metric_families(text):
        if family.type == "histogram" and family.name.startswith("vllm:"):
            out[family.name] = [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
    return out


def _capture_like_world() -> World:
    # The capture's server had max_model_len 512 (its kv_cache_max_concurrency = 1048576 / 512 = 2048), which is
    # what vLLM builds the token histograms' 1-2-5 buckets up to.
    scenario = make_scenario(
        engine={"max_model_len": 512},
        workload={
            "prompt_tokens": {"kind": "fixed", "tokens": 100},
            "output_tokens": {"kind": "fixed", "tokens": 64},
        },
    )
    return run(scenario, 30.0)


def test_names_types_labels_and_buckets_match_the_real_capture() -> None:
    real = CAPTURE.read_text(encoding="utf-8")
    ours = _capture_like_world().exposition()
    assert _vllm_shape(ours) == _vllm_shape(real)
    assert _buckets(ours) == _buckets(real)


def test_colons_and_created_siblings_survive_rendering() -> None:
    text = _capture_like_world().exposition()
    assert '\nvllm:spec_decode_num_drafts_total{engine="0",model_name="sim-test"} ' in text
    assert "# TYPE vllm:spec_decode_num_drafts_created gauge" in text
    assert "# TYPE vllm:inter_token_latency_seconds_created gauge" in text
    assert "vllm_" not in text


def test_cache_config_info_reports_the_kv_geometry() -> None:
    text = run(make_scenario(), 1.0).exposition()
    info = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info")
    labels = info.samples[0].labels
    # 200000 tokens / 16 per block = 12500 blocks; size in tokens = 12500 x 16 = 200000.
    assert labels["block_size"] == "16"
    assert labels["num_gpu_blocks"] == "12500"
    assert labels["kv_cache_size_tokens"] == "200000"


# -- physics (pure functions of the scenario, delegated to by the world) ----------------------------------------


def test_world_still_exports_the_physics_it_delegates_to() -> None:
    # Callers import these from service.sim.world; they must be the very functions the world runs on.
    for name in (
        "expected_step_time_s",
        "target_step_time_s",
        "draft_time_s",
        "acceptance_at",
        "arrival_rate_at",
        "expected_tokens_per_verification",
        "expected_proposed_tokens",
    ):
        assert getattr(world_module, name) is getattr(physics, name), name


def test_expected_tokens_per_verification_is_one_plus_the_chained_acceptance() -> None:
    drafter = make_scenario().drafter  # EAGLE proposes all k tokens every time
    # 1 + 0.8 + 0.8 x 0.6 + 0.8 x 0.6 x 0.5 = 1 + 0.8 + 0.48 + 0.24 = 2.52
    assert physics.expected_tokens_per_verification(drafter, 3, (0.8, 0.6, 0.5)) == pytest.approx(2.52)
    assert physics.expected_tokens_per_verification(drafter, 0, ()) == 1.0


def test_lookup_drafter_proposes_on_a_match_only_and_sometimes_short() -> None:
    drafter = make_scenario(
        drafter={
            "method": "ngram",
            "num_speculative_tokens": 4,
            "lookup_match_ratio": 0.6,
            "lookup_full_length_ratio": 0.5,
        }
    ).drafter
    # On a match (0.6): all 4 with 0.5, else 1..3 uniformly (mean 2), so 0.5 x 4 + 0.5 x 2 = 3; 0.6 x 3 = 1.8.
    assert physics.expected_proposed_tokens(drafter, 4) == pytest.approx(1.8)
    # Every proposal is verified along with the request's own token: 1 + 1.8.
    assert physics.verified_tokens_per_request(drafter, 4) == pytest.approx(2.8)


def test_drawn_verifications_keep_the_counter_invariants_and_the_profile() -> None:
    drafter = make_scenario().drafter
    draw = physics.draw_verifications(random.Random(1), drafter, k=3, verifications=200_000, acceptance=(0.8, 0.6, 0.5))
    # EAGLE: every verification is a draft of all 3 tokens.
    assert (draw.drafts, draw.draft_tokens) == (200_000, 600_000)
    assert draw.accepted == sum(draw.accepted_per_pos)
    # P(at least i+1 accepted): 0.8, 0.8 x 0.6 = 0.48, 0.48 x 0.5 = 0.24.
    assert [n / draw.drafts for n in draw.accepted_per_pos] == pytest.approx([0.8, 0.48, 0.24], abs=0.005)
    none = physics.draw_verifications(random.Random(1), drafter, k=3, verifications=0, acceptance=(0.8, 0.6, 0.5))
    assert (none.drafts, none.draft_tokens, none.accepted_per_pos) == (0, 0, (0, 0, 0))


def test_step_time_is_the_slower_of_memory_and_compute_plus_overheads() -> None:
    scenario = make_scenario()
    # One token, no KV: memory = 8e9 B / (2e12 B/s x 0.8) = 5 ms; compute = 2 x 4e9 FLOP / (4e14 x 0.5 FLOP/s)
    # = 0.04 ms. The p-norm (p = 3) of 5 and 0.04 is 5 x (1 + 0.008^3)^(1/3) ~ 5 ms, plus 3 ms step overhead = 8 ms.
    one = physics.target_step_time_s(scenario, tokens=1, kv_tokens_read=0.0, attention_pairs=0.0)
    assert one == pytest.approx(0.008, rel=1e-3)
    assert physics.draft_time_s(scenario, num_seqs=8, num_speculative_tokens=0) == 0.0
