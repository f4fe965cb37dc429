"""The whole sidecar against the simulated vLLM server, over real HTTP: the recommendation follows the load.

The packaged demo world (its physics, model and drafter) with a load that holds each phase long enough to be read:
light (1 request/s, speculation pays) for 140 simulated seconds, a 30 s ramp, a saturated batch (24 requests/s,
fewer drafts pay) for 100 s, a 30 s ramp down; time runs 20x here, so one 300 s cycle takes 15 s of wall time.
The demo's own profile is light for only ~40 s of each 240 s, and the queue a heavy phase leaves takes part of
that to drain: about 2 s of wall time at 20x against a 1 s estimator window and a 1 s dwell, so "back up" was a
race the advisor lost in about one run in four (the batch never left the cap within the test's deadline). The
waits below are bounded polls for a behaviour, not timing assertions.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sidecar_http import serving, wait_for

from service.app import build_sidecar
from service.settings import Settings, load_settings
from service.sim.physics import acceptance_at, expected_step_time_s, expected_tokens_per_verification
from service.sim.scenario import RatePoint, Scenario, default_scenario
from service.sim.server import SimServer
from service.sim.world import World
from service.sources.gpu import NoGpuSource

TIME_SCALE = 20.0


def held_phases_scenario() -> Scenario:
    """The demo world with each load phase held long enough for a 20 s window and a 20 s dwell (module docstring)."""
    scenario = default_scenario()
    knots = (
        RatePoint(t_s=0.0, requests_per_s=1.0),
        RatePoint(t_s=100.0, requests_per_s=1.0),
        RatePoint(t_s=130.0, requests_per_s=24.0),
        RatePoint(t_s=230.0, requests_per_s=24.0),
        RatePoint(t_s=260.0, requests_per_s=1.0),
    )
    workload = scenario.workload.model_copy(update={"arrival_rate": knots, "period_s": 300.0})
    return scenario.model_copy(update={"workload": workload})


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


def true_speedup(world: World, start_s: float, *, gamma: int, batch: float, context_tokens: float) -> float:
    """The simulator's own ground truth S(gamma) at a steady decode batch (its physics, not the advisor's model)."""
    scenario = world.scenario
    elapsed = world.now_s - start_s
    seqs = max(1, round(batch))

    def tokens_per_s(k: int) -> float:
        emitted = expected_tokens_per_verification(scenario.drafter, k, acceptance_at(scenario, elapsed, k))
        step = expected_step_time_s(
            scenario, num_seqs=seqs, num_speculative_tokens=k, mean_context_tokens=context_tokens
        )
        return emitted / step

    return tokens_per_s(gamma) / tokens_per_s(0)


def test_recommendation_follows_the_load_to_what_the_world_rewards() -> None:
    async def scenario() -> None:
        scenario = held_phases_scenario()
        start_s = time.time()
        world = World(scenario, seed=1, start_s=start_s)
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
                light_gamma = first["num_speculative_tokens"]
                assert isinstance(light_gamma, int) and light_gamma >= 2

                # Saturated batch: verification is real compute, so fewer drafts (or none) must be recommended.
                def cut_back(r: httpx.Response) -> bool:
                    rec = recommendation(r)
                    gamma = rec["num_speculative_tokens"]
                    return rec["state"] == "ok" and isinstance(gamma, int) and gamma < light_gamma

                await wait_for(client, "/v1/recommendation", cut_back, deadline_s=90.0)

                # Judged on the saturated plateau, where the truth does not depend on where a ramp was caught: the
                # first cut-back is read from a window trailing a ramp, and at a mid-size batch the world's 64-token
                # tiles make S(gamma) a sawtooth the advisor's smooth model does not follow (seen: truth S(3) 1.26,
                # S(2) 1.19, S(1) 1.26 at the batch of an early cut-back to 2).
                def on_plateau(r: httpx.Response) -> bool:
                    [e] = r.json()["targets"]
                    seqs = e.get("decode_seqs_per_step")
                    return e["state"] == "ok" and isinstance(seqs, float | int) and seqs > 0.6 * max_seqs

                max_seqs = scenario.engine.max_num_seqs
                await wait_for(client, "/v1/evidence", on_plateau, deadline_s=90.0)
                # One window and one dwell (2 s of wall time, 40 simulated) into the 100 s plateau: the advice has
                # seen the plateau and may have moved on from the ramp's gamma (seen under CPU load: still at
                # gamma 2, 88% of gamma 1's truth, as the plateau was reached).
                await asyncio.sleep(2.0)
                loaded = recommendation(await wait_for(client, "/v1/recommendation", cut_back, deadline_s=30.0))
                [ev] = (await client.get("/v1/evidence")).json()["targets"]
                assert ev["speculation_on"] is True  # nothing acts on the advice: the engine still runs k=3
                gamma = loaded["num_speculative_tokens"]
                assert isinstance(gamma, int)
                # The world's truth at the batch each step verified (what the advice prices), not the running
                # gauge, which also counts requests still prefilling on a ramp (seen: 131.9 running, 70 decoding).
                step_batch = ev["decode_seqs_per_step"]
                assert step_batch is not None and step_batch > 32
                truth = {
                    g: true_speedup(
                        world, start_s, gamma=g, batch=step_batch, context_tokens=ev["context_tokens_per_seq"]
                    )
                    for g in range(0, 5)
                }
                # The world agrees the cut-back is an improvement over what runs, and it is near the world's best.
                assert truth[gamma] >= truth[3], truth
                # Near the best, within 10%: the window (20 simulated seconds) may still hold the end of the ramp
                # (seen: gamma 2 at 94.9% of gamma 1's truth).
                assert truth[gamma] >= 0.90 * max(truth.values()), truth

                metrics = (await client.get("/metrics")).text
                published = [
                    s.value
                    for family in text_string_to_metric_families(metrics)
                    for s in family.samples
                    if s.name == "specadvisor_recommended_num_speculative_tokens"
                ]
                assert published == [float(gamma)]

                def back_up(r: httpx.Response) -> bool:
                    rec = recommendation(r)
                    g = rec["num_speculative_tokens"]
                    return rec["state"] == "ok" and isinstance(g, int) and g > gamma

                back = recommendation(await wait_for(client, "/v1/recommendation", back_up, deadline_s=150.0))
                assert back["enabled"] is True
        finally:
            await sim.stop()

    asyncio.run(scenario())
