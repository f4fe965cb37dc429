"""GET /v1/routes over real HTTP: two targets of one route and one unrouted, scraping vLLM capture servers."""

from __future__ import annotations

import asyncio

import httpx
from sidecar_http import FIXTURES, CaptureServer, serving, wait_for

from service.app import build_sidecar
from service.settings import load_settings
from service.sources.gpu import NoGpuSource


def test_targets_are_grouped_by_route_and_placed_on_a_pool() -> None:
    async def scenario() -> None:
        capture = CaptureServer(FIXTURES / "synthetic-eagle-k3.txt")
        async with serving(capture) as capture_url:
            target = {"url": capture_url, "hardware": "h100-sxm", "drafter": {"method": "eagle"}}
            settings = load_settings(overrides={
                "targets": [{"name": "code-0", "route": "code", **target},
                            {"name": "code-1", "route": "code", **target}, {"name": "other", **target}],
                "scrape_interval_s": 0.1, "scrape_timeout_s": 0.1,
                "estimator": {"window_s": 0.4, "stale_after_s": 0.5}, "gpu": {"telemetry": "none"},
            })
            sidecar = build_sidecar(settings, gpu_source=NoGpuSource())
            async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                answer = await wait_for(client, "/v1/routes",
                                        lambda r: r.status_code == 200 and r.json()["routes"][0]["pool"] != "unknown")
                [route] = answer.json()["routes"]  # "other" has no route: left out
                assert route["route"] == "code" and route["targets"] == ["code-0", "code-1"]
                recommendations = (await client.get("/v1/recommendation")).json()["targets"]
                on = {t["target"]: t["enabled"] for t in recommendations if t["state"] == "ok"}
                # Both targets read the same server: the pool follows their (common) recommendation.
                assert route["pool"] == ("spec_on" if all(on.values()) else "spec_off")
                assert route["mean_acceptance_length"] > 1.0 and route["relative_acceptance"] is not None

    asyncio.run(scenario())
