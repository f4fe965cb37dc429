"""`GET /v1/actions` (the audit log's recent records and each acted-on target's state) and the write endpoints
`POST /v1/actions/pause`, `/resume`, `/override` and `DELETE /v1/actions/override`, as one APIRouter.

Reads are open like the rest of the API. Writes need `Authorization: Bearer <token>`: no or a malformed header is a
401 (with `WWW-Authenticate: Bearer`), a wrong token a 403; the token is compared with `hmac.compare_digest`, so
the time taken does not depend on how much of it matched. The composition root only mounts the write endpoints
when it has a token (and refuses to start when actuation is on, write endpoints are enabled and no token is
configured). Error bodies are the API's `{"error": ..., "detail": ...}`. A write whose audit record could not be
persisted (disk full) is in force in memory but answers 503 `not_persisted`: a restart would forget it.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from policies.act.deployment import SpeculationSetting
from service.actuators.audit import AuditLog, rfc3339
from service.actuators.runner import ActuationRunner, AuditNotPersistedError, TargetActuation, UnknownTargetError
from service.http.bounded import bounded_route

# A write's body is a target name, a reason and a few numbers: 16 KiB leaves room and bounds the parse.
MAX_WRITE_BODY_BYTES = 16 * 1024
_T = TypeVar("_T")
MAX_RECORDS = 500
DEFAULT_RECORDS = 100


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Reason = Annotated[str, Field(min_length=1, max_length=500, description="Why, for the audit log.")]
TargetName = Annotated[str, Field(min_length=1, max_length=64)]


class PauseIn(_Strict):
    target: TargetName | None = Field(default=None, description="One acted-on target; omitted = all of them.")
    reason: Reason


class OverrideIn(_Strict):
    target: TargetName = Field(description="The acted-on target to override.")
    num_speculative_tokens: int = Field(ge=0, le=32, strict=True, description="k to run; 0 = speculation off.")
    expires_in_s: float = Field(gt=0, description="Seconds until the override lapses (at most max_override_s).")
    reason: Reason


class SettingOut(BaseModel):
    num_speculative_tokens: int = Field(description="Draft tokens per step (a schedule's largest K); 0 = off.")
    schedule: list[list[int]] = Field(
        description="vLLM Dynamic SD bands as ascending [max batch size, K] pairs; empty for a fixed K."
    )


class OverrideOut(BaseModel):
    setting: SettingOut = Field(description="What the override makes the target run.")
    expires_at: str = Field(description="RFC 3339 UTC time the override lapses and the recommendation rules again.")
    expires_in_s: float = Field(description="Seconds until it lapses.")
    reason: str = Field(description="Why it was set, as the operator gave it.")
    set_at: str = Field(description="RFC 3339 UTC time it was set.")


class TargetActuationOut(BaseModel):
    target: str = Field(description="The target's configured name.")
    target_ref: str = Field(
        description="The object acted on: deployment/NAMESPACE/NAME or httproute/NAMESPACE/NAME."
    )
    mode: str = Field(description="How it is acted on: kubernetes, schedule or routing.")
    dry_run: bool = Field(description="True: changes are computed and audited but never sent.")
    paused: bool = Field(description="True: an operator paused acting on it; the recommendation is still published.")
    override: OverrideOut | None = Field(description="The operator's override in force; null when none.")
    cooldown_until: str | None = Field(
        description="RFC 3339 UTC time the cooldown after the last action ends; null when it never acted."
    )
    cooldown_remaining_s: float = Field(description="Seconds until the cooldown allows another action; 0 = free.")
    actions_last_hour: int = Field(description="Actions in the last hour, a count (capped by max_actions_per_hour).")
    actions_last_day: int = Field(description="Actions in the last 24 hours, a count (capped by max_actions_per_day).")
    observed: SettingOut | None = Field(description="What the deployment runs, as last read.")
    rollout_in_progress: bool | None = Field(
        description="True while the object rolls out a change (no action then); null before the first read."
    )
    last_observation_error: str | None = Field(
        description="Why the last read of the object failed ('error: detail'); null when it worked."
    )
    last_skip_reason: str | None = Field(
        description="Why the last tick took no action (e.g. already_applied, cooldown, paused); null when it acted "
        "or before the first tick."
    )
    last_plan_detail: str | None = Field(description="The gate's last verdict in words; null before the first tick.")
    last_action_at: str | None = Field(description="RFC 3339 UTC time of the last action; null when none yet.")
    last_result: str | None = Field(
        description="Result of the last action: applied, dry_run, noop or failed; null when none yet."
    )
    actions: dict[str, int] = Field(description="Actions since start-up by result (applied, dry_run, noop, failed).")
    skipped: dict[str, int] = Field(description="Ticks without action since start-up by skip reason.")
    errors: dict[str, int] = Field(
        description="Actuator errors since start-up, reads and changes alike, by kind (e.g. forbidden, conflict, "
        "unreachable)."
    )


class AuditOut(BaseModel):
    path: str | None = Field(description="The audit log file; null in recommend-only mode (no log).")
    torn_bytes_skipped: int = Field(description="Bytes of a torn last line found at start-up (a crash mid-write).")
    corrupt_lines_skipped: int = Field(description="Lines that were not a JSON record, skipped at start-up, a count.")
    write_errors: int = Field(
        description="Audit records that could not be written since start-up (e.g. disk full), a count; any is worth "
        "an alert: a restart forgets what they recorded."
    )


class ActionsOut(BaseModel):
    mode: str = Field(description="Actuation mode: recommend-only, kubernetes, schedule or routing.")
    dry_run: bool = Field(description="True: changes are computed and audited but never sent.")
    write_endpoints: bool = Field(description="Whether the pause/resume/override endpoints are served.")
    targets: list[TargetActuationOut] = Field(
        description="Each acted-on target's state (only the one asked for with ?target=); empty in recommend-only."
    )
    records: list[dict[str, Any]] = Field(description="The most recent audit records, oldest first.")
    audit: AuditOut = Field(description="The audit log's health.")


class CommandOut(BaseModel):
    targets: list[str] = Field(description="The targets the command applied to.")
    paused: bool | None = Field(
        default=None, description="After pause/resume: whether they are now paused; else null."
    )
    override: OverrideOut | None = Field(
        default=None, description="After setting an override: the override now in force; else null."
    )
    cleared: bool | None = Field(
        default=None, description="After clearing an override: whether there was one to clear; else null."
    )


def create_actions_router(
    runner: ActuationRunner | None,
    audit: AuditLog | None,
    *,
    clock: Callable[[], float],
    token: str | None,
    max_override_s: float = 86400.0,
    mode: str = "recommend-only",
) -> APIRouter:
    """The actions router. `runner`/`audit` None = recommend-only (GET answers with no targets, no writes).
    Write endpoints are mounted only when both a runner and a `token` are given."""
    router = APIRouter()
    writes = runner is not None and token is not None

    @router.get("/v1/actions", response_model=ActionsOut)
    async def actions(
        target: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_RECORDS)] = DEFAULT_RECORDS,
    ) -> Response:
        """Recent audit records and, per acted-on target, its gate state (paused, override, cooldown, counts)."""
        now_s = clock()
        statuses = runner.statuses(now_s) if runner is not None else ()
        if target is not None:
            statuses = tuple(s for s in statuses if s.target == target)
            if not statuses:
                known = ", ".join(runner.target_names) if runner is not None else "none"
                return _error(404, "not_found", f"target '{target}' is not acted on (acted on: {known})")
        body = ActionsOut(
            mode=runner.mode if runner is not None else mode,
            dry_run=runner.dry_run if runner is not None else False,
            write_endpoints=writes,
            targets=[_status_out(s, now_s) for s in statuses],
            records=audit.recent(limit, target=target) if audit is not None else [],
            audit=AuditOut(
                path=str(audit.path) if audit is not None else None,
                torn_bytes_skipped=audit.report.torn_bytes if audit is not None else 0,
                corrupt_lines_skipped=audit.report.corrupt_lines if audit is not None else 0,
                write_errors=runner.audit_errors if runner is not None else 0,
            ),
        )
        return JSONResponse(content=body.model_dump(mode="json"))

    if runner is None or token is None:
        return router
    expected = token.encode()

    async def authorized(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise _AuthError(401, "unauthorized", "this endpoint needs 'Authorization: Bearer <token>'")
        if not hmac.compare_digest(presented.strip().encode(), expected):
            raise _AuthError(403, "forbidden", "the bearer token is not the configured one")

    # The bearer check and the body cap run before anything reads the body (service/http/bounded.py); the
    # dependency repeats the check so the OpenAPI schema shows what each write needs.
    writes_router = APIRouter(route_class=bounded_route(MAX_WRITE_BODY_BYTES, what="actions", guard=authorized))
    _mount_writes(writes_router, runner, clock=clock, auth=[Depends(authorized)], max_override_s=max_override_s)
    router.include_router(writes_router)
    return router


def _mount_writes(
    router: APIRouter, runner: ActuationRunner, *, clock: Callable[[], float], auth: list[Any],
    max_override_s: float,
) -> None:
    errors: dict[int | str, dict[str, Any]] = {401: {}, 403: {}, 413: {}, 422: {}, 503: {}}

    @router.post("/v1/actions/pause", response_model=CommandOut, dependencies=auth, responses=errors)
    async def pause(body: PauseIn) -> Response:
        """Stop acting on one target (or all); the recommendation keeps being published."""
        targets = await _commanded(runner, body.target, runner.pause(body.target, reason=body.reason, now_s=clock()))
        if isinstance(targets, Response):
            return targets
        return JSONResponse(content=CommandOut(targets=targets, paused=True).model_dump(mode="json"))

    @router.post("/v1/actions/resume", response_model=CommandOut, dependencies=auth, responses=errors)
    async def resume(body: PauseIn) -> Response:
        """Act again on one target (or all)."""
        targets = await _commanded(runner, body.target, runner.resume(body.target, reason=body.reason, now_s=clock()))
        if isinstance(targets, Response):
            return targets
        return JSONResponse(content=CommandOut(targets=targets, paused=False).model_dump(mode="json"))

    @router.post("/v1/actions/override", response_model=CommandOut, dependencies=auth, responses=errors)
    async def override(body: OverrideIn) -> Response:
        """Run k = num_speculative_tokens on the target until it expires, whatever the recommendation says (the
        rollout, observation and pause checks still apply)."""
        if body.expires_in_s > max_override_s:
            return _error(422, "invalid_request", [{"loc": ["body", "expires_in_s"],
                                                    "msg": f"must be at most {max_override_s:g} s"}])
        now_s = clock()
        result = await _commanded(runner, body.target, runner.set_override(
            body.target, num_speculative_tokens=body.num_speculative_tokens, expires_in_s=body.expires_in_s,
            reason=body.reason, now_s=now_s,
        ))
        if isinstance(result, Response):
            return result
        out = OverrideOut(setting=_setting(result.setting), expires_at=rfc3339(result.expires_at_s),
                          expires_in_s=result.expires_at_s - now_s, reason=result.reason, set_at=rfc3339(now_s))
        return JSONResponse(content=CommandOut(targets=[body.target], override=out).model_dump(mode="json"))

    @router.delete("/v1/actions/override", response_model=CommandOut, dependencies=auth, responses=errors)
    async def clear_override(
        target: Annotated[str, Query(min_length=1, max_length=64)],
        reason: Annotated[str, Query(min_length=1, max_length=500)] = "cleared by operator",
    ) -> Response:
        """Drop the target's override; the recommendation rules again."""
        cleared = await _commanded(runner, target, runner.clear_override(target, reason=reason, now_s=clock()))
        if isinstance(cleared, Response):
            return cleared
        return JSONResponse(content=CommandOut(targets=[target], cleared=cleared).model_dump(mode="json"))


class _AuthError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


async def auth_error_handler(request: Request, exc: Exception) -> Response:
    """Render a refused write as the API's error body (installed on the app by `install_auth_errors`)."""
    assert isinstance(exc, _AuthError)
    headers = {"WWW-Authenticate": 'Bearer realm="spec-advisor"'} if exc.status == 401 else None
    return _error(exc.status, exc.code, exc.detail, headers=headers)


def install_auth_errors(app: FastAPI) -> FastAPI:
    """Render refused writes as the API's error body on `app`; returns `app`."""
    app.add_exception_handler(_AuthError, auth_error_handler)
    return app


async def _commanded(runner: ActuationRunner, target: str | None, command: Awaitable[_T]) -> _T | Response:
    """The command's result, or the error answer for a target not acted on (422) or a command the audit log
    could not record (503)."""
    try:
        return await command
    except UnknownTargetError:
        return _unknown(runner, target)
    except AuditNotPersistedError as exc:
        return _not_persisted(exc)


def _unknown(runner: ActuationRunner, target: str | None) -> Response:
    known = ", ".join(runner.target_names)
    return _error(422, "invalid_request", [{"loc": ["body", "target"],
                                            "msg": f"'{target}' is not acted on (acted on: {known})"}])


def _not_persisted(exc: AuditNotPersistedError) -> Response:
    # The command is in force now but a restart would forget it (the gate is rebuilt from the log): not a success.
    return _error(503, "not_persisted", f"applied in memory, not persisted: the audit log could not record it for "
                                        f"{', '.join(exc.targets)}; it holds until the next restart only (check the "
                                        "state_dir's disk)")


def _error(status: int, code: str, detail: object, *, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(status_code=status, content={"error": code, "detail": detail}, headers=headers)


def _setting(setting: SpeculationSetting) -> SettingOut:
    return SettingOut(num_speculative_tokens=setting.num_speculative_tokens,
                      schedule=[list(band) for band in setting.schedule])


def _status_out(status: TargetActuation, now_s: float) -> TargetActuationOut:
    override = status.override
    observation = status.last_observation
    plan = status.last_plan
    return TargetActuationOut(
        target=status.target,
        target_ref=status.target_ref,
        mode=status.mode,
        dry_run=status.dry_run,
        paused=status.paused,
        override=None if override is None else OverrideOut(
            setting=_setting(override.setting), expires_at=rfc3339(override.expires_at_s),
            expires_in_s=max(0.0, override.expires_at_s - now_s), reason=override.reason,
            set_at=rfc3339(override.set_at_s),
        ),
        cooldown_until=None if status.cooldown_until_s is None else rfc3339(status.cooldown_until_s),
        cooldown_remaining_s=status.cooldown_remaining_s,
        actions_last_hour=status.actions_last_hour,
        actions_last_day=status.actions_last_day,
        observed=None if observation is None or observation.setting is None else _setting(observation.setting),
        rollout_in_progress=None if observation is None else observation.rollout_in_progress,
        last_observation_error=status.last_observation_error,
        last_skip_reason=None if plan is None or plan.skip is None else plan.skip.value,
        last_plan_detail=None if plan is None else plan.detail,
        last_action_at=None if status.last_action_s is None else rfc3339(status.last_action_s),
        last_result=status.last_result,
        actions=dict(status.actions),
        skipped=dict(status.skipped),
        errors=dict(status.errors),
    )
