"""Fleet mode: one model's vLLM series read from a Prometheus HTTP API across all its replicas, handed to the
estimator as the same `EngineSnapshot` a pod scrape gives, so nothing downstream changes.

Each scrape runs these instant queries (GET /api/v1/query, all at one evaluation time, `sel` = the model's
`model_name` matcher plus the target's selector, `w` = `rate_window_s`; names come from service/sources/names.py,
a renamed family is one more candidate there, joined here with `or`):
    counters    sum by (model_name) (rate(<counter>_total{sel}[w]))     drafts, draft tokens, accepted, generation
                                                                         and prompt tokens
    per position  sum by (model_name, position) (rate(<per_pos>_total{sel}[w]))
    histograms  sum by (model_name) (rate(<h>_sum{sel}[w])), and _count  inter-token latency, iteration tokens,
                                                                         time to first token
    per GPU     avg by (model_name) (rate(<estimated_*>_total{sel}[w]))  vLLM's own roofline counters
    gauges      avg by (model_name) (<gauge>{sel})                       running, waiting, KV usage
    KV size     <cache_config_info>{cfg} and on (instance, engine) <running>{sel}   labels -> tokens, averaged
Counters are fleet sums: acceptance is a ratio of counts, and every replica's drafts are evidence (the intervals
narrow with the fleet). Gauges are per-replica means (one series per replica, or per engine under data
parallelism): the cost model prices one engine's step at its own batch, and a batch summed over ten replicas
would be priced as one engine ten times as busy. The step time (ITL Δsum / Δcount over the fleet) is then the
mean step of a replica, weighted by its samples, at that mean batch.

Every rate becomes a synthetic monotone cumulative counter: value += rate x (now - its previous reading). The first
scrape seeds each counter with rate x w and dates the counters' epoch (`created_s`) w before it, so the
estimator's cold start reads exactly the rates over the window (flagged cold_start); so does the first scrape
after the speculative families changed shape (turned on or off, another k), which the estimator would treat as
a new baseline anyway. Replica restarts need nothing here: Prometheus' rate() absorbs counter resets. A counter
that drops out of the answers for a while keeps its value and resumes from it (monotone: never a false reset),
its gap priced at the rate it comes back with. A first counter appearing later starts from 0 at that scrape.

Failure policy (every failure is a `ScrapeError`, which the loop turns into `stale` with the reason, then
`error`; never a decision):
- CONNECT / TIMEOUT / PROTOCOL / BODY_TOO_LARGE: Prometheus unreachable, slower than `timeout_s` for the
  whole set of queries, broke HTTP, or an answer over `max_body_bytes`.
- HTTP_STATUS: a non-2xx answer (Prometheus' errorType and error are quoted: a bad selector is `bad_data`).
- PARSE: not JSON, status not success, or not an instant vector.
- MODEL_MISSING: no running/waiting series for the model under the selector (wrong model or selector, or every
  replica is down: Prometheus marks a failed target's series stale at once).
- MISSING_FAMILY: some speculative families but not all, or counters present whose rate() is empty (fewer
  than two samples in `w`: the rate window is shorter than two Prometheus scrape intervals).
- INVALID_VALUE: NaN, Inf or a negative number where a count, a rate or a ratio is expected; bad positions.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import httpx

from policies.types import EngineSnapshot, HistogramReading, SpecDecodeCounters
from service.sources import names
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.page import read_capped
from service.sources.vllm import MAX_POSITIONS

NAMING = "prometheus-fleet"
"""`EngineSnapshot.naming` of a fleet snapshot (shown with the evidence: where the numbers came from)."""

QUERY_PATH = "/api/v1/query"
# Queries in flight at once per source: the HTTP pool is shared with the other targets.
MAX_CONCURRENT_QUERIES = 4

# Canonical names of the synthetic counters (fields of EngineSnapshot, and one per position).
_DRAFTS, _DRAFT_TOKENS, _ACCEPTED = "drafts", "draft_tokens", "accepted"
_GENERATION, _PROMPT = "generation_tokens", "prompt_tokens"
_ITL_SUM, _ITL_COUNT = "itl_sum", "itl_count"
_ITER_SUM, _ITER_COUNT = "iteration_sum", "iteration_count"
_FIRST_SUM, _FIRST_COUNT = "first_token_sum", "first_token_count"
_FLOPS, _READ_BYTES = "estimated_flops", "estimated_read_bytes"
_RUNNING, _WAITING, _KV_USAGE, _KV_CONFIG = "running", "waiting", "kv_usage", "kv_config"
_PER_POSITION = "per_position"
_SPEC_RATES = (_DRAFTS, _DRAFT_TOKENS, _ACCEPTED)


@dataclass(frozen=True, slots=True)
class _Sample:
    labels: Mapping[str, str]
    value: float


def promql_duration(seconds: float) -> str:
    """A PromQL range duration: whole seconds as "60s", anything finer in milliseconds ("2500ms")."""
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def label_matchers(model: str, selector: str) -> str:
    """The label matchers inside `{}`: the model's `model_name` (escaped) and the target's selector."""
    escaped = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    own = f'{names.MODEL_LABEL}="{escaped}"'
    return f"{own}, {selector.strip().rstrip(',')}" if selector.strip() else own


def fleet_queries(*, model: str, selector: str, rate_window_s: float) -> dict[str, str]:
    """Every query one scrape runs, by the canonical name of what it reads (module docstring)."""
    sel = label_matchers(model, selector)
    window = promql_duration(rate_window_s)
    by_model = f"by ({names.MODEL_LABEL})"

    def either(exprs: Sequence[str]) -> str:
        # Preferred (newest) name first: `or` keeps its series and adds an older name's only where it is absent.
        return " or ".join(f"({e})" for e in exprs) if len(exprs) > 1 else exprs[0]

    def counter(field: str, *, op: str = "sum", by: str = by_model) -> str:
        family = names.VLLM_FAMILIES[field]
        return either([
            f"{op} {by} (rate({sample}{{{sel}}}[{window}]))"
            for base in family.candidates
            for sample in family.value_names(base)
        ])

    def histogram(field: str, suffix: str) -> str:
        family = names.VLLM_FAMILIES[field]
        return either([f"sum {by_model} (rate({base}{suffix}{{{sel}}}[{window}]))" for base in family.candidates])

    def gauge(field: str) -> str:
        return either([f"avg {by_model} ({base}{{{sel}}})" for base in names.VLLM_FAMILIES[field].candidates])

    running = either([f"{base}{{{sel}}}" for base in names.VLLM_FAMILIES[names.NUM_REQUESTS_RUNNING].candidates])
    # cache_config_info carries no model_name on vLLM 0.32: keep the selector's own matchers and pair each series
    # with an engine that serves the model (same scrape target and engine).
    config_sel = selector.strip().rstrip(",")
    kv_config = either([
        f"{base}{{{config_sel}}} and on (instance, {names.ENGINE_LABEL}) ({running})"
        for base in names.VLLM_FAMILIES[names.CACHE_CONFIG].candidates
    ])
    return {
        _DRAFTS: counter(names.SPEC_DRAFTS),
        _DRAFT_TOKENS: counter(names.SPEC_DRAFT_TOKENS),
        _ACCEPTED: counter(names.SPEC_ACCEPTED_TOKENS),
        _PER_POSITION: counter(names.SPEC_ACCEPTED_PER_POS, by=f"by ({names.MODEL_LABEL}, {names.POSITION_LABEL})"),
        _GENERATION: counter(names.GENERATION_TOKENS),
        _PROMPT: counter(names.PROMPT_TOKENS),
        _ITL_SUM: histogram(names.INTER_TOKEN_LATENCY, "_sum"),
        _ITL_COUNT: histogram(names.INTER_TOKEN_LATENCY, "_count"),
        _ITER_SUM: histogram(names.ITERATION_TOKENS, "_sum"),
        _ITER_COUNT: histogram(names.ITERATION_TOKENS, "_count"),
        _FIRST_SUM: histogram(names.FIRST_TOKEN_LATENCY, "_sum"),
        _FIRST_COUNT: histogram(names.FIRST_TOKEN_LATENCY, "_count"),
        _FLOPS: counter(names.ESTIMATED_FLOPS, op="avg"),
        _READ_BYTES: counter(names.ESTIMATED_READ_BYTES, op="avg"),
        _RUNNING: gauge(names.NUM_REQUESTS_RUNNING),
        _WAITING: gauge(names.NUM_REQUESTS_WAITING),
        _KV_USAGE: gauge(names.KV_CACHE_USAGE),
        _KV_CONFIG: kv_config,
    }


def counters_present_query(*, model: str, selector: str) -> str:
    """Whether the model's drafts counter exists at all (asked only when its rate() came back empty)."""
    sel = label_matchers(model, selector)
    family = names.VLLM_FAMILIES[names.SPEC_DRAFTS]
    return " or ".join(
        f"count by ({names.MODEL_LABEL}) ({sample}{{{sel}}})"
        for base in family.candidates
        for sample in family.value_names(base)
    )


# ------------------------------------------------------------------------------------------------------------
# Answers -> samples
# ------------------------------------------------------------------------------------------------------------


def parse_vector(body: bytes, *, what: str) -> list[_Sample]:
    """The samples of a Prometheus instant-vector answer (`status` success); `what` names the query in errors.

    Values are kept as Prometheus wrote them ("NaN", "+Inf" included): each reader validates what it uses.
    """
    try:
        document: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ScrapeError(ScrapeErrorReason.PARSE, f"{what}: answer is not JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("status") != "success":
        raise ScrapeError(ScrapeErrorReason.PARSE, f"{what}: answer is not a success: {_error_text(document)}")
    data = document.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        kind = data.get("resultType") if isinstance(data, dict) else None
        raise ScrapeError(ScrapeErrorReason.PARSE, f"{what}: answer is not an instant vector (resultType {kind!r})")
    samples: list[_Sample] = []
    for item in data["result"]:
        metric = item.get("metric") if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        if (
            not isinstance(metric, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items())
            or not isinstance(value, list)
            or len(value) != 2
            or not isinstance(value[1], str)
        ):
            raise ScrapeError(ScrapeErrorReason.PARSE, f"{what}: malformed sample {item!r:.200}")
        try:
            number = float(value[1])
        except ValueError as exc:
            raise ScrapeError(ScrapeErrorReason.PARSE, f"{what}: sample value {value[1]!r} is not a number") from exc
        samples.append(_Sample(labels=metric, value=number))
    return samples


def _error_text(document: Any) -> str:
    if isinstance(document, dict):
        kind, error = document.get("errorType"), document.get("error")
        if error is not None:
            return f"{kind}: {error}" if kind else str(error)
        return f"status {document.get('status')!r}"
    return f"{type(document).__name__} at the top level"


def _checked(value: float, what: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"{what} = {value}")
    return value


def _one(samples: Sequence[_Sample], *, model: str, what: str) -> float | None:
    """The model's value in a `by (model_name)` answer; None when the answer holds none."""
    values = [s.value for s in samples if s.labels.get(names.MODEL_LABEL) == model]
    if not values:
        return None
    if len(values) > 1:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"{what}: {len(values)} series for model {model!r}")
    return _checked(values[0], f"{what} for {model!r}")


def _per_position(samples: Sequence[_Sample], *, model: str) -> dict[int, float]:
    rates: dict[int, float] = {}
    for s in samples:
        if s.labels.get(names.MODEL_LABEL) != model:
            continue
        label = s.labels.get(names.POSITION_LABEL, "")
        if not (label.isascii() and label.isdigit()) or int(label) >= MAX_POSITIONS:
            raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"per-position rate with position={label!r}")
        if int(label) in rates:
            raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"per-position rate: position {label} twice")
        rates[int(label)] = _checked(s.value, f"per-position rate at position {label}")
    if sorted(rates) != list(range(len(rates))):
        raise ScrapeError(
            ScrapeErrorReason.INVALID_VALUE, f"model {model!r}: positions {sorted(rates)} are not 0..{len(rates) - 1}"
        )
    return rates


def _kv_capacity_tokens(samples: Sequence[_Sample]) -> float | None:
    """Mean KV capacity per engine (tokens) from cache_config_info labels; None when any series cannot say."""
    sizes: list[float] = []
    for s in samples:
        tokens = _label_number(s, names.KV_SIZE_TOKENS_LABEL)
        if tokens is None:
            blocks, block_size = _label_number(s, names.NUM_GPU_BLOCKS_LABEL), _label_number(s, names.BLOCK_SIZE_LABEL)
            if blocks is None or block_size is None:
                return None
            tokens = blocks * block_size
        sizes.append(tokens)
    return sum(sizes) / len(sizes) if sizes else None


def _label_number(sample: _Sample, label: str) -> float | None:
    raw = sample.labels.get(label)
    try:
        value = float(raw) if raw is not None else math.nan
    except ValueError:
        return None  # vLLM writes "None" for an unset value
    return value if math.isfinite(value) and value >= 0 else None


# ------------------------------------------------------------------------------------------------------------
# The source
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FleetRates:
    """One scrape's readings for the model: rates per second (None: the answer was empty) and gauges."""

    rates: Mapping[str, float]
    per_position: Mapping[int, float]
    running: float
    waiting: float
    kv_usage_ratio: float | None
    kv_capacity_tokens: float | None


@dataclass(frozen=True, slots=True)
class FleetSelection:
    """Which series a fleet source reads: those of `model` (its `model_name` label) narrowed by `selector` (more
    PromQL label matchers, e.g. `namespace="prod"`), with counters read as rates over `rate_window_s` seconds."""

    model: str
    selector: str = ""
    rate_window_s: float = 60.0


class PrometheusFleetSource:
    """Reads one model's replicas from Prometheus; `scrape(now_s)` has `EngineScraper.scrape`'s shape and contract
    (returns {model: EngineSnapshot}, raises only `ScrapeError`). Holds the synthetic counters between scrapes,
    so one instance serves one target. The HTTP client is injected (one pool per process).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        prometheus_url: str,
        fleet: FleetSelection,
        *,
        timeout_s: float = 4.0,
        max_body_bytes: int = 8 * 1024 * 1024,
        auth: httpx.Auth | None = None,
    ) -> None:
        if not fleet.rate_window_s > 0 or not timeout_s > 0:
            raise ValueError("rate_window_s and timeout_s must be > 0")
        self._client = client
        self._url = prometheus_url.rstrip("/") + QUERY_PATH
        self._model = fleet.model
        self._selector = fleet.selector
        self._rate_window_s = fleet.rate_window_s
        self._timeout_s = timeout_s
        self._max_body_bytes = max_body_bytes
        self._auth = auth
        self._queries = fleet_queries(model=fleet.model, selector=fleet.selector, rate_window_s=fleet.rate_window_s)
        self._limit = asyncio.Semaphore(MAX_CONCURRENT_QUERIES)
        # The synthetic counters: name -> cumulative value, when each was last advanced, and their epoch.
        self._counters: dict[str, float] = {}
        self._advanced_s: dict[str, float] = {}
        self._created_s: float | None = None
        self._shape: tuple[bool, int] | None = None  # (speculation on, k) the counters were seeded for

    @property
    def queries(self) -> Mapping[str, str]:
        return dict(self._queries)

    async def scrape(self, now_s: float) -> dict[str, EngineSnapshot]:
        """Query Prometheus at `now_s` (Unix seconds, also the snapshot's `taken_at_s`) and advance the counters."""
        readings = await self.read(now_s)
        return {self._model: self._advance(readings, now_s)}

    async def read(self, now_s: float) -> FleetRates:
        """One round of queries at `now_s`, validated (module docstring for the failures)."""
        answers = await self._query_all(self._queries, now_s)
        model = self._model
        running = _one(answers[_RUNNING], model=model, what="vllm:num_requests_running")
        waiting = _one(answers[_WAITING], model=model, what="vllm:num_requests_waiting")
        if running is None or waiting is None:
            where = f" with {self._selector}" if self._selector.strip() else ""
            raise ScrapeError(
                ScrapeErrorReason.MODEL_MISSING,
                f"Prometheus has no running/waiting series for model {model!r}{where}: wrong model or selector, "
                "or no replica is being scraped",
            )
        rates: dict[str, float] = {}
        for name in (_DRAFTS, _DRAFT_TOKENS, _ACCEPTED, _GENERATION, _PROMPT, _ITL_SUM, _ITL_COUNT, _ITER_SUM,
                     _ITER_COUNT, _FIRST_SUM, _FIRST_COUNT, _FLOPS, _READ_BYTES):
            value = _one(answers[name], model=model, what=f"rate of {name}")
            if value is not None:
                rates[name] = value
        per_position = _per_position(answers[_PER_POSITION], model=model)
        await self._check_spec(rates, per_position, now_s)
        usage = _one(answers[_KV_USAGE], model=model, what="KV cache usage")
        if usage is not None and usage > 1.0:
            raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"KV cache usage {usage} > 1 for {model!r}")
        return FleetRates(
            rates=rates,
            per_position=per_position,
            running=running,
            waiting=waiting,
            kv_usage_ratio=usage,
            kv_capacity_tokens=_kv_capacity_tokens(answers[_KV_CONFIG]),
        )

    async def _check_spec(self, rates: Mapping[str, float], per_position: Mapping[int, float], now_s: float) -> None:
        present = [name for name in _SPEC_RATES if name in rates] + ([_PER_POSITION] if per_position else [])
        if present and len(present) < len(_SPEC_RATES) + 1:
            missing = sorted({*_SPEC_RATES, _PER_POSITION} - set(present))
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY,
                f"model {self._model!r}: rates of some speculative families but not {missing}",
            )
        if present:
            return
        # No speculative rate: speculation is off, unless the counters exist and rate() had too few samples.
        query = {"present": counters_present_query(model=self._model, selector=self._selector)}
        if (await self._query_all(query, now_s))["present"]:
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY,
                f"model {self._model!r}: speculative counters exist but rate() over "
                f"{promql_duration(self._rate_window_s)} is empty (under two samples): make rate_window_s at least "
                "twice Prometheus' scrape interval",
            )

    # -- synthetic counters -------------------------------------------------------------------------------------

    def _advance(self, readings: FleetRates, now_s: float) -> EngineSnapshot:
        rates = dict(readings.rates)
        for position, rate in readings.per_position.items():
            rates[f"{_PER_POSITION}[{position}]"] = rate
        shape = (_DRAFTS in rates, len(readings.per_position))
        if self._created_s is None or shape != self._shape:
            # A cold start: the counters hold what the rates say happened over the last window.
            self._counters = {name: rate * self._rate_window_s for name, rate in rates.items()}
            self._advanced_s = dict.fromkeys(rates, now_s)
            self._created_s = now_s - self._rate_window_s
            self._shape = shape
        else:
            for name, rate in rates.items():
                # Since this counter's own last reading: one missing from an answer for a while resumes with the
                # rate it has now over the gap, instead of counting nothing for it.
                elapsed_s = max(0.0, now_s - self._advanced_s.get(name, now_s))
                self._counters[name] = self._counters.get(name, 0.0) + rate * elapsed_s
                self._advanced_s[name] = now_s
        counters = self._counters

        def value(name: str) -> float | None:
            return counters[name] if name in rates else None

        def histogram(sum_name: str, count_name: str) -> HistogramReading | None:
            total, count = value(sum_name), value(count_name)
            return None if total is None or count is None else HistogramReading(sum=total, count=count)

        spec = None
        if shape[0]:
            spec = SpecDecodeCounters(
                drafts=counters[_DRAFTS],
                draft_tokens=counters[_DRAFT_TOKENS],
                accepted_tokens=counters[_ACCEPTED],
                accepted_per_position=tuple(counters[f"{_PER_POSITION}[{i}]"] for i in range(shape[1])),
            )
        return EngineSnapshot(
            taken_at_s=now_s,
            model_name=self._model,
            engines=1,  # the fleet reads as one engine: replica counts come and go without a new baseline
            spec=spec,
            num_requests_running=readings.running,
            num_requests_waiting=readings.waiting,
            created_s=self._created_s,
            kv_cache_usage_ratio=readings.kv_usage_ratio,
            kv_cache_capacity_tokens=readings.kv_capacity_tokens,
            generation_tokens=value(_GENERATION),
            prompt_tokens=value(_PROMPT),
            inter_token_latency=histogram(_ITL_SUM, _ITL_COUNT),
            iteration_tokens=histogram(_ITER_SUM, _ITER_COUNT),
            first_token_latency=histogram(_FIRST_SUM, _FIRST_COUNT),
            estimated_flops=value(_FLOPS),
            estimated_read_bytes=value(_READ_BYTES),
            naming=NAMING,
        )

    # -- HTTP ---------------------------------------------------------------------------------------------------

    async def _query_all(self, queries: Mapping[str, str], now_s: float) -> dict[str, list[_Sample]]:
        """Run `queries` concurrently (at most MAX_CONCURRENT_QUERIES at once), all evaluated at `now_s`, within
        one `timeout_s` for the lot; the first failure cancels the rest."""
        try:
            async with asyncio.timeout(self._timeout_s):
                async with asyncio.TaskGroup() as group:
                    tasks = {name: group.create_task(self._query(name, expr, now_s)) for name, expr in queries.items()}
        except TimeoutError as exc:
            raise ScrapeError(
                ScrapeErrorReason.TIMEOUT, f"{self._url}: no complete answer within {self._timeout_s} s"
            ) from exc
        except ExceptionGroup as failures:
            _raise_first_scrape_error(failures)
        return {name: task.result() for name, task in tasks.items()}

    async def _query(self, name: str, expr: str, now_s: float) -> list[_Sample]:
        params = {"query": expr, "time": f"{now_s:.3f}", "timeout": promql_duration(self._timeout_s)}
        async with self._limit:
            body = await self._get(params, what=name)
        return parse_vector(body, what=f"query {name}")

    async def _get(self, params: Mapping[str, str], *, what: str) -> bytes:
        url = self._url
        try:
            # auth None: no credentials besides a URL's userinfo (httpx sends that as basic auth).
            async with self._client.stream(
                "GET", url, params=params, timeout=self._timeout_s, auth=self._auth
            ) as response:
                body = await self._read_capped(response)
        except httpx.TimeoutException as exc:
            raise ScrapeError(ScrapeErrorReason.TIMEOUT, f"{url} ({what}): {type(exc).__name__}") from exc
        except (httpx.ConnectError, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise ScrapeError(ScrapeErrorReason.CONNECT, f"{url}: {exc}") from exc
        except httpx.LocalProtocolError as exc:  # our own request was refused: its text may quote our headers
            raise ScrapeError(ScrapeErrorReason.PROTOCOL, f"{url} ({what}): the request could not be sent "
                              f"({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise ScrapeError(ScrapeErrorReason.PROTOCOL, f"{url} ({what}): {type(exc).__name__}: {exc}") from exc
        if not response.is_success:
            try:
                detail = _error_text(json.loads(body))
            except (ValueError, UnicodeDecodeError):
                detail = body[:200].decode("utf-8", errors="replace").strip() or response.reason_phrase
            raise ScrapeError(
                ScrapeErrorReason.HTTP_STATUS, f"{url} ({what}): HTTP {response.status_code}: {detail}"
            )
        return body

    async def _read_capped(self, response: httpx.Response) -> bytes:
        return await read_capped(response, max_body_bytes=self._max_body_bytes, url=self._url)


def _raise_first_scrape_error(failures: ExceptionGroup[Exception]) -> NoReturn:
    scrape_errors, others = failures.split(ScrapeError)
    if others is not None or scrape_errors is None:
        raise failures  # something other than a scrape failure is a bug: let the loop report it as one
    first: BaseException = scrape_errors
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    raise first
