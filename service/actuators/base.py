"""The contract between the actuation runner and the things that change a deployment.

An actuator never raises for anything the API server or the object can do wrong: failures come back as
`DeploymentObservation.error` / `ApplyResult.error` with an `ActuatorError` reason, so the runner can log, count
and skip without special cases. It never sends a partial patch: a patch either carries the whole change, guarded by
the `resourceVersion` it was computed from, or is not sent.
"""

from __future__ import annotations

from typing import Protocol

from policies.act.deployment import ApplyResult, DeploymentObservation, SpeculationSetting


class Actuator(Protocol):
    """One managed object (a vLLM Deployment, or an HTTPRoute splitting traffic between two pools)."""

    @property
    def mode(self) -> str:
        """"kubernetes", "schedule" or "routing" (a metric label and audit-log field)."""
        ...

    @property
    def target_ref(self) -> str:
        """What it manages, for people: e.g. "deployment/llm/vllm" (namespace/name)."""
        ...

    async def observe(self, now_s: float) -> DeploymentObservation:
        """Read the object now; `now_s` stamps the observation."""
        ...

    async def apply(
        self, desired: SpeculationSetting, observed: DeploymentObservation, *, dry_run: bool
    ) -> ApplyResult:
        """Change the object from `observed` (its resourceVersion guards the write) to run `desired`. In dry run,
        compute and return the exact patch without sending it."""
        ...
