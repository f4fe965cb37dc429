"""Run one policy on one scenario in simulated time: advance the world tick by tick, let the policy choose k,
restart the world when the choice changes, and record what happened."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from service.bench.accounting import Metrics, summarize
from service.bench.controllers import Controller
from service.bench.spec import BenchScenario
from service.sim.scenario import Scenario
from service.sim.world import Completion, World

# A fixed, plausible Unix time for the simulated clock: the sidecar formats timestamps from it.
EPOCH_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@dataclass(frozen=True, slots=True)
class Tick:
    """The state at the end of one decision interval (times relative to the start)."""

    t_s: float
    arrival_rate_per_s: float
    running: int
    waiting: int
    k: int  # configured draft tokens after this tick's decision (0 = off)
    completed_tokens: int  # output tokens of requests that finished during the interval


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    metrics: Metrics
    config_changes: int
    lost_requests: int
    ticks: tuple[Tick, ...]


# A controller factory gets the world and the simulated clock start; it yields the controller for the run's length.
ControllerFactory = Callable[[World, float], contextlib.AbstractAsyncContextManager[Controller]]


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A policy: the k the engine starts with, an optional engine-native batch threshold, an optional controller."""

    name: str
    initial_k: int
    disable_by_batch_size: int | None = None
    controller: ControllerFactory | None = None


def with_k(scenario: Scenario, k: int) -> Scenario:
    """The same world deployed with k draft tokens from the start (no restart)."""
    return scenario.model_copy(update={"drafter": scenario.drafter.model_copy(update={"num_speculative_tokens": k})})


async def run_policy(bench: BenchScenario, policy: PolicySpec, *, duration_s: float) -> RunResult:
    scenario = with_k(bench.scenario, policy.initial_k)
    start = EPOCH_S
    world = World(
        scenario,
        seed=bench.bench.seed,
        start_s=start,
        disable_by_batch_size=policy.disable_by_batch_size,
        record_completions=True,
    )
    interval = bench.bench.decision_interval_s
    ticks: list[Tick] = []
    done: list[Completion] = []
    changes = 0
    steps = max(1, round(duration_s / interval))
    factory = policy.controller
    async with contextlib.AsyncExitStack() as stack:
        controller = await stack.enter_async_context(factory(world, start)) if factory is not None else None
        for i in range(1, steps + 1):
            now = start + i * interval
            world.advance_to(now)
            if controller is not None:
                k_before = world.num_speculative_tokens
                k = await controller.choose(world, now)
                if k != world.num_speculative_tokens:
                    world.set_speculation(k, now_s=now)
                if world.num_speculative_tokens != k_before:  # a controller with an actuator changes the world itself
                    changes += 1
            finished = world.drain_completions()
            done.extend(finished)
            ticks.append(
                Tick(
                    t_s=now - start,
                    arrival_rate_per_s=world.arrival_rate_per_s,
                    running=world.num_running,
                    waiting=world.num_waiting,
                    k=world.num_speculative_tokens,
                    completed_tokens=sum(c.output_tokens for c in finished),
                )
            )
    done.extend(world.in_flight())  # what the clients still waiting at the end had received
    metrics = summarize(done, duration_s=steps * interval, itl_slo_s=bench.bench.itl_slo_s,
                        error_tokens=world.lifetime.lost_tokens)
    return RunResult(
        policy=policy.name,
        metrics=metrics,
        config_changes=changes,
        lost_requests=world.lifetime.lost_requests,
        ticks=tuple(ticks),
    )
