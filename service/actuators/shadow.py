"""The shadow actuator (`actuation.mode: shadow`): the gate runs as it would live, each action is recorded and
never sent, and each is scored later against the load that came (policies/act/shadow.py). It needs no Kubernetes
access: the deployed k comes from the engine's own metrics (the board's evidence).

Per runner step (one per advisor iteration): `observe` first adds the iteration's decision curve to the action
being evaluated (ok decisions only, each iteration once) and reports the shadow deployment's k; `apply` records
the action (result `dry_run`, its would-be change in the audit log as {"num_speculative_tokens": k}). Each
evaluated action is logged ("shadow action evaluated": predicted and realised gain) and read by the exporter's
shadow families (`outcome`).
"""

from __future__ import annotations

from policies.act.deployment import ActuatorError, ApplyResult, DeploymentObservation, SpeculationSetting
from policies.act.shadow import ShadowLedger, ShadowOutcome, observe_tick, record_action, with_deployed
from policies.types import DataState
from service.board import Board
from service.logs import fields, get_logger

SHADOW_PATCH_TYPE = "shadow"

_log = get_logger("shadow")


class ShadowActuator:
    """One target's shadow deployment, scored over `horizon_s` seconds after each action."""

    def __init__(self, board: Board, target: str, *, horizon_s: float) -> None:
        self._board = board
        self._target = target
        self._horizon_s = horizon_s
        self._ledger = ShadowLedger()
        self._seen_decision_s: float | None = None

    @property
    def mode(self) -> str:
        return "shadow"

    @property
    def target_ref(self) -> str:
        return f"shadow/{self._target}"

    @property
    def ledger(self) -> ShadowLedger:
        return self._ledger

    def outcome(self) -> ShadowOutcome | None:
        """The last evaluated action, or None before the first."""
        return self._ledger.last

    async def observe(self, now_s: float) -> DeploymentObservation:
        status = self._board.get(self._target)
        evidence = status.evidence if status is not None else None
        decision = status.decision if status is not None else None
        deployed = None
        if evidence is not None and evidence.state is not DataState.ERROR:
            deployed = evidence.deployed_k if evidence.speculation_on else 0
        self._ledger = with_deployed(self._ledger, deployed)
        curve = None
        if decision is not None and decision.state is DataState.OK and decision.evaluated_at_s != self._seen_decision_s:
            self._seen_decision_s = decision.evaluated_at_s
            curve = decision.curve
        self._ledger, closed = observe_tick(self._ledger, now_s=now_s, curve=curve, horizon_s=self._horizon_s)
        if closed is not None:
            _log_outcome(self._target, closed)
        if self._ledger.running_k is None:
            return DeploymentObservation(at_s=now_s, setting=None, rollout_in_progress=False,
                                         error=ActuatorError.NOT_FOUND,
                                         detail="the deployed k is not known yet (no evidence from the engine)")
        return DeploymentObservation(at_s=now_s, setting=SpeculationSetting(self._ledger.running_k),
                                     rollout_in_progress=False)

    async def apply(
        self, desired: SpeculationSetting, observed: DeploymentObservation, *, dry_run: bool
    ) -> ApplyResult:
        status = self._board.get(self._target)
        curve = status.decision.curve if status is not None and status.decision is not None else ()
        self._ledger, closed = record_action(self._ledger, at_s=observed.at_s, to_k=desired.num_speculative_tokens,
                                             curve=curve)
        if closed is not None:
            _log_outcome(self._target, closed)
        patch = {"num_speculative_tokens": desired.num_speculative_tokens}
        return ApplyResult(applied=False, dry_run=True, patch=patch, patch_type=SHADOW_PATCH_TYPE)


def _log_outcome(target: str, outcome: ShadowOutcome) -> None:
    action = outcome.action
    _log.info("shadow action evaluated", extra=fields(
        target=target, at_s=action.at_s, from_k=action.from_k, to_k=action.to_k,
        predicted_gain=action.predicted_gain, realised_gain=outcome.realised_gain, ticks=outcome.ticks,
    ))
