"""One evaluation for one target: evidence -> calibration -> speedup curve (in the objective that applies) ->
decision. Pure; the loop's only policy entry point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from policies.acceptance import acceptance_curve
from policies.calibrate import (
    CalibrationConfig,
    CalibrationFit,
    CalibrationState,
    StepObservation,
    split_observed,
    update,
)
from policies.change_cost import change_cost_of, inflight_work_s, queued_work_s
from policies.costmodel import ModelContext, operating_point, speedup_curve
from policies.decide import DecideConfig, DecideState, Probe, best_point, decide
from policies.memory import AcceptanceMemory, MemoryConfig, Recall, recall, remember
from policies.objectives import ObjectiveConfig, Workload, choose_objective, objective_curve, workload_from
from policies.plan import PlanState, plan_curve, queue_cost_s
from policies.plan import cost_scale as plan_cost_scale
from policies.plan import observe as observe_plan
from policies.types import CurvePoint, Decision, Evidence, TargetState
from policies.uncertainty import banded
from policies.value import point_at


def advise(
    evidence: Evidence,
    ctx: ModelContext | None,
    decide_config: DecideConfig,
    decide_state: DecideState,
    now_s: float,
) -> tuple[Decision, DecideState]:
    """Compose the cost model and the decision for one target at `now_s` (Unix seconds), without history: the
    one-point calibration and the latency objective (see `advise_target` for the full pipeline).

    The curve S(gamma) for gamma = 0..`decide_config.gamma_max` is evaluated only when `evidence.state` is ok; for
    insufficient_data, stale or error evidence it is empty, so `decide` keeps the last published recommendation
    rather than acting on a curve built from data it does not trust; likewise when `ctx` is None (no cost model
    could be set up: the caller marks such evidence as an error). Returns the decision and the state to pass
    to the next call.

    Example: evidence at batch 4 with per-position acceptance (0.8, 0.6, 0.4) gives E[L](3) = 1 + 0.8 + 0.6 + 0.4
    = 2.8 tokens per verification; if the model predicts a verify step 1.4x a plain step plus a draft cost of 0.1x,
    S(3) = 2.8 / 1.5 = 1.87, and `decide` turns speculation on at gamma 3 once its wait (30 s with free changes)
    has passed.
    """
    curve: tuple[CurvePoint, ...] = ()
    if evidence.state == TargetState.OK and ctx is not None:
        curve = speedup_curve(evidence, ctx, gamma_max=max(decide_config.gamma_max, evidence.deployed_k))
    return decide(evidence, curve, decide_config, decide_state, now_s)


@dataclass(frozen=True, slots=True)
class Advice:
    """One tick's outcome: the decision to publish, the states to carry to the next tick (the acceptance memory
    among them), the calibration fit, and the remembered profile the curve rested on (None: live or prior)."""

    decision: Decision
    decide_state: DecideState
    calibration_state: CalibrationState
    calibration: CalibrationFit | None
    memory: AcceptanceMemory = field(default_factory=AcceptanceMemory)
    recalled: Recall | None = None
    plan: PlanState = field(default_factory=PlanState)


def advise_target(
    evidence: Evidence,
    ctx: ModelContext | None,
    *,
    decide_config: DecideConfig,
    decide_state: DecideState,
    calibration_state: CalibrationState,
    now_s: float,
    calibration_config: CalibrationConfig | None = None,
    objective_config: ObjectiveConfig | None = None,
    memory: AcceptanceMemory | None = None,
    memory_config: MemoryConfig | None = None,
    plan: PlanState | None = None,
) -> Advice:
    """The full pipeline for one target at `now_s` (Unix seconds): add the evidence's step time to the online
    calibration (policies/calibrate.py) and refit; price S(gamma), gamma = 0..gamma_max, with the fitted scales in
    the objective that applies (policies/objectives.py); decide. The Decision carries `objective` and
    `calibration_error_ratio`; an ok decision's reason ends with the objective and the calibration error (a held
    one's reason is left about its data).

    As in `advise`, a curve is built only from ok evidence with a cost model; otherwise the curve is empty and
    `decide` holds the last recommendation (the calibration still learns from insufficient_data windows, whose
    step times are valid).

    Planning (policies/plan.py): when a change costs a restart (`decide_config.change_cost_s` > 0), each ok tick's
    curve is added to the plan (`plan`, carried in `Advice.plan`), decide chooses and weighs changes on the plan's
    curve (the recent load's mix, in tokens/s) with the restart priced at today's rate, and the queue a restart
    would error is added to its cost as far as the server would have served it within the horizon
    (`plan.queue_cost_s`).

    Acceptance memory (policies/memory.py): ok evidence measured while speculating is remembered per model
    (`Advice.memory` is the memory to carry on). When nothing usable is measured (speculation off, or on with too
    few drafts in the window) and the model's remembered profile is still usable, the curve is priced from the
    aged profile instead of the method prior, and the reason says so with the profile's age; its widened band is
    what decide's "low end clears 1 + margin" rule reads, so an old memory must promise more to switch on. A
    thin window (insufficient_data while speculating) then counts as ok: the remembered profile is the evidence.
    A memory too old to use is named in the reason and the prior prices the curve, as with no memory at all; off,
    either is a profile of infinite age to the probe rule (`probe_for`), which may then ask to look.

    Example: B = 256 with 50 waiting and the cache at 62%: objective capacity (max_num_seqs, not KV, is the
    limit, so every option holds 256); the reason ends "; objective capacity (capacity-bound: 50 waiting,
    KV 62%); model calibration error 4.1% over 12 points". Speculation off at B = 2 with r = (0.8, 0.6, 0.45)
    remembered 12 min ago over 9000 drafts: n_eff = 2000 x 2^(-720 / 1800) = 1516, the curve uses r with
    Wilson bands at 1516 drafts, and the reason carries "acceptance: remembered acceptance from 12 min ago (k=3,
    9000 drafts, aged to 1516 effective)".
    """
    calibration_config = calibration_config or CalibrationConfig()
    objective_config = objective_config or ObjectiveConfig()
    memory_config = memory_config or MemoryConfig()
    memory = remember(memory or AcceptanceMemory(), evidence, config=memory_config, now_s=now_s)
    fit: CalibrationFit | None = None
    if ctx is not None:
        calibration_state, fit = update(calibration_state, evidence, ctx, now_s=now_s, config=calibration_config)
    # Measured live while speculating (not a remembered profile standing in for a thin window): what releases a
    # held probe (decide: the probe hold).
    measured = evidence.state is TargetState.OK and evidence.speculation_on and evidence.acceptance is not None
    inflight_s = inflight_work_s(evidence)
    recalled, evidence, memory_note = _with_memory(evidence, memory, config=memory_config, now_s=now_s)
    curve: tuple[CurvePoint, ...] = ()
    objective = ""
    why = ""
    split_note = ""
    workload: Workload | None = None
    if evidence.state == TargetState.OK and ctx is not None and fit is not None:
        point = operating_point(evidence)
        # The curve reaches the deployed k even past gamma_max: the running setting's predicted speedup must be
        # published (the "speculation costs throughput" alert reads it), though decide never picks above gamma_max.
        acceptance = acceptance_curve(
            evidence.acceptance, method=ctx.drafter.method, gamma_max=max(decide_config.gamma_max, evidence.deployed_k)
        )
        workload = workload_from(evidence, context_tokens=point.context_tokens, prefill_tokens=point.prefill_tokens)
        curve, chosen, why = objective_curve(ctx, acceptance, workload, config=objective_config, scales=fit.scales)
        objective = chosen.value
        split_note = _split_note((*calibration_state.anchors, *calibration_state.points), evidence)
        if fit.covariance is not None:
            # The cost model's own uncertainty joins the acceptance's in every band (policies/uncertainty.py).
            running = evidence.deployed_k if evidence.speculation_on else 0
            curve = banded(
                lambda scales: objective_curve(ctx, acceptance, workload, config=objective_config, scales=scales)[0],
                fit.scales, fit.covariance, error_ratio=_form_error(fit), base=curve, reference_gamma=running,
            )
    probe: Probe | None = None
    off = decide_config.explore and evidence.state is TargetState.OK and not evidence.speculation_on
    if off and workload is not None and ctx is not None and fit is not None:
        # Off: is it time to look again? (probe_for; the prior is what it may find.) On a usable remembered
        # profile the chance the workload moved grows with its age; with none (never measured here, or too old
        # to use) nothing is known of this workload, which is a profile of infinite age: the curve is then the
        # prior's, and the probe runs at the prior's best gamma. Without this a server deployed off would never
        # be measured, however much the prior promised (a k=0 low-load world: SLO goodput 0 against 233).
        prior = acceptance_curve(None, method=ctx.drafter.method, gamma_max=decide_config.gamma_max)
        prior_curve = objective_curve(ctx, prior, workload, config=objective_config, scales=fit.scales)[0]
        known = recalled if recalled is not None and recalled.usable else None
        star = best_point(prior_curve, decide_config.gamma_max)
        probe = probe_for(
            age_s=known.age_s if known is not None else math.inf,
            gamma=known.entry.k if known is not None else (star.gamma if star is not None else 0),
            remembered=curve,
            prior=prior_curve,
            inflight_s=inflight_s,
            config=decide_config,
            half_life_s=memory_config.half_life_s,
        )
    plan_state = plan or PlanState()
    if decide_state.probe_since_s is not None and measured:
        # A held probe is released by this live window: the plan's ticks were priced on the profile the probe has
        # just re-measured (while off) or on the workload before it moved, so they no longer say what each gamma is
        # worth. Kept, they restarted a server from gamma 3 to 1 four minutes after a pick-up, for the memory of
        # a drafter-hostile spell in which gamma 1 had lost less than 3 (benchmark pickup-after-off).
        plan_state = PlanState()
    planned: tuple[CurvePoint, ...] | None = None
    cost_scale = 1.0
    if decide_config.change_cost_s > 0 and workload is not None and curve:
        # A change costs a restart: weigh it over the recent load, not this window alone (policies/plan.py).
        plan_state, planned, cost_scale = _plan_tick(
            plan_state, curve, evidence, capacity_bound=choose_objective(workload, objective_config)[1],
            tau_s=decide_config.payback_horizon_s, now_s=now_s,
        )
        # The queue a restart errors counts as far as the server would have caught up with it, within the
        # horizon the gain is counted over (plan.queue_cost_s).
        inflight_s += queue_cost_s(plan_state, queued_work_s(evidence), tau_s=decide_config.payback_horizon_s)
    decision, decide_state = decide(
        evidence, curve, decide_config, decide_state, now_s, probe=probe, measured=measured, inflight_s=inflight_s,
        plan=planned, cost_scale=cost_scale,
    )
    error = fit.error_ratio if fit is not None else None
    notes: list[str] = []
    if memory_note and decision.state == TargetState.OK:
        notes.append(memory_note)
    if objective:
        notes.append(f"objective {objective} ({why})")
    if split_note and decision.state == TargetState.OK:
        notes.append(split_note)
    # Only an ok decision rests on the model; on a hold (insufficient_data, stale, error) the reason is about the
    # data, and a model note would read as the cause.
    if decision.state == TargetState.OK and fit is not None and error is not None:
        notes.append(f"model calibration error {error:.1%} over {fit.points} points")
    reason = "; ".join([decision.reason, *notes]) if notes else decision.reason
    decision = replace(decision, reason=reason, objective=objective, calibration_error_ratio=error)
    return Advice(
        decision=decision,
        decide_state=decide_state,
        calibration_state=calibration_state,
        calibration=fit,
        memory=memory,
        recalled=recalled if recalled is not None and recalled.usable else None,
        plan=plan_state,
    )


def _plan_tick(
    state: PlanState, curve: tuple[CurvePoint, ...], evidence: Evidence, *, capacity_bound: bool, tau_s: float,
    now_s: float,
) -> tuple[PlanState, tuple[CurvePoint, ...] | None, float]:
    """This tick added to the plan, and what decide weighs changes on: (plan, its curve or None, cost scale). The
    value rate is the generated tokens/s times the running option's share meeting the SLO (1 without one)."""
    running = evidence.deployed_k if evidence.speculation_on else 0
    here = point_at(curve, running)
    share = here.slo_share if here is not None and here.slo_share is not None else 1.0
    rate = evidence.generation_tokens_per_s
    state = observe_plan(
        state, curve, running_gamma=running, value_rate=rate * share if rate is not None else None,
        capacity_bound=capacity_bound, now_s=now_s, tau_s=tau_s,
    )
    planned = plan_curve(state, curve)
    scale = plan_cost_scale(state, running_gamma=running, delivered_rate=rate)
    if planned is None or scale is None:
        return state, None, 1.0
    return state, planned, scale


def probe_for(
    *,
    age_s: float,
    gamma: int,
    remembered: Sequence[CurvePoint],
    prior: Sequence[CurvePoint],
    inflight_s: float,
    config: DecideConfig,
    half_life_s: float,
) -> Probe | None:
    """Whether to switch on for a while to re-measure acceptance, while off on a profile remembered `age_s` ago.

    Nothing is measured while off, so a workload that turned drafter-friendly (chat -> code) stays invisible
    until someone looks. Looking costs: two changes (on, and back off if the profile still holds), each
    `change_cost_s` + `inflight_s` seconds of full service (policies/change_cost.py: the outage and the in-flight
    work a restart drops), plus the time it runs at the remembered speedup S_mem(gamma) (< 1 is a loss) before
    the advisor may turn it off again: on_s = max(dwell_s, probe_min_s), the dwell or one estimator window to
    measure, whichever is longer. It pays when the expected gain over the payback horizon exceeds that:

        p(age) x (S_prior* - 1) x payback_horizon_s > 2 x (change_cost_s + inflight_s) + on_s x max(0, 1 - S_mem)

    p(age) = 1 - 2^(-age / half_life_s) is the chance the workload has moved since the profile was measured, on
    the memory's own half-life (the rate at which it says a profile goes stale); S_prior* is the best point
    speedup in 1..gamma_max priced with the drafter's prior acceptance (what the drafter does on a typical
    workload) in the objective that applies. Under an ITL SLO both speedup terms are multiplied by share(off),
    plain decoding's share of tokens meeting the SLO, so that they count tokens moved across the SLO per
    delivered token, the unit of the cost (policies/change_cost.py): S_prior* = 99 with 1% of tokens meeting the SLO off
    is a 98% gain in service, not 9800%. When speculation would not pay even at the prior (S_prior* <= 1) it
    never probes. The probe runs at the remembered k (`gamma`, >= 1), where the
    positions will be measured again; once published, decide holds it until a window is measured.
    `age_s` = inf stands for no usable profile (never measured, or too old): p = 1, and the caller passes the
    prior's own curve as `remembered` and its best gamma.
    Units: seconds; speedups are dimensionless ratios vs plain decoding.

    Example (cost 20 s, in-flight 0 s, horizon 600 s, dwell 120 s, half-life 1800 s): S_prior* 1.5, S_mem 0.9. At
    age 600 s p = 1 - 2^(-1/3) = 0.206, 0.206 x 0.5 x 600 = 61.9 s > 2 x 20 + 120 x 0.1 = 52 s -> probe at the
    remembered k. At age 450 s p = 0.159 -> 47.7 s < 52 s -> None. `config.explore` False: callers do not ask.
    """
    star = best_point(prior, config.gamma_max)
    if star is None or star.speedup <= 1.0 or gamma < 1:
        return None
    here = point_at(remembered, gamma)
    s_mem = here.speedup if here is not None else 1.0
    chance = 1.0 - 0.5 ** (max(0.0, age_s) / half_life_s)
    # Under an SLO the curve is SLO goodput over plain decoding's: per delivered token (the unit of the cost) a
    # gain is worth share(off) as much (policies/change_cost.py).
    off = point_at(prior, 0)
    unit = off.slo_share if off is not None and off.slo_share is not None else 1.0
    won = chance * (star.speedup - 1.0) * unit * config.payback_horizon_s
    one_change = change_cost_of(change_cost_s=config.change_cost_s, inflight_s=inflight_s)
    on_for_s = max(config.dwell_s, config.probe_min_s)
    cost = 2.0 * one_change + on_for_s * max(0.0, 1.0 - s_mem) * unit
    if won <= cost:
        return None
    seen = f"remembered profile is {age_s:.0f}s old" if math.isfinite(age_s) else "no usable measured profile"
    why = (
        f"{seen}, P(workload moved) {chance:.1%} x prior S({star.gamma})="
        f"{star.speedup:.2f} gain{f' x share {unit:.2f} meeting the SLO off' if unit != 1.0 else ''} x "
        f"{config.payback_horizon_s:.0f}s = {won:.1f}s > probe cost {cost:.1f}s "
        f"(2 changes + {on_for_s:.0f}s at {'remembered' if math.isfinite(age_s) else 'prior'} S({gamma})={s_mem:.2f})"
    )
    return Probe(gamma=gamma, why=why)


def _with_memory(
    evidence: Evidence, memory: AcceptanceMemory, *, config: MemoryConfig, now_s: float
) -> tuple[Recall | None, Evidence, str]:
    """The evidence the curve is priced from, the recalled profile and a note for the reason.

    Live acceptance wins whenever the estimator trusts it. Otherwise (off, or a thin window while on) a usable
    remembered profile stands in; an unusable one is only named, and the prior prices the curve.
    """
    off = evidence.state is TargetState.OK and not evidence.speculation_on
    thin = evidence.state is TargetState.INSUFFICIENT_DATA and evidence.speculation_on
    if not (off or thin) or not evidence.model:
        return None, evidence, ""
    entry = memory.get(evidence.model)
    if entry is None:
        return None, evidence, ""
    recalled = recall(entry, config=config, now_s=now_s)
    if not recalled.usable or recalled.acceptance is None:
        return recalled, evidence, f"acceptance: {recalled.describe()}; priced from the drafter's prior"
    note = f"acceptance: {recalled.describe()}"
    if thin:
        # The window's own drafts are too few to trust; the remembered profile is the better evidence until
        # the window fills (then live evidence replaces the memory).
        note += f" in place of a thin live window ({_one_line(evidence.reason)})"
        return recalled, replace(evidence, state=TargetState.OK, acceptance=recalled.acceptance), note
    return recalled, replace(evidence, acceptance=recalled.acceptance), note


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _split_note(seen: tuple[StepObservation, ...], evidence: Evidence) -> str:
    """"" when the points identify the verified token's cost (`split_observed`); otherwise what the reason says:
    steps at one tokens-per-sequence only leave that cost and the drafting share at the prior, and the band covers
    them. Example: k=3 steps only, speculating -> "verification cost not measured yet (no plain steps seen, nor
    another k): ..."."""
    if split_observed(seen):
        return ""
    if any(p.draft_passes == 0 for p in seen) and any(p.draft_passes > 0 for p in seen):
        missing = "plain and speculative steps verify nearly the same tokens per sequence (drafts on few steps)"
    else:
        missing = f"no {'plain' if evidence.speculation_on else 'speculative'} steps seen, nor another k"
    return (
        f"verification cost not measured yet ({missing}): bands cover the prior's per-token and drafting costs; a "
        "window with speculation off or at another k measures them"
    )


def _form_error(fit: CalibrationFit) -> float:
    """The model's form error where it prices now (a relative step-time error, >= 0): the larger of the fit's
    median error over its recent points and its error at the newest one. The newest point is the operating
    point the curve is priced at; a fit whose form does not carry over to it (a load that just dropped from a
    compute-bound peak to a handful of requests, seen so far by one window) misses it by more than its median says.
    Example: median 2%, newest -18% -> 0.18."""
    median = fit.error_ratio or 0.0
    newest = abs(fit.newest_error_ratio) if fit.newest_error_ratio is not None else 0.0
    return max(median, newest)
