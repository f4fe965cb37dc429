"""GET one Prometheus text page (an engine's `/metrics`, DCGM's exporter) with a whole-exchange deadline and a body
cap, mapping every transport failure to a `ScrapeError`."""

from __future__ import annotations

import asyncio

import httpx

from service.sources.errors import ScrapeError, ScrapeErrorReason


async def fetch_text(
    client: httpx.AsyncClient, url: str, *, timeout_s: float, max_body_bytes: int, auth: httpx.Auth | None = None
) -> str:
    """GET a Prometheus text page as str with `auth`'s credentials (None: none), mapping every transport failure
    to a `ScrapeError`."""
    try:
        async with asyncio.timeout(timeout_s):
            body = await _read_capped(client, url, timeout_s=timeout_s, max_body_bytes=max_body_bytes, auth=auth)
    except TimeoutError as exc:  # asyncio.timeout's overall deadline
        raise ScrapeError(ScrapeErrorReason.TIMEOUT, f"{url}: no complete answer within {timeout_s} s") from exc
    except httpx.TimeoutException as exc:
        raise ScrapeError(ScrapeErrorReason.TIMEOUT, f"{url}: {type(exc).__name__}") from exc
    except (httpx.ConnectError, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise ScrapeError(ScrapeErrorReason.CONNECT, f"{url}: {exc}") from exc
    except httpx.LocalProtocolError as exc:  # our own request was refused: its text may quote our headers
        raise ScrapeError(ScrapeErrorReason.PROTOCOL, f"{url}: the request could not be sent ({type(exc).__name__})"
                          ) from exc
    except httpx.HTTPError as exc:  # RemoteProtocolError, ReadError, DecodingError...: broke mid-answer
        raise ScrapeError(ScrapeErrorReason.PROTOCOL, f"{url}: {type(exc).__name__}: {exc}") from exc
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScrapeError(ScrapeErrorReason.PARSE, f"{url}: body is not UTF-8: {exc}") from exc


async def _read_capped(
    client: httpx.AsyncClient, url: str, *, timeout_s: float, max_body_bytes: int, auth: httpx.Auth | None
) -> bytes:
    # Plain text exposition: the parser does not read OpenMetrics.
    headers = {"Accept": "text/plain;version=0.0.4;q=1.0, */*;q=0.1"}
    # auth None: no credentials besides a URL's userinfo (httpx sends that as basic auth).
    async with client.stream("GET", url, headers=headers, timeout=timeout_s, auth=auth) as response:
        if not response.is_success:
            raise ScrapeError(
                ScrapeErrorReason.HTTP_STATUS, f"{url}: HTTP {response.status_code} {response.reason_phrase}"
            )
        return await read_capped(response, max_body_bytes=max_body_bytes, url=url)


async def read_capped(response: httpx.Response, *, max_body_bytes: int, url: str) -> bytes:
    """A streamed response's body, abandoned with BODY_TOO_LARGE once its declared Content-Length or the bytes read
    (after content decoding, so a gzip bomb is stopped too) pass `max_body_bytes`. `url` names it in the error."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_body_bytes:
        raise ScrapeError(ScrapeErrorReason.BODY_TOO_LARGE,
                          f"{url}: Content-Length {declared} > {max_body_bytes} bytes")
    chunks: list[bytes] = []
    received = 0
    async for chunk in response.aiter_bytes():
        received += len(chunk)
        if received > max_body_bytes:
            raise ScrapeError(ScrapeErrorReason.BODY_TOO_LARGE, f"{url}: body exceeds {max_body_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
