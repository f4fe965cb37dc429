"""A closed-loop load generator for an OpenAI-compatible completions server (vLLM's `/v1/completions`).

`concurrency` clients each send their next request as soon as the previous one returns, cycling through a fixed
list of prompts with greedy decoding, until `duration_s` has passed. What it measures is what the server gave
back: completed requests, the completion tokens it reports (`usage.completion_tokens`), and failed requests.

Rules (each one a choice a measurement depends on):
- No new request starts after the deadline; requests in flight at the deadline are awaited and counted, each
  bounded by `request_timeout_s`. `duration_s` of the result is the wall time including that drain, so
  `tokens_per_s` is what the level really delivered.
- A failed request is counted, never raised: an HTTP status >= 400, a body without `usage.completion_tokens`, a
  timeout, or a transport error (connection refused/reset, protocol error) that repeats on one immediate retry.
  The retry exists because a server's keep-alive connection can close just as a client reuses it (vLLM's uvicorn
  closes idle ones after 5 s); a timed-out request is not retried (that would double its bound).
- After a failure a client waits `FAILURE_BACKOFF_S` before its next request, so a dead port is not hammered in
  a hot loop that steals the CPU the server under test needs.
- The level stops early when every request that finished over the last `DEAD_AFTER_S` failed (a failure streak
  with no success in it, spanning that long): the server died. Requests still in flight are then cancelled
  and not counted; the result says `stopped_early`.
- `on_progress(fraction_done)` is called about once per `PROGRESS_INTERVAL_S` with the elapsed share of
  `duration_s` (0..1), and once more at the end (1.0 after a full level).

Pure asyncio + httpx; the caller owns the `httpx.AsyncClient` (its connection limits must allow `concurrency`
connections, e.g. `httpx.Limits(max_connections=None)` or at least `concurrency`). `clock` is injectable
(seconds, monotonic) so tests can run a level in simulated time.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import httpx

MIN_CONCURRENCY = 1
MAX_CONCURRENCY = 512
MIN_DURATION_S = 1.0
MAX_DURATION_S = 3600.0
MIN_MAX_TOKENS = 1
MAX_MAX_TOKENS = 4096

DEFAULT_REQUEST_TIMEOUT_S = 120.0
"""Per-request bound (s), retry included. 120 s covers 4096 tokens at ~35 tokens/s per sequence."""
PROGRESS_INTERVAL_S = 1.0
"""Seconds between two `on_progress` calls."""
DEAD_AFTER_S = 5.0
"""A failure streak with no success spanning this long (s) stops the level: the server is taken for dead."""
FAILURE_BACKOFF_S = 0.1
"""Seconds a client waits after a failed request before its next one."""


@dataclass(frozen=True, slots=True)
class LevelResult:
    """What one closed-loop level delivered.

    `concurrency`: clients, each sending its next request when the previous one returns. `duration_s`: wall time
    the level ran (s), from the first request to the last one awaited. `requests`: completed requests.
    `completion_tokens`: tokens generated (the server's `usage.completion_tokens`, summed). `errors`: failed
    requests (HTTP status >= 400, an unusable body, a timeout, or a transport error after one retry).
    `stopped_early`: the level ended before its duration because every request of the last `DEAD_AFTER_S`
    failed.
    """

    concurrency: int
    duration_s: float
    requests: int
    completion_tokens: int
    errors: int
    stopped_early: bool = False

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens per second of wall time (tokens/s); 0 for a level that took no time."""
        return self.completion_tokens / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """One closed-loop level's load: `concurrency` clients (1..512) post `/v1/completions` with `model`, the next
    prompt of `prompts` (cycled, in order, across all clients), `max_tokens` (1..4096 tokens) and `temperature`
    (0 = greedy), each sending its next request when the previous one returns, until `duration_s` (1..3600 s) has
    passed; each request is bounded by `request_timeout_s` (s). Raises ValueError on a value out of range."""

    model: str
    concurrency: int
    duration_s: float
    max_tokens: int
    prompts: Sequence[str]
    temperature: float = 0.0
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S

    def __post_init__(self) -> None:
        _check_count("concurrency", self.concurrency, MIN_CONCURRENCY, MAX_CONCURRENCY, unit="clients")
        if not (math.isfinite(self.duration_s) and MIN_DURATION_S <= self.duration_s <= MAX_DURATION_S):
            raise ValueError(f"duration_s must be {MIN_DURATION_S:g}..{MAX_DURATION_S:g} s, got {self.duration_s}")
        _check_count("max_tokens", self.max_tokens, MIN_MAX_TOKENS, MAX_MAX_TOKENS, unit="tokens")
        prompts = self.prompts
        if isinstance(prompts, str) or len(prompts) == 0 or not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompts must be a non-empty sequence of strings")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (math.isfinite(self.request_timeout_s) and self.request_timeout_s > 0):
            raise ValueError(f"request_timeout_s must be a finite number > 0 s, got {self.request_timeout_s}")


def _check_count(name: str, value: int, low: int, high: int, *, unit: str) -> None:
    """ValueError unless `value` is an integer (not a bool) in low..high."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be {low}..{high} {unit}, got {value}")


class _Tally:
    """Counts shared by the clients of one level, and the dead-server rule (times from the level's clock, s)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.requests = 0
        self.completion_tokens = 0
        self.errors = 0
        self._streak_started_s: float | None = None
        self.dead = asyncio.Event()

    def success(self, tokens: int) -> None:
        self.requests += 1
        self.completion_tokens += tokens
        self._streak_started_s = None

    def failure(self) -> None:
        self.errors += 1
        now = self._clock()
        if self._streak_started_s is None:
            self._streak_started_s = now
        elif now - self._streak_started_s >= DEAD_AFTER_S:
            self.dead.set()


def _completion_tokens(response: httpx.Response) -> int | None:
    """`usage.completion_tokens` of a successful answer; None for an error status or an unusable body."""
    if response.status_code >= 400:
        return None
    try:
        tokens = response.json()["usage"]["completion_tokens"]
    except (ValueError, KeyError, TypeError):
        return None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        return None
    return tokens


async def _post_with_retry(client: httpx.AsyncClient, url: str, body: dict[str, object], timeout_s: float) -> int:
    """One completion: its tokens, or -1 when it failed. A transport error (not a timeout) is retried once."""
    try:
        async with asyncio.timeout(timeout_s):
            try:
                response = await client.post(url, json=body, timeout=timeout_s)
            except httpx.TimeoutException:
                return -1
            except httpx.TransportError:
                response = await client.post(url, json=body, timeout=timeout_s)
    except (httpx.HTTPError, TimeoutError):
        return -1
    tokens = _completion_tokens(response)
    return -1 if tokens is None else tokens


async def run_closed_loop(
    client: httpx.AsyncClient,
    base_url: str,
    load: ClosedLoop,
    *,
    on_progress: Callable[[float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> LevelResult:
    """Run one closed-loop level of `load` against `base_url` (e.g. "http://127.0.0.1:8000") and return what it
    delivered.

    Requests in flight at the deadline are awaited, each bounded by `load.request_timeout_s` (s). See the module
    docstring for failures, the early stop on a dead server and progress. Never raises on a failed request.

    Example: 2 clients for 10 s against a server answering every request in 0.6 s with 64 tokens: each client
    starts requests at 0, 0.6, ..., 9.6 s (17 of them; the one started at 9.6 s is in flight at the deadline and
    awaited), so 34 requests, 34 x 64 = 2176 tokens, `duration_s` 10.2 and 2176 / 10.2 = 213 tokens/s.
    """
    concurrency, duration_s = load.concurrency, load.duration_s
    url = base_url.rstrip("/") + "/v1/completions"
    prompt_order: Iterator[str] = itertools.cycle(list(load.prompts))
    tally = _Tally(clock)
    start_s = clock()
    deadline_s = start_s + duration_s

    async def client_loop() -> None:
        while clock() < deadline_s and not tally.dead.is_set():
            body: dict[str, object] = {
                "model": load.model, "prompt": next(prompt_order), "max_tokens": load.max_tokens,
                "temperature": load.temperature,
            }  # fmt: skip
            tokens = await _post_with_retry(client, url, body, load.request_timeout_s)
            if tokens >= 0:
                tally.success(tokens)
            else:
                tally.failure()
                if not tally.dead.is_set():
                    await asyncio.sleep(FAILURE_BACKOFF_S)

    def fraction_done() -> float:
        return min(1.0, max(0.0, (clock() - start_s) / duration_s))

    clients: list[asyncio.Task[object]] = [
        asyncio.create_task(client_loop(), name=f"loadgen-client-{i}") for i in range(concurrency)
    ]
    dead: asyncio.Task[object] = asyncio.create_task(tally.dead.wait(), name="loadgen-dead")
    pending: set[asyncio.Task[object]] = set(clients)
    last_progress_s = time.monotonic()
    try:
        while pending and not tally.dead.is_set():
            wait_s = max(0.0, PROGRESS_INTERVAL_S - (time.monotonic() - last_progress_s))
            _, pending = await asyncio.wait(pending | {dead}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(dead)
            if time.monotonic() - last_progress_s >= PROGRESS_INTERVAL_S:
                last_progress_s = time.monotonic()
                if on_progress is not None:
                    on_progress(fraction_done())
    finally:
        for task in (*pending, dead):
            task.cancel()
        await asyncio.gather(*clients, dead, return_exceptions=True)
    for task in clients:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error  # a bug in this module, not a failed request (those are counted)
    if on_progress is not None:
        on_progress(fraction_done())
    return LevelResult(
        concurrency=concurrency,
        duration_s=clock() - start_s,
        requests=tally.requests,
        completion_tokens=tally.completion_tokens,
        errors=tally.errors,
        stopped_early=tally.dead.is_set(),
    )
