"""The e2e tests' independent view of vLLM's speculative-decoding numbers: the product's parser is checked against it.

Two oracles, deliberately written without the product's code:
- `read_raw_spec` reads vLLM's `vllm:spec_decode_*` counter lines from a `/metrics` body with plain string handling.
- `parse_spec_log` reads the `SpecDecoding metrics: ...` lines vLLM logs, and `aggregate_log` turns the lines of a
  window into exact totals (accepted and drafted token counts are logged as integers) and tight integer bounds
  (drafts and per-position counts, which vLLM only logs as rounded ratios).

What vLLM 0.32 logs (vllm/v1/spec_decode/metrics.py, `SpecDecodingLogging.log`): every VLLM_LOG_STATS_INTERVAL
seconds the API server sums the scheduler's per-step stats since its previous log line and then resets them, so
consecutive lines cover disjoint intervals and lines add up. Per line:
  Mean acceptance length = 1 + accepted / drafts                  printed with %.2f
  Accepted, Drafted      = accepted and draft tokens               printed with %d (exact)
  Per-position rate[i]   = accepted_per_pos[i] / drafts            printed with %.3f
drafts itself is not printed; it is recovered from the rounded mean length (and bounded by
draft_tokens / k <= drafts <= draft_tokens, since a draft counts only when it proposed at least one token).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_COUNTER_PREFIX = "vllm:spec_decode_num_"
_LOG_LINE = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: (?P<mean>[0-9.]+), .*?"
    r"Accepted: (?P<accepted>\d+) tokens, Drafted: (?P<drafted>\d+) tokens, "
    r"Per-position acceptance rate: (?P<rates>[0-9., ]+?), Avg Draft acceptance rate"
)
# Half a unit in the last printed digit, plus slack for binary floating point at the rounding boundary.
_MEAN_HALF_ULP = 0.005 + 1e-9
_RATE_HALF_ULP = 0.0005 + 1e-9


@dataclass(frozen=True, slots=True)
class RawSpec:
    """vLLM's spec-decode counters at one instant, summed over engines."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...]

    def minus(self, earlier: RawSpec) -> RawSpec:
        return RawSpec(
            drafts=self.drafts - earlier.drafts,
            draft_tokens=self.draft_tokens - earlier.draft_tokens,
            accepted=self.accepted - earlier.accepted,
            per_position=tuple(a - b for a, b in zip(self.per_position, earlier.per_position, strict=True)),
        )


def read_raw_spec(metrics_text: str) -> RawSpec:
    """Sum the `vllm:spec_decode_num_*_total` samples of a /metrics body (any engines, one model)."""
    totals: dict[str, float] = {}
    per_position: dict[int, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith(_COUNTER_PREFIX):
            continue
        series, _, value_text = line.rpartition(" ")
        name, _, labels = series.partition("{")
        value = float(value_text)
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            position = int(labels.split('position="', 1)[1].split('"', 1)[0])
            per_position[position] = per_position.get(position, 0.0) + value
        elif name.endswith("_total"):
            totals[name] = totals.get(name, 0.0) + value
    if not per_position:
        raise AssertionError("no vllm:spec_decode_num_accepted_tokens_per_pos_total series: is speculation on?")
    return RawSpec(
        drafts=totals["vllm:spec_decode_num_drafts_total"],
        draft_tokens=totals["vllm:spec_decode_num_draft_tokens_total"],
        accepted=totals["vllm:spec_decode_num_accepted_tokens_total"],
        per_position=tuple(per_position[i] for i in range(len(per_position))),
    )


def read_raw_steps(metrics_text: str) -> tuple[float, float]:
    """(ITL observations, engine steps) of a /metrics body, summed over engines: the counts of
    `vllm:inter_token_latency_seconds` (one per running sequence per step) and `vllm:iteration_tokens_total` (one
    per step). Their deltas over a span give the sequences each step decoded."""
    itl = steps = 0.0
    for line in metrics_text.splitlines():
        series, _, value_text = line.rpartition(" ")
        name = series.partition("{")[0]
        if name == "vllm:inter_token_latency_seconds_count":
            itl += float(value_text)
        elif name == "vllm:iteration_tokens_total_count":
            steps += float(value_text)
    return itl, steps


@dataclass(frozen=True, slots=True)
class LoggedInterval:
    """One `SpecDecoding metrics` log line, as printed."""

    mean_acceptance_length: float
    accepted: int
    drafted: int
    per_position_rates: tuple[float, ...]


def parse_spec_log(log_text: str) -> list[LoggedInterval]:
    lines: list[LoggedInterval] = []
    for match in _LOG_LINE.finditer(log_text):
        lines.append(
            LoggedInterval(
                mean_acceptance_length=float(match["mean"]),
                accepted=int(match["accepted"]),
                drafted=int(match["drafted"]),
                per_position_rates=tuple(float(part) for part in match["rates"].split(",")),
            )
        )
    return lines


@dataclass(frozen=True, slots=True)
class Bounds:
    """A closed integer interval [lo, hi] a count must lie in."""

    lo: float
    hi: float

    def __contains__(self, value: float) -> bool:
        return self.lo <= value <= self.hi

    def __add__(self, other: Bounds) -> Bounds:
        return Bounds(self.lo + other.lo, self.hi + other.hi)


@dataclass(frozen=True, slots=True)
class LogAggregate:
    """A window's log lines added up: exact token totals, bounded drafts and per-position counts."""

    lines: int
    accepted: int
    drafted: int
    drafts: Bounds
    per_position: tuple[Bounds, ...]

    def mean_acceptance_length(self) -> Bounds:
        # 1 + accepted / drafts is decreasing in drafts: the high bound comes from the fewest drafts.
        return Bounds(1.0 + self.accepted / self.drafts.hi, 1.0 + self.accepted / self.drafts.lo)

    def position_rate(self, index: int) -> Bounds:
        count = self.per_position[index]
        return Bounds(count.lo / self.drafts.hi, count.hi / self.drafts.lo)


def aggregate_log(lines: list[LoggedInterval], *, k: int) -> LogAggregate:
    """Add up the log lines of one window. Each bound is the set of integer counts that print as the line did."""
    if not lines:
        raise AssertionError("no SpecDecoding metrics lines in the window")
    drafts = Bounds(0.0, 0.0)
    per_position = [Bounds(0.0, 0.0) for _ in range(k)]
    for line in lines:
        if len(line.per_position_rates) != k:
            raise AssertionError(f"log line has {len(line.per_position_rates)} positions, expected {k}: {line}")
        line_drafts = _line_drafts(line, k=k)
        drafts = drafts + line_drafts
        for i, rate in enumerate(line.per_position_rates):
            low = max(0.0, rate - _RATE_HALF_ULP) * line_drafts.lo
            high = min(1.0, rate + _RATE_HALF_ULP) * line_drafts.hi
            per_position[i] = per_position[i] + Bounds(
                float(math.ceil(low - 1e-9)), float(min(math.floor(high + 1e-9), line.accepted))
            )
    return LogAggregate(
        lines=len(lines),
        accepted=sum(line.accepted for line in lines),
        drafted=sum(line.drafted for line in lines),
        drafts=drafts,
        per_position=tuple(per_position),
    )


def _line_drafts(line: LoggedInterval, *, k: int) -> Bounds:
    # Every draft proposed 1..k tokens, so drafted/k <= drafts <= drafted.
    lo = math.ceil(line.drafted / k - 1e-9)
    hi = float(line.drafted)
    if line.accepted > 0:
        # mean = 1 + accepted/drafts was rounded to 2 decimals: invert both ends of its rounding interval.
        excess_high = line.mean_acceptance_length + _MEAN_HALF_ULP - 1.0
        excess_low = line.mean_acceptance_length - _MEAN_HALF_ULP - 1.0
        lo = max(lo, math.ceil(line.accepted / excess_high - 1e-9))
        if excess_low > 0:
            hi = min(hi, float(math.floor(line.accepted / excess_low + 1e-9)))
    return Bounds(float(lo), hi)
