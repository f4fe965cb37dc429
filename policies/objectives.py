"""What "faster" means for one server right now: the objective the speedup curve is measured in.

Three objectives (DESIGN.md section 4), chosen per tick from the evidence:

- latency  (no queue: waiting < `waiting_threshold` and KV usage < `kv_full_ratio`): every running request is
  served, so the batch is what it is; S(gamma) = tokens/s per sequence with gamma drafts / without, at the same
  batch B (= the inverse ratio of inter-token latencies). This is `costmodel.curve_for` unchanged.
- capacity (requests waiting, or the KV cache nearly full): the server's throughput decides how fast the queue
  drains, and each option may hold a different batch. Draft tokens reserve KV slots (vLLM allocates gamma
  lookahead slots per running request), so with the cache full an option with gamma drafts holds
      B(gamma) = min(B + waiting, KV_capacity / (ctx_0 + gamma))   ctx_0 = ctx - deployed_k (the current reservation)
  and when the cache is not the limit (max_num_seqs or the token budget is), B(gamma) = B for all options.
      S_cap(gamma) = [B(gamma) E[L](gamma) / T(B(gamma), gamma)] / [B(0) / T(B(0), 0)]     total tokens/s ratio
  KV_capacity = ctx x B / kv_usage (tokens), from the evidence. Example: cache full at B = 64, ctx 264 with
  k = 3 deployed, 20 waiting: capacity 64 x 264 / 1.0 = 16896 tokens; gamma 0 holds min(84, 16896 / 261) =
  64.7 sequences, gamma 3 holds 64.0 -> if S(3) at B=64 is 1.50, S_cap(3) ~ 1.50 x 64.0 / 64.7 = 1.48.
- goodput_slo (an inter-token-latency SLO is configured): tokens/s of requests meeting it. Each option's mean
  inter-token latency is ITL(gamma) = T(B(gamma), gamma) / E[L](gamma); a request's own mean ITL spreads around
  that mean, and the share of requests meeting the SLO is taken as a log-normal CDF with log-spread sigma =
  `slo_itl_spread` (0.10), floored at `slo_share_floor` (1%):
      share(gamma) = max(floor, Phi(ln(SLO / ITL(gamma)) / sigma))
      goodput(gamma) = delivered(gamma) x share(gamma),   S_slo = goodput(gamma) / goodput(0)
  Why 0.10: with the batch shared, every request in a step sees the same step time; what sets one request apart
  is its own acceptance (E[L] varies by about +-10% between requests of one workload when the per-request
  acceptance rate varies by +-0.05 around 0.7 at k = 3: E[L] = (1 - a^4) / (1 - a) goes 2.53 -> 2.35..2.73) and
  the load changing during its life. A power law (SLO / ITL)^4 was used before: it credits an option 37% over
  the SLO with 28% of its tokens meeting it, where a spread of 10% gives 0.07%, and it made an advisor switch
  speculation off on a server where neither option met the SLO at all (both "shares" looked like 0.28 vs 0.14,
  a 2x "gain" in tokens nobody could count), which blinded it to the acceptance it could no longer measure.
  The floor says that some requests always meet an SLO (very short ones, idle moments): without it S_slo is a
  ratio of two vanishing numbers (1e-6 / 1e-9), meaningless and unreadable on a dashboard; with it S_slo stays in
  [0.01, 100] while latency-bound (capacity-bound, the throughput ratio multiplies in). `slo_share` on each point
  is share(gamma): decide weighs a change by the tokens it moves across the SLO per delivered token (rule 4), not
  by a ratio of shares.
  Delivered tokens/s: when capacity-bound, the throughput B(gamma) E[L] / T (B(gamma) from the capacity rule);
  when latency-bound the server already delivers everything asked of it, the same for every option, so
      S_slo = share(gamma) / share(0)          (latency-bound)
  and speed beyond the SLO earns nothing: a faster token stream is not more tokens meeting the SLO, and counting
  it (as throughput at the current B) made the advisor restart a server whose every option met the SLO for a
  "7.6% gain" that delivered nothing (always-worth-it, eagle3, draft-model in the decision benchmark). Example:
  SLO 8 ms, off at 11 ms: share(0) = max(0.01, Phi(ln(8/11) / 0.1) = Phi(-3.18) = 0.0007) = 0.01; gamma 2 at
  5.3 ms (Phi(4.12) = 0.99998) and gamma 3 at 4.7 ms (Phi(5.32) = 1.0): S(2) = 99.998, S(3) = 100.0, so decide's
  minimum-change rule keeps whichever runs. Chunked prefill stretches every
  step by 1 / (1 - rho), rho = the share of the current step spent on prompt tokens, priced by the model as
  1 - T(B, k, P = 0) / T(B, k, P) at the deployed k, whose steps the prefill per step P was measured over
  (policies/costmodel.py: prompt load is a rate, the same for every gamma); the ITL above uses the stretched
  step. The throughput ratios are unaffected (the factor cancels). Example: B 203 at k = 3, decode step 51.5 ms,
  P priced at 35.5 ms: rho = 35.5 / 87 = 0.41, stretch 1.69, so gamma 1's 33.7 ms step serves tokens every
  33.7 x 1.69 / 1.72 = 33 ms. (Pricing P against the 21.5 ms plain step instead gave rho = 0.62, stretch 2.65:
  every option far past a 30 ms SLO, and no option worth choosing.)
Bands: E[L] low/high give throughput (and ITL) low/high at the same step time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from policies.acceptance import AcceptancePoint
from policies.costmodel import ModelContext, curve_for, step_batch
from policies.roofline import CostScales
from policies.types import CurvePoint, Evidence


class Objective(StrEnum):
    """The wire values go on `Decision.objective`."""

    LATENCY = "latency"
    CAPACITY = "capacity"
    GOODPUT_SLO = "goodput_slo"


@dataclass(frozen=True, slots=True)
class ObjectiveConfig:
    """`itl_slo_s` (s, > 0, or None = no SLO): mean inter-token latency target. `kv_full_ratio` (0..1]: KV usage
    counted as full. `waiting_threshold` (requests, >= 0): mean queue length counted as a queue.
    `slo_itl_spread` (> 0): log-spread of per-request mean ITLs; `slo_share_floor` (0..1): the least share of
    requests counted as meeting the SLO (module docstring)."""

    itl_slo_s: float | None = None
    kv_full_ratio: float = 0.90
    waiting_threshold: float = 0.5
    slo_itl_spread: float = 0.10
    slo_share_floor: float = 0.01

    def __post_init__(self) -> None:
        if self.itl_slo_s is not None and not (math.isfinite(self.itl_slo_s) and self.itl_slo_s > 0):
            raise ValueError(f"itl_slo_s must be a positive number of seconds, got {self.itl_slo_s}")
        if not 0 < self.kv_full_ratio <= 1:
            raise ValueError(f"kv_full_ratio must be in (0, 1], got {self.kv_full_ratio}")
        if self.waiting_threshold < 0 or not self.slo_itl_spread > 0:
            raise ValueError("waiting_threshold must be >= 0 and slo_itl_spread > 0")
        if not 0 < self.slo_share_floor < 1:
            raise ValueError(f"slo_share_floor must be in (0, 1), got {self.slo_share_floor}")


@dataclass(frozen=True, slots=True)
class Workload:
    """The operating point an objective is evaluated at: running `batch` (>= 1), `waiting` requests (>= 0),
    `context_tokens` per sequence, `prefill_tokens` per step, `kv_usage_ratio` (None = unknown), `deployed_k`."""

    batch: float
    waiting: float
    context_tokens: float
    prefill_tokens: float = 0.0
    kv_usage_ratio: float | None = None
    deployed_k: int = 0

    @property
    def kv_capacity_tokens(self) -> float | None:
        """KV capacity implied by the usage: ctx x B / usage (tokens); None when the usage is unknown or ~0."""
        if self.kv_usage_ratio is None or self.kv_usage_ratio < 0.01:
            return None
        return self.context_tokens * self.batch / self.kv_usage_ratio


def workload_from(evidence: Evidence, *, context_tokens: float, prefill_tokens: float) -> Workload:
    """The evidence's workload with the cost model's resolved context and prefill (costmodel.operating_point).

    The batch is the one the cost model prices, `costmodel.step_batch`: sequences each engine step verified
    (`decode_seqs_per_step`) when measured, else the running-requests mean; floored at 1. The objectives compare
    options at the batch the steps run at, and the step time they are calibrated on was measured over those steps,
    not over the scrapes the running gauge averages (idle gaps, requests still prefilling).

    Example: batch 256, waiting 50, KV 0.62, k 3, no per-step count -> Workload(256, 50, ctx, P, 0.62, 3); the same
    with decode_seqs_per_step 240 -> Workload(240, ...).
    """
    waiting = evidence.waiting if math.isfinite(evidence.waiting) and evidence.waiting > 0 else 0.0
    return Workload(
        batch=max(step_batch(evidence), 1.0),
        waiting=waiting,
        context_tokens=context_tokens,
        prefill_tokens=prefill_tokens,
        kv_usage_ratio=evidence.kv_cache_usage_ratio,
        deployed_k=evidence.deployed_k if evidence.speculation_on else 0,
    )


def choose_objective(workload: Workload, config: ObjectiveConfig) -> tuple[Objective, bool, str]:
    """(objective, capacity_bound, why). Capacity-bound when waiting >= `waiting_threshold` or KV usage >=
    `kv_full_ratio`; the SLO objective applies whenever an SLO is configured, over the capacity or latency batch.

    Example: waiting 50, KV 0.62, no SLO -> (CAPACITY, True, "capacity-bound: 50 waiting, KV 62%").
    """
    kv = workload.kv_usage_ratio
    queued = workload.waiting >= config.waiting_threshold
    full = kv is not None and kv >= config.kv_full_ratio
    kv_text = f"KV {kv:.0%}" if kv is not None else "KV unknown"
    capacity = queued or full
    regime = f"capacity-bound: {workload.waiting:.0f} waiting, {kv_text}" if capacity else (
        f"latency-bound: no queue, {kv_text}"
    )
    if config.itl_slo_s is not None:
        return Objective.GOODPUT_SLO, capacity, f"goodput under ITL SLO {config.itl_slo_s * 1e3:.0f} ms ({regime})"
    return (Objective.CAPACITY if capacity else Objective.LATENCY), capacity, regime


def held_batch(workload: Workload, gamma: int, *, kv_full: bool) -> float:
    """Sequences an option with `gamma` drafts can run (>= 1): the current batch unless the KV cache is the limit,
    then min(B + waiting, capacity / (ctx - deployed_k + gamma)) (module docstring).

    Example: B 64, ctx 264, k 3, usage 1.0, 20 waiting, kv_full: gamma 0 -> min(84, 16896 / 261) = 64.7.
    """
    capacity = workload.kv_capacity_tokens
    if not kv_full or capacity is None:
        return workload.batch
    per_seq = max(workload.context_tokens - workload.deployed_k, 1.0) + gamma
    return max(1.0, min(workload.batch + workload.waiting, capacity / per_seq))


def objective_curve(
    ctx: ModelContext,
    acceptance: Sequence[AcceptancePoint],
    workload: Workload,
    *,
    config: ObjectiveConfig,
    scales: CostScales | None = None,
) -> tuple[tuple[CurvePoint, ...], Objective, str]:
    """The curve S(gamma) in the objective that applies (module docstring), with the objective and why.
    `acceptance` starts at gamma 0, contiguous. Latency objective: exactly `costmodel.curve_for` at B.

    Example: latency-bound at B = 1 -> the plain curve; capacity-bound with the cache not full -> the same
    numbers (every option holds the same batch) under the name "capacity".
    """
    objective, capacity, why = choose_objective(workload, config)
    kv = workload.kv_usage_ratio
    kv_full = capacity and kv is not None and kv >= config.kv_full_ratio

    def at(batch: float) -> tuple[tuple[CurvePoint, ...], float]:
        return curve_for(ctx, acceptance, batch=batch, context_tokens=workload.context_tokens, scales=scales)

    base_curve, base_step = at(held_batch(workload, 0, kv_full=kv_full))
    if objective is Objective.LATENCY or (objective is Objective.CAPACITY and not kv_full):
        return base_curve, objective, why
    b0 = held_batch(workload, 0, kv_full=kv_full)
    cache: dict[float, tuple[CurvePoint, ...]] = {b0: base_curve}
    stretch = 1.0
    if workload.prefill_tokens > 0:
        # rho is the prompt tokens' share of the step the server runs now: the prefill per step was measured over
        # steps of the deployed gamma, so it is priced against that step, not against a plain one (a plain step is
        # shorter: the same prefill would read as a larger share of it and stretch every option too far).
        k = min(max(workload.deployed_k, 0), len(acceptance) - 1)
        mixed = curve_for(
            ctx, acceptance[: k + 1], batch=workload.batch, context_tokens=workload.context_tokens, scales=scales,
            prefill_tokens=workload.prefill_tokens,
        )[0][k].step_time_s
        plain_now = curve_for(
            ctx, acceptance[: k + 1], batch=workload.batch, context_tokens=workload.context_tokens, scales=scales,
        )[0][k].step_time_s
        stretch = mixed / plain_now  # 1 / (1 - rho)
    plain_rate = b0 / base_step
    # Latency-bound under an SLO: every option delivers the offered load; only the share meeting the SLO differs.
    delivered_fixed = objective is Objective.GOODPUT_SLO and not capacity
    plain_goodput = (1.0 if delivered_fixed else plain_rate) * _slo_share(base_step * stretch, 1.0, config)
    points: list[CurvePoint] = []
    for acc in acceptance:
        b = held_batch(workload, acc.gamma, kv_full=kv_full)
        if b not in cache:
            cache[b] = at(b)[0]
        point = cache[b][acc.gamma]
        slo = objective is Objective.GOODPUT_SLO
        if acc.gamma == 0:
            points.append(replace(point, slo_share=_slo_share(base_step * stretch, 1.0, config)) if slo else point)
            continue

        def ratio(length: float, step: float = point.step_time_s, batch: float = b) -> float:
            rate = 1.0 if delivered_fixed else batch * length / step
            if objective is Objective.GOODPUT_SLO:
                return rate * _slo_share(step * stretch, length, config) / plain_goodput if plain_goodput > 0 else 0.0
            return rate / plain_rate

        points.append(
            CurvePoint(
                gamma=acc.gamma,
                speedup=ratio(acc.expected_length),
                speedup_low=ratio(acc.expected_length_low),
                speedup_high=ratio(acc.expected_length_high),
                expected_accepted_length=acc.expected_length,
                step_time_s=point.step_time_s,
                extrapolated=acc.extrapolated,
                extrapolated_share=acc.extrapolated_share,
                slo_share=_slo_share(point.step_time_s * stretch, acc.expected_length, config) if slo else None,
            )
        )
    return tuple(points), objective, why


def slo_share(itl_s: float, config: ObjectiveConfig) -> float:
    """Share (floor..1) of requests whose own mean inter-token latency meets the SLO when the mean is `itl_s`
    (s, > 0): max(floor, Phi(ln(SLO / ITL) / sigma)) (module docstring); 1.0 without an SLO.

    Example: SLO 8 ms, sigma 0.10: ITL 8 ms -> 0.5; 7.2 ms -> Phi(1.05) = 0.853; 11 ms -> the floor 0.01.
    """
    if config.itl_slo_s is None:
        return 1.0
    if not (math.isfinite(itl_s) and itl_s > 0):
        return config.slo_share_floor
    z = math.log(config.itl_slo_s / itl_s) / config.slo_itl_spread
    return max(config.slo_share_floor, 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))))


def _slo_share(step_s: float, length: float, config: ObjectiveConfig) -> float:
    return slo_share(step_s / max(length, 1.0), config)
