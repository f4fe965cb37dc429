"""GET /v1/routes: the targets grouped by the route (traffic class, gateway route, pool) their settings name, and
which routes belong on a speculation-on pool (policies/decide/routes.py has the rule)."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import APIRouter
from pydantic import BaseModel, Field

from policies.decide.routes import RoutedTarget, route_advice
from service.board import Board


class RouteOut(BaseModel):
    route: str = Field(description="The route as the targets' settings name it (targets without one are left out).")
    targets: list[str] = Field(description="The configured targets serving it.")
    pool: str = Field(
        description="spec_on (at least half its generated tokens are on targets recommended on), spec_off, or "
        "unknown (no ok decision yet)."
    )
    share_on: float | None = Field(description="Share of its generated tokens on targets recommended on, 0..1.")
    expected_speedup: float | None = Field(
        description="The recommendations' expected speedups weighted by generated tokens/s."
    )
    mean_acceptance_length: float | None = Field(
        description="1 + accepted / drafts summed over its targets (tokens per verification); null when none measured."
    )
    relative_acceptance: float | None = Field(
        description="Its accepted drafts per draft over that of all routed targets (1.0 = their mean)."
    )
    drafts: float = Field(description="Drafts its acceptance rests on (a count).")
    reason: str = Field(description="The numbers behind the pool, for people.")


class RoutesOut(BaseModel):
    routes: list[RouteOut] = Field(description="One entry per route, sorted by name.")


def create_routes_router(board: Board, routes: Mapping[str, str]) -> APIRouter:
    """The router over `board`; `routes` maps a target name to its route (targets without a route are absent)."""
    router = APIRouter(tags=["routes"])

    @router.get("/v1/routes", response_model=RoutesOut)
    async def by_route() -> RoutesOut:
        """Per route: its targets, acceptance and whether it belongs on a speculation-on pool."""
        routed = [
            RoutedTarget(route=routes[entry.target], evidence=entry.evidence, decision=entry.decision)
            for entry in board.statuses() if entry.target in routes
        ]
        return RoutesOut(routes=[
            RouteOut(route=a.route, targets=list(a.targets), pool=a.pool, share_on=a.share_on,
                     expected_speedup=a.expected_speedup, mean_acceptance_length=a.mean_acceptance_length,
                     relative_acceptance=a.relative_acceptance, drafts=a.drafts, reason=a.reason)
            for a in route_advice(routed)
        ])

    return router
