"""One evaluation for one target: evidence -> speedup curve -> decision. Pure; the loop's only policy entry point."""

from __future__ import annotations

from policies.costmodel import ModelContext, speedup_curve
from policies.decide import DecideConfig, DecideState, decide
from policies.types import CurvePoint, Decision, Evidence, TargetState


def advise(
    evidence: Evidence,
    ctx: ModelContext | None,
    decide_config: DecideConfig,
    decide_state: DecideState,
    now_s: float,
) -> tuple[Decision, DecideState]:
    """Compose the cost model and the decision for one target at `now_s` (Unix seconds).

    The curve S(gamma) for gamma = 0..`decide_config.gamma_max` is evaluated only when `evidence.state` is ok; for
    insufficient_data, stale or error evidence it is empty, so `decide` keeps the last published recommendation
    rather than acting on a curve built from data it does not trust; likewise when `ctx` is None (no cost model
    could be set up: the caller marks such evidence as an error). Returns the decision and the state to pass
    to the next call.

    Example: evidence at batch 4 with per-position acceptance (0.8, 0.6, 0.4) gives E[L](3) = 1 + 0.8 + 0.6 + 0.4
    = 2.8 tokens per verification; if the model predicts a verify step 1.4x a plain step plus a draft cost of 0.1x,
    S(3) = 2.8 / 1.5 = 1.87, and `decide` (margin 0.05) turns speculation on at gamma 3 once the dwell has passed.
    """
    curve: tuple[CurvePoint, ...] = ()
    if evidence.state == TargetState.OK and ctx is not None:
        curve = speedup_curve(evidence, ctx, gamma_max=decide_config.gamma_max)
    return decide(evidence, curve, decide_config, decide_state, now_s)
