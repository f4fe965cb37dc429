"""Estimate: a sliding window of engine snapshots -> Evidence with uncertainty.

Two pure functions, with the window carried in an explicit state value:

- `observe(state, snapshot, config)` appends a scrape, trims the window and starts a new baseline when the
  server's counters were reset or its speculation config changed, so no delta ever spans two counter epochs.
- `estimate(state, target=..., config=..., now_s=...)` turns the counter deltas between the oldest kept
  snapshot and the newest into acceptance per position (with Wilson intervals), mean accepted length, batch,
  sequences decoding per step, context per sequence, step time and throughput rates.

Choices worth knowing:
- Per-position acceptance is repaired to be non-increasing with the pool-adjacent-violators algorithm on the
  counts. All positions share one denominator (drafts), so this is the least-squares (and binomial
  maximum-likelihood) non-increasing fit: a violating pair is replaced by its average instead of pulling every
  later position down to the smallest value, as a running minimum would. vLLM's counters are nested by
  construction (per_pos[i] <= per_pos[i-1] <= drafts), so a violation only comes from scrape skew or summing
  engines, and is small.
- Cold start: with a single snapshot (first scrape, or first after a reset) the lifetime counters are a valid
  window from the server's `created_s` to the scrape; the acceptance is flagged `cold_start=True`. The cold
  start lasts until the window can stand on its own: while the window is younger than `window_s` and holds
  fewer than `min_drafts` drafts, the acceptance keeps using the span since the counters' baseline (the lifetime
  since `created_s`, which contains the window) rather than the thin window. Otherwise the second scrape after
  start-up, holding one scrape interval of drafts, would flip an ok cold start to insufficient_data and back
  once the window filled. Only the acceptance falls back: step time and rates from even one interval are fresh
  measurements, where lifetime averages could span days.
- Two batches. `batch` is the running-requests gauge averaged over the window's scrapes: what dashboards show,
  but it averages in idle time between scrapes and requests still prefilling, so on a load ramp it misstates the
  batch the engine steps ran at (on the simulator 131.9 running on average where the steps held 70.0 decoding).
  `decode_seqs_per_step` = Δ(ITL histogram count) / Δ(iteration-tokens histogram count) counts it from the
  engine's own per-step records: vLLM v1 (`IterationStats.update_from_output`, `PrometheusStatLogger.record`)
  observes one inter-token latency per request per step that gave that request tokens, its first token
  excluded (that one is a time-to-first-token), and one iteration-tokens value per batch of engine outputs
  (a step that emitted at least one token; a chunked-prefill step that emitted nothing is not counted). Both are
  summed over data-parallel engines, so the ratio is per engine step, where the running gauge is the engines'
  sum. The cost model reads the per-step one (policies/model/costmodel.py `operating_point`).
- Speculation off (`spec is None`) is state OK with `acceptance=None`: nothing is wrong, there is just nothing
  to measure. The decision layer decides what "no acceptance measured" means (e.g. a remembered profile).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from policies import iid
from policies.estimate.intervals import wilson_interval
from policies.types import (
    AcceptanceEvidence,
    DataState,
    EngineSnapshot,
    Evidence,
    GpuSnapshot,
    HistogramReading,
)

# Below half a running request the "context per sequence" division is dominated by noise (and idle servers
# report 0 running with a few KV blocks still cached).
_MIN_BATCH_FOR_CONTEXT = 0.5


@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    """How the estimator windows and judges its evidence.

    `window_s` (s, > 0): sliding window for counter deltas. `min_drafts` (>= 0): drafts needed in the window
    before the acceptance is trusted; below it the state is INSUFFICIENT_DATA. `z` (> 0): normal quantile of
    the two-sided interval (1.96 ~ 95 %). `stale_after_s` (s, > 0): the newest snapshot older than this is
    STALE.
    """

    window_s: float = 60.0
    min_drafts: int = 200
    z: float = 1.96
    stale_after_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")
        if self.min_drafts < 0:
            raise ValueError(f"min_drafts must be >= 0, got {self.min_drafts}")
        if not self.z > 0:
            raise ValueError(f"z must be > 0, got {self.z}")
        if not self.stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0, got {self.stale_after_s}")


@dataclass(frozen=True, slots=True)
class EstimatorState:
    """The snapshots of one target still inside the window, oldest first, all from one counter epoch."""

    snapshots: tuple[EngineSnapshot, ...] = ()


# ------------------------------------------------------------------------------------------------------------
# observe
# ------------------------------------------------------------------------------------------------------------


def observe(state: EstimatorState, snapshot: EngineSnapshot, config: EstimatorConfig) -> EstimatorState:
    """Add one scrape to the window; start a new baseline when the counters cannot be differenced.

    Units: `snapshot.taken_at_s` is Unix seconds; the window ends at the newest snapshot's time (observe has
    no clock). A new baseline (history = just `snapshot`) starts when the model, the engine count, `created_s`
    (when both are known), the deployed k or speculation on/off changed, or any counter used by `estimate`
    decreased. A snapshot not newer than the newest kept one (duplicate or out-of-order scrape) is ignored.
    Snapshots older than `now - window_s` are dropped, except the newest of them, kept as the base so the
    deltas cover the whole window.

    Worked example (window 60 s): snapshots at t = 0, 30, 60, then 90 arrives. Cutoff = 90 - 60 = 30; the
    newest snapshot at or before 30 is t = 30, so t = 0 is dropped and the window is (30, 60, 90), covering
    60 s. If the t = 90 scrape shows drafts = 12 after drafts = 540 at t = 60, the server restarted: the state
    becomes just (90,) and the next estimate is a cold start.
    """
    if not state.snapshots:
        return EstimatorState(snapshots=(snapshot,))
    newest = state.snapshots[-1]
    if snapshot.taken_at_s <= newest.taken_at_s:
        return state
    if _baseline_break(newest, snapshot) is not None:
        return EstimatorState(snapshots=(snapshot,))
    history = (*state.snapshots, snapshot)
    cutoff_s = snapshot.taken_at_s - config.window_s
    base_index = 0
    for index, kept in enumerate(history):
        if kept.taken_at_s <= cutoff_s:
            base_index = index
    return EstimatorState(snapshots=history[base_index:])


def _baseline_break(previous: EngineSnapshot, current: EngineSnapshot) -> str | None:
    """Why `current` cannot be differenced against `previous`, or None when it can."""
    return (
        _server_break(previous, current) or _speculation_break(previous, current)
        or _counter_break(previous, current)
    )


def _server_break(previous: EngineSnapshot, current: EngineSnapshot) -> str | None:
    """Another model, another engine count, or a restarted server (None: the same one)."""
    if current.model_name != previous.model_name:
        return f"model changed {previous.model_name!r} -> {current.model_name!r}"
    if current.engines != previous.engines:
        return f"engine count changed {previous.engines} -> {current.engines}"
    # A missing created_s (an exporter without *_created) is not evidence of a restart; the decrease check
    # below still catches restarts that happen between scrapes.
    known = previous.created_s is not None and current.created_s is not None
    if known and current.created_s != previous.created_s:
        return "counters re-created (server restart)"
    return None


def _speculation_break(previous: EngineSnapshot, current: EngineSnapshot) -> str | None:
    """Speculation turned on or off, its deployed k changed, or its counters changed shape (None: none)."""
    if (previous.spec is None) != (current.spec is None):
        return "speculation turned " + ("on" if current.spec is not None else "off")
    if (
        previous.spec is not None
        and current.spec is not None
        and previous.spec.deployed_k != current.spec.deployed_k
        # Totals-only counters (SGLang) run on across a k change (its adaptive tiers change k batch by batch):
        # the window's mean is then mixed over the tiers and priced at the newest k.
        and (previous.spec.positions_measured or current.spec.positions_measured)
    ):
        return f"deployed k changed {previous.spec.deployed_k} -> {current.spec.deployed_k}"
    if (
        previous.spec is not None
        and current.spec is not None
        and previous.spec.positions_measured != current.spec.positions_measured
    ):
        return "the engine's acceptance counters changed shape (per position <-> total only)"
    return None


def _counter_break(previous: EngineSnapshot, current: EngineSnapshot) -> str | None:
    """A monotone counter that went down (None: none did)."""
    before = _counters(previous)
    after = _counters(current)
    for name, value in after.items():
        if name in before and value < before[name]:
            return f"counter {name} decreased {before[name]:g} -> {value:g}"
    return None


def _counters(snapshot: EngineSnapshot) -> dict[str, float]:
    """Every monotone counter `estimate` differences, by a stable name."""
    values: dict[str, float] = {}
    if snapshot.spec is not None:
        values["drafts"] = snapshot.spec.drafts
        values["draft_tokens"] = snapshot.spec.draft_tokens
        values["accepted_tokens"] = snapshot.spec.accepted_tokens
        for position, count in enumerate(snapshot.spec.accepted_per_position):
            values[f"accepted_per_position[{position}]"] = count
        for position, count in enumerate(snapshot.spec.drafted_per_position):
            values[f"drafted_per_position[{position}]"] = count
    scalars = {
        "generation_tokens": snapshot.generation_tokens,
        "prompt_tokens": snapshot.prompt_tokens,
        "estimated_flops": snapshot.estimated_flops,
        "estimated_read_bytes": snapshot.estimated_read_bytes,
        "single_token_requests": snapshot.single_token_requests,
    }
    values.update({name: value for name, value in scalars.items() if value is not None})
    histograms = {
        "inter_token_latency": snapshot.inter_token_latency,
        "iteration_tokens": snapshot.iteration_tokens,
        "request_itl": snapshot.request_itl,
        "first_token_latency": snapshot.first_token_latency,
    }
    for name, histogram in histograms.items():
        if histogram is not None:
            values[f"{name}.sum"] = histogram.sum
            values[f"{name}.count"] = histogram.count
    return values


# ------------------------------------------------------------------------------------------------------------
# estimate
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Span:
    """The two ends the deltas are taken between. `base is None` is a cold start: counters count from zero at
    the server's `created_s`, so the newest value is itself the delta."""

    base: EngineSnapshot | None
    newest: EngineSnapshot
    elapsed_s: float | None

    def delta(self, read: Callable[[EngineSnapshot], float | None]) -> float | None:
        end = read(self.newest)
        if end is None:
            return None
        if self.base is None:
            return max(0.0, end)
        start = read(self.base)
        if start is None:
            return None
        return max(0.0, end - start)

    def rate(self, read: Callable[[EngineSnapshot], float | None]) -> float | None:
        change = self.delta(read)
        if change is None or self.elapsed_s is None or self.elapsed_s <= 0:
            return None
        return change / self.elapsed_s


def estimate(
    state: EstimatorState,
    *,
    target: str,
    config: EstimatorConfig,
    now_s: float,
    gpu: GpuSnapshot | None = None,
) -> Evidence:
    """Evidence for one target from the window in `state`, judged at `now_s` (Unix seconds).

    Deltas run from the oldest kept snapshot to the newest. A single snapshot is a cold start from lifetime
    counters. The acceptance (and the state it decides) stays a cold start while the window is younger than
    `config.window_s` and holds fewer than `config.min_drafts` drafts: it is then measured over the newest
    snapshot's lifetime counters (`cold_start=True`, `acceptance.window_s` = the lifetime), while step time,
    rates, batch and waiting, which need no minimum count, come from the window.

    Outputs and units: `acceptance.per_position[i]` = r_{i+1} = Δper_pos[i] / Δdrafts in [0, 1], non-increasing,
    with Wilson intervals at `config.z`; `mean_acceptance_length` = 1 + Δaccepted / Δdrafts (tokens per
    verification, in [1, k+1]); `acceptance_rate` = Δaccepted / Δdraft_tokens in [0, 1]; `mean_proposed_length` =
    Δdraft_tokens / Δdrafts (<= k); `draft_coverage` = Δdrafts / ΔITL count in (0, 1] (`_coverage`). `batch`,
    `waiting`: mean over the window's snapshots (requests).
    `context_tokens_per_seq` = KV usage ratio x KV capacity (tokens) / running requests, all from the newest
    snapshot. `step_time_s` = ITL Δsum / Δcount (s). Rates are Δcounter / Δt (per second). `prefill_tokens_per_step`
    = Δprompt_tokens / Δiteration_tokens.count (tokens per engine step); `prompt_tokens_per_request` =
    Δprompt_tokens / Δtime_to_first_token.count (tokens per prefilled prompt). `decode_seqs_per_step` = Δinter-token-
    latency count / Δiteration_tokens.count (sequences per engine step, >= 0; see `_decode_seqs_per_step`).
    State: STALE when there is no snapshot or the newest is older than `stale_after_s`; else
    INSUFFICIENT_DATA when speculation is on with fewer than `min_drafts` drafts; else OK (speculation off is
    OK, with acceptance None).

    Worked example (vLLM 0.32 CPU n-gram k=3, one scrape 100 s after start): drafts = 540, draft_tokens =
    1505, accepted = 1415, per_pos = (515, 465, 435). Cold start over 100 s: r = (515/540, 465/540, 435/540) =
    (0.9537, 0.8611, 0.8056); E[L] = 1 + 1415/540 = 3.620; acceptance rate = 1415/1505 = 0.9402;
    mean proposed = 1505/540 = 2.787; 540 >= 200 drafts, so state OK with `cold_start=True`. A second scrape
    5 s later with 20 more drafts (560, per_pos (535, 483, 452)): the 5 s window holds 20 < 200 drafts and is
    younger than 60 s, so the estimate stays on the lifetime counts: r_1 = 535/560 = 0.955, still OK and
    `cold_start=True`, over the 105 s since created_s.
    """
    if not state.snapshots:
        return Evidence(
            target=target,
            model="",
            at_s=now_s,
            state=DataState.STALE,
            speculation_on=False,
            deployed_k=0,
            acceptance=None,
            batch=0.0,
            waiting=0.0,
            gpu=gpu,
            reason="no snapshot yet",
        )
    span, window = _span(state.snapshots)
    newest = span.newest
    acceptance_span = _acceptance_span(span, config)
    acceptance = _acceptance(acceptance_span, z=config.z)
    itl_count = span.delta(_itl_count)
    itl_sum = span.delta(_itl_sum)
    step_time_s = itl_sum / itl_count if itl_sum is not None and itl_count else None
    prompt_tokens_per_s = span.rate(lambda s: s.prompt_tokens)
    evidence_state, reason = _judge(newest, acceptance, span=acceptance_span, config=config, now_s=now_s)
    return _finite_or_error(Evidence(
        target=target,
        model=newest.model_name,
        at_s=now_s,
        state=evidence_state,
        speculation_on=newest.spec is not None,
        deployed_k=newest.spec.deployed_k if newest.spec is not None else 0,
        acceptance=acceptance,
        batch=sum(s.num_requests_running for s in window) / len(window),
        waiting=sum(s.num_requests_waiting for s in window) / len(window),
        kv_cache_usage_ratio=newest.kv_cache_usage_ratio,
        context_tokens_per_seq=_context_per_seq(newest),
        step_time_s=step_time_s,
        step_samples=itl_count or 0.0,
        generation_tokens_per_s=span.rate(lambda s: s.generation_tokens),
        prompt_tokens_per_s=prompt_tokens_per_s,
        achieved_flops_per_s=span.rate(lambda s: s.estimated_flops),
        achieved_read_bytes_per_s=span.rate(lambda s: s.estimated_read_bytes),
        gpu=gpu,
        window_s=span.elapsed_s or 0.0,
        reason=reason,
        prefill_tokens_per_step=_prefill_per_step(span, prompt_tokens_per_s, step_time_s),
        prompt_tokens_per_request=_prompt_per_request(span),
        decode_seqs_per_step=_decode_seqs_per_step(span),
        engines=max(1, newest.engines),
        request_itl=_without_single_token(span, _histogram_change(span, lambda s: s.request_itl)),
    ))


# Evidence's numbers that readings feed; the required ones fall back to 0.0, the optional ones to None.
_REQUIRED_NUMBERS = ("batch", "waiting", "step_samples", "window_s")
_OPTIONAL_NUMBERS = (
    "kv_cache_usage_ratio", "context_tokens_per_seq", "step_time_s", "generation_tokens_per_s", "prompt_tokens_per_s",
    "achieved_flops_per_s", "achieved_read_bytes_per_s", "prefill_tokens_per_step", "decode_seqs_per_step",
    "prompt_tokens_per_request",
)
_ACCEPTANCE_NUMBERS = ("mean_acceptance_length", "acceptance_rate", "mean_proposed_length", "draft_coverage")


def _finite_or_error(evidence: Evidence) -> Evidence:
    """`evidence` unchanged when every number in it is finite; otherwise in state ERROR, naming the numbers that
    overflowed (a mean, a rate or a product of huge but finite readings), with them cleared (0 or None) and no
    acceptance. Nothing is decided on it. Example: two scrapes of 1e308 running requests -> batch = inf -> error
    "readings overflow: batch"."""
    bad = [name for name in (*_REQUIRED_NUMBERS, *_OPTIONAL_NUMBERS)
           if (value := getattr(evidence, name)) is not None and not math.isfinite(value)]
    acceptance = evidence.acceptance
    if acceptance is not None and not all(
        math.isfinite(v) for v in (*(getattr(acceptance, n) for n in _ACCEPTANCE_NUMBERS), *acceptance.per_position)
    ):
        bad.append("acceptance")
    if not bad:
        return evidence
    cleared: dict[str, object] = {name: 0.0 if name in _REQUIRED_NUMBERS else None
                                  for name in bad if name != "acceptance"}
    if "acceptance" in bad:
        cleared["acceptance"] = None
    return replace(evidence, state=DataState.ERROR,
                   reason=f"readings overflow: {', '.join(bad)} (the engine's numbers are out of any real range)",
                   **cleared)  # type: ignore[arg-type]


def after_failed_scrape(
    evidence: Evidence, *, failure: str, last_good_s: float | None, now_s: float, config: EstimatorConfig
) -> Evidence:
    """The evidence of a tick whose scrape failed (`failure` says how): stale while the last good scrape (Unix s,
    None: never) is at most `config.stale_after_s` old (the numbers are still shown, just not fresh), else error.
    Example: failed at 1000 s, last good at 990 s, stale_after_s 30 -> stale, reason "...; last good scrape 10 s
    ago"; last good at 900 s -> error."""
    if last_good_s is not None and now_s - last_good_s <= config.stale_after_s:
        return replace(
            evidence, state=DataState.STALE, reason=f"{failure}; last good scrape {now_s - last_good_s:.0f} s ago"
        )
    age = "never" if last_good_s is None else f"{now_s - last_good_s:.0f} s ago"
    return replace(evidence, state=DataState.ERROR, reason=f"{failure}; last good scrape {age}")


def _histogram_change(
    span: _Span, read: Callable[[EngineSnapshot], HistogramReading | None]
) -> HistogramReading | None:
    """The histogram of the observations made within the span: each bucket's, the sum's and the count's change
    (the newest reading itself on a cold start). None when either end lacks the histogram or its buckets, or the
    two ends have different bucket bounds (an exporter changed them: no bucket-wise difference means anything).
    Scrape skew can leave a bucket's change a hair below the one before it; the cumulative counts are made
    non-decreasing and capped at the count.

    Example: buckets ((0.025, 10), (0.05, 30), (inf, 32)) then ((0.025, 12), (0.05, 70), (inf, 80)) ->
    ((0.025, 2), (0.05, 40), (inf, 48)), count 48.
    """
    end = read(span.newest)
    if end is None or not end.buckets:
        return None
    zero = HistogramReading(0.0, 0.0, tuple((le, 0.0) for le, _ in end.buckets))
    start = read(span.base) if span.base is not None else zero
    if start is None or [le for le, _ in start.buckets] != [le for le, _ in end.buckets]:
        return None
    readings = (start.count, start.sum, end.count, end.sum, *(c for _, c in (*start.buckets, *end.buckets)))
    if not all(math.isfinite(v) for v in readings):
        return None
    count = max(0.0, end.count - start.count)
    buckets: list[tuple[float, float]] = []
    running = 0.0
    for (le, before), (_, after) in zip(start.buckets, end.buckets, strict=True):
        running = min(count, max(running, after - before))
        buckets.append((le, running))
    return HistogramReading(sum=max(0.0, end.sum - start.sum), count=count, buckets=tuple(buckets))


def _without_single_token(span: _Span, request_itl: HistogramReading | None) -> HistogramReading | None:
    """The window's per-request ITL histogram without the requests that gave at most one output token: vLLM
    records each as a mean ITL of 0 (decode time / (tokens - 1) is undefined), which sits in every cumulative
    bucket, adds nothing to the sum, and would read as a request far faster than any step. z = their count's
    change over the span (unknown: the histogram is left as read); every bucket and the count lose z, the sum
    keeps its value.

    Example: buckets ((0.025, 12), (0.05, 90), (inf, 100)), sum 3.0, 10 single-token requests ->
    ((0.025, 2), (0.05, 80), (inf, 90)), count 90, sum 3.0: the mean is 33 ms, not 30 ms.
    """
    if request_itl is None:
        return None
    end = span.newest.single_token_requests
    start = span.base.single_token_requests if span.base is not None else 0.0
    if end is None or start is None or not (math.isfinite(end) and math.isfinite(start)):
        return request_itl
    zeros = min(request_itl.count, max(0.0, end - start))
    if zeros <= 0:
        return request_itl
    return HistogramReading(
        sum=request_itl.sum,
        count=request_itl.count - zeros,
        buckets=tuple((le, max(0.0, n - zeros)) for le, n in request_itl.buckets),
    )


def _decode_seqs_per_step(span: _Span) -> float | None:
    """Sequences decoding per engine step on average over the span: Δ(inter-token-latency count) / Δ(iteration-
    tokens count), in sequences per step (>= 0; at most the engine's max_num_seqs, up to scrape skew).

    vLLM records one inter-token latency per request per step that gave it tokens (first token excluded) and one
    iteration-tokens value per step that emitted output, so the ratio is the mean number of requests each step
    verified, a step that only finished prefills counting 0. None when either histogram is missing at either
    end, no step ran in the span, or a reading is not a finite number (`_Span.delta` would turn a NaN into a
    zero change; a reset inside the span is handled by `observe`, which starts a new baseline, and by
    `_Span.delta`, which never returns a negative change).

    Worked example (the vLLM 0.32 CPU captures, idle then after 30 requests): ITL count 0 -> 550, iteration
    count 0 -> 162, so 550 / 162 = 3.40 sequences per step, while the running gauge read 0 at both scrapes.
    """
    return _ratio_of_changes(span, _itl_count, _steps)


def _ratio_of_changes(
    span: _Span,
    numerator: Callable[[EngineSnapshot], float | None],
    denominator: Callable[[EngineSnapshot], float | None],
) -> float | None:
    """Δnumerator / Δdenominator over the span; None when either reading is missing or not a finite number at
    either end (`_Span.delta` would turn a NaN into a zero change) or the denominator did not change."""
    ends = [span.newest] if span.base is None else [span.base, span.newest]
    for snapshot in ends:
        if any(value is None or not math.isfinite(value) for value in (numerator(snapshot), denominator(snapshot))):
            return None
    top, bottom = span.delta(numerator), span.delta(denominator)
    if top is None or not bottom:
        return None
    return top / bottom


def _steps(snapshot: EngineSnapshot) -> float | None:
    return snapshot.iteration_tokens.count if snapshot.iteration_tokens is not None else None


def _prompt_tokens(snapshot: EngineSnapshot) -> float | None:
    return snapshot.prompt_tokens


def _first_tokens(snapshot: EngineSnapshot) -> float | None:
    return snapshot.first_token_latency.count if snapshot.first_token_latency is not None else None


def _prefill_per_step(span: _Span, prompt_tokens_per_s: float | None, step_time_s: float | None) -> float | None:
    """Prompt tokens computed per engine step: Δprompt_tokens / Δsteps, the steps counted by the iteration-tokens
    histogram (one observation per engine step). Without that histogram, prompt tokens/s x step time (steps run
    back to back on a busy engine). Chunked prefill spreads a prompt over several steps; over a window the mean
    per step is what the cost model needs (policies/model/roofline.py)."""
    prompts = span.delta(lambda s: s.prompt_tokens)
    steps = span.delta(_steps)
    if prompts is not None and steps:
        return prompts / steps
    if prompt_tokens_per_s is not None and step_time_s is not None:
        return prompt_tokens_per_s * step_time_s
    return None


def _prompt_per_request(span: _Span) -> float | None:
    """Prompt tokens computed per prefilled request over the span: Δprompt_tokens / Δ(count of the time-to-first-
    token histogram, one observation per request whose prompt was prefilled). None when either is missing or not a
    finite number at either end, or no prompt finished prefilling. Prefix-cache hits count in the prompt tokens,
    as in `prefill_tokens_per_step`. Example: 2000 prompt tokens and 5 first tokens in the window -> 400 tokens."""
    return _ratio_of_changes(span, _prompt_tokens, _first_tokens)


def _span(snapshots: tuple[EngineSnapshot, ...]) -> tuple[_Span, tuple[EngineSnapshot, ...]]:
    """The delta ends and the snapshots between them. A state not built by `observe` may hold a reset; then
    only the newest snapshot is trusted (cold start), as `observe` would have done."""
    newest = snapshots[-1]
    base = snapshots[0]
    if len(snapshots) > 1 and _baseline_break(base, newest) is None:
        return _Span(base=base, newest=newest, elapsed_s=newest.taken_at_s - base.taken_at_s), snapshots
    return _lifetime(newest), (newest,)


def _lifetime(newest: EngineSnapshot) -> _Span:
    lifetime_s = newest.taken_at_s - newest.created_s if newest.created_s is not None else None
    return _Span(base=None, newest=newest, elapsed_s=lifetime_s)


def _acceptance_span(window: _Span, config: EstimatorConfig) -> _Span:
    """The span the acceptance is measured over: the window, unless it is still filling (younger than
    `window_s` with fewer than `min_drafts` drafts), then the newest snapshot's lifetime counters, which contain
    it (every kept snapshot shares one counter epoch: `observe` starts a new baseline otherwise)."""
    if window.base is None or window.newest.spec is None or window.elapsed_s is None:
        return window
    if window.elapsed_s >= config.window_s:
        return window
    drafts = window.delta(lambda s: s.spec.drafts if s.spec else None)
    if drafts is None or drafts >= config.min_drafts:
        return window
    return _lifetime(window.newest)


def _acceptance(span: _Span, *, z: float) -> AcceptanceEvidence | None:
    end = span.newest.spec
    if end is None or end.deployed_k < 1:
        return None  # (a k of 0 comes from no adapter; without positions nothing could be fitted)
    k = end.deployed_k  # `_span` guarantees the base, if any, has the same k

    def delta(read: Callable[[EngineSnapshot], float | None]) -> float:
        change = span.delta(read)
        return change if change is not None else 0.0

    drafts = delta(lambda s: s.spec.drafts if s.spec else None)
    if drafts <= 0:
        return None
    draft_tokens = delta(lambda s: s.spec.draft_tokens if s.spec else None)
    accepted = delta(lambda s: s.spec.accepted_tokens if s.spec else None)
    if end.positions_measured:
        counts = [min(delta(_position_reader(i)), drafts) for i in range(k)]
        repaired = _non_increasing(counts)
        bounds = [wilson_interval(count, drafts, z=z) for count in repaired]
        point = tuple(count / drafts for count in repaired)
        low, high = tuple(lo for lo, _ in bounds), tuple(hi for _, hi in bounds)
    else:
        point, low, high = _iid_profile(accepted, drafts, k=k, z=z)
    base = span.base.spec if span.base is not None else None
    counted = len(end.drafted_per_position) == k and (base is None or len(base.drafted_per_position) == k)
    given, given_low, given_high = _given_drafted(span, k=k, z=z) if counted else ((),) * 3
    return AcceptanceEvidence(
        per_position=point,
        per_position_low=low,
        per_position_high=high,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        # Totals-only counters run on across k changes (SGLang's adaptive tiers): the mean is bounded by the newest k.
        mean_acceptance_length=1.0 + (accepted / drafts if end.positions_measured else min(accepted / drafts, k)),
        # accepted <= draft_tokens by construction; clip so scrape skew cannot report more than 100 %.
        acceptance_rate=min(1.0, accepted / draft_tokens) if draft_tokens > 0 else 0.0,
        mean_proposed_length=draft_tokens / drafts,
        window_s=span.elapsed_s or 0.0,
        cold_start=span.base is None,
        draft_coverage=_coverage(drafts, span.delta(_itl_count)),
        positions_measured=end.positions_measured,
        per_position_given_drafted=given,
        per_position_given_drafted_low=given_low,
        per_position_given_drafted_high=given_high,
    )


def _given_drafted(span: _Span, *, k: int, z: float) -> tuple[_Profile, _Profile, _Profile]:
    """r_{i+1} among drafts that reached position i: Δaccepted[i] / Δdrafted[i] (types.AcceptanceEvidence), made
    non-increasing by pooling adjacent violators weighted by their drafts, with Wilson bounds on each position's own
    drafts; a position no draft reached in the window takes the one before it (nothing says it differs).
    Example: drafted (200, 200, 100), accepted (160, 110, 30) -> (0.80, 0.55, 0.30)."""
    trials = [max(span.delta(_drafted_reader(i)) or 0.0, 0.0) for i in range(k)]
    successes = [min(max(span.delta(_position_reader(i)) or 0.0, 0.0), n) for i, n in enumerate(trials)]
    ratios: list[float] = []
    for n, s in zip(trials, successes, strict=True):
        ratios.append(s / n if n > 0 else (ratios[-1] if ratios else 1.0))
    pooled = _non_increasing_weighted(ratios, [max(n, 1e-9) for n in trials])
    bounds = [wilson_interval(p * n, n, z=z) if n > 0 else (0.0, 1.0) for p, n in zip(pooled, trials, strict=True)]
    return tuple(pooled), tuple(lo for lo, _ in bounds), tuple(hi for _, hi in bounds)


def _non_increasing_weighted(values: list[float], weights: list[float]) -> list[float]:
    """Pool adjacent violators with weights: the weighted least-squares non-increasing fit.
    Example: values (0.5, 0.6), weights (1, 3) -> both 0.575."""
    blocks: list[tuple[float, float, int]] = []  # (weighted sum, weight, length)
    for value, weight in zip(values, weights, strict=True):
        total, mass, length = value * weight, weight, 1
        while blocks and blocks[-1][0] / blocks[-1][1] < total / mass:
            previous_total, previous_mass, previous_length = blocks.pop()
            total, mass, length = total + previous_total, mass + previous_mass, length + previous_length
        blocks.append((total, mass, length))
    return [total / mass for total, mass, length in blocks for _ in range(length)]


_Profile = tuple[float, ...]


def _iid_profile(accepted: float, drafts: float, *, k: int, z: float) -> tuple[_Profile, _Profile, _Profile]:
    """Per-position acceptance for an engine that counts only the accepted total: the i.i.d. profile alpha^i
    (i = 1..k) whose sum is the measured mean accepted drafts m = Δaccepted / Δdrafts, clipped to [0, k], and the
    same fit to m's interval. The interval treats each verification as one trial of the share m / k accepted
    (Wilson at `z` on m / k with Δdrafts trials): drafts within one verification are not independent, so the
    drafts, not the draft tokens, are the trials. Example: 1,540 accepted over 1,000 drafts at k 3 -> m 1.54,
    alpha 0.7018 (0.7018 + 0.4925 + 0.3457 = 1.54), profile (0.702, 0.493, 0.346).
    """
    mean = min(max(accepted / drafts, 0.0), float(k))
    share_low, share_high = wilson_interval(mean / k * drafts, drafts, z=z)

    def profile(mean_drafts: float) -> _Profile:
        alpha = iid.iid_rate_for_mean_length(1.0 + min(max(mean_drafts, 0.0), float(k)), k)
        return iid.iid_positions(alpha, k)

    return profile(mean), profile(share_low * k), profile(share_high * k)


def _coverage(drafts: float, sequence_steps: float | None) -> float:
    """Δdrafts / Δ(ITL count), the share of decoding sequence-steps that carried a draft, in (0, 1]; 1.0 without
    ITL samples. Scrape skew between the two counters can put the ratio a little above 1: clipped.
    Example: 5,800 drafts over 10,000 ITL samples -> 0.58."""
    if sequence_steps is None or not math.isfinite(sequence_steps) or sequence_steps <= 0:
        return 1.0
    return min(1.0, max(drafts / sequence_steps, 1e-6))


def _position_reader(position: int) -> Callable[[EngineSnapshot], float | None]:
    def read(snapshot: EngineSnapshot) -> float | None:
        return snapshot.spec.accepted_per_position[position] if snapshot.spec is not None else None

    return read


def _drafted_reader(position: int) -> Callable[[EngineSnapshot], float | None]:
    def read(snapshot: EngineSnapshot) -> float | None:
        return snapshot.spec.drafted_per_position[position] if snapshot.spec is not None else None

    return read


def _non_increasing(values: list[float]) -> list[float]:
    """Pool adjacent violators: the least-squares non-increasing fit with equal weights.

    (515, 470, 480) -> (515, 475, 475): the violating pair is pooled to its mean, the sum is preserved.
    """
    return _non_increasing_weighted(values, [1.0] * len(values))


def _itl(snapshot: EngineSnapshot) -> HistogramReading | None:
    return snapshot.inter_token_latency


def _itl_sum(snapshot: EngineSnapshot) -> float | None:
    histogram = _itl(snapshot)
    return histogram.sum if histogram is not None else None


def _itl_count(snapshot: EngineSnapshot) -> float | None:
    histogram = _itl(snapshot)
    return histogram.count if histogram is not None else None


def _context_per_seq(snapshot: EngineSnapshot) -> float | None:
    """KV tokens in use per running request, all read at one instant (mixing the window's mean batch with an
    instantaneous KV reading would divide quantities from different moments)."""
    usage = snapshot.kv_cache_usage_ratio
    capacity = snapshot.kv_cache_capacity_tokens
    running = snapshot.num_requests_running
    if usage is None or capacity is None or running < _MIN_BATCH_FOR_CONTEXT:
        return None
    return usage * capacity / running


def _judge(
    newest: EngineSnapshot,
    acceptance: AcceptanceEvidence | None,
    *,
    span: _Span,
    config: EstimatorConfig,
    now_s: float,
) -> tuple[DataState, str]:
    """State and a short reason naming the numbers. Staleness outranks all: old data is not evidence."""
    age_s = now_s - newest.taken_at_s
    if age_s > config.stale_after_s:
        return DataState.STALE, f"newest snapshot {age_s:.0f}s old (stale after {config.stale_after_s:g}s)"
    if newest.spec is None:
        return DataState.OK, "speculation off: no acceptance measured"
    window = f"{span.elapsed_s:.0f}s" if span.elapsed_s is not None else "unknown time"
    source = " (lifetime counters, cold start)" if span.base is None else ""
    drafts = acceptance.drafts if acceptance is not None else 0.0
    if acceptance is None or drafts < config.min_drafts:
        return (
            DataState.INSUFFICIENT_DATA,
            f"{drafts:.0f} drafts in {window}, need {config.min_drafts}{source}",
        )
    return (
        DataState.OK,
        f"{drafts:.0f} drafts in {window}: E[L]={acceptance.mean_acceptance_length:.2f} "
        f"at k={newest.spec.deployed_k}, acceptance rate {acceptance.acceptance_rate:.1%}{source}",
    )
