"""Fleet mode against a REAL Prometheus: Debian's `prometheus` scrapes two vLLM-format endpoints (static text
captures from tests/fixtures/vllm/, counters growing per request) as two replicas of one model, and the real
sidecar (`spec-advisor serve`, fleet mode) reads that model from Prometheus' HTTP API.

The two replicas are deliberately different: replica A replays the real vLLM 0.32 CPU n-gram capture (idle:
0 running) with its counters x100 per scrape, replica B the synthetic EAGLE k=3 page (14 running) relabelled to
the same model_name. So the fleet's acceptance is neither replica's, and the sum, not either part, is checked.

Runs only with SPEC_ADVISOR_E2E=1 (like every e2e test, see e2e_vllm.py); then a missing `prometheus` binary
fails the test (scripts/setup-observability-tools.sh installs it). Every wait is bounded; every process started
here is stopped at teardown.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_processes import Started, free_port, stop_process
from e2e_sidecar import epoch_s, start_sidecar
from e2e_vllm import E2E_ENV_VAR, e2e_enabled
from monitoring_stack import (
    PROMETHEUS_NAMES,
    READY_TIMEOUT_S,
    log_tails,
    poll,
    require_binary,
    start_prometheus,
    wait_process_ready,
)

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
MODEL = "tiny"
TARGET = "fleet-tiny"
SCRAPE_INTERVAL_S = 1.0  # Prometheus' scrape interval
RATE_WINDOW_S = 10.0  # rate() over 10 scrapes
WINDOW_S = 20.0  # the sidecar's estimator window
SIDECAR_INTERVAL_S = 1.0
SETTLE_TIMEOUT_S = 90.0

# The counter and histogram samples a replica grows; gauges (running, KV usage) and `_created` stay put.
_GROWING = re.compile(r"^(vllm:[A-Za-z0-9_:]*(?:_total|_sum|_count|_bucket))(\{[^}]*\})? (\S+)$")


class GrowingCapture:
    """A vLLM `/metrics` text capture served over HTTP by a thread: request n (1-based) multiplies every counter
    and histogram sample by n x `scale`, so a scraper sees `scale` x the capture's counts per request. The
    capture's `model_name` labels are rewritten to `model`. Static text keeps the `vllm:` colons (a
    prometheus-client exporter would escape them for Prometheus 2.x: client_python #1177).
    """

    def __init__(self, capture: Path, *, model: str, scale: float) -> None:
        text = capture.read_text(encoding="utf-8")
        self.lines = re.sub(r'model_name="[^"]*"', f'model_name="{model}"', text).splitlines()
        self.scale = scale
        self._lock = threading.Lock()
        self._served_at: list[float] = []
        capture_server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with capture_server._lock:
                    capture_server._served_at.append(time.time())
                    n = len(capture_server._served_at)
                body = capture_server.body(n).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="capture", daemon=True)

    def body(self, n: int) -> str:
        out: list[str] = []
        for line in self.lines:
            match = _GROWING.match(line)
            if match is None or match.group(1).endswith("_created"):
                out.append(line)
            else:
                out.append(f"{match.group(1)}{match.group(2) or ''} {float(match.group(3)) * n * self.scale!r}")
        return "\n".join(out) + "\n"

    def value(self, sample: str) -> float:
        """The capture's value of one sample line (name with labels, as on the page) x `scale`: the growth per
        request."""
        for line in self.lines:
            if line.startswith(sample + " "):
                return float(line.rsplit(" ", 1)[1]) * self.scale
        raise KeyError(sample)

    def requests_between(self, start_s: float, end_s: float) -> int:
        with self._lock:
            return sum(1 for t in self._served_at if start_s < t <= end_s)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10.0)


@dataclass(frozen=True, slots=True)
class Fleet:
    replicas: tuple[GrowingCapture, GrowingCapture]
    prometheus: Started
    prometheus_url: str
    sidecar: Started
    sidecar_url: str


def _write_prometheus_config(path: Path, replicas: tuple[GrowingCapture, ...]) -> None:
    # Not monitoring_stack.write_prometheus_config: that one is a job per target with rules and an Alertmanager.
    interval = f"{SCRAPE_INTERVAL_S:g}s"
    document = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        # One job, two instances: the replicas of one Deployment as a pod monitor would find them.
        "scrape_configs": [
            {
                "job_name": "vllm",
                "static_configs": [{"targets": [r.address for r in replicas], "labels": {"deployment": "tiny"}}],
            }
        ],
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def _start_prometheus(tmp_path: Path, replicas: tuple[GrowingCapture, ...]) -> tuple[Started, str]:
    binary = require_binary("Prometheus", PROMETHEUS_NAMES, env_var="SPEC_ADVISOR_PROMETHEUS_BIN")
    config = tmp_path / "prometheus.yml"
    _write_prometheus_config(config, replicas)
    port = free_port()
    started = start_prometheus(
        binary, config=config, storage=tmp_path / "tsdb", port=port, log_path=tmp_path / "prometheus.log"
    )
    url = f"http://127.0.0.1:{port}"
    wait_process_ready(started, url)
    return started, url


def _write_sidecar_settings(path: Path, *, prometheus_url: str, port: int) -> None:
    document: dict[str, Any] = {
        "targets": [
            {
                "name": TARGET,
                "prometheus_url": prometheus_url,
                "model": MODEL,
                "selector": 'job="vllm", deployment="tiny"',
                "rate_window_s": RATE_WINDOW_S,
                "hardware": "cpu",
                "model_profile": "tiny-llama",
                "drafter": {"method": "ngram"},
            }
        ],
        "scrape_interval_s": SIDECAR_INTERVAL_S,
        "scrape_timeout_s": SIDECAR_INTERVAL_S,
        "host": "127.0.0.1",
        "port": port,
        "gpu": {"telemetry": "none"},
        "estimator": {"window_s": WINDOW_S, "min_drafts": 100, "stale_after_s": 30.0},
        "decide": {"dwell_s": 0.0},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    if not e2e_enabled():
        pytest.skip(f"the fleet-mode test runs a real Prometheus: set {E2E_ENV_VAR}=1")
    replica_a = GrowingCapture(FIXTURES / "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt", model=MODEL, scale=100.0)
    replica_b = GrowingCapture(FIXTURES / "synthetic-eagle-k3.txt", model=MODEL, scale=1.0)
    replicas = (replica_a, replica_b)
    started: list[Started] = []
    for replica in replicas:
        replica.start()
    try:
        prometheus, prometheus_url = _start_prometheus(tmp_path, replicas)
        started.append(prometheus)
        config = tmp_path / "sidecar.yaml"
        port = free_port()
        _write_sidecar_settings(config, prometheus_url=prometheus_url, port=port)
        # /readyz waits for the first good scrape: Prometheus has the replicas' first samples by then.
        sidecar = start_sidecar(config, log_path=tmp_path / "sidecar.log", ready_timeout_s=READY_TIMEOUT_S)
        started.append(sidecar.started)
        yield Fleet(
            replicas=replicas,
            prometheus=prometheus,
            prometheus_url=prometheus_url,
            sidecar=sidecar.started,
            sidecar_url=sidecar.base_url,
        )
    finally:
        for process in reversed(started):
            stop_process(process, grace_s=10.0)
        for replica in replicas:
            replica.stop()


def _target(client: httpx.Client, url: str, path: str) -> dict[str, Any]:
    (target,) = client.get(f"{url}{path}", params={"target": TARGET}).raise_for_status().json()["targets"]
    assert isinstance(target, dict)
    return target


def _logs(fleet: Fleet) -> str:
    return log_tails((fleet.prometheus, fleet.sidecar))


def test_fleet_mode_reads_two_replicas_from_a_real_prometheus(fleet: Fleet) -> None:
    replica_a, replica_b = fleet.replicas
    with httpx.Client(timeout=5.0) as client:

        def settled() -> dict[str, Any] | None:
            # A reading whose window is full and whose rates rest on series older than the rate window: Prometheus'
            # rate() of a series younger than its range under-reads (it extrapolates at most half an interval).
            evidence = _target(client, fleet.sidecar_url, "/v1/evidence")
            acceptance = evidence.get("acceptance")
            if evidence["state"] != "ok" or acceptance is None or acceptance["cold_start"]:
                return None
            if float(evidence["window_s"]) < WINDOW_S or time.time() - start_s < RATE_WINDOW_S + WINDOW_S + 5.0:
                return None
            return evidence

        start_s = time.time()
        evidence = poll("a settled ok evidence", settled, timeout_s=SETTLE_TIMEOUT_S, diagnostics=lambda: _logs(fleet))
        recommendation = _target(client, fleet.sidecar_url, "/v1/recommendation")

    # The truth: each replica grows by its capture's counts x scale per scrape. Over the sidecar's window the fleet's
    # drafts are replica A's per-scrape drafts x A's scrapes in the window + the same for B.
    end_s = epoch_s(str(evidence["last_good_scrape_at"]))  # the window's newest scrape
    window_s = float(evidence["window_s"])
    drafts_a = replica_a.value(f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="{MODEL}"}}')
    drafts_b = replica_b.value(f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="{MODEL}"}}')
    scrapes_a = replica_a.requests_between(end_s - window_s, end_s)
    scrapes_b = replica_b.requests_between(end_s - window_s, end_s)
    true_drafts = drafts_a * scrapes_a + drafts_b * scrapes_b
    acceptance = evidence["acceptance"]
    # 15%: the fleet counters are rate()s integrated over the sidecar's ticks, a moving average over the rate
    # window (10 s) lagging the servers' own counts by ~5 s. With steady 1 s scrapes both agree up to the scrapes
    # that fall on either edge of the 20 s window (+-1 of ~20 per replica: 5% each way) and rate()'s
    # extrapolation over at most half a scrape interval at each end of its 10 s range (5% each way).
    assert float(acceptance["drafts"]) == pytest.approx(true_drafts, rel=0.15), (scrapes_a, scrapes_b)

    # Per-position acceptance of the fleet = (A's accepted at i + B's) / (A's drafts + B's), with the scrape counts
    # equal (Prometheus scrapes both every second): A r1 = 515/540 = 0.954 (x100), B r1 = 93600/120000 = 0.78, so
    # the fleet's r1 = (51500 + 93600) / (54000 + 120000) = 0.834. Both replicas' rates come from the same scrape
    # cadence, so timing errors move numerator and denominator together: a 10% misread of A's rate against B's
    # shifts r by w_A (1 - w_A) (r_A - r_B) x 0.1 <= 0.004 at most; 0.01 absolute covers it.
    per_pos_a = [
        replica_a.value(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="{i}"}}'
        )
        for i in range(3)
    ]
    per_pos_b = [
        replica_b.value(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="{i}"}}'
        )
        for i in range(3)
    ]
    expected = [(a + b) / (drafts_a + drafts_b) for a, b in zip(per_pos_a, per_pos_b, strict=True)]
    assert acceptance["per_position"] == pytest.approx(expected, abs=0.01)
    # Gauges are per-replica means: A runs 0 requests, B 14 -> batch 7.
    assert float(evidence["batch"]) == pytest.approx(7.0)
    assert recommendation["state"] == "ok"
    assert recommendation["curve"], "an ok fleet evidence is priced"

    # Prometheus goes away: the sidecar says stale, with the reason, and keeps its last recommendation.
    stop_process(fleet.prometheus, grace_s=10.0)
    with httpx.Client(timeout=5.0) as client:

        def stale() -> dict[str, Any] | None:
            rec = _target(client, fleet.sidecar_url, "/v1/recommendation")
            return rec if rec["state"] == "stale" else None

        held = poll("a stale recommendation", stale, timeout_s=30.0, diagnostics=lambda: _logs(fleet))
    assert "scrape failed (connect)" in held["reason"]
    assert held["enabled"] == recommendation["enabled"]
