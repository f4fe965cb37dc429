"""Objectives: which one applies, the capacity rule (KV the drafts reserve) and goodput under an ITL SLO."""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist

import pytest
from costmodel_builders import make_context, make_evidence

from policies.model.acceptance import acceptance_curve
from policies.model.costmodel import curve_for
from policies.model.objectives import (
    Objective,
    ObjectiveConfig,
    Workload,
    choose_objective,
    held_batch,
    objective_curve,
    open_loop_batch,
    slo_share,
    workload_from,
)
from policies.model.roofline import Shape
from policies.types import DraftMethod

ACCEPTANCE = acceptance_curve(make_evidence().acceptance, method=DraftMethod.EAGLE3, gamma_max=4)


def test_choice_follows_queue_kv_and_slo() -> None:
    config = ObjectiveConfig()
    assert choose_objective(Workload(8.0, 0.0, 512.0, kv_usage_ratio=0.3), config)[:2] == (Objective.LATENCY, False)
    queued = choose_objective(Workload(256.0, 50.0, 512.0, kv_usage_ratio=0.62), config)
    assert queued[:2] == (Objective.CAPACITY, True)
    assert "50 waiting" in queued[2] and "62%" in queued[2]
    assert choose_objective(Workload(64.0, 0.0, 512.0, kv_usage_ratio=0.95), config)[1]
    slo = choose_objective(Workload(8.0, 0.0, 512.0), ObjectiveConfig(itl_slo_s=0.02))
    assert slo[0] is Objective.GOODPUT_SLO and "20 ms" in slo[2]
    with pytest.raises(ValueError):
        ObjectiveConfig(itl_slo_s=0.0)


def test_latency_objective_is_the_plain_curve() -> None:
    ctx = make_context()
    curve, objective, _ = objective_curve(ctx, ACCEPTANCE, Workload(8.0, 0.0, 512.0), config=ObjectiveConfig())
    assert objective is Objective.LATENCY
    assert curve == curve_for(ctx, ACCEPTANCE, Shape(batch=8.0, context_tokens=512.0))[0]


def test_kv_reserved_by_drafts_limits_the_batch_when_the_cache_is_full() -> None:
    # Cache full at B=64, ctx 264 with k=3 deployed, 20 waiting: capacity 64 x 264 / 1.0 = 16896 tokens.
    workload = Workload(64.0, 20.0, 264.0, kv_usage_ratio=1.0, deployed_k=3)
    assert workload.kv_capacity_tokens == pytest.approx(16896.0)
    # gamma 0: 16896 / (261 + 0) = 64.74; gamma 4: 16896 / 265 = 63.76; both below the demand 84.
    assert held_batch(workload, 0, kv_full=True) == pytest.approx(16896.0 / 261.0)
    assert held_batch(workload, 4, kv_full=True) == pytest.approx(16896.0 / 265.0)
    assert held_batch(workload, 4, kv_full=False) == 64.0
    ctx = make_context()
    curve, objective, _ = objective_curve(ctx, ACCEPTANCE, workload, config=ObjectiveConfig())
    assert objective is Objective.CAPACITY
    # S_cap(4) = [B4 E[L](4) / T(B4, 4)] / [B0 / T(B0, 0)], each step priced at its own batch.
    b0, b4 = 16896.0 / 261.0, 16896.0 / 265.0
    plain = curve_for(ctx, ACCEPTANCE, Shape(batch=b0, context_tokens=264.0))
    spec = curve_for(ctx, ACCEPTANCE, Shape(batch=b4, context_tokens=264.0))
    expected = (b4 * ACCEPTANCE[4].expected_length / spec[0][4].step_time_s) / (b0 / plain[1])
    assert curve[4].speedup == pytest.approx(expected)
    # Fewer sequences fit with drafts, so capacity speedup < per-sequence speedup at the same batch.
    assert curve[4].speedup < spec[0][4].speedup
    assert curve[4].speedup_low <= curve[4].speedup <= curve[4].speedup_high


def test_capacity_bound_without_a_full_cache_keeps_the_batch() -> None:
    ctx = make_context()
    workload = Workload(256.0, 50.0, 512.0, kv_usage_ratio=0.62, deployed_k=3)
    curve, objective, _ = objective_curve(ctx, ACCEPTANCE, workload, config=ObjectiveConfig())
    assert objective is Objective.CAPACITY
    assert curve == curve_for(ctx, ACCEPTANCE, Shape(batch=256.0, context_tokens=512.0))[0]


def test_goodput_under_an_itl_slo() -> None:
    ctx = make_context()
    workload = Workload(1.0, 0.0, 512.0)
    plain_curve, plain_step = curve_for(ctx, ACCEPTANCE, Shape(batch=1.0, context_tokens=512.0))
    # SLO halfway between the plain ITL and the speculative ITL at gamma 3 (T(3) / E[L](3)): plain misses it.
    spec_itl = plain_curve[3].step_time_s / ACCEPTANCE[3].expected_length
    slo = 0.5 * (spec_itl + plain_step)
    curve, objective, _ = objective_curve(ctx, ACCEPTANCE, workload, config=ObjectiveConfig(itl_slo_s=slo))
    assert objective is Objective.GOODPUT_SLO
    # No queue: the server delivers the offered load whatever gamma runs, so goodput differs only by the share
    # meeting the SLO, a log-normal CDF of per-request ITLs with a 10% spread, floored at 1%.
    def share(itl: float) -> float:
        return max(0.01, NormalDist().cdf(math.log(slo / itl) / 0.10))

    share_plain, share_spec = share(plain_step), share(spec_itl)
    assert curve[3].speedup == pytest.approx(share_spec / share_plain)
    assert curve[3].slo_share == pytest.approx(share_spec) and curve[0].slo_share == pytest.approx(share_plain)
    # A loose SLO that everything meets: no option delivers more tokens meeting it, speed beyond it earns nothing.
    loose, _, _ = objective_curve(ctx, ACCEPTANCE, workload, config=ObjectiveConfig(itl_slo_s=1.0))
    assert all(p.speedup == pytest.approx(1.0) for p in loose)


def test_chunked_prefill_stretches_every_option_by_the_share_it_takes_of_the_running_step() -> None:
    # 1000 prompt tokens per step, measured while gamma 3 runs at batch 64. The server's own ITL (its mixed step /
    # E[L](3)) is what the share meeting the SLO must be judged on for the option that runs; the prompt load is a
    # rate, so every option's decode step is stretched by the same factor, T(64, 3, P) / T(64, 3, 0). A request
    # waiting (capacity-bound, cache not full): every option holds batch 64, so the stretch is all that differs.
    ctx = make_context()
    workload = Workload(64.0, 1.0, 512.0, prefill_tokens=1000.0, kv_usage_ratio=0.5, deployed_k=3)
    spec, _ = curve_for(ctx, ACCEPTANCE, Shape(batch=64.0, context_tokens=512.0))
    mixed, _ = curve_for(ctx, ACCEPTANCE, Shape(batch=64.0, context_tokens=512.0, prefill_tokens=1000.0))
    stretch = mixed[3].step_time_s / spec[3].step_time_s
    running_itl = mixed[3].step_time_s / ACCEPTANCE[3].expected_length
    config = ObjectiveConfig(itl_slo_s=running_itl * 1.05)  # the running option just meets it
    curve, _, _ = objective_curve(ctx, ACCEPTANCE, workload, config=config)
    assert curve[3].slo_share == pytest.approx(slo_share(running_itl, config))
    for gamma in (1, 2):
        itl = spec[gamma].step_time_s * stretch / ACCEPTANCE[gamma].expected_length
        assert curve[gamma].slo_share == pytest.approx(slo_share(itl, config))
    # The prefill is a larger share of a plain step than of a speculative one; pricing rho against the plain step
    # (as before 2026-12-03) would stretch the running option past what the server shows.
    plain_mixed = curve_for(ctx, ACCEPTANCE[:1], Shape(batch=64.0, context_tokens=512.0, prefill_tokens=1000.0))[1]
    plain = curve_for(ctx, ACCEPTANCE[:1], Shape(batch=64.0, context_tokens=512.0))[1]
    assert plain_mixed / plain > stretch * 1.05


def test_an_option_that_cannot_hold_the_open_load_is_counted_at_what_it_serves() -> None:
    # Gamma 3 runs at batch 64 with no queue and the KV cache 85% used: 64 / 0.85 = 75.3 sequences fit. Plain
    # decoding is slower per token, so under the same arrivals it would need more sequences in flight than fit:
    # it stops at 75.3 and serves (75.3 / T0(75.3)) / (64 / ITL3) of the load. The SLO is loose (every request
    # meets it), so that share is all that tells the two apart.
    ctx = make_context()
    workload = Workload(64.0, 0.0, 512.0, kv_usage_ratio=0.85, deployed_k=3)
    config = ObjectiveConfig(itl_slo_s=1.0)
    curve, objective, _ = objective_curve(ctx, ACCEPTANCE, workload, config=config)
    assert objective is Objective.GOODPUT_SLO
    cap = 64.0 / 0.85
    running_itl = curve_for(ctx, ACCEPTANCE, Shape(batch=64.0, context_tokens=512.0))[0][3].step_time_s / (
        ACCEPTANCE[3].expected_length)
    plain_step = curve_for(ctx, ACCEPTANCE, Shape(batch=cap, context_tokens=512.0))[1]
    assert 64.0 * plain_step / running_itl > cap  # the load plain decoding would need does not fit
    served = (cap / plain_step) / (64.0 / running_itl)
    assert served < 0.95
    assert curve[3].speedup == pytest.approx(1.0 / served, rel=1e-3)
    # With room for every option (usage unknown: 4x the batch), both deliver the load and meet the SLO alike.
    roomy, _, _ = objective_curve(ctx, ACCEPTANCE, Workload(64.0, 0.0, 512.0, deployed_k=3), config=config)
    assert roomy[3].speedup == pytest.approx(1.0)


def test_a_deployed_k_past_the_curve_keeps_the_measured_batch_for_every_option() -> None:
    # k = 6 deployed, the curve stops at 4: no point anchors the open load, so every option is priced at batch 64.
    ctx = make_context()
    config = ObjectiveConfig(itl_slo_s=0.02)
    curve, _, _ = objective_curve(ctx, ACCEPTANCE, Workload(64.0, 0.0, 512.0, deployed_k=6), config=config)
    held = curve_for(ctx, ACCEPTANCE, Shape(batch=64.0, context_tokens=512.0))[0]
    assert [p.step_time_s for p in curve] == pytest.approx([p.step_time_s for p in held])


def test_chunked_prefill_stretch_applies_at_each_options_open_load_batch() -> None:
    # As above, but nothing waits: each option holds the batch the open load gives it (open_loop_batch, anchored
    # on gamma 3's model ITL at batch 64), and its step there is stretched by the same prefill share.
    ctx = make_context()
    workload = Workload(64.0, 0.0, 512.0, prefill_tokens=1000.0, deployed_k=3)
    spec, _ = curve_for(ctx, ACCEPTANCE, Shape(batch=64.0, context_tokens=512.0))
    mixed, _ = curve_for(ctx, ACCEPTANCE, Shape(batch=64.0, context_tokens=512.0, prefill_tokens=1000.0))
    stretch = mixed[3].step_time_s / spec[3].step_time_s
    model_itl = spec[3].step_time_s / ACCEPTANCE[3].expected_length
    config = ObjectiveConfig(itl_slo_s=model_itl * stretch * 1.05)
    curve, objective, _ = objective_curve(ctx, ACCEPTANCE, workload, config=config)
    assert objective is Objective.GOODPUT_SLO
    assert curve[3].slo_share == pytest.approx(slo_share(model_itl * stretch, config))
    for gamma in (0, 2):
        length = ACCEPTANCE[gamma].expected_length

        def itl_at(batch: float, gamma: int = gamma, length: float = length) -> float:
            return curve_for(ctx, ACCEPTANCE, Shape(batch=batch, context_tokens=512.0))[0][gamma].step_time_s / length

        batch = open_loop_batch(64.0, model_itl, itl_at, cap=256.0)
        assert batch != pytest.approx(64.0, rel=0.01)  # the option does move the batch
        assert curve[gamma].slo_share == pytest.approx(slo_share(itl_at(batch) * stretch, config))


def test_slo_share_is_a_floored_log_normal_cdf() -> None:
    config = ObjectiveConfig(itl_slo_s=0.008)
    assert slo_share(0.008, config) == pytest.approx(0.5)
    # 10% spread: a mean 10% under the SLO keeps Phi(ln(1/0.9) / 0.1) = Phi(1.054) = 85.4% of requests under it.
    assert slo_share(0.0072, config) == pytest.approx(0.854, abs=0.001)
    # Far over the SLO: the floor, not a vanishing number (a ratio of two of those would mean nothing).
    assert slo_share(0.011, config) == 0.01 and slo_share(math.inf, config) == 0.01
    assert slo_share(0.004, config) == pytest.approx(1.0)
    assert slo_share(0.5, ObjectiveConfig()) == 1.0  # no SLO: everything counts
    with pytest.raises(ValueError, match="slo_share_floor"):
        ObjectiveConfig(slo_share_floor=0.0)


def test_goodput_under_an_itl_slo_while_capacity_bound_counts_throughput() -> None:
    ctx = make_context()
    # 50 waiting: the server's throughput is what it delivers; a loose SLO everything meets is then throughput.
    workload = Workload(256.0, 50.0, 512.0, kv_usage_ratio=0.62, deployed_k=3)
    plain = curve_for(ctx, ACCEPTANCE, Shape(batch=256.0, context_tokens=512.0))[0]
    loose, objective, _ = objective_curve(ctx, ACCEPTANCE, workload, config=ObjectiveConfig(itl_slo_s=10.0))
    assert objective is Objective.GOODPUT_SLO
    assert loose[3].speedup == pytest.approx(plain[3].speedup)


def test_an_slo_no_option_meets_keeps_the_floor_shares_and_says_so() -> None:
    ctx = make_context()
    # A queue and every option's ITL far past a 1 us SLO: every share sits at the 1% floor. No change can gain
    # tokens meeting it, so the ranking stays the SLO's (whatever runs stays), and the reason says why.
    workload = Workload(256.0, 50.0, 512.0, kv_usage_ratio=0.62, deployed_k=3)
    curve, objective, why = objective_curve(ctx, ACCEPTANCE, workload, config=ObjectiveConfig(itl_slo_s=1e-6))
    assert objective is Objective.GOODPUT_SLO
    assert all(p.slo_share == pytest.approx(0.01) for p in curve)
    assert "no option meets it" in why
    # One option past the floor: no such note.
    plain = curve_for(ctx, ACCEPTANCE, Shape(batch=256.0, context_tokens=512.0))[0]
    _, _, met = objective_curve(ctx, ACCEPTANCE, workload, config=ObjectiveConfig(itl_slo_s=plain[0].step_time_s))
    assert "no option meets it" not in met


def test_workload_from_evidence() -> None:
    evidence = make_evidence(batch=256.0, waiting=50.0, kv_cache_usage_ratio=0.62)
    workload = workload_from(evidence, context_tokens=700.0, prefill_tokens=120.0)
    assert workload == Workload(256.0, 50.0, 700.0, 120.0, 0.62, 3)
    off = workload_from(make_evidence(speculation_on=False, waiting=float("nan")), context_tokens=1.0,
                        prefill_tokens=0.0)
    assert off.deployed_k == 0 and off.waiting == 0.0


def test_max_num_seqs_bounds_the_batch_an_option_holds() -> None:
    # The cache full at B 64 with 20 waiting and room for more: 84 sequences would run, the engine runs at most
    # 70; a max_num_seqs under the measured batch (a summed page) never cuts below it.
    workload = Workload(64.0, 20.0, 264.0, kv_usage_ratio=0.5, deployed_k=3)
    assert held_batch(workload, 0, kv_full=True) == pytest.approx(84.0)
    assert held_batch(replace(workload, max_seqs=70.0), 0, kv_full=True) == pytest.approx(70.0)
    assert held_batch(replace(workload, max_seqs=32.0), 0, kv_full=True) == pytest.approx(64.0)


def test_under_an_slo_no_option_grows_past_max_num_seqs() -> None:
    # No queue at B 20 under an SLO: off's longer ITL would hold more requests in flight (Little's law); with the
    # engine capped at 22 it stops there, cannot hold the load, and serves less of it than unbounded.
    ctx = make_context()
    workload = Workload(20.0, 0.0, 512.0, deployed_k=3)
    config = ObjectiveConfig(itl_slo_s=10.0)
    free = objective_curve(ctx, ACCEPTANCE, workload, config=config)[0]
    capped = objective_curve(ctx, ACCEPTANCE, replace(workload, max_seqs=22.0), config=config)[0]
    assert free[3].speedup == pytest.approx(1.0)  # every option meets a 10 s SLO and, unbounded, holds the load
    assert capped[3].speedup > free[3].speedup  # off, held to 22 sequences, serves less: speculation gains
