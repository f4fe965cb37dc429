"""The step's token budget on the simulator: a k=4 deployment whose verified drafts crowd prompts out of a 512-token
step cannot admit the arrivals (tests/fixtures/scenarios/token-budget-h100.yaml: a queue grows at k=4, fewer
drafts serve the load). The real advisor pipeline, told the engine's --max-num-batched-tokens as the bench tells
it, leaves k=4; told nothing of the budget, the held-batch physics says k=4 pays and it stays. Behaviour only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.bench.accounting import Objective
from service.bench.controllers import Controller
from service.bench.pipeline import AdvisorController, SimClock, bench_advisor_settings
from service.bench.runner import PolicySpec, RunResult, run_policy
from service.bench.spec import BenchScenario, load_bench_scenario
from service.settings import Settings
from service.sim.world import World

SCENARIO = Path(__file__).resolve().parents[1] / "fixtures" / "scenarios" / "token-budget-h100.yaml"
THROUGHPUT = Objective("throughput")


def _advised(bench: BenchScenario, settings: Settings, reasons: list[str]) -> PolicySpec:
    @contextlib.asynccontextmanager
    async def factory(world: World, start_s: float) -> AsyncIterator[Controller]:
        async with AdvisorController(settings, world=world, clock=SimClock(start_s)) as controller:
            choose = controller.choose

            async def recorded(world: World, now_s: float) -> int:
                k = await choose(world, now_s)
                if controller.decision is not None:
                    reasons.append(controller.decision.reason)
                return k

            controller.choose = recorded  # type: ignore[method-assign]
            yield controller

    return PolicySpec("advisor", initial_k=bench.scenario.drafter.num_speculative_tokens, controller=factory)


@pytest.fixture(scope="module")
def bench() -> BenchScenario:
    return load_bench_scenario(SCENARIO)


def _run(bench: BenchScenario, policy: PolicySpec) -> RunResult:
    return asyncio.run(run_policy(bench, policy, duration_s=bench.bench.duration_s))


def test_the_scenario_passes_the_engine_budget_to_the_advisor(bench: BenchScenario) -> None:
    (target,) = bench_advisor_settings(bench).targets
    assert target.max_num_batched_tokens == bench.scenario.engine.max_num_batched_tokens == 512
    assert target.max_num_seqs == bench.scenario.engine.max_num_seqs


def test_told_the_budget_the_advisor_leaves_k4_and_serves_more_than_holding_it(bench: BenchScenario) -> None:
    reasons: list[str] = []
    advised = _run(bench, _advised(bench, bench_advisor_settings(bench), reasons))
    held = _run(bench, PolicySpec("always-on", initial_k=4))
    ks = [tick.k for tick in advised.ticks]
    assert ks[0] == 4
    assert min(ks) < 4 and ks[-1] < 4, "fewer drafts admit the arrivals the budget turns away at k=4"
    assert advised.config_changes == 1
    assert THROUGHPUT.score(advised.metrics) > THROUGHPUT.score(held.metrics)
    assert any("token budget 512 per step" in reason for reason in reasons)


def test_without_the_budget_the_held_batch_physics_keeps_k4(bench: BenchScenario) -> None:
    settings = bench_advisor_settings(bench)
    blind = settings.model_copy(
        update={"targets": [t.model_copy(update={"max_num_batched_tokens": None}) for t in settings.targets]}
    )
    reasons: list[str] = []
    advised = _run(bench, _advised(bench, blind, reasons))
    assert {tick.k for tick in advised.ticks} == {4}
    assert not any("token budget" in reason for reason in reasons)
