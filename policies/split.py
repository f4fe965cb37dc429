"""How much of a speculative step is drafting: a prior, until the server has run both with and without drafts.

Why. A step at k drafts times (verify k+1 tokens + draft k times) pins their SUM, not the split. The online fit
(policies/calibrate.py) explains every observed step, but with steps at one k only its `draft` scale stays at the
drafter profile's prior, and the prior is the least certain number of the model (EAGLE heads differ in layers,
lm_head and launch overheads across engines and GPUs). Whatever of the step the prior wrongly gives to drafting,
the model takes from the target, so plain decoding, the option that has never run, comes out too fast or too
slow by that much. Seen in the decision benchmark's pickup-while-off: the prior prices 3 EAGLE draft steps at
~5 ms where the world spends ~3, so plain decoding was predicted at 8.5 ms against a true 10.3 ms, a third of
requests under the 8 ms SLO instead of none, and the advisor switched off a server it could then no longer measure.

What. Until the calibration holds points of both kinds (plain steps and speculative steps), the curve's bands
also cover drafting's prior-driven part (what `CostScales.draft` scales: the draft passes' launches and roofline;
the speculative bookkeeping is measured data, policies/profiles.py) being `DRAFT_RANGE` = x0.5 .. x2 of the
fitted one, each alternative re-balanced so that it still explains the step that was observed: the target's
forward takes what drafting gives up, (1 - f) x that part at the observed operating point, as an additive
`CostScales.target_offset_s` (never removing more than 90% of the target's fixed term: where x2 would, the factor
is lowered to what the target can give, so every alternative explains the observed step). The band of each point is
the envelope of the three curves (fitted, cheaper drafting, dearer drafting); the point value stays the fitted
one. Why x0.5 .. x2: the drafter profiles' own derivations (policies/profiles.py) put their launch terms at
0.775-1.5 ms per step from one engine's k-sweep; another engine, GPU or head design halves or doubles that.

Example (H100 profile, Llama-3.1-8B, EAGLE, uncalibrated, batch 5, ctx 768, k = 3): the k = 3 step is 11.17 ms,
plain decoding 7.21 ms; drafting's prior-driven part at k = 3 is 3.15 ms, the target's fixed term 1.60 ms. x0.5:
the target gains 1.58 ms, plain decoding 8.79 ms, the k = 3 step still 11.17 ms. x2: the target would give up
3.15 ms, more than 90% of its fixed term: it gives 1.44 ms and drafting grows by as much (x1.46), plain decoding
5.77 ms, the k = 3 step still 11.17 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from policies.calibrate import StepObservation
from policies.costmodel import ModelContext, OperatingPoint
from policies.roofline import CostScales, drafting_time, target_step_time
from policies.types import CurvePoint

DRAFT_RANGE = (0.5, 2.0)
_MAX_OFFSET_SHARE = 0.9


def split_observed(points: Sequence[StepObservation]) -> bool:
    """Whether the calibration holds both plain steps (no drafts) and speculative steps: then the fit's `draft`
    scale is identified by data and no alternatives are needed."""
    return any(p.draft_passes == 0 for p in points) and any(p.draft_passes > 0 for p in points)


def alternatives(ctx: ModelContext, scales: CostScales, point: OperatingPoint) -> tuple[CostScales, ...]:
    """The fitted scales with drafting's prior-driven part at each factor f of `DRAFT_RANGE` and the target given
    what drafting gives up, (1 - f) x that part at `point` (`CostScales.target_offset_s`), so that the step at
    `point` (what was observed) keeps its predicted time. The offset never removes more than 90% of the target's
    fixed term; where x2 would, f is lowered to 1 + 0.9 x fixed / part, so the observed step is still explained
    (module docstring). At a plain-decoding point (no drafts) nothing is moved to the target.
    """
    out: list[CostScales] = []
    part = 0.0
    if point.draft_steps > 0:
        # Drafting is linear in `draft`: its prior-driven part is what draft = 0 would remove.
        def drafting(s: CostScales) -> float:
            return drafting_time(
                ctx.hardware, ctx.drafter, gamma=point.draft_steps, batch=point.batch,
                context_tokens=point.context_tokens, tensor_parallel=ctx.tensor_parallel, scales=s,
            ).total_s

        part = drafting(scales) - drafting(replace(scales, draft=0.0))
    fixed = target_step_time(
        ctx.hardware, ctx.model, batch=point.batch, tokens_per_seq=1.0, context_tokens=point.context_tokens,
        tensor_parallel=ctx.tensor_parallel, scales=scales, prefill_tokens=point.prefill_tokens,
    ).overhead_s
    for wanted in DRAFT_RANGE:
        factor, offset = wanted, (1.0 - wanted) * part
        if part > 0 and offset < -_MAX_OFFSET_SHARE * fixed:
            # The target cannot give up that much: drafting grows only by what it can give.
            offset = -_MAX_OFFSET_SHARE * fixed
            factor = 1.0 - offset / part
        out.append(replace(scales, draft=scales.draft * factor, target_offset_s=scales.target_offset_s + offset))
    return tuple(out)


def envelope(fitted: Sequence[CurvePoint], others: Sequence[Sequence[CurvePoint]]) -> tuple[CurvePoint, ...]:
    """`fitted` with each point's band widened to cover the same gamma's band on every curve of `others` (point
    values, step times and everything else stay the fitted curve's). Curves of another length are ignored.

    Example: fitted S(3) = 0.03 [0.03..0.03], the cheaper-drafting curve's S(3) = 1.0 [1.0..1.0] -> 0.03 [0.03..1.0].
    """
    usable = [curve for curve in others if len(curve) == len(fitted)]
    points: list[CurvePoint] = []
    for i, point in enumerate(fitted):
        lows = [point.speedup_low, *(curve[i].speedup_low for curve in usable)]
        highs = [point.speedup_high, *(curve[i].speedup_high for curve in usable)]
        points.append(replace(point, speedup_low=min(lows), speedup_high=max(highs)))
    return tuple(points)
