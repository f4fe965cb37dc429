"""Every way a Kubernetes API call can fail, as an `ActuatorError` reason plus a detail for the audit log.

lightkube raises `ApiError` (an `httpx2.HTTPStatusError` carrying the server's `Status`) for a JSON error body,
a bare `httpx2.HTTPStatusError` for any other error body (e.g. a proxy's HTML 502), `httpx2` transport errors
when the server does not answer, and `ConfigError` when credentials cannot be loaded (a missing token file).
"""

from __future__ import annotations

import httpx2
from lightkube import ApiError, ConfigError

from policies.act.deployment import ActuatorError, ApplyResult, DeploymentObservation

_BY_CODE = {
    400: ActuatorError.INVALID,
    401: ActuatorError.UNAUTHORIZED,
    403: ActuatorError.FORBIDDEN,
    404: ActuatorError.NOT_FOUND,
    409: ActuatorError.CONFLICT,
    415: ActuatorError.INVALID,
    422: ActuatorError.INVALID,
    # Too many requests and timeouts are the server being unavailable for now, like a 5xx.
    408: ActuatorError.UNREACHABLE,
    429: ActuatorError.UNREACHABLE,
}


def error_for_status(code: int) -> ActuatorError:
    """The reason for an HTTP status code from the API server (5xx: unreachable; unknown codes: unexpected).

    Example: 409 -> ActuatorError.CONFLICT; 503 -> ActuatorError.UNREACHABLE; 418 -> ActuatorError.UNEXPECTED.
    """
    if code in _BY_CODE:
        return _BY_CODE[code]
    if 500 <= code <= 599:
        return ActuatorError.UNREACHABLE
    return ActuatorError.UNEXPECTED


def error_for_exception(exc: Exception, *, target: str) -> tuple[ActuatorError, str]:
    """(reason, detail) for anything a lightkube call raised; `target` names the object for the detail."""
    if isinstance(exc, ApiError):
        status = exc.status
        code = status.code if status.code is not None else exc.response.status_code
        return error_for_status(code), f"{target}: HTTP {code} {status.reason or ''}: {status.message or ''}".strip()
    if isinstance(exc, httpx2.HTTPStatusError):
        code = exc.response.status_code
        body = exc.response.text[:200]
        return error_for_status(code), f"{target}: HTTP {code} (not a Kubernetes Status): {body!r}"
    if isinstance(exc, httpx2.TimeoutException):
        return ActuatorError.UNREACHABLE, f"{target}: the API server did not answer in time ({type(exc).__name__})"
    if isinstance(exc, httpx2.TransportError):
        return ActuatorError.UNREACHABLE, f"{target}: cannot reach the API server ({type(exc).__name__}: {exc})"
    if isinstance(exc, ConfigError):
        return ActuatorError.UNAUTHORIZED, f"{target}: credentials could not be loaded: {exc}"
    return ActuatorError.UNEXPECTED, f"{target}: {type(exc).__name__}: {exc}"


def failed_observation(now_s: float, reason: ActuatorError, detail: str) -> DeploymentObservation:
    """An observation that read nothing: no setting, no resourceVersion (so nothing can be applied from it)."""
    return DeploymentObservation(at_s=now_s, setting=None, rollout_in_progress=False, error=reason, detail=detail)


def failed_apply(dry_run: bool, reason: ActuatorError, detail: str, *, patch: object | None = None,
                 patch_type: str | None = None) -> ApplyResult:
    """An apply that changed nothing, with why (and the patch, when it got as far as computing one)."""
    return ApplyResult(
        applied=False, dry_run=dry_run, patch=patch, patch_type=patch_type, error=reason, detail=detail
    )


def unusable_observation(observed: DeploymentObservation, *, dry_run: bool) -> ApplyResult | None:
    """Refuse to apply from an observation that failed or carries no resourceVersion to guard the write."""
    if observed.error is not None:
        return failed_apply(dry_run, observed.error, f"not applied: the observation failed: {observed.detail}")
    if observed.resource_version is None:
        return failed_apply(dry_run, ActuatorError.UNEXPECTED, "not applied: the observation has no resourceVersion")
    return None
