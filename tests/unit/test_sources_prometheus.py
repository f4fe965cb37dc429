"""PrometheusFleetSource on answers a real Prometheus gave (tests/fixtures/prometheus/fleet-two-replicas.json: two
replicas of model 'tiny', rates per second recorded at one instant), replayed through an in-memory transport:
the queries it asks, how the answers become an EngineSnapshot with synthetic counters, and every way an answer
is refused. (A real HTTP peer and a real Prometheus: tests/integration/test_fleet_mode.py and
tests/e2e/test_fleet_prometheus.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.estimate.window import EstimatorConfig, EstimatorState, estimate, observe
from policies.types import EngineSnapshot
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.prometheus import (
    NAMING,
    FleetSelection,
    PrometheusFleetSource,
    counters_present_query,
    fleet_queries,
    label_matchers,
    parse_vector,
    promql_duration,
)

RECORDED = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "prometheus" / "fleet-two-replicas.json").read_text()
)
ANSWERS: dict[str, Any] = RECORDED["answers"]
MODEL = "tiny"
SELECTOR = 'job="vllm", deployment="tiny"'
WINDOW_S = 10.0
PROMETHEUS = "http://prometheus.test:9090"
T0 = 1_800_000_000.0
EMPTY: dict[str, Any] = {"status": "success", "data": {"resultType": "vector", "result": []}}

# The recorded rates (per second) the tests reason with, as Prometheus wrote them.
DRAFTS_RATE = 170071.8
PER_POSITION_RATES = (142014.43, 111462.81, 88716.39)


def _queries() -> dict[str, str]:
    return fleet_queries(model=MODEL, selector=SELECTOR, rate_window_s=WINDOW_S)


Overrides = Mapping[str, tuple[int, Any]]


def _replay(steps: Mapping[float, Overrides]) -> httpx.MockTransport:
    """Answers each query with its recorded answer; `steps[t]` replaces some answers (by query name) with
    (status, body) for the scrape evaluated at time t (every query of a scrape carries its `time`)."""
    queries = {**_queries(), "present": counters_present_query(model=MODEL, selector=SELECTOR)}
    names = {q: name for name, q in queries.items()}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/query"
        name = names.get(request.url.params["query"])
        assert name is not None, request.url.params["query"]
        # The recording predates the time-to-first-token queries: Prometheus answers a family no replica exports
        # with an empty vector, as it would have then.
        recorded = ANSWERS.get(name, {"status_code": 200, "body": EMPTY})
        overrides = steps.get(float(request.url.params["time"]), {})
        status, body = overrides.get(name, (recorded["status_code"], recorded["body"]))
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.Response(status, content=content, headers={"Content-Type": "application/json"})

    return httpx.MockTransport(handler)


def _scrape(times: list[float], steps: list[Overrides] | None = None) -> list[EngineSnapshot]:
    """The snapshots of one source scraping at `times`, scrape i answered with `steps[i]`'s overrides."""

    async def run() -> list[EngineSnapshot]:
        by_time = dict(zip(times, steps, strict=True)) if steps is not None else {}
        async with httpx.AsyncClient(transport=_replay(by_time)) as client:
            fleet = FleetSelection(model=MODEL, selector=SELECTOR, rate_window_s=WINDOW_S)
            source = PrometheusFleetSource(client, PROMETHEUS, fleet)
            return [(await source.scrape(t))[MODEL] for t in times]

    return asyncio.run(run())


def _failure(overrides: Overrides) -> ScrapeError:
    with pytest.raises(ScrapeError) as caught:
        _scrape([T0], [overrides])
    return caught.value


def _vector(*samples: tuple[dict[str, str], str]) -> dict[str, Any]:
    result = [{"metric": labels, "value": [T0, value]} for labels, value in samples]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


# ------------------------------------------------------------------------------------------------------------
# Queries
# ------------------------------------------------------------------------------------------------------------


def test_queries_are_the_documented_promql() -> None:
    queries = _queries()
    sel = 'model_name="tiny", job="vllm", deployment="tiny"'
    assert queries["drafts"] == (
        f"(sum by (model_name) (rate(vllm:spec_decode_num_drafts_total{{{sel}}}[10s]))) or "
        f"(sum by (model_name) (rate(vllm:spec_decode_num_drafts{{{sel}}}[10s])))"
    )
    assert queries["per_position"].startswith(
        f"(sum by (model_name, position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{{{sel}}}[10s])))"
    )
    # Gauges are per-replica means; the renamed KV family is the fallback of the current one.
    assert queries["running"] == f"avg by (model_name) (vllm:num_requests_running{{{sel}}})"
    assert queries["kv_usage"] == (
        f"(avg by (model_name) (vllm:kv_cache_usage_perc{{{sel}}})) or "
        f"(avg by (model_name) (vllm:gpu_cache_usage_perc{{{sel}}}))"
    )
    assert queries["itl_count"].startswith(
        f"(sum by (model_name) (rate(vllm:inter_token_latency_seconds_count{{{sel}}}[10s])))"
    )


def test_matchers_durations_and_escaping() -> None:
    assert label_matchers('a"b\\c', "") == 'model_name="a\\"b\\\\c"'
    assert label_matchers("m", ' namespace="x", ') == 'model_name="m", namespace="x"'
    assert (promql_duration(60.0), promql_duration(2.5), promql_duration(0.25)) == ("60s", "2500ms", "250ms")


# ------------------------------------------------------------------------------------------------------------
# Answers -> snapshot
# ------------------------------------------------------------------------------------------------------------


def test_first_scrape_seeds_the_counters_with_a_window_of_rates() -> None:
    (snapshot,) = _scrape([T0])
    assert snapshot.model_name == MODEL and snapshot.naming == NAMING and snapshot.engines == 1
    # Seeded with rate x window: drafts 170071.8 /s x 10 s = 1700718; the epoch is 10 s before the scrape.
    assert snapshot.spec is not None
    assert snapshot.spec.drafts == pytest.approx(DRAFTS_RATE * WINDOW_S)
    assert snapshot.spec.accepted_per_position == pytest.approx(tuple(r * WINDOW_S for r in PER_POSITION_RATES))
    assert snapshot.created_s == T0 - WINDOW_S
    # Gauges as Prometheus averaged them over the replicas: (0 + 14) / 2 = 7 running.
    assert snapshot.num_requests_running == 7.0 and snapshot.num_requests_waiting == 0.0
    # KV capacity from cache_config_info's kv_cache_size_tokens label (one engine: 1048576).
    assert snapshot.kv_cache_capacity_tokens == 1048576.0
    assert snapshot.inter_token_latency is not None and snapshot.inter_token_latency.count > 0


def test_later_scrapes_integrate_rate_times_elapsed() -> None:
    first, second, third = _scrape([T0, T0 + 5.0, T0 + 7.0])
    assert first.spec is not None and second.spec is not None and third.spec is not None
    # Same rates each time: +170071.8 x 5 s, then x 2 s; the epoch stays (no new baseline).
    assert second.spec.drafts - first.spec.drafts == pytest.approx(DRAFTS_RATE * 5.0)
    assert third.spec.drafts - second.spec.drafts == pytest.approx(DRAFTS_RATE * 2.0)
    assert first.created_s == second.created_s == third.created_s


def test_the_estimator_reads_the_fleet_acceptance() -> None:
    config = EstimatorConfig(window_s=20.0, min_drafts=100)
    state = EstimatorState()
    evidence = None
    for snapshot in _scrape([T0, T0 + 5.0]):
        state = observe(state, snapshot, config)
        evidence = estimate(state, target="fleet", config=config, now_s=snapshot.taken_at_s)
    assert evidence is not None and evidence.acceptance is not None
    # r1 = rate(per_pos[0]) / rate(drafts) = 142014.43 / 170071.8 = 0.835 (the recorded fleet of two replicas,
    # whose true r1 is (51500 + 93600) / (54000 + 120000) = 0.834).
    assert evidence.acceptance.per_position[0] == pytest.approx(142014.43 / 170071.8)
    assert evidence.acceptance.per_position[0] == pytest.approx(145100.0 / 174000.0, abs=0.005)
    assert evidence.batch == 7.0 and evidence.step_time_s is not None


def test_speculation_off_is_no_spec_and_its_reappearance_reseeds() -> None:
    off = {name: (200, EMPTY) for name in ("drafts", "draft_tokens", "accepted", "per_position", "present")}
    first, second = _scrape([T0, T0 + 5.0], [off, {}])  # then speculation turned on across the fleet
    assert first.spec is None
    # A new shape of the speculative counters is a new cold start: seeded again, epoch moved to the new window.
    assert second.spec is not None and second.spec.drafts == pytest.approx(DRAFTS_RATE * WINDOW_S)
    assert second.created_s == T0 + 5.0 - WINDOW_S


def test_a_counter_missing_for_a_scrape_continues_monotonically() -> None:
    first, gap, third = _scrape([T0, T0 + 5.0, T0 + 10.0], [{}, {"generation_tokens": (200, EMPTY)}, {}])
    assert gap.generation_tokens is None
    assert first.generation_tokens is not None and third.generation_tokens is not None
    rate = float(ANSWERS["generation_tokens"]["body"]["data"]["result"][0]["value"][1])
    # Seeded with rate x 10 s; nothing read at +5 s; at +10 s, 10 s of the rate since the last scrape: the counter
    # continues from its value instead of restarting (which the estimator would read as a reset).
    assert third.generation_tokens == pytest.approx(first.generation_tokens + rate * 10.0)


# ------------------------------------------------------------------------------------------------------------
# Refusals
# ------------------------------------------------------------------------------------------------------------


def test_an_error_answer_is_http_status_with_prometheus_reason() -> None:
    failure = _failure({"drafts": (400, ANSWERS["bad_query"]["body"])})
    assert failure.reason is ScrapeErrorReason.HTTP_STATUS
    assert "HTTP 400" in failure.detail and "bad_data" in failure.detail


def test_an_unavailable_prometheus_is_http_status() -> None:
    body = {"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}
    failure = _failure({"running": (503, body)})
    assert failure.reason is ScrapeErrorReason.HTTP_STATUS and "TSDB not ready" in failure.detail


def test_no_series_for_the_model_is_model_missing() -> None:
    failure = _failure({"running": (200, ANSWERS["empty_running"]["body"])})
    assert failure.reason is ScrapeErrorReason.MODEL_MISSING
    assert "'tiny'" in failure.detail and 'deployment="tiny"' in failure.detail


def test_partial_speculative_families_are_missing_family() -> None:
    failure = _failure({"accepted": (200, EMPTY)})
    assert failure.reason is ScrapeErrorReason.MISSING_FAMILY and "accepted" in failure.detail


def test_counters_without_a_rate_are_missing_family_not_speculation_off() -> None:
    off = {name: (200, EMPTY) for name in ("drafts", "draft_tokens", "accepted", "per_position")}
    failure = _failure(off)  # `present` still answers: the drafts counter exists
    assert failure.reason is ScrapeErrorReason.MISSING_FAMILY and "rate_window_s" in failure.detail


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("drafts", _vector(({"model_name": MODEL}, "NaN"))),
        ("running", _vector(({"model_name": MODEL}, "-1"))),
        ("kv_usage", _vector(({"model_name": MODEL}, "1.5"))),
        ("drafts", _vector(({"model_name": MODEL}, "1"), ({"model_name": MODEL, "x": "y"}, "2"))),
        ("per_position", _vector(({"model_name": MODEL, "position": "1"}, "5"))),
        ("per_position", _vector(({"model_name": MODEL, "position": "first"}, "5"))),
    ],
)
def test_unusable_values_are_invalid(name: str, answer: dict[str, Any]) -> None:
    assert _failure({name: (200, answer)}).reason is ScrapeErrorReason.INVALID_VALUE


@pytest.mark.parametrize(
    "body",
    [
        b"<html>proxy error</html>",
        {"status": "error", "error": "boom"},
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1]}]}},
        _vector(({"model_name": MODEL}, "twelve")),
    ],
)
def test_malformed_answers_are_parse_errors(body: Any) -> None:
    assert _failure({"waiting": (200, body)}).reason is ScrapeErrorReason.PARSE


def test_parse_vector_keeps_labels_and_values() -> None:
    samples = parse_vector(json.dumps(ANSWERS["per_position"]["body"]).encode(), what="per_position")
    assert [(s.labels["position"], s.value) for s in samples] == list(
        zip(("0", "1", "2"), PER_POSITION_RATES, strict=True)
    )
