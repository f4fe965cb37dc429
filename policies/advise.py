"""One evaluation for one target: evidence -> calibration -> speedup curve (in the objective that applies) ->
decision. Pure; the loop's only policy entry point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from policies.decide.audit import MethodOption
from policies.decide.change_cost import inflight_work_s, queued_work_s
from policies.decide.horizon import HorizonState, HorizonTick, horizon_curve, queue_cost_s
from policies.decide.horizon import cost_scale as plan_cost_scale
from policies.decide.horizon import observe as observe_plan
from policies.decide.probe import Remembered, probe_for
from policies.decide.rule import DecideConfig, DecideInputs, DecideState, HorizonCurve, Probe, best_point, decide
from policies.decide.value import point_at
from policies.estimate.memory import AcceptanceMemory, MemoryConfig, Recall, acceptance_in_use, remember
from policies.model.acceptance import acceptance_curve
from policies.model.calibrate import (
    UNIDENTIFIED_WITHOUT_PLAIN,
    CalibrationConfig,
    CalibrationFit,
    CalibrationState,
    StepObservation,
    for_other_drafter,
    unidentified,
    update,
)
from policies.model.costmodel import ModelContext, operating_point_with
from policies.model.drafter_semantics import allowed_curve, drafts_full_length, prefix_stable
from policies.model.objectives import ObjectiveConfig, Workload, choose_objective, objective_curve, workload_from
from policies.model.profiles import drafter_for
from policies.model.roofline import CostScales
from policies.model.uncertainty import Spread, banded
from policies.types import AcceptanceEvidence, CurvePoint, DataState, Decision, DraftMethod, Evidence, Why, WhyCode


@dataclass(frozen=True, slots=True)
class AdvisorConfig:
    """The policy configs one target is advised with: the decision rule, the calibration, the objective and the
    acceptance memory."""

    decide: DecideConfig = field(default_factory=DecideConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)


@dataclass(frozen=True, slots=True)
class AdvisorState:
    """Everything one target carries from one tick to the next: the decision's wait clock and what it published,
    the calibration's points, the acceptance memory and the load plan. A new target starts from `AdvisorState()`;
    a model change starts calibration and plan afresh (`for_new_model`)."""

    decide: DecideState = field(default_factory=DecideState)
    calibration: CalibrationState = field(default_factory=CalibrationState)
    memory: AcceptanceMemory = field(default_factory=AcceptanceMemory)
    plan: HorizonState = field(default_factory=HorizonState)

    def for_new_model(self, calibration: CalibrationState) -> AdvisorState:
        """The state after the target's cost model changed: `calibration` (fresh, or a profile's anchors) replaces
        the fitted points and the plan starts empty (its values were priced with the old model); what was
        published and the acceptance memory (kept per model) stay."""
        return replace(self, calibration=calibration, plan=HorizonState())


@dataclass(frozen=True, slots=True)
class Advice:
    """One tick's outcome: the decision to publish, the state to carry to the next tick, the calibration fit, and
    the remembered profile the curve rested on (None: live or prior)."""

    decision: Decision
    state: AdvisorState
    calibration: CalibrationFit | None
    recalled: Recall | None = None


@dataclass(frozen=True, slots=True)
class _Priced:
    """The curve one tick prices, with what it was priced from: the cost model, the fitted scales, the workload,
    the objective that applied and why, and the note on an unmeasured verification cost."""

    curve: tuple[CurvePoint, ...] = ()
    ctx: ModelContext | None = None
    scales: CostScales | None = None
    workload: Workload | None = None
    objective: str = ""
    why: str = ""
    split_note: str = ""
    split_code: WhyCode | None = None


def advise_target(
    evidence: Evidence, ctx: ModelContext | None, config: AdvisorConfig, state: AdvisorState, now_s: float
) -> Advice:
    """The full pipeline for one target at `now_s` (Unix seconds): add the evidence's step time to the online
    calibration (policies/model/calibrate.py) and refit; price S(gamma), gamma = 0..gamma_max, with the fitted scales in
    the objective that applies (policies/model/objectives.py); decide. The Decision carries `objective` and
    `calibration_error_ratio`; an ok decision's reason ends with the objective and the calibration error (a held
    one's reason is left about its data).

    The curve S(gamma) is evaluated only from ok evidence with a cost model (`ctx` not None): for insufficient_data,
    stale or error evidence it is empty, so `decide` keeps the last published recommendation rather than acting on
    a curve built from data it does not trust (the calibration still learns from insufficient_data windows, whose
    step times are valid).

    Planning (policies/decide/horizon.py): when a change costs a restart (`config.decide.change_cost_s` > 0), each ok
    tick's curve is added to the plan (`state.plan`), decide chooses and weighs changes on the plan's curve (the recent
    load's mix, in tokens/s) with the restart priced at today's rate, and the queue a restart would error is added
    to its cost as far as the server would have served it within the horizon (`plan.queue_cost_s`).

    Acceptance memory (policies/estimate/memory.py): ok evidence measured while speculating is remembered per model.
    When nothing usable is measured (speculation off, or on with too few drafts in the window) and the model's
    remembered profile is still usable, the curve is priced from the aged profile instead of the method prior,
    and the reason says so with the profile's age; its widened band is what decide's "low end clears 1 + margin"
    rule reads, so an old memory must promise more to switch on. A thin window (insufficient_data while
    speculating) then counts as ok: the remembered profile is the evidence. A memory too old to use is named in
    the reason and the prior prices the curve, as with no memory at all; off, either is a profile of infinite age
    to the probe rule (policies/decide/probe.py), which may then ask to look.

    Example: B = 256 with 50 waiting and the cache at 62%: objective capacity (max_num_seqs, not KV, is the
    limit, so every option holds 256); the reason ends "; objective capacity (capacity-bound: 50 waiting,
    KV 62%); model calibration error 4.1% over 12 points". Speculation off at B = 2 with r = (0.8, 0.6, 0.45)
    remembered 12 min ago over 9000 drafts: n_eff = 2000 x 2^(-720 / 1800) = 1516, the curve uses r with
    Wilson bands at 1516 drafts, and the reason carries "acceptance: remembered acceptance from 12 min ago (k=3,
    9000 drafts, aged to 1516 effective)".
    """
    memory = remember(state.memory, evidence, config=config.memory, now_s=now_s)
    calibration_state, fit = state.calibration, None
    if ctx is not None:
        calibration_state, fit = update(calibration_state, evidence, ctx, now_s=now_s, config=config.calibration)
    # Measured live while speculating (not a remembered profile standing in for a thin window): what releases a
    # held probe (decide: the probe hold).
    measured = _measured_live(evidence)
    inflight_s = inflight_work_s(evidence)
    in_use = acceptance_in_use(evidence, memory, config=config.memory, now_s=now_s)
    recalled = in_use.recalled
    priced = _Priced()
    decidable = evidence.state is DataState.OK or in_use.stands_in
    if decidable and ctx is not None and fit is not None:
        priced = _price(evidence, in_use.acceptance, ctx, fit, calibration_state, config)
    probe = _probe(evidence, priced, recalled, inflight_s=inflight_s, config=config)
    plan_state = state.plan
    if state.decide.probe_since_s is not None and measured:
        # A held probe is released by this live window: the plan's ticks were priced on the profile the probe has
        # just re-measured (while off) or on the workload before it moved, so they no longer say what each gamma is
        # worth (kept, they can restart a server from the gamma it just picked up at, for the memory of a
        # drafter-hostile spell in which a smaller gamma had lost less).
        plan_state = HorizonState()
    planned: HorizonCurve | None = None
    if config.decide.change_cost_s > 0 and priced.workload is not None and priced.curve:
        # A change costs a restart: weigh it over the recent load, not this window alone (policies/decide/horizon.py).
        capacity_bound = choose_objective(priced.workload, config.objective)[1]
        plan_state, planned = _plan_tick(
            plan_state, priced.curve, evidence, capacity_bound=capacity_bound, config=config.decide, now_s=now_s,
        )
        # The queue a restart errors counts as far as the server would have caught up with it, within the
        # horizon the gain is counted over (plan.queue_cost_s).
        inflight_s += queue_cost_s(plan_state, queued_work_s(evidence), tau_s=config.decide.payback_horizon_s)
    inputs = DecideInputs(
        probe=probe, measured=measured, inflight_s=inflight_s, plan=planned, acceptance_stands_in=in_use.stands_in
    )
    decision, decide_state = decide(evidence, priced.curve, config.decide, state.decide, now_s, inputs=inputs)
    decision = _annotated(decision, priced, fit, memory_note=in_use.note, recalled=recalled)
    return Advice(
        decision=decision,
        state=AdvisorState(decide=decide_state, calibration=calibration_state, memory=memory, plan=plan_state),
        calibration=fit,
        recalled=recalled if recalled is not None and recalled.usable else None,
    )


def _price(
    evidence: Evidence,
    measured: AcceptanceEvidence | None,
    ctx: ModelContext,
    fit: CalibrationFit,
    calibration: CalibrationState,
    config: AdvisorConfig,
) -> _Priced:
    """S(gamma) for gamma = 0..max(gamma_max, deployed k) in the objective that applies, from the acceptance in use
    (`measured`: the window's own or the profile standing in for it) and the fitted scales, banded by the
    acceptance's and (with a covariance) the calibration's uncertainty."""
    point = operating_point_with(evidence, measured, budget=ctx.step_token_budget)
    # The curve reaches the deployed k even past gamma_max: the running setting's predicted speedup must be
    # published (the "speculation costs throughput" alert reads it), though decide never picks above gamma_max.
    acceptance = acceptance_curve(
        measured, method=ctx.drafter.method, gamma_max=max(config.decide.gamma_max, evidence.deployed_k),
        prefix_stable=prefix_stable(ctx.drafter.method, ctx.drafter.prefix_stable),
        full_length=drafts_full_length(ctx.drafter.method),
    )
    workload = workload_from(
        evidence, context_tokens=point.context_tokens, prefill_tokens=point.prefill_tokens,
        tokens_per_seq=point.tokens_per_seq, budget_tokens=ctx.step_token_budget, max_seqs=ctx.max_num_seqs,
    )
    workload = replace(workload, prefill_chunk_tokens=point.prefill_chunk_tokens)
    curve, chosen, why = objective_curve(ctx, acceptance, workload, config=config.objective, scales=fit.scales)
    if fit.covariance is not None:
        # The cost model's own uncertainty joins the acceptance's in every band (policies/model/uncertainty.py).
        running = evidence.deployed_k if evidence.speculation_on else 0
        curve = banded(
            lambda scales: objective_curve(ctx, acceptance, workload, config=config.objective, scales=scales)[0],
            fit.scales, Spread(fit.covariance, _form_error(fit), fit.split_alternative), base=curve,
            reference_gamma=running,
        )
    curve = allowed_curve(curve, ctx.drafter.allowed_k, running=evidence.deployed_k if evidence.speculation_on else 0)
    note, code = _split_note((*calibration.anchors, *calibration.points), evidence)
    return _Priced(
        curve=curve, ctx=ctx, scales=fit.scales, workload=workload, objective=chosen.value, why=why,
        split_note=note, split_code=code,
    )


def method_options(
    evidence: Evidence, ctx: ModelContext, advice: Advice, config: AdvisorConfig
) -> tuple[MethodOption, ...]:
    """Every other drafting method (not draft_model: it needs the draft model's own profile) priced at this tick's
    operating point from its prior acceptance (policies/model/acceptance.py METHOD_PRIORS) with the target's
    calibrated scales, as `_price` prices the deployed one: its best gamma in 1..gamma_max and that point's speedup
    and band; its drafter's own cost at its prior (`calibrate.for_other_drafter`: what the deployed drafter's
    steps measured of drafting is not another's). Empty before the first calibration fit. What
    policies/decide/audit.py weighs a method switch with."""
    fit = advice.calibration
    if fit is None:
        return ()
    options: list[MethodOption] = []
    for method in DraftMethod:
        if method in (ctx.drafter.method, DraftMethod.DRAFT_MODEL):
            continue
        other = replace(ctx, drafter=drafter_for(method, ctx.model))
        other_fit = for_other_drafter(fit, other.drafter, config.calibration)
        priced = _price(evidence, None, other, other_fit, advice.state.calibration, config)
        best = best_point(priced.curve, config.decide.gamma_max)
        if best is not None:
            options.append(MethodOption(method.value, best.gamma, best.speedup, best.speedup_low, best.speedup_high))
    return tuple(options)


def _probe(
    evidence: Evidence, priced: _Priced, recalled: Recall | None, *, inflight_s: float, config: AdvisorConfig
) -> Probe | None:
    """Off: is it time to look again? (`probe_for`; the prior is what it may find.)

    On a usable remembered profile the chance the workload moved grows with its age; with none (never measured
    here, or too old to use) nothing is known of this workload, which is a profile of infinite age: the curve is
    then the prior's, and the probe runs at the prior's best gamma. Without this a server deployed off would never
    be measured, however much the prior promised."""
    off = config.decide.explore and evidence.state is DataState.OK and not evidence.speculation_on
    if not off or priced.workload is None or priced.ctx is None or priced.scales is None:
        return None
    gamma_max = config.decide.gamma_max
    prior = acceptance_curve(None, method=priced.ctx.drafter.method, gamma_max=gamma_max)
    prior_curve = allowed_curve(
        objective_curve(priced.ctx, prior, priced.workload, config=config.objective, scales=priced.scales)[0],
        priced.ctx.drafter.allowed_k, running=0,
    )
    known = recalled if recalled is not None and recalled.usable else None
    star = best_point(prior_curve, gamma_max)
    remembered = Remembered(
        age_s=known.age_s if known is not None else math.inf,
        gamma=known.entry.k if known is not None else (star.gamma if star is not None else 0),
        curve=priced.curve,
    )
    return probe_for(
        remembered,
        prior=prior_curve,
        inflight_s=inflight_s,
        config=config.decide,
        half_life_s=config.memory.half_life_s,
    )


def _annotated(
    decision: Decision, priced: _Priced, fit: CalibrationFit | None, *, memory_note: str, recalled: Recall | None
) -> Decision:
    """The decision with its objective, its calibration error and, when ok, the reason's notes (and causes) on what
    the curve rests on: a remembered profile, an unmeasured verification cost. On a hold (insufficient_data,
    stale, error) the reason is about the data: a model note would read as the cause."""
    error = fit.error_ratio if fit is not None else None
    ok = decision.state == DataState.OK
    notes: list[str] = []
    whys = list(decision.why)
    if memory_note and ok:
        notes.append(memory_note)
        if recalled is not None and recalled.usable:
            whys.append(Why(WhyCode.REMEMBERED, (("age_s", recalled.age_s),)))
    if priced.objective:
        notes.append(f"objective {priced.objective} ({priced.why})")
    if priced.split_note and priced.split_code is not None and ok:
        notes.append(priced.split_note)
        whys.append(Why(priced.split_code))
    if ok and fit is not None and error is not None:
        notes.append(f"model calibration error {error:.1%} over {fit.points} points")
    reason = "; ".join([decision.reason, *notes]) if notes else decision.reason
    return replace(
        decision, reason=reason, objective=priced.objective, calibration_error_ratio=error, why=tuple(whys)
    )


def _measured_live(evidence: Evidence) -> bool:
    """This window's acceptance was measured live while speculating (not a remembered profile standing in for a
    thin window, not the prior's while off)."""
    return evidence.state is DataState.OK and evidence.speculation_on and evidence.acceptance is not None


def _plan_tick(
    state: HorizonState, curve: tuple[CurvePoint, ...], evidence: Evidence, *, capacity_bound: bool,
    config: DecideConfig, now_s: float,
) -> tuple[HorizonState, HorizonCurve | None]:
    """This tick added to the plan, and what decide weighs changes on: (plan, its curve and cost scale or None). The
    value rate is the generated tokens/s times the running option's share meeting the SLO (1 without one)."""
    running = evidence.deployed_k if evidence.speculation_on else 0
    here = point_at(curve, running)
    share = here.slo_share if here is not None and here.slo_share is not None else 1.0
    rate = evidence.generation_tokens_per_s
    tick = HorizonTick(
        curve, running_gamma=running, value_rate=rate * share if rate is not None else None,
        capacity_bound=capacity_bound, measured=_measured_live(evidence),
    )
    state = observe_plan(state, tick, now_s=now_s, tau_s=config.payback_horizon_s, margin=config.margin)
    planned = horizon_curve(state, curve)
    scale = plan_cost_scale(state, running_gamma=running, delivered_rate=rate)
    if planned is None or scale is None:
        return state, None
    return state, HorizonCurve(curve=planned, cost_scale=scale)


def _split_note(seen: tuple[StepObservation, ...], evidence: Evidence) -> tuple[str, WhyCode | None]:
    """What the reason says about the costs the points leave at the prior (policies/model/calibrate.py
    `unidentified`), and its cause code: steps at one tokens-per-sequence only leave the verified token's cost, the
    drafting share and the bookkeeping, and the band covers them (`VERIFICATION_UNMEASURED`); two k without a
    plain step leave the speculative bookkeeping, what a plain step saves besides the drafts (`PLAIN_UNMEASURED`);
    ("", None) when nothing is held. Example: k=3 steps only, speculating -> "verification cost not measured yet
    (no plain steps seen, nor another k): ..."; k=3 and k=2 -> "plain step not measured yet (speculative steps
    only, at two k): ..."."""
    held = unidentified(seen)
    if not held:
        return "", None
    if held == UNIDENTIFIED_WITHOUT_PLAIN:
        return (
            "plain step not measured yet (speculative steps only, at two k): bands cover the prior's cost of the "
            "speculative bookkeeping, what turning off saves besides the drafts; a window with speculation off "
            "measures it"
        ), WhyCode.PLAIN_UNMEASURED
    if any(p.draft_passes == 0 for p in seen) and any(p.draft_passes > 0 for p in seen):
        missing = "plain and speculative steps verify nearly the same tokens per sequence (drafts on few steps)"
    else:
        missing = f"no {'plain' if evidence.speculation_on else 'speculative'} steps seen, nor another k"
    return (
        f"verification cost not measured yet ({missing}): bands cover the prior's per-token, drafting and "
        "bookkeeping costs; a window with speculation off or at another k measures them"
    ), WhyCode.VERIFICATION_UNMEASURED


def _form_error(fit: CalibrationFit) -> float:
    """The model's form error where it prices now (a relative step-time error, >= 0): the larger of the fit's
    median error over its recent points and its error at the newest one. The newest point is the operating
    point the curve is priced at; a fit whose form does not carry over to it (a load that just dropped from a
    compute-bound peak to a handful of requests, seen so far by one window) misses it by more than its median says.
    Example: median 2%, newest -18% -> 0.18."""
    median = fit.error_ratio or 0.0
    newest = abs(fit.newest_error_ratio) if fit.newest_error_ratio is not None else 0.0
    return max(median, newest)
