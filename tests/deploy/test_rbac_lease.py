"""deploy/kubernetes/rbac-lease, the leader election's component, added to the auto-toggle overlays the way an
operator scales out: it renders with `kubectl kustomize` and passes `kubernetes-validate --strict`, grants only what
leader election uses (create: any name, since RBAC cannot name the object of a create; get/update: the one Lease),
turns actuation.leader_election on for the advisor container with its pod's name, and is enough: two electors
authorized by exactly the rendered Roles elect one leader on the loopback API server and hand over on release.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import require_tool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from kube_apiserver import LEASES, FakeKubeApiServer

from policies.act.leader import ElectionConfig
from service.actuators.kube_client import kube_client
from service.actuators.leader import LeaseElector, LeaseName
from service.settings import Settings, load_settings

KUBERNETES = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
OVERLAYS = ("standalone-auto-toggle", "sidecar-auto-toggle")
NS = "llm-serving"
Doc = dict[str, Any]


def render_with_leases(overlay: str, workdir: Path) -> list[Doc]:
    """`overlay` plus the component, in a kustomization of its own (relative paths: kustomize refuses absolute)."""
    workdir.mkdir(parents=True, exist_ok=True)
    to = Path(os.path.relpath(KUBERNETES, workdir))
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": NS,
        "resources": [str(to / "overlays" / overlay)], "components": [str(to / "rbac-lease")],
    }), encoding="utf-8")
    result = subprocess.run([require_tool("kubectl"), "kustomize", str(workdir)], capture_output=True, text=True,
                            check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Doc]]:
    root = tmp_path_factory.mktemp("rbac-lease")
    return {overlay: render_with_leases(overlay, root / overlay) for overlay in OVERLAYS}


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def advisor(docs: list[Doc]) -> tuple[Doc, Doc]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "spec-advisor"]
    return deployment, container


def advisor_settings(docs: list[Doc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings as the container loads them: its --config file from the ConfigMap, then its env (a downward-API
    value as the kubelet fills it in)."""
    deployment, container = advisor(docs)
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    (mount,) = [m for m in container["volumeMounts"] if config_path.is_relative_to(m["mountPath"])]
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    key = str(config_path.relative_to(mount["mountPath"]))
    settings_file = tmp_path / key
    settings_file.write_text(config_map["data"][key], encoding="utf-8")
    for name in [k for k in os.environ if k.startswith("SPEC_ADVISOR_")]:
        monkeypatch.delenv(name)
    for variable in container.get("env", []):
        field = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        monkeypatch.setenv(variable["name"], "pod-0" if field == "metadata.name" else variable["value"])
    return load_settings(settings_file)


def test_the_role_grants_what_leader_election_uses_on_the_one_lease(renders: dict[str, list[Doc]]) -> None:
    for overlay, docs in renders.items():
        role = one(docs, "Role", "spec-advisor-leader-election")
        assert role["metadata"]["namespace"] == NS, overlay
        assert role["rules"] == [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["spec-advisor-actuation"], "verbs": ["get", "update"]},
        ], overlay
        binding = one(docs, "RoleBinding", "spec-advisor-leader-election")
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": "spec-advisor-leader-election"}
        account = one(docs, "ServiceAccount", "spec-advisor")  # the rbac component's, which the pod runs as
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                        "namespace": NS}], overlay
        deployment, _ = advisor(docs)
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "spec-advisor", overlay


def test_the_advisor_competes_for_the_lease_its_role_names(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for overlay, docs in renders.items():
        _, container = advisor(docs)
        env = {v["name"]: v for v in container["env"]}
        assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}
        workdir = tmp_path / overlay
        workdir.mkdir()
        actuation = advisor_settings(docs, workdir, monkeypatch).actuation
        assert actuation.leader_election.enabled, overlay
        named = one(docs, "Role", "spec-advisor-leader-election")["rules"][1]["resourceNames"]
        assert named == [actuation.leader_election.lease_name], overlay
        assert actuation.lease_namespace == NS, overlay  # where the Role grants


def test_kubernetes_validate_strict_passes(renders: dict[str, list[Doc]], tmp_path: Path) -> None:
    validator = require_tool("kubernetes-validate")
    for overlay, docs in renders.items():
        rendered = tmp_path / f"{overlay}.yaml"
        rendered.write_text(yaml.safe_dump_all(docs), encoding="utf-8")
        result = subprocess.run([validator, "--strict", str(rendered)], capture_output=True, text=True, check=False,
                                timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "passed for resource role/spec-advisor-leader-election" in result.stdout


def grants_from(docs: list[Doc], user: str) -> set[tuple[str, str, str, str]]:
    """The loopback API server's grants for `user` from the rendered Roles: a rule without resourceNames allows
    every name ("*")."""
    grants = set()
    for role in (d for d in docs if d["kind"] == "Role"):
        for rule in role["rules"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames", ["*"]):
                        grants.add((user, verb, resource, name))
    return grants


@pytest.fixture
def token_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "token"
    path.write_text("sa-token", encoding="utf-8")
    yield path


def test_the_rendered_rbac_is_enough_to_elect_and_hand_over(renders: dict[str, list[Doc]], token_file: Path) -> None:
    user = f"system:serviceaccount:{NS}:spec-advisor"
    grants = grants_from(renders["standalone-auto-toggle"], user)

    async def scenario(api: FakeKubeApiServer) -> None:
        async with kube_client(api_url=api.url, kubeconfig=None, token_file=token_file, namespace=NS,
                               timeout_s=5.0) as client:
            lease = LeaseName(NS, "spec-advisor-actuation")
            first, second = (
                LeaseElector(client, lease=lease, config=ElectionConfig(
                    identity=identity, lease_duration_s=30, renew_deadline_s=0.6, retry_period_s=0.2))
                for identity in ("pod-0_a", "pod-1_b")
            )
            assert await first.attempt() and first.last_error is None  # create
            assert not await second.attempt() and second.last_error is None  # get: held by pod-0_a
            assert await first.attempt()  # update: renew
            assert await first.release()  # update: release
            assert await second.attempt() and second.last_error is None  # get, update: take over
        assert api.get(LEASES, NS, "spec-advisor-actuation")["spec"]["holderIdentity"] == "pod-1_b"

    with FakeKubeApiServer(tokens={"sa-token": user}, grants=grants) as api:
        asyncio.run(scenario(api))
