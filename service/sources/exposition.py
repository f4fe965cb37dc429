"""Reading Prometheus text exposition, shared by every engine adapter: choose the sample lines of the families an
adapter reads, parse only those with prometheus_client's parser, and validate each value where it is read.

Every failure is a `ScrapeError`: PARSE for text the parser rejects, INVALID_VALUE for a number that cannot be
the count or ratio it claims to be (NaN, Inf, negative, past `MAX_COUNT` or the caller's limit, a fractional
histogram count, a histogram whose buckets are not cumulative or disagree with its count), TOO_MANY_SERIES past
`MAX_SAMPLE_LINES` lines of the families read.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from policies.types import HistogramReading
from service.sources.errors import ScrapeError, ScrapeErrorReason

# What prometheus_client's parser raises on malformed input (it has no exception type of its own).
# OverflowError: an integer literal past 2**1024 (the library keeps integer text as int, and float() of it overflows).
PARSER_ERRORS = (ValueError, IndexError, KeyError, TypeError, AttributeError, OverflowError)
# On a page with none of our lines, validate this much of it to tell garbage (PARSE) from another server's metrics.
_SNIFF_CHARS = 64 * 1024

MAX_COUNT = 1e18
"""The largest value accepted for a counter, a histogram's sum, count or bucket, or a timestamp: 1e18 tokens is
a million tokens a second for 30 000 years. Past it a number is a broken exporter or an attack, and sums and rates
of such numbers overflow to infinity downstream."""

MAX_SAMPLE_LINES = 20_000
"""The most sample lines of the families read accepted on one page. One vLLM engine serves 71 + k of them (k=3:
75, tests/fixtures/vllm/vllm-0.32.0-cpu-ngram-k3-idle.txt), so 20 000 lines hold 128 data-parallel engines at any
k up to 64 (128 x 135 = 17 280). prometheus_client's parser costs ~18 us a line on a 2-core box: the cap bounds one
parse at ~0.4 s of interpreter time, checked before the parser runs."""

# Two counts the engine increments together, read from one page, agree exactly; they are integers, so a real
# disagreement is at least 1. 0.5 absorbs float formatting of integers (an exporter printing "1.415e+03"), and the
# relative part covers float sums of huge counters.
SUM_ABS_TOLERANCE = 0.5
SUM_REL_TOLERANCE = 1e-9


def select_lines(text: str, wanted: frozenset[str], *, engine: str) -> list[str]:
    """The sample lines of `text` whose metric name is in `wanted`, in page order (comment lines dropped).
    Raises TOO_MANY_SERIES past `MAX_SAMPLE_LINES`. Example: "# HELP a x\\na 1\\nb 2\\n", wanted {"a"} -> ["a 1"]."""
    kept: list[str] = []
    for line in text.split("\n"):
        name = line.partition("{")[0].split(None, 1)
        if name and name[0] in wanted:
            kept.append(line)
            check_line_cap(len(kept), engine=engine, name=name[0])
    return kept


def check_line_cap(kept: int, *, engine: str, name: str) -> None:
    """Raise TOO_MANY_SERIES once more than `MAX_SAMPLE_LINES` lines of the families read were kept (`name`: the
    last one's metric name)."""
    if kept > MAX_SAMPLE_LINES:
        raise ScrapeError(
            ScrapeErrorReason.TOO_MANY_SERIES,
            f"more than MAX_SAMPLE_LINES ({MAX_SAMPLE_LINES}) series of the {engine} families read (last: {name}); "
            "a real engine serves ~75 per engine",
        )


def parse_lines(lines: list[str]) -> list[Sample]:
    """The samples of `lines` (whole sample lines, no comments). Raises PARSE on a line the parser rejects."""
    try:
        return [s for family in text_string_to_metric_families("\n".join(lines) + "\n") for s in family.samples]
    except PARSER_ERRORS as exc:
        raise ScrapeError(ScrapeErrorReason.PARSE, f"malformed metric line: {exc}") from exc


def raise_unless_prometheus_text(text: str) -> None:
    """Raise PARSE unless the page's first `_SNIFF_CHARS` (whole lines) are valid Prometheus text."""
    head = text[:_SNIFF_CHARS]
    if len(text) > _SNIFF_CHARS:
        head = head[: head.rfind("\n") + 1]
    try:
        for _ in text_string_to_metric_families(head):
            pass
    except PARSER_ERRORS as exc:
        raise ScrapeError(ScrapeErrorReason.PARSE, f"not Prometheus text: {exc}") from exc


def index_samples(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    """Samples by name; INVALID_VALUE for a series given twice (summing over engines would count it twice)."""
    index: dict[str, list[Sample]] = defaultdict(list)
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for s in samples:
        key = (s.name, frozenset(s.labels.items()))
        if key in seen:
            raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"duplicate series {s.name}{s.labels}")
        seen.add(key)
        index[s.name].append(s)
    return index


def checked(sample: Sample, limit: float = MAX_COUNT) -> float:
    """The sample's value when it is a number in [0, `limit`]; INVALID_VALUE otherwise."""
    try:
        value = float(sample.value)
    except OverflowError:  # an integer literal past 2**1024
        value = math.inf
    if not (math.isfinite(value) and 0 <= value <= limit):
        raise ScrapeError(
            ScrapeErrorReason.INVALID_VALUE,
            f"{sample.name}{sample.labels} = {value:g}" + (f" (over {limit:g})" if value > limit else ""),
        )
    return value


def with_tolerance(value: float) -> float:
    """`value` plus the slack two exactly-agreeing counts may differ by on a page (SUM_*_TOLERANCE)."""
    return value * (1.0 + SUM_REL_TOLERANCE) + SUM_ABS_TOLERANCE


def observations(base: str, count: float, *, total: float) -> float:
    """A histogram's `_count` as the whole number of observations it is (float formatting of an integer is
    tolerated: 1.415e+03 is 1415). Raises INVALID_VALUE for a fraction of an observation, or a sum with none: a
    `_count` of 5e-324 under a positive `_sum` would make the mean step time infinite.
    Example: 1415.0000001 -> 1415.0; 0.5 -> invalid; 5e-324 with _sum 12.0 -> invalid."""
    whole = float(round(count))
    if not math.isclose(count, whole, rel_tol=SUM_REL_TOLERANCE, abs_tol=SUM_ABS_TOLERANCE / 1000.0):
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"histogram {base}: _count {count!r} is not a whole number")
    if whole == 0.0 and total > 0.0:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"histogram {base}: _sum {total:g} with no observations")
    return whole


def le_bound(sample: Sample) -> float:
    """A bucket's `le` label as a number; INVALID_VALUE when it is not one."""
    label = sample.labels.get("le", "")
    try:
        bound = float(label)
    except ValueError:
        bound = math.nan
    if math.isnan(bound):
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"{sample.name} has le={label!r}")
    return bound


def histogram_reading(
    base: str, sums: list[Sample], counts: list[Sample], buckets: list[Sample]
) -> HistogramReading:
    """One histogram summed over its series: buckets by `le`, cumulative and ending at +Inf, `_count` equal to the
    +Inf bucket (INVALID_VALUE otherwise). Callers check that `sums` and `counts` are not empty."""
    by_le: dict[float, float] = defaultdict(float)
    for s in buckets:
        by_le[le_bound(s)] += checked(s)
    cumulative = tuple(sorted(by_le.items()))
    if cumulative and not math.isinf(cumulative[-1][0]):
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"histogram {base} has no +Inf bucket")
    if any(later[1] < earlier[1] for earlier, later in itertools.pairwise(cumulative)):
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"histogram {base} buckets are not cumulative")
    total = sum(checked(s) for s in sums)
    count = observations(base, sum(checked(s) for s in counts), total=total)
    if cumulative and not math.isclose(cumulative[-1][1], count, rel_tol=SUM_REL_TOLERANCE,
                                       abs_tol=SUM_ABS_TOLERANCE):
        raise ScrapeError(
            ScrapeErrorReason.INVALID_VALUE,
            f"histogram {base}: _count {count:g} != +Inf bucket {cumulative[-1][1]:g}",
        )
    return HistogramReading(sum=total, count=count, buckets=cumulative)


def by_position(samples: Iterable[Sample], *, label: str, max_positions: int, what: str) -> tuple[float, ...]:
    """Counts by a 0-based position label, summed over the other labels, as a tuple indexed by position.
    INVALID_VALUE for a label that is not a whole number, one at or past `max_positions`, or a gap (a hole would
    shift every later position). Example: positions {"0": 30, "1": 27} -> (30.0, 27.0)."""
    totals: dict[int, float] = defaultdict(float)
    for s in samples:
        raw = s.labels.get(label, "")
        if not (raw.isascii() and raw.isdigit()):
            raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"{s.name} has {label}={raw!r}")
        position = int(raw)
        if position >= max_positions:
            raise ScrapeError(ScrapeErrorReason.INVALID_VALUE,
                              f"{what}: position {position} >= {max_positions} positions accepted")
        totals[position] += checked(s)
    if sorted(totals) != list(range(len(totals))):
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE,
                          f"{what}: positions {sorted(totals)} are not 0..{len(totals) - 1}")
    return tuple(totals[i] for i in range(len(totals)))


def nested_counts_problem(
    drafts: float, draft_tokens: float, accepted: float, per_position: tuple[float, ...], *, rel_tol: float
) -> str:
    """Why speculative counts cannot come from one engine's accounting, or "" when they can: more accepted than
    proposed tokens, more proposed tokens than k per draft, the first position accepted more often than there were
    drafts, a position accepted more often than the one before it, or per-position counts that do not add up to
    the accepted total. `rel_tol` is the exporter's number precision (1e-9 for full floats, 1e-5 for "%g" text)."""
    k = len(per_position)

    def over(value: float, bound: float) -> bool:
        return value > bound * (1.0 + rel_tol) + SUM_ABS_TOLERANCE

    if over(accepted, draft_tokens):
        return f"accepted tokens {accepted:g} > draft tokens {draft_tokens:g}"
    if k and over(draft_tokens, k * drafts):
        return f"draft tokens {draft_tokens:g} > k={k} x drafts {drafts:g}"
    if k and over(per_position[0], drafts):
        return f"position 0 accepted {per_position[0]:g} > drafts {drafts:g}"
    if any(over(b, a) for a, b in itertools.pairwise(per_position)):
        return f"per-position accepted counts rise with the position: {per_position}"
    if k and not math.isclose(sum(per_position), accepted, rel_tol=rel_tol, abs_tol=SUM_ABS_TOLERANCE):
        return f"accepted tokens {accepted:g} != sum over positions {sum(per_position):g}"
    return ""


MAX_MODELS_PER_PAGE = 8
"""The most served models accepted on one page: an engine serves one model per server (LoRA adapters share its
name); each model becomes a label value on every exported series, so a page naming thousands is refused."""


def samples_by_model(samples: Iterable[Sample], *, label: str, engine: str) -> dict[str, list[Sample]]:
    """`samples` grouped by their `label` (the served model). INVALID_VALUE for a sample without it,
    TOO_MANY_SERIES past `MAX_MODELS_PER_PAGE` models."""
    groups: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        model = s.labels.get(label)
        if model is None:
            raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"{s.name} has no {label} label")
        groups[model].append(s)
        if len(groups) > MAX_MODELS_PER_PAGE:
            raise ScrapeError(ScrapeErrorReason.TOO_MANY_SERIES,
                              f"more than MAX_MODELS_PER_PAGE ({MAX_MODELS_PER_PAGE}) models on one {engine} page")
    return groups
