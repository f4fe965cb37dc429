"""EngineScraper and DcgmSource against a real HTTP server on 127.0.0.1 (ephemeral port, one thread per request).

Each route plays one way a `/metrics` peer can fail. Timeouts are kept short (fractions of a second) and the slow
routes are released at teardown, so no test waits on a sleeping server.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.types import EngineSnapshot, GpuSnapshot
from service.sources.dcgm import DcgmSource
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.scraper import PARSE_IN_THREAD_CHARS, EngineScraper

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURE = (FIXTURES / "vllm" / "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt").read_bytes()
DCGM_PAGE = (FIXTURES / "sources" / "dcgm-exporter-2xh100.txt").read_bytes()
T = 1_800_000_000.0
SHORT_TIMEOUT_S = 0.5
MIB = 1024 * 1024

Route = Callable[["_Handler", threading.Event], None]


def _send(handler: _Handler, status: int, body: bytes, **headers: str) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
    handler.send_header("Content-Length", headers.pop("content_length", str(len(body))))
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.end_headers()
    handler.wfile.write(body)


def _capture(h: _Handler, _: threading.Event) -> None:
    _send(h, 200, CAPTURE)


def _eight_engines(h: _Handler, _: threading.Event) -> None:
    # A data-parallel server: every engine="0" series repeated for engines 1..7, so the page passes the size above
    # which the scraper parses in a worker thread.
    lines = []
    for line in CAPTURE.decode().splitlines():
        lines.append(line)
        if 'engine="0"' in line and not line.startswith("#"):
            lines.extend(line.replace('engine="0"', f'engine="{i}"') for i in range(1, 8))
    _send(h, 200, ("\n".join(lines) + "\n").encode())


def _gzipped_capture(h: _Handler, _: threading.Event) -> None:
    _send(h, 200, gzip.compress(CAPTURE), Content_Encoding="gzip")


def _dcgm(h: _Handler, _: threading.Event) -> None:
    _send(h, 200, DCGM_PAGE)


def _error_500(h: _Handler, _: threading.Event) -> None:
    _send(h, 500, b"Internal Server Error\n")


def _garbage(h: _Handler, _: threading.Event) -> None:
    _send(h, 200, b"<html><body>{{ login required </body></html>\n")


def _cut_mid_line(h: _Handler, _: threading.Event) -> None:
    # A well-formed HTTP answer whose body stops inside a sample line.
    cut = CAPTURE.index(b"vllm:num_requests_running{") + 30
    _send(h, 200, CAPTURE[:cut])


_CUT_AT_LINE = CAPTURE[: CAPTURE.index(b"\n", CAPTURE.index(b"vllm:prompt_tokens_total{")) + 1]
_SERVED: dict[str, int] = {}


def _whole_then_cut_at_a_line(h: _Handler, _: threading.Event) -> None:
    # The first answer is the whole page; later ones stop after a complete line (prompt_tokens): valid text.
    served = _SERVED.get(h.path, 0)
    _SERVED[h.path] = served + 1
    _send(h, 200, CAPTURE if served == 0 else _CUT_AT_LINE)


def _short_body(h: _Handler, _: threading.Event) -> None:
    # Promises more bytes than it sends, then closes: the peer died mid-answer.
    h.close_connection = True
    _send(h, 200, CAPTURE[: len(CAPTURE) // 2], content_length=str(len(CAPTURE)))


def _no_answer(h: _Handler, release: threading.Event) -> None:
    release.wait(10)


def _drip(h: _Handler, release: threading.Event) -> None:
    # Each byte comes well within the per-read timeout; the whole body never does.
    h.send_response(200)
    h.send_header("Content-Length", str(len(CAPTURE)))
    h.end_headers()
    for byte in CAPTURE:
        if release.wait(0.05):
            return
        h.wfile.write(bytes([byte]))
        h.wfile.flush()


def _huge_chunked(h: _Handler, release: threading.Event) -> None:
    # 50 MB with no Content-Length: only counting received bytes can stop it.
    h.send_response(200)
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    chunk = b"# padding line for a very large page\n" * 1700  # ~64 KB
    sent = 0
    while sent < 50_000_000 and not release.is_set():
        h.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        sent += len(chunk)
    h.wfile.write(b"0\r\n\r\n")


def _huge_declared(h: _Handler, _: threading.Event) -> None:
    h.close_connection = True
    _send(h, 200, CAPTURE, content_length="50000000")


def _gzip_bomb(h: _Handler, _: threading.Event) -> None:
    # ~40 KB on the wire, 20 MB once decoded.
    _send(h, 200, gzip.compress(b"# pad\n" * (20 * MIB // 6)), Content_Encoding="gzip")


ROUTES: dict[str, Route] = {
    "/metrics": _capture,
    "/gzip": _gzipped_capture,
    "/eight-engines": _eight_engines,
    "/dcgm": _dcgm,
    "/500": _error_500,
    "/garbage": _garbage,
    "/cut-mid-line": _cut_mid_line,
    "/whole-then-cut": _whole_then_cut_at_a_line,
    "/short-body": _short_body,
    "/no-answer": _no_answer,
    "/drip": _drip,
    "/huge-chunked": _huge_chunked,
    "/huge-declared": _huge_declared,
    "/gzip-bomb": _gzip_bomb,
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    release = threading.Event()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up on a huge or slow answer is the point of the test, not a failure


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        route = ROUTES.get(self.path)
        if route is None:
            _send(self, 404, b"not found\n")
            return
        try:
            route(self, self.server.release)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass(frozen=True)
class Peer:
    base_url: str


@pytest.fixture
def peer() -> Iterator[Peer]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.release = threading.Event()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Peer(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def scrape(url: str, **options: Any) -> dict[str, EngineSnapshot]:
    async def go() -> dict[str, EngineSnapshot]:
        async with httpx.AsyncClient() as client:
            return await EngineScraper(client, url, **options).scrape(T)

    return asyncio.run(go())


def scrape_error(url: str, **options: Any) -> ScrapeError:
    with pytest.raises(ScrapeError) as caught:
        scrape(url, **options)
    return caught.value


def read_dcgm(url: str) -> GpuSnapshot:
    async def go() -> GpuSnapshot:
        async with httpx.AsyncClient() as client:
            return await DcgmSource(client, url, timeout_s=SHORT_TIMEOUT_S).read(T)

    return asyncio.run(go())


def refused_url() -> str:
    """A port that was free a moment ago and has no listener now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


# ---------------------------------------------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------------------------------------------


def test_scrapes_the_real_capture(peer: Peer) -> None:
    snap = scrape(peer.base_url + "/metrics")["tiny"]
    assert snap.taken_at_s == T
    assert snap.spec is not None
    # Capture header: drafts=540 draft_tokens=1505 accepted=1415.
    assert (snap.spec.drafts, snap.spec.draft_tokens, snap.spec.accepted_tokens) == (540, 1505, 1415)


def test_a_large_data_parallel_page_is_parsed_off_the_event_loop_and_summed(peer: Peer) -> None:
    with httpx.Client() as client:
        size = len(client.get(peer.base_url + "/eight-engines").content)
    assert size > PARSE_IN_THREAD_CHARS  # the thread path is the one exercised
    snap = scrape(peer.base_url + "/eight-engines")["tiny"]
    assert snap.engines == 8
    assert snap.spec is not None
    # 8 engines x the capture's drafts=540 draft_tokens=1505 accepted=1415, per position 515/465/435.
    assert (snap.spec.drafts, snap.spec.draft_tokens, snap.spec.accepted_tokens) == (8 * 540, 8 * 1505, 8 * 1415)
    assert snap.spec.accepted_per_position == (8 * 515, 8 * 465, 8 * 435)


def test_gzip_encoded_page_is_decoded(peer: Peer) -> None:
    snap = scrape(peer.base_url + "/gzip")["tiny"]
    assert snap.spec is not None
    assert snap.spec.accepted_per_position == (515, 465, 435)


def test_http_500_is_http_status_with_the_code(peer: Peer) -> None:
    error = scrape_error(peer.base_url + "/500")
    assert error.reason is ScrapeErrorReason.HTTP_STATUS
    assert "500" in error.detail


def test_unknown_path_is_http_status_404(peer: Peer) -> None:
    error = scrape_error(peer.base_url + "/nope")
    assert error.reason is ScrapeErrorReason.HTTP_STATUS
    assert "404" in error.detail


def test_garbage_is_a_parse_error(peer: Peer) -> None:
    assert scrape_error(peer.base_url + "/garbage").reason is ScrapeErrorReason.PARSE


def test_body_cut_mid_line_is_a_parse_error(peer: Peer) -> None:
    assert scrape_error(peer.base_url + "/cut-mid-line").reason is ScrapeErrorReason.PARSE


def test_a_page_cut_at_a_line_boundary_after_a_whole_one_is_a_missing_family(peer: Peer) -> None:
    async def go() -> tuple[dict[str, EngineSnapshot], ScrapeError]:
        async with httpx.AsyncClient() as client:
            scraper = EngineScraper(client, f"{peer.base_url}/whole-then-cut")
            whole = await scraper.scrape(T)
            with pytest.raises(ScrapeError) as caught:
                await scraper.scrape(T + 5)
            return whole, caught.value

    _SERVED.clear()
    whole, error = asyncio.run(go())
    assert whole["tiny"].inter_token_latency is not None
    assert error.reason is ScrapeErrorReason.MISSING_FAMILY
    assert "inter_token_latency" in error.detail and "generation_tokens" in error.detail


def test_peer_closing_before_the_promised_length_is_a_protocol_error(peer: Peer) -> None:
    assert scrape_error(peer.base_url + "/short-body").reason is ScrapeErrorReason.PROTOCOL


def test_no_answer_is_a_timeout(peer: Peer) -> None:
    error = scrape_error(peer.base_url + "/no-answer", timeout_s=SHORT_TIMEOUT_S)
    assert error.reason is ScrapeErrorReason.TIMEOUT


def test_a_dripping_body_is_a_timeout_on_the_whole_exchange(peer: Peer) -> None:
    # One byte per 50 ms never trips the per-read timeout; the overall deadline stops it.
    error = scrape_error(peer.base_url + "/drip", timeout_s=SHORT_TIMEOUT_S)
    assert error.reason is ScrapeErrorReason.TIMEOUT


def test_a_50_mb_body_is_abandoned_at_the_default_limit(peer: Peer) -> None:
    assert scrape_error(peer.base_url + "/huge-chunked").reason is ScrapeErrorReason.BODY_TOO_LARGE


def test_a_declared_huge_length_is_refused_before_reading(peer: Peer) -> None:
    error = scrape_error(peer.base_url + "/huge-declared", max_body_bytes=1 * MIB)
    assert error.reason is ScrapeErrorReason.BODY_TOO_LARGE
    assert "50000000" in error.detail


def test_a_gzip_bomb_is_counted_after_decoding(peer: Peer) -> None:
    error = scrape_error(peer.base_url + "/gzip-bomb", max_body_bytes=1 * MIB)
    assert error.reason is ScrapeErrorReason.BODY_TOO_LARGE


def test_connection_refused_is_connect() -> None:
    assert scrape_error(refused_url()).reason is ScrapeErrorReason.CONNECT


# ---------------------------------------------------------------------------------------------------------------
# dcgm-exporter
# ---------------------------------------------------------------------------------------------------------------


def test_dcgm_source_reads_the_exporter_page(peer: Peer) -> None:
    snap = read_dcgm(peer.base_url + "/dcgm")
    assert snap.error is None
    assert (snap.source, snap.device_count, snap.activity_source) == ("dcgm", 2, "dcgm")
    assert snap.tensor_active_ratio == pytest.approx(0.400)  # (0.412 + 0.388) / 2


@pytest.mark.parametrize(("path", "reason"), [("/500", "http_status"), ("/no-answer", "timeout")])
def test_dcgm_failures_go_in_the_snapshot(peer: Peer, path: str, reason: str) -> None:
    snap = read_dcgm(peer.base_url + path)
    assert snap.source == "dcgm"
    assert snap.error is not None and snap.error.startswith(reason)
    assert snap.tensor_active_ratio is None


def test_dcgm_refused_goes_in_the_snapshot() -> None:
    snap = read_dcgm(refused_url())
    assert snap.error is not None and snap.error.startswith("connect")
