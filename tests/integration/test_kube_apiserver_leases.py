"""The loopback kube-apiserver's Leases (coordination.k8s.io/v1), against the API server's documented behaviour:
create (201, 409 AlreadyExists), update guarded by resourceVersion (409 Conflict on a stale one, 422 without one,
create on update), the MicroTime wire format, Lease validation, resourceVersion bumped on every write, Status
bodies, and RBAC that cannot name the object of a create. Over real HTTP, raw and through lightkube."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from kube_apiserver import LEASES, FakeKubeApiServer
from lightkube import ApiError
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from policies.act.deployment import ActuatorError
from service.actuators.kube_client import kube_client
from service.actuators.kube_errors import error_for_exception

NS = "llm-serving"
COLLECTION = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
ITEM = f"{COLLECTION}/spec-advisor-actuation"
HEADERS = {"Authorization": "Bearer t", "Content-Type": "application/json"}


def lease(holder: str = "pod-a_1", *, version: str | None = None, name: str = "spec-advisor-actuation",
          **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NS}
    if version is not None:
        metadata["resourceVersion"] = version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 0,
                     "acquireTime": "2026-05-01T10:00:00.000000Z", "renewTime": "2026-05-01T10:00:00.000000Z",
                     **spec}}


def post(api: FakeKubeApiServer, body: Any, *, token: str = "t") -> httpx.Response:
    return httpx.post(api.url + COLLECTION, content=json.dumps(body), headers={**HEADERS,
                                                                               "Authorization": f"Bearer {token}"})


def put(api: FakeKubeApiServer, body: Any, *, path: str = ITEM) -> httpx.Response:
    return httpx.put(api.url + path, content=json.dumps(body), headers=HEADERS)


def status_of(response: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert response.status_code == code, response.text
    assert response.headers["content-type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert {k: body[k] for k in ("kind", "apiVersion", "metadata", "status", "reason", "code")} == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": reason, "code": code}
    return body


@pytest.fixture
def api() -> Any:
    with FakeKubeApiServer(tokens={"t": "alice"}) as server:
        yield server


def test_create_then_already_exists(api: FakeKubeApiServer) -> None:
    created = post(api, lease())
    assert created.status_code == 201
    body = created.json()
    assert body["kind"] == "Lease" and body["apiVersion"] == "coordination.k8s.io/v1"
    assert body["metadata"]["resourceVersion"] and body["metadata"]["uid"]
    assert "generation" not in body["metadata"]  # a Lease's strategy keeps no generation
    again = status_of(post(api, lease("pod-b_2")), 409, "AlreadyExists")
    assert again["message"] == 'leases.coordination.k8s.io "spec-advisor-actuation" already exists'
    assert again["details"] == {"name": "spec-advisor-actuation", "group": "coordination.k8s.io", "kind": "leases"}
    assert api.get(LEASES, NS, "spec-advisor-actuation")["spec"]["holderIdentity"] == "pod-a_1"  # the first won
    got = httpx.get(api.url + ITEM, headers=HEADERS)
    assert got.status_code == 200 and got.json() == body
    missing = status_of(httpx.get(api.url + COLLECTION + "/other", headers=HEADERS), 404, "NotFound")
    assert missing["message"] == 'leases.coordination.k8s.io "other" not found'


def test_update_is_guarded_by_the_resource_version_bumped_on_every_write(api: FakeKubeApiServer) -> None:
    first = post(api, lease()).json()["metadata"]["resourceVersion"]
    renewed = put(api, lease(version=first, renewTime="2026-05-01T10:00:02.000000Z"))
    assert renewed.status_code == 200
    second = renewed.json()["metadata"]["resourceVersion"]
    assert int(second) > int(first)
    assert renewed.json()["metadata"]["uid"] == api.get(LEASES, NS, "spec-advisor-actuation")["metadata"]["uid"]
    # Another writer renewed since version `first` was read: its update is refused whole.
    stale = status_of(put(api, lease("pod-b_2", version=first, leaseTransitions=1)), 409, "Conflict")
    assert stale["message"] == (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "spec-advisor-actuation": the object has been '
        "modified; please apply your changes to the latest version and try again")
    assert api.get(LEASES, NS, "spec-advisor-actuation")["spec"]["holderIdentity"] == "pod-a_1"
    # Leases allow no unconditional update.
    unconditional = status_of(put(api, lease("pod-b_2")), 422, "Invalid")
    assert "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update" in unconditional["message"]
    third = put(api, lease("pod-b_2", version=second, leaseTransitions=1)).json()["metadata"]["resourceVersion"]
    assert int(third) > int(second)
    # The same object again writes nothing: the resourceVersion stays.
    same = put(api, lease("pod-b_2", version=third, leaseTransitions=1)).json()["metadata"]["resourceVersion"]
    assert same == third


def test_a_put_creates_a_missing_lease_and_names_must_match(api: FakeKubeApiServer) -> None:
    created = put(api, lease())
    assert created.status_code == 201 and created.json()["metadata"]["resourceVersion"]
    wrong_name = status_of(put(api, lease(name="other"), path=ITEM), 400, "BadRequest")
    assert "does not match the name on the URL" in wrong_name["message"]
    other_ns = lease()
    other_ns["metadata"]["namespace"] = "elsewhere"
    status_of(post(api, other_ns), 400, "BadRequest")


def test_micro_times_are_parsed_with_six_digits_and_stored_in_utc(api: FakeKubeApiServer) -> None:
    for bad in ("2026-05-01T10:00:00Z", "2026-05-01T10:00:00.123Z", "2026-05-01T10:00:00.123456789Z", "yesterday"):
        refused = status_of(post(api, lease(renewTime=bad)), 400, "BadRequest")
        assert 'cannot be handled as a Lease: parsing time "' in refused["message"]
    stored = post(api, lease(renewTime="2026-05-01T12:00:00.500000+02:00")).json()
    assert stored["spec"]["renewTime"] == "2026-05-01T10:00:00.500000Z"


def test_lease_validation(api: FakeKubeApiServer) -> None:
    invalid = status_of(post(api, lease(leaseDurationSeconds=0)), 422, "Invalid")
    assert invalid["message"] == ('Lease.coordination.k8s.io "spec-advisor-actuation" is invalid: '
                                  "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0")
    status_of(post(api, lease(leaseTransitions=-1)), 422, "Invalid")
    assert api.find(LEASES, NS, "spec-advisor-actuation") is None


def test_rbac_cannot_name_the_object_of_a_create() -> None:
    named = {("alice", verb, "leases", "spec-advisor-actuation") for verb in ("get", "create", "update")}
    with FakeKubeApiServer(tokens={"t": "alice"}, grants=named) as api:
        forbidden = status_of(post(api, lease()), 403, "Forbidden")
        assert forbidden["message"] == (
            'leases.coordination.k8s.io is forbidden: User "alice" cannot create resource "leases" in API group '
            f'"coordination.k8s.io" in the namespace "{NS}"')
    grants = {("alice", "create", "leases", "*"), ("alice", "update", "leases", "spec-advisor-actuation")}
    with FakeKubeApiServer(tokens={"t": "alice"}, grants=grants) as api:
        version = post(api, lease()).json()["metadata"]["resourceVersion"]
        assert put(api, lease(version=version, leaseTransitions=1)).status_code == 200
        other = lease(name="other", version="1")
        status_of(put(api, other, path=COLLECTION + "/other"), 403, "Forbidden")


def test_lightkube_round_trip_and_error_reasons() -> None:
    async def scenario(api: FakeKubeApiServer) -> None:
        async with kube_client(api_url=api.url, kubeconfig=None, token_file=None, namespace=NS,
                               timeout_s=5.0) as client:
            client_lease = Lease(metadata=ObjectMeta(name="spec-advisor-actuation", namespace=NS), spec=LeaseSpec(
                holderIdentity="pod-a_1", leaseDurationSeconds=15, leaseTransitions=0,
                renewTime=datetime(2026, 5, 1, 10, 0, 0, 1, tzinfo=UTC)))
            created = await client.create(client_lease)
            assert created.metadata is not None and created.spec is not None
            assert created.spec.renewTime == datetime(2026, 5, 1, 10, 0, 0, 1, tzinfo=UTC)
            with pytest.raises(ApiError) as exists:
                await client.create(client_lease)
            assert exists.value.status.code == 409 and exists.value.status.reason == "AlreadyExists"
            stale = Lease(metadata=ObjectMeta(name="spec-advisor-actuation", namespace=NS, resourceVersion="1"),
                          spec=LeaseSpec(holderIdentity="pod-b_2", leaseDurationSeconds=15))
            with pytest.raises(ApiError) as conflict:
                await client.replace(stale)
            assert conflict.value.status.reason == "Conflict"
            assert error_for_exception(conflict.value, target="lease")[0] is ActuatorError.CONFLICT
            current = await client.get(Lease, "spec-advisor-actuation", namespace=NS)
            assert current.metadata is not None and current.metadata.resourceVersion == created.metadata.resourceVersion

    with FakeKubeApiServer() as api:  # no authentication: the client sends no token
        asyncio.run(scenario(api))
