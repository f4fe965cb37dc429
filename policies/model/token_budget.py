"""The step's token budget: what speculation costs a server whose scheduler caps the tokens per engine step.

vLLM schedules at most N = `max_num_batched_tokens` tokens per step. A decoding request takes 1 + gamma of them
(its token and gamma drafts to verify); chunked prefill fills what is left with prompt tokens. Over its life a
request of p prompt and o output tokens therefore uses p + o (1 + gamma) / E[L] of budget. When every step is
full, the served mix sets how the budget splits (r = p / o, the served prompt-to-output ratio):

    B_g = min(N / (r E[L] + 1 + g), M)      sequences decoding per step      (M: max_num_seqs, where known)
    P_g = B_g r E[L]                         prompt tokens per step           (B_g (1 + g) + P_g = N below M)
    cap(g) = B_g E[L] / T(B_g, g, P_g)      output tokens/s                  (T: the calibrated step with drafting)

cap(g) is the most option g can serve on one engine: the KV cache only lowers it. Where the budget would hold
more sequences than max_num_seqs M, M holds them and the step is not full: off, which takes the fewest tokens per
sequence, is the option M caps first (N 2048, r 2, M 256: B_0 = 2048 / 3 = 683 -> 256, while gamma 4 with E[L]
3.08, B_4 = 2048 / 11.2 = 183; unknown M credits off with 2.7x the sequences, and gamma 1 reads 0.92 of off's
throughput where M makes it 0.97: tests/unit/test_token_budget.py). The less the prompts leave of the step to
decoding, the less it matters: the step then grows with its prompt tokens, whoever runs.
Units: N tokens per step, r >= 0, E[L] tokens per verification (1 at g = 0), T seconds, cap tokens/s. Example
(A100, an 8B model, N 512, r 3.0): off, B_0 = 512 / 4 = 128, P_0 = 384; gamma 4 with E[L] 2.99, B_4 = 512 /
13.97 = 36.6, P_4 = 329; at equal step times cap(4) / cap(0) = 36.6 x 2.99 / 128 = 0.86: every verified draft
that is rejected takes a prompt token's place, so at a budget-bound load deeper speculation admits less.

How it enters the objectives (policies/model/objectives.py), only when some option's step at this batch could
fill the budget (B (1 + gamma_max) + P >= N; else the budget never binds and the curve is unchanged):
- D, the output tokens/s one engine serves now: the lesser of B E[L](running) / T_obs from the window's own
  steps (a fleet summed by Prometheus reads per engine) and the generation rate over the engines (an engine idle
  part of the window serves less than while it steps);
- the option that runs holds D: where the model gives it less capacity, every cap is scaled by D / cap(running)
  (the model's absolute step time is off, the ratios stand); where its steps are full and requests wait it
  serves exactly its cap, and the caps are scaled to D either way;
- latency (no queue): an option whose cap is under D cannot hold the load (its queue would grow without bound):
  it is counted at the throughput it serves against what plain decoding serves, S(g) = cap(g) / min(D, cap(0)),
  instead of its per-sequence speed (the running option holds D by definition);
- capacity (a queue): each option serves min(its rate at the held batch, cap(g)); when the running option's steps
  already fill the budget (measured tokens per step >= BUDGET_FULL x N) and the KV cache is not the limit, the
  budget is, and every option serves cap(g): S(g) = cap(g) / cap(0). Where max_num_seqs is not known
  (`targets[].max_num_seqs` unset) and B_0 passes it, off's cap is too high.
- goodput_slo: each option's rate is held to its cap as above (a share of the offered load when latency-bound,
  tokens/s when capacity-bound), and an option whose cap binds runs full steps: its requests' mean ITL is
  T(B_g, g, P_g) / E[L], with B_g sequences a step rather than the held batch, so its share meeting the SLO is
  taken there (what runs keeps its own ITL). goodput(g) = rate x share, S = goodput(g) / goodput(0). A full
  budget throttles admission: fewer requests run, and they step sooner, so under an ITL SLO a drafting option
  can meet it where it would not at the held batch (the requests it leaves queued count against TTFT, which the
  ITL SLO does not grade). Example (A100, an 8B model): off running 120 sequences, 390 prompt tokens a step, N
  512, r 3: gamma 1 holds 512 / (3 x 1.78 + 2) = 70 sequences and 372 prompt tokens a step; that full step
  takes 54 ms, 31 ms per token, inside a 40 ms SLO that its step at the held 120 sequences, stretched by their
  prefill, misses (tests/unit/test_token_budget_slo.py). A point's `step_time_s` stays the held batch's step.
The band: E[L] low/high give B_g, P_g, T and cap again. Prefix caching lowers the computed prompt tokens and the
prompt counter may count cached ones: r is then too high and the budget's cost of drafts too low.

At one operating point (the what-if and the per-batch schedules, policies/offline/: B sequences running, P prompt
tokens per step, no load mix) the load's prompt tokens are the same for every gamma (prefill deferred is not work
saved: the prompts must be computed for the requests to run at all), and the running sequences share the rest of
the budget, q_g tokens each (1 + gamma, or a tree's nodes + 1). So a step holds n_g = min(B, (N - P) / q_g) of the
B sequences, and a sequence steps n_g / B of the steps on average (vLLM takes the running requests in order, so
which ones wait varies; the mean is what a sequence's speed averages to) (`curve_within_budget`):

    T_eff(g) = T(n_g, g, P) x B / n_g        s between one sequence's steps
    S(g)     = E[L](g) x T_eff(0) / T_eff(g)

N - P must hold at least one whole sequence (q_g tokens) at every gamma priced (ValueError otherwise; vLLM would
trim the drafts to fit, `fitting_gammas` says which gammas fit). Example (N 512, B 128, P 0): off holds all 128
(q 1); gamma 4 (q 5) holds 102.4 a step, so each sequence steps 80% of the steps: with T(102.4, 4) 30 ms and
T(128, 0) 25 ms, S(4) = 2.99 x 25 / (30 / 0.8) = 1.99, where the unbudgeted step T(128, 4) 36 ms would give 2.08.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from policies.model.acceptance import AcceptancePoint
from policies.model.costmodel import (
    ModelContext,
    OperatingPoint,
    curve_for,
    observed_step_s,
    step_batch,
    step_time_at,
)
from policies.model.roofline import CostScales, Shape
from policies.types import CurvePoint, Evidence

# The share of the budget the running option's measured steps must carry to count as budget-bound (a full step
# is N tokens exactly; the measured mean sits a little under it where the queue empties between bursts).
BUDGET_FULL = 0.9


class Regime(StrEnum):
    """The objective the budget limits (policies/model/objectives.py): no queue; a queue; a queue with the KV
    cache the limit of the held batch (the curve's own B(gamma) stays a limit then)."""

    LATENCY = "latency"
    CAPACITY = "capacity"
    CAPACITY_KV = "capacity_kv"

    @classmethod
    def of(cls, *, capacity: bool, kv_full: bool) -> Regime:
        """The regime of a capacity-bound (or not) window, with the KV cache full (or not)."""
        return (cls.CAPACITY_KV if kv_full else cls.CAPACITY) if capacity else cls.LATENCY


@dataclass(frozen=True, slots=True)
class BudgetLoad:
    """What the budget's physics needs from one window: `budget_tokens` N (tokens per step, > 0), `prompt_per_output`
    r (served prompt tokens per output token, >= 0), `served_tokens_per_s` (output tokens/s of one engine, > 0: the
    generation rate over the engines; `served` prefers the window's steps), and the running option's step: `batch`
    sequences decoding (>= 1), `prefill_tokens` (>= 0), `tokens_per_step` (decode + prefill, >= 0),
    `context_tokens` (>= 0), its gamma `running` (0 = off) and its observed `step_time_s` (None = not measured);
    `max_seqs` M, the engine's max_num_seqs (None = unknown)."""

    budget_tokens: float
    prompt_per_output: float
    served_tokens_per_s: float
    tokens_per_step: float
    context_tokens: float
    batch: float = 1.0
    prefill_tokens: float = 0.0
    running: int = 0
    step_time_s: float | None = None
    max_seqs: float | None = None

    def served(self, emitted_per_seq: float) -> float:
        """D (tokens/s of one engine): the lesser of B x `emitted_per_seq` (E[L] of the running option) / the
        observed step and `served_tokens_per_s`. The first is one engine's rate while it steps (a fleet summed by
        Prometheus reads as one engine with every replica's tokens); the second the average over the window (an
        engine idle part of it serves less than while it steps). Example: B 41, E[L] 2.79, step 0.127 s -> 901
        tokens/s, or 500 when the generation rate over the engines is 500."""
        step = self.step_time_s
        if step is not None and math.isfinite(step) and step > 0 and emitted_per_seq >= 1:
            return min(self.batch * emitted_per_seq / step, self.served_tokens_per_s)
        return self.served_tokens_per_s

    @property
    def full(self) -> bool:
        """The running option's steps already fill the budget (>= BUDGET_FULL x N)."""
        return self.tokens_per_step >= BUDGET_FULL * self.budget_tokens


def budget_load(
    budget_tokens: float | None, evidence: Evidence, *, tokens_per_seq: float, prefill_tokens: float,
    context_tokens: float, max_seqs: float | None = None,
) -> BudgetLoad | None:
    """The window's BudgetLoad, or None when the budget is unknown, the generation rate is missing, non-finite or
    zero, or the prompt rate is missing, non-finite or negative. The running step carries B x tokens_per_seq +
    prefill_tokens tokens, B the batch the cost model prices (`costmodel.step_batch`, >= 1); non-finite or negative
    prefill and context count as 0.

    Example: N 512, prompt 3300 tokens/s, generation 1100 tokens/s on one engine, 110 sequences at 1 token and 330
    prompt tokens per step, off -> r 3.0, 1100 tokens/s, 440 tokens per step, not full.
    """
    prompt, generation = evidence.prompt_tokens_per_s, evidence.generation_tokens_per_s
    if budget_tokens is None or prompt is None or generation is None:
        return None
    if not all(math.isfinite(v) for v in (budget_tokens, prompt, generation)):
        return None
    if budget_tokens <= 0 or generation <= 0 or prompt < 0:
        return None
    batch = max(step_batch(evidence), 1.0)
    prefill = _non_negative(prefill_tokens)
    return BudgetLoad(
        budget_tokens=budget_tokens,
        prompt_per_output=prompt / generation,
        served_tokens_per_s=generation / max(evidence.engines, 1),
        tokens_per_step=batch * _non_negative(tokens_per_seq) + prefill,
        context_tokens=_non_negative(context_tokens),
        batch=batch,
        prefill_tokens=prefill,
        running=evidence.deployed_k if evidence.speculation_on else 0,
        step_time_s=observed_step_s(evidence),
        max_seqs=max_seqs,
    )


def _non_negative(value: float) -> float:
    return value if math.isfinite(value) and value > 0 else 0.0


def _full_step(
    ctx: ModelContext, acceptance: Sequence[AcceptancePoint], load: BudgetLoad, gamma: int, *,
    length: float | None, scales: CostScales | None,
) -> tuple[float, float, float]:
    """(B_g, E[L], T(B_g, g, P_g)): option gamma's step with every step full at the served mix (module docstring);
    `length` replaces E[L] (the band's ends). B_g may be under 1: where one sequence and its prompt share pass N,
    prompts span steps and fewer than one sequence decodes a step on average; the step is then priced with one."""
    point = acceptance[gamma]
    e = max(point.expected_length if length is None else length, 1.0)
    verified = verified_tokens(point)
    share = load.prompt_per_output * e + verified
    batch, prefill = load.budget_tokens / share, load.budget_tokens * load.prompt_per_output * e / share
    if load.max_seqs is not None and batch > load.max_seqs:
        batch = max(load.max_seqs, 1.0)
        prefill = batch * load.prompt_per_output * e
    point_at = OperatingPoint(batch=max(batch, 1.0), context_tokens=load.context_tokens, tokens_per_seq=verified,
                              draft_steps=gamma, prefill_tokens=prefill)
    return batch, e, step_time_at(ctx, point_at, scales=scales)  # gamma's step alone, as curve_for prices it


def capacity_tokens_per_s(
    ctx: ModelContext, acceptance: Sequence[AcceptancePoint], load: BudgetLoad, gamma: int, *,
    length: float | None = None, scales: CostScales | None = None,
) -> float:
    """cap(gamma) (module docstring), output tokens/s, > 0; `length` replaces E[L] (the band's ends).

    Example: N 512, r 3.0, gamma 4, E[L] 2.99, T(36.6, 4, 329) 80 ms -> 36.6 x 2.99 / 0.080 = 1368 tokens/s.
    """
    return _cap(*_full_step(ctx, acceptance, load, gamma, length=length, scales=scales))


def _cap(batch: float, e: float, step: float) -> float:
    """B_g E[L] / T: tokens/s of one full step (`_full_step`'s triple)."""
    return batch * e / step if step > 0 else math.inf


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    """What the budget lets each option serve in one window (module docstring): `served` D (tokens/s of one
    engine), `scale` (the measured-over-model factor every cap is multiplied by), `queued` (a queue: each option
    serves at most its cap; else an option under D cannot hold the load), `budget_only` (the running option's
    steps fill the budget and the KV cache is not the limit: every option serves exactly its cap); `steps` each
    gamma's full step at its E[L] (`_full_step`), priced once for its cap and its ITL."""

    ctx: ModelContext
    acceptance: tuple[AcceptancePoint, ...]
    load: BudgetLoad
    scales: CostScales | None
    steps: tuple[tuple[float, float, float], ...]
    served: float
    scale: float
    queued: bool
    budget_only: bool

    def capacity(self, gamma: int, length: float | None = None) -> float:
        """cap(gamma) x scale: tokens/s option gamma serves with every step full (`length` replaces E[L])."""
        return _cap(*self._step(gamma, length)) * self.scale

    def holds(self, gamma: int, length: float | None = None) -> bool:
        """The option serves the load D without a queue (the running option does by definition)."""
        return gamma == self.load.running or self.capacity(gamma, length) >= self.served * (1.0 - 1e-9)

    def full_itl_s(self, gamma: int, length: float | None = None) -> float:
        """The model's inter-token latency of option gamma with every step full: T(B_g, g, P_g) / E[L] (s)."""
        _, e, step = self._step(gamma, length)
        return step / e

    def _step(self, gamma: int, length: float | None) -> tuple[float, float, float]:
        if length is None or length == self.acceptance[gamma].expected_length:
            return self.steps[gamma]
        return _full_step(self.ctx, self.acceptance, self.load, gamma, length=length, scales=self.scales)

    def note(self, short: Sequence[int] = ()) -> str:
        """The reason's words: the budget, how full the running steps are, and the options that cannot hold D."""
        load = self.load
        state = "every step full" if load.full else f"{load.tokens_per_step:.0f} tokens per step"
        note = f"; token budget {load.budget_tokens:.0f} per step ({state}, prompt/output {load.prompt_per_output:.1f})"
        if short:
            note += f": gamma {', '.join(map(str, short))} cannot hold {self.served:.0f} tokens/s"
        return note


def budget_limits(
    ctx: ModelContext, acceptance: Sequence[AcceptancePoint], load: BudgetLoad, *, regime: Regime,
    scales: CostScales | None = None,
) -> BudgetLimits | None:
    """The window's BudgetLimits, or None when the budget cannot bind at this batch (no option's step could fill
    it: B (1 + gamma_max) + P < N) or the running gamma is past the curve. The running option serves D: at its cap
    when its steps are full and requests wait, within it otherwise, so the caps are scaled by D / cap(running)
    then, and by at least 1 otherwise (module docstring)."""
    top = len(acceptance) - 1
    run = load.running
    if top < 1 or run > top or load.batch * (top + 1) + load.prefill_tokens < load.budget_tokens:
        return None
    steps = tuple(_full_step(ctx, acceptance, load, g, length=None, scales=scales) for g in range(top + 1))
    served = load.served(acceptance[run].expected_length)
    queued = regime is not Regime.LATENCY
    running_cap = _cap(*steps[run])
    anchor = served / running_cap if running_cap > 0 else 1.0
    return BudgetLimits(
        ctx=ctx, acceptance=tuple(acceptance), load=load, scales=scales, steps=steps, served=served,
        scale=anchor if queued and load.full else max(1.0, anchor), queued=queued,
        budget_only=load.full and regime is Regime.CAPACITY,
    )


def budget_limited(
    curve: Sequence[CurvePoint],
    ctx: ModelContext,
    acceptance: Sequence[AcceptancePoint],
    load: BudgetLoad,
    *,
    regime: Regime,
    scales: CostScales | None = None,
) -> tuple[tuple[CurvePoint, ...], str]:
    """The curve with each option held to what the budget lets it serve (module docstring), and a note for the
    reason ("" when the budget cannot bind at this batch, or the running gamma is past the curve: the curve is
    returned unchanged). The curve is a throughput or per-sequence speed ratio (latency, capacity).

    Example: latency, D 1100 tokens/s, running off with cap(0) 1300: cap(4) 1040 < 1100 -> S(4) 2.1 becomes
    1040 / 1100 = 0.95; cap(1) 1260 holds the load and S(1) stays.
    """
    limits = budget_limits(ctx, acceptance[: len(curve)], load, regime=regime, scales=scales)
    if limits is None:
        return tuple(curve), ""
    run, served = load.running, limits.served
    plain_cap = limits.capacity(0)
    base = curve[run].speedup

    def limited(gamma: int, speedup: float, length: float) -> float:
        capacity = limits.capacity(gamma, length)
        if not limits.queued:
            return speedup if limits.holds(gamma, length) else min(speedup, capacity / min(served, plain_cap))
        held = math.inf if limits.budget_only and gamma != run else served * speedup / base
        plain_held = math.inf if limits.budget_only and run != 0 else served / base
        return min(held, capacity) / min(plain_held, plain_cap)

    points = [curve[0]]
    for p in curve[1:]:
        acc = acceptance[p.gamma]
        points.append(replace(
            p,
            speedup=limited(p.gamma, p.speedup, acc.expected_length),
            speedup_low=limited(p.gamma, p.speedup_low, acc.expected_length_low),
            speedup_high=limited(p.gamma, p.speedup_high, acc.expected_length_high),
        ))
    short = [] if limits.queued else [p.gamma for p in points[1:] if not limits.holds(p.gamma)]
    return tuple(points), limits.note(short)


def verified_tokens(acceptance: AcceptancePoint, *, tree_tokens: float | None = None) -> float:
    """q: the tokens one sequence takes of a step at this point's gamma (1 + gamma for a chain, the tree's nodes +
    1 for a tree drafter at gamma >= 1, the point's own count where an n-gram drafts shorter; 1 at gamma 0)."""
    if acceptance.gamma == 0:
        return 1.0
    if tree_tokens is not None:
        return tree_tokens + 1.0
    return acceptance.verified_tokens if acceptance.verified_tokens is not None else acceptance.gamma + 1.0


def fitting_gammas(
    budget_tokens: float | None, acceptance: Sequence[AcceptancePoint], at: Shape, *, tree_tokens: float | None = None
) -> int:
    """How many of `acceptance`'s points (gamma 0, 1, ...) fit one whole sequence in a step with `at`'s prompt
    tokens (the mean q_g <= N - P, module docstring; an n-gram's q is its mean verified tokens, below 1 + gamma);
    all of them without a budget. Example: N 8, P 4 -> gamma 0..3."""
    if budget_tokens is None:
        return len(acceptance)
    room = budget_tokens - at.prefill_tokens
    count = 0
    for point in acceptance:
        if verified_tokens(point, tree_tokens=tree_tokens) > room:
            break
        count += 1
    return count


def curve_within_budget(
    ctx: ModelContext,
    acceptance: Sequence[AcceptancePoint],
    at: Shape,
    *,
    scales: CostScales | None = None,
    tree_tokens: float | None = None,
) -> tuple[tuple[CurvePoint, ...], float]:
    """`costmodel.curve_for` at one operating point under the engine's step budget N (`ctx.step_token_budget`;
    None: `curve_for` as it is), as the module docstring fills a step: each point's `step_time_s` and the returned
    plain step are T_eff, the seconds between one sequence's steps (the step itself where every sequence fits),
    and S is E[L] x T_eff(0) / T_eff(gamma), its band at E[L]'s ends. Same arguments and errors as `curve_for`, and
    ValueError where N - P cannot hold one sequence at some gamma of `acceptance` (`fitting_gammas`).

    Example: N 512, B 128, P 0, gamma 4 -> 102.4 sequences a step, T_eff(4) = T(102.4, 4) / 0.8 (module docstring).
    """
    curve, base = curve_for(ctx, acceptance, at, scales=scales, tree_tokens=tree_tokens)
    budget = ctx.step_token_budget
    if budget is None:
        return curve, base
    if fitting_gammas(budget, acceptance, at, tree_tokens=tree_tokens) < len(acceptance):
        raise ValueError(f"a step budget of {budget:g} tokens with {at.prefill_tokens:g} prompt tokens a step holds "
                         f"no whole sequence at gamma {len(acceptance) - 1}")
    room = budget - at.prefill_tokens

    def held(tokens_per_seq: float) -> float:
        """n / B: the share of the B sequences one step holds."""
        return min(1.0, room / (tokens_per_seq * at.batch))

    def effective(point: CurvePoint, tokens_per_seq: float) -> float:
        """T_eff: the step with n = share x B sequences (gamma's step alone, as curve_for prices it), over the
        share."""
        share = held(tokens_per_seq)
        if share >= 1.0:
            return point.step_time_s
        # A full step leaves no room for prompt tokens beyond P: every step carries a chunk of exactly P
        # (costmodel.prefill_chunk: max(P, N - n q) = P), so the shape's chunk does not apply here.
        fewer = OperatingPoint(batch=share * at.batch, context_tokens=at.context_tokens, tokens_per_seq=tokens_per_seq,
                               draft_steps=point.gamma, prefill_tokens=at.prefill_tokens)  # batch >= 1: room >= q
        return step_time_at(ctx, fewer, scales=scales) / share

    base = effective(curve[0], 1.0)
    points = [replace(curve[0], step_time_s=base)]
    for point in curve[1:]:
        acc = acceptance[point.gamma]
        step = effective(point, verified_tokens(acc, tree_tokens=tree_tokens))
        points.append(replace(
            point, step_time_s=step, speedup=acc.expected_length * base / step,
            speedup_low=acc.expected_length_low * base / step, speedup_high=acc.expected_length_high * base / step,
        ))
    return tuple(points), base
