"""A live terminal view of the Board for the demo: plain ANSI escapes, redrawn about once a second.

`render` is a pure function of the statuses (tested without a terminal); `run_view` only redraws it.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Callable, Sequence
from typing import TextIO

from policies.types import DataState, Decision, Evidence
from service.board import Board, BoardEntry

_CLEAR = "\x1b[H\x1b[2J"
_BAR_WIDTH = 30
_BAR_MAX_SPEEDUP = 3.0  # bars are scaled to 3x: typical speculative speedups sit well inside
_SCREEN = 120  # columns the screen fits
_WIDTH = _SCREEN - 4  # indented lines wrap here


def _paint(text: str, code: str, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color else text


def render(statuses: Sequence[BoardEntry], *, now_s: float, header: Sequence[str], color: bool = True) -> str:
    """The whole screen as text: `header` lines (wrapped to 120 columns), then one block per target."""
    wrapped = [textwrap.wrap(line, width=_SCREEN, subsequent_indent="  ") or [""] for line in header]
    title = [_paint(line, "1", color) for line in wrapped[0]] if wrapped else [""]
    lines = [*title, *(part for parts in wrapped[1:] for part in parts), ""]
    for status in statuses:
        lines.extend(_target_block(status, now_s=now_s, color=color))
        lines.append("")
    return "\n".join(lines)


def _target_block(status: BoardEntry, *, now_s: float, color: bool) -> list[str]:
    lines = [_paint(f"target {status.target}  model {status.model or '?'}", "1;36", color)]
    evidence, decision = status.evidence, status.decision
    if evidence is None or decision is None:
        lines.append(f"  waiting for the first scrape{': ' + status.last_error if status.last_error else ''}")
        return lines
    lines.extend(_evidence_lines(evidence, status, now_s=now_s))
    lines.extend(_curve_lines(decision, color=color))
    lines.extend(_decision_lines(decision, color=color))
    if decision.changed_at_s is not None:
        lines.append(f"  recommendation unchanged for {max(0.0, now_s - decision.changed_at_s):.0f} s")
    return lines


def _evidence_lines(evidence: Evidence, status: BoardEntry, *, now_s: float) -> list[str]:
    step = f"{evidence.step_time_s * 1000:.1f} ms" if evidence.step_time_s is not None else "?"
    deployed = f"on, k={evidence.deployed_k}" if evidence.speculation_on else "off"
    age = "never" if status.last_good_scrape_s is None else f"{now_s - status.last_good_scrape_s:.0f} s ago"
    lines = [
        f"  load, mean over the last {evidence.window_s:.0f} s: {evidence.batch:.1f} running, "
        f"{evidence.waiting:.1f} waiting; step {step}",
        f"  deployed: speculation {deployed}   last good scrape {age}",
    ]
    acceptance = evidence.acceptance
    if acceptance is not None:
        positions = "  ".join(
            f"#{i + 1} {value:.2f} [{low:.2f}..{high:.2f}]"
            for i, (value, low, high) in enumerate(
                zip(acceptance.per_position, acceptance.per_position_low, acceptance.per_position_high, strict=True)
            )
        )
        lines.append(
            f"  acceptance: E[L] {acceptance.mean_acceptance_length:.2f} tokens per verification over "
            f"{acceptance.drafts:.0f} drafts; per position [95% interval]:"
        )
        lines.extend(textwrap.wrap(positions, width=_WIDTH, initial_indent="    ", subsequent_indent="    "))
    elif evidence.speculation_on:
        why = f" ({' '.join(evidence.reason.split())})" if evidence.reason else ""
        lines.append(f"  acceptance: not measured yet{why}")
    else:
        lines.append("  acceptance: not measured while speculation is off (priced from a remembered profile, if any, "
                     "else the drafter's prior)")
    return lines


def _curve_lines(decision: Decision, *, color: bool) -> list[str]:
    if not decision.curve:
        return ["  predicted speedup: no curve (evidence not usable yet)"]
    lines = ["  predicted speedup per gamma (point [low..high]):"]
    chosen = decision.num_speculative_tokens if decision.enabled else 0
    for point in decision.curve:
        filled = max(0, min(_BAR_WIDTH, round(point.speedup / _BAR_MAX_SPEEDUP * _BAR_WIDTH)))
        bar = "#" * filled + "." * (_BAR_WIDTH - filled)
        bar = _paint(bar, "32" if point.speedup >= 1.0 else "31", color)
        mark = " <" if point.gamma == chosen else ""
        extra = " (extrapolated)" if point.extrapolated else ""
        lines.append(
            f"    gamma {point.gamma:>2}  {bar} {point.speedup:5.2f} "
            f"[{point.speedup_low:.2f}..{point.speedup_high:.2f}]{extra}{mark}"
        )
    return lines


def _decision_lines(decision: Decision, *, color: bool) -> list[str]:
    """The verdict, its band and state, and the reason one clause per line. A decision that is not ok is shown as
    what it is: the deployment (nothing published yet) or the last good recommendation kept, not a new one."""
    setting = (
        f"speculation ON, num_speculative_tokens={decision.num_speculative_tokens}" if decision.enabled
        else "speculation OFF"
    )
    low, high = decision.expected_speedup_low, decision.expected_speedup_high
    band = f"expected {decision.expected_speedup:.2f}x [{low:.2f}..{high:.2f}]   "
    state = decision.state.value
    if decision.state is DataState.OK:
        verdict = _paint(f"RECOMMEND: {setting}", "1;32" if decision.enabled else "1;33", color)
    else:
        state = _paint(state, "1;31", color)
        if decision.changed_at_s is None:
            verdict, band = _paint(f"NO RECOMMENDATION YET (deployed: {setting})", "1;33", color), ""
        else:
            verdict = _paint(f"KEEPING the last recommendation: {setting}", "1;33", color)
    # The sentence, not the arithmetic: the full reason is the API's (`reason`, with `why` its numbers).
    summary = decision.summary or decision.reason
    return [f"  {verdict}   {band}state {state}", *textwrap.wrap(summary, width=_WIDTH, initial_indent="  ",
                                                                        subsequent_indent="    ")]


async def run_view(
    board: Board,
    *,
    clock: Callable[[], float],
    header: Callable[[], Sequence[str]],
    stream: TextIO,
    interval_s: float = 1.0,
    color: bool = True,
) -> None:
    """Redraw the screen every `interval_s` until cancelled."""
    while True:
        stream.write(_CLEAR + render(board.statuses(), now_s=clock(), header=header(), color=color))
        stream.flush()
        await asyncio.sleep(interval_s)
