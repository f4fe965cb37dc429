"""The actuation runner: an `IterationListener` that, after each advisor iteration and per actuated target,
observes the deployment, computes the wanted setting from the Board's published decision, asks the pure gate
(`policies.act.gate.gate_action`) whether to act, applies (or dry-runs) the change, writes the audit log and counts.

One action in flight: `after_iteration` starts one background pass over the targets (sequentially) and returns at
once, so a slow API server never stalls the advisor loop (and /healthz); a tick that finds the previous pass still
running starts nothing (`busy_ticks` counts them). Operator commands (pause, resume, override) change the gate state
directly: a pass writes its next state before it awaits the actuator, so a command issued meanwhile is never lost.
At start-up `restore` rebuilds the pause switch, overrides and recent actions from the audit log
(`AuditLog.gate_records`, gathered from the whole file). A live apply is recorded twice: an "action_started" record
with the exact patch, fsync'd before anything is sent, then the "action" record with the result (same `at_s`), so a
`kill -9` in between still leaves the action in the log and a restart still counts it.
With leader election on (several replicas), a replica acts only while it leads (`Leadership.leading()`, asked
before each target's step and again right before a patch is sent); otherwise each step is a `not_leader` skip,
written to the audit log like any other skip (when the holder changes, or once per skip_log_interval_s), and the
gate's dwell is cleared (the cooldown and caps are kept): a new leader waits out its own dwell.
The gate acts only when the board's evidence is ok too: a decision that advise.py kept ok on remembered acceptance
over a thin live window (evidence insufficient_data) is good enough to advise, not to restart pods on. Nothing here
raises into the loop: an actuator that raises or hangs is an `unexpected` / `unreachable` error in the
audit log and the counters, and the recommendation keeps being served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol

from policies.act.deployment import ActuatorError, ApplyResult, DeploymentObservation, SpeculationSetting
from policies.act.engine import engine_mismatch, priced_engine
from policies.act.gate import (
    DAY_S,
    HOUR_S,
    ActionPlan,
    ActuationConfig,
    ActuationState,
    Override,
    SkipReason,
    actions_within,
    active_override,
    cooldown_remaining_s,
    desired_setting,
    gate_action,
    judged_decision,
)
from policies.model.roofline import CostScales
from policies.offline.schedule import (
    BatchSchedule,
    ScheduleAsk,
    engine_max_num_seqs,
    inputs_from_evidence,
    schedule_for,
)
from policies.types import DataState, Decision
from service.actuators.audit import AuditLog, SkipThrottle, rfc3339
from service.actuators.base import Actuator
from service.board import Board, BoardEntry
from service.logs import fields, get_logger
from service.tasks import cancel_and_wait

RESULTS = ("applied", "dry_run", "noop", "failed")
# Results of an "action" record that count against the cooldown and caps at restore ("dry_run" only in dry run).
_LIVE_RESULTS = ("applied", "noop", "failed")


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    """How the runner acts: the mode ("kubernetes", "schedule", "routing"), the gate's numbers, and what the wanted
    setting is computed from (per target, the routing on-pool's k; the schedule's batch range, gamma limit and
    margin)."""

    mode: str
    config: ActuationConfig
    on_pool_k: Mapping[str, int] = field(default_factory=dict)  # routing: target -> the on-pool's k
    schedule_max_num_seqs: int = 256
    schedule_gamma_max: int = 8
    schedule_margin: float = 0.0
    actuator_timeout_s: float = 30.0
    skip_interval_s: float = 600.0


@dataclass(frozen=True, slots=True)
class TargetActuation:
    """One target's actuation state at `now_s`, for GET /v1/actions and the exporter."""

    target: str
    target_ref: str
    mode: str
    dry_run: bool
    paused: bool
    override: Override | None
    cooldown_remaining_s: float
    cooldown_until_s: float | None
    actions_last_hour: int
    actions_last_day: int
    last_observation: DeploymentObservation | None
    last_plan: ActionPlan | None
    last_action_s: float | None
    last_result: str | None
    actions: Mapping[str, int]  # by result: applied, dry_run, failed
    skipped: Mapping[str, int]  # by SkipReason value
    errors: Mapping[str, int]  # by ActuatorError value

    @property
    def last_observation_error(self) -> str | None:
        obs = self.last_observation
        if obs is None or obs.error is None:
            return None
        return f"{obs.error.value}: {obs.detail}" if obs.detail else obs.error.value


@dataclass(slots=True)
class _Runtime:
    target: str
    actuator: Actuator
    state: ActuationState = field(default_factory=ActuationState)
    last_observation: DeploymentObservation | None = None
    last_plan: ActionPlan | None = None
    last_result: str | None = None
    actions: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Entry:
    """What one audit record says: its kind and result, why (`reason`, `detail`), the setting wanted, and for an
    action the actuator's result; for an override, when it expires."""

    kind: str
    reason: str
    result: str = "ok"
    desired: SpeculationSetting | None = None
    detail: str = ""
    apply: ApplyResult | None = None
    expires_at_s: float | None = None


class Leadership(Protocol):
    """Whether this replica may act (leader election; service/actuators/leader.py `LeaseElector`)."""

    @property
    def holder(self) -> str | None:
        """Who holds the lease as last observed ("" nobody, None not read yet)."""
        ...

    def leading(self) -> bool:
        """True while this replica leads and may act."""
        ...

    def describe(self) -> str:
        """Why this replica does not act, in words."""
        ...


class UnknownTargetError(KeyError):
    """A command named a target the runner does not act on."""


class AuditNotPersistedError(Exception):
    """An operator command changed the gate state in memory, but its audit record could not be written: it holds
    until the next restart only (the restart rebuilds the gate from the log)."""

    def __init__(self, targets: Sequence[str]) -> None:
        super().__init__(f"applied in memory, not persisted to the audit log for {', '.join(targets)}")
        self.targets = tuple(targets)


class ActuationRunner:
    """Acts on `actuators` (target name -> Actuator) from `board`'s decisions; every step lands in `audit`."""

    def __init__(
        self,
        board: Board,
        actuators: Mapping[str, Actuator],
        *,
        options: RunnerOptions,
        audit: AuditLog,
        logger: logging.Logger | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self._board = board
        self._leadership = leadership
        self._options = options
        self._audit = audit
        self._throttle = SkipThrottle(options.skip_interval_s)
        self._runtimes = {name: _Runtime(target=name, actuator=actuator) for name, actuator in actuators.items()}
        self._log = logger if logger is not None else get_logger("actuation")
        self._task: asyncio.Task[None] | None = None
        self.busy_ticks = 0
        self.audit_errors = 0
        self.version = 0  # grows with every change a reader could see

    @property
    def mode(self) -> str:
        return self._options.mode

    @property
    def dry_run(self) -> bool:
        return self._options.config.dry_run

    @property
    def config(self) -> ActuationConfig:
        return self._options.config

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(self._runtimes)

    @property
    def leadership(self) -> Leadership | None:
        """The leader election this runner obeys; None when it is off (this replica always acts)."""
        return self._leadership

    def leading(self) -> bool:
        """Whether this replica may act now (always, without leader election)."""
        return self._leadership is None or self._leadership.leading()

    # -- the listener ------------------------------------------------------------------------------------------

    async def after_iteration(self, now_s: float) -> None:
        """Start one pass over the targets at `now_s` unless the previous one is still running."""
        if self._task is not None and not self._task.done():
            self.busy_ticks += 1
            self.version += 1
            return
        self._task = asyncio.create_task(self._pass(now_s), name="spec-advisor-actuation")

    async def idle(self) -> None:
        """Wait for the pass in flight (if any) to finish."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def aclose(self, *, grace_s: float = 5.0) -> None:
        """Let a pass in flight finish for up to `grace_s`, then cancel it (at shutdown)."""
        task = self._task
        if task is None:
            return
        failed = await cancel_and_wait(task, grace_s=grace_s)
        if failed is not None:
            self._log.error("the last actuation pass failed", exc_info=failed)

    async def _pass(self, now_s: float) -> None:
        for runtime in self._runtimes.values():
            try:
                await self._step(runtime, now_s)
            except Exception as exc:  # a bug of ours: keep acting on the other targets, keep advising
                self._log.error("actuation step failed", exc_info=exc, extra=fields(target=runtime.target))
                runtime.errors[ActuatorError.UNEXPECTED.value] = runtime.errors.get("unexpected", 0) + 1
                self.version += 1

    async def _step(self, runtime: _Runtime, now_s: float) -> None:
        if not self.leading():
            await self._not_leader(runtime, now_s)
            return
        observation = await self._observe(runtime, now_s)
        # The decision is read after the observation, which can take up to actuator_timeout_s: the gate must judge
        # the recommendation in force now, not the one from before the wait.
        status = self._board.get(runtime.target)
        decision, thin_evidence = _gate_decision(status)
        if observation.engine is not None and status is not None and status.context is not None:
            # What runs against what the advice priced: the gate holds a change back while they differ.
            why = engine_mismatch(observation.engine, priced_engine(status.context))
            observation = replace(observation, engine_mismatch=why)
        runtime.last_observation = observation
        if observation.error is not None:
            runtime.errors[observation.error.value] = runtime.errors.get(observation.error.value, 0) + 1
        desired = await self._desired(runtime.target, decision, status)
        plan, state = gate_action(
            decision, observation, desired, config=self._options.config, state=runtime.state, now_s=now_s
        )
        if thin_evidence is not None and plan.skip is not None and plan.skip.value == thin_evidence.value:
            plan = replace(plan, detail=f"the recommendation is ok but the live evidence is {thin_evidence.value} "
                                        "(an ok decision over a thin window rests on remembered acceptance)")
        if plan.act and not self.leading():  # lost the lease while observing: the gate's verdict is void
            await self._not_leader(runtime, now_s)
            return
        runtime.state = state
        runtime.last_plan = plan
        self.version += 1
        if not plan.act:
            assert plan.skip is not None
            # An observation error's cause is part of its key: forbidden then unreachable is news worth a line.
            key = plan.skip.value if observation.error is None else f"{plan.skip.value}:{observation.error.value}"
            await self._skipped(runtime, plan, now_s, status=status, observation=observation, key=key)
            return
        assert plan.desired is not None
        reason = "override" if plan.via_override else "recommendation"
        result = await self._act(runtime, plan, observation, status=status, reason=reason, now_s=now_s)
        label = _result_label(result)
        self._log.log(
            logging.WARNING if result.error is not None else logging.INFO,
            "actuation " + label,
            extra=fields(target=runtime.target, ref=runtime.actuator.target_ref, mode=self._options.mode,
                         desired=_setting_json(plan.desired), error=result.error and result.error.value,
                         detail=result.detail),
        )
        detail = plan.detail if not result.detail else f"{plan.detail}; {result.detail}".strip("; ")
        # The record first, the counters after: a reader of /v1/actions that sees the count also sees the record
        # (the write awaits a thread, and GET /v1/actions is served meanwhile). The action happened whatever the
        # write does (a cancelled await, an unexpected error): the counters and the throttle follow it anyway.
        try:
            entry = _Entry("action", reason, label, desired=plan.desired, detail=detail, apply=result)
            await self._write(self._record(runtime, now_s, entry, status=status, observation=observation))
        finally:
            runtime.actions[label] = runtime.actions.get(label, 0) + 1
            runtime.last_result = label
            if result.error is not None:
                runtime.errors[result.error.value] = runtime.errors.get(result.error.value, 0) + 1
            self.version += 1
            self._throttle.reset(runtime.target)

    async def _not_leader(self, runtime: _Runtime, now_s: float) -> None:
        """A step while another replica leads (or this one cannot renew): skip `not_leader`, audited when the holder
        changes or once per skip interval; the object is not read, and of the gate state only the dwell is cleared."""
        assert self._leadership is not None
        plan = ActionPlan(act=False, desired=None, skip=SkipReason.NOT_LEADER, detail=self._leadership.describe())
        runtime.last_plan = plan
        # The dwell restarts: a replica that leads again must hold the wanted setting for a whole dwell as leader.
        runtime.state = replace(runtime.state, wanted=None, wanted_since_s=None)
        self.version += 1
        key = f"{SkipReason.NOT_LEADER.value}:{self._leadership.holder or ''}"
        await self._skipped(runtime, plan, now_s, status=self._board.get(runtime.target),
                            observation=runtime.last_observation, key=key)

    async def _skipped(
        self,
        runtime: _Runtime,
        plan: ActionPlan,
        now_s: float,
        *,
        status: BoardEntry | None,
        observation: DeploymentObservation | None,
        key: str,
    ) -> None:
        """Count a skip and write it when its throttle `key` (the reason, with what else makes it news) changed or
        its interval passed."""
        assert plan.skip is not None
        runtime.skipped[plan.skip.value] = runtime.skipped.get(plan.skip.value, 0) + 1
        if self._throttle.should_write(runtime.target, key, now_s):
            entry = _Entry("skip", plan.skip.value, "skipped", desired=plan.desired, detail=plan.detail)
            await self._write(self._record(runtime, now_s, entry, status=status, observation=observation))

    async def _act(
        self,
        runtime: _Runtime,
        plan: ActionPlan,
        observation: DeploymentObservation,
        *,
        status: BoardEntry | None,
        reason: str,
        now_s: float,
    ) -> ApplyResult:
        """Dry run: the patch, unsent. Live: compute the exact patch first (a dry run of the same apply), make an
        "action_started" record of it durable, and only then send it. A patch that cannot be recorded is not sent."""
        assert plan.desired is not None
        if self._options.config.dry_run:
            return await self._apply(runtime, plan.desired, observation, dry_run=True)
        preview = await self._apply(runtime, plan.desired, observation, dry_run=True)
        if preview.error is not None or preview.patch is None:
            return replace(preview, dry_run=False)  # nothing to send, or it would fail the same way: nothing sent
        entry = _Entry("action_started", reason, "started", desired=plan.desired, detail=plan.detail, apply=preview)
        started = await self._write(self._record(runtime, now_s, entry, status=status, observation=observation))
        if not started:
            return ApplyResult(applied=False, dry_run=False, patch=preview.patch, patch_type=preview.patch_type,
                               error=ActuatorError.UNEXPECTED,
                               detail="not sent: the audit log could not record the action before it")
        if not self.leading():  # the preview and the record took a while: another replica may lead by now
            return ApplyResult(applied=False, dry_run=False, patch=preview.patch, patch_type=preview.patch_type,
                               error=ActuatorError.UNEXPECTED,
                               detail="not sent: this replica stopped leading before the patch went out "
                                      f"({self._leadership.describe() if self._leadership is not None else ''})")
        return await self._apply(runtime, plan.desired, observation, dry_run=False)

    async def _observe(self, runtime: _Runtime, now_s: float) -> DeploymentObservation:
        try:
            async with asyncio.timeout(self._options.actuator_timeout_s):
                return await runtime.actuator.observe(now_s)
        except TimeoutError:
            return DeploymentObservation(
                at_s=now_s, setting=None, rollout_in_progress=False, error=ActuatorError.UNREACHABLE,
                detail=f"no answer within {self._options.actuator_timeout_s:g} s",
            )
        except Exception as exc:  # the actuator broke its never-raise contract
            self._log.error("actuator observe raised", exc_info=exc, extra=fields(target=runtime.target))
            return DeploymentObservation(
                at_s=now_s, setting=None, rollout_in_progress=False, error=ActuatorError.UNEXPECTED,
                detail=f"{type(exc).__name__}: {exc}",
            )

    async def _apply(
        self, runtime: _Runtime, desired: SpeculationSetting, observation: DeploymentObservation, *, dry_run: bool
    ) -> ApplyResult:
        try:
            async with asyncio.timeout(self._options.actuator_timeout_s):
                return await runtime.actuator.apply(desired, observation, dry_run=dry_run)
        except TimeoutError:
            return ApplyResult(applied=False, dry_run=dry_run, patch=None, patch_type=None,
                               error=ActuatorError.UNREACHABLE,
                               detail=f"no answer within {self._options.actuator_timeout_s:g} s (the next observation "
                                      "shows whether it landed)")
        except Exception as exc:
            self._log.error("actuator apply raised", exc_info=exc, extra=fields(target=runtime.target))
            return ApplyResult(applied=False, dry_run=dry_run, patch=None, patch_type=None,
                               error=ActuatorError.UNEXPECTED, detail=f"{type(exc).__name__}: {exc}")

    async def _desired(
        self, target: str, decision: Decision | None, status: BoardEntry | None
    ) -> SpeculationSetting | None:
        if decision is None or decision.state != DataState.OK:
            return None
        schedule: BatchSchedule | None = None
        if self._options.mode == "schedule":
            schedule = await asyncio.to_thread(self._schedule, status)
            if schedule is None:
                return None
        return desired_setting(decision, mode=self._options.mode, schedule=schedule,
                               on_pool_k=self._options.on_pool_k.get(target))

    def _schedule(self, status: BoardEntry | None) -> BatchSchedule | None:
        if status is None or status.evidence is None or status.context is None:
            return None
        try:
            scales = status.calibration.scales if status.calibration is not None else CostScales()
            plan = inputs_from_evidence(
                status.evidence, status.context,
                ScheduleAsk(
                    max_num_seqs=engine_max_num_seqs(status.context, self._options.schedule_max_num_seqs),
                    gamma_max=self._options.schedule_gamma_max, margin=self._options.schedule_margin,
                ),
                scales=scales,
            )
            return schedule_for(plan)
        except ValueError as exc:
            self._log.warning("no schedule for the target", extra=fields(target=status.target, reason=str(exc)))
            return None

    # -- restart -----------------------------------------------------------------------------------------------

    def restore(self, records: Sequence[Mapping[str, Any]], *, now_s: float) -> None:
        """Rebuild each target's gate state from audit records (oldest first) read back at start-up
        (`AuditLog.gate_records`): the pause switch, an unexpired override, and the actions of the last day
        (cooldown and caps). So a restart neither un-pauses a target nor resets its rate limits. An
        "action_started" record counts as an action (a crash may have cut off its result); its "action" record
        (same target and `at_s`) is then not counted again. Dry-run actions count only while running in dry run:
        they sent nothing, so they must not hold back the first live actions. The dwell starts afresh (it needs
        fresh good data anyway)."""
        started: dict[str, float] = {}  # target -> at_s of the last action_started record
        for record in records:
            runtime = self._runtimes.get(str(record.get("target")))
            at_s = record.get("at_s")
            if runtime is None or not isinstance(at_s, int | float):
                continue
            kind = record.get("kind")
            command = _RESTORE_COMMAND.get(kind) if isinstance(kind, str) else None
            if command is not None:
                runtime.state = command(runtime.state, record, float(at_s))
            elif kind in ("action_started", "action"):
                runtime.state = self._restored_from_action(runtime, record, float(at_s), now_s, started)
        for runtime in self._runtimes.values():
            if runtime.state.override is not None and active_override(runtime.state, now_s) is None:
                runtime.state = replace(runtime.state, override=None)
        self.version += 1

    def _restored_from_action(
        self, runtime: _Runtime, record: Mapping[str, Any], at_s: float, now_s: float, started: dict[str, float]
    ) -> ActuationState:
        """`runtime`'s gate state after an "action_started" or "action" record at `at_s`; `started` (target -> at_s
        of its last "action_started" record) is updated so an action's result is not counted twice."""
        if record.get("kind") == "action_started":
            started[runtime.target] = at_s
            return _restored_action(runtime.state, at_s, now_s)
        if started.get(runtime.target) == at_s:
            del started[runtime.target]  # the result of an action already counted from its started record
            return runtime.state
        if self._counts_at_restore(record.get("result")):
            return _restored_action(runtime.state, at_s, now_s)
        return runtime.state

    def _counts_at_restore(self, result: object) -> bool:
        return result in _LIVE_RESULTS or (result == "dry_run" and self._options.config.dry_run)

    # -- operator commands -------------------------------------------------------------------------------------

    async def pause(self, target: str | None, *, reason: str, now_s: float) -> list[str]:
        """Pause one target (or all when None); returns the targets paused. Every command raises
        AuditNotPersistedError (after changing the state in memory) when its audit record could not be written."""
        return await self._command(target, _Entry("pause", reason), now_s, lambda s: replace(s, paused=True))

    async def resume(self, target: str | None, *, reason: str, now_s: float) -> list[str]:
        return await self._command(target, _Entry("resume", reason), now_s, lambda s: replace(s, paused=False))

    async def set_override(
        self, target: str, *, num_speculative_tokens: int, expires_in_s: float, reason: str, now_s: float
    ) -> Override:
        """Make `target` run k = `num_speculative_tokens` (0 = off) until now + `expires_in_s`. In routing mode any
        k >= 1 means "the on-pool" (whose k is fixed)."""
        k = num_speculative_tokens
        on_pool_k = self._options.on_pool_k.get(target)
        if self._options.mode == "routing" and k > 0 and on_pool_k is not None:
            k = on_pool_k
        override = Override(setting=SpeculationSetting(k), expires_at_s=now_s + expires_in_s, reason=reason,
                            set_at_s=now_s)
        entry = _Entry("override", reason, desired=override.setting, detail=f"until {rfc3339(override.expires_at_s)}",
                       expires_at_s=override.expires_at_s)
        await self._command(target, entry, now_s, lambda s: replace(s, override=override))
        return override

    async def clear_override(self, target: str, *, reason: str, now_s: float) -> bool:
        """Drop `target`'s override; False when it had none in force."""
        runtime = self._runtime(target)
        had = active_override(runtime.state, now_s) is not None
        await self._command(target, _Entry("override_cleared", reason), now_s, lambda s: replace(s, override=None))
        return had

    async def _command(
        self, target: str | None, entry: _Entry, now_s: float, change: Callable[[ActuationState], ActuationState]
    ) -> list[str]:
        """Apply `change` to the gate state of `target` (all targets when None), then write `entry` for each."""
        runtimes = list(self._runtimes.values()) if target is None else [self._runtime(target)]
        for runtime in runtimes:
            runtime.state = change(runtime.state)
            self._throttle.reset(runtime.target)
        self.version += 1
        unpersisted: list[str] = []
        for runtime in runtimes:
            self._log.info("actuation " + entry.kind, extra=fields(target=runtime.target, reason=entry.reason))
            status = self._board.get(runtime.target)
            written = await self._write(self._record(
                runtime, now_s, entry, status=status, observation=runtime.last_observation
            ))
            if not written:
                unpersisted.append(runtime.target)
        if unpersisted:
            raise AuditNotPersistedError(unpersisted)
        return [runtime.target for runtime in runtimes]

    def _runtime(self, target: str) -> _Runtime:
        runtime = self._runtimes.get(target)
        if runtime is None:
            raise UnknownTargetError(target)
        return runtime

    # -- what readers see --------------------------------------------------------------------------------------

    def statuses(self, now_s: float) -> tuple[TargetActuation, ...]:
        return tuple(self._status(runtime, now_s) for runtime in self._runtimes.values())

    def _status(self, runtime: _Runtime, now_s: float) -> TargetActuation:
        state = runtime.state
        config = self._options.config
        remaining = cooldown_remaining_s(state, config, now_s)
        return TargetActuation(
            target=runtime.target,
            target_ref=runtime.actuator.target_ref,
            mode=self._options.mode,
            dry_run=config.dry_run,
            paused=state.paused,
            override=active_override(state, now_s),
            cooldown_remaining_s=remaining,
            cooldown_until_s=None if state.last_action_s is None else state.last_action_s + config.cooldown_s,
            actions_last_hour=actions_within(state, HOUR_S, now_s),
            actions_last_day=actions_within(state, DAY_S, now_s),
            last_observation=runtime.last_observation,
            last_plan=runtime.last_plan,
            last_action_s=state.last_action_s,
            last_result=runtime.last_result,
            actions=MappingProxyType(dict(runtime.actions)),
            skipped=MappingProxyType(dict(runtime.skipped)),
            errors=MappingProxyType(dict(runtime.errors)),
        )

    # -- the audit log -----------------------------------------------------------------------------------------

    def _record(
        self,
        runtime: _Runtime,
        now_s: float,
        entry: _Entry,
        *,
        status: BoardEntry | None,
        observation: DeploymentObservation | None,
    ) -> dict[str, Any]:
        """The audit record of `entry` for `runtime`'s target at `now_s`, with what was observed and the evidence."""
        apply = entry.apply
        return {
            "time": rfc3339(now_s),
            "at_s": now_s,
            "kind": entry.kind,
            "target": runtime.target,
            "target_ref": runtime.actuator.target_ref,
            "mode": self._options.mode,
            "dry_run": self._options.config.dry_run,
            "desired": _setting_json(entry.desired),
            "observed": None if observation is None else _setting_json(observation.setting),
            "observed_error": None if observation is None or observation.error is None else observation.error.value,
            "reason": entry.reason,
            "detail": entry.detail,
            "patch": None if apply is None else apply.patch,
            "patch_type": None if apply is None else apply.patch_type,
            "result": entry.result,
            "error": None if apply is None or apply.error is None else apply.error.value,
            "resource_version": None if apply is None else apply.resource_version,
            "evidence": _evidence_summary(status),
            "expires_at_s": entry.expires_at_s,
        }

    async def _write(self, record: dict[str, Any]) -> bool:
        """Append `record`; False (counted, logged) when it could not be made durable."""
        try:
            await asyncio.to_thread(self._audit.append, record)
        except (OSError, RuntimeError) as exc:  # a full disk must not stop advising; the counter shows it
            self.audit_errors += 1
            self.version += 1
            self._log.error("audit log write failed", extra=fields(path=str(self._audit.path), error=str(exc)))
            return False
        return True


def skip_reasons() -> tuple[str, ...]:
    """Every skip reason, so counters can start at 0 for each."""
    return tuple(reason.value for reason in SkipReason)


def _gate_decision(status: BoardEntry | None) -> tuple[Decision | None, DataState | None]:
    """The decision the gate judges, and the evidence state when it downgraded an ok decision. An ok decision
    needs ok live evidence too: otherwise it is handed to the gate in the evidence's state (insufficient_data when
    there is no evidence), so the gate skips for that reason, restarts the dwell and still lets an override act."""
    if status is None or status.decision is None:
        return None, None
    judged = judged_decision(status.decision, status.evidence.state if status.evidence is not None else None)
    return judged, (judged.state if judged is not status.decision and judged is not None else None)


def _result_label(result: ApplyResult) -> str:
    if result.error is not None:
        return "failed"
    if result.patch is None:
        return "noop"  # the object already ran the setting when the patch was computed: nothing was sent
    return "dry_run" if result.dry_run else "applied"


def _restored_action(state: ActuationState, at_s: float, now_s: float) -> ActuationState:
    if now_s - at_s >= DAY_S:
        return state
    return replace(state, last_action_s=at_s, recent_actions_s=(*state.recent_actions_s, at_s))


def _restored_override(state: ActuationState, record: Mapping[str, Any], at_s: float) -> ActuationState:
    desired, expires_at_s = record.get("desired"), record.get("expires_at_s")
    k = desired.get("num_speculative_tokens") if isinstance(desired, dict) else None
    if not isinstance(k, int) or not isinstance(expires_at_s, int | float):
        return state
    override = Override(setting=SpeculationSetting(k), expires_at_s=float(expires_at_s),
                        reason=str(record.get("reason", "")), set_at_s=at_s)
    return replace(state, override=override)


# How an operator command's audit record ("kind") changes the gate state it is restored into.
_RESTORE_COMMAND: dict[str, Callable[[ActuationState, Mapping[str, Any], float], ActuationState]] = {
    "pause": lambda state, _record, _at_s: replace(state, paused=True),
    "resume": lambda state, _record, _at_s: replace(state, paused=False),
    "override": _restored_override,
    "override_cleared": lambda state, _record, _at_s: replace(state, override=None),
}


def _setting_json(setting: SpeculationSetting | None) -> dict[str, Any] | None:
    if setting is None:
        return None
    return {"num_speculative_tokens": setting.num_speculative_tokens,
            "schedule": [list(band) for band in setting.schedule]}


def _evidence_summary(status: BoardEntry | None) -> dict[str, Any] | None:
    if status is None or status.decision is None:
        return None
    decision, evidence = status.decision, status.evidence
    acceptance = evidence.acceptance if evidence is not None else None
    return {
        "decision_state": decision.state.value,
        "evidence_state": None if evidence is None else evidence.state.value,
        "recommended_enabled": decision.enabled,
        "recommended_num_speculative_tokens": decision.num_speculative_tokens,
        "expected_speedup": decision.expected_speedup,
        "expected_speedup_low": decision.expected_speedup_low,
        "objective": decision.objective,
        "batch": None if evidence is None else evidence.batch,
        "acceptance_rate": None if acceptance is None else acceptance.acceptance_rate,
        "mean_acceptance_length": None if acceptance is None else acceptance.mean_acceptance_length,
        "decision_reason": decision.reason,
    }
