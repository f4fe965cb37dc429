"""The one write path every actuator shares: read the object again, check it is still the version the decision saw,
compute the patch from what is there now, and send it carrying that resourceVersion, so a concurrent writer gets a
409 instead of being overwritten. Nothing here raises: every failure becomes an `ApplyResult` with a reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from policies.deployment import ActuatorError, ApplyResult, DeploymentObservation
from service.actuators.kube_errors import error_for_exception, failed_apply, unusable_observation


class PatchRefusedError(Exception):
    """The object is in a form the actuator will not edit (raised by a patch builder); nothing is sent."""

    def __init__(self, reason: ActuatorError, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


async def guarded_apply(
    *,
    target_ref: str,
    observed: DeploymentObservation,
    dry_run: bool,
    read: Callable[[], Awaitable[dict[str, Any]]],
    patch_for: Callable[[dict[str, Any]], dict[str, Any] | None],
    send: Callable[[dict[str, Any]], Awaitable[str | None]],
    patch_type: str,
    unchanged: str,
) -> ApplyResult:
    """Apply `patch_for(object as read now)` through `send` (which returns the new resourceVersion), unless the
    observation is unusable, the object changed since `observed` (CONFLICT), the builder refuses
    (`PatchRefusedError`), there is nothing to change (`unchanged` says so), or it is a dry run (the exact patch is
    returned, not sent)."""
    refused = unusable_observation(observed, dry_run=dry_run)
    if refused is not None:
        return refused
    try:
        current = await read()
    except Exception as exc:  # every transport/API failure is a reason, never an exception out of the actuator
        return failed_apply(dry_run, *error_for_exception(exc, target=target_ref))
    version = (current.get("metadata") or {}).get("resourceVersion")
    if version != observed.resource_version:
        return failed_apply(
            dry_run, ActuatorError.CONFLICT,
            f"{target_ref} changed since it was observed (resourceVersion {observed.resource_version} -> "
            f"{version}); observe again before acting",
        )
    try:
        patch = patch_for(current)
    except PatchRefusedError as exc:
        return failed_apply(dry_run, exc.reason, exc.detail)
    if patch is None:
        return ApplyResult(applied=False, dry_run=dry_run, patch=None, patch_type=None, detail=unchanged)
    if dry_run:
        return ApplyResult(applied=False, dry_run=True, patch=patch, patch_type=patch_type)
    try:
        new_version = await send(patch)
    except Exception as exc:
        return failed_apply(dry_run, *error_for_exception(exc, target=target_ref), patch=patch, patch_type=patch_type)
    return ApplyResult(applied=True, dry_run=False, patch=patch, patch_type=patch_type, resource_version=new_version)
