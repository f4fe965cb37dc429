"""Read a vLLM `/metrics` page into one `EngineSnapshot` per served model, and fetch that page over HTTP.

Parsing is `prometheus_client.parser`, but only on the sample lines we use: a real page is ~50 KB (~700 lines) of
which ~55 lines matter, and the library parser costs ~6-12 ms for the whole page. A cheap line pre-filter (a string
prefix test and one set lookup per line) keeps the cost linear in page size and the parser's share small. Lines of
other families are not validated: a malformed line there is the server's business, not a reason to drop our
reading.

Failure policy (every failure is a `ScrapeError`, nothing else escapes):
- PARSE: undecodable bytes, a line the parser rejects, or a body that does not end in a newline (a truncated page;
  the exposition format ends every line with one), or garbage with no vLLM line at all.
- INVALID_VALUE: NaN, Inf or a negative number in a field we use, or one past its plausible range
  (`exposition.MAX_COUNT` for counters, histograms and timestamps, `MAX_ENGINE_FLOPS`, `MAX_REQUESTS_PER_ENGINE`,
  `MAX_KV_USAGE_RATIO`, `MAX_KV_CAPACITY_TOKENS`: so no sum over engines and no rate downstream can overflow), an
  unusable `position`/`le` label, a gap in
  positions, more than `MAX_POSITIONS` positions, per-position counts that do not add up to the accepted tokens
  (a vanished position series), duplicate series, a histogram that is not cumulative or whose `_count` is not a
  whole number, differs from its +Inf bucket, or is 0 under a positive `_sum`, and spec-decode counters vLLM's
  own accounting cannot produce (`_check_spec_counts`): a sum over engines that overflows to Inf, more accepted
  than proposed draft tokens, more proposed tokens than k per draft, a position counted more often than the one
  before it (or the first more often than the drafts), or more drafts than generated tokens (every verification
  emits at least one token).
- MISSING_FAMILY: a model without `vllm:num_requests_running`/`waiting`, some but not all four spec-decode
  families (e.g. a V0 page that lacks `num_drafts`: acceptance per position cannot be estimated from it, and
  calling that "speculation off" would be a lie), none of the four but other `vllm:spec_decode*` names (a vLLM
  that renamed them: same lie), a histogram with buckets but no `_sum`/`_count`.
- MODEL_MISSING: a well-formed Prometheus page without any vLLM engine series (wrong target, other server).
- TOO_MANY_SERIES: more than `MAX_SAMPLE_LINES` sample lines of the families we read (checked before the parser
  runs: the parse, not the download, is what costs), more than `MAX_MODELS_PER_PAGE` models, or more than
  `MAX_ENGINES_PER_MODEL` engines of one model.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from prometheus_client.samples import Sample

from policies.types import EngineSnapshot, HistogramReading, SpecDecodeCounters
from service.sources import exposition, names
from service.sources.errors import ScrapeError, ScrapeErrorReason

_WANTED = names.wanted_sample_names()
_KNOWN_SPEC = names.known_spec_decode_sample_names()
_SPEC_VALUES = names.spec_decode_value_names()
# Every wanted name starts with one of these (e.g. "vllm:"): a C-level startswith rejects the other ~95% of lines.
_PREFIXES: tuple[str, ...] = tuple(sorted({n.split(":", 1)[0] + ":" if ":" in n else n for n in _WANTED}))
# Unknown spec-decode names quoted in the error message; one renamed family brings a handful of sample names.
_UNKNOWN_NAMES_SHOWN = 6
# Distinct unknown spec-decode names remembered per page: enough to name a renamed family, bounded against a page of
# invented names.
_UNKNOWN_NAMES_KEPT = 64

MAX_SAMPLE_LINES = exposition.MAX_SAMPLE_LINES  # the one cap every adapter applies

MAX_MODELS_PER_PAGE = exposition.MAX_MODELS_PER_PAGE  # as every adapter

MAX_ENGINES_PER_MODEL = 128
"""The most `engine` label values accepted per model: vLLM's data-parallel engines behind one API server (a node
holds 8-16 GPUs; wide expert-parallel deployments run one API server per node or a few dozen engines)."""

MAX_ENGINE_FLOPS = 1e30
"""The largest `estimated_flops_per_gpu` / `estimated_read_bytes_per_gpu` counter accepted: 1e18 FLOP/s (a
thousand times a B200) for 30 000 years."""

MAX_REQUESTS_PER_ENGINE = 1e6
"""The most running or waiting requests accepted per engine (vLLM's max_num_seqs is at most a few thousand; a queue
of a million requests is a broken exporter)."""

MAX_KV_USAGE_RATIO = 1.0 + 1e-6
"""`kv_cache_usage_perc` is a fraction of the KV cache in use (vLLM: "1 means 100 percent usage"), not a percent."""

MAX_KV_CAPACITY_TOKENS = 1e12
"""The largest KV capacity accepted per engine (tokens): a thousand times a large GPU node's."""

MAX_POSITIONS = 64
"""The most `position` series accepted per model. vLLM creates one per draft token (k of them); real deployments
run k <= ~10 (n-gram, EAGLE, MTP), the decision evaluates gamma <= 32 (settings `decide.gamma_max`), so 64 is
twice anything usable. Each position becomes an exported series (`acceptance_per_position_ratio`) and a slot in
the estimator's state: a page claiming 20000 positions is a bug or an attack, not a deployment to advise."""

def parse_vllm_metrics(text: str, *, taken_at_s: float) -> dict[str, EngineSnapshot]:
    """Parse one vLLM `/metrics` page into snapshots keyed by `model_name`.

    Series of several engines (data parallelism, label `engine`) are summed per model; `engines` counts the
    distinct `engine` values. Raises `ScrapeError` (see the module docstring for which reason when).
    """
    if text and not text.endswith("\n"):
        raise ScrapeError(ScrapeErrorReason.PARSE, "body does not end with a newline (truncated page)")
    lines, unknown_spec = _select_lines(text)
    if not lines and not unknown_spec:
        _raise_no_vllm_lines(text)
    index = exposition.index_samples(exposition.parse_lines(lines)) if lines else {}
    if unknown_spec and _SPEC_VALUES.isdisjoint(index):
        _raise_unknown_spec_names(unknown_spec)
    return _build_snapshots(index, taken_at_s=taken_at_s)


# ------------------------------------------------------------------------------------------------------------
# Text -> samples
# ------------------------------------------------------------------------------------------------------------


def _select_lines(text: str) -> tuple[list[str], set[str]]:
    """The sample lines of wanted names, in page order, and the `vllm:spec_decode*` sample names we do not know.

    HELP/TYPE lines are dropped: without them each sample reaches us under its exposed name, which is what the
    name mapping is written against, and they would cost as much parser time as the samples themselves.
    The unknown spec-decode names cost one more prefix test on lines we skip anyway; they tell a renamed family
    (a new vLLM) from speculation being off.
    """
    kept: list[str] = []
    unknown_spec: set[str] = set()
    for line in text.split("\n"):
        if line.startswith(_PREFIXES):
            name = line.partition("{")[0].split(None, 1)
            if not name:
                continue
            if name[0] in _WANTED:
                kept.append(line)
                exposition.check_line_cap(len(kept), engine="vLLM", name=name[0])
            elif (name[0].startswith(names.SPEC_DECODE_PREFIX) and name[0] not in _KNOWN_SPEC
                  and len(unknown_spec) < _UNKNOWN_NAMES_KEPT):
                unknown_spec.add(name[0])
    return kept, unknown_spec


def _raise_unknown_spec_names(unknown: set[str]) -> NoReturn:
    # Value names before their `_created` siblings: they are what names.py needs.
    shown = sorted(unknown, key=lambda n: (n.endswith(names.CREATED_SUFFIX), n))[:_UNKNOWN_NAMES_SHOWN]
    more = f" (+{len(unknown) - len(shown)} more)" if len(unknown) > len(shown) else ""
    raise ScrapeError(
        ScrapeErrorReason.MISSING_FAMILY,
        f"unknown spec_decode metric names {', '.join(shown)}{more} and none of the known ones (a newer vLLM?): "
        "add them to service/sources/names.py",
    )


def _raise_no_vllm_lines(text: str) -> NoReturn:
    """Tell a page that is not Prometheus text (PARSE) from a well-formed page of another server (MODEL_MISSING)."""
    exposition.raise_unless_prometheus_text(text)
    raise ScrapeError(ScrapeErrorReason.MODEL_MISSING, "no vLLM engine series on the page")


# ------------------------------------------------------------------------------------------------------------
# Samples -> snapshots
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Resolved:
    """The candidate name chosen for one canonical field on this page."""

    base: str
    legacy: bool  # not the preferred (newest) name


@dataclass(slots=True)
class _ModelSamples:
    """One model's samples by sample name, and the engines they came from."""

    by_name: dict[str, list[Sample]] = field(default_factory=lambda: defaultdict(list))
    engines: set[str] = field(default_factory=set)


def _resolve(index: Mapping[str, list[Sample]]) -> dict[str, _Resolved]:
    resolved: dict[str, _Resolved] = {}
    for field_name, family in names.VLLM_FAMILIES.items():
        for rank, base in enumerate(family.candidates):
            if any(n in index for n in family.value_names(base)):
                resolved[field_name] = _Resolved(base=base, legacy=rank > 0)
                break
    return resolved


def _group_by_model(
    index: Mapping[str, list[Sample]], resolved: Mapping[str, _Resolved]
) -> tuple[dict[str, _ModelSamples], list[Sample]]:
    """Per-model samples of the resolved names, plus cache-config series that carry no model (apply to all)."""
    models: dict[str, _ModelSamples] = defaultdict(_ModelSamples)
    unowned_config: list[Sample] = []
    for field_name, res in resolved.items():
        family = names.VLLM_FAMILIES[field_name]
        for sample_name in (*family.value_names(res.base), res.base + names.CREATED_SUFFIX):
            for s in index.get(sample_name, ()):
                model = s.labels.get(names.MODEL_LABEL)
                if model is None:
                    if family.kind is names.Kind.INFO:
                        unowned_config.append(s)
                        continue
                    raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"{s.name} has no {names.MODEL_LABEL} label")
                group = models[model]
                group.by_name[sample_name].append(s)
                if family.kind is not names.Kind.INFO:
                    group.engines.add(s.labels.get(names.ENGINE_LABEL, ""))
    return models, unowned_config


def _build_snapshots(index: Mapping[str, list[Sample]], *, taken_at_s: float) -> dict[str, EngineSnapshot]:
    resolved = _resolve(index)
    models, unowned_config = _group_by_model(index, resolved)
    models = {m: g for m, g in models.items() if g.engines}  # a model seen only in cache_config is no engine
    if not models:
        raise ScrapeError(ScrapeErrorReason.MODEL_MISSING, "no vLLM engine series on the page")
    _check_cardinality(models)
    legacy = sorted(r.base.removeprefix("vllm:") for r in resolved.values() if r.legacy)
    naming = names.NAMING_LEGACY_PREFIX + ",".join(legacy) if legacy else names.NAMING_CURRENT
    return {
        model: _ModelReader(model, group, resolved, unowned_config).snapshot(taken_at_s=taken_at_s, naming=naming)
        for model, group in sorted(models.items())
    }


_GAUGE_LIMITS = {
    names.NUM_REQUESTS_RUNNING: MAX_REQUESTS_PER_ENGINE,
    names.NUM_REQUESTS_WAITING: MAX_REQUESTS_PER_ENGINE,
    names.KV_CACHE_USAGE: MAX_KV_USAGE_RATIO,
}
_ENGINE_ROOFLINE_COUNTERS = frozenset({names.ESTIMATED_FLOPS, names.ESTIMATED_READ_BYTES})


def _check_cardinality(models: Mapping[str, _ModelSamples]) -> None:
    """Raise TOO_MANY_SERIES past `MAX_MODELS_PER_PAGE` models or `MAX_ENGINES_PER_MODEL` engines of one model."""
    if len(models) > MAX_MODELS_PER_PAGE:
        raise ScrapeError(
            ScrapeErrorReason.TOO_MANY_SERIES,
            f"{len(models)} models on one page > MAX_MODELS_PER_PAGE ({MAX_MODELS_PER_PAGE})",
        )
    for model, group in models.items():
        if len(group.engines) > MAX_ENGINES_PER_MODEL:
            raise ScrapeError(
                ScrapeErrorReason.TOO_MANY_SERIES,
                f"model {model[:80]!r}: {len(group.engines)} engines > MAX_ENGINES_PER_MODEL ({MAX_ENGINES_PER_MODEL})",
            )


def _engine(sample: Sample) -> str:
    return sample.labels.get(names.ENGINE_LABEL, "")


class _ModelReader:
    """Turns one model's samples into an `EngineSnapshot`; every value is validated where it is read."""

    def __init__(
        self,
        model: str,
        group: _ModelSamples,
        resolved: Mapping[str, _Resolved],
        unowned_config: list[Sample],
    ) -> None:
        self._model = model
        self._group = group
        self._resolved = resolved
        self._unowned_config = unowned_config
        # Earliest `_created` per engine: the engine's counter epoch.
        self._created_by_engine: dict[str, float] = {}

    def snapshot(self, *, taken_at_s: float, naming: str) -> EngineSnapshot:
        running = self._gauge_total(names.NUM_REQUESTS_RUNNING)
        waiting = self._gauge_total(names.NUM_REQUESTS_WAITING)
        if running is None or waiting is None:
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY,
                f"model {self._model!r} lacks vllm:num_requests_running or vllm:num_requests_waiting",
            )
        capacity_by_engine = self._kv_capacity_by_engine()
        spec = self._spec()
        generation = self._counter(names.GENERATION_TOKENS)
        if spec is not None:
            _check_spec_counts(spec, generation_tokens=generation, engines=max(1, len(self._group.engines)),
                               model=self._model)
        prompt = self._counter(names.PROMPT_TOKENS)
        itl = self._histogram(names.INTER_TOKEN_LATENCY)
        iteration = self._histogram(names.ITERATION_TOKENS)
        request_itl = self._histogram(names.REQUEST_ITL)
        first_token = self._histogram(names.FIRST_TOKEN_LATENCY)
        single_token = _at_most_one(self._histogram(names.REQUEST_GENERATION_TOKENS))
        flops = self._counter(names.ESTIMATED_FLOPS)
        read_bytes = self._counter(names.ESTIMATED_READ_BYTES)
        return EngineSnapshot(
            taken_at_s=taken_at_s,
            model_name=self._model,
            # Series without an `engine` label (older pages) are whole-server series, not an extra engine.
            engines=max(1, len(self._group.engines - {""})),
            spec=spec,
            num_requests_running=running,
            num_requests_waiting=waiting,
            kv_cache_usage_ratio=self._kv_usage(capacity_by_engine),
            kv_cache_capacity_tokens=sum(capacity_by_engine.values()) if capacity_by_engine is not None else None,
            generation_tokens=generation,
            prompt_tokens=prompt,
            inter_token_latency=itl,
            iteration_tokens=iteration,
            request_itl=request_itl,
            first_token_latency=first_token,
            single_token_requests=single_token,
            estimated_flops=flops,
            estimated_read_bytes=read_bytes,
            created_s=self._created_s(),  # after every counter read: each one notes its `_created`
            naming=naming,
        )

    def _created_s(self) -> float | None:
        """The latest engine epoch: a restart of any one engine (data parallelism) moves it, and with one engine
        it is simply the earliest `_created` read."""
        by_engine = dict(self._created_by_engine)
        unlabelled = by_engine.pop("", None)  # series without `engine` (older pages) belong to every engine
        if unlabelled is not None:
            by_engine = {e: min(c, unlabelled) for e, c in by_engine.items()} or {"": unlabelled}
        return max(by_engine.values()) if by_engine else None

    # -- generic readers ----------------------------------------------------------------------------------------

    def _samples(self, sample_name: str) -> list[Sample]:
        return self._group.by_name.get(sample_name, [])

    def _base(self, field_name: str) -> str | None:
        res = self._resolved.get(field_name)
        return res.base if res is not None else None

    def _note_created(self, base: str) -> None:
        for s in self._samples(base + names.CREATED_SUFFIX):
            created = exposition.checked(s)
            engine = _engine(s)
            self._created_by_engine[engine] = min(created, self._created_by_engine.get(engine, math.inf))

    def _counter_samples(self, field_name: str) -> list[Sample]:
        base = self._base(field_name)
        if base is None:
            return []
        samples = self._samples(base + "_total") or self._samples(base)
        if samples:
            self._note_created(base)
        return samples

    def _counter(self, field_name: str) -> float | None:
        samples = self._counter_samples(field_name)
        limit = MAX_ENGINE_FLOPS if field_name in _ENGINE_ROOFLINE_COUNTERS else exposition.MAX_COUNT
        return sum(exposition.checked(s, limit) for s in samples) if samples else None

    def _gauge_by_engine(self, field_name: str) -> dict[str, float]:
        base = self._base(field_name)
        if base is None:
            return {}
        limit = _GAUGE_LIMITS.get(field_name, exposition.MAX_COUNT)
        by_engine: dict[str, float] = defaultdict(float)
        for s in self._samples(base):
            by_engine[_engine(s)] += exposition.checked(s, limit)
        return by_engine

    def _gauge_total(self, field_name: str) -> float | None:
        by_engine = self._gauge_by_engine(field_name)
        return sum(by_engine.values()) if by_engine else None

    # -- speculative decoding -----------------------------------------------------------------------------------

    def _spec(self) -> SpecDecodeCounters | None:
        present = {f: self._counter_samples(f) for f in names.SPEC_FIELDS}
        missing = [f for f, samples in present.items() if not samples]
        if len(missing) == len(names.SPEC_FIELDS):
            return None  # speculation is off: vLLM registers these families only when it is on
        if missing:
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY,
                f"model {self._model!r} has some spec_decode families but not {missing}",
            )
        per_position_samples = present[names.SPEC_ACCEPTED_PER_POS]
        per_position = self._per_position(per_position_samples)
        self._check_positions_add_up(present[names.SPEC_ACCEPTED_TOKENS], per_position_samples)
        return SpecDecodeCounters(
            drafts=sum(exposition.checked(s) for s in present[names.SPEC_DRAFTS]),
            draft_tokens=sum(exposition.checked(s) for s in present[names.SPEC_DRAFT_TOKENS]),
            accepted_tokens=sum(exposition.checked(s) for s in present[names.SPEC_ACCEPTED_TOKENS]),
            accepted_per_position=per_position,
        )

    def _per_position(self, samples: list[Sample]) -> tuple[float, ...]:
        totals: dict[int, float] = defaultdict(float)
        for s in samples:
            label = s.labels.get(names.POSITION_LABEL)
            position = _int_label(label)
            if position is None:
                raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"{s.name} has position={label!r}")
            if position >= MAX_POSITIONS:
                raise ScrapeError(
                    ScrapeErrorReason.INVALID_VALUE,
                    f"model {self._model!r}: spec_decode position {position} >= MAX_POSITIONS ({MAX_POSITIONS})",
                )
            totals[position] += exposition.checked(s)
        # A hole would shift every later position; a vanished trailing one is caught by the sum check.
        if sorted(totals) != list(range(len(totals))):
            raise ScrapeError(
                ScrapeErrorReason.INVALID_VALUE,
                f"model {self._model!r}: spec_decode positions {sorted(totals)} are not 0..{len(totals) - 1}",
            )
        return tuple(totals[i] for i in range(len(totals)))

    def _check_positions_add_up(self, accepted: list[Sample], per_position: list[Sample]) -> None:
        """vLLM adds every accepted draft to exactly one accepted total and to per_pos[0..n-1], so per engine
        sum(per_pos) == accepted. A mismatch means a position series is missing (the deployed k would be read too
        small) or the page is corrupt: either way the per-position profile is wrong.
        """
        by_engine: dict[str, float] = defaultdict(float)
        for s in accepted:
            by_engine[_engine(s)] += exposition.checked(s)
        summed: dict[str, float] = defaultdict(float)
        for s in per_position:
            summed[_engine(s)] += exposition.checked(s)
        for engine in sorted(by_engine.keys() | summed.keys()):
            total, positions = by_engine.get(engine, 0.0), summed.get(engine, 0.0)
            if not math.isclose(total, positions, rel_tol=exposition.SUM_REL_TOLERANCE,
                                abs_tol=exposition.SUM_ABS_TOLERANCE):
                raise ScrapeError(
                    ScrapeErrorReason.INVALID_VALUE,
                    f"model {self._model!r} engine {engine!r}: accepted tokens {total:g} != sum over positions "
                    f"{positions:g} (a position series is missing?)",
                )

    # -- KV cache -----------------------------------------------------------------------------------------------

    def _kv_capacity_by_engine(self) -> dict[str, float] | None:
        """KV capacity in tokens per engine from `vllm:cache_config_info`; None when any series cannot say."""
        base = self._base(names.CACHE_CONFIG)
        if base is None:
            return None
        series = self._samples(base) + self._unowned_config
        if not series:
            return None
        capacity: dict[str, float] = {}
        for s in series:
            tokens = _label_number(s, names.KV_SIZE_TOKENS_LABEL)
            if tokens is None:
                blocks = _label_number(s, names.NUM_GPU_BLOCKS_LABEL)
                block_size = _label_number(s, names.BLOCK_SIZE_LABEL)
                if blocks is None or block_size is None:
                    return None
                tokens = blocks * block_size
            if tokens > MAX_KV_CAPACITY_TOKENS:
                raise ScrapeError(ScrapeErrorReason.INVALID_VALUE,
                                  f"{s.name}: a KV capacity of {tokens:g} tokens (over {MAX_KV_CAPACITY_TOKENS:g})")
            capacity[_engine(s)] = tokens
        return capacity

    def _kv_usage(self, capacity_by_engine: Mapping[str, float] | None) -> float | None:
        usage = self._gauge_by_engine(names.KV_CACHE_USAGE)
        if not usage:
            return None
        # Engines have separate KV pools: weight each engine's ratio by its capacity when every one is known.
        if capacity_by_engine is not None and usage.keys() <= capacity_by_engine.keys():
            total_capacity = sum(capacity_by_engine[e] for e in usage)
            if total_capacity > 0:
                return sum(u * capacity_by_engine[e] for e, u in usage.items()) / total_capacity
        return sum(usage.values()) / len(usage)

    # -- histograms ---------------------------------------------------------------------------------------------

    def _histogram(self, field_name: str) -> HistogramReading | None:
        base = self._base(field_name)
        if base is None:
            return None
        sums, counts, buckets = (self._samples(base + suffix) for suffix in ("_sum", "_count", "_bucket"))
        if not (sums or counts or buckets):
            return None
        if not sums or not counts:
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY, f"histogram {base} for {self._model!r} lacks _sum or _count"
            )
        self._note_created(base)
        return exposition.histogram_reading(base, sums, counts, buckets)


# Slack for counters that vLLM updates in different stats records of one engine step (drafts vs generated tokens):
# a step's worth of requests per engine, beyond the relative tolerance.
_STEP_SLACK_PER_ENGINE = 1024.0


def _check_spec_counts(
    spec: SpecDecodeCounters, *, generation_tokens: float | None, engines: int, model: str
) -> None:
    """Raise INVALID_VALUE on spec-decode counters vLLM's accounting cannot produce (module docstring). Each draft
    proposes 1..k tokens, each accepted token was proposed, a verification that accepted i+2 drafts accepted i+1,
    and each verification emits at least one token. Example: drafts 1e308 beside 3e5 generated tokens -> invalid
    (read as it stands, the per-position acceptance would be ~0 and flip a k=4 recommendation to off)."""
    k = spec.deployed_k
    totals = (spec.drafts, spec.draft_tokens, spec.accepted_tokens, *spec.accepted_per_position)
    problem = ""
    if not all(math.isfinite(t) for t in totals):
        problem = "a spec_decode sum over engines is not finite"
    elif spec.accepted_tokens > exposition.with_tolerance(spec.draft_tokens):
        problem = f"accepted tokens {spec.accepted_tokens:g} > draft tokens {spec.draft_tokens:g}"
    elif k and spec.draft_tokens > exposition.with_tolerance(k * spec.drafts):
        problem = f"draft tokens {spec.draft_tokens:g} > k={k} x drafts {spec.drafts:g}"
    elif k and spec.accepted_per_position[0] > exposition.with_tolerance(spec.drafts):
        problem = f"position 0 accepted {spec.accepted_per_position[0]:g} > drafts {spec.drafts:g}"
    elif any(b > exposition.with_tolerance(a) for a, b in itertools.pairwise(spec.accepted_per_position)):
        problem = f"per-position accepted counts rise with the position: {spec.accepted_per_position}"
    elif generation_tokens is not None and spec.drafts > (
        exposition.with_tolerance(generation_tokens) + _STEP_SLACK_PER_ENGINE * engines
    ):
        problem = f"drafts {spec.drafts:g} > generated tokens {generation_tokens:g}"
    if problem:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"model {model!r}: {problem}")


def _at_most_one(generation_tokens: HistogramReading | None) -> float | None:
    """Finished requests with at most one output token: the `le="1.0"` bucket of vLLM's request_generation_tokens
    (its buckets are 1, 2, 5, 10, ...). None without that bucket: an exporter with other bounds cannot say."""
    if generation_tokens is None:
        return None
    return next((count for le, count in generation_tokens.buckets if le == 1.0), None)


def _int_label(label: str | None) -> int | None:
    if label is None or not (label.isascii() and label.isdigit()):
        return None
    return int(label)


def _label_number(sample: Sample, label: str) -> float | None:
    """A numeric label of an info series; None when absent or not a number (vLLM writes "None" when unset)."""
    raw = sample.labels.get(label)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"{sample.name} has {label}={raw!r}")
    return value
