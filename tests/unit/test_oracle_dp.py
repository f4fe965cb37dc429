"""The oracle's dynamic program: it pays for changes, follows the true physics, and its plan is the best the
switching cost allows."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml

from service.bench.oracle import Oracle
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


def _oracle(scenario: Scenario, duration_s: float = 1200.0, itl_slo_s: float | None = LOOSE_SLO_S) -> Oracle:
    return Oracle(scenario, start_s=0.0, gamma_max=5, interval_s=5.0, duration_s=duration_s, itl_slo_s=itl_slo_s)


def _changes(plan: tuple[int, ...]) -> int:
    return sum(1 for a, b in itertools.pairwise(plan) if a != b)


def test_without_downtime_the_plan_runs_the_best_gamma_in_steady_stretches() -> None:
    oracle = _oracle(_scenario("load-shift", restart_delay_s=0))
    # Only the dropped in-flight requests are left to pay for a change, so in the middle of each steady stretch
    # (light: 0-200 s, heavy: 260-500 s, of a 600 s period) the plan runs a gamma of top utility (1.0).
    for t in (100, 400, 700, 1000):
        i = t // 5
        assert oracle.utility(i, oracle.plan[i]) == 1.0, t


def test_without_an_slo_no_restart_is_paid_for_latency_alone() -> None:
    # Without an SLO the headline is goodput; the light phases are served in full by any gamma and the heavy ones
    # best by gamma 1 (more capacity than 0 or 3 here), so latency alone never pays a restart.
    oracle = _oracle(_scenario("load-shift"), itl_slo_s=None)
    assert _changes(oracle.plan) == 0
    with_latency = _oracle(_scenario("load-shift"))
    assert _changes(with_latency.plan) > 0


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
    # At most two changes per 600 s cycle: down once, up once.
    assert 2 <= _changes(oracle.plan) <= 4
    free = _oracle(_scenario("load-shift", restart_delay_s=0))
    assert _changes(oracle.plan) <= _changes(free.plan)


def test_rolling_updates_are_cheaper_so_the_plan_changes_at_least_as_often() -> None:
    restart = _oracle(_scenario("load-shift"))
    rolling = _oracle(_scenario("load-shift", replicas=4, reconfigure="rolling"))
    assert _changes(rolling.plan) >= _changes(restart.plan)


def test_acceptance_drift_is_followed_from_the_true_profile() -> None:
    oracle = _oracle(_scenario("acceptance-drift"), duration_s=900)
    # Code-like acceptance until 300 s, chat-like from 420 s: fewer drafts pay after the drift.
    assert oracle.plan[-1] < oracle.plan[0]


def test_utility_is_relative_to_the_best_gamma() -> None:
    oracle = _oracle(_scenario("low-load"), duration_s=60)
    for i in range(len(oracle.plan)):
        values = [oracle.utility(i, g) for g in range(6)]
        assert max(values) == 1.0 and min(values) >= 0.0
    assert oracle.utility(0, 99) == 0.0
