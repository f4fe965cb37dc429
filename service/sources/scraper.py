"""GET one inference server's `/metrics` page and read it with its engine's adapter (service/sources/engines.py)."""

from __future__ import annotations

import asyncio

import httpx

from policies.types import EngineSnapshot
from service.sources import continuity
from service.sources.engines import EngineKind, PageReader
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.page import fetch_text

# A single-engine vLLM page is ~50 KB and parses in ~1.5 ms: cheaper inline than a thread hand-off.
PARSE_IN_THREAD_CHARS = 128 * 1024


class EngineScraper:
    """GETs one engine's `/metrics` URL and parses it. The HTTP client is injected (one pool per process).

    `engine` is the adapter to read the page with, or `EngineKind.AUTO` to tell it from the page's metric names.
    `timeout_s` bounds the whole exchange, not only each socket read: a server that drips bytes cannot hold the
    loop. The body is streamed and abandoned past `max_body_bytes` (counted after content decoding, so a gzip bomb
    is stopped too).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        *,
        timeout_s: float = 5.0,
        max_body_bytes: int = 8 * 1024 * 1024,
        auth: httpx.Auth | None = None,
        engine: EngineKind = EngineKind.AUTO,
    ) -> None:
        self._client = client
        self._auth = auth
        self._url = url
        self._timeout_s = timeout_s
        self._max_body_bytes = max_body_bytes
        self._reader = PageReader(engine)
        # A later page of the same engine that lost families was cut at a line boundary.
        self._cuts = continuity.CutDetector()

    async def scrape(self, now_s: float) -> dict[str, EngineSnapshot]:
        """One GET + parse; `now_s` becomes `taken_at_s` of every snapshot. Raises `ScrapeError` only: besides the
        adapters' reasons, MISSING_FAMILY when the same engine served families on its last good page that this
        page lacks (a body cut at a line boundary: service/sources/continuity.py)."""
        body = await fetch_text(self._client, self._url, timeout_s=self._timeout_s, max_body_bytes=self._max_body_bytes,
                                auth=self._auth)
        if len(body) < PARSE_IN_THREAD_CHARS:
            snapshots = self._reader.read(body, taken_at_s=now_s)
        else:
            # A data-parallel server's page (4-8 engines: 150-280 KB) takes 10-20 ms to parse; in a worker thread
            # the interpreter still switches to the API's requests every few ms instead of stalling them.
            snapshots = await asyncio.to_thread(self._reader.read, body, taken_at_s=now_s)
        cut = self._cuts.check(snapshots)
        if cut is not None:
            model, vanished = cut
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY,
                f"model {model!r}: {', '.join(vanished)} were on the engine's last page and are gone from this one "
                "with no restart (a page cut at a line boundary?)",
            )
        return snapshots
