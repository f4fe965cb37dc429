"""Families an engine served on its last good page and not on this one: the sign of a page cut at a line boundary.

The text format has no end marker, so a body cut after a complete line parses cleanly: the families after the cut
are simply absent. vLLM registers every family it serves when the engine starts (the labelled children exist from
then on, at zero), so between two pages of the same engine the set of families never shrinks. It changes only
across a restart, which every counter's `_created` epoch shows (`EngineSnapshot.created_s`) and which resets the
counters. So, for each model on the page:

    same engine  = the epochs agree, |created_s - created_s'| <= SAME_EPOCH_S, where both pages carry one;
                   else (an exporter without `_created`) no cumulative count present on both pages went down
    vanished     = fields present on the last good page and absent now
    refuse       = same engine and vanished is not empty, unless the page has the same families as the
                   ACCEPT_AFTER_PAGES - 1 pages refused before it (the engine's new shape: a cut lands on another
                   line as the counters grow; an exporter without `_created` whose idle counters cannot show a
                   restart must not be refused for ever)

Why a tolerance on the epoch: `created_s` is the earliest `_created` of the families read, so a cut that removes
the earliest-registered family moves it. vLLM registers its families within a millisecond of each other (the
0.32 capture: 0.1 ms over 50 `vllm:` families); a restart moves every one by the process's start-up time, seconds
at least (a model load). Why the epoch alone where there is one: on a data-parallel page a cut between two engines'
lines of one counter family lowers that family's sum, which is not a restart.

Example: a page with the ITL histogram and generation tokens, then one cut after `vllm:prompt_tokens_total` of the
same epoch -> refused, naming `generation_tokens, inter_token_latency, ...`. After a restart that turned
speculation off the epoch moves and the page without spec-decode families is read as "speculation off".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from policies.types import EngineSnapshot, HistogramReading

SAME_EPOCH_S = 1.0
ACCEPT_AFTER_PAGES = 3

# The optional fields of a snapshot, each one family (or a group read together) of the page.
TRACKED_FIELDS: tuple[str, ...] = (
    "spec",
    "kv_cache_usage_ratio",
    "kv_cache_capacity_tokens",
    "generation_tokens",
    "prompt_tokens",
    "inter_token_latency",
    "iteration_tokens",
    "request_itl",
    "single_token_requests",
    "estimated_flops",
    "estimated_read_bytes",
)


def present_fields(snapshot: EngineSnapshot) -> frozenset[str]:
    """The tracked fields `snapshot` carries (not None)."""
    return frozenset(name for name in TRACKED_FIELDS if getattr(snapshot, name) is not None)


def _cumulative(snapshot: EngineSnapshot) -> dict[str, float]:
    """Every cumulative count on the snapshot, by name (counters and histogram counts)."""
    out: dict[str, float] = {}
    for name in ("generation_tokens", "prompt_tokens", "estimated_flops", "estimated_read_bytes"):
        value = getattr(snapshot, name)
        if value is not None:
            out[name] = float(value)
    for name in ("inter_token_latency", "iteration_tokens", "request_itl"):
        histogram: HistogramReading | None = getattr(snapshot, name)
        if histogram is not None:
            out[name] = histogram.count
    if snapshot.spec is not None:
        out["spec_drafts"] = snapshot.spec.drafts
    return out


def same_engine(previous: EngineSnapshot, current: EngineSnapshot) -> bool:
    """Whether two pages of one model come from the same engine run (module docstring)."""
    epochs = (previous.created_s, current.created_s)
    if epochs[0] is not None and epochs[1] is not None:
        return abs(epochs[1] - epochs[0]) <= SAME_EPOCH_S
    before, now = _cumulative(previous), _cumulative(current)
    return all(now[name] >= before[name] for name in before.keys() & now.keys())


def vanished_fields(previous: EngineSnapshot | None, current: EngineSnapshot) -> tuple[str, ...]:
    """Tracked fields the same engine served on `previous` and not on `current`, sorted; () when none, when there
    is no previous page, or when the engine restarted in between."""
    if previous is None or not same_engine(previous, current):
        return ()
    return tuple(sorted(present_fields(previous) - present_fields(current)))


class CutDetector:
    """Per scrape target: the last good page of each model and the refusals since (module docstring)."""

    def __init__(self) -> None:
        self._last_good: dict[str, EngineSnapshot] = {}
        self._refused: deque[tuple[str, tuple[str, ...]]] = deque(maxlen=ACCEPT_AFTER_PAGES)

    def check(self, page: Mapping[str, EngineSnapshot]) -> tuple[str, tuple[str, ...]] | None:
        """(model, vanished fields) when `page` is to be refused as cut, else None (and `page` becomes the last
        good one)."""
        cut = first_cut(self._last_good, page)
        if cut is not None:
            self._refused.append(cut)
            if len(self._refused) < ACCEPT_AFTER_PAGES or any(r != cut for r in self._refused):
                return cut
        self._refused.clear()
        self._last_good = dict(page)
        return None


def first_cut(
    last_good: Mapping[str, EngineSnapshot], page: Mapping[str, EngineSnapshot]
) -> tuple[str, tuple[str, ...]] | None:
    """(model, vanished fields) of the first model on `page` (by name) whose page lost families, or None."""
    for model in sorted(page):
        vanished = vanished_fields(last_good.get(model), page[model])
        if vanished:
            return model, vanished
    return None
