"""The actuation gate run over recorded decisions: what a deployment would have been told to do, and when.

`spec-advisor backtest` replays history through the advisor and hands each tick's decision to this replay, which
runs `gate_action` (policies/act/gate.py) exactly as the actuation runner does, in `kubernetes` mode (a fixed k, or
off), against a counterfactual deployment:

    running(t_0)    = what history ran at the first tick (the evidence's deployed k; 0 when speculation was off)
    running(t+)     = the wanted setting, from the tick the gate would have acted on (the change is taken as applied
                      at once and rolled out before the next tick; nothing failed)
    judged decision = the tick's decision, in its evidence's state when that is not ok (the runner's rule: an ok
                      recommendation over thin live evidence is good enough to advise, not to restart pods on)

History itself is not changed: the evidence after a would-be action still comes from what really ran, so the
acceptance of a k the deployment never ran stays the model's extrapolation, as it was for the live advisor.

The value of a would-be action is the decision's own prediction at that tick: gain = S(wanted) / S(running),
both read from the decision's curve (speedups relative to plain decoding, so the ratio is the expected change in
each sequence's token rate), with band ends S_low(wanted) / S(running) and S_high(wanted) / S(running). Example:
running k 3 priced at 0.90x and the decision says off (1.00x): gain 1.00 / 0.90 = 1.11, an 11% faster token rate
per sequence expected from turning speculation off.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from policies.act.deployment import DeploymentObservation, SpeculationSetting
from policies.act.gate import (
    ActionPlan,
    ActuationConfig,
    ActuationState,
    desired_setting,
    gate_action,
    judged_decision,
)
from policies.types import DataState, Decision


@dataclass(frozen=True, slots=True)
class ReplayTick:
    """One replayed iteration: its time (Unix s), the published decision (None before the first), the evidence's
    state (None: no evidence) and the k history ran (None when unknown)."""

    at_s: float
    decision: Decision | None
    evidence_state: DataState | None
    deployed_k: int | None


@dataclass(frozen=True, slots=True)
class WouldAct:
    """One action the gate would have taken: at `at_s`, from `running` to `wanted` k (0 = off), with the decision's
    predicted gain S(wanted) / S(running) and its 90% band (None where the curve lacks either option)."""

    at_s: float
    running_k: int
    wanted_k: int
    gain: float | None
    gain_low: float | None
    gain_high: float | None
    reason: str


@dataclass(frozen=True, slots=True)
class GateReplay:
    """The replay's outcome: the would-be actions in time order and how many ticks each skip reason held back."""

    actions: tuple[WouldAct, ...]
    skips: dict[str, int]


def replay_gate(ticks: Iterable[ReplayTick], *, config: ActuationConfig) -> GateReplay:
    """Run the gate over `ticks` (time order) against the counterfactual deployment (module docstring)."""
    state = ActuationState()
    running: SpeculationSetting | None = None
    actions: list[WouldAct] = []
    skips: Counter[str] = Counter()
    for tick in ticks:
        if running is None and tick.deployed_k is not None:
            running = SpeculationSetting(tick.deployed_k)
        decision = judged_decision(tick.decision, tick.evidence_state)
        desired = desired_setting(decision, mode="kubernetes") if decision is not None else None
        observation = DeploymentObservation(at_s=tick.at_s, setting=running, rollout_in_progress=False)
        plan, state = gate_action(decision, observation, desired, config=config, state=state, now_s=tick.at_s)
        if plan.act and plan.desired is not None and running is not None and decision is not None:
            actions.append(_would_act(tick.at_s, decision, running, plan))
            running = plan.desired
        elif plan.skip is not None:
            skips[plan.skip.value] += 1
    return GateReplay(actions=tuple(actions), skips=dict(skips))


def _would_act(at_s: float, decision: Decision, running: SpeculationSetting, plan: ActionPlan) -> WouldAct:
    wanted = plan.desired.num_speculative_tokens if plan.desired is not None else 0
    by_gamma = {point.gamma: point for point in decision.curve}
    here, there = by_gamma.get(running.num_speculative_tokens), by_gamma.get(wanted)
    gain = low = high = None
    if here is not None and there is not None and here.speedup > 0:
        gain = there.speedup / here.speedup
        low, high = there.speedup_low / here.speedup, there.speedup_high / here.speedup
    return WouldAct(at_s=at_s, running_k=running.num_speculative_tokens, wanted_k=wanted, gain=gain,
                    gain_low=low, gain_high=high, reason=decision.summary or decision.reason)
