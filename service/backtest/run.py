"""Replay a fleet-mode target's Prometheus history through the advisor's own loop, one iteration per grid time.

The composition is the sidecar's (service/app.py `target_specs`, `advisor_loop`): the same fleet source, estimator,
model, decision and acceptance memory, stepped at t_i = start + i x step with `run_once(t_i)`, its Prometheus
answers served from range queries (service/backtest/replay.py). Each iteration's published decision and evidence
become one `BacktestRow`; the actuation gate is then replayed over them (policies/act/replay.py). Nothing is
written anywhere: actuation is off and the acceptance memory lives in memory, whatever the settings say.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx

from policies.act.replay import GateReplay, ReplayTick, replay_gate
from service.backtest.replay import Grid, RangeReplayTransport
from service.board import Board, BoardEntry
from service.settings import ActuationSettings, Settings, TargetSettings
from service.sources.gpu import NoGpuSource

MAX_TICKS = 100_000
"""The most iterations one backtest runs (a week at a 7 s step); a longer range needs a coarser step."""


class BacktestError(ValueError):
    """A backtest that cannot run as asked (not a fleet-mode target, a grid too fine...); the message says why."""


@dataclass(frozen=True, slots=True)
class BacktestRow:
    """One replayed iteration: the decision published at `at_s` (None before the first) and what it rested on.
    Speedups are relative to plain decoding; `mean_accepted_length` is tokens per verification at the deployed k."""

    at_s: float
    state: str | None
    enabled: bool | None
    num_speculative_tokens: int | None
    expected_speedup: float | None
    expected_speedup_low: float | None
    expected_speedup_high: float | None
    summary: str
    batch: float | None
    waiting: float | None
    deployed_k: int | None
    mean_accepted_length: float | None
    generation_tokens_per_s: float | None
    error: str | None


@dataclass(frozen=True, slots=True)
class BacktestResult:
    target: str
    model: str
    grid: Grid
    rows: tuple[BacktestRow, ...]
    gate: GateReplay
    range_requests: int


def backtest_target(settings: Settings, name: str | None) -> TargetSettings:
    """The fleet-mode target named `name` (or the only target); BacktestError when there is none such."""
    targets = [t for t in settings.targets if name is None or t.name == name]
    if len(targets) != 1:
        names = ", ".join(t.name for t in settings.targets)
        raise BacktestError(f"name one target to backtest (--target): the settings have {names}")
    target = targets[0]
    if target.prometheus_url is None:
        raise BacktestError(f"target {target.name} scrapes a pod: a backtest reads history from Prometheus, so it "
                            "needs a fleet-mode target (prometheus_url and model)")
    return target


async def run_backtest(
    settings: Settings,
    target: TargetSettings,
    grid: Grid,
    *,
    upstream: httpx.AsyncClient,
    progress: Callable[[int, int], None] | None = None,
) -> BacktestResult:
    """Replay `target` over `grid` (module docstring). `upstream` reaches Prometheus; `progress(done, total)` is
    called after each iteration. Raises BacktestError for a grid over `MAX_TICKS` points."""
    if grid.points > MAX_TICKS:
        raise BacktestError(f"{grid.points} iterations > {MAX_TICKS}: use a coarser step")
    # Imported here: the composition root also builds the API, whose POST /v1/backtest runs this function.
    from service.app import advisor_loop, target_auth, target_specs  # noqa: PLC0415

    assert target.prometheus_url is not None  # backtest_target checked it
    replay_settings = settings.model_copy(update={
        "targets": [target], "actuation": ActuationSettings(),
        "scrape_interval_s": grid.step_s, "scrape_timeout_s": min(settings.scrape_timeout_s, grid.step_s),
    })
    # The range queries carry the target's credentials, as its live queries do.
    transport = RangeReplayTransport(upstream, target.prometheus_url, grid, timeout_s=settings.scrape_timeout_s * 4,
                                     auth=target_auth(target))
    board = Board([(target.name, target.model)], started_at_s=grid.start_s)
    rows: list[BacktestRow] = []
    ticks: list[ReplayTick] = []
    async with httpx.AsyncClient(transport=transport) as client:
        loop = advisor_loop(replay_settings, target_specs(replay_settings, client), board=board, gpu=NoGpuSource())
        for i in range(grid.points):
            t = grid.time(i)
            await loop.run_once(t)
            entry = board.get(target.name)
            row = _row(entry, t)
            rows.append(row)
            ticks.append(ReplayTick(
                at_s=t, decision=entry.decision if entry is not None else None,
                evidence_state=entry.evidence.state if entry is not None and entry.evidence is not None else None,
                deployed_k=row.deployed_k,
            ))
            if progress is not None:
                progress(i + 1, grid.points)
    gate = replay_gate(ticks, config=settings.actuation.gate.to_config(dry_run=True))
    return BacktestResult(target=target.name, model=target.model or "", grid=grid, rows=tuple(rows), gate=gate,
                          range_requests=transport.range_requests)


def _row(entry: BoardEntry | None, t: float) -> BacktestRow:
    decision = entry.decision if entry is not None else None
    evidence = entry.evidence if entry is not None else None
    acceptance = evidence.acceptance if evidence is not None else None
    return BacktestRow(
        at_s=t,
        state=decision.state.value if decision is not None else None,
        enabled=decision.enabled if decision is not None else None,
        num_speculative_tokens=decision.num_speculative_tokens if decision is not None else None,
        expected_speedup=decision.expected_speedup if decision is not None else None,
        expected_speedup_low=decision.expected_speedup_low if decision is not None else None,
        expected_speedup_high=decision.expected_speedup_high if decision is not None else None,
        summary=(decision.summary or decision.reason) if decision is not None else "",
        batch=evidence.batch if evidence is not None else None,
        waiting=evidence.waiting if evidence is not None else None,
        deployed_k=_deployed_k(entry),
        mean_accepted_length=acceptance.mean_acceptance_length if acceptance is not None else None,
        generation_tokens_per_s=evidence.generation_tokens_per_s if evidence is not None else None,
        error=entry.last_error if entry is not None else None,
    )


def _deployed_k(entry: BoardEntry | None) -> int | None:
    """The k history ran (0 = off) as this iteration's fresh evidence says; None when this iteration's queries
    failed (the evidence kept on the board then describes an earlier time, or nothing at all)."""
    if entry is None or entry.evidence is None or entry.last_error is not None:
        return None
    return entry.evidence.deployed_k if entry.evidence.speculation_on else 0

