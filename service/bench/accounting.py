"""What a run delivered, from the requests its clients saw finish (`world.Completion`).

Definitions (docs/bench.md):
- goodput: output tokens of requests that completed within the run, per second of the run. Tokens of requests a
  restart dropped never count (their clients got an error).
- a request's inter-token latency (ITL): (done - first token) / (output tokens - 1), its mean time between tokens,
  queueing and preemption stalls included; requests with one token have none.
- mean ITL: token-weighted, sum over requests of (done - first token) / sum of (output tokens - 1).
- p99 ITL: the 99th percentile of the per-request ITL (nearest rank).
- SLO goodput: tokens/s of completed requests whose ITL <= the scenario's SLO.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from service.sim.world import Completion


@dataclass(frozen=True, slots=True)
class Metrics:
    goodput_tokens_per_s: float
    mean_itl_s: float | None
    p99_itl_s: float | None
    slo_goodput_tokens_per_s: float | None
    completed_requests: int


def request_itl_s(c: Completion) -> float | None:
    """Mean seconds between a request's output tokens; None for a one-token request."""
    if c.output_tokens < 2:
        return None
    return (c.done_s - c.first_token_s) / (c.output_tokens - 1)


def nearest_rank(values: Sequence[float], quantile: float) -> float:
    """The nearest-rank quantile: the smallest value with at least `quantile` of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, math.ceil(quantile * len(ordered)))
    return ordered[rank - 1]


def summarize(completions: Sequence[Completion], *, duration_s: float, itl_slo_s: float | None) -> Metrics:
    tokens = sum(c.output_tokens for c in completions)
    itls = [(c, itl) for c in completions if (itl := request_itl_s(c)) is not None]
    gaps = sum(c.output_tokens - 1 for c, _ in itls)
    mean = sum(c.done_s - c.first_token_s for c, _ in itls) / gaps if gaps else None
    p99 = nearest_rank([itl for _, itl in itls], 0.99) if itls else None
    slo: float | None = None
    if itl_slo_s is not None:
        # A one-token request has no inter-token gap, so it cannot miss the SLO.
        slo = sum(c.output_tokens for c in completions if (request_itl_s(c) or 0.0) <= itl_slo_s) / duration_s
    return Metrics(
        goodput_tokens_per_s=tokens / duration_s,
        mean_itl_s=mean,
        p99_itl_s=p99,
        slo_goodput_tokens_per_s=slo,
        completed_requests=len(completions),
    )
