"""What "faster" means for one server right now: the objective the speedup curve is measured in.

Three objectives, chosen per tick from the evidence:

- latency  (no queue: waiting < `waiting_threshold` and KV usage < `kv_full_ratio`): every running request is
  served, so the batch is what it is; S(gamma) = tokens/s per sequence with gamma drafts / without, at the same
  batch B (= the inverse ratio of inter-token latencies). This is `costmodel.curve_for` unchanged, unless the
  step's token budget binds (below).
- capacity (requests waiting, or the KV cache nearly full): the server's throughput decides how fast the queue
  drains, and each option may hold a different batch. Draft tokens reserve KV slots (vLLM allocates gamma
  lookahead slots per running request), so with the cache full an option with gamma drafts holds
      B(gamma) = min(B + waiting, KV_capacity / (ctx_0 + gamma))   ctx_0 = ctx - deployed_k (the current reservation)
  and when the cache is not the limit (max_num_seqs or the token budget is), B(gamma) = B for all options; where
  the token budget is the limit, each option is held to what the budget lets it serve (below).
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
  is share(gamma): decide weighs a change by the tokens it moves across the SLO per delivered token
  (policies/decide/value.py), not by a ratio of shares.
  Measured shares. When the window holds at least `slo_min_requests` finished requests in vLLM's per-request
  ITL histogram (`Evidence.request_itl`), the log-normal is fitted to it instead (its mean and its spread, the
  model's only in the ratio between options): policies/model/slo_share.py, which also says why.
  Delivered tokens/s: when capacity-bound, the throughput B(gamma) E[L] / T (B(gamma) from the capacity rule);
  when latency-bound the server already delivers everything asked of it, the same for every option, so
      S_slo = share(gamma) / share(0)          (latency-bound)
  and each option's ITL is priced at the batch that load gives it, not at the measured one: by Little's law the
  batch follows the ITL, B(gamma) = B x ITL_gamma(B(gamma)) / ITL_running (`open_loop_batch`). An option whose
  batch would pass what the KV cache holds (or 4x the measured one, or max_num_seqs where known) cannot hold the
  load: it stops there and is counted at the share it serves, (B_cap / ITL_gamma(B_cap)) / (B / ITL_running),
  times its share meeting the SLO. A deployed k past the curve has no point to anchor this on: every option then
  keeps the measured batch. Speed beyond the SLO earns nothing: a faster token stream is not more tokens meeting
  the SLO, and counting it (as throughput at the current B) would restart a server whose every option meets the
  SLO for a gain that delivers nothing. Example:
  SLO 8 ms, off at 11 ms: share(0) = max(0.01, Phi(ln(8/11) / 0.1) = Phi(-3.18) = 0.0007) = 0.01; gamma 2 at
  5.3 ms (Phi(4.12) = 0.99998) and gamma 3 at 4.7 ms (Phi(5.32) = 1.0): S(2) = 99.998, S(3) = 100.0, so decide's
  minimum-change rule keeps whichever runs. When every option's share sits at the floor (an overload that holds
  every option's ITL past the SLO) no change can gain tokens meeting it, and a restart's dropped requests still
  count: the options keep their floor shares (whichever runs stays) and the reason says that no option meets
  the SLO. (Ranking them by tokens/s instead was tried: it restarted an overloaded server late, dropping its
  queue, and it let the overload's ticks outweigh the light load after it in the plan, keeping a setting that
  met the SLO for a third as many requests; docs/bench.md.) Chunked prefill stretches every
  step by 1 / (1 - rho), rho = the share of the current step spent on prompt tokens, priced by the model as
  1 - T(B, k, P = 0) / T(B, k, P) at the deployed k, whose steps the prefill per step P was measured over
  (policies/model/costmodel.py: prompt load is a rate, the same for every gamma); the ITL above uses the stretched
  step. The throughput ratios are unaffected (the factor cancels). Example: B 203 at k = 3, decode step 51.5 ms,
  P priced at 35.5 ms: rho = 35.5 / 87 = 0.41, stretch 1.69, so gamma 1's 33.7 ms step serves tokens every
  33.7 x 1.69 / 1.72 = 33 ms. (Pricing P against the 21.5 ms plain step instead gave rho = 0.62, stretch 2.65:
  every option far past a 30 ms SLO, and no option worth choosing.)
Bands: E[L] low/high give throughput (and ITL) low/high at the same step time.
The step's token budget: with `ModelContext.step_token_budget` known, each option is held to the output tokens/s it
can serve with every step full at the served prompt/output mix, and under goodput_slo an option so held is priced
at its full step's ITL (policies/model/token_budget.py, with its maths and an example).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from policies.model.acceptance import AcceptancePoint
from policies.model.costmodel import ModelContext, curve_for, step_batch
from policies.model.roofline import CostScales, Shape
from policies.model.slo_share import fit_request_itl, modelled_share, shifted_share
from policies.model.token_budget import BudgetLoad, Regime, budget_limited, budget_limits, budget_load
from policies.types import CurvePoint, Evidence, HistogramReading


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
    requests counted as meeting the SLO (module docstring). `slo_min_requests` (>= 1): finished requests the
    window's per-request ITL histogram needs before the shares are taken from it (policies/model/slo_share.py): at 30,
    a share of 0.5 is known to +-0.09 (one binomial sd), below the gaps between options that matter."""

    itl_slo_s: float | None = None
    kv_full_ratio: float = 0.90
    waiting_threshold: float = 0.5
    slo_itl_spread: float = 0.10
    slo_share_floor: float = 0.01
    slo_min_requests: int = 30

    def __post_init__(self) -> None:
        if self.itl_slo_s is not None and not (math.isfinite(self.itl_slo_s) and self.itl_slo_s > 0):
            raise ValueError(f"itl_slo_s must be a positive number of seconds, got {self.itl_slo_s}")
        if not 0 < self.kv_full_ratio <= 1:
            raise ValueError(f"kv_full_ratio must be in (0, 1], got {self.kv_full_ratio}")
        if self.waiting_threshold < 0 or not self.slo_itl_spread > 0:
            raise ValueError("waiting_threshold must be >= 0 and slo_itl_spread > 0")
        if not 0 < self.slo_share_floor < 1:
            raise ValueError(f"slo_share_floor must be in (0, 1), got {self.slo_share_floor}")
        if self.slo_min_requests < 1:
            raise ValueError(f"slo_min_requests must be >= 1, got {self.slo_min_requests}")


@dataclass(frozen=True, slots=True)
class Workload:
    """The operating point an objective is evaluated at: running `batch` (>= 1), `waiting` requests (>= 0),
    `context_tokens` per sequence, `prefill_tokens` per step, `kv_usage_ratio` (None = unknown), `deployed_k`,
    `request_itl` the window's per-request mean ITLs while the deployed option ran (None = not measured), `budget`
    the step's token budget and the load on it (policies/model/token_budget.py; None = the budget is unknown),
    `max_seqs` the engine's max_num_seqs (None = unknown): no option runs more than max(B, max_num_seqs) sequences
    (B may pass it where a page sums several engines)."""

    batch: float
    waiting: float
    context_tokens: float
    prefill_tokens: float = 0.0
    kv_usage_ratio: float | None = None
    deployed_k: int = 0
    request_itl: HistogramReading | None = None
    budget: BudgetLoad | None = None
    max_seqs: float | None = None
    prefill_chunk_tokens: float | None = None  # the chunk prompt tokens arrive in (roofline.Shape; None = P)

    @property
    def kv_capacity_tokens(self) -> float | None:
        """KV capacity implied by the usage: ctx x B / usage (tokens); None when the usage is unknown or ~0."""
        if self.kv_usage_ratio is None or self.kv_usage_ratio < 0.01:
            return None
        return self.context_tokens * self.batch / self.kv_usage_ratio


def workload_from(
    evidence: Evidence,
    *,
    context_tokens: float,
    prefill_tokens: float,
    tokens_per_seq: float = 1.0,
    budget_tokens: float | None = None,
    max_seqs: float | None = None,
) -> Workload:
    """The evidence's workload with the cost model's resolved context, prefill and tokens verified per sequence
    (costmodel.operating_point) and the engine's step token budget (None = unknown); the prompt chunk is the
    caller's to set (`Workload.prefill_chunk_tokens`, the operating point's).

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
        request_itl=evidence.request_itl,
        budget=budget_load(budget_tokens, evidence, tokens_per_seq=tokens_per_seq, prefill_tokens=prefill_tokens,
                           context_tokens=context_tokens, max_seqs=max_seqs),
        max_seqs=max_seqs,
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
    then min(B + waiting, capacity / (ctx - deployed_k + gamma)) (module docstring), and never more than the
    engine's max_num_seqs where it is known (or B, where a summed page reads more).

    Example: B 64, ctx 264, k 3, usage 1.0, 20 waiting, kv_full: gamma 0 -> min(84, 16896 / 261) = 64.7; with
    max_num_seqs 64 -> 64.
    """
    capacity = workload.kv_capacity_tokens
    if not kv_full or capacity is None:
        return workload.batch
    per_seq = max(workload.context_tokens - workload.deployed_k, 1.0) + gamma
    return max(1.0, min(workload.batch + workload.waiting, capacity / per_seq, _seq_limit(workload)))


def _seq_limit(workload: Workload) -> float:
    """The most sequences an option can run: max(B, max_num_seqs), or unbounded where max_num_seqs is unknown."""
    return math.inf if workload.max_seqs is None else max(workload.batch, workload.max_seqs)


def objective_curve(
    ctx: ModelContext,
    acceptance: Sequence[AcceptancePoint],
    workload: Workload,
    *,
    config: ObjectiveConfig,
    scales: CostScales | None = None,
) -> tuple[tuple[CurvePoint, ...], Objective, str]:
    """The curve S(gamma) in the objective that applies (module docstring), with the objective and why.
    `acceptance` starts at gamma 0, contiguous. Latency objective: exactly `costmodel.curve_for` at B, unless the
    step's token budget binds (each option held to what the budget lets it serve, and under an SLO priced at its
    full step's ITL: policies/model/token_budget.py).

    Example: latency-bound at B = 1 -> the plain curve; capacity-bound with the cache not full -> the same
    numbers (every option holds the same batch) under the name "capacity".
    """
    objective, capacity, why = choose_objective(workload, config)
    kv = workload.kv_usage_ratio
    kv_full = capacity and kv is not None and kv >= config.kv_full_ratio

    def at(batch: float) -> tuple[tuple[CurvePoint, ...], float]:
        return curve_for(ctx, acceptance, Shape(batch=batch, context_tokens=workload.context_tokens), scales=scales)

    base_curve, base_step = at(held_batch(workload, 0, kv_full=kv_full))
    if objective is Objective.LATENCY or (objective is Objective.CAPACITY and not kv_full):
        return _budgeted(ctx, acceptance, workload, (base_curve, objective, why), kv_full=kv_full, scales=scales)
    b0 = held_batch(workload, 0, kv_full=kv_full)
    cache: dict[float, tuple[CurvePoint, ...]] = {b0: base_curve}

    def at_batch(batch: float) -> tuple[CurvePoint, ...]:
        if batch not in cache:
            cache[batch] = at(batch)[0]
        return cache[batch]

    stretch = _prefill_stretch(ctx, acceptance, workload, scales=scales)
    plain_rate = b0 / base_step
    slo = objective is Objective.GOODPUT_SLO
    # Latency-bound under an SLO: every option delivers the offered load; only the share meeting the SLO differs,
    # and each option holds the batch that load gives it (open_loop_batch).
    delivered_fixed = slo and not capacity
    running = min(max(workload.deployed_k, 0), len(acceptance) - 1)
    running_itl_s = at_batch(workload.batch)[running].step_time_s / max(acceptance[running].expected_length, 1.0)
    share = _share_function(workload, len(acceptance), config, running_itl_s=running_itl_s * stretch)
    # The open load is anchored on the option that runs; a deployed k past the curve has no point to anchor it
    # on (its ITL would be another gamma's), so every option then keeps the measured batch.
    open_loop = delivered_fixed and 0 <= workload.deployed_k < len(acceptance)
    cap = _open_loop_cap(workload)

    def batch_for(gamma: int, length: float) -> float:
        if not open_loop:
            return held_batch(workload, gamma, kv_full=kv_full)
        return open_loop_batch(
            workload.batch, running_itl_s, lambda b: at_batch(b)[gamma].step_time_s / max(length, 1.0), cap=cap,
        )

    def served(batch: float, length: float, step: float) -> float:
        """The share of the offered load (workload.batch / running_itl_s, sequences' tokens/s) an option at its
        open-loop batch serves: 1 below the cap (Little's law holds there by construction), its rate at the cap
        over the offered one at it (it cannot hold the load; a queue forms)."""
        if not open_loop or batch < cap * (1.0 - 1e-9):
            return 1.0
        return min(1.0, batch * length / step * running_itl_s / workload.batch)

    limits = None if not slo or workload.budget is None else budget_limits(
        ctx, acceptance, workload.budget, regime=Regime.of(capacity=capacity, kv_full=kv_full), scales=scales)
    b_run = held_batch(workload, running, kv_full=kv_full)
    # The running option's model tokens/s at its held batch: converts rates to and from the measured D.
    run_rate = b_run * max(acceptance[running].expected_length, 1.0) / at_batch(b_run)[running].step_time_s if (
        limits is not None) else 1.0

    def budgeted(gamma: int, length: float, rate: float, itl_s: float) -> tuple[float, float]:
        """(rate, ITL) held to the step's token budget (module docstring): an option whose cap binds serves its
        cap with every step full, at the full step's ITL (what runs keeps its own). `rate` is the share of the
        offered load served when latency-bound, the model's tokens/s when capacity-bound (D x rate / run_rate in
        measured tokens/s; with every step full, each option but what runs serves exactly its cap)."""
        if limits is None or (delivered_fixed and limits.holds(gamma, length)):
            return rate, itl_s
        cap = limits.capacity(gamma, length)
        if delivered_fixed:
            return min(rate, cap / limits.served), limits.full_itl_s(gamma, length)
        held = math.inf if limits.budget_only and gamma != running else limits.served * rate / run_rate
        if held < cap or gamma == running:  # what runs keeps its measured ITL; its band's ends, its cap
            return min(held, cap) * run_rate / limits.served, itl_s
        return cap * run_rate / limits.served, limits.full_itl_s(gamma, length)

    def goodput(gamma: int, length: float, batch: float, step: float) -> tuple[float, float]:
        """(rate x share meeting the SLO, that share) of option gamma at `batch`, its step `step` (s)."""
        rate = served(batch, length, step) if delivered_fixed else batch * length / step
        rate, itl_s = budgeted(gamma, length, rate, step * stretch / max(length, 1.0))
        met = share(itl_s)
        return rate * met, met

    b_plain = batch_for(0, 1.0)
    plain_step = at_batch(b_plain)[0].step_time_s
    plain_goodput, plain_share = goodput(0, 1.0, b_plain, plain_step)
    points: list[CurvePoint] = []
    for acc in acceptance:
        b = batch_for(acc.gamma, acc.expected_length)
        point = at_batch(b)[acc.gamma]
        if acc.gamma == 0:
            points.append(replace(point, slo_share=plain_share) if slo else point)
            continue

        def ratio(length: float, step: float = point.step_time_s, batch: float = b, gamma: int = acc.gamma) -> float:
            if slo:
                return goodput(gamma, length, batch, step)[0] / plain_goodput if plain_goodput > 0 else 0.0
            return batch * length / step / plain_rate

        at_length = goodput(acc.gamma, acc.expected_length, b, point.step_time_s) if slo else None
        points.append(
            CurvePoint(
                gamma=acc.gamma,
                speedup=ratio(acc.expected_length) if at_length is None else (
                    at_length[0] / plain_goodput if plain_goodput > 0 else 0.0),
                speedup_low=ratio(acc.expected_length_low),
                speedup_high=ratio(acc.expected_length_high),
                expected_accepted_length=acc.expected_length,
                step_time_s=point.step_time_s,
                extrapolated=acc.extrapolated,
                extrapolated_share=acc.extrapolated_share,
                slo_share=None if at_length is None else at_length[1],
            )
        )
    if slo and _slo_unmet(points, config):
        why += "; no option meets it (every share at the floor): no change can gain tokens meeting it"
    if limits is not None:
        short = [] if limits.queued else [g for g in range(1, len(points)) if not limits.holds(g)]
        why += limits.note(short)
    return _budgeted(ctx, acceptance, workload, (tuple(points), objective, why), kv_full=kv_full, scales=scales)


def _prefill_stretch(
    ctx: ModelContext, acceptance: Sequence[AcceptancePoint], workload: Workload, *, scales: CostScales | None
) -> float:
    """1 / (1 - rho), rho the prompt tokens' share of the step the server runs now (module docstring); 1.0 without
    prefill. The prefill per step was measured over steps of the deployed gamma, so it is priced against that step,
    not against a plain one (a plain step is shorter: the same prefill would read as a larger share of it and
    stretch every option too far)."""
    if workload.prefill_tokens <= 0:
        return 1.0
    k = min(max(workload.deployed_k, 0), len(acceptance) - 1)
    shape = Shape(batch=workload.batch, context_tokens=workload.context_tokens)
    with_prefill = replace(shape, prefill_tokens=workload.prefill_tokens,
                           prefill_chunk_tokens=workload.prefill_chunk_tokens)
    mixed = curve_for(ctx, acceptance[: k + 1], with_prefill, scales=scales)[0][k].step_time_s
    plain_now = curve_for(ctx, acceptance[: k + 1], shape, scales=scales)[0][k].step_time_s
    return mixed / plain_now


def _budgeted(
    ctx: ModelContext,
    acceptance: Sequence[AcceptancePoint],
    workload: Workload,
    priced: tuple[tuple[CurvePoint, ...], Objective, str],
    *,
    kv_full: bool,
    scales: CostScales | None,
) -> tuple[tuple[CurvePoint, ...], Objective, str]:
    """`priced` (curve, objective, why) with each option held to what the step's token budget lets it serve
    (policies/model/token_budget.py), under latency and capacity; unchanged without a budget or under an SLO."""
    curve, objective, why = priced
    if workload.budget is None or objective is Objective.GOODPUT_SLO:
        return priced
    regime = Regime.of(capacity=objective is not Objective.LATENCY, kv_full=kv_full)
    limited, note = budget_limited(curve, ctx, acceptance, workload.budget, regime=regime, scales=scales)
    return limited, objective, why + note


def _slo_unmet(points: Sequence[CurvePoint], config: ObjectiveConfig) -> bool:
    """Every option's share meeting the SLO is at the floor (within rounding): the SLO cannot be met at this load."""
    ceiling = config.slo_share_floor * (1.0 + 1e-6)
    return all(p.slo_share is not None and p.slo_share <= ceiling for p in points)


def open_loop_batch(
    running_batch: float, running_itl_s: float, itl_at: Callable[[float], float], *, cap: float
) -> float:
    """The batch (sequences, 1..cap) an option holds when the offered load stays what it is (no queue): Little's
    law, requests decoding = arrival rate x output tokens x ITL, with the traffic's arrival rate and output lengths
    the same under every option, so the batch follows the option's ITL:
        B(gamma) = B_c x ITL_gamma(B(gamma)) / ITL_c        B_c, ITL_c: the running option's batch and ITL (s)
    `itl_at(B)` is the option's ITL at batch B (s, from the cost model, as is `running_itl_s`: the ratio is the
    model's, the level the measured batch). Solved by fixed-point iteration from B_c: the step grows less than in
    proportion to the batch (its fixed and weight-streaming parts do not grow), so each iteration shrinks the
    error by the batch-proportional share of the step, and 1% is reached in a few. An option whose ITL grows as
    fast as its batch cannot hold the load at all (a queue forms): it stops at `cap`.
    Why: compared at the measured batch, a faster option would leave the batch as it was. Under an open load it
    does not: requests finish sooner, fewer are in flight, and each step is shorter again. With B ~200 at gamma 3
    and a 30 ms SLO, gamma 1 priced at gamma 3's batch meets the SLO for a few percent of requests where at the
    batch it holds it meets it for most: the batch an option holds, not the measured one, sets its share.
    Example: B_c 200 at ITL_c 37 ms; an option with ITL(B) = 12 ms + 0.11 ms x B (34 ms at B_c): 200 x 34 / 37
    = 184 -> ITL 32.2 ms -> 174 -> 31.2 ms -> 168 ... -> B = 160, ITL 29.6 ms.
    """
    if not (math.isfinite(running_itl_s) and running_itl_s > 0 and running_batch >= 1):
        return max(1.0, running_batch)
    batch = running_batch
    for _ in range(_OPEN_LOOP_ITERATIONS):
        itl = itl_at(batch)
        if not (math.isfinite(itl) and itl > 0):
            return max(1.0, running_batch)
        following = min(cap, max(1.0, running_batch * itl / running_itl_s))
        if abs(following - batch) <= _OPEN_LOOP_TOLERANCE * batch:
            return following
        batch = following
    return batch


# The most an option's open-loop batch may grow over the measured one; past it the option is overloaded.
OPEN_LOOP_MAX_GROWTH = 4.0
_OPEN_LOOP_ITERATIONS = 30
_OPEN_LOOP_TOLERANCE = 0.005


def _open_loop_cap(workload: Workload) -> float:
    """OPEN_LOOP_MAX_GROWTH x the batch, and no more sequences than the KV cache holds at this context nor than the
    engine runs (max_num_seqs, where known)."""
    cap = min(OPEN_LOOP_MAX_GROWTH * workload.batch, _seq_limit(workload))
    capacity = workload.kv_capacity_tokens
    if capacity is not None and workload.context_tokens > 0:
        cap = min(cap, max(workload.batch, capacity / workload.context_tokens))
    return max(1.0, cap)


def _share_function(
    workload: Workload, options: int, config: ObjectiveConfig, *, running_itl_s: float
) -> Callable[[float], float]:
    """ITL (s) -> share meeting the SLO: shifted from the window's per-request histogram when it holds at least
    `slo_min_requests` requests and the running option is one of the `options` on the curve, else modelled
    (policies/model/slo_share.py). `running_itl_s`: the running option's model ITL, its step x stretch / E[L]."""
    slo_s = config.itl_slo_s
    if slo_s is None:
        return lambda itl_s: 1.0

    def modelled(itl_s: float) -> float:
        return slo_share(itl_s, config)

    measured = workload.request_itl
    if measured is None or measured.count < config.slo_min_requests or not 0 <= workload.deployed_k < options:
        return modelled
    fitted = fit_request_itl(measured, prior_spread=config.slo_itl_spread)
    if fitted is None:
        return modelled

    def shifted(itl_s: float) -> float:
        share = shifted_share(
            fitted, slo_s=slo_s, running_itl_s=running_itl_s, itl_s=itl_s, floor=config.slo_share_floor
        )
        return modelled(itl_s) if share is None else share

    return shifted


def slo_share(itl_s: float, config: ObjectiveConfig) -> float:
    """Share (floor..1) of requests whose own mean inter-token latency meets the SLO when the mean is `itl_s`
    (s, > 0), modelled: max(floor, Phi(ln(SLO / ITL) / sigma)) (module docstring); 1.0 without an SLO.

    Example: SLO 8 ms, sigma 0.10: ITL 8 ms -> 0.5; 7.2 ms -> Phi(1.05) = 0.853; 11 ms -> the floor 0.01.
    """
    if config.itl_slo_s is None:
        return 1.0
    return modelled_share(itl_s, slo_s=config.itl_slo_s, spread=config.slo_itl_spread, floor=config.slo_share_floor)
