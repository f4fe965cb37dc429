"""The whole sidecar in fleet mode over real HTTP: `build_sidecar` with a `prometheus_url` target reads a stand-in
Prometheus on 127.0.0.1 that answers /api/v1/query with what a real Prometheus answered (tests/fixtures/
prometheus/fleet-two-replicas.json), and every way that Prometheus can fail turns into `stale` with the reason
while the last recommendation stays as it was. (A real Prometheus: tests/e2e/test_fleet_prometheus.py.)

Waits are bounded polls for a behaviour (sidecar_http.wait_for), never timing assertions.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from sidecar_http import serving, wait_for

from service.app import build_sidecar
from service.settings import Settings, load_settings
from service.sources.gpu import NoGpuSource
from service.sources.prometheus import counters_present_query, fleet_queries

RECORDED = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "prometheus" / "fleet-two-replicas.json").read_text()
)
MODEL = "tiny"
SELECTOR = 'job="vllm", deployment="tiny"'
RATE_WINDOW_S = 10.0
TARGET = "fleet"
UNAVAILABLE = {"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}


class FakePrometheus(ThreadingHTTPServer):
    """Answers the fleet queries with the recorded answers; `mode` makes it fail: "slow" holds every answer until
    released (the sidecar's timeout fires first), "unavailable" is a 503 with Prometheus' error body, "empty" an
    empty vector for every query (the model's replicas are gone)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        queries = fleet_queries(model=MODEL, selector=SELECTOR, rate_window_s=RATE_WINDOW_S)
        queries["present"] = counters_present_query(model=MODEL, selector=SELECTOR)
        # The recording predates the time-to-first-token queries: a family no replica exports is an empty vector.
        empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
        recorded = RECORDED["answers"]
        self.answers = {query: recorded[name]["body"] if name in recorded else empty for name, query in queries.items()}
        self.mode = "ok"
        self.release = threading.Event()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the sidecar hanging up on a slow answer is the point of that test

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakePrometheus

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query).get("query", [""])[0]
        mode = self.server.mode
        if mode == "slow":
            self.server.release.wait(10.0)
            return
        status, body = 200, self.server.answers.get(query)
        if parts.path != "/api/v1/query" or body is None:
            status, body = 400, {"status": "error", "errorType": "bad_data", "error": f"unknown query {query!r}"}
        elif mode == "unavailable":
            status, body = 503, UNAVAILABLE
        elif mode == "empty":
            body = {"status": "success", "data": {"resultType": "vector", "result": []}}
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    server = FakePrometheus()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def fleet_settings(prometheus_url: str) -> Settings:
    return load_settings(
        overrides={
            "targets": [
                {
                    "name": TARGET,
                    "prometheus_url": prometheus_url,
                    "model": MODEL,
                    "selector": SELECTOR,
                    "rate_window_s": RATE_WINDOW_S,
                    "hardware": "cpu",
                    "model_profile": "tiny-llama",
                    "drafter": {"method": "ngram"},
                }
            ],
            "scrape_interval_s": 0.25,
            "scrape_timeout_s": 0.25,
            "estimator": {"window_s": 1.0, "min_drafts": 100, "stale_after_s": 5.0},
            "decide": {"dwell_s": 0.0},
            "gpu": {"telemetry": "none"},
        }
    )


def _target(response: httpx.Response) -> dict[str, Any]:
    [target] = response.json()["targets"]
    assert isinstance(target, dict)
    return target


def test_fleet_mode_advises_from_prometheus_and_goes_stale_with_the_reason(prometheus: FakePrometheus) -> None:
    async def scenario() -> None:
        sidecar = build_sidecar(fleet_settings(prometheus.url), gpu_source=NoGpuSource())
        async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:

            def state_is(state: str, reason: str = "") -> Any:
                def accept(response: httpx.Response) -> bool:
                    target = _target(response)
                    return bool(target["state"] == state and reason in target["reason"])

                return accept

            good = _target(await wait_for(client, "/v1/recommendation", state_is("ok")))
            evidence = _target(await client.get("/v1/evidence"))
            # The recorded fleet: r1 = rate(per_pos[0]) / rate(drafts) = 142014.43 / 170071.8; batch = the
            # replicas' mean running, (0 + 14) / 2 = 7.
            assert evidence["acceptance"]["per_position"][0] == pytest.approx(142014.43 / 170071.8)
            assert evidence["batch"] == pytest.approx(7.0)
            assert evidence["speculation_on"] is True and evidence["deployed_k"] == 3
            assert good["curve"]

            # Each failure: stale with its reason, the recommendation held; then Prometheus recovers.
            for mode, reason in (
                ("slow", "scrape failed (timeout)"),
                ("unavailable", "scrape failed (http_status)"),
                ("empty", "scrape failed (model_missing)"),
            ):
                prometheus.mode = mode
                held = _target(await wait_for(client, "/v1/recommendation", state_is("stale", reason)))
                assert (held["enabled"], held["num_speculative_tokens"]) == (
                    good["enabled"],
                    good["num_speculative_tokens"],
                ), mode
                if mode == "unavailable":
                    assert "TSDB not ready" in held["reason"]
                prometheus.release.set()
                prometheus.mode = "ok"
                await wait_for(client, "/v1/recommendation", state_is("ok"))
                prometheus.release.clear()

            # Prometheus down: nothing listens on its port any more.
            prometheus.shutdown()
            prometheus.server_close()
            held = _target(await wait_for(client, "/v1/recommendation", state_is("stale", "scrape failed (connect)")))
            assert held["enabled"] == good["enabled"]
            errors = _target(await client.get("/v1/evidence"))["scrape_errors"]
            assert {"timeout", "http_status", "model_missing", "connect"} <= set(errors)

    asyncio.run(scenario())
