"""The real sidecar pipeline driven in simulated time: scrape (over an in-process HTTP transport that answers from
the world) -> estimate -> model -> decide -> publish, by `AdvisorLoop.run_once(now)`; an actuator then applies the
published recommendation to the world.

The composition is the sidecar's: `build_sidecar` for the settings' checks and the board, and the composition
root's public seam (`service.app.target_specs`, `advisor_loop`) for the loop, which the lifespan drives in wall
time and this module steps in simulated time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx

from policies.decide.rule import DecideConfig
from policies.types import Decision
from service.app import advisor_loop, build_sidecar, target_specs
from service.bench.spec import BenchScenario
from service.loop import AdvisorLoop
from service.settings import Settings, load_settings
from service.sim.scenario import Scenario
from service.sim.world import EngineUnavailableError, World
from service.sources.gpu import NoGpuSource

TARGET = "sim"
METRICS_URL = "http://sim.invalid/metrics"


class SimClock:
    """The simulated wall clock the sidecar reads (Unix-like seconds); the runner moves it."""

    def __init__(self, start_s: float) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s


class WorldTransport(httpx.AsyncBaseTransport):
    """Answers GET /metrics from the world's exposition, 503 while the engine restarts, 404 for anything else."""

    def __init__(self, world: World) -> None:
        self._world = world

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "GET" or request.url.path != "/metrics":
            return httpx.Response(404, text="not found\n")
        try:
            body = self._world.exposition()
        except EngineUnavailableError as exc:
            return httpx.Response(503, text=f"{exc}\n")
        return httpx.Response(200, text=body, headers={"content-type": "text/plain; version=0.0.4; charset=utf-8"})


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        old = merged.get(key)
        merged[key] = _merge(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    return merged


def advisor_settings(
    *,
    model_name: str,
    target: Mapping[str, Any],
    interval_s: float,
    itl_slo_s: float | None,
    extra: Mapping[str, Any],
    change_cost_s: float = 0.0,
) -> Settings:
    """The sidecar's settings for one benchmark world; raises SettingsError (one line per bad field).

    `target` holds the target's own settings (hardware, model_profile or model_config_path, tensor_parallel,
    drafter); its name, URL and model are the benchmark's. `change_cost_s` (s) is what the operator knows of their
    rollout: the service one change interrupts (`decide.change_cost_s`); it goes under the scenario's own settings,
    which may override it.
    """
    ours: dict[str, Any] = {
        "targets": [{**target, "name": TARGET, "url": METRICS_URL, "model": model_name}],
        "scrape_interval_s": interval_s,
        "scrape_timeout_s": interval_s,
        "gpu": {"telemetry": "none"},
    }
    if itl_slo_s is not None:
        ours["objective"] = {"itl_slo_s": itl_slo_s}
    # The operator's rollout time is a default the scenario's advisor settings may override; the target, the
    # tick and the SLO are the benchmark's and go on top.
    known = {"decide": {"change_cost_s": change_cost_s}}
    return load_settings(None, overrides=_merge(_merge(known, extra), ours))


def change_cost_s(scenario: Scenario) -> float:
    """The seconds of full service one change of k interrupts in this world, as its operator would know it.

    restart: nothing is served for restart_delay_s. rolling: each of the N replicas is down for restart_delay_s in
    turn, 1/N of the capacity each time: N x restart_delay_s x 1/N = restart_delay_s of full service, the same
    number (an upper bound: at light load the other replicas absorb the share). Example: restart_delay_s 20 -> 20.
    """
    return scenario.engine.restart_delay_s


def bench_advisor_settings(bench: BenchScenario, *, extra: Mapping[str, Any] | None = None) -> Settings:
    """The advisor's settings for one benchmark scenario (its advisor section, tick, SLO, restart cost and step token
    budget, as its operator configures them: vLLM's --max-num-batched-tokens), with
    `extra` laid over the scenario's own advisor settings. Raises SettingsError."""
    section = bench.bench
    advisor = section.advisor
    drafter: dict[str, Any] = {"method": advisor.drafter_method or bench.scenario.drafter.method,
                               "draft_model_profile": advisor.draft_model_profile}
    if advisor.draft_tensor_parallel is not None:
        drafter["tensor_parallel"] = advisor.draft_tensor_parallel
    target = {
        "hardware": advisor.hardware,
        "model_profile": advisor.model_profile,
        "model_config_path": advisor.model_config_path,
        "tensor_parallel": advisor.tensor_parallel,
        "max_num_batched_tokens": bench.scenario.engine.max_num_batched_tokens,
        "max_num_seqs": bench.scenario.engine.max_num_seqs,
        "drafter": drafter,
    }
    return advisor_settings(
        model_name=bench.scenario.model_name,
        target=target,
        interval_s=section.decision_interval_s,
        itl_slo_s=section.itl_slo_s,
        # The gammas the static runs and the oracle range over are the advisor's too (never fewer than its own
        # default); the scenario's own settings, what its operator configured, go on top.
        extra=_merge(_merge(_bench_options(bench), section.advisor.settings), extra or {}),
        change_cost_s=change_cost_s(bench.scenario),
    )


def _bench_options(bench: BenchScenario) -> dict[str, Any]:
    return {"decide": {"gamma_max": max(bench.gamma_max, DecideConfig().gamma_max)}}


class AdvisorController:
    """The advisor as a benchmark controller: one `run_once(now)` per tick, then the published k (0 = off)."""

    def __init__(self, settings: Settings, *, world: World, clock: SimClock) -> None:
        transport = WorldTransport(world)
        # Validates the profiles (SettingsError) exactly as the sidecar does at start-up; its board is the one the
        # loop publishes to.
        self._clock = clock
        self._sidecar = build_sidecar(settings, clock=clock, gpu_source=NoGpuSource(), transport=transport)
        self._transport = transport
        self._settings = settings
        self._client: httpx.AsyncClient | None = None
        self._loop: AdvisorLoop | None = None
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> AdvisorController:
        s = self._settings
        self._client = await self._stack.enter_async_context(httpx.AsyncClient(transport=self._transport))
        # The sidecar's own seam: the same scrapers, resolvers and loop configuration as production.
        self._loop = advisor_loop(s, target_specs(s, self._client), board=self._sidecar.board, gpu=NoGpuSource())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()

    @property
    def decision(self) -> Decision | None:
        """The decision the last tick published (None before the first)."""
        status = self._sidecar.board.get(TARGET)
        return status.decision if status is not None else None

    async def choose(self, world: World, now_s: float) -> int:
        if self._loop is None:
            raise RuntimeError("AdvisorController is used outside `async with`")
        self._clock.now_s = now_s  # what the sidecar's board and exporter read as "now"
        await self._loop.run_once(now_s)
        decision = self.decision
        if decision is None:
            return world.num_speculative_tokens  # nothing published yet: leave the engine as it is
        return decision.num_speculative_tokens if decision.enabled else 0
