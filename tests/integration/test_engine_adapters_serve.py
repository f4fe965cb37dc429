"""The whole sidecar (`build_sidecar` under uvicorn) advising on SGLang and TensorRT-LLM stand-ins over loopback HTTP.

Each stand-in is a stdlib HTTP server in a thread (sidecar_http.served_in_thread) serving its engine's fixture page
(tests/fixtures/sglang/, tests/fixtures/trtllm/) with the speculative and token counters grown by a fixed step on
every request, the way the engine's accounting would grow them, so every scrape sees a fresh delta:

    SGLang       verify calls +100, finished requests +5, accepted drafts +150 (implicit), generated tokens
                 +255 = requests + verify + accepted; the ITL histogram +250 tokens (every token after a request's
                 first), its sum +100 steps x 12.5 ms, the buckets from 5 ms per token up.
                 Window E[L] = 1 + 150 / 100 = 2.5 (the fixture's lifetime: 2.70).
    TensorRT-LLM drafted +200 at each of the 3 positions, accepted +160 / +110 / +60 (330), generated tokens
                 +534 = 200 verifications + 330 accepted + 4 finished requests' first tokens.
                 Window r = (0.80, 0.55, 0.30), E[L] = 1 + 330 / 200 = 2.65 (the fixture's lifetime: 2.87).

Next to each engine target the sidecar also advises on a vLLM capture (sidecar_http.CaptureServer), so the engine
target's answers are compared key for key with a vLLM target's (the documented contract: service/http/api.py).
A page that mixes vLLM and SGLang series, or a page of another engine than the target's `engine`, is a
`mixed_engines` scrape error.

Waits are bounded polls for a behaviour (sidecar_http.wait_for), never timing assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sidecar_http import FIXTURES, CaptureServer, served_in_thread, serving, wait_for

from service.app import build_sidecar
from service.http.api import AcceptanceOut, CurvePointOut, EvidenceOut, RecommendationOut
from service.settings import Settings, load_settings
from service.sources.gpu import NoGpuSource

FIXTURE_ROOT = FIXTURES.parent
SGLANG_PAGE = FIXTURE_ROOT / "sglang" / "sglang-0.5.23-eagle-k3.txt"
TRTLLM_PAGE = FIXTURE_ROOT / "trtllm" / "trtllm-050f80d-eagle3-k3.txt"
VLLM_PAGE = FIXTURES / "synthetic-eagle-k3.txt"
VLLM_REF = "vllm-ref"
DEPLOYED_K = 3

# ---- SGLang growth per request -----------------------------------------------------------------------------------
SG_VERIFY = 100.0
SG_REQUESTS = 5.0
SG_ACCEPTED = 150.0  # not on the page: generated - requests - verify
SG_GENERATED = SG_REQUESTS + SG_VERIFY + SG_ACCEPTED  # 255
SG_PROMPT = 2_000.0
SG_STEP_S = 0.0125
SG_ITL_TOKENS = SG_VERIFY + SG_ACCEPTED  # every generated token after a request's first: 250
SG_PER_TOKEN_S = SG_STEP_S * SG_VERIFY / SG_ITL_TOKENS  # 5 ms: the bucket the ITL tokens land in
SG_EXPECTED_MEAN = 1.0 + SG_ACCEPTED / SG_VERIFY  # 2.5
SG_LIFETIME_MEAN = 1.0 + (88_912 - 412 - 32_771) / 32_771  # the fixture's own counters: 2.70

# ---- TensorRT-LLM growth per request -----------------------------------------------------------------------------
TRT_DRAFTED = (200.0, 200.0, 200.0)  # per position: every draft proposes all 3 (max_draft_len 3)
TRT_ACCEPTED = (160.0, 110.0, 60.0)  # per position: drafts that accepted at least position + 1 tokens
TRT_FINISHED = 4.0
TRT_GENERATED = TRT_DRAFTED[0] + sum(TRT_ACCEPTED) + TRT_FINISHED  # 534
TRT_PROMPT = 8_000.0
TRT_EXPECTED_PER_POSITION = [a / TRT_DRAFTED[0] for a in TRT_ACCEPTED]  # 0.80, 0.55, 0.30
TRT_EXPECTED_MEAN = 1.0 + sum(TRT_ACCEPTED) / TRT_DRAFTED[0]  # 2.65
TRT_LIFETIME_MEAN = 1.0 + (13_728 + 10_841 + 8_334) / 17_600  # the fixture's own counters: 2.87

_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _labels(series: str) -> dict[str, str]:
    return dict(_LABEL.findall(series))


def sglang_step(name: str, series: str) -> float:
    """What one request adds to an SGLang sample (module docstring); 0 for what does not grow."""
    if name == "sglang:inter_token_latency_seconds_bucket":
        return SG_ITL_TOKENS if float(_labels(series)["le"]) >= SG_PER_TOKEN_S else 0.0
    return {
        "sglang:spec_verify_calls_total": SG_VERIFY,
        "sglang:num_requests_total": SG_REQUESTS,
        "sglang:generation_tokens_total": SG_GENERATED,
        "sglang:prompt_tokens_total": SG_PROMPT,
        "sglang:inter_token_latency_seconds_count": SG_ITL_TOKENS,
        "sglang:inter_token_latency_seconds_sum": SG_VERIFY * SG_STEP_S,
        "sglang:realtime_tokens_total": SG_ITL_TOKENS,
    }.get(name, 0.0)


def trtllm_step(name: str, series: str) -> float:
    """What one request adds to a TensorRT-LLM sample (module docstring); 0 for what does not grow."""
    if name == "trtllm_spec_decode_drafted_tokens_total":
        return TRT_DRAFTED[int(_labels(series)["token_position"])]
    if name == "trtllm_spec_decode_accepted_tokens_total":
        return TRT_ACCEPTED[int(_labels(series)["token_position"])]
    if name == "trtllm_request_success_total":
        return TRT_FINISHED if _labels(series)["finished_reason"] == "stop" else 0.0
    return {
        "trtllm_generation_tokens_total": TRT_GENERATED,
        "trtllm_prompt_tokens_total": TRT_PROMPT,
        "trtllm_spec_decode_num_draft_tokens_total": sum(TRT_DRAFTED),
        "trtllm_spec_decode_num_accepted_tokens_total": sum(TRT_ACCEPTED),
    }.get(name, 0.0)


def no_growth(name: str, series: str) -> float:
    return 0.0


def grown(lines: list[str], n: int, step: Callable[[str, str], float]) -> str:
    """The page with every sample line's value plus `n` times `step(metric name, series)`."""
    out: list[str] = []
    for line in lines:
        if not line or line.startswith("#"):
            out.append(line)
            continue
        series, _, value = line.rpartition(" ")
        increment = step(series.split("{", 1)[0], series)
        out.append(f"{series} {float(value) + n * increment!r}" if increment else line)
    return "\n".join(out) + "\n"


class StandIn:
    """An engine's /metrics at `path` (404 elsewhere): request n (1-based) gets the page grown n steps."""

    def __init__(self, lines: list[str], step: Callable[[str, str], float], *, path: str) -> None:
        self.lines, self.step, self.path = lines, step, path
        self.requests = 0  # of `path`
        self.misses = 0  # requests of any other path
        self.lock = threading.Lock()

    def next_body(self) -> bytes:
        with self.lock:
            self.requests += 1
            n = self.requests
        return grown(self.lines, n, self.step).encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    stand_in: StandIn


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        stand_in = self.server.stand_in
        if self.path != stand_in.path:
            with stand_in.lock:
                stand_in.misses += 1
            body, status = b"not found\n", 404
        else:
            body, status = stand_in.next_body(), 200
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def standing_in(stand_in: StandIn) -> Iterator[str]:
    """Serve `stand_in` on 127.0.0.1 (ephemeral port) from a thread; yields the base URL."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.stand_in = stand_in
    with served_in_thread(server):
        yield f"http://127.0.0.1:{server.server_address[1]}"


def sidecar_settings(targets: list[dict[str, Any]]) -> Settings:
    return load_settings(
        overrides={
            "targets": targets,
            "scrape_interval_s": 0.25,
            "scrape_timeout_s": 0.25,
            # 100 (SGLang) or 200 (TensorRT-LLM) drafts a scrape: the second scrape's delta is already a window.
            "estimator": {"window_s": 1.0, "min_drafts": 50, "stale_after_s": 5.0},
            "gpu": {"telemetry": "none"},
        }
    )


def _entry(response: httpx.Response, target: str) -> dict[str, Any]:
    assert response.status_code == 200, response.text[:500]
    [entry] = response.json()["targets"]
    assert isinstance(entry, dict) and entry["target"] == target
    return entry


async def _get(client: httpx.AsyncClient, path: str, target: str) -> dict[str, Any]:
    return _entry(await client.get(path, params={"target": target}), target)


def _samples(metrics_text: str, sample_name: str, target: str) -> list[tuple[dict[str, str], float]]:
    """The samples named `sample_name` on the sidecar's /metrics for one target, (labels, value)."""
    return [(dict(s.labels), s.value) for family in text_string_to_metric_families(metrics_text)
            for s in family.samples if s.name == sample_name and s.labels.get("target") == target]


@dataclass(frozen=True)
class EngineCase:
    engine: str  # the target's name and its `engine` spelling
    page: Path
    step: Callable[[str, str], float]
    path: str  # where the stand-in serves the page
    url_path: str  # what the target's url adds to the stand-in's base URL
    drafter: str
    model: str
    expected_mean: float
    lifetime_mean: float
    drafts_per_scrape: float


SGLANG = EngineCase("sglang", SGLANG_PAGE, sglang_step, "/metrics", "", "eagle",
                    "meta-llama/Llama-3.1-8B-Instruct", SG_EXPECTED_MEAN, SG_LIFETIME_MEAN, SG_VERIFY)
TRTLLM = EngineCase("trtllm", TRTLLM_PAGE, trtllm_step, "/prometheus/metrics", "/prometheus/metrics", "eagle3",
                    "Llama-3.1-8B-Instruct", TRT_EXPECTED_MEAN, TRT_LIFETIME_MEAN, TRT_DRAFTED[0])


def _window_ok(entry: dict[str, Any]) -> bool:
    """An ok evidence whose acceptance is a window delta (the first scrape's is the lifetime counters')."""
    acceptance = entry.get("acceptance")
    return entry["state"] == "ok" and acceptance is not None and acceptance["cold_start"] is False


async def _check_engine_target(client: httpx.AsyncClient, case: EngineCase) -> tuple[dict[str, Any], dict[str, Any]]:
    """The engine target's evidence, recommendation and exported gauges against the growth served; returns the
    evidence and recommendation read."""
    name = case.engine
    evidence = _entry(await wait_for(client, f"/v1/evidence?target={name}", lambda r: _window_ok(_entry(r, name))),
                      name)
    # The growth served is what the window measured, not the fixture's lifetime ratios.
    assert abs(case.expected_mean - case.lifetime_mean) > 0.1  # the check below tells the two apart
    acceptance = evidence["acceptance"]
    assert evidence["model"] == case.model
    assert evidence["speculation_on"] is True and evidence["deployed_k"] == DEPLOYED_K
    assert acceptance["mean_acceptance_length"] == pytest.approx(case.expected_mean, rel=1e-9)
    assert acceptance["drafts"] > 0
    assert acceptance["drafts"] / case.drafts_per_scrape == pytest.approx(
        round(acceptance["drafts"] / case.drafts_per_scrape), abs=1e-9), "a window of whole scrapes' growth"
    assert len(acceptance["per_position"]) == DEPLOYED_K
    if case is SGLANG:
        # Only the accepted total is counted: the profile is a fit, exact in its sum (E[L] - 1).
        assert acceptance["positions_measured"] is False
        assert sum(acceptance["per_position"]) == pytest.approx(SG_ACCEPTED / SG_VERIFY, rel=1e-9)
        # The ITL histogram's tokens turned into verify steps: the sum's growth over the verify calls'.
        assert evidence["step_time_s"] == pytest.approx(SG_STEP_S, rel=1e-6)
    else:
        assert acceptance["positions_measured"] is True
        assert acceptance["per_position"] == pytest.approx(TRT_EXPECTED_PER_POSITION, rel=1e-9)
        assert acceptance["acceptance_rate"] == pytest.approx(sum(TRT_ACCEPTED) / sum(TRT_DRAFTED), rel=1e-9)
        assert acceptance["mean_proposed_length"] == pytest.approx(sum(TRT_DRAFTED) / TRT_DRAFTED[0], rel=1e-9)

    # The evaluation after it (a scrape timing out on a loaded machine would make one stale: read the next).
    recommendation = _entry(await wait_for(client, f"/v1/recommendation?target={name}",
                                           lambda r: _entry(r, name)["state"] != "stale"), name)
    assert recommendation["state"] == "ok", recommendation["reason"]
    assert recommendation["model"] == case.model
    assert recommendation["enabled"] is not None and recommendation["expected_speedup"] is not None
    curve = recommendation["curve"]
    assert curve, recommendation
    gammas = [int(p["gamma"]) for p in curve]
    assert gammas == list(range(len(curve))) and max(gammas) > DEPLOYED_K
    flagged = {int(p["gamma"]) for p in curve if p["extrapolated"]}
    if case is SGLANG:
        # Only E[L] at the deployed k is measured: every other speculative gamma rests on the fit. Gamma 0 (plain
        # decoding) uses no acceptance at all, so it is never flagged.
        assert flagged == set(gammas) - {0, DEPLOYED_K}
    else:
        assert flagged == {g for g in gammas if g > DEPLOYED_K}

    metrics = (await client.get("/metrics")).text
    [(labels, mean_length)] = _samples(metrics, "specadvisor_mean_acceptance_length_tokens", name)
    assert labels["model"] == case.model
    assert mean_length == pytest.approx(case.expected_mean, rel=1e-9)
    per_position = {int(lb["position"]): v for lb, v in
                    _samples(metrics, "specadvisor_acceptance_per_position_ratio", name)}
    if case is SGLANG:
        assert per_position == {}, "a fit to the mean is not exported as a per-position measurement"
    else:
        assert [per_position[i] for i in range(DEPLOYED_K)] == pytest.approx(TRT_EXPECTED_PER_POSITION, rel=1e-9)
    # The family itself is exported: the vLLM target's positions are there.
    assert len(_samples(metrics, "specadvisor_acceptance_per_position_ratio", VLLM_REF)) == DEPLOYED_K
    errors = {lb["reason"]: v for lb, v in _samples(metrics, "specadvisor_scrape_errors_total", name)}
    assert errors and all(v == 0 for r, v in errors.items() if r != "timeout"), errors
    return evidence, recommendation


async def _check_same_contract_as_vllm(
    client: httpx.AsyncClient, evidence: dict[str, Any], recommendation: dict[str, Any]
) -> None:
    """The engine target's documents have the vLLM target's keys, which are the documented contract's."""
    vllm_evidence = _entry(await wait_for(client, f"/v1/evidence?target={VLLM_REF}",
                                          lambda r: _window_ok(_entry(r, VLLM_REF))), VLLM_REF)
    vllm_rec = _entry(await wait_for(client, f"/v1/recommendation?target={VLLM_REF}",
                                     lambda r: _entry(r, VLLM_REF)["state"] == "ok"), VLLM_REF)
    assert set(recommendation) == set(vllm_rec) == set(RecommendationOut.model_fields)
    assert {frozenset(p) for p in recommendation["curve"]} == {frozenset(p) for p in vllm_rec["curve"]} == {
        frozenset(CurvePointOut.model_fields)}
    assert set(evidence) == set(vllm_evidence) == set(EvidenceOut.model_fields)
    assert set(evidence["acceptance"]) == set(vllm_evidence["acceptance"]) == set(AcceptanceOut.model_fields)


@pytest.mark.parametrize(
    ("case", "engine_setting"),
    [(SGLANG, "auto"), (SGLANG, "sglang"), (TRTLLM, "auto"), (TRTLLM, "trtllm")],
    ids=["sglang-auto", "sglang-explicit", "trtllm-auto", "trtllm-explicit"],
)
def test_the_sidecar_advises_on_an_engine_page_with_the_vllm_contract(case: EngineCase, engine_setting: str) -> None:
    stand_in = StandIn(case.page.read_text(encoding="utf-8").splitlines(), case.step, path=case.path)

    async def scenario(engine_url: str) -> None:
        capture = CaptureServer(VLLM_PAGE)
        async with serving(capture) as vllm_url:
            settings = sidecar_settings([
                {"name": case.engine, "url": engine_url + case.url_path, "engine": engine_setting,
                 "hardware": "h100-sxm", "drafter": {"method": case.drafter}},
                {"name": VLLM_REF, "url": vllm_url, "hardware": "h100-sxm", "drafter": {"method": "eagle"}},
            ])
            app = build_sidecar(settings, gpu_source=NoGpuSource()).app
            async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                evidence, recommendation = await _check_engine_target(client, case)
                await _check_same_contract_as_vllm(client, evidence, recommendation)
        # The target's url reached the page's path, and only it (a base URL gets /metrics; a /prometheus/metrics
        # URL is kept as it is).
        assert stand_in.requests >= 2 and stand_in.misses == 0

    with standing_in(stand_in) as engine_url:
        asyncio.run(scenario(engine_url))


MIXED_PAGE = VLLM_PAGE.read_text(encoding="utf-8").splitlines() + SGLANG_PAGE.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize(
    ("lines", "path", "engine_setting", "quoted"),
    [
        (MIXED_PAGE, "/metrics", "auto", "series of vllm, sglang on one page"),
        # The target's engine is a claim the page is checked against: a TensorRT-LLM page for an SGLang target.
        (TRTLLM_PAGE.read_text(encoding="utf-8").splitlines(), "/prometheus/metrics", "sglang",
         "the target says sglang"),
    ],
    ids=["vllm-and-sglang-lines", "trtllm-page-for-an-sglang-target"],
)
def test_a_page_of_mixed_or_other_engines_is_a_mixed_engines_scrape_error(
    lines: list[str], path: str, engine_setting: str, quoted: str
) -> None:
    stand_in = StandIn(lines, no_growth, path=path)
    name = "mixed"

    async def scenario(engine_url: str) -> None:
        settings = sidecar_settings([{"name": name, "url": engine_url + path, "engine": engine_setting,
                                      "hardware": "h100-sxm", "drafter": {"method": "eagle"}}])
        app = build_sidecar(settings, gpu_source=NoGpuSource()).app
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
            # A couple of scrapes answered, so the state is the loop's verdict on the page, not the start-up one.
            failed = await wait_for(client, f"/v1/recommendation?target={name}",
                                    lambda r: stand_in.requests >= 2 and "scrape failed" in _entry(r, name)["reason"])
            rec = _entry(failed, name)
            assert rec["state"] in ("stale", "error"), rec
            assert "scrape failed (mixed_engines)" in rec["reason"] and quoted in rec["reason"], rec["reason"]
            assert rec["enabled"] is None and rec["curve"] == [], "no advice from a page that was never read"
            evidence = await _get(client, "/v1/evidence", name)
            assert evidence["state"] in ("stale", "error") and "mixed_engines" in evidence["reason"]
            assert evidence["scrape_errors"].get("mixed_engines", 0) > 0
            assert evidence["acceptance"] is None
            errors = {lb["reason"]: v for lb, v in
                      _samples((await client.get("/metrics")).text, "specadvisor_scrape_errors_total", name)}
            assert errors["mixed_engines"] > 0, errors
            assert {r: c for r, c in errors.items() if c > 0}.keys() <= {"mixed_engines", "timeout"}, errors
            assert (await client.get("/readyz")).status_code == 503

    with standing_in(stand_in) as engine_url:
        asyncio.run(scenario(engine_url))
