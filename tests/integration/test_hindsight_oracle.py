"""The hindsight oracle: starting from the best static run it stays at or above every static run (exactly: same
seed, deterministic world), and what it commits to at a boundary is what the run then delivers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import yaml

from service.bench.accounting import Objective
from service.bench.controllers import Controller
from service.bench.hindsight import Schedule
from service.bench.runner import EPOCH_S, PolicySpec, RunResult, run_policy
from service.bench.spec import BenchScenario, load_bench_scenario
from service.bench.steady_state import PlanGrid, SteadyStatePlanner
from service.bench.suite import (
    ORACLE_DEPLOYED,
    deployed_oracle_spec,
    headline_of,
    hindsight_spec,
    plan_policy,
    scenario_objective,
    schedule_of,
)
from service.sim.world import World

BENCH = Path(__file__).resolve().parents[2] / "service" / "sim" / "scenarios" / "bench"
DURATION_S = 480.0
SLO_S = 0.010


def _shortened(tmp_path: Path, name: str, duration_s: float) -> BenchScenario:
    """The packaged scenario `name` with `duration_s` simulated seconds, loaded as the bench loads it."""
    data = yaml.safe_load((BENCH / f"{name}.yaml").read_text(encoding="utf-8"))
    data["bench"] = {**data["bench"], "duration_s": duration_s}
    path = tmp_path / f"short-{name}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_bench_scenario(path)


def test_the_oracle_bounds_the_static_runs_under_a_load_rise(tmp_path: Path) -> None:
    # slo-load-rise's world with a 10 ms SLO: 4 requests/s until 150 s, 22/s from 180 s. Over the whole run gamma 2
    # meets the SLO for the most requests; moving to gamma 1 for the heavy phase gains less than the requests its
    # restart drops (errors count against the headline by the tokens they asked for), so the oracle holds.
    data = yaml.safe_load((BENCH / "slo-load-rise.yaml").read_text(encoding="utf-8"))
    data["workload"]["arrival_rate"] = [
        {"t_s": 0, "requests_per_s": 4.0}, {"t_s": 150, "requests_per_s": 4.0}, {"t_s": 180, "requests_per_s": 22.0},
    ]
    data["bench"] = {**data["bench"], "duration_s": DURATION_S, "oracle_segment_s": 60, "itl_slo_s": SLO_S}
    path = tmp_path / "slo-rise.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    bench = load_bench_scenario(path)

    async def run(spec: PolicySpec) -> RunResult:
        return await run_policy(bench, spec, duration_s=DURATION_S)

    statics = [(spec, asyncio.run(run(spec))) for spec in (PolicySpec(name=f"g{g}", initial_k=g) for g in range(4))]
    objective = scenario_objective(bench, [result for _, result in statics])
    assert objective == Objective("slo_goodput", itl_slo_s=SLO_S)
    oracle_spec, _ = hindsight_spec(bench, DURATION_S, statics, objective)  # hold only: no planned start
    oracle = asyncio.run(run(oracle_spec))

    values = {spec.initial_k: headline_of(result, objective) for spec, result in statics}
    assert oracle_spec.initial_k == max(values, key=lambda g: values[g]) == 2  # starts as the best static run
    assert headline_of(oracle, objective) >= max(values.values())
    assert all(t.k == 2 for t in oracle.ticks)


def test_what_the_oracle_commits_to_is_what_the_run_then_delivers(tmp_path: Path) -> None:
    # With the planner's plan as a base policy (and a planned start): at every boundary the value of continuing
    # is, exactly, the value committed to at the one before, and the run ends at the last value committed to.
    bench = _shortened(tmp_path, "load-shift", 600)
    statics = [(spec, asyncio.run(run_policy(bench, spec, duration_s=600)))
               for spec in (PolicySpec(name=f"g{g}", initial_k=g) for g in range(4))]
    objective = scenario_objective(bench, [result for _, result in statics])
    planner = SteadyStatePlanner(bench.scenario, PlanGrid(start_s=EPOCH_S, interval_s=5.0, duration_s=600),
                                 gamma_max=3, itl_slo_s=None)
    spec, controller = hindsight_spec(bench, 600, statics, objective,
                                      plan_policy(planner, start_s=EPOCH_S, interval_s=5.0))
    oracle = asyncio.run(run_policy(bench, spec, duration_s=600))
    log = controller.log
    assert len(log) >= 9  # a boundary every 60 s (and a planned start, when one was taken)
    for (_, _, committed), (_, continuing, _) in itertools.pairwise(log):
        assert continuing == committed
    assert headline_of(oracle, objective) == log[-1][2]
    assert headline_of(oracle, objective) >= max(headline_of(result, objective) for _, result in statics)


def test_the_oracle_from_the_deployed_k_leaves_a_wrong_one_at_the_first_tick_and_pays_for_it(tmp_path: Path) -> None:
    # never-worth-it is deployed at k=3 where plain decoding halves the mean ITL. The best static run (off) starts
    # there for free; a run from the deployed k can only get there by a restart, which loses the arrivals of its
    # outage. The deployed oracle leaves k=3 at the first decision tick (5 s, before its first 60 s segment),
    # ends at or above holding k=3 (what its first boundary weighs first) and below off, by what the restart cost.
    bench = _shortened(tmp_path, "never-worth-it", 300)
    assert bench.scenario.drafter.num_speculative_tokens == 3
    statics = {g: asyncio.run(run_policy(bench, PolicySpec(name=f"g{g}", initial_k=g), duration_s=300))
               for g in range(4)}
    objective = scenario_objective(bench, list(statics.values()))

    # With the planner's plan as the second base policy, as the suite runs it.
    planner = SteadyStatePlanner(bench.scenario, PlanGrid(start_s=EPOCH_S, interval_s=5, duration_s=300),
                                 gamma_max=3, itl_slo_s=None)
    spec, _ = deployed_oracle_spec(bench, 300, objective, plan_policy(planner, start_s=EPOCH_S, interval_s=5))
    run = asyncio.run(run_policy(bench, spec, duration_s=300))

    assert spec.name == ORACLE_DEPLOYED and spec.initial_k == 3
    assert run.ticks[0].t_s == 5 and run.ticks[0].k == 0 and run.config_changes == 1
    headline = headline_of(run, objective)
    assert headline >= headline_of(statics[3], objective)
    assert headline < headline_of(statics[0], objective)


class _OffAt:
    """A controller that turns speculation off at one time: a policy that moves between the oracle's boundaries."""

    def __init__(self, at_s: float) -> None:
        self._at_s = at_s

    async def choose(self, world: World, now_s: float) -> int:
        return 0 if now_s >= self._at_s else world.num_speculative_tokens


def test_the_deployed_oracle_bounds_a_policy_that_moves_between_its_boundaries(tmp_path: Path) -> None:
    # never-worth-it, deployed at k=3: a policy that turns off 35 s in (between the 5 s and 60 s boundaries) beats
    # holding k=3, so the deployed oracle starts as its replay (the log's first entry: holding's value, then the
    # replay's, exactly the policy's own headline) and ends at or above it, whatever its own moves.
    bench = _shortened(tmp_path, "never-worth-it", 300)

    @contextlib.asynccontextmanager
    async def off_at_35(_world: World, start_s: float) -> AsyncIterator[Controller]:
        yield _OffAt(start_s + 35.0)

    policy = asyncio.run(run_policy(bench, PolicySpec(name="off-at-35", initial_k=3, controller=off_at_35),
                                    duration_s=300))
    schedule = schedule_of(3, policy, interval_s=5.0)
    assert schedule == Schedule(3, ((EPOCH_S + 35.0, 0),))
    statics = [asyncio.run(run_policy(bench, PolicySpec(name=f"g{g}", initial_k=g), duration_s=300)) for g in (0, 3)]
    objective = scenario_objective(bench, statics)
    holding, own = headline_of(statics[1], objective), headline_of(policy, objective)
    assert own > holding
    spec, oracle = deployed_oracle_spec(bench, 300, objective, replays=[schedule])
    assert oracle.log == [(0.0, holding, own)]
    run = asyncio.run(run_policy(bench, spec, duration_s=300))
    assert headline_of(run, objective) >= own
