"""Property-based fuzzing of what turns a vLLM /metrics page into Evidence: the page parser
(`service.sources.vllm.parse_vllm_metrics`) and the estimator the loop runs on its snapshots
(`policies.estimate.window.observe` then `estimate`, and `after_failed_scrape` on a tick whose scrape failed:
service/loop.py `AdvisorLoop._estimate`).

Properties:
- The parser, on any text (arbitrary Unicode, pages made of the sample names it reads, and the real pages of
  tests/fixtures/vllm mutated line-wise: values replaced by huge/NaN/Inf/negative/-0/1e308/5e-324 numbers, lines
  dropped, duplicated or renamed, labels altered, series copied to another engine, the body cut at a line boundary
  or mid-line), either returns snapshots whose every number is finite and non-negative (a histogram's last bound
  is +Inf by contract) or raises `ScrapeError` with one of its reasons. Nothing else escapes.
- The estimator, fed sequences of such snapshots (what the parser made of a mutated real page whose counters grow,
  or built directly within the parser's guarantees with extreme values) interleaved with failed scrapes, raises
  nothing (none of the three functions documents an error), and every number of its Evidence is finite, its
  acceptance ratios within 0..1.

Runs are reproducible: `derandomize=True` and no example database (no failing example is replayed from an earlier
run), bounded example counts; the file takes about 15 s on two slow cores. Hypothesis still writes caches (the
source's constants, Unicode tables) under `.hypothesis/`, which it gitignores itself.

The bugs this fuzzing found are pinned, each with its exact input, by the regression tests at the end of the file:
A, an integer literal past 2**1024 escaped the parser as OverflowError; B, the parser's own sums and products of
finite readings overflowed to inf; C, the estimator's means, rates and products of huge finite readings did.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from policies.estimate.window import EstimatorConfig, EstimatorState, after_failed_scrape, estimate, observe
from policies.types import (
    AcceptanceEvidence,
    DataState,
    EngineSnapshot,
    Evidence,
    HistogramReading,
    SpecDecodeCounters,
)
from service.sources import names
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.vllm import MAX_POSITIONS, parse_vllm_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
PAGES: dict[str, list[str]] = {
    path.name: path.read_text(encoding="utf-8").splitlines() for path in sorted(FIXTURES.glob("*.txt"))
}
AFTER_30 = "vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt"
DP2 = "synthetic-ngram-k5-dp2.txt"
T = 1_800_000_000.0
MAX_FLOAT = 1.7976931348623157e308

# Reproducible in CI: the same examples on every run, nothing stored between runs. filter_too_much: some strategies
# reject many drawn examples in a row (assume) on some pages.
FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# ---------------------------------------------------------------------------------------------------------------
# The parser's oracle
# ---------------------------------------------------------------------------------------------------------------


def _bad(value: float) -> bool:
    return not (math.isfinite(value) and value >= 0.0)


def histogram_problems(where: str, histogram: HistogramReading | None) -> list[str]:
    """Why `histogram` breaks its contract (policies/types.py): a finite non-negative sum and counts, bounds
    ascending, finite but the last, which is +Inf."""
    if histogram is None:
        return []
    problems = [f"{where}.{name} = {value!r}" for name, value in (("sum", histogram.sum), ("count", histogram.count))
                if _bad(value)]
    problems += [f"{where} bucket le={le!r} = {count!r}" for le, count in histogram.buckets if _bad(count)]
    bounds = [le for le, _ in histogram.buckets]
    if any(math.isnan(le) for le in bounds) or bounds != sorted(bounds) or (bounds and bounds[-1] != math.inf):
        problems.append(f"{where} bounds are {bounds}")
    problems += [f"{where} bound le={le!r} before the last" for le in bounds[:-1] if not math.isfinite(le)]
    return problems


def _spec_problems(spec: SpecDecodeCounters) -> list[str]:
    counts = (("drafts", spec.drafts), ("draft_tokens", spec.draft_tokens), ("accepted_tokens", spec.accepted_tokens),
              *((f"per_position[{i}]", c) for i, c in enumerate(spec.accepted_per_position)))
    problems = [f"spec.{name} = {c!r}" for name, c in counts if _bad(c)]
    return problems + ([f"spec k = {spec.deployed_k}"] if spec.deployed_k > MAX_POSITIONS else [])


def snapshot_problems(snapshot: EngineSnapshot) -> list[str]:
    """Every number of `snapshot` that is not finite and non-negative, and broken histograms or k."""
    problems = [f"engines = {snapshot.engines}"] if snapshot.engines < 1 else []
    for f in fields(snapshot):
        value = getattr(snapshot, f.name)
        if isinstance(value, int | float):
            problems += [f"{f.name} = {value!r}"] if _bad(float(value)) else []
        elif isinstance(value, HistogramReading):
            problems += histogram_problems(f.name, value)
        elif isinstance(value, SpecDecodeCounters):
            problems += _spec_problems(value)
        elif value is not None and not isinstance(value, str):
            problems.append(f"{f.name}: unexpected type {type(value).__name__}")
    return problems


def parse_checked(text: str) -> dict[str, EngineSnapshot] | ScrapeError:
    """Parse `text`; fail the test on anything but sane snapshots or a ScrapeError."""
    try:
        snapshots = parse_vllm_metrics(text, taken_at_s=T)
    except ScrapeError as error:
        assert isinstance(error.reason, ScrapeErrorReason)
        assert error.detail
        event(f"scrape error: {error.reason.value}")  # --hypothesis-show-statistics shows what the inputs reached
        return error
    assert isinstance(snapshots, dict)
    event(f"snapshots: {len(snapshots)}")
    for model, snapshot in snapshots.items():
        assert isinstance(snapshot, EngineSnapshot)
        assert snapshot.model_name == model and snapshot.taken_at_s == T
        problems = snapshot_problems(snapshot)
        assert not problems, problems
    return snapshots


# ---------------------------------------------------------------------------------------------------------------
# Pages: arbitrary, made of the names the parser reads, and real ones mutated line-wise
# ---------------------------------------------------------------------------------------------------------------

# Numbers as a server (or a broken proxy) could print them. Python's float() accepts more than Prometheus does
# ("1_000", "infinity"): the parser must not let those through as something else either.
EXTREME_TEXTS = ("1e308", "1.7976931348623157e+308", "5e-324", "-0", "NaN", "+Inf", "-1")
NUMBER_TEXTS = (
    "0", "-0.0", "0.0", "1", "3", "-1e308", "1e309", "-1e309", "-5e-324", "2.2250738585072014e-308", "nan", "-NaN",
    "-Inf", "Inf", "inf", "infinity", "-0.5", "0.5", "1e15", "9" * 400, "1_000", "0x10", "", "abc",
    "1.0 1700000000000", "1 2 3",
)
numbers = st.one_of(
    st.sampled_from(EXTREME_TEXTS),
    st.sampled_from(NUMBER_TEXTS),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
)
LABEL_VALUES = ("0", "1", "2", "63", "64", "-1", "1.0", "٣", "", "None", "+Inf", "NaN", "-5", "1e308", "1e200",
                "tiny", "other", 'a"b', "a\\b", "\n")
label_values = st.one_of(st.sampled_from(LABEL_VALUES), st.text(max_size=6))
LABEL_NAMES = ("model_name", "engine", "position", "le", "finished_reason", "kv_cache_size_tokens", "num_gpu_blocks",
               "block_size", "x")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
WANTED = sorted(names.wanted_sample_names())
_WANTED_SET = frozenset(WANTED)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _metric(line: str) -> str:
    return line.partition("{")[0].split(" ")[0]


@dataclass(frozen=True)
class Mutation:
    """One line-wise edit of a page. `index` picks a line (modulo the candidates' count) among the sample lines
    the parser reads (`scope` "read"), all `vllm:` lines ("vllm") or any line ("any")."""

    kind: str
    index: int = 0
    text: str = ""
    label: str = ""
    scope: str = "read"


_indices = st.integers(0, 10_000)
_scopes = st.sampled_from(["read", "read", "vllm", "any"])
mutations = st.one_of(
    # a value; or the values of every series of the line's metric (all engines, positions, buckets)
    st.builds(Mutation, kind=st.sampled_from(["value", "value_family"]), index=_indices, text=numbers,
              scope=_scopes),
    st.builds(Mutation, kind=st.sampled_from(["drop", "duplicate"]), index=_indices, scope=_scopes),
    st.builds(Mutation, kind=st.just("label"), index=_indices, label=st.sampled_from(LABEL_NAMES), text=label_values,
              scope=_scopes),
    st.builds(Mutation, kind=st.just("drop_label"), index=_indices, label=st.sampled_from(LABEL_NAMES)),
    st.builds(Mutation, kind=st.just("rename"), index=_indices, scope=_scopes,
              text=st.sampled_from(["vllm:spec_decode_v2_", "vllm:x_", "vllm:", "vLLM:", "vllm:spec_decode_num_"])),
    st.builds(Mutation, kind=st.just("suffix"), index=_indices, scope=_scopes,
              text=st.sampled_from([" 1700000000000", " x", "{", "}", '"', " # c", "\r", "\t", " " + "9" * 400])),
    # the line again for another engine (data parallelism, or a stray series)
    st.builds(Mutation, kind=st.just("engine_copy"), index=_indices, text=st.sampled_from(["1", "7"])),
    st.builds(Mutation, kind=st.sampled_from(["cut_at_line", "cut_mid_line"]), index=st.integers(0, 10**6)),
)


def _candidates(lines: Sequence[str], scope: str) -> list[int]:
    if scope == "any":
        return list(range(len(lines)))
    if scope == "vllm":
        return [i for i, line in enumerate(lines) if line.startswith("vllm:")]
    return [i for i, line in enumerate(lines) if _metric(line) in _WANTED_SET]


def _relabel(line: str, label: str, value: str | None) -> str:
    head, brace, rest = line.partition("{")
    if not brace:
        return line if value is None else f'{head.split(" ")[0]}{{{label}="{_escape(value)}"}} 1'
    inside, close, tail = rest.partition("}")
    pairs = [(m.group(1), m.group(2)) for m in _LABEL.finditer(inside)]
    kept = [(k, v) for k, v in pairs if k != label]
    if value is not None:
        kept.append((label, _escape(value)))
    return head + "{" + ",".join(f'{k}="{v}"' for k, v in kept) + close + tail


def _with_value(line: str, value: str) -> str:
    return f"{line.rsplit(' ', 1)[0] if ' ' in line else line} {value}"


def _edit_line(lines: list[str], i: int, mutation: Mutation) -> list[str]:
    line, out, kind = lines[i], list(lines), mutation.kind
    if kind == "value":
        out[i] = _with_value(line, mutation.text)
    elif kind == "value_family":
        metric = _metric(line)
        out = [_with_value(other, mutation.text) if _metric(other) == metric else other for other in out]
    elif kind == "drop":
        del out[i]
    elif kind == "duplicate":
        out.insert(i, line)
    elif kind in ("label", "drop_label"):
        out[i] = _relabel(line, mutation.label, mutation.text if kind == "label" else None)
    elif kind == "rename":
        out[i] = mutation.text + line.split(":", 1)[1] if ":" in line else line
    elif kind == "suffix":
        out[i] = line + mutation.text
    else:  # engine_copy
        out.insert(i + 1, _relabel(line, "engine", mutation.text))
    return out


def mutate(lines: list[str], mutation: Mutation) -> tuple[list[str], bool]:
    """`lines` with `mutation` applied, and whether the page still ends with a newline (False: cut mid-line)."""
    if mutation.kind == "cut_at_line":
        return lines[: mutation.index % (len(lines) + 1)], True
    if mutation.kind == "cut_mid_line":
        text = "\n".join(lines) + "\n"
        cut = text[: mutation.index % (len(text) + 1)]
        return cut.split("\n")[:-1] if cut.endswith("\n") else cut.split("\n"), cut.endswith("\n") or not cut
    candidates = _candidates(lines, mutation.scope)
    if not candidates:
        return lines, True
    return _edit_line(lines, candidates[mutation.index % len(candidates)], mutation), True


def render(lines: list[str], newline_at_end: bool) -> str:
    text = "\n".join(lines)
    return text + "\n" if newline_at_end and lines else text


@st.composite
def mutated_pages(draw: st.DrawFn) -> str:
    lines = PAGES[draw(st.sampled_from(sorted(PAGES)))]
    whole = True
    for mutation in draw(st.lists(mutations, min_size=1, max_size=6)):
        if not whole:
            break
        lines, whole = mutate(lines, mutation)
    return render(lines, whole)


label_sets = st.dictionaries(st.sampled_from(LABEL_NAMES), label_values, max_size=4)


@st.composite
def built_pages(draw: st.DrawFn) -> str:
    """Pages made of the sample names the parser reads, with random labels and values: they reach its validation
    (positions, engines, models, buckets, info labels) far more often than arbitrary text."""
    # Half the pages keep to vLLM's labels, plain counts and one series per name, so that some of them get past
    # the validation to snapshots; the other half is any mix of names, labels and values.
    plain = draw(st.booleans())
    if plain:
        chosen = ["vllm:num_requests_running", "vllm:num_requests_waiting",
                  *draw(st.lists(st.sampled_from(WANTED), unique=True, max_size=12))]
        values = st.one_of(st.integers(0, 5000).map(str), st.integers(0, 5000).map(str), numbers)
    else:
        chosen = draw(st.lists(st.sampled_from(WANTED), min_size=1, max_size=40))
        values = numbers
    lines = []
    for name in chosen:
        labels = {"model_name": "tiny", "engine": "0"} if plain else {}
        if plain and name.endswith("_bucket"):
            labels["le"] = "+Inf"
        if plain and "_per_pos" in name:
            labels["position"] = "0"
        labels |= draw(label_sets) if not plain or draw(st.integers(0, 9)) == 0 else {}
        if draw(st.booleans()):
            labels.setdefault("model_name", "tiny")
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {draw(values)}" if labels else f"{name} {draw(values)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# (a) the parser
# ---------------------------------------------------------------------------------------------------------------


@FUZZ
@given(st.text(max_size=2000))
@example("")
@example("\n")
@example("vllm:\n")
@example("vllm:num_requests_running")
@example('vllm:num_requests_running{model_name="m"} 1\n')
@example("\udcff\n")  # a lone surrogate, as a lenient decoder could hand over
def test_arbitrary_text_gives_snapshots_or_a_scrape_error(text: str) -> None:
    parse_checked(text)


@FUZZ
@given(built_pages())
def test_pages_of_the_names_read_give_sane_snapshots_or_a_scrape_error(text: str) -> None:
    parse_checked(text)


@settings(FUZZ, max_examples=600)
@given(mutated_pages())
def test_mutated_real_pages_give_sane_snapshots_or_a_scrape_error(text: str) -> None:
    parse_checked(text)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_fixture_parses_into_sane_snapshots(name: str) -> None:
    # The fuzzing starts from good pages; otherwise every mutation would only exercise the same error.
    snapshots = parse_vllm_metrics("\n".join(PAGES[name]) + "\n", taken_at_s=T)
    assert snapshots
    assert all(not snapshot_problems(s) for s in snapshots.values())


# ---------------------------------------------------------------------------------------------------------------
# The estimator's oracle
# ---------------------------------------------------------------------------------------------------------------


def _ratio(value: float) -> bool:
    return 0.0 <= value <= 1.0


def acceptance_problems(acceptance: AcceptanceEvidence | None) -> list[str]:
    if acceptance is None:
        return []
    problems: list[str] = []
    for f in fields(acceptance):
        value = getattr(acceptance, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"acceptance.{f.name} = {value!r}")
        elif isinstance(value, tuple) and not all(_ratio(v) for v in value):
            problems.append(f"acceptance.{f.name} out of 0..1: {value}")
    problems += [f"acceptance.{name} out of 0..1: {getattr(acceptance, name)!r}"
                 for name in ("acceptance_rate", "draft_coverage") if not _ratio(getattr(acceptance, name))]
    return problems


def evidence_problems(evidence: Evidence) -> list[str]:
    """Every number of `evidence` that is not finite, and the acceptance's ratios outside 0..1."""
    problems = [f"{f.name} = {getattr(evidence, f.name)!r}" for f in fields(evidence)
                if isinstance(getattr(evidence, f.name), float) and not math.isfinite(getattr(evidence, f.name))]
    problems += acceptance_problems(evidence.acceptance)
    problems += [p for p in histogram_problems("request_itl", evidence.request_itl) if "bound" not in p]
    if not isinstance(evidence.state, DataState):
        problems.append(f"state = {evidence.state!r}")
    return problems


@dataclass(frozen=True)
class Tick:
    """One loop tick: a scrape `dt_s` after the last one (a snapshot, or None for a failed scrape), judged `lag_s`
    later (the loop judges at once; a lag plays a slow tick)."""

    dt_s: float
    snapshot: EngineSnapshot | None
    lag_s: float


def run_estimator(ticks: Iterable[Tick], config: EstimatorConfig) -> None:
    """The loop's estimate step (service/loop.py `_estimate`) over `ticks`, checking every Evidence."""
    state = EstimatorState()
    now_s = T
    last_good_s: float | None = None
    for tick in ticks:
        now_s += tick.dt_s
        if tick.snapshot is not None:
            state = observe(state, replace(tick.snapshot, taken_at_s=now_s), config)
            last_good_s = now_s
        evidence = estimate(state, target="t", config=config, now_s=now_s + tick.lag_s)
        if tick.snapshot is None:
            evidence = after_failed_scrape(evidence, failure="scrape failed (timeout): no answer",
                                           last_good_s=last_good_s, now_s=now_s + tick.lag_s, config=config)
        problems = evidence_problems(evidence)
        assert not problems, (problems, state.snapshots)


# ---------------------------------------------------------------------------------------------------------------
# Snapshots for the estimator
# ---------------------------------------------------------------------------------------------------------------

# The extremes a page can carry that the parser lets through (finite, non-negative), and ordinary values.
extreme = st.one_of(
    st.sampled_from([0.0, 5e-324, 2.2250738585072014e-308, 1e-9, 0.5, 1.0, 3.0, 1e6, 1e15, 1e300, 1e307, 1e308,
                     MAX_FLOAT]),
    st.floats(min_value=0.0, max_value=MAX_FLOAT),
)
ordinary = st.one_of(st.sampled_from([0.0, 5e-324, 0.5, 1.0, 3.0]), st.floats(min_value=0.0, max_value=1e15))


@st.composite
def histograms(draw: st.DrawFn, values: st.SearchStrategy[float]) -> HistogramReading | None:
    """None, or a cumulative histogram as the parser returns it: a whole count, +Inf bucket = count."""
    if draw(st.booleans()):
        return None
    count = float(round(draw(values)))
    total = draw(values) if count > 0 else 0.0
    bounds = sorted(set(draw(st.lists(st.sampled_from([0.001, 0.01, 0.025, 0.05, 0.1, 1.0, 2.0, 10.0]),
                                      max_size=4))))
    shares = sorted(draw(st.lists(st.floats(0.0, 1.0), min_size=len(bounds), max_size=len(bounds))))
    buckets = (*((le, float(math.floor(count * p))) for le, p in zip(bounds, shares, strict=True)), (math.inf, count))
    return HistogramReading(sum=total, count=count, buckets=buckets)


@st.composite
def spec_counters(draw: st.DrawFn, values: st.SearchStrategy[float]) -> SpecDecodeCounters | None:
    """None (speculation off), or counters the parser accepts (`_check_spec_counts`): per-position counts
    non-increasing and at most the drafts, accepted = their sum <= draft tokens <= k x drafts, all finite."""
    if draw(st.integers(0, 5)) == 0:
        return None
    k = draw(st.integers(1, 8))
    drafts = draw(values)
    shares = sorted(draw(st.lists(st.floats(0.0, 1.0), min_size=k, max_size=k)), reverse=True)
    per_position = tuple(drafts * s for s in shares)
    accepted = sum(per_position)
    assume(math.isfinite(accepted))
    ceiling = min(k * drafts, MAX_FLOAT)
    draft_tokens = max(accepted, accepted + (ceiling - accepted) * draw(st.floats(0.0, 1.0)))
    return SpecDecodeCounters(drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
                              accepted_per_position=per_position)


def _optional(values: st.SearchStrategy[float]) -> st.SearchStrategy[float | None]:
    return st.one_of(st.none(), values)


@st.composite
def built_snapshots(draw: st.DrawFn, values: st.SearchStrategy[float]) -> EngineSnapshot:
    """A snapshot the parser could return (its guarantees, nothing more); the caller sets the time. The counters
    are drawn afresh each time, so a sequence also plays restarts, counters going down, model and k changes."""
    spec = draw(spec_counters(values))
    engines = draw(st.sampled_from([1, 1, 2, 8]))
    generation = draw(_optional(values))
    if spec is not None and generation is not None:
        generation = max(generation, spec.drafts - 1024.0 * engines)  # drafts <= generated tokens + slack
    request_itl = draw(histograms(values))
    single = draw(_optional(values))
    if single is not None and request_itl is not None:
        single = min(single, request_itl.count)
    return EngineSnapshot(
        taken_at_s=0.0,
        model_name=draw(st.sampled_from(["tiny", "tiny", "other"])),
        engines=engines,
        spec=spec,
        num_requests_running=draw(values),
        num_requests_waiting=draw(values),
        # None (no _created), the usual epoch, one a hair before now, one in the future (clock skew), 1970
        created_s=draw(st.sampled_from([None, T - 100.0, T - 100.0, T - 5e-324, T + 50.0, 0.0])),
        kv_cache_usage_ratio=draw(_optional(values)),
        kv_cache_capacity_tokens=draw(_optional(values)),
        generation_tokens=generation,
        prompt_tokens=draw(_optional(values)),
        inter_token_latency=draw(histograms(values)),
        iteration_tokens=draw(histograms(values)),
        request_itl=request_itl,
        single_token_requests=single,
        estimated_flops=draw(_optional(values)),
        estimated_read_bytes=draw(_optional(values)),
    )


# Scrape intervals as a loop sees them, with a duplicate time (0) and tiny steps; lags up to past stale_after_s.
intervals = st.sampled_from([0.0, 1e-6, 0.001, 0.25, 1.0, 5.0, 30.0, 120.0])
lags = st.sampled_from([0.0, 0.0, 0.1, 31.0, 1000.0])
# Usual configs, and any within the settings' bounds (service/settings.py EstimatorSettings).
configs = st.one_of(
    st.builds(EstimatorConfig, window_s=st.sampled_from([0.5, 1.0, 60.0]), min_drafts=st.sampled_from([0, 1, 200]),
              stale_after_s=st.sampled_from([1.0, 30.0])),
    st.builds(EstimatorConfig, window_s=st.floats(1e-6, 3600.0), min_drafts=st.integers(0, 10**9),
              z=st.floats(1e-9, 5.0), stale_after_s=st.floats(1e-6, math.inf)),
)


def ticks_of(snapshots: st.SearchStrategy[EngineSnapshot]) -> st.SearchStrategy[list[Tick]]:
    return st.lists(st.builds(Tick, dt_s=intervals, snapshot=st.one_of(st.none(), snapshots), lag_s=lags),
                    min_size=1, max_size=8)


_COUNTER_PREFIXES = ("vllm:spec_decode_", "vllm:generation_tokens_total", "vllm:prompt_tokens_total")


def grown(lines: list[str], factor: float) -> list[str]:
    """The page with its counters times `factor` (CaptureServer's trick: ratios kept, the deltas fresh)."""
    out = []
    for line in lines:
        if line.startswith(_COUNTER_PREFIXES) and "_total" in _metric(line):
            series, _, value = line.rpartition(" ")
            out.append(f"{series} {float(value) * factor!r}")
        else:
            out.append(line)
    return out


@st.composite
def parsed_ticks(draw: st.DrawFn) -> list[Tick]:
    """Ticks whose snapshots are what the parser made of a real page, its counters growing tick by tick, with up to
    two line-wise mutations per page (a page the parser refuses is a failed scrape, as in the loop)."""
    name = draw(st.sampled_from(sorted(PAGES)))
    ticks = []
    for n in range(1, draw(st.integers(1, 6)) + 1):
        lines, whole = grown(PAGES[name], float(n)), True
        for mutation in draw(st.lists(mutations, max_size=2)):
            if whole:
                lines, whole = mutate(lines, mutation)
        result = parse_checked(render(lines, whole))
        snapshot = next(iter(result.values())) if isinstance(result, dict) and result else None
        ticks.append(Tick(dt_s=draw(intervals), snapshot=snapshot, lag_s=draw(lags)))
    return ticks


# ---------------------------------------------------------------------------------------------------------------
# (b) the estimator
# ---------------------------------------------------------------------------------------------------------------


@FUZZ
@given(parsed_ticks(), configs)
def test_estimator_on_parsed_mutated_pages_raises_nothing_and_stays_finite(
    ticks: list[Tick], config: EstimatorConfig
) -> None:
    run_estimator(ticks, config)


@FUZZ
@given(ticks_of(built_snapshots(extreme)), configs)
def test_estimator_on_extreme_snapshots_raises_nothing_and_stays_finite(
    ticks: list[Tick], config: EstimatorConfig
) -> None:
    run_estimator(ticks, config)


@FUZZ
@given(ticks_of(built_snapshots(ordinary)), configs)
def test_estimator_on_ordinary_snapshots_stays_finite_with_no_tolerance(
    ticks: list[Tick], config: EstimatorConfig
) -> None:
    # Readings up to 1e15: no known bug applies here, every violation fails.
    run_estimator(ticks, config)


@FUZZ
@given(st.floats(), st.integers(-10, 10**6), st.floats(), st.floats())
def test_an_estimator_config_is_built_or_refused_with_value_error(
    window_s: float, min_drafts: int, z: float, stale_after_s: float
) -> None:
    # EstimatorConfig's documented error; NaN and Inf included.
    try:
        config = EstimatorConfig(window_s=window_s, min_drafts=min_drafts, z=z, stale_after_s=stale_after_s)
    except ValueError:
        return
    assert config.window_s > 0 and config.min_drafts >= 0 and config.z > 0 and config.stale_after_s > 0


# ---------------------------------------------------------------------------------------------------------------
# Known bugs found by the fuzzing, each with its exact input (the module docstring says how to retire them)
# ---------------------------------------------------------------------------------------------------------------


def page_with(name: str, edits: dict[str, str]) -> str:
    """Fixture `name` with each line starting with a key of `edits` given that value (the key's series kept)."""
    out = []
    for line in PAGES[name]:
        value = next((v for prefix, v in edits.items() if line.startswith(prefix)), None)
        out.append(line if value is None else _with_value(line, value))
    return "\n".join(out) + "\n"


HUGE_INT = "9" * 400  # 10**400 - 1: Python's int() takes it; float() of that int overflows


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        # value on a line the parser reads: float(int) in vllm.py `_checked`
        (page_with(AFTER_30, {"vllm:num_requests_running{": HUGE_INT}), ScrapeErrorReason.INVALID_VALUE),
        # timestamp on a line the parser reads: `int / 1000` in prometheus_client.parser, from `_parse_lines`
        (page_with(AFTER_30, {"vllm:num_requests_running{": f"0.0 {HUGE_INT}"}), ScrapeErrorReason.PARSE),
        # a page without vLLM lines: the same, from `_raise_no_vllm_lines`
        (f"process_open_fds 1 {HUGE_INT}\n", ScrapeErrorReason.PARSE),
    ],
    ids=["value", "timestamp", "no-vllm-page"],
)
def test_bug_a_a_huge_integer_literal_is_a_scrape_error_not_an_overflow(text: str, reason: ScrapeErrorReason) -> None:
    # Before: OverflowError escaped parse_vllm_metrics, and the loop counted reason `internal` every tick.
    with pytest.raises(ScrapeError) as caught:
        parse_vllm_metrics(text, taken_at_s=T)
    assert caught.value.reason is reason


def _kv_overflow_page() -> str:
    text = "\n".join(PAGES[AFTER_30]) + "\n"
    return (text.replace('kv_cache_size_tokens="1048576"', 'kv_cache_size_tokens="None"')
            .replace('num_gpu_blocks="8192"', 'num_gpu_blocks="1e200"')
            .replace(',block_size="128"', ',block_size="1e200"'))


@pytest.mark.parametrize(
    "text",
    [
        # two engines with 1e308 requests running each: their sum was inf
        page_with(DP2, {"vllm:num_requests_running{": "1e308"}),
        # two engines with 1e308 generated tokens each: their sum was inf
        page_with(DP2, {"vllm:generation_tokens_total{": "1e308"}),
        # one engine, cache_config_info num_gpu_blocks="1e200" block_size="1e200": capacity was inf, usage nan
        _kv_overflow_page(),
    ],
    ids=["running-dp2", "generation-dp2", "kv-capacity"],
)
def test_bug_b_readings_whose_sums_or_products_would_overflow_are_invalid(text: str) -> None:
    with pytest.raises(ScrapeError) as caught:
        parse_vllm_metrics(text, taken_at_s=T)
    assert caught.value.reason is ScrapeErrorReason.INVALID_VALUE


def _two_snapshots(change: dict[str, float], *, dt_s: float, first: dict[str, float] | None = None) -> EstimatorState:
    """Two scrapes of the after-30 capture `dt_s` apart, with the snapshot fields in `change` (and `first` on the
    first one) set past anything the parser lets through: the estimator must hold on its own."""
    config = EstimatorConfig()
    base = parse_vllm_metrics("\n".join(PAGES[AFTER_30]) + "\n", taken_at_s=T)["tiny"]
    state = observe(EstimatorState(), replace(base, **(first or change)), config)  # type: ignore[arg-type]
    return observe(state, replace(base, taken_at_s=T + dt_s, **change), config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "first", "dt_s", "named"),
    [
        # a window mean of two 1e308s: (1e308 + 1e308) / 2 was inf
        ({"num_requests_running": 1e308}, None, 5.0, "batch"),
        # generation tokens 1920 -> 1e308 within 0.25 s: 4e308 per second was inf
        ({"generation_tokens": 1e308}, {"generation_tokens": 1920.0}, 0.25, "generation_tokens_per_s"),
        # KV usage 1e308 x 1048576 tokens / 1 running request was inf
        ({"kv_cache_usage_ratio": 1e308, "num_requests_running": 1.0}, None, 5.0, "context_tokens_per_seq"),
    ],
    ids=["batch", "generation-rate", "context-per-seq"],
)
def test_bug_c_the_estimator_calls_overflowing_readings_an_error_and_stays_finite(
    change: dict[str, float], first: dict[str, float] | None, dt_s: float, named: str
) -> None:
    state = _two_snapshots(change, dt_s=dt_s, first=first)
    evidence = estimate(state, target="t", config=EstimatorConfig(), now_s=T + dt_s)
    assert not evidence_problems(evidence), evidence_problems(evidence)
    assert evidence.state is DataState.ERROR
    assert named in evidence.reason
