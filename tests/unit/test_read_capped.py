"""The one body-capping reader every HTTP source uses (service/sources/page.py `read_capped`): by the declared
Content-Length, and by the bytes actually read when none is declared (or it lies)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.page import read_capped
from service.sources.prometheus import FleetSelection, PrometheusFleetSource


def read(response: httpx.Response, limit: int) -> bytes:
    async def go() -> bytes:
        async with httpx.AsyncClient(transport=httpx.MockTransport(lambda _: response)) as client, \
                client.stream("GET", "http://peer/metrics") as streamed:
            return await read_capped(streamed, max_body_bytes=limit, url="http://peer/metrics")

    return asyncio.run(go())


async def chunks(n: int, size: int) -> AsyncIterator[bytes]:
    for _ in range(n):
        yield b"x" * size


def test_a_body_within_the_cap_is_read_whole() -> None:
    assert read(httpx.Response(200, content=b"a 1\n"), 4) == b"a 1\n"


def test_a_declared_length_past_the_cap_is_refused_before_reading() -> None:
    with pytest.raises(ScrapeError) as caught:
        read(httpx.Response(200, content=b"y" * 100), 50)
    assert caught.value.reason is ScrapeErrorReason.BODY_TOO_LARGE and "Content-Length 100 > 50" in caught.value.detail


def test_an_undeclared_stream_past_the_cap_is_abandoned() -> None:
    with pytest.raises(ScrapeError) as caught:
        read(httpx.Response(200, content=chunks(10, 16)), 100)
    assert caught.value.reason is ScrapeErrorReason.BODY_TOO_LARGE and "exceeds 100" in caught.value.detail


def test_a_fleet_source_refuses_a_prometheus_answer_past_its_cap() -> None:
    async def go() -> None:
        transport = httpx.MockTransport(lambda _: httpx.Response(200, content=b'{"status": "success"' + b" " * 500))
        async with httpx.AsyncClient(transport=transport) as client:
            source = PrometheusFleetSource(client, "http://prometheus:9090", FleetSelection(model="m", selector="",
                                           rate_window_s=60.0), timeout_s=2.0, max_body_bytes=100)
            await source.scrape(1.0)

    with pytest.raises(ScrapeError) as caught:
        asyncio.run(go())
    assert caught.value.reason is ScrapeErrorReason.BODY_TOO_LARGE
