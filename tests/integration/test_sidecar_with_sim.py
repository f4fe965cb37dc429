"""The whole sidecar against the simulated vLLM server, over real HTTP: the recommendation follows the load.

The packaged demo world swings between light load (speculation pays) and a saturated batch (it costs) every 240
simulated seconds; time runs 20x here, so one cycle takes 12 s of wall time. The waits below are bounded polls
for a behaviour, not timing assertions.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sidecar_http import serving, wait_for

from service.app import build_sidecar
from service.settings import Settings, load_settings
from service.sim.scenario import default_scenario
from service.sim.server import SimServer
from service.sim.world import World
from service.sources.gpu import NoGpuSource

TIME_SCALE = 20.0


def sim_settings(url: str, model: str) -> Settings:
    return load_settings(
        overrides={
            "targets": [
                {
                    "name": "sim",
                    "url": url,
                    "model": model,
                    "model_profile": "llama-3.1-8b",  # the demo world is a Llama-3.1-8B-like model on an H100
                    "hardware": "h100-sxm",
                    "drafter": {"method": "eagle"},
                }
            ],
            "scrape_interval_s": 0.25,
            "scrape_timeout_s": 0.25,
            "estimator": {"window_s": 1.0, "stale_after_s": 2.0},  # 1 s wall = 20 simulated seconds
            "decide": {"dwell_s": 1.0},
            "gpu": {"telemetry": "none"},
        }
    )


def recommendation(response: httpx.Response) -> dict[str, object]:
    [rec] = response.json()["targets"]
    assert isinstance(rec, dict)
    return rec


def test_recommendation_turns_off_under_load_and_back_on() -> None:
    async def scenario() -> None:
        scenario = default_scenario()
        world = World(scenario, seed=1, start_s=time.time())
        sim = SimServer(world, time_scale=TIME_SCALE)
        await sim.start()
        try:
            sidecar = build_sidecar(sim_settings(sim.url, world.model_name), gpu_source=NoGpuSource())
            async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                first = recommendation(
                    await wait_for(client, "/v1/recommendation", lambda r: recommendation(r)["state"] == "ok")
                )
                # Light load first: the running deployment (EAGLE k=3) is the baseline and worth keeping on.
                assert first["enabled"] is True
                assert first["model"] == scenario.model_name

                off = recommendation(
                    await wait_for(
                        client,
                        "/v1/recommendation",
                        lambda r: recommendation(r)["state"] == "ok" and recommendation(r)["enabled"] is False,
                        deadline_s=90.0,
                    )
                )
                assert off["num_speculative_tokens"] == 0
                assert isinstance(off["reason"], str) and "off" in off["reason"]
                [ev] = (await client.get("/v1/evidence")).json()["targets"]
                assert ev["speculation_on"] is True  # nothing acts on the advice: the engine still runs k=3

                metrics = (await client.get("/metrics")).text
                enabled = [
                    s.value
                    for family in text_string_to_metric_families(metrics)
                    for s in family.samples
                    if s.name == "specadvisor_recommended_enabled"
                ]
                assert enabled == [0.0]

                back_on = recommendation(
                    await wait_for(
                        client,
                        "/v1/recommendation",
                        lambda r: recommendation(r)["state"] == "ok" and recommendation(r)["enabled"] is True,
                        deadline_s=90.0,
                    )
                )
                assert isinstance(back_on["num_speculative_tokens"], int) and back_on["num_speculative_tokens"] >= 1
        finally:
            await sim.stop()

    asyncio.run(scenario())
