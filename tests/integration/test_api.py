"""The sidecar over real HTTP: uvicorn on 127.0.0.1, scraping a capture server, answered through httpx."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sidecar_http import FIXTURES, CaptureServer, serving, wait_for

from policies.types import GpuSnapshot
from service.api import create_api
from service.app import build_sidecar
from service.board import Board
from service.exporter import build_registry
from service.loop import GpuReader
from service.settings import Settings, load_settings
from service.sources.gpu import NoGpuSource

EAGLE_CAPTURE = FIXTURES / "synthetic-eagle-k3.txt"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class NamedGpu:
    """GPU telemetry that only knows the device name (as NVML would report it)."""

    def __init__(self, name: str) -> None:
        self._name = name

    async def read(self, now_s: float) -> GpuSnapshot:
        return GpuSnapshot(taken_at_s=now_s, source="nvml", device_name=self._name, device_count=1)


def settings_for(url: str, *, hardware: str = "h100-sxm") -> Settings:
    # Fast ticks so the test does not wait; the window still holds two scrapes (0.4 >= 2 x 0.1).
    return load_settings(
        overrides={
            "targets": [
                {"name": "llama", "url": url, "hardware": hardware, "drafter": {"method": "eagle"}},
            ],
            "scrape_interval_s": 0.1,
            "scrape_timeout_s": 0.1,
            "estimator": {"window_s": 0.4, "stale_after_s": 0.5},
            "gpu": {"telemetry": "none"},
        }
    )


def run_with_sidecar(
    check: Callable[[httpx.AsyncClient, str, CaptureServer], Awaitable[None]],
    *,
    hardware: str = "h100-sxm",
    gpu: GpuReader | None = None,
) -> None:
    async def scenario() -> None:
        capture = CaptureServer(EAGLE_CAPTURE)
        async with serving(capture) as capture_url:
            sidecar = build_sidecar(settings_for(capture_url, hardware=hardware), gpu_source=gpu or NoGpuSource())
            async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                await wait_for(client, "/readyz", lambda r: r.status_code == 200)
                await check(client, url, capture)

    asyncio.run(scenario())


def is_ok(response: httpx.Response) -> bool:
    return response.status_code == 200 and response.json()["targets"][0]["state"] == "ok"


def test_recommendation_contract() -> None:
    async def check(client: httpx.AsyncClient, _url: str, _capture: CaptureServer) -> None:
        body = (await wait_for(client, "/v1/recommendation", is_ok)).json()
        [rec] = body["targets"]
        assert rec["target"] == "llama"
        assert rec["model"] == MODEL
        # First decision: the running deployment (EAGLE, k=3) is the published baseline.
        assert rec["enabled"] is True
        assert rec["num_speculative_tokens"] == 3
        assert rec["expected_speedup_low"] <= rec["expected_speedup"] <= rec["expected_speedup_high"]
        assert rec["reason"]
        assert rec["evaluated_at"].endswith("Z")
        datetime.fromisoformat(rec["evaluated_at"].replace("Z", "+00:00"))
        assert [point["gamma"] for point in rec["curve"]] == list(range(9))  # gamma_max 8
        assert set(rec["curve"][0]) == {"gamma", "speedup", "speedup_low", "speedup_high", "extrapolated"}
        assert rec["curve"][0]["speedup"] == 1.0  # gamma 0 is plain decoding
        assert rec["age_s"] >= 0.0

        same = (await client.get("/v1/recommendation", params={"target": "llama"})).json()
        assert [t["target"] for t in same["targets"]] == ["llama"]

    run_with_sidecar(check)


def test_evidence_contract() -> None:
    async def check(client: httpx.AsyncClient, _url: str, _capture: CaptureServer) -> None:
        await wait_for(client, "/v1/recommendation", is_ok)
        [ev] = (await client.get("/v1/evidence")).json()["targets"]
        assert ev["state"] == "ok"
        assert ev["deployed_k"] == 3
        assert ev["batch"] == pytest.approx(14.0)  # vllm:num_requests_running in the capture
        acceptance = ev["acceptance"]
        # The capture's per-position counts over its drafts: 93600, 67200, 46800 / 120000; every scrape grows them
        # in proportion, so each window delta has the same ratios.
        assert acceptance["per_position"] == pytest.approx([0.78, 0.56, 0.39])
        assert all(
            low <= value <= high
            for low, value, high in zip(
                acceptance["per_position_low"], acceptance["per_position"], acceptance["per_position_high"], strict=True
            )
        )
        assert acceptance["mean_acceptance_length"] == pytest.approx(1 + 207600 / 120000)  # 2.73
        assert acceptance["acceptance_rate"] == pytest.approx(207600 / 360000)
        assert ev["gpu"]["source"] == "absent"
        assert ev["last_good_scrape_at"].endswith("Z")
        assert ev["profiles"] == {
            "hardware": "h100-sxm", "model": "llama-3.1-8b", "drafter": "eagle", "tensor_parallel": "1"
        }

    run_with_sidecar(check)


def test_auto_hardware_follows_the_gpu_name() -> None:
    async def check(client: httpx.AsyncClient, _url: str, _capture: CaptureServer) -> None:
        await wait_for(client, "/v1/recommendation", is_ok)
        [ev] = (await client.get("/v1/evidence")).json()["targets"]
        assert ev["gpu"]["device_name"] == "NVIDIA H200"
        assert ev["profiles"]["hardware"] == "h200"

    run_with_sidecar(check, hardware="auto", gpu=NamedGpu("NVIDIA H200"))


def test_auto_hardware_without_a_gpu_uses_the_fallback() -> None:
    async def check(client: httpx.AsyncClient, _url: str, _capture: CaptureServer) -> None:
        await wait_for(client, "/v1/recommendation", is_ok)
        [ev] = (await client.get("/v1/evidence")).json()["targets"]
        assert ev["profiles"]["hardware"] == "h100-sxm"  # Settings.fallback_hardware's default

    run_with_sidecar(check, hardware="auto")


def test_metrics_and_health() -> None:
    async def check(client: httpx.AsyncClient, _url: str, _capture: CaptureServer) -> None:
        await wait_for(client, "/v1/recommendation", is_ok)
        response = await client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
        }
        ids = (("model", MODEL), ("target", "llama"))
        assert samples[("specadvisor_recommended_enabled", ids)] == 1.0
        assert samples[("specadvisor_recommended_num_speculative_tokens", ids)] == 3.0
        assert samples[("specadvisor_decision_state", (*ids[:1], ("state", "ok"), ids[1]))] == 1.0
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
        schema = (await client.get("/openapi.json")).json()
        assert {"/v1/recommendation", "/v1/evidence", "/healthz", "/readyz", "/metrics"} <= set(schema["paths"])
        assert (await client.get("/docs")).status_code == 200

    run_with_sidecar(check)


def test_bad_requests_are_4xx_json() -> None:
    async def check(client: httpx.AsyncClient, _url: str, _capture: CaptureServer) -> None:
        unknown = await client.get("/v1/recommendation", params={"target": "nope"})
        assert unknown.status_code == 404
        assert unknown.json()["error"] == "not_found"
        assert "nope" in unknown.json()["detail"]
        assert (await client.get("/v1/evidence", params={"target": "nope"})).status_code == 404

        empty = await client.get("/v1/recommendation", params={"target": ""})
        assert empty.status_code == 422
        assert empty.json()["error"] == "invalid_request"
        too_long = await client.get("/v1/recommendation", params={"target": "x" * 500})
        assert too_long.status_code == 422

        wrong_method = await client.post("/v1/recommendation", json={})
        assert wrong_method.status_code == 405
        assert wrong_method.json()["error"] == "method_not_allowed"
        missing = await client.get("/v2/nothing")
        assert missing.status_code == 404
        assert missing.json()["error"] == "not_found"

    run_with_sidecar(check)


def test_failing_target_keeps_the_last_recommendation_visible() -> None:
    async def check(client: httpx.AsyncClient, _url: str, capture: CaptureServer) -> None:
        await wait_for(client, "/v1/recommendation", is_ok)
        capture.status = 503
        body = (
            await wait_for(
                client, "/v1/recommendation", lambda r: r.json()["targets"][0]["state"] in ("stale", "error")
            )
        ).json()
        [rec] = body["targets"]
        assert rec["enabled"] is True and rec["num_speculative_tokens"] == 3  # kept, not flipped
        assert "http_status" in rec["reason"]
        assert rec["age_s"] >= 0.0
        [ev] = (await client.get("/v1/evidence")).json()["targets"]
        assert ev["scrape_errors"]["http_status"] >= 1
        assert "HTTP 503" in ev["last_error"]

        metrics = (await client.get("/metrics")).text
        assert 'specadvisor_scrape_errors_total{model="' + MODEL + '",reason="http_status",target="llama"}' in metrics

    run_with_sidecar(check)


def test_health_before_any_progress() -> None:
    """No loop at all: /readyz waits for a good scrape, /healthz fails once the stall limit has passed."""
    now = {"s": 1_000.0}
    board = Board([("a", None)], started_at_s=1_000.0)
    app = create_api(
        board,
        registry=build_registry(board, clock=lambda: now["s"], version="t"),
        clock=lambda: now["s"],
        stall_after_s=15.0,
        version="t",
    )

    async def scenario() -> None:
        async with serving(app) as url, httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/healthz")).status_code == 200  # 0 s since start-up
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["status"] == "not_ready"
            [rec] = (await client.get("/v1/recommendation")).json()["targets"]
            assert rec["enabled"] is None and rec["evaluated_at"] is None and rec["curve"] == []
            now["s"] = 1_016.0  # 16 s > stall limit 15 s with no iteration
            stalled = await client.get("/healthz")
            assert stalled.status_code == 503
            assert stalled.json()["status"] == "stalled"
            board.finish_iteration(1_016.0)
            assert (await client.get("/healthz")).status_code == 200

    asyncio.run(scenario())

