"""The published band holds the simulated world's true speedup (issue 14: "the truth lies inside the published band
in every phase of the demo world"), judged tick by tick as `benchmarks/truth_in_band.py` prints it."""

from __future__ import annotations

from benchmarks.truth_in_band import DEMO, FORCED_SETTLE_S, coverage, true_speedup
from service.bench.spec import load_bench_scenario


def test_the_true_speedup_of_a_light_memory_bound_world_is_its_acceptance_over_the_drafting_cost() -> None:
    # The world's own physics at batch 1 (no model of the advisor's involved): S = E[L] x T(1, 0) / T(1, 3),
    # more than 1 and less than E[L](3) (drafting and verifying are not free).
    scenario = load_bench_scenario(DEMO).scenario
    s = true_speedup(scenario, elapsed_s=0.0, batch=1.0, context=600.0, gamma=3)
    assert 1.0 < s < 1 + 0.72 + 0.72 * 0.6 + 0.72 * 0.6 * 0.52
    assert true_speedup(scenario, elapsed_s=0.0, batch=1.0, context=600.0, gamma=0) == 1.0


def test_the_demo_worlds_truth_is_inside_the_published_band_in_every_phase() -> None:
    # Measured 2026-12-04: 98% of 240 judged ticks (low load 97%, ramps 96%, peak 100%); the misses are the first
    # minute, before the calibration has its points.
    result = coverage(load_bench_scenario(DEMO), name="demo")
    assert len(result.judged) >= 100
    for phase in ("low", "ramp", "high"):
        share = result.share(phase)
        assert share is not None and share >= 0.9, (phase, share)


def test_after_a_move_between_two_k_the_band_still_holds_what_a_plain_step_would_give() -> None:
    # The world runs k=3, then k=2 from 750 s: steps at two k and never a plain one. The two k measure a draft
    # pass and its tokens, not the speculative bookkeeping both pay, so S (over a plain step the model never saw)
    # must keep that cost's prior spread (policies/model/calibrate.py `unidentified`). Measured 2026-12-06: from
    # 790 s, S(1) 94%, S(2) 90%, S(3) 93%, S(4) 91% of ticks inside (docs/accuracy.md).
    result = coverage(load_bench_scenario(DEMO), name="demo", forced=((0.0, 3), (750.0, 2)))
    for gamma in (1, 2, 3, 4):
        share = result.share(gamma=gamma, since_s=750.0 + FORCED_SETTLE_S)
        assert share is not None and share >= 0.85, (gamma, share)
