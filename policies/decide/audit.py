"""Audit an engine's own speculation controller against the best static choice the model sees.

Engines now choose the draft length inside themselves on some paths: vLLM's adaptive verification (AV: a verify
budget per step from a cost table profiled at start-up) and Dynamic SD (K per batch size, K = 0 allowed),
TensorRT-LLM's `draft_len_schedule`. The advisor cannot tune those per step; it can say whether the controller
delivers what a static k would, and do what the engine cannot (unload a drafter, cap k).

What the counters show of the controller (vLLM counts what the scheduler scheduled, TensorRT-LLM likewise):

    m = Δdraft_tokens / Δdrafts        drafted tokens per draft (the scheduled K; below the deployed K_max under
                                       Dynamic SD or a schedule, = K_max under AV, which trims on the device)
    c = Δdrafts / Δ(ITL count)         share of sequence-steps that drafted (1 - the share at K = 0)
    V = 1 + c m                        tokens verified per sequence-step, bonus included (not under AV: the
                                       trimmed budget never reaches the counters, so `budget_observable` is False)

The controller's service is the curve's running point S(run) (the model at the measured operating point, its
step time calibrated on the engine's own steps: it prices what runs, controller included); the best static choice
is the curve's best point S(g*), gamma in 1..gamma_max or off. With the curve's gain sd (policies/model/
uncertainty.py: sd of log S(g) / S(run)),

    gain = S(g*) / S(run),   band = gain x exp(+-z sd),   z = 1.645 (90%)
    worse      when the band's low end exceeds 1 + min_gain: a static choice is measurably better
    not_worse  otherwise; unknown when the evidence is not ok or nothing is priced

Worked example: S(run) 1.05 under Dynamic SD, best static k 2 at S 1.30 with sd 0.06 -> gain 1.238, band
1.238 x exp(-1.645 x 0.06) = 1.122 .. 1.366; the low end clears 1.03 -> worse, action cap_k at 2.

Under AV the per-position acceptance counts trimmed slots as rejections, so the profile understates the drafter:
every static option is priced low, "worse" is then conservative and "not_worse" may flatter the controller; the
reason says so. With no controller declared a drafter that always drafts k (EAGLE, EAGLE-3, MTP, a draft model)
whose m falls below `SUSPECT_SHARE` x k is reported as `suspected_dynamic` (vLLM also drafts short where a step
has no room, so it is a suspicion, not a finding).

Actions, when worse: best static off -> `unload_drafter` (K = 0 still runs the drafter's prefill, 5-22% of TPOT
in vLLM issue #49548; restarting without it frees its weights for KV: tokens = drafter weight bytes / the target's
KV bytes per token, both per GPU); best static 0 < g* < K_max -> `cap_k` at g*; g* > K_max -> `set_k` at g* (a
restart with more draft tokens); g* = K_max, which the curve prices as what runs only where the controller's
cuts are measurable (TensorRT-LLM), -> `static_k`. Whatever the verdict, another drafting method priced from its
prior acceptance at this operating point (`alternatives`) whose band's low end clears max(S(g*), S(run)) by min_gain
-> `switch_method` (to that method at its best gamma): a prior must win even at its pessimistic end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from policies.decide.value import point_at
from policies.model.costmodel import ModelContext
from policies.model.drafter_semantics import drafts_full_length
from policies.model.roofline import kv_bytes_per_token_per_gpu
from policies.types import CurvePoint, DataState, Decision, DraftMethod, Evidence

SUSPECT_SHARE = 0.9


class SpeculationController(StrEnum):
    """The engine's own speculation controller, as the target's settings declare it."""

    NONE = "none"
    ADAPTIVE_VERIFICATION = "adaptive_verification"  # vLLM enable_adaptive_verification
    DYNAMIC_SD = "dynamic_sd"  # vLLM num_speculative_tokens_per_batch_size
    DRAFT_LEN_SCHEDULE = "draft_len_schedule"  # TensorRT-LLM draft_len_schedule


class AuditVerdict(StrEnum):
    WORSE = "worse"
    NOT_WORSE = "not_worse"
    UNKNOWN = "unknown"
    NO_CONTROLLER = "no_controller"


@dataclass(frozen=True, slots=True)
class AuditConfig:
    gamma_max: int = 8  # the deepest static k considered (decide's gamma_max)
    z: float = 1.645  # two-sided 90% band on the gain
    min_gain: float = 0.03  # the least gain (share of service) a static choice must surely bring to call it worse


@dataclass(frozen=True, slots=True)
class AuditAction:
    """What to do about a controller that is worse: `unload_drafter` (with `kv_tokens_freed` per replica) or
    `cap_k` (at `gamma`)."""

    code: str
    gamma: int = 0
    kv_tokens_freed: float | None = None
    method: str = ""  # switch_method: the drafting method to switch to


@dataclass(frozen=True, slots=True)
class MethodOption:
    """Another drafting method priced at this operating point from its prior acceptance (policies/model/
    acceptance.py METHOD_PRIORS) with the target's calibrated costs: its best gamma and that point's speedup and
    90% band over plain decoding."""

    method: str
    gamma: int
    speedup: float
    speedup_low: float
    speedup_high: float


@dataclass(frozen=True, slots=True)
class ControllerAudit:
    """One target's audit at `at_s` (module docstring for every number)."""

    target: str
    at_s: float
    controller: str  # a SpeculationController value, or "suspected_dynamic"
    declared: bool
    verdict: AuditVerdict
    reason: str
    deployed_k: int = 0
    drafted_per_draft: float | None = None  # m
    draft_share: float | None = None  # c
    verified_per_step: float | None = None  # V = 1 + c m; None when not observable
    budget_observable: bool = True
    engine_speedup: float | None = None
    engine_speedup_low: float | None = None
    engine_speedup_high: float | None = None
    best_gamma: int | None = None
    best_speedup: float | None = None
    gain_ratio: float | None = None
    gain_low_ratio: float | None = None
    gain_high_ratio: float | None = None
    calibration_error_ratio: float | None = None
    actions: tuple[AuditAction, ...] = ()
    alternatives: tuple[MethodOption, ...] = ()


_MIXED: dict[SpeculationController, str] = {
    SpeculationController.ADAPTIVE_VERIFICATION: "the engine's adaptive verification trims drafts after they are "
    "counted, so trimmed slots count as rejections",
    SpeculationController.DYNAMIC_SD: "Dynamic SD drafts fewer tokens at large batches, so deep positions are "
    "counted only at the batch sizes its table lets draft them",
    SpeculationController.DRAFT_LEN_SCHEDULE: "the draft_len_schedule drafts fewer tokens at large batches, so deep "
    "positions are counted only at the batch sizes it lets draft them",
}


def with_mixed_note(evidence: Evidence, controller: SpeculationController) -> Evidence:
    """`evidence` with its reason saying that the acceptance it measured is mixed with the engine's controller
    (not the drafter's alone), when a controller is declared and an acceptance was measured."""
    note = _MIXED.get(controller)
    if note is None or evidence.acceptance is None or not evidence.speculation_on:
        return evidence
    return replace(evidence, reason=f"{evidence.reason}; acceptance mixed: {note}")


def audit_controller(
    evidence: Evidence,
    decision: Decision,
    context: ModelContext | None,
    *,
    controller: SpeculationController,
    config: AuditConfig = AuditConfig(),
    alternatives: tuple[MethodOption, ...] = (),
) -> ControllerAudit:
    """The audit of `evidence.target`'s controller from this tick's evidence and decision (module docstring);
    `alternatives` are other methods priced from their priors (policies/advise.py `method_options`)."""
    acceptance = evidence.acceptance
    k = evidence.deployed_k if evidence.speculation_on else 0
    m = acceptance.mean_proposed_length if acceptance is not None else None
    c = acceptance.draft_coverage if acceptance is not None else None
    kind, declared = controller.value, controller is not SpeculationController.NONE
    # A draft model is left out: llama.cpp's stops early on its own confidence (--spec-draft-p-min).
    if (not declared and m is not None and context is not None and drafts_full_length(context.drafter.method)
            and context.drafter.method is not DraftMethod.DRAFT_MODEL and k >= 1 and m < SUSPECT_SHARE * k):
        kind = "suspected_dynamic"
    observable = controller is not SpeculationController.ADAPTIVE_VERIFICATION
    base = ControllerAudit(
        target=evidence.target, at_s=decision.evaluated_at_s, controller=kind, declared=declared,
        verdict=AuditVerdict.UNKNOWN, reason="", deployed_k=k, drafted_per_draft=m, draft_share=c,
        verified_per_step=1.0 + c * m if (observable and m is not None and c is not None) else None,
        budget_observable=observable, calibration_error_ratio=decision.calibration_error_ratio,
        alternatives=tuple(sorted(alternatives, key=lambda o: -o.speedup)),
    )
    if kind == SpeculationController.NONE.value:
        return _with(base, AuditVerdict.NO_CONTROLLER, "no engine controller declared or suspected")
    running = point_at(decision.curve, k)
    best = _best_static(decision.curve, config.gamma_max)
    if evidence.state is not DataState.OK or decision.state is not DataState.OK or running is None or best is None:
        return _with(base, AuditVerdict.UNKNOWN, f"nothing to compare: evidence {evidence.state.value}, "
                     f"{'no priced running point' if running is None else 'no static option priced'}")
    return _judged(base, running, best, context, config=config)


def _best_static(curve: tuple[CurvePoint, ...], gamma_max: int) -> CurvePoint | None:
    options = [p for p in curve if p.gamma <= gamma_max and math.isfinite(p.speedup)]
    return max(options, key=lambda p: (p.speedup, -p.gamma), default=None)


def _judged(
    base: ControllerAudit, running: CurvePoint, best: CurvePoint, context: ModelContext | None, *, config: AuditConfig
) -> ControllerAudit:
    gain = best.speedup / running.speedup
    spread = math.exp(config.z * best.gain_sd)
    low, high = gain / spread, gain * spread
    verdict = AuditVerdict.WORSE if low > 1.0 + config.min_gain else AuditVerdict.NOT_WORSE
    actions = _actions(best, base.deployed_k, context) if verdict is AuditVerdict.WORSE else ()
    switch = _switch(base.alternatives, max(best.speedup, running.speedup), config)
    actions = (*actions, switch) if switch is not None else actions
    caveat = (" (under adaptive verification trimmed slots count as rejections: static options are priced low)"
              if not base.budget_observable else "")
    setting = "off" if best.gamma == 0 else f"k={best.gamma}"
    reason = (f"{base.controller} at k<={base.deployed_k} gives S={running.speedup:.2f}; static {setting} gives "
              f"S={best.speedup:.2f}: gain {gain:.2f} [{low:.2f}..{high:.2f}] -> {verdict.value}{caveat}")
    return replace(
        base, verdict=verdict, reason=reason, engine_speedup=running.speedup,
        engine_speedup_low=running.speedup_low, engine_speedup_high=running.speedup_high, best_gamma=best.gamma,
        best_speedup=best.speedup, gain_ratio=gain, gain_low_ratio=low, gain_high_ratio=high, actions=actions,
    )


def _actions(best: CurvePoint, deployed_k: int, context: ModelContext | None) -> tuple[AuditAction, ...]:
    if best.gamma == 0:
        return (AuditAction("unload_drafter", kv_tokens_freed=_kv_tokens_freed(context)),)
    if best.gamma < deployed_k:
        return (AuditAction("cap_k", gamma=best.gamma),)
    if best.gamma > deployed_k:
        return (AuditAction("set_k", gamma=best.gamma),)
    # The deployed k run statically (its own point is the controller's): turn the controller off at k.
    return (AuditAction("static_k", gamma=best.gamma),)


def _switch(alternatives: tuple[MethodOption, ...], reference: float, config: AuditConfig) -> AuditAction | None:
    """`switch_method` to the alternative whose band's low end clears the best the deployed method can do (or
    what runs) by min_gain, if any: priced from a prior, it must win even at its pessimistic end."""
    sure = [o for o in alternatives if o.speedup_low > reference * (1.0 + config.min_gain)]
    if not sure:
        return None
    pick = max(sure, key=lambda o: o.speedup_low)
    return AuditAction("switch_method", gamma=pick.gamma, method=pick.method)


def _kv_tokens_freed(context: ModelContext | None) -> float | None:
    """Tokens of KV cache the drafter's weights would hold on the GPU that holds most of them (weights over the
    drafter's own tensor-parallel degree, over the target's KV bytes per token per GPU). Example: an EAGLE-3 head
    of 4.0e8 bf16 params (0.8 GB) beside Llama-3.1-8B (128 KiB a token): ~6 100 tokens; a 1B draft model on one
    of 4 GPUs frees its whole 2.5 GB there, not a quarter of it."""
    if context is None or context.drafter.params <= 0:
        return None
    tp = float(context.tensor_parallel)
    per_token = kv_bytes_per_token_per_gpu(context.model.attention, context.model.kv_dtype_bytes, tp)
    degree = float(context.drafter.degree(context.tensor_parallel))
    return context.drafter.params * context.drafter.dtype_bytes / degree / per_token if per_token > 0 else None


def _with(base: ControllerAudit, verdict: AuditVerdict, reason: str) -> ControllerAudit:
    return replace(base, verdict=verdict, reason=reason)
