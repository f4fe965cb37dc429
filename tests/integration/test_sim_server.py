"""The simulated vLLM server over real HTTP on 127.0.0.1 (ephemeral port), driven by a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.sim.scenario import default_scenario
from service.sim.server import SimServer
from service.sim.world import World
from service.sources.dcgm import parse_dcgm_metrics

START_S = 1_900_000_000.0


class FakeClock:
    """A wall clock the test moves by hand."""

    def __init__(self, t: float = 500.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def with_server(
    body: Callable[[SimServer, httpx.AsyncClient, FakeClock], Awaitable[None]], *, time_scale: float = 10.0
) -> None:
    async def main() -> None:
        clock = FakeClock()
        server = SimServer(World(default_scenario(), seed=4, start_s=START_S), time_scale=time_scale, clock=clock)
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30.0) as client:
                await body(server, client, clock)
        finally:
            await server.stop()

    asyncio.run(main())


def family_names(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


def sample(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    raise KeyError(name)


def test_metrics_are_served_in_vllm_format_on_an_ephemeral_port() -> None:
    async def body(server: SimServer, client: httpx.AsyncClient, clock: FakeClock) -> None:
        assert server.url.startswith("http://127.0.0.1:")
        assert not server.url.endswith(":0")
        clock.t += 12.0
        response = await client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        names = family_names(response.text)
        assert {"vllm:spec_decode_num_drafts", "vllm:num_requests_running", "vllm:generation_tokens"} <= names
        # 12 s of wall clock at time_scale 10 is 120 simulated seconds after the world's start.
        state = (await client.get("/sim/state")).json()
        assert state["sim_time_s"] == pytest.approx(START_S + 120.0)
        assert state["serving"] is True
        assert (await client.get("/health")).status_code == 200
        models = (await client.get("/v1/models")).json()
        assert models["data"][0]["id"] == "demo-llama-8b"

    with_server(body)


def test_speculation_change_restarts_the_server() -> None:
    delay_s = default_scenario().engine.restart_delay_s

    async def body(server: SimServer, client: httpx.AsyncClient, clock: FakeClock) -> None:
        clock.t += 6.0  # 60 simulated seconds of traffic
        before = (await client.get("/metrics")).text
        assert sample(before, "vllm:generation_tokens_created") == START_S

        response = await client.post("/sim/speculation", json={"num_speculative_tokens": 0})
        assert response.status_code == 202
        assert response.json()["num_speculative_tokens"] == 0
        assert (await client.get("/metrics")).status_code == 503
        assert (await client.get("/health")).status_code == 503

        # The restart started at START + 60 s and lasts delay_s simulated seconds = delay_s / 10 wall seconds.
        clock.t += delay_s / 10.0 + 1.0
        after = await client.get("/metrics")
        assert after.status_code == 200
        assert not any(name.startswith("vllm:spec_decode") for name in family_names(after.text))
        assert sample(after.text, "vllm:generation_tokens_created") == pytest.approx(START_S + 60.0 + delay_s)

    with_server(body)


def test_a_dcgm_exporter_page_sits_beside_the_engine() -> None:
    # The demo world: an H100-like device at 3.35e12 B/s peak that streams at 0.82 of it. Under its light start the
    # steps read well under the 0.82 ceiling; the tensor pipe (tiny decode GEMMs) barely works; the page parses
    # as dcgm-exporter's, and keeps answering while the engine restarts (the GPU is still there, idle).
    async def body(server: SimServer, client: httpx.AsyncClient, clock: FakeClock) -> None:
        clock.t += 6.0
        page = await client.get("/dcgm/metrics")
        assert page.status_code == 200
        gpu = parse_dcgm_metrics(page.text, taken_at_s=START_S + 60.0)
        assert gpu.dram_active_ratio is not None and 0.05 < gpu.dram_active_ratio <= 0.82
        assert gpu.tensor_active_ratio is not None and gpu.tensor_active_ratio < gpu.dram_active_ratio
        assert gpu.memory_used_bytes is not None and gpu.memory_used_bytes > 16e9  # the weights at least
        await client.post("/sim/speculation", json={"num_speculative_tokens": 0})
        clock.t += 1.5  # 15 simulated seconds into the restart: nothing runs for the last 10 s
        idle = parse_dcgm_metrics((await client.get("/dcgm/metrics")).text, taken_at_s=START_S + 75.0)
        assert idle.dram_active_ratio == 0.0 and idle.gpu_util_ratio == 0.0

    with_server(body)


def test_bad_speculation_requests_are_rejected() -> None:
    async def body(server: SimServer, client: httpx.AsyncClient, clock: FakeClock) -> None:
        for payload in ({"num_speculative_tokens": -1}, {"num_speculative_tokens": 99}, {"k": 2}):
            response = await client.post("/sim/speculation", json=payload)
            assert response.status_code == 422
        assert (await client.get("/health")).status_code == 200

    with_server(body)


def test_url_before_start_is_an_error() -> None:
    server = SimServer(World(default_scenario(), start_s=START_S), clock=FakeClock())
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.url
