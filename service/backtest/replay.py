"""Prometheus history served as the instant queries fleet mode asks, from one `query_range` per query.

Fleet mode (service/sources/prometheus.py) asks Prometheus `GET /api/v1/query?query=Q&time=t` for each of its
queries at each iteration's time t. A range query is, by Prometheus' definition, that same instant query evaluated
at start, start + step, ..., end: so replaying history at the grid times t_i = start + i x step needs one
`GET /api/v1/query_range?query=Q&start&end&step` per query (in chunks of at most `MAX_POINTS` points, the server's
per-series limit is 11 000), and each instant query at t_i is answered with the series that have a point at t_i,
as the live query at t_i would have been. The fleet source itself runs unchanged above this transport.

An upstream error (connection, timeout, an HTTP error answer) is passed through as it came, so the source reports
it with the same reasons as live; an instant query off the grid, or for a path other than /api/v1/query, is a 400
(a bug of the caller, not Prometheus' answer).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from service.sources.errors import ScrapeError
from service.sources.page import read_capped

QUERY_PATH = "/api/v1/query"
RANGE_PATH = "/api/v1/query_range"
MAX_POINTS = 10_000
"""Points per series fetched by one range query: below Prometheus' 11 000 (its `exceeded maximum resolution`)."""

# Grid times are compared to the millisecond the fleet source formats `time` with.
_GRID_TOLERANCE_S = 0.002
MIN_STEP_S = 0.01
"""The finest step a replay takes: five times the grid tolerance, so neighbouring grid times never blur."""
MAX_GRID_POINTS = 1e9
"""A grid is refused past this many points before anything counts them (a backtest's own cap is far lower)."""
MAX_RANGE_BODY_BYTES = 64 * 1024 * 1024
"""The largest range-query answer read (bytes): a chunk of 10 000 points for ~100 series is ~30 MB of JSON."""
MAX_REPLAY_POINTS = 20_000_000
"""The most (series x grid point) values one replay keeps in memory, over all its queries (~2 GB would be a
fleet of thousands of pods over a week): past it the replay stops with an error rather than exhausting memory."""


@dataclass(frozen=True, slots=True)
class Grid:
    """The replay's times: start_s, start_s + step_s, ..., up to end_s (Unix seconds, step_s > 0)."""

    start_s: float
    end_s: float
    step_s: float

    def __post_init__(self) -> None:
        finite = all(math.isfinite(v) for v in (self.start_s, self.end_s, self.step_s))
        if not finite or self.step_s < MIN_STEP_S or self.end_s < self.start_s:
            raise ValueError(f"a grid needs finite start <= end and a step of at least {MIN_STEP_S:g} s, got {self}")
        if not (self.end_s - self.start_s) / self.step_s < MAX_GRID_POINTS:
            raise ValueError(f"a grid of more than {MAX_GRID_POINTS:g} points: use a coarser step")

    @property
    def points(self) -> int:
        """start, start + step, ... up to end: the last point is kept when it lies within the grid tolerance of
        end (a step of 0.1 s does not divide a window exactly in binary floating point)."""
        return math.floor((self.end_s - self.start_s + _GRID_TOLERANCE_S) / self.step_s) + 1

    def time(self, index: int) -> float:
        return self.start_s + index * self.step_s

    def index(self, t: float) -> int | None:
        """The grid index of `t`, or None when `t` is not (within a few ms) a grid time."""
        i = round((t - self.start_s) / self.step_s)
        if 0 <= i < self.points and abs(self.time(i) - t) <= _GRID_TOLERANCE_S:
            return i
        return None


Series = tuple[dict[str, str], dict[int, str]]  # (labels, {grid index: value as Prometheus wrote it})


class RangeReplayTransport(httpx.AsyncBaseTransport):
    """Answers instant queries on `grid` from range queries to `prometheus_url` through `upstream` (module
    docstring). One instance per replay: it keeps every query's matrix (series x grid points)."""

    def __init__(
        self, upstream: httpx.AsyncClient, prometheus_url: str, grid: Grid, *, timeout_s: float,
        auth: httpx.Auth | None = None,
    ) -> None:
        self._upstream = upstream
        self._auth = auth
        self._base = prometheus_url.rstrip("/")
        self._query_path = httpx.URL(self._base).path.rstrip("/") + QUERY_PATH  # a base may carry a path prefix
        self._grid = grid
        self._timeout_s = timeout_s
        self._matrices: dict[str, list[Series]] = {}
        self._failed: dict[str, httpx.Response] = {}  # a query whose range fetch failed, with the answer it got
        self._kept_points = 0
        self.range_requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        query, time = params.get("query"), params.get("time")
        if request.url.path.rstrip("/") != self._query_path or not query:
            return _error(400, "bad_data", f"the replay answers {QUERY_PATH} only, not {request.url.path}")
        index = self._grid.index(float(time)) if time else None
        if index is None:
            return _error(400, "bad_data", f"time {time!r} is not on the replay's grid")
        failed = self._failed.get(query)
        if failed is not None:  # answered once for the whole window: every later iteration gets the same answer
            return httpx.Response(failed.status_code, content=failed.content, headers=failed.headers)
        if query not in self._matrices:
            failed = await self._fetch(query)
            if failed is not None:
                self._failed[query] = failed
                return httpx.Response(failed.status_code, content=failed.content, headers=failed.headers)
        return _vector(self._matrices[query], index, self._grid.time(index))

    async def _fetch(self, query: str) -> httpx.Response | None:
        """Range-query `query` over the grid in chunks into `_matrices`; the upstream's answer when one failed."""
        series: dict[str, Series] = {}
        first = 0
        while first < self._grid.points:
            last = min(first + MAX_POINTS, self._grid.points) - 1
            params = {"query": query, "start": f"{self._grid.time(first):.3f}", "end": f"{self._grid.time(last):.3f}",
                      "step": repr(self._grid.step_s)}
            status, body, headers = await self._get_capped(params)
            self.range_requests += 1  # answered ones: a fetch cancelled on its way (a sibling query failed) is not
            if not 200 <= status < 300:
                return httpx.Response(status, content=body, headers=headers)
            try:
                self._kept_points += _merge_matrix(series, json.loads(body), self._grid)
            except (ValueError, TypeError, AttributeError) as exc:  # not JSON, or not a matrix answer's shape
                raise httpx.DecodingError(f"a range query's answer is not a matrix: {exc}") from None
            if self._kept_points > MAX_REPLAY_POINTS:
                return _error(413, "too_large", f"the replay's history passed {MAX_REPLAY_POINTS} values: narrow the "
                                                "window or the selector, or use a coarser step")
            first = last + 1
        self._matrices[query] = list(series.values())
        return None

    async def _get_capped(self, params: Mapping[str, str]) -> tuple[int, bytes, httpx.Headers]:
        """(status, body, headers) of one range query, its body read up to `MAX_RANGE_BODY_BYTES`."""
        async with self._upstream.stream("GET", self._base + RANGE_PATH, params=params, timeout=self._timeout_s,
                                         auth=self._auth) as response:
            try:
                body = await read_capped(response, max_body_bytes=MAX_RANGE_BODY_BYTES, url=self._base + RANGE_PATH)
            except ScrapeError:
                return 413, _error(413, "too_large", f"a range query's answer passed {MAX_RANGE_BODY_BYTES} "
                                                     "bytes").content, httpx.Headers()
            return response.status_code, body, response.headers


def _merge_matrix(into: dict[str, Series], body: Any, grid: Grid) -> int:
    """Add a query_range answer's points to `into`, keyed by the series' labels; how many points were added."""
    if not isinstance(body, Mapping):
        raise httpx.DecodingError(f"a range query answered {str(body)[:200]}")
    added = 0
    data = body.get("data") or {}
    if body.get("status") != "success" or data.get("resultType") != "matrix":
        raise httpx.DecodingError(f"a range query answered {str(body)[:200]}")
    for item in data.get("result") or []:
        labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
        key = json.dumps(labels, sort_keys=True)
        _, points = into.setdefault(key, (labels, {}))
        for t, value in item.get("values") or []:
            i = grid.index(float(t))
            if i is not None:
                added += i not in points
                points[i] = str(value)
    return added


def _vector(matrix: list[Series], index: int, t: float) -> httpx.Response:
    result = [{"metric": labels, "value": [t, points[index]]} for labels, points in matrix if index in points]
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})


def _error(status: int, error_type: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"status": "error", "errorType": error_type, "error": message})
