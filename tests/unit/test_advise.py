"""advise_target: the composition of calibration, the cost model's curve and decide."""

from __future__ import annotations

import math

import pytest
from costmodel_builders import make_acceptance, make_context, make_evidence, make_off_evidence

from policies.advise import AdvisorConfig, AdvisorState, advise_target
from policies.decide.rule import DecideConfig
from policies.types import DataState, DraftMethod

NOW = 1_800_000_000.0


def test_the_curve_reaches_a_deployed_k_beyond_gamma_max_but_the_choice_stays_within_it() -> None:
    # An ngram deployment at k=10 with a decide gamma_max of 8: the running setting's S(10) must be published (the
    # "speculation costs throughput" alert reads the point at the deployed gamma), yet decide never picks above 8.
    r = tuple(0.7 * 0.85**i for i in range(10))
    evidence = make_evidence(deployed_k=10, acceptance=make_acceptance(r), batch=4.0)
    advice = advise_target(
        evidence, make_context(method=DraftMethod.NGRAM), AdvisorConfig(decide=DecideConfig(gamma_max=8, dwell_s=0.0)),
        AdvisorState(), NOW,
    )
    decision = advice.decision
    assert decision.state == DataState.OK
    assert [p.gamma for p in decision.curve] == list(range(11))
    assert not any(p.extrapolated for p in decision.curve)  # every point up to k=10 is measured
    # Acceptance still grows to position 10 (r_10 = 0.7 x 0.85^9 = 0.16), so S(10) beats the best S(gamma <= 8):
    # the deployment is kept, and its published speedup is the curve's point at 10, not a placeholder.
    assert decision.num_speculative_tokens == 10
    assert decision.expected_speedup == decision.curve[10].speedup
    assert decision.curve[10].speedup > max(p.speedup for p in decision.curve[1:9])


def test_the_plan_starts_afresh_once_a_window_measures_what_its_ticks_were_priced_without() -> None:
    # A 20 s restart: every ok tick adds its curve to the plan, the sums decayed over the 600 s horizon. Three
    # windows of k=3 steps 30 s apart: weight 1 + e^(-30/600) + e^(-60/600) = 2.856. Their curves priced a verified
    # token at the prior's cost (one kind of step). A plain window measures it: the plan restarts with that tick
    # alone (weight 1). The next k=3 window measures nothing new: it adds to the plan (1 + e^(-30/600) = 1.951).
    config = AdvisorConfig(decide=DecideConfig(change_cost_s=20.0))
    ctx = make_context()
    state = AdvisorState()
    weights = []
    for i, (on, step_s) in enumerate([(True, 0.012), (True, 0.012), (True, 0.0125), (False, 0.008), (True, 0.012)]):
        make = make_evidence if on else make_off_evidence
        evidence = make(at_s=NOW + 30.0 * i, batch=8.0, decode_seqs_per_step=8.0, step_time_s=step_s,
                        step_samples=500.0, generation_tokens_per_s=1000.0, window_s=30.0)
        advice = advise_target(evidence, ctx, config, state, NOW + 30.0 * i)
        assert advice.decision.state == DataState.OK
        state = advice.state
        weights.append(state.plan.weight)
    assert weights[2] == pytest.approx(1.0 + math.exp(-0.05) + math.exp(-0.1))
    assert weights[3] == 1.0
    assert weights[4] == pytest.approx(1.0 + math.exp(-0.05))
