"""The loopback kube-apiserver itself, against documented semantics: RFC 7386 and RFC 6902 examples, the Kubernetes
strategic-merge-patch docs' examples, and the API conventions for Status errors, resourceVersion and generation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kube_apiserver import DEPLOYMENTS, HTTPROUTES, FakeKubeApiServer, json_patch, merge_patch, strategic_merge_patch
from lightkube import ApiError
from lightkube.types import PatchType

from policies.act.deployment import ActuatorError
from service.actuators.kube_client import kube_client
from service.actuators.kube_errors import error_for_exception
from service.actuators.routing import HTTPRoute

NS = "default"
PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/patch-demo"


def demo() -> dict[str, Any]:
    # The Deployment of the Kubernetes task "Update API Objects in Place Using kubectl patch".
    return {
        "metadata": {"name": "patch-demo", "namespace": NS},
        "spec": {
            "replicas": 2, "selector": {"matchLabels": {"app": "nginx"}},
            "template": {"metadata": {"labels": {"app": "nginx"}}, "spec": {
                "containers": [{"name": "patch-demo-ctr", "image": "nginx"}],
                "tolerations": [{"effect": "NoSchedule", "key": "dedicated", "value": "test-team"}],
            }},
        },
    }


@pytest.fixture
def api() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer(tokens={"t": "alice"}) as server:
        server.put(DEPLOYMENTS, demo())
        server.finish_rollout(NS, "patch-demo")
        yield server


def send(api: FakeKubeApiServer, content_type: str, body: Any, *, token: str | None = "t",
         path: str = PATH) -> httpx.Response:
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.patch(api.url + path, content=json.dumps(body), headers=headers)


def test_rfc7386_appendix_a_examples() -> None:
    assert merge_patch({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert merge_patch({"a": "b"}, {"a": None}) == {}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}
    assert merge_patch({}, {"a": {"bb": {"ccc": None}}}) == {"a": {"bb": {}}}
    assert merge_patch({"a": "foo"}, "bar") == "bar"


def test_rfc6902_examples() -> None:
    assert json_patch({"foo": ["bar", "baz"]}, [{"op": "add", "path": "/foo/1", "value": "qux"}]) == {
        "foo": ["bar", "qux", "baz"]}
    assert json_patch({"foo": "bar"}, [{"op": "add", "path": "/child", "value": {"grandchild": {}}}]) == {
        "foo": "bar", "child": {"grandchild": {}}}
    assert json_patch({"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
                      [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}]) == {
        "foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}}
    assert json_patch({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": 10}]) == {"/": 9, "~1": 10}


def test_strategic_merge_merges_containers_by_name_and_replaces_other_lists() -> None:
    patched = strategic_merge_patch(demo(), {"spec": {"template": {"spec": {
        "containers": [{"name": "patch-demo-ctr-2", "image": "redis"}],
        "tolerations": [{"effect": "NoSchedule", "key": "disktype", "value": "ssd"}],
    }}}})
    spec = patched["spec"]["template"]["spec"]
    # The docs' outcome: both containers (merge key name), and only the new toleration (no merge key: replaced).
    assert spec["containers"] == [{"name": "patch-demo-ctr", "image": "nginx"}, {"name": "patch-demo-ctr-2",
                                                                                 "image": "redis"}]
    assert spec["tolerations"] == [{"effect": "NoSchedule", "key": "disktype", "value": "ssd"}]


def test_strategic_merge_directives() -> None:
    base = demo()
    base["spec"]["template"]["spec"]["containers"].append({"name": "b", "image": "x", "ports": [
        {"containerPort": 80, "name": "http"}, {"containerPort": 81, "name": "alt"}]})
    replaced = strategic_merge_patch(base, {"spec": {"template": {"spec": {
        "containers": [{"name": "only", "image": "y"}, {"$patch": "replace"}]}}}})
    assert replaced["spec"]["template"]["spec"]["containers"] == [{"name": "only", "image": "y"}]
    deleted = strategic_merge_patch(base, {"spec": {"template": {"spec": {
        "containers": [{"name": "b", "$patch": "delete"}]}}}})
    assert [c["name"] for c in deleted["spec"]["template"]["spec"]["containers"]] == ["patch-demo-ctr"]
    ports = strategic_merge_patch(base, {"spec": {"template": {"spec": {
        "containers": [{"name": "b", "ports": [{"containerPort": 81, "name": "renamed"}]}]}}}})
    assert ports["spec"]["template"]["spec"]["containers"][1]["ports"] == [
        {"containerPort": 80, "name": "http"}, {"containerPort": 81, "name": "renamed"}]
    whole_map = strategic_merge_patch(base, {"metadata": {"$patch": "replace", "name": "patch-demo"}})
    assert whole_map["metadata"] == {"name": "patch-demo"}


def test_versions_generation_noop_and_dry_run(api: FakeKubeApiServer) -> None:
    before = api.get(DEPLOYMENTS, NS, "patch-demo")
    label = {"metadata": {"labels": {"x": "1"}}}
    response = send(api, "application/merge-patch+json", label)
    assert response.status_code == 200
    body = response.json()
    assert int(body["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    assert body["metadata"]["generation"] == before["metadata"]["generation"]  # metadata only: same generation
    again = send(api, "application/merge-patch+json", label).json()
    assert again["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]  # no-op: not written
    scale = {"spec": {"replicas": 3}}
    dry = send(api, "application/merge-patch+json", scale, path=PATH + "?dryRun=All").json()
    assert dry["spec"]["replicas"] == 3 and api.get(DEPLOYMENTS, NS, "patch-demo")["spec"]["replicas"] == 2
    real = send(api, "application/strategic-merge-patch+json", scale).json()
    assert real["metadata"]["generation"] == before["metadata"]["generation"] + 1
    status = send(api, "application/merge-patch+json", {"status": {"replicas": 99}}).json()
    assert status["status"] == real["status"]  # status is a subresource: the main resource cannot change it


def status_of(response: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert response.status_code == code
    assert response.headers["content-type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert {k: body[k] for k in ("kind", "apiVersion", "status", "reason", "code")} == {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
    return body


def test_errors_are_status_objects(api: FakeKubeApiServer) -> None:
    version = api.get(DEPLOYMENTS, NS, "patch-demo")["metadata"]["resourceVersion"]
    stale = {"metadata": {"resourceVersion": str(int(version) - 1)}, "spec": {"replicas": 5}}
    conflict = status_of(send(api, "application/merge-patch+json", stale), 409, "Conflict")
    assert "the object has been modified" in conflict["message"]
    assert api.get(DEPLOYMENTS, NS, "patch-demo")["spec"]["replicas"] == 2
    failed_test = [{"op": "test", "path": "/spec/replicas", "value": 7}, {"op": "replace", "path": "/spec/replicas",
                                                                          "value": 9}]
    status_of(send(api, "application/json-patch+json", failed_test), 422, "Invalid")
    assert api.get(DEPLOYMENTS, NS, "patch-demo")["spec"]["replicas"] == 2  # all or nothing
    status_of(send(api, "application/merge-patch+json", {}, token=None), 401, "Unauthorized")
    status_of(send(api, "application/merge-patch+json", {}, token="nope"), 401, "Unauthorized")
    missing = status_of(send(api, "application/merge-patch+json", {}, path=PATH + "x"), 404, "NotFound")
    assert missing["message"] == 'deployments.apps "patch-demox" not found'
    status_of(send(api, "application/apply-patch+yaml", {}), 415, "UnsupportedMediaType")


def test_rbac_and_crd_patch_types() -> None:
    with FakeKubeApiServer(tokens={"t": "alice"}, grants={("alice", "get", "deployments", "patch-demo")}) as api:
        api.put(DEPLOYMENTS, demo())
        forbidden = status_of(send(api, "application/merge-patch+json", {}), 403, "Forbidden")
        assert 'User "alice" cannot patch resource "deployments" in API group "apps"' in forbidden["message"]
        assert httpx.get(api.url + PATH, headers={"Authorization": "Bearer t"}).status_code == 200
    with FakeKubeApiServer() as api:
        api.put(HTTPROUTES, {"metadata": {"name": "r", "namespace": NS}, "spec": {"rules": []}})

        async def strategic_on_a_crd() -> None:
            async with kube_client(api_url=api.url, kubeconfig=None, token_file=None, namespace=NS,
                                   timeout_s=5.0) as client:
                with pytest.raises(ApiError) as caught:
                    await client.patch(HTTPRoute, "r", {"spec": {"rules": []}}, patch_type=PatchType.STRATEGIC)
                assert caught.value.status.code == 415
                reason, _ = error_for_exception(caught.value, target="httproute/default/r")
                assert reason is ActuatorError.INVALID

        asyncio.run(strategic_on_a_crd())
