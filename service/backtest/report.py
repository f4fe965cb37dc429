"""What a backtest found, for an operator: a summary, the recommendation's changes, the would-be actions, a JSON
document and a plot of load, acceptance and the choice over time.

Summary figures (over the replayed iterations; `ok` = the decision rested on fresh data):
    ok_share              ok iterations / all iterations
    on_share              of the ok iterations, the share that recommended speculation on
    mean_expected_speedup the mean of the recommendation's expected speedup over plain decoding, ok iterations
    changes               times the recommended setting (off, or k) changed between consecutive ok iterations
    would_act             the actions the gate would have taken (policies/act/replay.py), each with its expected
                          gain S(wanted) / S(running) and band
Example: 360 iterations, 350 ok, 300 of them on at k 3 and 50 off -> ok_share 0.97, on_share 0.86.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from service.backtest.run import BacktestResult, BacktestRow

INSTALL_HINT = "pip install 'spec-advisor[plot]' (or: pip install matplotlib)"


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def _setting(row: BacktestRow) -> int | None:
    """The recommended k (0 = off) of an ok iteration, None otherwise."""
    if row.state != "ok" or row.enabled is None:
        return None
    return (row.num_speculative_tokens or 0) if row.enabled else 0


def recommendation_changes(rows: Sequence[BacktestRow]) -> list[tuple[float, int | None, int]]:
    """(time, previous k or None at the first, new k) each time the ok recommendation changed (0 = off)."""
    changes: list[tuple[float, int | None, int]] = []
    previous: int | None = None
    for row in rows:
        k = _setting(row)
        if k is None or k == previous:
            continue
        changes.append((row.at_s, previous, k))
        previous = k
    return changes


def summary(result: BacktestResult) -> dict[str, Any]:
    """The module docstring's figures, as a JSON-ready mapping."""
    rows = result.rows
    ok = [row for row in rows if _setting(row) is not None]
    speedups = [row.expected_speedup for row in ok if row.expected_speedup is not None]
    return {
        "iterations": len(rows),
        "ok_share": len(ok) / len(rows) if rows else 0.0,
        "on_share": sum(1 for row in ok if _setting(row)) / len(ok) if ok else None,
        "mean_expected_speedup": sum(speedups) / len(speedups) if speedups else None,
        "changes": max(0, len(recommendation_changes(rows)) - 1),
        "would_act": len(result.gate.actions),
        "gate_skips": dict(sorted(result.gate.skips.items())),
        "range_requests": result.range_requests,
    }


def to_json(result: BacktestResult) -> dict[str, Any]:
    """The whole backtest: settings of the replay, the summary, the changes, the would-be actions and every row."""
    return {
        "target": result.target,
        "model": result.model,
        "start_s": result.grid.start_s,
        "end_s": result.grid.end_s,
        "step_s": result.grid.step_s,
        "summary": summary(result),
        "changes": [{"at_s": t, "from_k": a, "to_k": b} for t, a, b in recommendation_changes(result.rows)],
        "would_act": [asdict(action) for action in result.gate.actions],
        "rows": [asdict(row) for row in result.rows],
    }


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _k(k: int | None) -> str:
    return "-" if k is None else ("off" if k == 0 else f"k={k}")


def render_text(result: BacktestResult) -> str:
    """A few lines for the terminal: the summary, the changes and the would-be actions."""
    s = summary(result)
    speedup = s["mean_expected_speedup"]
    on = s["on_share"]
    lines = [
        f"backtest {result.target} ({result.model}) {_when(result.grid.start_s)} .. {_when(result.grid.end_s)}, "
        f"step {result.grid.step_s:g} s: {s['iterations']} iterations, {s['ok_share']:.0%} on fresh data",
        f"  recommended on in {on:.0%} of them" if on is not None else "  no recommendation rested on fresh data",
    ]
    if speedup is not None:
        lines.append(f"  mean expected speedup of the recommendation: {speedup:.2f}x over plain decoding")
    lines.append(f"  recommendation changes: {s['changes']}")
    for t, before, after in recommendation_changes(result.rows)[1:]:
        lines.append(f"    {_when(t)}  {_k(before)} -> {_k(after)}")
    lines.append(f"  the actuation gate would have acted {s['would_act']} times"
                 + (f" (held back: {_skips(s['gate_skips'])})" if s["gate_skips"] else ""))
    for action in result.gate.actions:
        gain = "" if action.gain is None else (
            f", expected gain {action.gain:.2f}x [{action.gain_low:.2f}..{action.gain_high:.2f}]")
        lines.append(f"    {_when(action.at_s)}  {_k(action.running_k)} -> {_k(action.wanted_k)}{gain}")
    return "\n".join(lines) + "\n"


def _skips(skips: dict[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in skips.items())


def plot_backtest(result: BacktestResult, path: Path) -> None:
    """Three panels over time: load (running and waiting requests), acceptance (mean accepted length per
    verification) and the choice (recommended k, 0 = off, beside what history ran), with the would-be actions
    marked. Writes a PNG. Raises PlotUnavailableError without matplotlib, OSError when the file cannot be written."""
    try:
        import matplotlib as mpl  # noqa: PLC0415  (optional extra: imported only when a plot is asked for)
    except ImportError as exc:
        raise PlotUnavailableError(f"--plot needs matplotlib: {INSTALL_HINT}") from exc
    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = result.rows
    minutes = [(row.at_s - result.grid.start_s) / 60.0 for row in rows]
    figure, (load, acceptance, choice) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    load.plot(minutes, [_nan(row.batch) for row in rows], label="running (per replica)")
    load.plot(minutes, [_nan(row.waiting) for row in rows], label="waiting")
    load.set_ylabel("requests")
    load.legend(loc="upper left")
    acceptance.plot(minutes, [_nan(row.mean_accepted_length) for row in rows], color="tab:green")
    acceptance.set_ylabel("accepted length")
    acceptance.ticklabel_format(axis="y", useOffset=False)
    choice.step(minutes, [_nan(_setting(row)) for row in rows], where="post", label="recommended k (0 = off)")
    choice.step(minutes, [_nan(row.deployed_k) for row in rows], where="post", linestyle="--", label="history ran")
    for action in result.gate.actions:
        choice.axvline((action.at_s - result.grid.start_s) / 60.0, color="tab:red", alpha=0.5)
    choice.set_ylabel("k")
    choice.yaxis.get_major_locator().set_params(integer=True)
    ks = [k for row in rows for k in (_setting(row), row.deployed_k) if k is not None]
    choice.set_ylim(-0.5, max(ks, default=1) + 0.5)
    choice.set_xlabel(f"minutes since {_when(result.grid.start_s)}")
    choice.legend(loc="upper left")
    figure.suptitle(f"backtest {result.target}: red lines = actions the gate would have taken")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)
