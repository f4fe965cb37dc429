"""End to end in simulated time: the real loop (scrape over an in-process transport from the simulated world ->
estimate -> model -> decide) with an acceptance memory on disk. Heavy load first: the advisor turns speculation off.
Then the load drops: nothing measures acceptance any more, and the advisor must turn speculation back on from the
acceptance it remembers, within a few decision windows of the queue draining."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import httpx

from policies.advise import AdvisorConfig
from policies.types import DataState
from service.app import build_sidecar, context_resolver
from service.bench.pipeline import SimClock, WorldTransport, advisor_settings
from service.bench.runner import EPOCH_S
from service.bench.spec import load_bench_scenario
from service.loop import AdvisorLoop, LoopConfig, LoopWiring, TargetSpec
from service.sim.world import World
from service.sources.gpu import NoGpuSource
from service.sources.scraper import EngineScraper
from service.stores.memory import MemoryStore

SCENARIO = Path(__file__).resolve().parents[1] / "fixtures" / "scenarios" / "memory-load-drop.yaml"


@dataclass(frozen=True)
class Step:
    t_s: float
    rate_per_s: float
    waiting: int
    k: int  # what the engine runs after this tick's decision
    ok: bool  # the decision's state is ok (not stale while the engine restarts)
    reason: str


async def drive(memory_path: Path) -> tuple[list[Step], float]:
    bench = load_bench_scenario(SCENARIO)
    scenario = bench.scenario
    interval = bench.bench.decision_interval_s
    world = World(scenario, seed=bench.bench.seed, start_s=EPOCH_S)
    clock = SimClock(EPOCH_S)
    settings = advisor_settings(
        model_name=scenario.model_name,
        target={"hardware": bench.bench.advisor.hardware, "model_profile": bench.bench.advisor.model_profile,
                "drafter": {"method": scenario.drafter.method}},
        interval_s=interval,
        itl_slo_s=None,
        extra={},
    )
    transport = WorldTransport(world)
    sidecar = build_sidecar(settings, clock=clock, gpu_source=NoGpuSource(), transport=transport)
    [target] = settings.targets
    steps: list[Step] = []
    async with httpx.AsyncClient(transport=transport) as client:
        spec = TargetSpec(
            name=target.name,
            model=target.model,
            scraper=EngineScraper(client, target.metrics_url, timeout_s=interval,
                                  max_body_bytes=settings.max_body_bytes),
            resolve_context=context_resolver(target, fallback_hardware=settings.fallback_hardware),
        )
        loop = AdvisorLoop(
            [spec],
            wiring=LoopWiring(gpu=NoGpuSource(), board=sidecar.board, memory_store=MemoryStore(memory_path)),
            config=LoopConfig(
                estimator=settings.estimator.to_config(),
                interval_s=interval,
                advisor=AdvisorConfig(
                    decide=settings.decide.to_config(),
                    calibration=settings.calibration.to_config(),
                    objective=settings.objective.to_config(),
                ),
            ),
        )
        ticks = round(bench.bench.duration_s / interval)
        for i in range(1, ticks + 1):
            now = EPOCH_S + i * interval
            world.advance_to(now)
            clock.now_s = now
            await loop.run_once(now)
            status = sidecar.board.get(target.name)
            decision = status.decision if status is not None else None
            if decision is not None:
                k = decision.num_speculative_tokens if decision.enabled else 0
                if k != world.num_speculative_tokens:
                    world.set_speculation(k, now_s=now)
            steps.append(
                Step(
                    t_s=now - EPOCH_S,
                    rate_per_s=world.arrival_rate_per_s,
                    waiting=world.num_waiting,
                    k=world.num_speculative_tokens,
                    ok=decision is not None and decision.state is DataState.OK,
                    reason=decision.reason if decision is not None else "",
                )
            )
    return steps, settings.estimator.window_s


def test_speculation_comes_back_on_after_the_load_drops(tmp_path: Path) -> None:
    memory_path = tmp_path / "acceptance-memory.json"
    steps, window_s = asyncio.run(drive(memory_path))

    heavy = [s for s in steps if s.rate_per_s > 30.0]
    assert heavy[0].k == 3  # the scenario starts speculating at k=3
    turned_off = next(s for s in heavy if s.k == 0)  # at a full batch of 1024 it costs throughput

    # After the drop, wait for the backlog to drain (the load is really light only once nothing waits).
    light = [s for s in steps if s.t_s > turned_off.t_s and s.rate_per_s < 2.0]
    drained = next(s for s in light if s.waiting == 0)
    # Every good tick while off in between was priced from the remembered profile, not the prior.
    off_ticks = [s for s in steps if turned_off.t_s < s.t_s < drained.t_s and s.k == 0 and s.ok]
    assert off_ticks and all("remembered acceptance" in s.reason for s in off_ticks)
    back_on = next(s for s in light if s.t_s >= drained.t_s and s.k > 0)
    # "Within a few windows": the wait (at most the 120 s dwell) plus at most two more 60 s windows.
    assert back_on.t_s - drained.t_s <= 4 * window_s
    assert "remembered acceptance from" in back_on.reason
    # It stays on for the rest of the run (no flapping at steady light load) and saved what it measured.
    assert all(s.k > 0 for s in steps if s.t_s >= back_on.t_s)
    assert memory_path.exists()
    assert MemoryStore(memory_path).load().error is None
