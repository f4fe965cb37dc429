"""What a run delivered, from the requests its clients saw (`world.Completion`): the ones that finished within the
run, and the ones still in flight at its end (`complete=False`, as far as they got).

Definitions (docs/bench.md):
- goodput: output tokens the clients received within the run, per second of the run: every token of a finished
  request, and the tokens a request still in flight at the end had received. Tokens of requests a restart dropped
  never count (their clients got an error: the `errors` column).
- a request's inter-token latency (ITL): (last token - first token) / (tokens - 1), its mean time between tokens,
  queueing and preemption stalls included; for a request in flight, up to the end of the run. A request with one
  token has none, and meets an ITL SLO, as in vLLM's own benchmark goodput (`vllm bench serve`: TPOT 0 when the
  output has one token).
- mean ITL: token-weighted, sum over requests of (last - first token) / sum of (tokens - 1).
- p50 / p99 ITL: the median and 99th percentile of the per-request ITL (nearest rank).
- TTFT: first token - arrival; for a request in flight that has no token yet, end of run - arrival (a lower
  bound: its client is still waiting). p50 / p99 of those.
- SLO goodput: the goodput of requests whose ITL meets the scenario's SLO (finished or in flight).
- errors: requests a restart dropped (in flight, queued, or arriving while the engine was down); their clients
  got an error. The headline counts each against the policy by the output tokens it asked for (Objective).
Example: two finished requests of 11 tokens over 1.0 s and 2.0 s after their first, one in flight with 6 tokens
over 0.5 s, a 10 s run, SLO 0.15 s: goodput 2.8 tokens/s; ITLs 0.1, 0.2, 0.1 s; mean ITL 3.5 / 25 = 0.14 s;
SLO goodput (11 + 6) / 10 = 1.7 tokens/s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from service.sim.world import Completion


@dataclass(frozen=True, slots=True)
class Metrics:
    goodput_tokens_per_s: float
    mean_itl_s: float | None
    p50_itl_s: float | None
    p99_itl_s: float | None
    p50_ttft_s: float | None
    p99_ttft_s: float | None
    slo_goodput_tokens_per_s: float | None
    completed_requests: int
    in_flight_requests: int  # admitted and not finished at the end of the run
    error_tokens_per_s: float = 0.0  # output tokens the requests a restart dropped had asked for, per second


def request_itl_s(c: Completion) -> float | None:
    """Mean seconds between a request's output tokens (up to now for one in flight); None with under two tokens."""
    if c.output_tokens < 2:
        return None
    return (c.done_s - c.first_token_s) / (c.output_tokens - 1)


def request_ttft_s(c: Completion) -> float:
    """Seconds from arrival to the first token; for a request in flight still without one, until now."""
    return (c.first_token_s if c.output_tokens > 0 else c.done_s) - c.arrival_s


def meets_slo(c: Completion, itl_slo_s: float) -> bool:
    """Whether the request's ITL meets the SLO; a request with one token (or none yet) has no gap to miss it."""
    itl = request_itl_s(c)
    return itl is None or itl <= itl_slo_s


def headline_tokens(completions: Sequence[Completion], *, itl_slo_s: float | None) -> float:
    """The tokens the headline counts: all those received, or with an ITL SLO those of requests meeting it."""
    if itl_slo_s is None:
        return float(sum(c.output_tokens for c in completions))
    return float(sum(c.output_tokens for c in completions if meets_slo(c, itl_slo_s)))


def nearest_rank(values: Sequence[float], quantile: float) -> float:
    """The nearest-rank quantile: the smallest value with at least `quantile` of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, math.ceil(quantile * len(ordered)))
    return ordered[rank - 1]


def _quantiles(values: Sequence[float]) -> tuple[float | None, float | None]:
    return (nearest_rank(values, 0.5), nearest_rank(values, 0.99)) if values else (None, None)


def summarize(completions: Sequence[Completion], *, duration_s: float, itl_slo_s: float | None,
              error_tokens: int = 0) -> Metrics:
    """The run's metrics from its finished and in-flight requests and the tokens its dropped requests had asked
    for (module docstring)."""
    itls = [(c, itl) for c in completions if (itl := request_itl_s(c)) is not None]
    gaps = sum(c.output_tokens - 1 for c, _ in itls)
    mean = sum(c.done_s - c.first_token_s for c, _ in itls) / gaps if gaps else None
    p50_itl, p99_itl = _quantiles([itl for _, itl in itls])
    p50_ttft, p99_ttft = _quantiles([request_ttft_s(c) for c in completions])
    slo = None if itl_slo_s is None else headline_tokens(completions, itl_slo_s=itl_slo_s) / duration_s
    return Metrics(
        goodput_tokens_per_s=headline_tokens(completions, itl_slo_s=None) / duration_s,
        mean_itl_s=mean,
        p50_itl_s=p50_itl,
        p99_itl_s=p99_itl,
        p50_ttft_s=p50_ttft,
        p99_ttft_s=p99_ttft,
        slo_goodput_tokens_per_s=slo,
        completed_requests=sum(1 for c in completions if c.complete),
        in_flight_requests=sum(1 for c in completions if not c.complete),
        error_tokens_per_s=error_tokens / duration_s,
    )


ObjectiveKind = Literal["throughput", "slo_goodput", "latency"]


@dataclass(frozen=True, slots=True)
class Objective:
    """What a scenario grades policies by (its headline figure; higher is better):

    - throughput: goodput - errors, tokens/s;
    - slo_goodput: SLO goodput - errors, tokens/s of requests whose ITL meets `itl_slo_s`;
    - latency (at a throughput floor): 1 / mean ITL, each sequence's tokens/s, times min(1, (goodput - errors) /
      `floor_tokens_per_s`): a run that delivers the floor is graded on latency alone, one below it loses in
      proportion to what it did not deliver (a backlog is not free).
    errors = the output tokens the requests a restart dropped had asked for, per second (`error_tokens_per_s`):
    an error counts against the policy by the size of the request its client did not get, so dropping a backlog
    is never a way to make the requests after it meet an SLO.
    Example (latency, floor 2000 tokens/s): mean ITL 10 ms at 2100 tokens/s scores 100; 8 ms at 1800 tokens/s
    scores 125 x 0.9 = 112.5; (slo_goodput) 1500 tokens/s meeting the SLO with 300 tokens/s of errors scores 1200.
    """

    kind: ObjectiveKind
    itl_slo_s: float | None = None
    floor_tokens_per_s: float = 0.0
    # Why the scenario is graded on another objective than the one it states ("" when it is not).
    note: str = ""

    def score(self, m: Metrics) -> float:
        errors = m.error_tokens_per_s
        if self.kind == "slo_goodput":
            return (m.slo_goodput_tokens_per_s or 0.0) - errors
        if self.kind == "latency":
            if m.mean_itl_s is None or m.mean_itl_s <= 0:
                return 0.0
            delivered = m.goodput_tokens_per_s - errors
            short = delivered / self.floor_tokens_per_s if self.floor_tokens_per_s > 0 else 1.0
            return max(0.0, min(1.0, short)) / m.mean_itl_s
        return m.goodput_tokens_per_s - errors

    @property
    def unit(self) -> str:
        return "tokens/s per sequence (1 / mean ITL)" if self.kind == "latency" else "tokens/s"
