"""Read an SGLang `/metrics` page (`--enable-metrics`) into one `EngineSnapshot` per served model.

Names, types and meaning are SGLang 0.5.23's (`sglang/srt/observability/metrics_collector.py`, metrics set in
`managers/scheduler_components/metrics_reporter.py` and `managers/tokenizer_manager.py`); the page is rendered by
prometheus_client in multiprocess mode, so it has no `_created` samples (a restart shows as counters going down).

What SGLang gives, and how it becomes the snapshot (k = `sglang:spec_num_steps`, the draft chain's depth):

    running, waiting   sglang:num_running_reqs, sglang:num_queue_reqs           (scheduler gauges, per dp_rank)
    KV usage, capacity sglang:token_usage (0..1), sglang:max_total_num_tokens   (tokens)
    generated, prompt  sglang:generation_tokens_total, sglang:prompt_tokens_total (summed over is_streaming)
    drafts             V = sglang:spec_verify_calls_total: one per request per verify step, added when the request
                       finishes (as the generated tokens are, so the two agree over any window)
    accepted drafts    A = G - R - V: a request's G tokens are its prefill token plus, per verify step, the accepted
                       drafts and one bonus token (R = sglang:num_requests_total, finished requests)
    draft tokens       V x (sglang:spec_num_draft_tokens - 1): the tree's draft slots (k with topk 1)
    step time          sglang:inter_token_latency_seconds: `_sum` adds each request's interval between outputs (one
                       engine step), `_count` adds the tokens of that output. Steps per request = tokens / L with
                       L = (G - R) / V the tokens per verify step, so the snapshot's ITL count is `_count` / L
                       (lifetime L; `_count` itself without speculation). Its per-token buckets are dropped.

Example (the fixture tests/fixtures/sglang/sglang-0.5.23-eagle-k3.txt): G 88 912, R 412, V 32 771 -> A = 55 729
accepted drafts, E[L] = 1 + A / V = 2.70 at k 3; ITL count 88 500 tokens / 2.70 = 32 770 request-steps.

What is lost against vLLM: no per-position acceptance (only the sum A: `declared_k` carries k and the profile is
fitted, policies/model/acceptance.py), no iteration-tokens histogram (no sequences per step, no chunked-prefill
mix), no `_created` epochs. `sglang:spec_accept_length` / `spec_accept_rate` are gauges over the last 40 decode
batches (`--decode-log-interval`), stale when idle: not read, the counters above supersede them.

Adaptive speculation (`--speculative-adaptive`, SGLang 0.5.13+) makes `spec_num_steps` the tier of the last batch:
a tier of 0 draft steps still counts verify steps but hides k (`K_NOT_SHOWN`; `TierMemory` takes the model's last
shown k). Its draft tokens, verify steps x the tier's slots on each page, are kept as a running total
by `TierMemory` (each page adds its new verify steps x its tier's slots), so a tier change never lowers them.

Scheduler gauges come from every attention-TP rank when `--enable-metrics-for-all-schedulers` is set: each
`dp_rank` is read once (its lowest tp/pp rank), and `engines` counts the dp ranks.

Failure policy, beyond the shared reading's (service/sources/exposition.py):
- MISSING_FAMILY: a model without num_running_reqs / num_queue_reqs; speculation on (`spec_accept_length` > 0)
  with no `spec_num_steps` gauge: SGLang before 0.5.13, whose page has no verify counter to count acceptance by.
- INVALID_VALUE: a non-integer or out-of-range k, more generated tokens claimed by verify steps than k + 1 each,
  fewer generated tokens than finished requests plus verify steps.
- MODEL_MISSING: no `model_name` series of the running/waiting gauges.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from prometheus_client.samples import Sample

from policies.types import EngineSnapshot, HistogramReading, SpecDecodeCounters
from service.sources import exposition
from service.sources.errors import ScrapeError, ScrapeErrorReason

RUNNING = "sglang:num_running_reqs"
WAITING = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
MAX_TOKENS = "sglang:max_total_num_tokens"
GENERATED = "sglang:generation_tokens_total"
PROMPT = "sglang:prompt_tokens_total"
REQUESTS = "sglang:num_requests_total"
VERIFY_CALLS = "sglang:spec_verify_calls_total"
SPEC_STEPS = "sglang:spec_num_steps"
SPEC_DRAFT_TOKENS = "sglang:spec_num_draft_tokens"
ACCEPT_LENGTH = "sglang:spec_accept_length"
ITL = "sglang:inter_token_latency_seconds"

_SCHEDULER_GAUGES = (RUNNING, WAITING, TOKEN_USAGE, MAX_TOKENS, SPEC_STEPS, SPEC_DRAFT_TOKENS, ACCEPT_LENGTH)
_COUNTERS = (GENERATED, PROMPT, REQUESTS, VERIFY_CALLS)
WANTED: frozenset[str] = frozenset((*_SCHEDULER_GAUGES, *_COUNTERS, f"{ITL}_sum", f"{ITL}_count"))

MODEL_LABEL = "model_name"
DP_RANK_LABEL = "dp_rank"
# A scheduler gauge's rank labels; one series per dp rank is read, the lowest of these.
_RANK_LABELS = ("tp_rank", "pp_rank", "moe_ep_rank")

MAX_REQUESTS = 1e6
"""The most running or waiting requests accepted per dp rank (SGLang's max_running_requests is thousands)."""
MAX_K = 64
"""The deepest draft chain accepted (`spec_num_steps`): the estimator and the exported gauges hold one slot per
position, as for vLLM (service/sources/vllm.py MAX_POSITIONS)."""
MAX_KV_TOKENS = 1e12
"""The largest KV pool accepted per dp rank (tokens): a thousand times a large GPU node's."""
NAMING = "sglang"
K_NOT_SHOWN = 0
"""`declared_k` of a page that speculates without showing k (an adaptive tier of 0 steps): `TierMemory` replaces it."""


def parse_sglang_metrics(text: str, *, taken_at_s: float) -> dict[str, EngineSnapshot]:
    """One snapshot per `model_name` on an SGLang page (module docstring). Raises `ScrapeError` only."""
    if text and not text.endswith("\n"):
        raise ScrapeError(ScrapeErrorReason.PARSE, "body does not end with a newline (truncated page)")
    samples = exposition.parse_lines(exposition.select_lines(text, WANTED, engine="SGLang"))
    exposition.index_samples(samples)  # duplicate series are refused
    by_model = exposition.samples_by_model(samples, label=MODEL_LABEL, engine="SGLang")
    models = {m: group for m, group in by_model.items() if any(s.name in (RUNNING, WAITING) for s in group)}
    if not models:
        raise ScrapeError(ScrapeErrorReason.MODEL_MISSING, "no SGLang scheduler series (num_running_reqs) on the page")
    return {model: _snapshot(model, group, taken_at_s=taken_at_s) for model, group in sorted(models.items())}


def _snapshot(model: str, samples: list[Sample], *, taken_at_s: float) -> EngineSnapshot:
    gauges = _scheduler_gauges(samples)
    running, waiting = gauges.get(RUNNING), gauges.get(WAITING)
    if running is None or waiting is None:
        raise ScrapeError(ScrapeErrorReason.MISSING_FAMILY, f"model {model!r} lacks {RUNNING} or {WAITING}")
    for name, limit in ((RUNNING, MAX_REQUESTS), (WAITING, MAX_REQUESTS), (MAX_TOKENS, MAX_KV_TOKENS)):
        _check_limit(gauges, name, limit)
    counters = _counters(samples)
    spec = _spec(model, gauges, counters)
    capacity = gauges.get(MAX_TOKENS)
    return EngineSnapshot(
        taken_at_s=taken_at_s,
        model_name=model,
        engines=max(1, len({_dp_rank(s) for s in samples if s.name == RUNNING})),
        spec=spec,
        num_requests_running=running,
        num_requests_waiting=waiting,
        kv_cache_usage_ratio=_usage(samples, gauges),
        kv_cache_capacity_tokens=capacity if capacity else None,
        generation_tokens=counters.get(GENERATED),
        prompt_tokens=counters.get(PROMPT),
        inter_token_latency=_steps_itl(samples, spec, counters),
        naming=NAMING,
    )


def _dp_rank(sample: Sample) -> str:
    return sample.labels.get(DP_RANK_LABEL, "")


def _rank_key(sample: Sample) -> tuple[int, ...]:
    labels = [sample.labels.get(name, "0") for name in _RANK_LABELS]
    return tuple(int(v) if v.isascii() and v.isdigit() else 1 << 30 for v in labels)


def _per_dp_rank(samples: Iterable[Sample], name: str) -> dict[str, Sample]:
    """For one scheduler gauge, the series of each dp rank with the lowest tp/pp/ep rank (the one every
    configuration exports); series of a priority class (`priority` label set) are left out of the total."""
    chosen: dict[str, Sample] = {}
    for s in samples:
        if s.name != name or s.labels.get("priority", ""):
            continue
        rank = _dp_rank(s)
        if rank not in chosen or _rank_key(s) < _rank_key(chosen[rank]):
            chosen[rank] = s
    return chosen


def _scheduler_gauges(samples: list[Sample]) -> dict[str, float]:
    """Each scheduler gauge summed over dp ranks (the spec gauges: the largest, one config for all ranks)."""
    out: dict[str, float] = {}
    for name in _SCHEDULER_GAUGES:
        series = _per_dp_rank(samples, name)
        if not series:
            continue
        values = [exposition.checked(s) for s in series.values()]
        out[name] = max(values) if name in (SPEC_STEPS, SPEC_DRAFT_TOKENS, ACCEPT_LENGTH, TOKEN_USAGE) else sum(values)
    return out


def _check_limit(gauges: Mapping[str, float], name: str, limit: float) -> None:
    value = gauges.get(name)
    if value is not None and value > limit:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"{name} = {value:g} (over {limit:g})")


def _usage(samples: list[Sample], gauges: Mapping[str, float]) -> float | None:
    """KV usage over the dp ranks' pools, each rank's ratio weighted by its pool when every pool is known."""
    usage = _per_dp_rank(samples, TOKEN_USAGE)
    if not usage:
        return None
    pools = _per_dp_rank(samples, MAX_TOKENS)
    ratios = {rank: exposition.checked(s, 1.0 + 1e-6) for rank, s in usage.items()}
    if usage.keys() <= pools.keys() and gauges.get(MAX_TOKENS):
        sizes = {rank: exposition.checked(pools[rank]) for rank in usage}
        total = sum(sizes.values())
        if total > 0:
            return sum(ratios[r] * sizes[r] for r in ratios) / total
    return sum(ratios.values()) / len(ratios)


def _counters(samples: list[Sample]) -> dict[str, float]:
    """Tokenizer counters summed over every series of the model (is_streaming, cache_source, ...)."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name in _COUNTERS:
            out[s.name] = out.get(s.name, 0.0) + exposition.checked(s)
    return out


def _spec(model: str, gauges: Mapping[str, float], counters: Mapping[str, float]) -> SpecDecodeCounters | None:
    """The verify counters as drafts / accepted / draft tokens at k = spec_num_steps (module docstring); None when
    speculation is off (k 0 and no verify step ever counted, or neither gauge). Under SGLang's adaptive speculation
    (`--speculative-adaptive`, 0.5.13+) `spec_num_steps` is the tier of the last batch, 0 at a tier that does not
    draft: with verify steps counted the page is then speculating with k not shown (`K_NOT_SHOWN`), which
    `TierMemory` resolves from the engine's last page that showed it."""
    steps = gauges.get(SPEC_STEPS)
    if steps is None:
        if gauges.get(ACCEPT_LENGTH, 0.0) > 0:
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY,
                f"model {model!r}: speculation is on ({ACCEPT_LENGTH} > 0) but {SPEC_STEPS} is absent (SGLang before "
                f"0.5.13 exports no {VERIFY_CALLS} to count acceptance by): upgrade SGLang",
            )
        return None
    if steps != math.floor(steps) or steps > MAX_K:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"model {model!r}: {SPEC_STEPS} = {steps:g}")
    k = int(steps)
    verify = counters.get(VERIFY_CALLS, 0.0)  # created at the first finished speculative request
    if k == 0 and verify == 0:
        return None
    generated, requests = counters.get(GENERATED, 0.0), counters.get(REQUESTS, 0.0)
    accepted = generated - requests - verify
    # Lifetime counts against the current k would refuse an adaptive server's pages after a tier change (k 3 then
    # k 1: more accepted drafts than 1 per verify step so far), so only MAX_K bounds them.
    bound = MAX_K
    if accepted < -exposition.SUM_ABS_TOLERANCE or accepted > exposition.with_tolerance(bound * verify):
        raise ScrapeError(
            ScrapeErrorReason.INVALID_VALUE,
            f"model {model!r}: {generated:g} generated tokens cannot come from {requests:g} requests and {verify:g} "
            f"verify steps of at most {bound + 1} tokens each",
        )
    slots = gauges.get(SPEC_DRAFT_TOKENS, 0.0) - 1.0
    per_verify = slots if slots >= 1.0 else float(k)
    return SpecDecodeCounters(
        drafts=verify,
        draft_tokens=verify * per_verify,
        accepted_tokens=min(max(accepted, 0.0), bound * verify),
        accepted_per_position=(),
        declared_k=k if k > 0 else K_NOT_SHOWN,
    )


def _steps_itl(
    samples: list[Sample], spec: SpecDecodeCounters | None, counters: Mapping[str, float]
) -> HistogramReading | None:
    """SGLang's ITL histogram with its token count turned into request-steps (module docstring)."""
    sums = [s for s in samples if s.name == f"{ITL}_sum"]
    counts = [s for s in samples if s.name == f"{ITL}_count"]
    if not sums and not counts:
        return None
    if not sums or not counts:
        raise ScrapeError(ScrapeErrorReason.MISSING_FAMILY, f"histogram {ITL} lacks _sum or _count")
    reading = exposition.histogram_reading(ITL, sums, counts, [])
    if spec is None or spec.drafts <= 0:
        return reading
    tokens_per_step = (counters.get(GENERATED, 0.0) - counters.get(REQUESTS, 0.0)) / spec.drafts
    return HistogramReading(sum=reading.sum, count=reading.count / max(tokens_per_step, 1.0))


class TierMemory:
    """What reading one SGLang server's pages in turn must remember under adaptive speculation (module docstring):
    per model, the k its pages last showed and the running total of draft tokens with the verify steps it counts
    up to."""

    def __init__(self) -> None:
        self._shown_k: dict[str, int] = {}
        self._draft_totals: dict[str, tuple[float, float]] = {}

    def resolve(self, snapshots: dict[str, EngineSnapshot]) -> dict[str, EngineSnapshot]:
        """Each snapshot with a k its page did not show (`K_NOT_SHOWN`) taken from the model's last page that did
        (MISSING_FAMILY when none has), and its draft tokens as a running total: each page adds its new verify
        steps x its own draft tokens per verify step, so adaptive tiers never lower it (a restart, verify steps
        going down, starts the total again from the page).
        Example: 100 verify steps at k 3 (300), then 150 at a tier of k 1 -> 300 + 50 x 1 = 350, not 150."""
        return {model: self._resolved(snapshot) for model, snapshot in snapshots.items()}

    def _resolved(self, snapshot: EngineSnapshot) -> EngineSnapshot:
        spec = snapshot.spec
        if spec is None or spec.positions_measured:
            return snapshot
        model = snapshot.model_name
        if spec.declared_k != K_NOT_SHOWN:
            self._shown_k[model] = spec.declared_k
        k = self._shown_k.get(model)
        if k is None:
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY,
                f"model {model!r}: SGLang's adaptive speculation is at a tier of 0 draft steps and no page has "
                "shown its k yet (sglang:spec_num_steps)",
            )
        per_verify = spec.draft_tokens / spec.drafts if spec.drafts > 0 and spec.draft_tokens > 0 else float(k)
        counted, total = self._draft_totals.get(model, (math.inf, 0.0))
        total = spec.draft_tokens if spec.drafts < counted else total + (spec.drafts - counted) * per_verify
        self._draft_totals[model] = (spec.drafts, total)
        return replace(snapshot, spec=replace(spec, declared_k=k, draft_tokens=total))
