"""Where each quantity the advisor reads lives on a vLLM `/metrics` page, across vLLM versions.

This module is data: a rename in a new vLLM release is one more candidate here, not new parsing code.

History the candidates encode (newest first in each tuple, so the preferred name wins when a server exports both,
as 0.10-0.12 do with `--show-hidden-metrics-for-version`):
- `vllm:gpu_cache_usage_perc` -> `vllm:kv_cache_usage_perc` (vllm#18354, V1, 2025; old name hidden, then removed).
- `vllm:time_per_output_token_seconds` -> `vllm:inter_token_latency_seconds` (deprecated in 0.11, hidden in 0.12,
  removed in 0.13 by vllm#32661). Same buckets and meaning: one observation per request per engine step.
- `vllm:spec_decode_num_drafts` and `..._num_accepted_tokens_per_pos` appeared with the V1 engine (vllm#16665,
  0.8.5/0.9). Earlier pages (V0) have draft/accepted/emitted totals but no drafts count: not enough to estimate
  acceptance per position, so the parser reports those pages as a missing family instead of "speculation off".
- The `engine` label on spec-decode series under data parallelism arrived with vllm#24049 (2025); older pages have
  one series per model and no `engine` label.
- `vllm:estimated_flops_per_gpu` / `vllm:estimated_read_bytes_per_gpu` exist only on recent versions (optional).
- `vllm:cache_config_info` gained `kv_cache_size_tokens` late; before that capacity is num_gpu_blocks x block_size.

Counters are listed by their family base name (no `_total`): the exposition carries `<base>_total` samples and a
`<base>_created` gauge (prometheus_client's text format), and a few exporters emit the bare `<base>` sample. The
parser is fed sample lines only (no TYPE lines), so it never renames them: names here are the exposed names.
Histograms are listed by their base name; their samples are `<base>_bucket`, `<base>_sum`, `<base>_count`
(note `vllm:iteration_tokens_total` is a histogram whose base name happens to end in `_total`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType


class Kind(StrEnum):
    """Prometheus type of a family, which decides which sample names it exposes."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    INFO = "info"  # a gauge at 1.0 whose labels carry the information


@dataclass(frozen=True, slots=True)
class Family:
    """One canonical quantity: its type and the metric names it has had, preferred (newest) first."""

    kind: Kind
    candidates: tuple[str, ...]
    # Histograms only: whether the `_bucket` samples are read. The library parser costs ~20 us per sample line, so
    # a histogram whose distribution nothing uses is read as its `_sum` and `_count` alone.
    buckets: bool = True

    def value_names(self, base: str) -> tuple[str, ...]:
        """The sample names that carry `base`'s values (a counter's `_total`, or bare from some exporters)."""
        if self.kind is Kind.COUNTER:
            return (base + "_total", base)
        if self.kind is Kind.HISTOGRAM:
            summary = (base + "_sum", base + "_count")
            return (*summary, base + "_bucket") if self.buckets else summary
        return (base,)


# Canonical field -> family. Keys are what vllm.py asks for; values are the only place metric names are spelled.
SPEC_DRAFTS = "spec_drafts"
SPEC_DRAFT_TOKENS = "spec_draft_tokens"
SPEC_ACCEPTED_TOKENS = "spec_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "spec_accepted_per_pos"
NUM_REQUESTS_RUNNING = "num_requests_running"
NUM_REQUESTS_WAITING = "num_requests_waiting"
KV_CACHE_USAGE = "kv_cache_usage"
GENERATION_TOKENS = "generation_tokens"
PROMPT_TOKENS = "prompt_tokens"
INTER_TOKEN_LATENCY = "inter_token_latency"
REQUEST_ITL = "request_itl"
REQUEST_GENERATION_TOKENS = "request_generation_tokens"
ITERATION_TOKENS = "iteration_tokens"
FIRST_TOKEN_LATENCY = "first_token_latency"
CACHE_CONFIG = "cache_config"
ESTIMATED_FLOPS = "estimated_flops"
ESTIMATED_READ_BYTES = "estimated_read_bytes"

SPEC_FIELDS: tuple[str, ...] = (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED_TOKENS, SPEC_ACCEPTED_PER_POS)

# Counters whose `<base>_created` dates the engine's counter epoch (restart detection). Every counter of an engine
# is created at its start-up, so a few always-present families suffice; reading all of them (per position, per
# histogram) would triple the lines handed to the parser for no new information.
EPOCH_FIELDS: tuple[str, ...] = (SPEC_DRAFTS, GENERATION_TOKENS, PROMPT_TOKENS)
CREATED_SUFFIX = "_created"

VLLM_FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        SPEC_DRAFTS: Family(Kind.COUNTER, ("vllm:spec_decode_num_drafts",)),
        SPEC_DRAFT_TOKENS: Family(Kind.COUNTER, ("vllm:spec_decode_num_draft_tokens",)),
        SPEC_ACCEPTED_TOKENS: Family(Kind.COUNTER, ("vllm:spec_decode_num_accepted_tokens",)),
        SPEC_ACCEPTED_PER_POS: Family(Kind.COUNTER, ("vllm:spec_decode_num_accepted_tokens_per_pos",)),
        NUM_REQUESTS_RUNNING: Family(Kind.GAUGE, ("vllm:num_requests_running",)),
        NUM_REQUESTS_WAITING: Family(Kind.GAUGE, ("vllm:num_requests_waiting",)),
        KV_CACHE_USAGE: Family(Kind.GAUGE, ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
        GENERATION_TOKENS: Family(Kind.COUNTER, ("vllm:generation_tokens",)),
        PROMPT_TOKENS: Family(Kind.COUNTER, ("vllm:prompt_tokens",)),
        INTER_TOKEN_LATENCY: Family(
            Kind.HISTOGRAM, ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
        ),
        # Per finished request, its own mean inter-token latency: the share of requests meeting an ITL SLO
        # (policies/model/slo_share.py). Its buckets are the point.
        REQUEST_ITL: Family(Kind.HISTOGRAM, ("vllm:request_time_per_output_token_seconds",)),
        # Per finished request, its output tokens: its le=1 bucket counts the requests vLLM records in REQUEST_ITL
        # with a mean ITL of 0 (no token after the first), which are taken out of that histogram.
        REQUEST_GENERATION_TOKENS: Family(Kind.HISTOGRAM, ("vllm:request_generation_tokens",)),
        # Only the mean tokens per step (sum/count) is used; its 14 bucket lines were a quarter of the parser's work.
        ITERATION_TOKENS: Family(Kind.HISTOGRAM, ("vllm:iteration_tokens_total",), buckets=False),
        # One observation per request whose prompt was prefilled: its count beside the prompt-tokens counter gives
        # the chunk a prompt arrives in (policies/model/roofline.py, a MoE's expert bytes per step).
        FIRST_TOKEN_LATENCY: Family(Kind.HISTOGRAM, ("vllm:time_to_first_token_seconds",), buckets=False),
        CACHE_CONFIG: Family(Kind.INFO, ("vllm:cache_config_info",)),
        ESTIMATED_FLOPS: Family(Kind.COUNTER, ("vllm:estimated_flops_per_gpu",)),
        ESTIMATED_READ_BYTES: Family(Kind.COUNTER, ("vllm:estimated_read_bytes_per_gpu",)),
    }
)

# Labels vLLM puts on every engine series.
MODEL_LABEL = "model_name"
ENGINE_LABEL = "engine"
POSITION_LABEL = "position"

# vllm:cache_config_info labels that size the KV cache (values are strings, "None" when unset).
KV_SIZE_TOKENS_LABEL = "kv_cache_size_tokens"
NUM_GPU_BLOCKS_LABEL = "num_gpu_blocks"
BLOCK_SIZE_LABEL = "block_size"

# `EngineSnapshot.naming` when every field matched its preferred name; otherwise the legacy names are appended.
NAMING_CURRENT = "vllm-v1"
NAMING_LEGACY_PREFIX = "vllm-v1+legacy:"


# Every spec-decode sample name starts with this. A page carrying such names but none of the four families above
# is a vLLM that renamed them: reported as a missing family (naming the new names), never as "speculation off".
SPEC_DECODE_PREFIX = "vllm:spec_decode"


def known_spec_decode_sample_names() -> frozenset[str]:
    """Every spec-decode sample name this mapping knows, read or not.

    Besides the value samples this includes every `<base>_created` sibling: vLLM 0.32 exports one per counter
    (e.g. `vllm:spec_decode_num_accepted_tokens_per_pos_created`, `..._num_draft_tokens_created`) and the parser
    reads only the drafts one, so the others are known but deliberately skipped, not a sign of a rename.
    """
    return frozenset(
        name
        for field_name in SPEC_FIELDS
        for base in VLLM_FAMILIES[field_name].candidates
        for name in (*VLLM_FAMILIES[field_name].value_names(base), base + CREATED_SUFFIX)
    )


def spec_decode_value_names() -> frozenset[str]:
    """The sample names that carry the values of the four spec-decode families (any candidate)."""
    return frozenset(
        name
        for field_name in SPEC_FIELDS
        for base in VLLM_FAMILIES[field_name].candidates
        for name in VLLM_FAMILIES[field_name].value_names(base)
    )


def wanted_sample_names() -> frozenset[str]:
    """Every sample name the parser needs to see: the only lines of a page worth parsing."""
    values = {
        name for family in VLLM_FAMILIES.values() for base in family.candidates for name in family.value_names(base)
    }
    created = {base + CREATED_SUFFIX for f in EPOCH_FIELDS for base in VLLM_FAMILIES[f].candidates}
    return frozenset(values | created)
