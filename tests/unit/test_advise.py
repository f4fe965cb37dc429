"""advise_target: the composition of calibration, the cost model's curve and decide."""

from __future__ import annotations

from costmodel_builders import make_acceptance, make_context, make_evidence

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
