"""The one write path every actuator shares: read the object again, check it is still the version the decision saw,
compute the patch from what is there now, and send it carrying that resourceVersion, so a concurrent writer gets a
409 instead of being overwritten. Nothing here raises: every failure becomes an `ApplyResult` with a reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from policies.act.deployment import ActuatorError, ApplyResult, DeploymentObservation
from service.actuators.kube_errors import error_for_exception, failed_apply, unusable_observation


class PatchRefusedError(Exception):
    """The object is in a form the actuator will not edit (raised by a patch builder); nothing is sent."""

    def __init__(self, reason: ActuatorError, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class GuardedWrite:
    """How one object is read, patched and written: `read` fetches it as it is now, `patch_for` builds the patch
    from it (None: nothing to change; may raise `PatchRefusedError`), `send` sends a patch of `patch_type` and
    returns the new resourceVersion; `unchanged` is the detail reported when there is nothing to send."""

    target_ref: str
    read: Callable[[], Awaitable[dict[str, Any]]]
    patch_for: Callable[[dict[str, Any]], dict[str, Any] | None]
    send: Callable[[dict[str, Any]], Awaitable[str | None]]
    patch_type: str
    unchanged: str


async def guarded_apply(write: GuardedWrite, observed: DeploymentObservation, *, dry_run: bool) -> ApplyResult:
    """Apply `write.patch_for(object as read now)` through `write.send`, unless the observation is unusable, the
    object changed since `observed` (CONFLICT), the builder refuses (`PatchRefusedError`), there is nothing to change
    (`write.unchanged` says so), or it is a dry run (the exact patch is returned, not sent)."""
    refused = unusable_observation(observed, dry_run=dry_run)
    if refused is not None:
        return refused
    current = await _read_unchanged(write, observed, dry_run=dry_run)
    if isinstance(current, ApplyResult):
        return current
    patch = _build_patch(write, current, dry_run=dry_run)
    if isinstance(patch, ApplyResult):
        return patch
    if dry_run:
        return ApplyResult(applied=False, dry_run=True, patch=patch, patch_type=write.patch_type)
    return await _send(write, patch)


async def _read_unchanged(
    write: GuardedWrite, observed: DeploymentObservation, *, dry_run: bool
) -> dict[str, Any] | ApplyResult:
    """The object as read now, or the failure: unreadable, or a resourceVersion other than the observed one."""
    try:
        current = await write.read()
    except Exception as exc:  # every transport/API failure is a reason, never an exception out of the actuator
        return failed_apply(dry_run, *error_for_exception(exc, target=write.target_ref))
    version = (current.get("metadata") or {}).get("resourceVersion")
    if version != observed.resource_version:
        return failed_apply(
            dry_run, ActuatorError.CONFLICT,
            f"{write.target_ref} changed since it was observed (resourceVersion {observed.resource_version} -> "
            f"{version}); observe again before acting",
        )
    return current


def _build_patch(write: GuardedWrite, current: dict[str, Any], *, dry_run: bool) -> dict[str, Any] | ApplyResult:
    """The patch for `current`, or the result that ends the apply here: the builder refused, or nothing to change."""
    try:
        patch = write.patch_for(current)
    except PatchRefusedError as exc:
        return failed_apply(dry_run, exc.reason, exc.detail)
    if patch is None:
        return ApplyResult(applied=False, dry_run=dry_run, patch=None, patch_type=None, detail=write.unchanged)
    return patch


async def _send(write: GuardedWrite, patch: dict[str, Any]) -> ApplyResult:
    """Send `patch` for real: applied with the new resourceVersion, or failed with the API's reason."""
    try:
        new_version = await write.send(patch)
    except Exception as exc:
        return failed_apply(
            False, *error_for_exception(exc, target=write.target_ref), patch=patch, patch_type=write.patch_type
        )
    return ApplyResult(
        applied=True, dry_run=False, patch=patch, patch_type=write.patch_type, resource_version=new_version
    )
