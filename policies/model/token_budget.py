"""The step's token budget: what speculation costs a server whose scheduler caps the tokens per engine step.

vLLM schedules at most N = `max_num_batched_tokens` tokens per step. A decoding request takes 1 + gamma of them
(its token and gamma drafts to verify); chunked prefill fills what is left with prompt tokens. Over its life a
request of p prompt and o output tokens therefore uses p + o (1 + gamma) / E[L] of budget. When every step is
full, the served mix sets how the budget splits (r = p / o, the served prompt-to-output ratio):

    B_g = N / (r E[L] + 1 + g)              sequences decoding per step
    P_g = N r E[L] / (r E[L] + 1 + g)       prompt tokens per step           (B_g (1 + g) + P_g = N)
    cap(g) = B_g E[L] / T(B_g, g, P_g)      output tokens/s                  (T: the calibrated step with drafting)

cap(g) is the most option g can serve: other limits (max_num_seqs, the KV cache) only lower it. Units: N tokens
per step, r >= 0, E[L] tokens per verification (1 at g = 0), T seconds, cap tokens/s. Example (A100, an 8B model,
N 512, r 3.0): off, B_0 = 512 / 4 = 128, P_0 = 384; gamma 4 with E[L] 2.99, B_4 = 512 / 13.97 = 36.6,
P_4 = 329; at equal step times cap(4) / cap(0) = 36.6 x 2.99 / 128 = 0.86: every verified draft that is
rejected takes a prompt token's place, so at a budget-bound load deeper speculation admits less.

How it enters the objectives (policies/model/objectives.py), only when some option's step at this batch could
fill the budget (B (1 + gamma_max) + P >= N; else the budget never binds and the curve is unchanged):
- the option that runs holds the load it serves (D, output tokens/s, measured): where the model gives it less
  capacity, every cap is scaled by D / cap(running) (the model's absolute step time is off, the ratios stand);
  where its steps are full and requests wait it serves exactly its cap, and the caps are scaled to D either way;
- latency (no queue): an option whose cap is under D cannot hold the load (its queue would grow without bound):
  it is counted at the throughput it serves, S(g) = cap(g) / D, instead of its per-sequence speed;
- capacity (a queue): each option serves min(its rate at the held batch, cap(g)); when the running option's steps
  already fill the budget (measured tokens per step >= BUDGET_FULL x N) the budget, not the batch, is the limit, so
  every option serves cap(g): S(g) = cap(g) / cap(0).
The band: E[L] low/high change B_g, P_g and cap at the same step time. Prefix caching lowers the computed prompt
tokens and the prompt counter may count cached ones: r is then too high and the budget's cost of drafts too low.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.model.acceptance import AcceptancePoint
from policies.model.costmodel import ModelContext, curve_for, step_batch
from policies.model.roofline import CostScales, Shape
from policies.types import CurvePoint, Evidence

# The share of the budget the running option's measured steps must carry to count as budget-bound (a full step
# is N tokens exactly; the measured mean sits a little under it where the queue empties between bursts).
BUDGET_FULL = 0.9


@dataclass(frozen=True, slots=True)
class BudgetLoad:
    """What the budget's physics needs from one window: `budget_tokens` N (tokens per step, > 0), `prompt_per_output`
    r (served prompt tokens per output token, >= 0), `served_tokens_per_s` D (output tokens/s, > 0), and the running
    option's step: `batch` sequences decoding (>= 1), `prefill_tokens` (>= 0), `tokens_per_step` (decode + prefill,
    >= 0), `context_tokens` (>= 0) and its gamma, `running` (0 = off)."""

    budget_tokens: float
    prompt_per_output: float
    served_tokens_per_s: float
    tokens_per_step: float
    context_tokens: float
    batch: float = 1.0
    prefill_tokens: float = 0.0
    running: int = 0

    @property
    def full(self) -> bool:
        """The running option's steps already fill the budget (>= BUDGET_FULL x N)."""
        return self.tokens_per_step >= BUDGET_FULL * self.budget_tokens


def budget_load(
    budget_tokens: float | None, evidence: Evidence, *, tokens_per_seq: float, prefill_tokens: float,
    context_tokens: float,
) -> BudgetLoad | None:
    """The window's BudgetLoad, or None when the budget is unknown or the evidence's prompt and generation rates
    are missing, non-finite or zero. The running step carries B x tokens_per_seq + prefill_tokens tokens, B the
    batch the cost model prices (`costmodel.step_batch`, >= 1).

    Example: N 512, prompt 3300 tokens/s, generation 1100 tokens/s, 110 sequences at 1 token and 330 prompt tokens
    per step, off -> r 3.0, D 1100, 440 tokens per step, not full.
    """
    prompt, generation = evidence.prompt_tokens_per_s, evidence.generation_tokens_per_s
    if budget_tokens is None or prompt is None or generation is None:
        return None
    if not all(math.isfinite(v) for v in (budget_tokens, prompt, generation)):
        return None
    if budget_tokens <= 0 or generation <= 0 or prompt < 0:
        return None
    batch = max(step_batch(evidence), 1.0)
    return BudgetLoad(
        budget_tokens=budget_tokens,
        prompt_per_output=prompt / generation,
        served_tokens_per_s=generation,
        tokens_per_step=max(batch * tokens_per_seq + prefill_tokens, 0.0),
        context_tokens=max(context_tokens, 0.0),
        batch=batch,
        prefill_tokens=max(prefill_tokens, 0.0),
        running=evidence.deployed_k if evidence.speculation_on else 0,
    )


def capacity_tokens_per_s(
    ctx: ModelContext, acceptance: Sequence[AcceptancePoint], load: BudgetLoad, gamma: int, *,
    length: float | None = None, scales: CostScales | None = None,
) -> float:
    """cap(gamma) (module docstring), output tokens/s, > 0; `length` replaces E[L] (the band's ends).

    Example: N 512, r 3.0, gamma 4, E[L] 2.99, T(36.6, 4, 329) 80 ms -> 36.6 x 2.99 / 0.080 = 1368 tokens/s.
    """
    point = acceptance[gamma]
    e = max(point.expected_length if length is None else length, 1.0)
    verified = point.verified_tokens if point.verified_tokens is not None else gamma + 1.0
    share = load.prompt_per_output * e + verified
    batch = max(load.budget_tokens / share, 1.0)
    prefill = load.budget_tokens * load.prompt_per_output * e / share
    shape = Shape(batch=batch, context_tokens=load.context_tokens, prefill_tokens=prefill)
    step = curve_for(ctx, acceptance[: gamma + 1], shape, scales=scales)[0][gamma].step_time_s
    return batch * e / step if step > 0 else math.inf


def budget_limited(
    curve: Sequence[CurvePoint],
    ctx: ModelContext,
    acceptance: Sequence[AcceptancePoint],
    load: BudgetLoad,
    *,
    queued: bool,
    scales: CostScales | None = None,
) -> tuple[tuple[CurvePoint, ...], str]:
    """The curve with each option held to what the budget lets it serve (module docstring), and a note for the
    reason ("" when the budget cannot bind at this batch: the curve is returned unchanged). `queued`: requests
    wait (the capacity objective), else the latency objective.

    Example: latency, D 1100 tokens/s, running off with cap(0) 1300: cap(4) 1040 < 1100 -> S(4) 2.1 becomes
    1040 / 1100 = 0.95; cap(1) 1260 holds the load and S(1) stays.
    """
    top = len(curve) - 1
    if top < 1 or load.batch * (top + 1) + load.prefill_tokens < load.budget_tokens:
        return tuple(curve), ""
    run = min(load.running, top)

    def cap(gamma: int, length: float | None = None) -> float:
        return capacity_tokens_per_s(ctx, acceptance, load, gamma, length=length, scales=scales)

    caps = [cap(g) for g in range(top + 1)]
    # The running option serves D: at its cap when its steps are full and requests wait, within it otherwise.
    anchor = load.served_tokens_per_s / caps[run] if caps[run] > 0 else 1.0
    scale = anchor if queued and load.full else max(1.0, anchor)
    served = load.served_tokens_per_s
    base = curve[run].speedup

    def limited(gamma: int, speedup: float, length: float) -> float:
        capacity = (caps[gamma] if length == acceptance[gamma].expected_length else cap(gamma, length)) * scale
        if not queued:
            plain = min(served, caps[0] * scale)
            return speedup if capacity >= served else min(speedup, capacity / plain)
        held = math.inf if load.full and gamma != run else served * speedup / base
        plain_held = math.inf if load.full and run != 0 else served / base
        return min(held, capacity) / min(plain_held, caps[0] * scale)

    points = [curve[0]]
    for p in curve[1:]:
        acc = acceptance[p.gamma]
        points.append(replace(
            p,
            speedup=limited(p.gamma, p.speedup, acc.expected_length),
            speedup_low=limited(p.gamma, p.speedup_low, acc.expected_length_low),
            speedup_high=limited(p.gamma, p.speedup_high, acc.expected_length_high),
        ))
    short = [p.gamma for p in points[1:] if caps[p.gamma] * scale < served] if not queued else []
    regime = "every step full" if load.full else f"{load.tokens_per_step:.0f} tokens per step"
    note = f"; token budget {load.budget_tokens:.0f} per step ({regime}, prompt/output {load.prompt_per_output:.1f})"
    if short:
        note += f": gamma {', '.join(map(str, short))} cannot hold {served:.0f} tokens/s"
    return tuple(points), note
