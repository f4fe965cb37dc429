"""The `spec-advisor backtest` command: what the advisor would have recommended over recorded history, and how
often its gate would have acted (service/backtest/). Run it before turning actuation on.

The target is a fleet-mode one: from `--config` (`--target NAME` when it has several), or from the flags
(`--prometheus URL --model M` and the profile flags). Times: Unix seconds, ISO 8601 (2026-12-05T10:00:00Z), or a
duration before now (-2h, -30m, -90s); `--to` defaults to now and `--step` to the settings' scrape interval.
The summary goes to stdout; `--json FILE` writes every iteration, `--plot FILE` a PNG of load, acceptance and the
choice over time.

Exit codes: 0 the replay ran (whatever it found); 1 Prometheus could not be read at all (no iteration got data);
2 bad usage (settings, times, a pod-mode target, a range too fine for `MAX_TICKS`, no matplotlib for --plot).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from service.backtest.replay import Grid
from service.backtest.report import PlotUnavailableError, plot_backtest, render_text, to_json
from service.backtest.run import BacktestError, BacktestResult, backtest_target, run_backtest
from service.settings import Settings, SettingsError, TargetSettings, load_settings

EXIT_UPSTREAM = 1
EXIT_USAGE = 2
_DURATION = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def add_backtest_command(commands: Any) -> None:
    backtest = commands.add_parser(
        "backtest", help="replay Prometheus history through the advisor: what it would have recommended and done",
    )
    backtest.add_argument("--config", type=Path, metavar="FILE", help="settings file holding the fleet-mode target")
    backtest.add_argument("--target", metavar="NAME", help="with --config: the target to replay")
    backtest.add_argument("--prometheus", metavar="URL", help="instead of --config: the Prometheus API base URL")
    backtest.add_argument("--model", help="with --prometheus: the vLLM model_name")
    backtest.add_argument("--selector", default="", help='with --prometheus: PromQL label matchers, e.g. job="vllm"')
    backtest.add_argument("--rate-window-s", type=float, default=60.0,
                          help="with --prometheus: the range of rate(), as fleet mode's rate_window_s (default 60)")
    backtest.add_argument("--hardware", default="h100-sxm", help="with --prometheus: the replicas' GPU profile")
    backtest.add_argument("--model-profile", help="with --prometheus: catalog name (default: the served name)")
    backtest.add_argument("--drafter", default="ngram", help="with --prometheus: the drafter method")
    backtest.add_argument("--tensor-parallel", type=int, default=1, help="with --prometheus: GPUs per replica")
    backtest.add_argument("--from", dest="start", required=True, metavar="TIME", help="start (module docstring)")
    backtest.add_argument("--to", dest="end", default="now", metavar="TIME", help="end (default now)")
    backtest.add_argument("--step", type=float, metavar="S", help="seconds between iterations (default: the "
                          "settings' scrape_interval_s)")
    backtest.add_argument("--json", type=Path, metavar="FILE", help="write every iteration as JSON")
    backtest.add_argument("--plot", type=Path, metavar="FILE", help="draw load, acceptance and the choice (PNG)")


def parse_time(text: str, *, now_s: float) -> float:
    """Unix seconds of `text`: a number (Unix seconds), "now", a duration before now ("-2h") or ISO 8601 (a time
    without a zone is UTC). Raises ValueError naming the accepted forms."""
    text = text.strip()
    match = _DURATION.match(text)
    if text == "now":
        return now_s
    if match:
        return now_s - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use Unix seconds, now, -2h/-30m/-90s or ISO 8601") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def _settings(args: argparse.Namespace) -> Settings:
    if args.config is not None:
        if args.prometheus is not None:
            raise BacktestError("give --config or --prometheus, not both")
        return load_settings(args.config)
    if args.prometheus is None or args.model is None:
        raise BacktestError("give --config FILE, or --prometheus URL and --model NAME")
    target: dict[str, Any] = {
        "name": "backtest", "prometheus_url": args.prometheus, "model": args.model, "selector": args.selector,
        "rate_window_s": args.rate_window_s,
        "hardware": args.hardware, "drafter": {"method": args.drafter}, "tensor_parallel": args.tensor_parallel,
    }
    if args.model_profile:
        target["model_profile"] = args.model_profile
    return load_settings(overrides={"targets": [target]})


def _progress(done: int, total: int) -> None:
    if done == total or done % max(1, total // 10) == 0:
        print(f"  {done}/{total} iterations", file=sys.stderr, flush=True)


def run_backtest_command(args: argparse.Namespace) -> int:
    """The command (module docstring)."""
    try:
        settings = _settings(args)
        target = backtest_target(settings, args.target)
        now_s = time.time()
        start, end = parse_time(args.start, now_s=now_s), parse_time(args.end, now_s=now_s)
        grid = Grid(start_s=start, end_s=end, step_s=args.step or settings.scrape_interval_s)
        if args.plot is not None:
            import importlib.util  # noqa: PLC0415

            if importlib.util.find_spec("matplotlib") is None:
                raise PlotUnavailableError("--plot needs matplotlib: pip install 'spec-advisor[plot]'")
        result = asyncio.run(_replay(settings, target, grid))
    except (SettingsError, BacktestError, ValueError, PlotUnavailableError) as exc:
        print(f"spec-advisor backtest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(render_text(result), end="")
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(result), indent=1) + "\n", encoding="utf-8")
    if args.plot is not None:
        plot_backtest(result, args.plot)
    if all(row.error is not None for row in result.rows):  # every iteration's queries failed
        errors = sorted({row.error for row in result.rows if row.error})
        print(f"spec-advisor backtest: no iteration got data from Prometheus: {'; '.join(errors)[:500]}",
              file=sys.stderr)
        return EXIT_UPSTREAM
    return 0


async def _replay(settings: Settings, target: TargetSettings, grid: Grid) -> BacktestResult:
    async with httpx.AsyncClient() as upstream:
        return await run_backtest(settings, target, grid, upstream=upstream, progress=_progress)
