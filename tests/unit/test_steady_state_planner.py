"""The steady-state planner's dynamic program: it pays for changes, follows the true physics, and its plan is
the best the switching cost allows."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml

from service.bench.steady_state import LATENCY_TIE_WEIGHT, PlanGrid, SteadyStatePlanner, slo_share
from service.sim.scenario import Scenario, scenario_from_mapping

BENCH = Path(__file__).parents[2] / "service" / "sim" / "scenarios" / "bench"


def _scenario(name: str, **engine: Any) -> Scenario:
    data = yaml.safe_load((BENCH / f"{name}.yaml").read_text(encoding="utf-8"))
    data.pop("bench")
    data["engine"].update(engine)
    return scenario_from_mapping(data, source=name)


# An SLO every option meets: the score is then per-sequence speed (latency counts), so load shifts move the best
# gamma; without an SLO only tokens delivered count.
LOOSE_SLO_S = 10.0


def _oracle(scenario: Scenario, duration_s: float = 1200.0,
            itl_slo_s: float | None = LOOSE_SLO_S) -> SteadyStatePlanner:
    grid = PlanGrid(start_s=0.0, interval_s=5.0, duration_s=duration_s)
    return SteadyStatePlanner(scenario, grid, gamma_max=5, itl_slo_s=itl_slo_s)


def _changes(plan: tuple[int, ...]) -> int:
    return sum(1 for a, b in itertools.pairwise(plan) if a != b)


def test_without_downtime_the_plan_runs_the_best_gamma_in_steady_stretches() -> None:
    oracle = _oracle(_scenario("load-shift", restart_delay_s=0))
    # Only the dropped in-flight requests are left to pay for a change, so in the middle of each steady stretch
    # (light: 0-200 s, heavy: 260-500 s, of a 600 s period) the plan runs a gamma that serves as much as the
    # best: its utility is within the latency tie-breaker (LATENCY_TIE_WEIGHT) of 1.0.
    for t in (100, 400, 700, 1000):
        i = t // 5
        assert oracle.utility(i, oracle.plan[i]) >= 1.0 - LATENCY_TIE_WEIGHT, t


def test_without_an_slo_no_restart_is_paid_for_latency_alone() -> None:
    # Without an SLO the headline is goodput. The heavy phases are served best by gamma 1 (more capacity than the
    # deployed 3), which pays one restart; the light phases are served in full by any gamma, so going back to
    # the lower-latency gamma 3 for them never pays: one change, down, and the plan stays there.
    oracle = _oracle(_scenario("load-shift"), itl_slo_s=None)
    assert _changes(oracle.plan) == 1
    assert oracle.plan[-1] < oracle.plan[0]
    # An SLO every option meets changes nothing: speed beyond the SLO is not SLO goodput either.
    assert _oracle(_scenario("load-shift")).plan == oracle.plan


def test_changes_that_cannot_pay_back_are_never_made() -> None:
    # A restart longer than the whole run costs more than any gain it could buy.
    oracle = _oracle(_scenario("load-shift", restart_delay_s=5000))
    assert _changes(oracle.plan) == 0


def test_load_shift_plan_follows_the_load_down_and_up_paying_for_each_change() -> None:
    scenario = _scenario("load-shift")
    oracle = _oracle(scenario)
    # The profile: light (1 req/s) until 200 s, heavy (28 req/s) from 260 to 500 s, back to light by 600 s,
    # twice in 1200 s. Heavy load wants fewer drafts than light load.
    light = oracle.plan[round(100 / 5)]
    heavy = oracle.plan[round(400 / 5)]
    assert heavy < light
    # At least the move down, at most two changes per 600 s cycle (down once, up once: going back up pays only
    # when the light-load gain of the larger gamma beats a restart, which the true physics decides).
    assert 1 <= _changes(oracle.plan) <= 4
    free = _oracle(_scenario("load-shift", restart_delay_s=0))
    assert _changes(oracle.plan) <= _changes(free.plan)


def test_rolling_updates_are_cheaper_so_the_plan_changes_at_least_as_often() -> None:
    restart = _oracle(_scenario("load-shift"))
    rolling = _oracle(_scenario("load-shift", replicas=4, reconfigure="rolling"))
    assert _changes(rolling.plan) >= _changes(restart.plan)


def test_acceptance_drift_is_followed_from_the_true_profile() -> None:
    # Code-like acceptance until 300 s, chat-like from 420 s. With a 20 ms SLO the deployed k=4 meets it before
    # the drift (~7 ms per token) and misses it after (~36 ms) while k=1 meets it (~14 ms): fewer drafts pay.
    oracle = _oracle(_scenario("acceptance-drift"), duration_s=900, itl_slo_s=0.020)
    assert oracle.plan[0] == 4
    assert oracle.plan[-1] < oracle.plan[0]


def test_utility_is_relative_to_the_best_gamma() -> None:
    oracle = _oracle(_scenario("low-load"), duration_s=60)
    for i in range(len(oracle.plan)):
        values = [oracle.utility(i, g) for g in range(6)]
        assert max(values) == 1.0 and min(values) >= 0.0
    assert oracle.utility(0, 99) == 0.0


def test_the_plan_starts_at_the_deployed_k_and_pays_for_its_first_correction() -> None:
    scenario = _scenario("load-shift")
    deployed = scenario.drafter.num_speculative_tokens
    oracle = _oracle(scenario)
    # Interval 0 runs what the server was deployed with: no decision can take effect before the first tick.
    assert oracle.initial_k() == deployed and oracle.plan[0] == deployed
    # A restart longer than the run: leaving the deployed k can never pay, so the plan keeps it throughout.
    stuck = _oracle(_scenario("load-shift", restart_delay_s=5000))
    assert set(stuck.plan) == {deployed}


def test_a_free_start_is_what_the_deployed_start_would_pick_when_nothing_to_correct() -> None:
    scenario = _scenario("load-shift")
    free_choice = _oracle(scenario).plan[1]
    # Deployed at the gamma the oracle would run first anyway: nothing to correct, no change at the start.
    started_there = SteadyStatePlanner(scenario, PlanGrid(start_s=0.0, interval_s=5.0, duration_s=1200.0),
                                       gamma_max=5, itl_slo_s=LOOSE_SLO_S, initial_k=free_choice)
    assert started_there.plan[0] == started_there.plan[1] == free_choice


def test_the_slo_share_is_half_at_the_slo_and_falls_with_the_itl() -> None:
    # Per-request ITLs spread 5% around the mean: mean = SLO -> half the requests meet it.
    assert abs(slo_share(0.008, 0.008) - 0.5) < 1e-12
    # Mean 7.6 ms vs 8 ms: z = (8 / 7.6 - 1) / 0.05 = 1.05 -> between 0.8 and 0.9; mean 5.7 ms: z = 8.1 -> ~1;
    # mean 11 ms: z = -5.5 -> ~0.
    assert 0.8 < slo_share(0.0076, 0.008) < 0.9
    assert slo_share(0.0057, 0.008) > 0.9999
    assert slo_share(0.011, 0.008) < 1e-6


def test_requests_that_differ_meet_the_slo_class_by_class() -> None:
    # always-worth-it at k=2: every request alike, all at one ITL. With the drafter predicting some requests far
    # worse than others (spread 1.0), an SLO at that ITL sits between the classes: the well-predicted ones meet it,
    # the others do not, so the oracle's share is strictly between what one ITL alone would give (0 or 1 apart
    # from the 5% spread) and each class's own share, averaged, is what it scores.
    base = _scenario("always-worth-it")
    spread = base.model_copy(update={"drafter": base.drafter.model_copy(update={"request_acceptance_spread": 1.0})})
    alike = _oracle(base, duration_s=60.0, itl_slo_s=10.0).steady_state(2, elapsed_s=30.0)
    mixed = _oracle(spread, duration_s=60.0, itl_slo_s=10.0).steady_state(2, elapsed_s=30.0)
    slo = mixed.itl_s  # the batch's mean ITL
    state = _oracle(spread, duration_s=60.0, itl_slo_s=slo).steady_state(2, elapsed_s=30.0)
    assert alike.slo_score == 1.0 and mixed.slo_score == 1.0  # a loose SLO: everyone meets it
    assert 0.3 < state.slo_score / state.served < 0.7
