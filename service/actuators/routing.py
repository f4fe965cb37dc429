"""Mode `routing`: shift a Gateway API HTTPRoute's traffic between a speculation-on and a speculation-off pool.

The rule(s) whose backendRefs name both pools get weights on=100/off=0 (speculation on) or the inverse. HTTPRoute
is a CRD, and the API server only takes JSON patch, JSON merge patch and apply for CRDs (strategic merge: 415), so
the write is a JSON merge patch of the whole `spec.rules` (a merge patch replaces lists) with
`metadata.resourceVersion`, so a concurrent edit of the route gives a 409 instead of being overwritten.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from policies.act.deployment import ActuatorError, ApplyResult, DeploymentObservation, SpeculationSetting
from service.actuators.guarded_patch import GuardedWrite, PatchRefusedError, guarded_apply
from service.actuators.kube_errors import (
    error_for_exception,
    failed_observation,
)

HTTPRoute = create_namespaced_resource("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes")
PATCH_TYPE = PatchType.MERGE
FULL_WEIGHT = 100


def _weight(ref: Mapping[str, Any]) -> int:
    weight = ref.get("weight")
    return 1 if weight is None else int(weight)  # Gateway API: an omitted weight is 1


def split_rules(rules: Sequence[Mapping[str, Any]], on: str, off: str) -> list[int]:
    """Indexes of the rules whose backendRefs name both pools."""
    found = []
    for index, rule in enumerate(rules):
        names = {ref.get("name") for ref in rule.get("backendRefs") or []}
        if {on, off} <= names:
            found.append(index)
    return found


def on_share(rule: Mapping[str, Any], on: str, off: str) -> float:
    """The on-pool's share of the two pools' weights in one rule, in [0, 1] (0 when both weigh 0).

    Example: on weight 30, off weight 10 -> 30 / (30 + 10) = 0.75.
    """
    refs = rule.get("backendRefs") or []
    on_weight = sum(_weight(r) for r in refs if r.get("name") == on)
    off_weight = sum(_weight(r) for r in refs if r.get("name") == off)
    total = on_weight + off_weight
    return on_weight / total if total > 0 else 0.0


class RoutingActuator:
    """Reads and patches the weights of one HTTPRoute. Never raises: failures are reasons (see base.py)."""

    def __init__(
        self, client: AsyncClient, *, namespace: str, route: str, on_backend: str, off_backend: str, on_pool_k: int
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._route = route
        self._on = on_backend
        self._off = off_backend
        self._on_pool_k = on_pool_k

    @property
    def mode(self) -> str:
        return "routing"

    @property
    def target_ref(self) -> str:
        return f"httproute/{self._namespace}/{self._route}"

    async def _read(self) -> dict[str, Any]:
        route = await self._client.get(HTTPRoute, self._route, namespace=self._namespace)
        return dict(route)  # a Generic resource is the JSON object itself

    def _rules(self, route: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
        rules = list((route.get("spec") or {}).get("rules") or [])
        found = split_rules(rules, self._on, self._off)
        if not found:
            names = {ref.get("name") for rule in rules for ref in rule.get("backendRefs") or []}
            missing = [pool for pool in (self._on, self._off) if pool not in names]
            why = f"has no backendRef {missing!r}" if missing else "has no rule whose backendRefs name both pools"
            raise _NoBackendError(f"{self.target_ref} {why} (speculation on: {self._on!r}, off: {self._off!r})")
        return rules, found

    async def observe(self, now_s: float) -> DeploymentObservation:
        try:
            route = await self._read()
        except Exception as exc:  # every failure of the call is a reason, never an exception to the runner
            return failed_observation(now_s, *error_for_exception(exc, target=self.target_ref))
        metadata = route.get("metadata") or {}
        version = metadata.get("resourceVersion")
        in_progress, why = _programming(route)
        try:
            rules, found = self._rules(route)
        except _NoBackendError as exc:
            return DeploymentObservation(
                at_s=now_s, setting=None, rollout_in_progress=in_progress, resource_version=version,
                error=ActuatorError.NO_BACKEND, detail=str(exc),
            )
        share = on_share(rules[found[0]], self._on, self._off)
        setting = SpeculationSetting(self._on_pool_k if share >= 0.5 else 0)
        return DeploymentObservation(
            at_s=now_s, setting=setting, rollout_in_progress=in_progress, resource_version=version,
            on_weight_share=share, detail=why,
        )

    def patch_for(self, route: Mapping[str, Any], desired: SpeculationSetting) -> dict[str, Any] | None:
        """The JSON merge patch that sends all traffic to the pool `desired` needs, or None when it already goes
        there. Raises _NoBackendError when the route does not split between the two pools."""
        rules, found = self._rules(route)
        weights = {self._on: FULL_WEIGHT, self._off: 0} if desired.enabled else {self._on: 0, self._off: FULL_WEIGHT}
        new_rules = copy.deepcopy(rules)
        for index in found:
            for ref in new_rules[index].get("backendRefs") or []:
                if ref.get("name") in weights:
                    ref["weight"] = weights[ref["name"]]
        if new_rules == rules:
            return None
        version = (route.get("metadata") or {}).get("resourceVersion")
        return {"metadata": {"resourceVersion": version}, "spec": {"rules": new_rules}}

    async def apply(
        self, desired: SpeculationSetting, observed: DeploymentObservation, *, dry_run: bool
    ) -> ApplyResult:
        def patch_for(route: dict[str, Any]) -> dict[str, Any] | None:
            try:
                return self.patch_for(route, desired)
            except _NoBackendError as exc:
                raise PatchRefusedError(ActuatorError.NO_BACKEND, str(exc)) from exc

        async def send(patch: dict[str, Any]) -> str | None:
            result = await self._client.patch(
                HTTPRoute, self._route, patch, namespace=self._namespace, patch_type=PATCH_TYPE
            )
            metadata = result.metadata
            return metadata.resourceVersion if metadata is not None else None

        write = GuardedWrite(
            target_ref=self.target_ref, read=self._read, patch_for=patch_for, send=send, patch_type=PATCH_TYPE.value,
            unchanged=f"{self.target_ref} already routes to the desired pool; nothing to send",
        )
        return await guarded_apply(write, observed, dry_run=dry_run)

class _NoBackendError(Exception):
    pass


def _programming(route: Mapping[str, Any]) -> tuple[bool, str]:
    """A gateway has not yet accepted the route's latest generation (a weight change is not in effect yet)."""
    generation = int((route.get("metadata") or {}).get("generation") or 0)
    for parent in (route.get("status") or {}).get("parents") or []:
        for condition in parent.get("conditions") or []:
            seen = condition.get("observedGeneration")
            if seen is not None and int(seen) < generation:
                return True, f"parent {parent.get('parentRef', {}).get('name')!r} has not accepted generation " \
                             f"{generation} yet (condition {condition.get('type')} at {seen})"
    return False, ""
