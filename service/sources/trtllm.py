"""Read a TensorRT-LLM `trtllm-serve` Prometheus page into one `EngineSnapshot` per served model.

The page is `GET /prometheus/metrics` (set the target's url to it: `/metrics` on trtllm-serve is a JSON list of
iteration stats), served when the LLM-API config has `return_perf_metrics: true`; the iteration-level families
(speculative decoding among them) also need `enable_iter_perf_stats: true`. Names, types and meaning are those of
`tensorrt_llm/metrics/collector.py` (`MetricsCollector`, prefix `trtllm_`, after TensorRT-LLM PRs #12545 and
#12636, 2026); every series carries `model_name` and `engine_type`, gauges also `pid` (prometheus_client's
multiprocess mode, which writes no `_created` samples).

    running, waiting   trtllm_num_requests_running, trtllm_num_requests_waiting (the largest pid series: a gone
                       process's series stay on a multiprocess page)
    KV usage, capacity trtllm_kv_cache_utilization (0..1); trtllm_kv_cache_max_blocks x _tokens_per_block, per pid
    generated, prompt  trtllm_generation_tokens_total, trtllm_prompt_tokens_total
    drafts             trtllm_spec_decode_drafted_tokens_total{token_position="0"}: every draft proposes position 0
    draft tokens       sum over positions of trtllm_spec_decode_drafted_tokens_total
    per position       trtllm_spec_decode_accepted_tokens_total{token_position="i"}: drafts whose position i was
                       accepted, i.e. that accepted at least i+1 tokens (acceptance stops at the first rejection)
    accepted           the sum over positions (the same per-request source as the drafts; the iteration-stats
                       totals `trtllm_spec_decode_num_*_tokens_total` come from another path and are not mixed in)
    drafted per pos.   trtllm_spec_decode_drafted_tokens_total{token_position="i"}: drafts that reached position i;
                       where a draft_len_schedule cut drafts short, accepted[i] / drafted[i] is the acceptance a
                       static k would see (policies/model/acceptance.py `full_length`)
    k                  `spec_num_tokens` of trtllm_speculative_config_info (max_draft_len), else the positions seen

Example (tests/fixtures/trtllm/): drafted (17 600, 17 600, 17 600), accepted (13 728, 10 841, 8 334) at k 3 ->
E[L] = 1 + 32 903 / 17 600 = 2.87, r = (0.78, 0.62, 0.47).

Caveats: the per-position counters are added when a request finishes, and TensorRT-LLM refreshes its iteration
gauges (running, waiting, KV) only when one does, so they go stale between completions; windows must be longer
than a request. No step-time histogram is read (`trtllm_iteration_latency_seconds` is the last iteration only).
Builds before PR #12636 have no per-position counters: with speculation on their page is MISSING_FAMILY, since
without a count of drafts the accepted length cannot be measured.

Failure policy, beyond the shared reading's (service/sources/exposition.py): MISSING_FAMILY without the running
or waiting gauge, or speculation on without per-position counters; INVALID_VALUE for a `spec_num_tokens` that is
not a whole number in 1..`MAX_POSITIONS`, or counts TensorRT-LLM's accounting cannot produce
(`exposition.nested_counts_problem`); MODEL_MISSING without any `model_name` series of the running gauge.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from prometheus_client.samples import Sample

from policies.types import EngineSnapshot, SpecDecodeCounters
from service.sources import exposition
from service.sources.errors import ScrapeError, ScrapeErrorReason

RUNNING = "trtllm_num_requests_running"
WAITING = "trtllm_num_requests_waiting"
KV_UTILIZATION = "trtllm_kv_cache_utilization"
KV_MAX_BLOCKS = "trtllm_kv_cache_max_blocks"
KV_TOKENS_PER_BLOCK = "trtllm_kv_cache_tokens_per_block"
GENERATED = "trtllm_generation_tokens_total"
PROMPT = "trtllm_prompt_tokens_total"
DRAFTED_PER_POSITION = "trtllm_spec_decode_drafted_tokens_total"
ACCEPTED_PER_POSITION = "trtllm_spec_decode_accepted_tokens_total"
ACCEPTED_TOTAL = "trtllm_spec_decode_num_accepted_tokens_total"
SPEC_CONFIG = "trtllm_speculative_config_info"
WANTED: frozenset[str] = frozenset({
    RUNNING, WAITING, KV_UTILIZATION, KV_MAX_BLOCKS, KV_TOKENS_PER_BLOCK, GENERATED, PROMPT,
    DRAFTED_PER_POSITION, ACCEPTED_PER_POSITION, ACCEPTED_TOTAL, SPEC_CONFIG,
})

MODEL_LABEL = "model_name"
POSITION_LABEL = "token_position"
NAMING = "trtllm"
MAX_REQUESTS = 1e6
"""The most running or waiting requests accepted (max_batch_size is at most thousands)."""
MAX_POSITIONS = 64
"""The most draft positions accepted (max_draft_len is a handful; as vLLM's MAX_POSITIONS)."""
MAX_KV_TOKENS = 1e12
"""The largest KV pool accepted (tokens): a thousand times a large GPU node's."""


def parse_trtllm_metrics(text: str, *, taken_at_s: float) -> dict[str, EngineSnapshot]:
    """One snapshot per `model_name` on a trtllm-serve page (module docstring). Raises `ScrapeError` only."""
    if text and not text.endswith("\n"):
        raise ScrapeError(ScrapeErrorReason.PARSE, "body does not end with a newline (truncated page)")
    samples = exposition.parse_lines(exposition.select_lines(text, WANTED, engine="TensorRT-LLM"))
    exposition.index_samples(samples)  # duplicate series are refused
    by_model: dict[str, dict[str, list[Sample]]] = {}
    for model, group in exposition.samples_by_model(samples, label=MODEL_LABEL, engine="TensorRT-LLM").items():
        by_model[model] = defaultdict(list)
        for s in group:
            by_model[model][s.name].append(s)
    models = {m: index for m, index in by_model.items() if index.get(RUNNING)}
    if not models:
        raise ScrapeError(ScrapeErrorReason.MODEL_MISSING, f"no {RUNNING} series on the TensorRT-LLM page")
    return {model: _snapshot(model, index, taken_at_s=taken_at_s) for model, index in sorted(models.items())}


def _total(index: dict[str, list[Sample]], name: str, limit: float = exposition.MAX_COUNT) -> float | None:
    return sum(exposition.checked(s, limit) for s in index[name]) if index.get(name) else None


def _gauge(index: dict[str, list[Sample]], name: str, limit: float = exposition.MAX_COUNT) -> float | None:
    """A gauge over its `pid` series: the largest. One process writes the iteration stats; in prometheus_client's
    multiprocess mode the series of a process that is gone stay on the page, so a sum would count it twice."""
    return max(exposition.checked(s, limit) for s in index[name]) if index.get(name) else None


def _capacity(index: dict[str, list[Sample]]) -> float | None:
    """KV tokens: max blocks x tokens per block of the same process (pid), the largest over processes."""
    per_block = {s.labels.get("pid", ""): exposition.checked(s) for s in index.get(KV_TOKENS_PER_BLOCK, [])}
    pools = [exposition.checked(s) * per_block[pid] for s in index.get(KV_MAX_BLOCKS, [])
             if (pid := s.labels.get("pid", "")) in per_block]
    return max(pools) if pools and max(pools) > 0 else None


def _snapshot(model: str, index: dict[str, list[Sample]], *, taken_at_s: float) -> EngineSnapshot:
    running, waiting = _gauge(index, RUNNING, MAX_REQUESTS), _gauge(index, WAITING, MAX_REQUESTS)
    if running is None or waiting is None:
        raise ScrapeError(ScrapeErrorReason.MISSING_FAMILY, f"model {model!r} lacks {RUNNING} or {WAITING}")
    capacity = _capacity(index)
    if capacity is not None and capacity > MAX_KV_TOKENS:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"model {model!r}: a KV pool of {capacity:g} tokens")
    return EngineSnapshot(
        taken_at_s=taken_at_s,
        model_name=model,
        engines=1,
        spec=_spec(model, index),
        num_requests_running=running,
        num_requests_waiting=waiting,
        kv_cache_usage_ratio=_gauge(index, KV_UTILIZATION, 1.0 + 1e-6),
        kv_cache_capacity_tokens=capacity,
        generation_tokens=_total(index, GENERATED),
        prompt_tokens=_total(index, PROMPT),
        naming=NAMING,
    )


def _configured_k(model: str, index: dict[str, list[Sample]]) -> int | None:
    """max_draft_len from the speculative config info; 0 when it says speculation is off, None without it."""
    infos = index.get(SPEC_CONFIG, [])
    if not infos:
        return None
    labels = infos[0].labels
    if labels.get("spec_enabled", "").lower() != "true":
        return 0
    raw = labels.get("spec_num_tokens", "")
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_POSITIONS:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"model {model!r}: {SPEC_CONFIG} spec_num_tokens={raw!r}")
    return int(raw)


def _spec(model: str, index: dict[str, list[Sample]]) -> SpecDecodeCounters | None:
    k = _configured_k(model, index)
    drafted = exposition.by_position(index.get(DRAFTED_PER_POSITION, []), label=POSITION_LABEL,
                                     max_positions=MAX_POSITIONS, what=f"model {model!r} drafted")
    accepted = exposition.by_position(index.get(ACCEPTED_PER_POSITION, []), label=POSITION_LABEL,
                                      max_positions=MAX_POSITIONS, what=f"model {model!r} accepted")
    if k == 0:
        return None
    if not drafted and _total(index, ACCEPTED_TOTAL):
        raise ScrapeError(
            ScrapeErrorReason.MISSING_FAMILY,
            f"model {model!r}: speculative totals but no per-position counters ({DRAFTED_PER_POSITION}, "
            "TensorRT-LLM PR #12636): the accepted length cannot be measured without a count of drafts",
        )
    if k is None and not drafted:
        return None
    length = max(k or 0, len(drafted), len(accepted))
    if len(accepted) > len(drafted) or (k is not None and len(drafted) > k):
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE,
                          f"model {model!r}: {len(accepted)} accepted and {len(drafted)} drafted positions at k={k}")
    tolerance = exposition.with_tolerance
    if any(a > tolerance(d) for a, d in zip(accepted, drafted, strict=False)) or any(
        later > tolerance(earlier) for earlier, later in itertools.pairwise(drafted)
    ):
        raise ScrapeError(
            ScrapeErrorReason.INVALID_VALUE,
            f"model {model!r}: drafted {drafted} / accepted {accepted} per position: a position accepted more often "
            "than drafted, or drafted more often than the one before it",
        )
    per_position = accepted + (0.0,) * (length - len(accepted))
    drafts = drafted[0] if drafted else 0.0
    problem = exposition.nested_counts_problem(drafts, sum(drafted), sum(accepted), per_position,
                                               rel_tol=exposition.SUM_REL_TOLERANCE)
    if problem:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"model {model!r}: {problem}")
    return SpecDecodeCounters(
        drafts=drafts, draft_tokens=sum(drafted), accepted_tokens=sum(accepted), accepted_per_position=per_position,
        drafted_per_position=drafted + (0.0,) * (length - len(drafted)),
    )
