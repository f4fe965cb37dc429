"""RoutingActuator against the loopback kube-apiserver: HTTPRoute weights between a speculation-on and -off pool,
by JSON merge patch guarded by resourceVersion; failures as reasons with the route unchanged."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from kube_apiserver import HTTPROUTES, FakeKubeApiServer, patches

from policies.act.deployment import ActuatorError, DeploymentObservation, SpeculationSetting
from service.actuators.base import Actuator
from service.actuators.kube_client import kube_client
from service.actuators.routing import RoutingActuator

NS = "llm"
NAME = "vllm-llama-8b"
ON, OFF = "vllm-spec-on", "vllm-spec-off"
T = TypeVar("T")


def route(on_weight: int | None, off_weight: int | None) -> dict[str, Any]:
    def ref(name: str, weight: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {"group": "", "kind": "Service", "name": name, "port": 8000}
        if weight is not None:
            out["weight"] = weight
        return out

    return {
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "parentRefs": [{"name": "inference-gateway"}],
            "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/health"}}],
                 "backendRefs": [ref("health", None)]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                 "backendRefs": [ref(ON, on_weight), ref(OFF, off_weight)], "timeouts": {"request": "300s"}},
            ],
        },
    }


@pytest.fixture
def api() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer() as server:
        yield server


def run(api: FakeKubeApiServer, body: Callable[[RoutingActuator], Awaitable[T]], *, on: str = ON) -> T:
    async def scenario() -> T:
        async with kube_client(api_url=api.url, kubeconfig=None, token_file=None, namespace=NS, timeout_s=5.0) as c:
            return await body(RoutingActuator(c, namespace=NS, route=NAME, on_backend=on, off_backend=OFF,
                                              on_pool_k=3))

    return asyncio.run(scenario())


async def observe(actuator: RoutingActuator) -> DeploymentObservation:
    return await actuator.observe(1.0)


@pytest.mark.parametrize(
    ("on_weight", "off_weight", "share", "k"),
    [
        (100, 0, 1.0, 3),
        (0, 100, 0.0, 0),
        (30, 10, 0.75, 3),  # 30 / (30 + 10)
        (None, None, 0.5, 3),  # omitted weights are 1 each: 1 / 2, and half counts as on
        (10, 30, 0.25, 0),
    ],
)
def test_observe_reads_the_on_pool_share(
    api: FakeKubeApiServer, on_weight: int | None, off_weight: int | None, share: float, k: int
) -> None:
    api.put(HTTPROUTES, route(on_weight, off_weight))
    observed = run(api, observe)
    assert observed.error is None
    assert observed.on_weight_share == pytest.approx(share)
    assert observed.setting == SpeculationSetting(k)


def test_off_then_on_shifts_all_traffic_and_keeps_the_rest_of_the_route(api: FakeKubeApiServer) -> None:
    before = api.put(HTTPROUTES, route(100, 0))

    async def body(actuator: RoutingActuator) -> list[DeploymentObservation]:
        typed: Actuator = actuator
        assert (typed.mode, typed.target_ref) == ("routing", f"httproute/{NS}/{NAME}")
        first = await actuator.observe(1.0)
        off = await actuator.apply(SpeculationSetting(0), first, dry_run=False)
        assert off.applied and off.patch_type == "application/merge-patch+json", off.detail
        middle = await actuator.observe(2.0)
        on = await actuator.apply(SpeculationSetting(3), middle, dry_run=False)
        assert on.applied, on.detail
        return [middle, await actuator.observe(3.0)]

    middle, last = run(api, body)
    assert (middle.on_weight_share, middle.setting) == (0.0, SpeculationSetting(0))
    assert (last.on_weight_share, last.setting) == (1.0, SpeculationSetting(3))
    after = api.get(HTTPROUTES, NS, NAME)
    assert after["spec"] == before["spec"]  # back to on=100/off=0, everything else untouched
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 2


def test_dry_run_returns_the_merge_patch_of_all_rules_and_sends_nothing(api: FakeKubeApiServer) -> None:
    before = api.put(HTTPROUTES, route(100, 0))

    async def body(actuator: RoutingActuator) -> Any:
        result = await actuator.apply(SpeculationSetting(0), await actuator.observe(1.0), dry_run=True)
        assert (result.applied, result.dry_run, result.error) == (False, True, None)
        return result.patch

    patch = run(api, body)
    expected_rules = copy.deepcopy(before["spec"]["rules"])
    expected_rules[1]["backendRefs"][0]["weight"] = 0
    expected_rules[1]["backendRefs"][1]["weight"] = 100
    assert patch == {"metadata": {"resourceVersion": before["metadata"]["resourceVersion"]},
                     "spec": {"rules": expected_rules}}
    assert api.get(HTTPROUTES, NS, NAME) == before
    assert not list(patches(api.requests))


def test_a_missing_pool_is_no_backend(api: FakeKubeApiServer) -> None:
    api.put(HTTPROUTES, route(100, 0))

    async def body(actuator: RoutingActuator) -> None:
        observed = await actuator.observe(1.0)
        assert observed.error is ActuatorError.NO_BACKEND and "vllm-spec-on2" in observed.detail
        result = await actuator.apply(SpeculationSetting(0), observed, dry_run=False)
        assert result.error is ActuatorError.NO_BACKEND

    run(api, body, on="vllm-spec-on2")
    assert not list(patches(api.requests))


def test_a_concurrent_edit_of_the_route_is_a_conflict_not_an_overwrite(api: FakeKubeApiServer) -> None:
    api.put(HTTPROUTES, route(100, 0))

    def other_writer() -> None:
        api.mutate(HTTPROUTES, NS, NAME, lambda r: r["spec"]["rules"][1]["timeouts"].update(request="60s"))

    async def body(actuator: RoutingActuator) -> None:
        observed = await actuator.observe(1.0)
        api.before_patch = other_writer
        result = await actuator.apply(SpeculationSetting(0), observed, dry_run=False)
        assert (result.applied, result.error) == (False, ActuatorError.CONFLICT)

    run(api, body)
    stored = api.get(HTTPROUTES, NS, NAME)
    assert stored["spec"]["rules"][1]["timeouts"] == {"request": "60s"}  # the other writer's change stands
    assert [r["weight"] for r in stored["spec"]["rules"][1]["backendRefs"]] == [100, 0]  # ours was not applied


def test_forbidden_and_not_found_are_reasons() -> None:
    user = "system:serviceaccount:llm:spec-advisor"
    with FakeKubeApiServer(grants={(user, "get", "httproutes", "other")}) as api:
        api.put(HTTPROUTES, route(100, 0))
        assert run(api, observe).error is ActuatorError.FORBIDDEN
    with FakeKubeApiServer() as api:
        assert run(api, observe).error is ActuatorError.NOT_FOUND
