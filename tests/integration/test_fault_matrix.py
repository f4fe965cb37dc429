"""The fault matrix: the whole sidecar (`build_sidecar` under uvicorn) against one loopback upstream on 127.0.0.1
that is switched, fault by fault, between a good vLLM page and every way a /metrics peer can fail.

The contract (README "What it answers", docs/runbook.md SpecAdvisorStale, policies/estimate/window.py
`after_failed_scrape`, policies/decide/hold.py `held`): a failed scrape is counted in
`specadvisor_scrape_errors_total{reason=...}` and turns the target `stale`, with "scrape failed (<reason>)" in its
reason, while the last good recommendation is kept with a growing `age_s`; after `estimator.stale_after_s` without
a good scrape the state is `error`, still keeping that recommendation. `/healthz` (liveness) stays 200 throughout;
the next good scrape brings the state back to `ok`. A restart (counters reset under a new `_created`) is no error:
the window starts a new baseline and the state stays `ok`.

One sidecar instance runs every fault in turn. Waits are bounded polls for a behaviour (sidecar_http.wait_for),
never timing assertions; the whole matrix takes ~30 s, most of it the stale_after_s of each fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sidecar_http import FIXTURES, serving, wait_for

from service.app import build_sidecar
from service.settings import Settings, load_settings
from service.sources.gpu import NoGpuSource

TARGET = "vllm-0"
CAPTURE = (FIXTURES / "synthetic-eagle-k3.txt").read_text(encoding="utf-8").splitlines()
OTHER_SERVER = [  # a real page of a server that is not vLLM: the vLLM capture's process and Python families
    line for line in (FIXTURES / "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt").read_text().splitlines()
    if not line.removeprefix("# HELP ").removeprefix("# TYPE ").startswith("vllm:")
]
STALE_AFTER_S = 1.0
MAX_BODY_BYTES = 8 * 1024 * 1024  # the settings' default, named here because the big bodies are sized against it
MIB = 1024 * 1024


def page(factor: int, *, created_shift_s: float = 0.0, edit: Callable[[str], str] = lambda line: line) -> str:
    """The capture with its speculative counters and generated tokens times `factor` (every scrape sees a fresh
    delta with the capture's ratios, as sidecar_http.CaptureServer does), every `_created` moved by
    `created_shift_s`, and each line then passed through `edit`."""
    out = []
    for line in CAPTURE:
        series, _, value = line.rpartition(" ")
        if line.startswith(("vllm:spec_decode_", "vllm:generation_tokens_total")) and "_total{" in line:
            out.append(edit(f"{series} {float(value) * factor}"))
        elif created_shift_s and not line.startswith("#") and "_created{" in line:
            out.append(edit(f"{series} {float(value) + created_shift_s}"))
        else:
            out.append(edit(line))
    return "\n".join(out) + "\n"


def set_value(prefix: str, value: str) -> Callable[[str], str]:
    """An `edit` that gives every sample line starting with `prefix` the value `value`."""
    return lambda line: f"{line.rsplit(' ', 1)[0]} {value}" if line.startswith(prefix) else line


def cut_after(text: str, prefix: str) -> str:
    """`text` cut at the end of the line starting with `prefix`: well-formed text with the families after it gone."""
    start = text.index("\n" + prefix) + 1
    return text[: text.index("\n", start) + 1]


DRAFTS = "vllm:spec_decode_num_drafts_total{"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total{"
RUNNING = "vllm:num_requests_running{"
WAITING = "vllm:num_requests_waiting{"
# 100 000 engines' series of one family, ~5 MB: within the body cap, far past the series cap.
ONE_FAMILY_100K = "".join(
    f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 0\n' for i in range(100_000)
).encode()
assert len(ONE_FAMILY_100K) < MAX_BODY_BYTES
GZIP_BOMB = gzip.compress(b"# pad\n" * (20 * MIB // 6))  # ~20 KB on the wire, 20 MiB decoded


@dataclass(frozen=True)
class Answer:
    """What the upstream sends: a status, a body, and optionally a Content-Length other than the body's, a
    Content-Encoding, or a body streamed in chunks until `stream_bytes` (no length: ends when the connection does)."""

    body: bytes = b""
    status: int = 200
    content_length: int | None = None
    content_encoding: str | None = None
    stream_bytes: int = 0


def answer_for(fault: str, n: int, *, since_switch: int) -> Answer:
    """The upstream's answer to its `n`th request (1-based), the `since_switch`th under `fault` (the matrix's
    names)."""
    good = page(n)
    bodies: dict[str, Callable[[], str]] = {
        "garbage": lambda: "<html><body>{{ login required </body></html>\n",
        "nan": lambda: page(n, edit=set_value(RUNNING, "NaN")),
        "inf": lambda: page(n, edit=set_value(DRAFTS, "+Inf")),
        "negative": lambda: page(n, edit=set_value(WAITING, "-3")),
        "drafts_1e308": lambda: page(n, edit=set_value(DRAFTS, "1e308")),
        # accepted tokens (207600 x n, = the sum over positions) above the draft tokens proposed
        "accepted_gt_drafted": lambda: page(n, edit=set_value(DRAFT_TOKENS, str(207_600 * n - 1000))),
        "no_engine_series": lambda: "\n".join(OTHER_SERVER) + "\n",
        "renamed_spec_families": lambda: page(
            n, edit=lambda line: line.replace("vllm:spec_decode_num_", "vllm:spec_decode_v2_num_")),
        # a new engine: counters from (near) zero again, every _created an hour later
        "restart": lambda: page(since_switch, created_shift_s=3600.0),
        "cut_mid_line": lambda: good[: good.index(RUNNING) + 30],
        # At a line boundary, after the sidecar has read whole pages: valid text, families gone. The cut moves
        # between two lines, as it would from page to page; a cut that stays on one line is accepted as the
        # engine's new shape after three pages (service/sources/continuity.py), which is not this fault.
        "cut_at_line": lambda: cut_after(good, "vllm:prompt_tokens_total{" if n % 2 else "vllm:generation_tokens"),
    }
    if fault in bodies:
        return Answer(bodies[fault]().encode())
    return {
        "good": Answer(good.encode()),
        "http_500": Answer(b"Internal Server Error\n", status=500),
        "http_401": Answer(b"Unauthorized\n", status=401),
        "short_body": Answer(good.encode()[: len(good) // 2], content_length=len(good)),
        "huge_body": Answer(stream_bytes=MAX_BODY_BYTES + 4 * MIB),
        "gzip_bomb": Answer(GZIP_BOMB, content_encoding="gzip"),
        "one_family_100k": Answer(ONE_FAMILY_100K),
    }[fault]


class Upstream:
    """The switchable vLLM stand-in. `fault` names what the next requests get ("good", a name `answer_for` knows,
    "no_answer" (hold the request until the fault changes) or "refused" (nothing listens: `stop`))."""

    def __init__(self) -> None:
        self.fault = "good"
        self.requests = 0
        self.switched_at = 0  # the request count when `fault` was last switched
        self.port = 0
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> None:
        """Listen (again) on the same port, so the sidecar's target URL stays valid."""
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.upstream = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    def switch(self, fault: str) -> None:
        with self._lock:
            self.fault, self.switched_at = fault, self.requests

    def next_request(self) -> tuple[int, int]:
        """This request's number and its number since the last switch (both 1-based)."""
        with self._lock:
            self.requests += 1
            return self.requests, self.requests - self.switched_at


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    upstream: Upstream

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the sidecar hanging up on a huge or held answer is the point of those faults


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so "refused" is refused (no kept-alive connection outlives `stop`).
    server: _Server

    def do_GET(self) -> None:
        upstream = self.server.upstream
        n, since_switch = upstream.next_request()
        while upstream.fault == "no_answer":
            time.sleep(0.02)  # hold it; then answer as the upstream is by then (the sidecar has hung up)
        # A request accepted just before `stop` is answered as a good one (the listener is gone, not the server).
        fault = "good" if upstream.fault == "refused" else upstream.fault
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._send(answer_for(fault, n, since_switch=since_switch))

    def _send(self, answer: Answer) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if not answer.stream_bytes:
            self.send_header("Content-Length", str(answer.content_length or len(answer.body)))
        if answer.content_encoding:
            self.send_header("Content-Encoding", answer.content_encoding)
        self.end_headers()
        self.wfile.write(answer.body)
        chunk = b"# padding line for a very large page\n" * 1700  # ~64 KB
        sent = 0
        while sent < answer.stream_bytes:
            self.wfile.write(chunk)
            sent += len(chunk)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    server.start()
    try:
        yield server
    finally:
        server.switch("good")  # releases held requests
        server.stop()


def fault_settings(url: str) -> Settings:
    return load_settings(
        overrides={
            "targets": [{"name": TARGET, "url": url, "hardware": "h100-sxm", "drafter": {"method": "eagle"}}],
            "scrape_interval_s": 0.25,
            "scrape_timeout_s": 0.2,
            "max_body_bytes": MAX_BODY_BYTES,
            # /healthz fails after 2 s without a finished iteration: far beyond a slow CI box's tick, far below a
            # fault's length, so a loop held up by a fault still fails it.
            "stall_after_intervals": 8,
            "estimator": {"window_s": 0.5, "stale_after_s": STALE_AFTER_S},
            # No change of advice during the test: the advice a fault holds is the one published before it.
            "decide": {"confirm_s": 3600.0, "dwell_s": 3600.0},
            "gpu": {"telemetry": "none"},
        }
    )


# (fault, the scrape error reason it must be counted as, a piece of the detail the reason must quote)
FAULTS: list[tuple[str, str, str]] = [
    ("refused", "connect", ""),
    ("no_answer", "timeout", ""),
    ("http_500", "http_status", "HTTP 500"),
    ("http_401", "http_status", "HTTP 401"),
    ("garbage", "parse", ""),
    ("cut_mid_line", "parse", "newline"),
    ("cut_at_line", "missing_family", "inter_token_latency"),
    ("short_body", "protocol", ""),
    ("huge_body", "body_too_large", ""),
    ("gzip_bomb", "body_too_large", ""),
    ("one_family_100k", "too_many_series", "MAX_SAMPLE_LINES"),
    ("nan", "invalid_value", "nan"),
    ("inf", "invalid_value", "inf"),
    ("negative", "invalid_value", "-3"),
    ("drafts_1e308", "invalid_value", "= 1e+308 (over 1e+18)"),
    ("accepted_gt_drafted", "invalid_value", "> draft tokens"),
    ("no_engine_series", "unknown_engine", "its metric prefixes"),
    ("renamed_spec_families", "missing_family", "vllm:spec_decode_v2_num_drafts_total"),
]


def _target(response: httpx.Response) -> dict[str, Any]:
    [target] = response.json()["targets"]
    assert isinstance(target, dict)
    return target


def _advice(target: dict[str, Any]) -> tuple[Any, ...]:
    return (target["enabled"], target["num_speculative_tokens"], target["expected_speedup"],
            target["expected_speedup_low"], target["expected_speedup_high"])


def scrape_errors(metrics_text: str) -> dict[str, float]:
    """`specadvisor_scrape_errors_total` of the target by reason, from the sidecar's /metrics page."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "specadvisor_scrape_errors":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["target"] == TARGET:
                    counts[sample.labels["reason"]] = sample.value
    assert counts, "no specadvisor_scrape_errors_total series"
    return counts


class Sidecar:
    """The sidecar's API as the matrix reads it."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def errors(self) -> dict[str, float]:
        return scrape_errors((await self.client.get("/metrics")).text)

    async def until(self, what: str, accept: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        response = await wait_for(self.client, "/v1/recommendation",
                                  lambda r: r.status_code == 200 and accept(_target(r)))
        target = _target(response)
        assert target["target"] == TARGET, what
        return target

    async def live(self, what: str) -> None:
        response = await self.client.get("/healthz")
        assert response.status_code == 200, (what, response.text)


def failing_with(state: str, reason: str) -> Callable[[dict[str, Any]], bool]:
    return lambda t: t["state"] == state and f"scrape failed ({reason})" in t["reason"]


async def check_fault(sidecar: Sidecar, upstream: Upstream, fault: str, reason: str, quoted: str) -> None:
    good = await sidecar.until(f"{fault}: ok before", lambda t: t["state"] == "ok")
    before = await sidecar.errors()
    if fault == "refused":
        upstream.stop()
    upstream.switch(fault)

    # stale, with the reason and the detail, the last advice kept; its age grows
    stale = await sidecar.until(f"{fault}: stale", failing_with("stale", reason))
    assert _advice(stale)[:2] == _advice(good)[:2] and stale["expected_speedup"] is not None, fault
    assert quoted in stale["reason"], (fault, stale["reason"])
    later = await sidecar.until(f"{fault}: age grows", lambda t: failing_with("stale", reason)(t)
                                and t["age_s"] > stale["age_s"])
    assert _advice(later) == _advice(stale) and later["evaluated_at"] == stale["evaluated_at"], fault
    await sidecar.live(f"{fault}: stale")

    # counted under its reason, and under no other (but `timeout`: on a loaded machine a good scrape may miss the
    # short scrape timeout this test runs with, and that is counted too, truly)
    during = await sidecar.errors()
    assert during[reason] > before[reason], (fault, before, during)
    others = {reason, "timeout"}
    assert {r: c for r, c in during.items() if r not in others} == {r: c for r, c in before.items()
                                                                      if r not in others}, (fault, before, during)

    # error once no good scrape for stale_after_s, the advice still kept, older
    error = await sidecar.until(f"{fault}: error", failing_with("error", reason))
    assert _advice(error) == _advice(stale) and error["age_s"] > STALE_AFTER_S, (fault, error)
    await sidecar.live(f"{fault}: error")

    # back to the good page: ok again
    upstream.switch("good")
    if fault == "refused":
        upstream.start()
    back = await sidecar.until(f"{fault}: ok after", lambda t: t["state"] == "ok")
    assert back["age_s"] < error["age_s"], fault
    await sidecar.live(f"{fault}: ok after")


async def check_restart(sidecar: Sidecar, upstream: Upstream) -> None:
    """A restart is no scrape error: the window starts again from the new engine's counters, the state stays ok."""
    await sidecar.until("restart: ok before", lambda t: t["state"] == "ok")
    before = await sidecar.errors()
    upstream.switch("restart")
    # Once the sidecar has scraped the restarted engine a few times (the upstream's own count of requests):
    evidence = await wait_for(sidecar.client, "/v1/evidence", lambda r: upstream.requests >= upstream.switched_at + 3
                              and _target(r)["state"] == "ok")
    acceptance = _target(evidence)["acceptance"]
    # Deltas from the new engine's counters only (a delta across the reset would be 0 drafts: no acceptance).
    assert acceptance is not None and acceptance["drafts"] > 0
    assert acceptance["per_position"][0] == pytest.approx(93600 / 120000)  # the capture's r_1
    assert _target(await sidecar.client.get("/v1/recommendation"))["state"] == "ok"
    assert await sidecar.errors() == before
    await sidecar.live("restart")
    upstream.switch("good")


def test_every_fault_turns_stale_then_error_with_its_reason_and_recovers(upstream: Upstream) -> None:
    async def scenario() -> None:
        app = build_sidecar(fault_settings(upstream.url), gpu_source=NoGpuSource()).app
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
            sidecar = Sidecar(client)
            first = await sidecar.until("first ok", lambda t: t["state"] == "ok")
            assert first["enabled"] is not None and first["expected_speedup"] is not None
            assert all(count == 0 for count in (await sidecar.errors()).values())
            for fault, reason, quoted in FAULTS:
                await check_fault(sidecar, upstream, fault, reason, quoted)
            await check_restart(sidecar, upstream)
            # Every fault was counted under its reason (the per-fault checks compare before and after).
            counted = await sidecar.errors()
            assert {reason for _, reason, _ in FAULTS} <= {r for r, c in counted.items() if c > 0}
            assert counted["internal"] == 0

    asyncio.run(scenario())
