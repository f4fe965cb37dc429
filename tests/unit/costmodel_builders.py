"""Builders for the model-stage tests (profiles, acceptance, roofline, cost model).

Defaults describe the published vLLM point in tests/fixtures/published/vllm-eagle-k-sweep-bs1.csv: Llama-3.1-8B on an
H100 SXM with an EAGLE-3 head at k=3, batch 1, where AL(2) = 2.36 and AL(3) = 2.79 are consistent with per-position
acceptance r = (0.78, 0.58, 0.43): 1 + 0.78 + 0.58 = 2.36, + 0.43 = 2.79.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from policies.model.costmodel import ModelContext
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.types import AcceptanceEvidence, DataState, DraftMethod, Evidence

EAGLE3_R = (0.78, 0.58, 0.43)
EAGLE3_R_LOW = (0.76, 0.55, 0.40)
EAGLE3_R_HIGH = (0.80, 0.61, 0.46)


def make_acceptance(
    per_position: tuple[float, ...] = EAGLE3_R,
    *,
    low: tuple[float, ...] | None = None,
    high: tuple[float, ...] | None = None,
    drafts: float = 1000.0,
    mean_proposed_length: float | None = None,
) -> AcceptanceEvidence:
    """Acceptance at k = len(per_position) with consistent derived fields (accepted = drafts x sum r_i)."""
    k = len(per_position)
    proposed = float(k) if mean_proposed_length is None else mean_proposed_length
    accepted = drafts * sum(per_position)
    return AcceptanceEvidence(
        per_position=per_position,
        per_position_low=per_position if low is None else low,
        per_position_high=per_position if high is None else high,
        drafts=drafts,
        draft_tokens=drafts * proposed,
        accepted_tokens=accepted,
        mean_acceptance_length=1.0 + sum(per_position),
        acceptance_rate=accepted / (drafts * proposed) if proposed > 0 else 0.0,
        mean_proposed_length=proposed,
        window_s=60.0,
    )


def make_evidence(**overrides: Any) -> Evidence:
    """Speculation on at k=3 with the eagle3 acceptance above, batch 1, context 512, no step-time observation.
    Any Evidence field can be overridden by name."""
    base = Evidence(
        target="http://127.0.0.1:8000",
        model="meta-llama/Llama-3.1-8B-Instruct",
        at_s=1_800_000_000.0,
        state=DataState.OK,
        speculation_on=True,
        deployed_k=3,
        acceptance=make_acceptance(low=EAGLE3_R_LOW, high=EAGLE3_R_HIGH),
        batch=1.0,
        waiting=0.0,
        context_tokens_per_seq=512.0,
    )
    return replace(base, **overrides)


def make_off_evidence(**overrides: Any) -> Evidence:
    """Speculation off: nothing measured about acceptance."""
    return make_evidence(**{"speculation_on": False, "deployed_k": 0, "acceptance": None, **overrides})


def make_context(
    *,
    hardware: str = "h100-sxm",
    model: str = "llama-3.1-8b",
    method: DraftMethod = DraftMethod.EAGLE3,
    tensor_parallel: int = 1,
) -> ModelContext:
    target = model_by_name(model)
    return ModelContext(
        hardware=hardware_by_name(hardware),
        model=target,
        drafter=drafter_for(method, target),
        tensor_parallel=tensor_parallel,
    )
