"""GET /v1/audit over real HTTP: a sidecar whose target declares Dynamic SD, scraping a vLLM capture server."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sidecar_http import FIXTURES, CaptureServer, serving, wait_for

from service.app import build_sidecar
from service.settings import load_settings
from service.sources.gpu import NoGpuSource


def test_a_declared_controller_is_audited_against_the_best_static_k() -> None:
    async def scenario() -> None:
        capture = CaptureServer(FIXTURES / "synthetic-eagle-k3.txt")
        async with serving(capture) as capture_url:
            settings = load_settings(overrides={
                "targets": [{"name": "llama", "url": capture_url, "hardware": "h100-sxm",
                             "drafter": {"method": "eagle"}, "speculation_controller": "dynamic_sd"}],
                "scrape_interval_s": 0.1, "scrape_timeout_s": 0.1,
                "estimator": {"window_s": 0.4, "stale_after_s": 0.5}, "gpu": {"telemetry": "none"},
            })
            sidecar = build_sidecar(settings, gpu_source=NoGpuSource())
            async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                await wait_for(client, "/readyz", lambda r: r.status_code == 200)
                answer = await wait_for(
                    client, "/v1/audit",
                    lambda r: r.status_code == 200 and r.json()["targets"][0]["verdict"] in ("worse", "not_worse"),
                )
                [audit] = answer.json()["targets"]
                assert audit["target"] == "llama" and audit["controller"] == "dynamic_sd" and audit["declared"]
                assert audit["deployed_k"] == 3
                assert audit["gain_low_ratio"] <= audit["gain_ratio"] <= audit["gain_high_ratio"]
                assert audit["best_speedup"] / audit["engine_speedup"] == audit["gain_ratio"]
                assert 0 < audit["draft_share"] <= 1 and audit["verified_per_step"] is not None
                # The other methods (eagle deployed; draft_model needs its own profile), priced from their priors.
                assert {o["method"] for o in audit["alternatives"]} == {"ngram", "suffix", "eagle3", "mtp"}
                assert all(o["speedup_low"] <= o["speedup"] <= o["speedup_high"] for o in audit["alternatives"])
                assert (await client.get("/v1/audit", params={"target": "nope"})).status_code == 404
                page = (await client.get("/metrics")).text
                worse = [s for f in text_string_to_metric_families(page) for s in f.samples
                         if s.name == "specadvisor_engine_controller_worse"]
                assert [(s.labels["target"], s.labels["controller"]) for s in worse] == [("llama", "dynamic_sd")]
                assert worse[0].value == (1.0 if audit["verdict"] == "worse" else 0.0)

    asyncio.run(scenario())
