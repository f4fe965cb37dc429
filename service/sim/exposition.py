"""vLLM 0.32's `/metrics` families, the simulator's accumulators for them, and their rendering.

Names, HELP texts, label sets and histogram bucket bounds are copied from a real vLLM 0.32.0 capture
(`tests/fixtures/vllm/vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt`), so that a scraper cannot tell the simulator
from the engine by shape. Rendering goes through prometheus_client (a collector on a private registry and
`generate_latest`, text format 0.0.4), which is what vLLM itself uses: `_total` suffixes, `_created` sibling
families and label ordering come out exactly as on a real page, and the `vllm:` colons are legal legacy names.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

ENGINE_LABEL = "0"

# Bucket bounds as vLLM 0.32 declares them (vllm/v1/metrics/loggers.py), checked against the capture.
# fmt: off
TIME_TO_FIRST_TOKEN_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)
INTER_TOKEN_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)
ITERATION_TOKENS_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
PARAMS_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
NUM_PREEMPTIONS_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
# fmt: on

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def one_two_five_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to and including `max_value` (its max_model_len).

    Example: max_value=512 -> (1, 2, 5, 10, 20, 50, 100, 200, 500), the bounds on the real capture.
    """
    bounds: list[float] = []
    base = 1
    while base <= max_value:
        bounds.extend(float(base * m) for m in (1, 2, 5) if base * m <= max_value)
        base *= 10
    return tuple(bounds)


class Histogram:
    """A Prometheus histogram's state: per-bucket counts (non-cumulative, last = +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """Record `count` observations of `value` (Prometheus buckets are `le`: a value on a bound falls in it)."""
        if count <= 0:
            return
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.total += value * count

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs in prometheus_client's form, ending with +Inf."""
        pairs: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            pairs.append((_le(bound), float(running)))
        return pairs


def _le(bound: float) -> str:
    # prometheus_client's own spelling of bounds (floatToGoString): "+Inf", "0.001", "7680.0".
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _histograms(max_model_len: int) -> dict[str, Histogram]:
    tokens = one_two_five_buckets(max_model_len)
    return {name: Histogram(bounds) for name, (_, bounds) in _histogram_specs(tokens).items()}


def _histogram_specs(tokens: tuple[float, ...]) -> dict[str, tuple[str, tuple[float, ...]]]:
    # Insertion order is the capture's family order.
    return {
        "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", tokens),
        "vllm:request_generation_tokens": ("Number of generation tokens processed.", tokens),
        "vllm:iteration_tokens_total": ("Histogram of number of tokens per engine_step.", ITERATION_TOKENS_BUCKETS),
        "vllm:request_max_num_generation_tokens": (
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        ),
        "vllm:request_params_n": ("Histogram of the n request parameter.", PARAMS_N_BUCKETS),
        "vllm:request_params_max_tokens": ("Histogram of the max_tokens request parameter.", tokens),
        "vllm:time_to_first_token_seconds": (
            "Histogram of time to first token in seconds.",
            TIME_TO_FIRST_TOKEN_BUCKETS_S,
        ),
        "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", INTER_TOKEN_BUCKETS_S),
        "vllm:request_time_per_output_token_seconds": (
            "Histogram of time_per_output_token_seconds per request.",
            INTER_TOKEN_BUCKETS_S,
        ),
        "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS_S),
        "vllm:request_queue_time_seconds": (
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS_S,
        ),
        "vllm:request_inference_time_seconds": (
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS_S,
        ),
        "vllm:request_prefill_time_seconds": (
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS_S,
        ),
        "vllm:request_decode_time_seconds": (
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS_S,
        ),
        "vllm:request_num_preemptions": (
            "Histogram of the number of times a request was preempted.",
            NUM_PREEMPTIONS_BUCKETS,
        ),
        "vllm:request_prefill_kv_computed_tokens": (
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        ),
    }


@dataclass(slots=True)
class EngineMetrics:
    """Everything one engine lifetime has counted. A restart replaces the whole object (counters restart at 0)."""

    created_s: float
    num_speculative_tokens: int
    max_model_len: int
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    estimated_flops: float = 0.0
    estimated_read_bytes: float = 0.0
    estimated_write_bytes: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    success_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISHED_REASONS, 0))
    histograms: dict[str, Histogram] = field(default_factory=dict)

    @classmethod
    def fresh(cls, *, created_s: float, num_speculative_tokens: int, max_model_len: int) -> EngineMetrics:
        """A just-started engine: all k per-position series exist at 0 (as on vLLM), histograms empty."""
        return cls(
            created_s=created_s,
            num_speculative_tokens=num_speculative_tokens,
            max_model_len=max_model_len,
            spec_accepted_per_pos=[0] * num_speculative_tokens,
            histograms=_histograms(max_model_len),
        )

    def histogram(self, name: str) -> Histogram:
        return self.histograms[name]


@dataclass(frozen=True, slots=True)
class EngineGauges:
    """Instantaneous engine state shown as gauges."""

    num_running: int
    num_waiting: int
    kv_cache_usage_ratio: float


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """What `vllm:cache_config_info` reports about the KV cache."""

    block_size: int
    num_gpu_blocks: int
    kv_cache_memory_bytes: int
    max_model_len: int

    def labels(self) -> dict[str, str]:
        """The full label set of vLLM 0.32's cache_config_info (values as vLLM stringifies them)."""
        size_tokens = self.num_gpu_blocks * self.block_size
        return {
            "_block_size_resolved": "True",
            "block_size": str(self.block_size),
            "cache_dtype": "auto",
            "cache_hit_alignment_tokens": "None",
            "effective_attention_block_size": str(self.block_size),
            "enable_mamba_shared_prefix_checkpoint": "False",
            "enable_prefix_caching": "True",
            "engine": ENGINE_LABEL,
            "gpu_memory_utilization": "0.9",
            "hash_block_size": "None",
            "is_attention_free": "False",
            "kv_cache_dtype_skip_layers": "[]",
            "kv_cache_layout": "None",
            "kv_cache_max_concurrency": repr(size_tokens / self.max_model_len),
            "kv_cache_memory_bytes": str(self.kv_cache_memory_bytes),
            "kv_cache_size_tokens": str(size_tokens),
            "kv_offloading_backend": "native",
            "kv_offloading_size": "None",
            "kv_sharing_fast_prefill": "False",
            "mamba_block_size": "None",
            "mamba_cache_dtype": "auto",
            "mamba_cache_mode": "none",
            "mamba_page_size_padded": "None",
            "mamba_ssm_cache_dtype": "float32",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(self.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_cache_retention_interval": "0",
            "prefix_caching_hash_algo": "sha256",
            "prefix_match_unit": "None",
            "replayssm_buffer_len": "16",
            "skip_page_size_padded": "None",
            "sliding_window": "None",
            "swa_bounded_replay": "True",
            "use_kda_recoverssm": "False",
            "use_replayssm": "False",
            "user_specified_block_size": "False",
        }


_MFU_HELP = "(for Model Flops Utilization calculations)."


class _EngineCollector(Collector):
    """Builds fresh families from one engine's state at scrape time."""

    def __init__(self, metrics: EngineMetrics, gauges: EngineGauges, *, model_name: str, cache: CacheConfig) -> None:
        self._m = metrics
        self._g = gauges
        self._model = model_name
        self._cache = cache

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["engine", "model_name"])
        family.add_metric([ENGINE_LABEL, self._model], float(value), created=self._m.created_s)
        return family

    def _labelled_counter(self, name: str, doc: str, label: str, values: Sequence[tuple[str, float]]) -> Metric:
        family = CounterMetricFamily(name, doc, labels=["engine", "model_name", label])
        for key, value in values:
            family.add_metric([ENGINE_LABEL, self._model, key], float(value), created=self._m.created_s)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["engine", "model_name"])
        family.add_metric([ENGINE_LABEL, self._model], float(value))
        return family

    def _histogram(self, name: str, doc: str) -> HistogramMetricFamily:
        hist = self._m.histograms[name]
        family = HistogramMetricFamily(name, doc, labels=["engine", "model_name"])
        family.add_metric([ENGINE_LABEL, self._model], hist.cumulative(), hist.total)
        # HistogramMetricFamily has no `created` argument; the text format renders this as `<name>_created`.
        family.samples.append(
            Sample(name + "_created", {"engine": ENGINE_LABEL, "model_name": self._model}, self._m.created_s)
        )
        return family

    def collect(self) -> Iterator[Metric]:
        m = self._m
        if m.num_speculative_tokens > 0:
            # Absent, not zero, when speculation is off: that is how a real server says "off".
            yield self._counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", m.spec_drafts)
            yield self._counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", m.spec_draft_tokens)
            yield self._counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", m.spec_accepted_tokens
            )
            yield self._labelled_counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                "position",
                [(str(i), v) for i, v in enumerate(m.spec_accepted_per_pos)],
            )
        yield self._counter(
            "vllm:estimated_flops_per_gpu",
            f"Estimated number of floating point operations per GPU {_MFU_HELP}",
            m.estimated_flops,
        )
        yield self._counter(
            "vllm:estimated_read_bytes_per_gpu",
            f"Estimated number of bytes read from memory per GPU {_MFU_HELP}",
            m.estimated_read_bytes,
        )
        yield self._counter(
            "vllm:estimated_write_bytes_per_gpu",
            f"Estimated number of bytes written to memory per GPU {_MFU_HELP}",
            m.estimated_write_bytes,
        )
        yield from self._engine_gauges()
        yield from self._token_counters()
        for name, (doc, _) in _histogram_specs(()).items():
            yield self._histogram(name, doc)
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(self._cache.labels())
        )
        info.add_metric(list(self._cache.labels().values()), 1.0)
        yield info

    def _engine_gauges(self) -> Iterator[Metric]:
        g = self._g
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.", g.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", g.num_waiting)
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            labels=["engine", "model_name", "reason"],
        )
        by_reason.add_metric([ENGINE_LABEL, self._model, "capacity"], float(g.num_waiting))
        by_reason.add_metric([ENGINE_LABEL, self._model, "deferred"], 0.0)
        yield by_reason
        sleep = GaugeMetricFamily(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            labels=["engine", "model_name", "sleep_state"],
        )
        for state, value in (("awake", 1.0), ("weights_offloaded", 0.0), ("discard_all", 0.0)):
            sleep.add_metric([ENGINE_LABEL, self._model, state], value)
        yield sleep
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", g.kv_cache_usage_ratio
        )

    def _token_counters(self) -> Iterator[Metric]:
        m = self._m
        # No prefix caching in the simulated world: every prompt token is a cache query and a miss.
        yield self._counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", m.prompt_tokens
        )
        yield self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", 0)
        yield self._counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
            0,
        )
        yield self._counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, "
            "in terms of number of cached tokens.",
            0,
        )
        yield self._counter(
            "vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.", 0
        )
        yield self._counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", 0)
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", m.num_preemptions
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", m.prompt_tokens)
        yield self._labelled_counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            [("local_compute", m.prompt_tokens), ("local_cache_hit", 0), ("external_kv_transfer", 0)],
        )
        yield self._counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", 0)
        yield self._labelled_counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
            "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            "source",
            [(s, 0) for s in ("device", "host", "p2p", "disk", "external_unspecified")],
        )
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.", m.generation_tokens)
        yield self._labelled_counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            list(m.success_by_reason.items()),
        )
        rejections = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=["model_name", "reason"],
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.add_metric([self._model, reason], 0.0, created=m.created_s)
        yield rejections


def render_exposition(metrics: EngineMetrics, gauges: EngineGauges, *, model_name: str, cache: CacheConfig) -> str:
    """The engine's `/metrics` page in Prometheus text format 0.0.4 (vLLM families only, no process metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineCollector(metrics, gauges, model_name=model_name, cache=cache))
    return generate_latest(registry).decode("utf-8")
