"""`spec-advisor backtest` against a stand-in Prometheus on 127.0.0.1 that answers both instant and range queries
from the same time-varying history (the recorded fleet answers of tests/fixtures/prometheus/fleet-two-replicas.json,
with the running gauge swinging over time). The replay must see exactly what live fleet mode would have seen at
each grid time, while asking Prometheus one range query per query. (A real Prometheus: tests/e2e/.)
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from sidecar_http import served_in_thread, serving

from service.app import advisor_loop, build_sidecar, target_specs
from service.backtest.replay import Grid
from service.backtest.run import BacktestError, backtest_target, run_backtest
from service.board import Board
from service.cli.command import main
from service.settings import Settings, load_settings
from service.sources.gpu import NoGpuSource
from service.sources.prometheus import counters_present_query, fleet_queries

RECORDED = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "prometheus" / "fleet-two-replicas.json").read_text()
)
MODEL = "tiny"
SELECTOR = 'job="vllm", deployment="tiny"'
RATE_WINDOW_S = 10.0
START_S = 1_796_215_000.0
STEP_S = 2.0
POINTS = 40
GRID = Grid(start_s=START_S, end_s=START_S + (POINTS - 1) * STEP_S, step_s=STEP_S)


def running_scale(t: float) -> float:
    """The running gauge over time: x0.2 .. x1.8 of the recorded value, a 40 s swing."""
    return 1.0 + 0.8 * math.sin(2.0 * math.pi * (t - START_S) / 40.0)


class HistoryPrometheus(ThreadingHTTPServer):
    """Answers /api/v1/query?time=t and /api/v1/query_range from one history: each recorded answer's values, the
    running gauge scaled by `running_scale(t)`. Counts the requests per path."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        queries = fleet_queries(model=MODEL, selector=SELECTOR, rate_window_s=RATE_WINDOW_S)
        queries["present"] = counters_present_query(model=MODEL, selector=SELECTOR)
        self.names = {query: name for name, query in queries.items()}
        self.requests: dict[str, int] = {}
        self.asked: dict[str, set[str]] = {}
        self.hold: threading.Event | None = None  # when set to an Event, range queries wait for it
        self.unavailable = False  # when True, every query answers 503 with Prometheus' error body

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def series_at(self, query: str, t: float) -> list[tuple[dict[str, str], str]]:
        name = self.names[query]
        # The recording predates the time-to-first-token queries: a family no replica exports has no series.
        recorded = RECORDED["answers"].get(name)
        result = recorded["body"]["data"]["result"] if recorded is not None else []
        scale = running_scale(t) if name == "running" else 1.0
        return [(item["metric"], repr(float(item["value"][1]) * scale)) for item in result]


class _Handler(BaseHTTPRequestHandler):
    server: HistoryPrometheus

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        params = {key: values[0] for key, values in parse_qs(parts.query).items()}
        self.server.requests[parts.path] = self.server.requests.get(parts.path, 0) + 1
        query = params.get("query", "")
        self.server.asked.setdefault(parts.path, set()).add(query)
        if self.server.unavailable:
            self._send(503, {"status": "error", "errorType": "unavailable", "error": "TSDB not ready"})
        elif query not in self.server.names:
            self._send(400, {"status": "error", "errorType": "bad_data", "error": f"unknown query {query!r}"})
        elif parts.path == "/api/v1/query":
            t = float(params["time"])
            result = [{"metric": m, "value": [t, v]} for m, v in self.server.series_at(query, t)]
            self._send(200, {"status": "success", "data": {"resultType": "vector", "result": result}})
        elif parts.path == "/api/v1/query_range":
            if self.server.hold is not None:
                self.server.hold.wait(30.0)
            start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
            times = [start + i * step for i in range(round((end - start) / step) + 1)]
            by_series: dict[str, dict[str, Any]] = {}
            for t in times:
                for metric, value in self.server.series_at(query, t):
                    entry = by_series.setdefault(json.dumps(metric, sort_keys=True), {"metric": metric, "values": []})
                    entry["values"].append([t, value])
            self._send(200, {"status": "success", "data": {"resultType": "matrix", "result": list(by_series.values())}})
        else:
            self._send(404, {"status": "error", "errorType": "not_found", "error": parts.path})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[HistoryPrometheus]:
    with served_in_thread(HistoryPrometheus()) as server:
        yield server


def fleet_settings(url: str) -> Settings:
    return load_settings(overrides={
        "targets": [{"name": "fleet", "prometheus_url": url, "model": MODEL, "selector": SELECTOR,
                     "rate_window_s": RATE_WINDOW_S, "hardware": "cpu", "model_profile": "tiny-llama",
                     "drafter": {"method": "ngram"}}],
        "scrape_interval_s": STEP_S,
        "scrape_timeout_s": 1.0,
        "estimator": {"window_s": 10.0, "min_drafts": 100, "stale_after_s": 30.0},
        "decide": {"dwell_s": 0.0},
        "gpu": {"telemetry": "none"},
        "actuation": {"gate": {"dwell_s": 10.0, "cooldown_s": 20.0}},
    })


def live_decisions(settings: Settings) -> list[tuple[Any, ...]]:
    """Fleet mode as the sidecar runs it, stepped through the grid's times with instant queries."""

    async def go() -> list[tuple[Any, ...]]:
        board = Board([("fleet", MODEL)], started_at_s=GRID.start_s)
        out: list[tuple[Any, ...]] = []
        async with httpx.AsyncClient() as client:
            loop = advisor_loop(settings, target_specs(settings, client), board=board, gpu=NoGpuSource())
            for i in range(GRID.points):
                await loop.run_once(GRID.time(i))
                entry = board.get("fleet")
                decision = entry.decision if entry is not None else None
                evidence = entry.evidence if entry is not None else None
                out.append((decision.state.value if decision else None, decision.enabled if decision else None,
                            decision.num_speculative_tokens if decision else None,
                            round(decision.expected_speedup, 9) if decision else None,
                            round(evidence.batch, 9) if evidence else None))
        return out

    return asyncio.run(go())


def test_the_replay_sees_what_live_fleet_mode_saw_at_each_time(prometheus: HistoryPrometheus) -> None:
    settings = fleet_settings(prometheus.url)
    live = live_decisions(settings)
    instant_before = prometheus.requests.get("/api/v1/query", 0)

    async def go() -> Any:
        async with httpx.AsyncClient() as upstream:
            return await run_backtest(settings, backtest_target(settings, None), GRID, upstream=upstream)

    result = asyncio.run(go())
    replayed = [(r.state, r.enabled, r.num_speculative_tokens,
                 round(r.expected_speedup, 9) if r.expected_speedup is not None else None,
                 round(r.batch, 9) if r.batch is not None else None) for r in result.rows]
    assert replayed == live
    # The load swung (the evidence followed it) and decisions rested on fresh data.
    batches = [r.batch for r in result.rows if r.batch is not None]
    assert max(batches) > 2 * min(batches)
    assert sum(r.state == "ok" for r in result.rows) > POINTS // 2
    # One range query per fleet query, no instant query.
    assert prometheus.requests.get("/api/v1/query", 0) == instant_before
    assert result.range_requests == prometheus.requests["/api/v1/query_range"]
    assert prometheus.asked["/api/v1/query_range"] == prometheus.asked["/api/v1/query"]
    assert result.range_requests == len(prometheus.asked["/api/v1/query"])


def test_the_cli_prints_the_summary_and_writes_json_and_a_plot(
    prometheus: HistoryPrometheus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "backtest.json", tmp_path / "backtest.png"
    code = main(["backtest", "--prometheus", prometheus.url, "--model", MODEL, "--selector", SELECTOR,
                 "--rate-window-s", f"{RATE_WINDOW_S:g}", "--hardware", "cpu", "--model-profile", "tiny-llama",
                 "--from", f"{GRID.start_s:.0f}",
                 "--to", f"{GRID.end_s:.0f}", "--step", f"{STEP_S:g}", "--json", str(out), "--plot", str(png)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "backtest backtest (tiny)" in printed and "iterations" in printed
    document = json.loads(out.read_text())
    assert len(document["rows"]) == POINTS
    assert document["summary"]["iterations"] == POINTS
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_pod_target_cannot_be_backtested() -> None:
    settings = load_settings(overrides={"targets": [{"name": "pod", "url": "http://127.0.0.1:8000"}]})
    with pytest.raises(BacktestError, match="fleet-mode target"):
        backtest_target(settings, None)


def test_prometheus_unreachable_is_exit_1_and_bad_times_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["backtest", "--prometheus", "http://127.0.0.1:9", "--model", MODEL, "--hardware", "cpu",
            "--model-profile", "tiny-llama"]
    assert main([*base, "--from", f"{START_S:.0f}", "--to", f"{START_S + 4:.0f}", "--step", "2"]) == 1
    assert "no iteration got data" in capsys.readouterr().err
    assert main([*base, "--from", "yesterday"]) == 2
    assert "is not a time" in capsys.readouterr().err
    assert main([*base, "--from", f"{START_S:.0f}", "--to", f"{START_S - 10:.0f}"]) == 2


# ---------------------------------------------------------------------------------------------------------------
# POST /v1/backtest on the running sidecar
# ---------------------------------------------------------------------------------------------------------------


def test_the_api_replays_a_configured_fleet_target_and_refuses_what_it_must(prometheus: HistoryPrometheus) -> None:
    settings = fleet_settings(prometheus.url)
    window = {"start_s": GRID.start_s, "end_s": GRID.end_s, "step_s": STEP_S}

    async def scenario() -> None:
        sidecar = build_sidecar(settings, gpu_source=NoGpuSource())
        async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=60.0) as client:
            answer = await client.post("/v1/backtest", json={"target": "fleet", **window})
            assert answer.status_code == 200, answer.text
            document = answer.json()
            assert document["summary"]["iterations"] == POINTS
            assert document["rows"] is None
            with_rows = (await client.post("/v1/backtest", json={"target": "fleet", "include_rows": True,
                                                                 **window})).json()
            assert len(with_rows["rows"]) == POINTS
            assert with_rows["summary"] == document["summary"]
            refused = {
                "unknown target": {"target": "nope", **window},
                "end before start": {"target": "fleet", "start_s": GRID.end_s, "end_s": GRID.start_s},
                "too many iterations": {"target": "fleet", "start_s": 0.0, "end_s": 1e9, "step_s": 1.0},
                "unknown field": {"target": "fleet", "url": "http://elsewhere", **window},
            }
            for what, body in refused.items():
                response = await client.post("/v1/backtest", json=body)
                assert response.status_code == 422, (what, response.text)
            # While the API answers a backtest, the live endpoints keep answering.
            assert (await client.get("/healthz")).status_code == 200

    asyncio.run(scenario())


def test_the_api_runs_one_backtest_at_a_time(prometheus: HistoryPrometheus) -> None:
    settings = fleet_settings(prometheus.url)
    hold = prometheus.hold = threading.Event()  # range queries wait until released
    window = {"target": "fleet", "start_s": GRID.start_s, "end_s": GRID.end_s, "step_s": STEP_S}

    async def scenario() -> None:
        sidecar = build_sidecar(settings, gpu_source=NoGpuSource())
        async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=60.0) as client:
            first = asyncio.create_task(client.post("/v1/backtest", json=window))
            while not prometheus.requests.get("/api/v1/query_range"):
                await asyncio.sleep(0.05)
            second = await client.post("/v1/backtest", json=window)
            assert second.status_code == 409
            assert "one at a time" in second.json()["detail"]
            hold.set()
            assert (await first).status_code == 200

    asyncio.run(scenario())


def test_a_failing_range_query_is_asked_once_per_replay_not_once_per_iteration(prometheus: HistoryPrometheus) -> None:
    settings = fleet_settings(prometheus.url)
    prometheus.unavailable = True

    async def go() -> Any:
        async with httpx.AsyncClient() as upstream:
            return await run_backtest(settings, backtest_target(settings, None), GRID, upstream=upstream)

    result = asyncio.run(go())
    assert all(row.error is not None and "http_status" in row.error for row in result.rows)
    # At most one range query per query fleet mode asks (its whole window; one failing cancels its siblings), then
    # the same answer from memory: not one per iteration (40 here).
    assert result.range_requests <= prometheus.requests["/api/v1/query_range"] <= len(prometheus.names)


@pytest.mark.parametrize(
    "window",
    [
        {"start_s": GRID.start_s, "end_s": GRID.end_s, "step_s": 1e-320},  # (end - start) / step overflows
        {"start_s": -1e308, "end_s": 1e308, "step_s": 1.0},  # end - start overflows
    ],
)
def test_a_window_no_grid_can_hold_is_a_422_not_a_500(prometheus: HistoryPrometheus, window: dict[str, float]
                                                      ) -> None:
    async def scenario() -> None:
        sidecar = build_sidecar(fleet_settings(prometheus.url), gpu_source=NoGpuSource())
        async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=10.0) as client:
            response = await client.post("/v1/backtest", json={"target": "fleet", **window})
            assert response.status_code == 422, response.text

    asyncio.run(scenario())
