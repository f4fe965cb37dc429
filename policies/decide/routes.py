"""Advice per route: which kinds of traffic belong on a speculation-on pool.

Acceptance depends on the traffic far more than on the server: code and structured output accept 2-3x more draft
tokens than open prose. When targets are labelled with the route (the traffic class, gateway route or pool) they
serve, the targets of one route are summed into one view and the route is placed:

    E[L]_route   = 1 + sum accepted / sum drafts                  over the route's targets that measured acceptance
    share_on     = sum over targets recommended on of G_t / sum G_t, G_t the target's generated tokens/s (1 each
                   when no target reports a rate)
    S_route      = sum G_t S_t / sum G_t                          the recommendations' expected speedups
    pool         = spec_on   when share_on >= 1/2
                   spec_off  when share_on < 1/2
                   unknown   when no target of the route has an ok decision

Example: route "code" with two targets, 800 and 200 tokens/s, both recommended on at S 1.9 and 1.7 -> share_on
1.0, S 1.86, spec_on; route "chat" with one target recommended off at 300 tokens/s -> spec_off.
`relative_acceptance` is the route's accepted drafts per draft over that of all the routed targets given (1.0 = their
mean; targets without a route are not given).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.types import DataState, Decision, Evidence


@dataclass(frozen=True, slots=True)
class RoutedTarget:
    """One target's latest evidence and decision, and the route its settings give it."""

    route: str
    evidence: Evidence | None
    decision: Decision | None


@dataclass(frozen=True, slots=True)
class RouteAdvice:
    route: str
    targets: tuple[str, ...]
    pool: str  # spec_on, spec_off, unknown
    share_on: float | None
    expected_speedup: float | None
    mean_acceptance_length: float | None
    relative_acceptance: float | None
    drafts: float
    reason: str


def route_advice(targets: Sequence[RoutedTarget]) -> tuple[RouteAdvice, ...]:
    """One advice per route, sorted by route name (module docstring)."""
    fleet_drafts = sum(_drafts(t)[0] for t in targets)
    fleet_accepted = sum(_drafts(t)[1] for t in targets)
    fleet_rate = fleet_accepted / fleet_drafts if fleet_drafts > 0 else None
    routes = sorted({t.route for t in targets})
    return tuple(_one(route, [t for t in targets if t.route == route], fleet_rate) for route in routes)


def _drafts(target: RoutedTarget) -> tuple[float, float]:
    acceptance = target.evidence.acceptance if target.evidence is not None else None
    return (acceptance.drafts, acceptance.accepted_tokens) if acceptance is not None else (0.0, 0.0)


def _one(route: str, members: list[RoutedTarget], fleet_rate: float | None) -> RouteAdvice:
    names = tuple(sorted(t.decision.target if t.decision else (t.evidence.target if t.evidence else "")
                         for t in members))
    drafts = sum(_drafts(t)[0] for t in members)
    accepted = sum(_drafts(t)[1] for t in members)
    per_draft = accepted / drafts if drafts > 0 else None
    relative = per_draft / fleet_rate if per_draft is not None and fleet_rate else None
    decided = [t for t in members if t.decision is not None and t.decision.state is DataState.OK]
    if not decided:
        return RouteAdvice(route, names, "unknown", None, None, _length(per_draft), relative, drafts,
                           "no target of the route has an ok decision yet")
    weights = [_rate(t) for t in decided]
    if not any(w > 0 for w in weights):
        weights = [1.0] * len(decided)
    total = sum(weights)
    share_on = sum(w for t, w in zip(decided, weights, strict=True) if t.decision and t.decision.enabled) / total
    speedup = sum(w * t.decision.expected_speedup for t, w in zip(decided, weights, strict=True)
                  if t.decision is not None) / total
    pool = "spec_on" if share_on >= 0.5 else "spec_off"
    reason = (f"{share_on:.0%} of the route's generated tokens are on targets recommended on; expected "
              f"{speedup:.2f}x" + (f"; acceptance {relative:.2f}x the fleet's" if relative is not None else ""))
    return RouteAdvice(route, names, pool, share_on, speedup, _length(per_draft), relative, drafts, reason)


def _rate(target: RoutedTarget) -> float:
    rate = target.evidence.generation_tokens_per_s if target.evidence is not None else None
    return rate if rate is not None and rate > 0 else 0.0


def _length(per_draft: float | None) -> float | None:
    return 1.0 + per_draft if per_draft is not None else None
