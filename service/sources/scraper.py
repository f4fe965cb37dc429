"""GET one inference server's `/metrics` page and read it with its engine's adapter (service/sources/engines.py)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import httpx

from policies.types import EngineSnapshot
from service.sources import continuity
from service.sources.engines import EngineKind, parse_engine_page
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.page import fetch_text
from service.sources.sglang import K_NOT_SHOWN

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
        self._engine = engine
        # A later page of the same engine that lost families was cut at a line boundary.
        self._cuts = continuity.CutDetector()
        # Per model of a totals-only engine (SGLang): the k its pages last showed (adaptive tiers hide it at a tier
        # of 0 draft steps), and the running total of draft tokens with the verify steps it counts up to.
        self._shown_k: dict[str, int] = {}
        self._draft_totals: dict[str, tuple[float, float]] = {}

    async def scrape(self, now_s: float) -> dict[str, EngineSnapshot]:
        """One GET + parse; `now_s` becomes `taken_at_s` of every snapshot. Raises `ScrapeError` only: besides the
        adapters' reasons, MISSING_FAMILY when the same engine served families on its last good page that this
        page lacks (a body cut at a line boundary: service/sources/continuity.py)."""
        body = await fetch_text(self._client, self._url, timeout_s=self._timeout_s, max_body_bytes=self._max_body_bytes,
                                auth=self._auth)
        if len(body) < PARSE_IN_THREAD_CHARS:
            snapshots = parse_engine_page(body, taken_at_s=now_s, engine=self._engine)
        else:
            # A data-parallel server's page (4-8 engines: 150-280 KB) takes 10-20 ms to parse; in a worker thread
            # the interpreter still switches to the API's requests every few ms instead of stalling them.
            snapshots = await asyncio.to_thread(parse_engine_page, body, taken_at_s=now_s, engine=self._engine)
        snapshots = {model: self._with_k(snapshot) for model, snapshot in snapshots.items()}
        cut = self._cuts.check(snapshots)
        if cut is not None:
            model, vanished = cut
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY,
                f"model {model!r}: {', '.join(vanished)} were on the engine's last page and are gone from this one "
                "with no restart (a page cut at a line boundary?)",
            )
        return snapshots

    def _with_k(self, snapshot: EngineSnapshot) -> EngineSnapshot:
        """A totals-only snapshot (SGLang) with the k its page did not show taken from the model's last page that
        did (sglang.py `K_NOT_SHOWN`; MISSING_FAMILY when none has), and its draft tokens as a running total: each
        page adds its new verify steps x its own draft tokens per verify step, so adaptive tiers never lower it (a
        restart, verify steps going down, starts the total again from the page).
        Example: 100 verify steps at k 3 (300), then 150 at a tier of k 1 -> 300 + 50 x 1 = 350, not 150."""
        spec = snapshot.spec
        if spec is None or spec.positions_measured:
            return snapshot
        model = snapshot.model_name
        if spec.declared_k != K_NOT_SHOWN:
            self._shown_k[model] = spec.declared_k
        k = self._shown_k.get(model)
        if k is None:
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY,
                f"model {model!r}: SGLang's adaptive speculation is at a tier of 0 draft steps and no page has "
                "shown its k yet (sglang:spec_num_steps)",
            )
        per_verify = spec.draft_tokens / spec.drafts if spec.drafts > 0 and spec.draft_tokens > 0 else float(k)
        counted, total = self._draft_totals.get(model, (math.inf, 0.0))
        total = spec.draft_tokens if spec.drafts < counted else total + (spec.drafts - counted) * per_verify
        self._draft_totals[model] = (spec.drafts, total)
        return replace(snapshot, spec=replace(spec, declared_k=k, draft_tokens=total))
