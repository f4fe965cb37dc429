"""End to end: the real sidecar (`spec-advisor serve`) advising on a real llama.cpp llama-server (b10434, CPU, tiny
random GGUF, ngram-simple drafts of up to 4 tokens; see e2e_llamacpp.py).

llama-server's page names no model, so the target's `model: tiny` names it (and, through the catalog's `tiny`
alias, picks the cost model's `tiny-llama` profile). The engine is told from the page (`engine` left at auto).
The sidecar's window must measure exactly the drafts the load added to llama.cpp's own
`llamacpp:spec_decode_num_drafts_total`, per position (llama.cpp counts each position, unlike SGLang).

Runs whenever scripts/setup-llamacpp.sh has installed the server (skipped otherwise, failed under
SPEC_ADVISOR_E2E=1 without it: e2e_llamacpp.require_installed). About 10 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_llamacpp import DRAFT_MAX, LIMITS, PROMPTS, LlamaCppServer, complete, parse_page, run_load
from e2e_processes import free_port, log_tail, stop_process
from e2e_sidecar import RunningSidecar, epoch_s, start_sidecar
from e2e_vllm import record_timing

from service.http.api import AcceptanceOut, EvidenceOut, RecommendationOut

pytestmark = [pytest.mark.e2e]

TARGET = "llamacpp-cpu"
MODEL = "tiny"
DRAFTS = "llamacpp:spec_decode_num_drafts_total"
PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
SCRAPE_INTERVAL_S = 0.5
# Longer than the whole test: the window's oldest scrape is one taken before the load, so its delta is the load.
WINDOW_S = 120.0
# The standard load (e2e_llamacpp.run_load: 12 greedy requests) gives ~40 drafts; 10 is a quarter of that.
MIN_DRAFTS = 10
# A prompt that repeats itself: its first request drafts, so the per-position series exist before the sidecar starts.
WARM_UP_PROMPT = PROMPTS[1]


def write_settings(path: Path, *, url: str, port: int) -> None:
    document: dict[str, Any] = {
        "targets": [
            {"name": TARGET, "url": url, "model": MODEL, "hardware": "cpu", "drafter": {"method": "ngram"}},
        ],
        "scrape_interval_s": SCRAPE_INTERVAL_S,
        "scrape_timeout_s": SCRAPE_INTERVAL_S,
        "host": "127.0.0.1",
        "port": port,
        "gpu": {"telemetry": "none"},
        "estimator": {"window_s": WINDOW_S, "min_drafts": MIN_DRAFTS, "stale_after_s": 10 * SCRAPE_INTERVAL_S},
        "decide": {"dwell_s": 0.0},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def _scrape(server: LlamaCppServer) -> dict[str, float]:
    response = httpx.get(f"{server.base_url}/metrics", timeout=10.0)
    assert response.status_code == 200, response.text[:500]
    return parse_page(response.text)


async def _warm_up(server: LlamaCppServer) -> None:
    async with httpx.AsyncClient(timeout=60.0, limits=LIMITS) as client:
        await complete(client, server.base_url, WARM_UP_PROMPT)


@pytest.fixture
def sidecar(
    llamacpp_server: LlamaCppServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[RunningSidecar]:
    # Speculation shows on llama.cpp's page only once a request has drafted (before, the page reads as "off", and
    # its first drafts would turn speculation "on" in the sidecar: a new baseline, measured over lifetime counters).
    # One drafting request first, so the sidecar's first scrape already reads speculation on and the load below is
    # measured as a window delta, whatever ran on this session-wide server before.
    if f'{PER_POS}{{position="0"}}' not in _scrape(llamacpp_server):
        asyncio.run(_warm_up(llamacpp_server))
    assert f'{PER_POS}{{position="0"}}' in _scrape(llamacpp_server), "the warm-up request drafted nothing"
    config_path = tmp_path / "spec-advisor.yaml"
    write_settings(config_path, url=llamacpp_server.base_url, port=free_port())
    t0 = time.monotonic()
    running = start_sidecar(config_path, log_path=tmp_path / "spec-advisor.log", ready_timeout_s=30.0)
    record_timing(request.config, "sidecar ready (llama.cpp)", time.monotonic() - t0)
    try:
        yield running
    finally:
        stop_process(running.started, grace_s=10.0)


def _target(response: httpx.Response) -> dict[str, Any]:
    response.raise_for_status()
    (entry,) = response.json()["targets"]
    assert isinstance(entry, dict) and entry["target"] == TARGET
    return entry


def _read_after(
    sidecar: RunningSidecar, after_s: float, *, timeout_s: float = 20.0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """/v1/evidence and /v1/recommendation of one evaluation whose scrape came after `after_s` (Unix s)."""
    params = {"target": TARGET}
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] | None = None
    with httpx.Client(base_url=sidecar.base_url, timeout=5.0) as client:
        while time.monotonic() < deadline:
            evidence = _target(client.get("/v1/evidence", params=params))
            recommendation = _target(client.get("/v1/recommendation", params=params))
            last = evidence
            scraped = evidence["last_good_scrape_at"]
            if (scraped is not None and epoch_s(str(scraped)) > after_s
                    and recommendation["evaluated_at"] is not None
                    and epoch_s(str(recommendation["evaluated_at"])) == epoch_s(str(scraped))):
                return evidence, recommendation
            time.sleep(SCRAPE_INTERVAL_S / 4)
    pytest.fail(f"no evaluation of a scrape after the load within {timeout_s:.0f} s; last evidence: {last}\n"
                f"sidecar log:\n{log_tail(sidecar.started.log_path)}", pytrace=False)


def test_sidecar_measures_the_drafts_llamacpp_counted(
    llamacpp_server: LlamaCppServer, sidecar: RunningSidecar, request: pytest.FixtureRequest
) -> None:
    t0 = time.monotonic()
    before = _scrape(llamacpp_server)
    load = run_load(llamacpp_server.base_url)
    llamacpp_server.assert_alive()
    after_s = time.time()  # every request has finished: the counters are final from here on
    after = _scrape(llamacpp_server)
    drafts = after[DRAFTS] - before[DRAFTS]
    per_position = [after[f'{PER_POS}{{position="{i}"}}'] - before[f'{PER_POS}{{position="{i}"}}']
                    for i in range(DRAFT_MAX)]
    assert load.draft_tokens > 0 and drafts >= MIN_DRAFTS, f"the load drafted too little: {load}, {drafts} drafts"

    evidence, recommendation = _read_after(sidecar, after_s)
    record_timing(request.config, "llama.cpp load + sidecar reading", time.monotonic() - t0)

    assert evidence["model"] == MODEL and recommendation["model"] == MODEL
    assert evidence["state"] == "ok", evidence["reason"]
    assert evidence["speculation_on"] is True and evidence["deployed_k"] == DRAFT_MAX
    acceptance = evidence["acceptance"]
    assert acceptance is not None, evidence
    assert acceptance["positions_measured"] is True
    assert len(acceptance["per_position"]) == DRAFT_MAX
    # The window spans the load exactly (its oldest scrape was taken on the idle server before it).
    assert acceptance["cold_start"] is False
    assert acceptance["drafts"] == drafts
    assert acceptance["per_position"] == pytest.approx([count / drafts for count in per_position], rel=1e-9)
    assert acceptance["mean_acceptance_length"] == pytest.approx(1.0 + sum(per_position) / drafts, rel=1e-9)

    # ok, not insufficient_data: the window holds the load's ~40 drafts, above min_drafts (10), and the cost model
    # resolves (model "tiny" is the catalog's tiny-llama, hardware cpu). llama.cpp exports no step-time histogram,
    # so the model stays uncalibrated: a wide band, but a recommendation all the same.
    assert recommendation["state"] == "ok", recommendation["reason"]
    assert recommendation["enabled"] is not None and recommendation["num_speculative_tokens"] is not None
    assert recommendation["expected_speedup"] is not None
    assert recommendation["expected_speedup_low"] <= recommendation["expected_speedup"]
    assert recommendation["expected_speedup"] <= recommendation["expected_speedup_high"]
    assert recommendation["summary"] and recommendation["why"] and recommendation["reason"]
    curve = recommendation["curve"]
    assert [point["gamma"] for point in curve] == list(range(len(curve))) and len(curve) > DRAFT_MAX
    # Positions are measured up to k: only the gammas beyond it are extrapolated.
    assert {p["gamma"] for p in curve if p["extrapolated"]} == {p["gamma"] for p in curve if p["gamma"] > DRAFT_MAX}
    assert recommendation["objective"]
    # The same contract fields as for vLLM (service/http/api.py).
    assert set(recommendation) == set(RecommendationOut.model_fields)
    assert set(evidence) == set(EvidenceOut.model_fields) and set(acceptance) == set(AcceptanceOut.model_fields)
