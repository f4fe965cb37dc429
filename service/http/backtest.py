"""POST /v1/backtest: `spec-advisor backtest` (service/backtest/) for a configured fleet-mode target, over HTTP.

The request names a target of the sidecar's settings (never a URL: the sidecar only queries the Prometheus its
operator configured) and a window; the answer is the CLI's JSON document (docs/backtest.md), iterations included
only when asked. A replay is CPU work, so it runs in a worker thread on its own event loop (the advisor loop and
the API keep answering), one at a time (409 while one runs), and at most `MAX_API_ITERATIONS` iterations.

Errors: 422 an unknown or pod-mode target, a window that is not one (end before start, not finite), or too many
iterations; 409 a backtest is already running; 502 no iteration got data from Prometheus (the detail says why).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from service.backtest.replay import Grid
from service.backtest.report import to_json
from service.backtest.run import BacktestError, BacktestResult, backtest_target, run_backtest
from service.http.bounded import bounded_route
from service.settings import Settings, TargetSettings

MAX_API_ITERATIONS = 20_000
"""The most iterations one API backtest runs (a day at a 5 s step; ~1-2 min of one core): longer ones belong to
the CLI, which is not sharing a process with a live advisor."""
MAX_BODY_BYTES = 4 * 1024


class BacktestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str = Field(description="A fleet-mode target of the sidecar's settings (it reads Prometheus).")
    start_s: float = Field(description="Start of the window, Unix seconds.")
    end_s: float = Field(description="End of the window, Unix seconds (>= start_s).")
    step_s: float | None = Field(
        default=None, gt=0, description="Seconds between iterations; default the settings' scrape_interval_s."
    )
    include_rows: bool = Field(
        default=False, description="Also return every iteration (decision, band, load, acceptance): large."
    )


class BacktestAnswer(BaseModel):
    """The CLI's JSON document (docs/backtest.md): the window, the summary, the changes and the would-be actions."""

    target: str = Field(description="The replayed target.")
    model: str = Field(description="Its vLLM model_name.")
    start_s: float = Field(description="First iteration, Unix seconds.")
    end_s: float = Field(description="End of the window, Unix seconds.")
    step_s: float = Field(description="Seconds between iterations.")
    summary: dict[str, Any] = Field(
        description="iterations, ok_share, on_share, mean_expected_speedup, changes, would_act, gate_skips, "
        "range_requests (docs/backtest.md)."
    )
    changes: list[dict[str, Any]] = Field(description="Each change of the ok recommendation: at_s, from_k, to_k.")
    would_act: list[dict[str, Any]] = Field(
        description="Each action the gate would have taken: at_s, running_k, wanted_k, gain, gain_low, gain_high, "
        "reason."
    )
    rows: list[dict[str, Any]] | None = Field(
        default=None, description="Every iteration when include_rows was asked, else null."
    )


def create_backtest_router(settings: Settings) -> APIRouter:
    """The router; `settings` names the targets a backtest may read."""
    router = APIRouter(route_class=bounded_route(MAX_BODY_BYTES, what="backtest"), tags=["backtest"])
    busy = asyncio.Lock()
    errors: dict[int | str, dict[str, Any]] = {409: {"description": "a backtest is already running"},
                                               422: {"description": "bad target or window"},
                                               502: {"description": "Prometheus gave no data"}}

    @router.post("/v1/backtest", response_model=BacktestAnswer, responses=errors,
                 summary="What the advisor would have recommended over a past window (docs/backtest.md)")
    async def backtest(request: BacktestRequest) -> BacktestAnswer:
        target, grid = _checked(settings, request)
        if busy.locked():
            raise HTTPException(409, "a backtest is already running: one at a time")
        async with busy:
            result = await asyncio.to_thread(asyncio.run, _replay(settings, target, grid))
        if all(row.error is not None for row in result.rows):
            errors_seen = sorted({row.error for row in result.rows if row.error})
            raise HTTPException(502, f"no iteration got data from Prometheus: {'; '.join(errors_seen)[:500]}")
        document = to_json(result)
        if not request.include_rows:
            document["rows"] = None
        return BacktestAnswer(**document)

    return router


def _checked(settings: Settings, request: BacktestRequest) -> tuple[TargetSettings, Grid]:
    try:
        target = backtest_target(settings, request.target)
        grid = Grid(start_s=request.start_s, end_s=request.end_s, step_s=request.step_s or settings.scrape_interval_s)
    except (BacktestError, ValueError) as exc:
        raise HTTPException(422, str(exc)) from exc
    if grid.points > MAX_API_ITERATIONS:
        raise HTTPException(422, f"{grid.points} iterations > {MAX_API_ITERATIONS}: use a coarser step_s or the "
                                 "spec-advisor backtest command")
    return target, grid


async def _replay(settings: Settings, target: TargetSettings, grid: Grid) -> BacktestResult:
    async with httpx.AsyncClient() as upstream:
        return await run_backtest(settings, target, grid, upstream=upstream)
