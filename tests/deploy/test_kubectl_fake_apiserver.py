"""Real kubectl against the loopback kube-apiserver (tests/integration/kube_apiserver.py): `kubectl get -o json`
and `kubectl patch --type strategic|merge|json`, checked through the actuator's own observe. This proves the fake
speaks the real protocol (discovery, content types, Status errors), so the actuator tests against it mean something.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_tools import require_tool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from kube_apiserver import DEPLOYMENTS, FakeKubeApiServer

from policies.act.deployment import DeploymentObservation, SpeculationSetting
from service.actuators.kube_client import kube_client
from service.actuators.kubernetes import DeploymentActuator

NS = "llm"
NAME = "vllm-llama-8b"
SPEC: dict[str, Any] = {"method": "ngram", "prompt_lookup_max": 4, "num_speculative_tokens": 3}


@pytest.fixture
def api() -> Iterator[FakeKubeApiServer]:
    # No authentication: kubectl (client-go) does not send a bearer token to a plain-http server, and the fake speaks
    # plain http; the token path is covered by the actuator tests (lightkube sends it).
    with FakeKubeApiServer() as server:
        server.put(DEPLOYMENTS, {
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "vllm"}}, "template": {
                "metadata": {"labels": {"app": "vllm"}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                                         "args": ["m", "--speculative-config", json.dumps(SPEC), "--port", "8000"]}]},
            }},
        })
        server.finish_rollout(NS, NAME)
        yield server


@pytest.fixture
def kubeconfig(api: FakeKubeApiServer, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
        "users": [{"name": "admin", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "admin", "namespace": NS}}],
    }), encoding="utf-8")
    return path


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = require_tool("kubectl")
    return subprocess.run(
        [binary, f"--kubeconfig={kubeconfig}", f"--cache-dir={kubeconfig.parent / 'cache'}", *args],
        capture_output=True, text=True, check=False, timeout=60,
    )


def observe(kubeconfig: Path) -> DeploymentObservation:
    async def scenario() -> DeploymentObservation:
        async with kube_client(api_url=None, kubeconfig=kubeconfig, token_file=None, namespace=NS,
                               timeout_s=5.0) as client:
            actuator = DeploymentActuator(client, namespace=NS, deployment=NAME, container=None,
                                          schedule_mode=False, speculative_config=None)
            return await actuator.observe(1.0)

    return asyncio.run(scenario())


def args_of(deployment: dict[str, Any]) -> list[str]:
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_kubectl_get_sees_what_the_actuator_sees(api: FakeKubeApiServer, kubeconfig: Path) -> None:
    got = kubectl(kubeconfig, "get", "deployment", NAME, "-o", "json")
    assert got.returncode == 0, got.stderr
    deployment = json.loads(got.stdout)
    assert deployment == api.get(DEPLOYMENTS, NS, NAME)
    observed = observe(kubeconfig)
    assert observed.resource_version == deployment["metadata"]["resourceVersion"]
    assert observed.setting == SpeculationSetting(json.loads(args_of(deployment)[2])["num_speculative_tokens"])


def test_kubectl_patch_types_change_what_the_actuator_observes(api: FakeKubeApiServer, kubeconfig: Path) -> None:
    k2 = json.dumps({**SPEC, "num_speculative_tokens": 2})
    strategic = {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": [
        "m", "--speculative-config", k2, "--port", "8000"]}]}}}}
    done = kubectl(kubeconfig, "patch", "deployment", NAME, "--type", "strategic", "-p", json.dumps(strategic))
    assert done.returncode == 0, done.stderr
    assert observe(kubeconfig).setting == SpeculationSetting(2)
    assert observe(kubeconfig).rollout_in_progress  # new pod template, not rolled out yet

    api.finish_rollout(NS, NAME)
    k4 = json.dumps({**SPEC, "num_speculative_tokens": 4})
    json_ops = [{"op": "test", "path": "/spec/template/spec/containers/0/args/2", "value": k2},
                {"op": "replace", "path": "/spec/template/spec/containers/0/args/2", "value": k4}]
    done = kubectl(kubeconfig, "patch", "deployment", NAME, "--type", "json", "-p", json.dumps(json_ops))
    assert done.returncode == 0, done.stderr
    assert observe(kubeconfig).setting == SpeculationSetting(4)

    merge = {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                                                            "args": ["m", "--port", "8000"]}]}}}}
    done = kubectl(kubeconfig, "patch", "deployment", NAME, "--type", "merge", "-p", json.dumps(merge))
    assert done.returncode == 0, done.stderr
    assert observe(kubeconfig).setting == SpeculationSetting(0)


def test_kubectl_reports_the_fakes_errors_as_the_real_ones(api: FakeKubeApiServer, kubeconfig: Path) -> None:
    missing = kubectl(kubeconfig, "get", "deployment", "nope", "-o", "json")
    assert missing.returncode != 0
    assert 'deployments.apps "nope" not found' in missing.stderr
    stale = {"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 3}}
    conflict = kubectl(kubeconfig, "patch", "deployment", NAME, "--type", "merge", "-p", json.dumps(stale))
    assert conflict.returncode != 0
    assert "the object has been modified" in conflict.stderr
    failed_test = [{"op": "test", "path": "/spec/replicas", "value": 9}]
    invalid = kubectl(kubeconfig, "patch", "deployment", NAME, "--type", "json", "-p", json.dumps(failed_test))
    assert invalid.returncode != 0 and "testing value /spec/replicas failed" in invalid.stderr
    assert api.get(DEPLOYMENTS, NS, NAME)["spec"]["replicas"] == 1
