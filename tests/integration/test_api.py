"""The sidecar over real HTTP: uvicorn on 127.0.0.1, scraping a capture server, answered through httpx."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import httpx
import pytest
from fastapi import APIRouter
from prometheus_client.parser import text_string_to_metric_families
from sidecar_http import FIXTURES, CaptureServer, Receive, Scope, Send, serving, wait_for

from policies.types import AcceptanceEvidence, CurvePoint, DataState, Decision, Evidence, GpuSnapshot, Why, WhyCode
from service.app import build_sidecar
from service.board import Board
from service.exporter import MetricsPage
from service.http.api import ApiExtensions, EvidencesOut, RecommendationsOut, create_api
from service.loop import GpuReader
from service.settings import Settings, load_settings
from service.sources.gpu import NoGpuSource

EAGLE_CAPTURE = FIXTURES / "synthetic-eagle-k3.txt"
DCGM_PAGE = FIXTURES.parent / "sources" / "dcgm-exporter-2xh100.txt"
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
        # The sentence and its causes: the first decision adopts the deployment and names the best point.
        assert 0 < len(rec["summary"]) <= 120
        codes = [why["code"] for why in rec["why"]]
        assert codes[:2] == ["baseline", "best"]
        best = rec["why"][1]["numbers"]
        assert set(best) == {"gamma", "speedup", "low", "high", "batch"} and best["low"] <= best["speedup"]
        assert rec["evaluated_at"].endswith("Z")
        datetime.fromisoformat(rec["evaluated_at"].replace("Z", "+00:00"))
        assert [point["gamma"] for point in rec["curve"]] == list(range(9))  # gamma_max 8
        assert set(rec["curve"][0]) == {
            "gamma", "speedup", "speedup_low", "speedup_high", "extrapolated", "extrapolated_share", "slo_share"
        }
        assert all(point["slo_share"] is None for point in rec["curve"])  # no ITL SLO configured
        assert rec["curve"][0]["speedup"] == 1.0  # gamma 0 is plain decoding
        # Deployed k = 3 measures positions 1..3: gamma <= 3 rests on them alone, deeper gammas partly extrapolate.
        assert all(point["extrapolated_share"] == 0.0 for point in rec["curve"][:4])
        assert all(0.0 < point["extrapolated_share"] <= 1.0 for point in rec["curve"][4:])
        assert rec["objective"] == "latency"  # the capture has no queue and no SLO is configured
        assert rec["calibration_error_ratio"] is None or rec["calibration_error_ratio"] >= 0.0
        assert list(rec)[-1] == "age_s"  # written per request after the cached rest of the body
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
        assert "prefill_tokens_per_step" in ev and "calibration_error_ratio" in ev
        assert "decode_seqs_per_step" in ev and ev["engines"] == 1
        [rec] = (await client.get("/v1/recommendation")).json()["targets"]
        assert ev["calibration_error_ratio"] == rec["calibration_error_ratio"]

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


class StaticPage:
    """Serves one file at every path (a dcgm-exporter stand-in)."""

    def __init__(self, path: Any) -> None:
        self._body = path.read_bytes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self._body})


def test_a_target_never_scraped_shows_null_values_not_made_up_ones() -> None:
    """The loop evaluates a target whose every scrape fails: its decision echoes defaults (off, gamma 0, speedup
    1.0), which a client ignoring `state` would read as "turn it off". Until a good scrape they are null.
    """

    async def scenario() -> None:
        capture = CaptureServer(EAGLE_CAPTURE)
        capture.status = 503
        async with serving(capture) as capture_url:
            sidecar = build_sidecar(settings_for(capture_url), gpu_source=NoGpuSource())
            async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                body = (
                    await wait_for(
                        client, "/v1/recommendation", lambda r: r.json()["targets"][0]["state"] == "error"
                    )
                ).json()
                [rec] = body["targets"]
                assert RecommendationsOut.model_validate(body)  # null is within the response model
                assert "http_status" in rec["reason"]
                for key in ("enabled", "num_speculative_tokens", "expected_speedup", "expected_speedup_low",
                            "expected_speedup_high", "age_s"):
                    assert rec[key] is None, key
                assert rec["evaluated_at"] is not None  # it was evaluated, just never on data

                evidence = (await client.get("/v1/evidence")).json()
                [ev] = evidence["targets"]
                assert EvidencesOut.model_validate(evidence)
                assert ev["state"] == "error"
                for key in ("speculation_on", "deployed_k", "batch", "waiting", "acceptance", "window_s"):
                    assert ev[key] is None, key
                assert ev["scrape_errors"]["http_status"] >= 1

                capture.status = 200  # the first good scrape brings real values
                [rec] = (await wait_for(client, "/v1/recommendation", is_ok)).json()["targets"]
                assert rec["enabled"] is True and rec["num_speculative_tokens"] == 3  # EAGLE k=3 deployment
                [ev] = (await client.get("/v1/evidence")).json()["targets"]
                assert ev["deployed_k"] == 3 and ev["speculation_on"] is True

    asyncio.run(scenario())


def test_dcgm_label_match_reaches_the_dcgm_source() -> None:
    # The page has two H100s (gpu="0" at 97 %, gpu="1" at 95 %); matching gpu="0" keeps one device at 0.97.
    async def scenario() -> None:
        capture = CaptureServer(EAGLE_CAPTURE)
        async with serving(capture) as capture_url, serving(StaticPage(DCGM_PAGE)) as dcgm_url:
            base = settings_for(capture_url)
            gpu = {"telemetry": "dcgm", "dcgm_url": f"{dcgm_url}/metrics", "dcgm_label_match": {"gpu": "0"}}
            settings = load_settings(overrides={**base.model_dump(exclude={"gpu"}), "gpu": gpu})
            sidecar = build_sidecar(settings)
            async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                await wait_for(client, "/v1/recommendation", is_ok)
                [ev] = (await client.get("/v1/evidence")).json()["targets"]
                assert ev["gpu"]["source"] == "dcgm"
                assert ev["gpu"]["device_count"] == 1
                assert ev["gpu"]["gpu_util_ratio"] == pytest.approx(0.97)  # 97 % / 100, gpu 1 filtered out

    asyncio.run(scenario())


def test_openapi_allows_null_recommendation_and_measurement_values() -> None:
    schemas = create_api(
        Board([("a", None)], started_at_s=0.0),
        metrics=MetricsPage(Board([("a", None)], started_at_s=0.0), clock=lambda: 0.0, version="t"),
        clock=lambda: 0.0,
        stall_after_s=15.0,
        version="t",
    ).openapi()["components"]["schemas"]
    nullable = {
        "RecommendationOut": ("enabled", "num_speculative_tokens", "expected_speedup", "expected_speedup_low",
                              "expected_speedup_high"),
        "EvidenceOut": ("speculation_on", "deployed_k", "batch", "waiting"),
    }
    for model, fields in nullable.items():
        for field in fields:
            prop = schemas[model]["properties"][field]
            assert {"type": "null"} in prop["anyOf"], (model, field)
            assert "first good scrape" in prop["description"], (model, field)


def test_health_before_any_progress() -> None:
    """No loop at all: /readyz waits for a good scrape, /healthz fails once the stall limit has passed."""
    now = {"s": 1_000.0}
    board = Board([("a", None)], started_at_s=1_000.0)
    app = create_api(
        board,
        metrics=MetricsPage(board, clock=lambda: now["s"], version="t"),
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
            assert rec["summary"] == "Not evaluated yet: no good scrape of this target so far." and rec["why"] == []
            now["s"] = 1_016.0  # 16 s > stall limit 15 s with no iteration
            stalled = await client.get("/healthz")
            assert stalled.status_code == 503
            assert stalled.json()["status"] == "stalled"
            board.finish_iteration(1_016.0)
            assert (await client.get("/healthz")).status_code == 200

    asyncio.run(scenario())



def test_causes_reach_the_api_without_numbers_json_cannot_carry() -> None:
    # A running k past the curve gains "inf" over it: JSON has no inf, so that number is left out, the rest stays.
    board = Board([("a", None)], started_at_s=1_000.0)
    why = (Why(WhyCode.GAIN, (("to_gamma", 3.0), ("gain", math.inf), ("wait_s", 30.0))),)
    decision = Decision(
        target="a", model="m", state=DataState.OK, enabled=True, num_speculative_tokens=9, expected_speedup=1.0,
        expected_speedup_low=1.0, expected_speedup_high=1.0, reason="r", evaluated_at_s=1_000.0,
        summary="Running speculation on, k=9; changing to speculation on, k=3 in 30 s if that holds.", why=why,
    )
    evidence = Evidence(target="a", model="m", at_s=1_000.0, state=DataState.OK, speculation_on=True, deployed_k=9,
                        acceptance=None, batch=1.0, waiting=0.0)
    board.publish("a", evidence=evidence, decision=decision, good_scrape_s=1_000.0)
    app = create_api(board, metrics=MetricsPage(board, clock=lambda: 1_000.0, version="t"), clock=lambda: 1_000.0,
                     stall_after_s=15.0, version="t")

    async def scenario() -> None:
        async with serving(app) as url, httpx.AsyncClient(base_url=url) as client:
            reply = await client.get("/v1/recommendation")
            assert reply.status_code == 200, reply.text
            [rec] = reply.json()["targets"]
            assert rec["summary"] == decision.summary
            assert rec["why"] == [{"code": "gain", "numbers": {"to_gamma": 3.0, "wait_s": 30.0}}]

    asyncio.run(scenario())


# ----------------------------------------------------------------------------------------------------------------
# Bodies are rendered once per board write and served as bytes: they must read exactly as pydantic renders the
# response models, and the time-dependent age must still follow the clock between writes.
# ----------------------------------------------------------------------------------------------------------------


def make_decision(*, evaluated_at_s: float, enabled: bool = True) -> Decision:
    return Decision(
        target="llama",
        model=MODEL,
        state=DataState.OK,
        enabled=enabled,
        num_speculative_tokens=3 if enabled else 0,
        expected_speedup=1.42,
        expected_speedup_low=1.31,
        expected_speedup_high=1.55,
        reason="on" if enabled else "off",
        evaluated_at_s=evaluated_at_s,
        curve=(
            CurvePoint(gamma=0, speedup=1.0, speedup_low=1.0, speedup_high=1.0, expected_accepted_length=1.0,
                       step_time_s=0.02),
            CurvePoint(gamma=3, speedup=1.42, speedup_low=1.31, speedup_high=1.55, expected_accepted_length=2.8,
                       step_time_s=0.03, extrapolated=True),
        ),
    )


def make_evidence(*, at_s: float) -> Evidence:
    return Evidence(
        target="llama",
        model=MODEL,
        at_s=at_s,
        state=DataState.OK,
        speculation_on=True,
        deployed_k=3,
        acceptance=AcceptanceEvidence(
            per_position=(0.8, 0.6, 0.4),
            per_position_low=(0.78, 0.57, 0.37),
            per_position_high=(0.82, 0.63, 0.43),
            drafts=1000.0,
            draft_tokens=3000.0,
            accepted_tokens=1800.0,
            mean_acceptance_length=2.8,
            acceptance_rate=0.6,
            mean_proposed_length=3.0,
            window_s=60.0,
        ),
        batch=12.0,
        waiting=0.0,
        step_time_s=0.025,
        gpu=GpuSnapshot(taken_at_s=at_s, source="absent"),
    )


def run_with_board(
    check: Callable[[httpx.AsyncClient, Board, dict[str, float]], Awaitable[None]],
    *,
    routers: Sequence[APIRouter] = (),
) -> None:
    """The API alone (no loop) over a board the test writes, with a clock the test moves."""
    now = {"s": 1_000.0}
    board = Board([("llama", None), ("idle", "m")], started_at_s=1_000.0)
    app = create_api(
        board,
        metrics=MetricsPage(board, clock=lambda: now["s"], version="t"),
        clock=lambda: now["s"],
        stall_after_s=15.0,
        version="t",
        extensions=ApiExtensions(routers=routers),
    )

    async def scenario() -> None:
        async with serving(app) as url, httpx.AsyncClient(base_url=url) as client:
            await check(client, board, now)

    asyncio.run(scenario())


def without_age(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in target.items() if k != "age_s"} for target in body["targets"]]


def test_recommendation_bytes_are_pydantic_json_and_age_follows_the_clock() -> None:
    async def check(client: httpx.AsyncClient, board: Board, now: dict[str, float]) -> None:
        board.publish(
            "llama", evidence=make_evidence(at_s=1_000.0), decision=make_decision(evaluated_at_s=1_000.0),
            good_scrape_s=1_000.0,
        )
        now["s"] = 1_010.25
        first = await client.get("/v1/recommendation")
        assert first.status_code == 200
        assert first.headers["content-type"] == "application/json"
        # Parsing the bytes into the response model and rendering it again gives the same bytes: field order,
        # separators and float spelling are pydantic's, as when FastAPI serialised the model per request.
        assert RecommendationsOut.model_validate_json(first.content).model_dump_json().encode() == first.content
        llama, idle = first.json()["targets"]
        assert llama["age_s"] == 10.25  # 1010.25 now - 1000.0 last good decision
        assert llama["enabled"] is True and llama["curve"][1]["extrapolated"] is True
        assert idle["target"] == "idle" and idle["age_s"] is None and idle["enabled"] is None

        now["s"] = 1_013.5  # no board write in between: only the age moves
        second = await client.get("/v1/recommendation")
        assert RecommendationsOut.model_validate_json(second.content).model_dump_json().encode() == second.content
        assert second.json()["targets"][0]["age_s"] == 13.5  # 1013.5 - 1000.0
        assert without_age(second.json()) == without_age(first.json())

        board.publish(
            "llama", evidence=make_evidence(at_s=1_013.5),
            decision=make_decision(evaluated_at_s=1_013.5, enabled=False), good_scrape_s=1_013.5,
        )
        [after] = (await client.get("/v1/recommendation", params={"target": "llama"})).json()["targets"]
        assert after["enabled"] is False and after["num_speculative_tokens"] == 0 and after["reason"] == "off"
        assert after["age_s"] == 0.0  # 1013.5 - 1013.5

        [idle_only] = (await client.get("/v1/recommendation", params={"target": "idle"})).json()["targets"]
        assert idle_only["target"] == "idle"

    run_with_board(check)


def test_evidence_bytes_are_pydantic_json_and_follow_board_writes() -> None:
    async def check(client: httpx.AsyncClient, board: Board, now: dict[str, float]) -> None:
        board.publish(
            "llama", evidence=make_evidence(at_s=1_000.0), decision=make_decision(evaluated_at_s=1_000.0),
            good_scrape_s=1_000.0,
        )
        first = await client.get("/v1/evidence")
        assert first.headers["content-type"] == "application/json"
        assert EvidencesOut.model_validate_json(first.content).model_dump_json().encode() == first.content
        llama, idle = first.json()["targets"]
        assert llama["acceptance"]["per_position"] == [0.8, 0.6, 0.4]
        assert llama["last_good_scrape_at"] == "1970-01-01T00:16:40.000Z"  # 1000 s after the epoch
        assert llama["scrape_errors"] == {} and idle["acceptance"] is None

        board.record_error("llama", "timeout", "slow")  # a write without a new evaluation
        [llama_after] = (await client.get("/v1/evidence", params={"target": "llama"})).json()["targets"]
        assert llama_after["scrape_errors"] == {"timeout": 1}
        assert llama_after["last_error"] == "timeout: slow"

    run_with_board(check)


def test_metrics_age_is_live_between_board_writes() -> None:
    async def check(client: httpx.AsyncClient, board: Board, now: dict[str, float]) -> None:
        board.publish(
            "llama", evidence=make_evidence(at_s=1_000.0), decision=make_decision(evaluated_at_s=1_000.0),
            good_scrape_s=1_000.0,
        )
        ids = {"target": "llama", "model": MODEL}

        async def sample(name: str) -> float | None:
            text = (await client.get("/metrics")).text
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == name and s.labels == ids:
                        return s.value
            return None

        now["s"] = 1_004.0
        assert await sample("specadvisor_last_good_scrape_age_seconds") == 4.0  # 1004 - 1000
        now["s"] = 1_009.0
        assert await sample("specadvisor_last_good_scrape_age_seconds") == 9.0  # 1009 - 1000, no board write
        assert await sample("specadvisor_recommended_enabled") == 1.0
        board.publish(
            "llama", evidence=make_evidence(at_s=1_009.0),
            decision=make_decision(evaluated_at_s=1_009.0, enabled=False), good_scrape_s=1_009.0,
        )
        assert await sample("specadvisor_recommended_enabled") == 0.0
        assert await sample("specadvisor_last_good_scrape_age_seconds") == 0.0  # 1009 - 1009

    run_with_board(check)


def test_openapi_still_documents_the_response_models() -> None:
    async def check(client: httpx.AsyncClient, _board: Board, _now: dict[str, float]) -> None:
        schema = (await client.get("/openapi.json")).json()
        for path, model in (("/v1/recommendation", "RecommendationsOut"), ("/v1/evidence", "EvidencesOut")):
            ok = schema["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
            assert ok == {"$ref": f"#/components/schemas/{model}"}
        assert "age_s" in schema["components"]["schemas"]["RecommendationOut"]["properties"]

    run_with_board(check)


def test_extra_routers_are_served_with_the_same_error_bodies() -> None:
    router = APIRouter()

    @router.get("/v1/echo")
    async def echo(n: int) -> dict[str, int]:
        return {"n": n}

    async def check(client: httpx.AsyncClient, _board: Board, _now: dict[str, float]) -> None:
        assert (await client.get("/v1/echo", params={"n": 3})).json() == {"n": 3}
        bad = await client.get("/v1/echo", params={"n": "x"})
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"

    run_with_board(check, routers=[router])
