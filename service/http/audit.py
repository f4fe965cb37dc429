"""GET /v1/audit: the engine's own speculation controller judged against the best static k, per target
(policies/decide/audit.py has the maths; this module is the wire format)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from policies.decide.audit import AuditVerdict, ControllerAudit
from service.board import BoardEntry


class ControllerActionOut(BaseModel):
    code: str = Field(description="unload_drafter (restart without speculation: the drafter runs even at K=0), "
                      "cap_k (run at most `gamma` draft tokens), set_k (restart with `gamma`, above the deployed "
                      "k), static_k (turn the engine's controller off and run `gamma` always) or switch_method "
                      "(another drafting method, priced from its prior, wins even at its band's low end).")
    gamma: int = Field(description="cap_k, set_k, static_k, switch_method: the k to run; 0 for unload_drafter.")
    method: str = Field(description="switch_method: the drafting method to switch to; empty otherwise.")
    kv_tokens_freed: float | None = Field(
        description="unload_drafter: KV-cache tokens per replica the drafter's weights would hold; null when unknown."
    )


class MethodAlternativeOut(BaseModel):
    method: str = Field(description="A drafting method (ngram, suffix, eagle, eagle3, mtp).")
    gamma: int = Field(description="Its best k at this operating point.")
    speedup: float = Field(description="Its predicted speedup there over plain decoding, from its prior acceptance.")
    speedup_low: float = Field(description="Low end of the 90% band (the prior's acceptance band).")
    speedup_high: float = Field(description="High end of the 90% band.")


class ControllerAuditOut(BaseModel):
    target: str = Field(description="The configured target.")
    model: str | None = Field(description="Its served model.")
    controller: str = Field(
        description="none, adaptive_verification, dynamic_sd, draft_len_schedule (as the target's settings declare "
        "it), or suspected_dynamic (none declared, but a drafter that always drafts k drafted under 90% of it)."
    )
    declared: bool = Field(description="Whether the settings declared the controller.")
    verdict: str = Field(
        description="worse (a static k is measurably better), not_worse, unknown (nothing to compare yet), "
        "no_controller."
    )
    reason: str = Field(description="The numbers behind the verdict, for people.")
    evaluated_at_s: float | None = Field(description="When, Unix seconds; null before the first evaluation.")
    deployed_k: int = Field(description="The k the engine is configured with (its most draft tokens per step).")
    drafted_per_draft: float | None = Field(description="Draft tokens the engine scheduled per draft (tokens).")
    draft_share: float | None = Field(description="Share of decoding sequence-steps that carried a draft, 0..1.")
    verified_per_step: float | None = Field(
        description="Tokens verified per sequence-step, 1 + draft_share x drafted_per_draft; null where the engine "
        "does not count its verified budget (adaptive verification trims on the device)."
    )
    budget_observable: bool = Field(description="Whether the counters show the verified budget.")
    engine_speedup: float | None = Field(description="Predicted speedup of what runs now (the curve's running point).")
    best_gamma: int | None = Field(description="The best static k (0 = off) on the curve.")
    best_speedup: float | None = Field(description="Its predicted speedup.")
    gain_ratio: float | None = Field(description="best_speedup / engine_speedup.")
    gain_low_ratio: float | None = Field(description="Low end of the gain's 90% band.")
    gain_high_ratio: float | None = Field(description="High end of the gain's 90% band.")
    calibration_error_ratio: float | None = Field(
        description="The cost model's calibration error on this engine's steps (median |predicted / observed - 1|)."
    )
    actions: list[ControllerActionOut] = Field(description="What to do when worse: what the engine cannot do itself.")
    alternatives: list[MethodAlternativeOut] = Field(
        description="Other drafting methods priced at this operating point from their prior acceptance (best first); "
        "empty without a declared controller."
    )


class ControllerAuditsOut(BaseModel):
    targets: list[ControllerAuditOut] = Field(description="One audit per configured target (only the one asked for).")


def audits_body(entries: Sequence[BoardEntry]) -> ControllerAuditsOut:
    """The wire answer for `entries`; a target not evaluated yet answers verdict unknown."""
    return ControllerAuditsOut(targets=[_one(entry) for entry in entries])


def _one(entry: BoardEntry) -> ControllerAuditOut:
    audit = entry.audit or ControllerAudit(
        target=entry.target, at_s=float("nan"), controller="none", declared=False, verdict=AuditVerdict.UNKNOWN,
        reason="not evaluated yet",
    )
    evaluated = entry.audit is not None
    return ControllerAuditOut(
        target=entry.target, model=entry.model, controller=audit.controller, declared=audit.declared,
        verdict=audit.verdict.value, reason=audit.reason, evaluated_at_s=audit.at_s if evaluated else None,
        deployed_k=audit.deployed_k, drafted_per_draft=audit.drafted_per_draft, draft_share=audit.draft_share,
        verified_per_step=audit.verified_per_step, budget_observable=audit.budget_observable,
        engine_speedup=audit.engine_speedup, best_gamma=audit.best_gamma, best_speedup=audit.best_speedup,
        gain_ratio=audit.gain_ratio, gain_low_ratio=audit.gain_low_ratio, gain_high_ratio=audit.gain_high_ratio,
        calibration_error_ratio=audit.calibration_error_ratio,
        actions=[ControllerActionOut(code=a.code, gamma=a.gamma, kv_tokens_freed=a.kv_tokens_freed, method=a.method)
                 for a in audit.actions],
        alternatives=[MethodAlternativeOut(method=o.method, gamma=o.gamma, speedup=o.speedup,
                                           speedup_low=o.speedup_low, speedup_high=o.speedup_high)
                      for o in audit.alternatives],
    )
