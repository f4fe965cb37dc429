"""The API server's connection bounds over real sockets: the sidecar served by `_start_api` (the path `serve` and
`demo` take) on 127.0.0.1, probed with raw TCP connections and httpx.

Every wait below is bounded by DEADLINE_S so a regression fails instead of hanging; no assertion is on elapsed
time. A connection the server keeps open past DEADLINE_S fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from service.app import build_sidecar
from service.cli.command import _start_api
from service.settings import load_settings
from service.sources.gpu import NoGpuSource

DEADLINE_S = 10.0
SHORT_READ_TIMEOUT_S = 0.5
CLOSED = "specadvisor_api_connections_closed_total"

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Api:
    """The served API's base URL, and the raw connections a test opened to it (closed before the server stops, so
    a connection the server failed to close cannot hold up its shutdown)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.streams: list[Stream] = []

    async def connect(self) -> Stream:
        parts = urlsplit(self.url)
        assert parts.hostname is not None and parts.port is not None
        stream = await asyncio.open_connection(parts.hostname, parts.port)
        self.streams.append(stream)
        return stream


@contextlib.asynccontextmanager
async def api(**overrides: Any) -> AsyncIterator[Api]:
    """The sidecar's API on 127.0.0.1 with an ephemeral port and `overrides` applied to its settings; its target
    refuses connections (the API answers regardless)."""
    settings = load_settings(
        overrides={
            "targets": [{"name": "a", "url": "http://127.0.0.1:9/metrics"}],
            "host": "127.0.0.1",
            "port": 0,
            "gpu": {"telemetry": "none"},
            **overrides,
        }
    )
    server, task, url = await _start_api(build_sidecar(settings, gpu_source=NoGpuSource()))
    assert url is not None, "uvicorn did not start"
    served = Api(url)
    try:
        yield served
    finally:
        for stream in served.streams:
            await close(stream)
        server.should_exit = True
        await asyncio.wait_for(task, timeout=DEADLINE_S)


async def close(stream: Stream) -> None:
    _, writer = stream
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection; AssertionError if it is still open after
    DEADLINE_S."""
    try:
        return await asyncio.wait_for(reader.read(), timeout=DEADLINE_S)
    except ConnectionResetError:
        return b""
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open for {DEADLINE_S:g} s") from None


async def drip_until_closed(stream: Stream, head: bytes, drip: bytes) -> bytes:
    """Send `head`, then one byte of `drip` (cycled) every 50 ms until the server closes the connection; what the
    server sent. AssertionError if it is still open after DEADLINE_S."""
    reader, writer = stream
    closed = asyncio.create_task(read_until_closed(reader))
    writer.write(head)
    sent = 0
    with contextlib.suppress(ConnectionError):
        while not closed.done():
            writer.write(drip[sent % len(drip) : sent % len(drip) + 1])
            await writer.drain()
            sent += 1
            await asyncio.sleep(0.05)
    return await closed


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a content-length: its status and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=DEADLINE_S)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in header_lines if line)
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout=DEADLINE_S)
    return int(status_line.split(" ")[1]), body


def closed_counts(metrics_text: str) -> dict[str, float]:
    """specadvisor_api_connections_closed_total by reason, from a /metrics page."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == CLOSED:
                counts[sample.labels["reason"]] = sample.value
    return counts


async def scrape_closed_counts(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    return closed_counts(response.text)


def test_connections_that_send_nothing_are_closed_after_the_read_timeout() -> None:
    async def scenario() -> None:
        async with api(api_request_read_timeout_s=SHORT_READ_TIMEOUT_S) as served:
            url = served.url
            silent = [await served.connect() for _ in range(5)]
            received = await asyncio.gather(*(read_until_closed(reader) for reader, _ in silent))
            assert received == [b""] * 5  # closed without an answer: no request came
            for stream in silent:
                await close(stream)
            assert await scrape_closed_counts(url) == {"read_timeout": 5, "over_limit": 0}

    asyncio.run(scenario())


def test_a_client_dripping_a_request_head_is_closed() -> None:
    async def scenario() -> None:
        async with api(api_request_read_timeout_s=SHORT_READ_TIMEOUT_S) as served:
            url = served.url
            stream = await served.connect()
            received = await drip_until_closed(stream, b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ", b"abcdefgh")
            assert received == b""
            await close(stream)
            assert (await scrape_closed_counts(url))["read_timeout"] == 1

    asyncio.run(scenario())


def test_a_client_dripping_a_request_body_is_closed() -> None:
    async def scenario() -> None:
        async with api(api_request_read_timeout_s=SHORT_READ_TIMEOUT_S) as served:
            url = served.url
            stream = await served.connect()
            head = (
                b"POST /v1/whatif HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
            )
            received = await drip_until_closed(stream, head, b"{}")
            assert received == b""  # the route was still reading the body
            await close(stream)
            assert (await scrape_closed_counts(url))["read_timeout"] == 1

    asyncio.run(scenario())


def test_the_next_request_on_a_kept_alive_connection_is_timed_from_its_first_byte() -> None:
    async def scenario() -> None:
        async with api(api_request_read_timeout_s=SHORT_READ_TIMEOUT_S) as served:
            url = served.url
            stream = await served.connect()
            reader, writer = stream
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await read_response(reader))[0] == 200
            await asyncio.sleep(3 * SHORT_READ_TIMEOUT_S)  # idle between requests: not timed by the guard
            received = await drip_until_closed(stream, b"GET /healthz HTTP/1.1\r\n", b"X-Slow: abc\r\n")
            assert received == b""
            await close(stream)
            assert (await scrape_closed_counts(url))["read_timeout"] == 1

    asyncio.run(scenario())


def test_whole_requests_and_kept_alive_connections_still_work() -> None:
    async def scenario() -> None:
        async with api(api_request_read_timeout_s=SHORT_READ_TIMEOUT_S) as served:
            url = served.url
            async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
                assert (await client.get("/healthz")).status_code == 200
            stream = await served.connect()
            reader, writer = stream
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await read_response(reader))[0] == 200
            # Idle for longer than the read timeout: the keep-alive timeout (75 s) governs an idle connection.
            await asyncio.sleep(3 * SHORT_READ_TIMEOUT_S)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            status, body = await read_response(reader)
            assert status == 200
            assert closed_counts(body.decode()) == {"read_timeout": 0, "over_limit": 0}
            # The appended family leaves the rest of the page as it was.
            assert b"specadvisor_build_info" in body
            await close(stream)

    asyncio.run(scenario())


async def healthz_on_a_fresh_connection(url: str) -> int | None:
    """/healthz's status on a new connection, or None when the server closed the connection without answering."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
            return (await client.get("/healthz")).status_code
    except httpx.TransportError:
        return None


def test_connections_over_the_cap_are_closed_at_once_and_the_api_answers_after() -> None:
    async def scenario() -> None:
        # A read timeout far above DEADLINE_S: the connections closed here are closed by the cap, not by it.
        async with api(api_max_connections=3, api_request_read_timeout_s=300) as served:
            url = served.url
            held = [await served.connect() for _ in range(3)]
            extra = [await served.connect() for _ in range(2)]
            received = await asyncio.gather(*(read_until_closed(reader) for reader, _ in extra))
            assert received == [b"", b""]
            assert await healthz_on_a_fresh_connection(url) is None  # refused as well while the 3 are open
            refused = 3
            for stream in held:
                await close(stream)
            loop = asyncio.get_running_loop()
            give_up = loop.time() + DEADLINE_S
            while (status := await healthz_on_a_fresh_connection(url)) is None:
                refused += 1  # the server had not yet seen the held ones close
                assert loop.time() < give_up, "the API never answered again after the held connections closed"
                await asyncio.sleep(0.05)
            assert status == 200
            for stream in extra:
                await close(stream)
            assert await scrape_closed_counts(url) == {"read_timeout": 0, "over_limit": refused}

    asyncio.run(scenario())


def test_at_the_cap_an_idle_kept_alive_connection_makes_room_for_a_probe() -> None:
    async def scenario() -> None:
        async with api(api_max_connections=3, api_request_read_timeout_s=300) as served:
            # Three clients each send one whole request, then keep their connections open and idle.
            idle = [await served.connect() for _ in range(3)]
            for reader, writer in idle:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
                await writer.drain()
                status, _ = await read_response(reader)
                assert status == 200
            # A probe still gets in: one idle connection is closed to make room, not the probe's.
            assert await healthz_on_a_fresh_connection(served.url) == 200
            closed = await asyncio.gather(*(asyncio.wait_for(reader.read(1), DEADLINE_S)
                                            for reader, _ in idle), return_exceptions=True)
            assert sum(1 for c in closed if c == b"") >= 1
            for stream in idle:
                await close(stream)

    asyncio.run(scenario())
