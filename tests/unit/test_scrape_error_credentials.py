"""Credentials in a target URL (http://user:pass@host) never reach a scrape error's text, which goes to the open
/v1/recommendation reason, /v1/evidence last_error and the logs."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from service.sources.errors import ScrapeError, ScrapeErrorReason, without_userinfo
from service.sources.page import fetch_text

URL = "http://scraper:hunter2@vllm.internal:8000/metrics"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"{URL}: HTTP 500 Internal Server Error", "http://vllm.internal:8000/metrics: HTTP 500 Internal Server Error"),
        ("https://tok@h/m and http://u:p%40ss@h2:1/x", "https://h/m and http://h2:1/x"),
        ("http://vllm.internal:8000/metrics: fine", "http://vllm.internal:8000/metrics: fine"),
        ("mail user@example.com is not a URL", "mail user@example.com is not a URL"),
    ],
)
def test_userinfo_is_dropped_from_every_url_in_a_text(text: str, shown: str) -> None:
    assert without_userinfo(text) == shown
    error = ScrapeError(ScrapeErrorReason.CONNECT, text)
    assert error.detail == shown and str(error) == f"connect: {shown}"


@pytest.mark.parametrize("failure", ["status", "connect"])
def test_a_failed_scrape_of_a_url_with_credentials_names_the_url_without_them(failure: str) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if failure == "connect":
            raise httpx.ConnectError(f"cannot connect to {request.url}", request=request)
        return httpx.Response(503, request=request)

    async def scrape() -> ScrapeError:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            with pytest.raises(ScrapeError) as caught:
                await fetch_text(client, URL, timeout_s=1.0, max_body_bytes=1024)
        return caught.value

    error = asyncio.run(scrape())
    assert "hunter2" not in str(error) and "scraper" not in str(error)
    assert "vllm.internal:8000/metrics" in error.detail
