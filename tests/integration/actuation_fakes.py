"""A fake Actuator for the actuation tests: an in-memory deployment that runs one SpeculationSetting, records every
patch, and can be told to fail, raise, hang or be mid-rollout."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from policies.act.deployment import ActuatorError, ApplyResult, DeploymentObservation, SpeculationSetting
from policies.types import AcceptanceEvidence, DataState, Evidence


def make_evidence(target: str, at_s: float, *, batch: float = 6.0) -> Evidence:
    """Good evidence at `batch` with acceptance rate 0.62 (1665 accepted of 2700 drafted)."""
    acceptance = AcceptanceEvidence(
        per_position=(0.8, 0.6, 0.45), per_position_low=(0.78, 0.57, 0.42), per_position_high=(0.82, 0.63, 0.48),
        drafts=900.0, draft_tokens=2700.0, accepted_tokens=1665.0, mean_acceptance_length=2.85,
        acceptance_rate=0.62, mean_proposed_length=3.0, window_s=60.0,
    )
    return Evidence(target=target, model="m", at_s=at_s, state=DataState.OK, speculation_on=False, deployed_k=0,
                    acceptance=acceptance, batch=batch, waiting=0.0, window_s=60.0)


@dataclass
class FakeActuator:
    setting: SpeculationSetting = field(default_factory=lambda: SpeculationSetting(0))
    mode: str = "kubernetes"
    target_ref: str = "deployment/llm/vllm"
    resource_version: int = 1
    rollout_in_progress: bool = False
    observe_error: ActuatorError | None = None
    apply_error: ActuatorError | None = None
    raise_on_observe: bool = False
    gate: asyncio.Event | None = None  # when set, apply waits for it (an action in flight)
    observed: int = 0
    applied: list[tuple[SpeculationSetting, bool]] = field(default_factory=list)

    async def observe(self, now_s: float) -> DeploymentObservation:
        self.observed += 1
        if self.raise_on_observe:
            raise RuntimeError("bug in the actuator")
        if self.observe_error is not None:
            return DeploymentObservation(at_s=now_s, setting=None, rollout_in_progress=False,
                                         error=self.observe_error, detail="refused by the fake")
        return DeploymentObservation(at_s=now_s, setting=self.setting, rollout_in_progress=self.rollout_in_progress,
                                     resource_version=str(self.resource_version))

    async def apply(
        self, desired: SpeculationSetting, observed: DeploymentObservation, *, dry_run: bool
    ) -> ApplyResult:
        if self.gate is not None:
            await self.gate.wait()
        self.applied.append((desired, dry_run))
        patch = {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": [
            f"--speculative-config={{\"num_speculative_tokens\": {desired.num_speculative_tokens}}}"]}]}}}}
        if self.apply_error is not None:
            return ApplyResult(applied=False, dry_run=dry_run, patch=patch, patch_type="application/merge-patch+json",
                               error=self.apply_error, detail="the fake refused")
        if dry_run:
            return ApplyResult(applied=False, dry_run=True, patch=patch, patch_type="application/merge-patch+json")
        self.setting = desired
        self.resource_version += 1
        return ApplyResult(applied=True, dry_run=False, patch=patch, patch_type="application/merge-patch+json",
                           resource_version=str(self.resource_version))
