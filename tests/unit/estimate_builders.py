"""Snapshot builders for the estimator tests.

The defaults are the real numbers of tests/fixtures/vllm/vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt (vLLM
0.32.0 on CPU, n-gram, k=3, after 30 requests), typed in by hand so these tests do not depend on the scraper.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from policies.estimate.window import EstimatorConfig, EstimatorState, observe
from policies.types import EngineSnapshot, HistogramReading, SpecDecodeCounters

# `vllm:spec_decode_num_drafts_created` in the capture, rounded to the second.
FIXTURE_CREATED_S = 1_796_205_210.0
# A scrape time 100 s after the server created its counters (the capture does not record its own time).
FIXTURE_TAKEN_AT_S = FIXTURE_CREATED_S + 100.0

FIXTURE_DRAFTS = 540.0
FIXTURE_DRAFT_TOKENS = 1505.0
FIXTURE_ACCEPTED = 1415.0
FIXTURE_PER_POSITION = (515.0, 465.0, 435.0)
FIXTURE_GENERATION_TOKENS = 1920.0


def make_spec(
    *,
    drafts: float = FIXTURE_DRAFTS,
    draft_tokens: float = FIXTURE_DRAFT_TOKENS,
    accepted_tokens: float = FIXTURE_ACCEPTED,
    per_position: tuple[float, ...] = FIXTURE_PER_POSITION,
) -> SpecDecodeCounters:
    return SpecDecodeCounters(
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted_tokens,
        accepted_per_position=per_position,
    )


def make_snapshot(**overrides: Any) -> EngineSnapshot:
    """The fixture's scrape; any EngineSnapshot field can be overridden by name."""
    base = EngineSnapshot(
        taken_at_s=FIXTURE_TAKEN_AT_S,
        model_name="tiny",
        engines=1,
        spec=make_spec(),
        num_requests_running=0.0,
        num_requests_waiting=0.0,
        created_s=FIXTURE_CREATED_S,
        kv_cache_usage_ratio=0.0,
        generation_tokens=FIXTURE_GENERATION_TOKENS,
    )
    return replace(base, **overrides)


def advance(
    snapshot: EngineSnapshot,
    *,
    dt_s: float,
    drafts: float = 0.0,
    draft_tokens: float = 0.0,
    accepted: float = 0.0,
    per_position: tuple[float, ...] | None = None,
    **overrides: Any,
) -> EngineSnapshot:
    """A later scrape of the same server: time moves by `dt_s`, the spec counters grow by the given amounts.

    Other fields are copied unless overridden (pass absolute values for them).
    """
    spec = snapshot.spec
    if spec is not None:
        growth = per_position if per_position is not None else (0.0,) * spec.deployed_k
        spec = make_spec(
            drafts=spec.drafts + drafts,
            draft_tokens=spec.draft_tokens + draft_tokens,
            accepted_tokens=spec.accepted_tokens + accepted,
            per_position=tuple(a + b for a, b in zip(spec.accepted_per_position, growth, strict=True)),
        )
    return replace(snapshot, taken_at_s=snapshot.taken_at_s + dt_s, spec=spec, **overrides)


def itl(total_s: float, count: float) -> HistogramReading:
    """An inter-token-latency histogram reading (buckets are not used by the estimator)."""
    return HistogramReading(sum=total_s, count=count, buckets=((float("inf"), count),))


def feed(snapshots: list[EngineSnapshot], config: EstimatorConfig | None = None) -> EstimatorState:
    """Observe the snapshots in order from an empty state."""
    used = config if config is not None else EstimatorConfig()
    state = EstimatorState()
    for snapshot in snapshots:
        state = observe(state, snapshot, used)
    return state
