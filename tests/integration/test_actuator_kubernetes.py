"""DeploymentActuator (modes kubernetes and schedule) against the loopback kube-apiserver, through lightkube over
real HTTP: on/off/gamma/schedule, rollout detection, dry run, and every failure as a reason with nothing changed."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kube_apiserver import DEPLOYMENTS, FakeKubeApiServer, patches

from policies.act.deployment import ActuatorError, DeploymentObservation, EngineFlags, SpeculationSetting
from service.actuators.base import Actuator
from service.actuators.kube_client import kube_client
from service.actuators.kubernetes import ANNOTATION, DeploymentActuator

NS = "llm"
NAME = "vllm-llama-8b"
USER = "system:serviceaccount:llm:spec-advisor"
TOKEN = "advisor-token"
SPEC: dict[str, Any] = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}
OTHER = ["--port", "8000", "--max-num-seqs", "256"]
ADVISOR = {
    "name": "spec-advisor", "image": "spec-advisor:1", "args": ["--config", "/etc/spec-advisor/config.yaml"],
    "ports": [{"name": "http", "containerPort": 8321}], "env": [{"name": "SPEC_ADVISOR_LOG", "value": "info"}],
}
T = TypeVar("T")


def deployment(args: list[str], *, command: list[str] | None = None, replicas: int = 2) -> dict[str, Any]:
    vllm: dict[str, Any] = {
        "name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "args": args,
        "env": [{"name": "HF_HOME", "value": "/models"}], "ports": [{"name": "http", "containerPort": 8000}],
    }
    if command is not None:
        vllm["command"] = command
    return {
        "metadata": {"name": NAME, "namespace": NS, "labels": {"app": "vllm"}},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"app": "vllm"}},
            "template": {"metadata": {"labels": {"app": "vllm"}}, "spec": {"containers": [vllm, ADVISOR]}},
        },
    }


@pytest.fixture
def api() -> Iterator[FakeKubeApiServer]:
    grants = {(USER, verb, "deployments", NAME) for verb in ("get", "patch")}
    with FakeKubeApiServer(tokens={TOKEN: USER}, grants=grants) as server:
        yield server


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n", encoding="utf-8")
    return path


def seed(api: FakeKubeApiServer, args: list[str], **kwargs: Any) -> None:
    api.put(DEPLOYMENTS, deployment(args, **kwargs))
    api.finish_rollout(NS, NAME)


def run(
    api_url: str, token_file: Path | None, body: Callable[[DeploymentActuator], Awaitable[T]], *,
    schedule_mode: bool = False, template: dict[str, Any] | None = None, container: str | None = None,
) -> T:
    async def scenario() -> T:
        async with kube_client(
            api_url=api_url, kubeconfig=None, token_file=token_file, namespace=NS, timeout_s=5.0
        ) as client:
            actuator = DeploymentActuator(
                client, namespace=NS, deployment=NAME, container=container, schedule_mode=schedule_mode,
                speculative_config=template,
            )
            return await body(actuator)

    return asyncio.run(scenario())


def vllm_container(api: FakeKubeApiServer) -> dict[str, Any]:
    containers = api.get(DEPLOYMENTS, NS, NAME)["spec"]["template"]["spec"]["containers"]
    (found,) = [c for c in containers if c["name"] == "vllm"]
    return dict(found)


def spec_json(args: list[str]) -> dict[str, Any] | None:
    if "--speculative-config" not in args:
        return None
    loaded: dict[str, Any] = json.loads(args[args.index("--speculative-config") + 1])
    return loaded


# ----------------------------------------------------------------------------------------------------------------
# Happy paths
# ----------------------------------------------------------------------------------------------------------------


def test_it_is_an_actuator_named_for_its_target(api: FakeKubeApiServer, token_file: Path) -> None:
    async def body(actuator: DeploymentActuator) -> None:
        typed: Actuator = actuator
        assert (typed.mode, typed.target_ref) == ("kubernetes", f"deployment/{NS}/{NAME}")

    run(api.url, token_file, body)


def test_off_then_on_restores_the_config_and_touches_nothing_else(api: FakeKubeApiServer, token_file: Path) -> None:
    seed(api, ["meta-llama/Llama-3.1-8B-Instruct", *OTHER, "--speculative-config", json.dumps(SPEC)])
    before = api.get(DEPLOYMENTS, NS, NAME)

    async def turn_off(actuator: DeploymentActuator) -> DeploymentObservation:
        observed = await actuator.observe(1000.0)
        assert observed.error is None and observed.setting == SpeculationSetting(3)
        assert not observed.rollout_in_progress
        result = await actuator.apply(SpeculationSetting(0), observed, dry_run=False)
        assert result.applied and result.error is None
        assert result.patch_type == "application/strategic-merge-patch+json"
        after = await actuator.observe(1001.0)
        assert after.resource_version == result.resource_version != observed.resource_version
        return after

    after_off = run(api.url, token_file, turn_off)
    assert after_off.setting == SpeculationSetting(0)
    assert after_off.rollout_in_progress  # a new pod template: the controller has a rollout to do
    stored = api.get(DEPLOYMENTS, NS, NAME)
    assert stored["metadata"]["generation"] == before["metadata"]["generation"] + 1
    assert vllm_container(api)["args"] == ["meta-llama/Llama-3.1-8B-Instruct", *OTHER]
    assert json.loads(stored["metadata"]["annotations"][ANNOTATION]) == SPEC
    # The other container, and the vLLM container's other fields, are exactly as they were.
    assert stored["spec"]["template"]["spec"]["containers"][1] == before["spec"]["template"]["spec"]["containers"][1]
    assert {k: v for k, v in vllm_container(api).items() if k != "args"} == {
        k: v for k, v in before["spec"]["template"]["spec"]["containers"][0].items() if k != "args"
    }

    api.finish_rollout(NS, NAME)

    async def turn_on(actuator: DeploymentActuator) -> DeploymentObservation:
        observed = await actuator.observe(2000.0)
        assert not observed.rollout_in_progress
        result = await actuator.apply(SpeculationSetting(3), observed, dry_run=False)
        assert result.applied, result.detail
        return await actuator.observe(2001.0)

    # No template configured: turning on works from the annotation the advisor wrote when it turned off.
    assert run(api.url, token_file, turn_on).setting == SpeculationSetting(3)
    args = vllm_container(api)["args"]
    assert spec_json(args) == SPEC
    assert args[:5] == ["meta-llama/Llama-3.1-8B-Instruct", *OTHER]


def test_the_engine_flags_are_read_with_the_container_s_env(api: FakeKubeApiServer, token_file: Path) -> None:
    args = ["m", "-tp", "$(TP)", "--max-num-seqs", "$(SEQS)", "--pipeline-parallel-size=$(PP)", *OTHER[:2]]
    manifest = deployment(args)
    (vllm, _) = manifest["spec"]["template"]["spec"]["containers"]
    vllm["env"] = [
        {"name": "TP", "value": "4"},
        {"name": "SEQS", "value": "64"}, {"name": "SEQS", "value": "128"},  # the kubelet takes the last
        {"name": "PP", "value": "2"}, {"name": "PP", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "pp"}}},
    ]
    api.put(DEPLOYMENTS, manifest)
    api.finish_rollout(NS, NAME)

    async def body(actuator: DeploymentActuator) -> DeploymentObservation:
        return await actuator.observe(1.0)

    engine = run(api.url, token_file, body).engine
    assert engine == EngineFlags(tensor_parallel_size=4, max_num_seqs=128,
                                 unreadable=(("pipeline_parallel_size", "$(PP)"),))


def test_gamma_change_edits_only_num_speculative_tokens(api: FakeKubeApiServer, token_file: Path) -> None:
    seed(api, ["m", f"--speculative-config={json.dumps(SPEC)}", *OTHER])

    async def body(actuator: DeploymentActuator) -> DeploymentObservation:
        result = await actuator.apply(SpeculationSetting(5), await actuator.observe(1.0), dry_run=False)
        assert result.applied, result.detail
        return await actuator.observe(2.0)

    assert run(api.url, token_file, body).setting == SpeculationSetting(5)
    k5 = json.dumps({**SPEC, "num_speculative_tokens": 5})
    assert vllm_container(api)["args"] == ["m", f"--speculative-config={k5}", *OTHER]


def test_turning_on_from_the_configured_template(api: FakeKubeApiServer, token_file: Path) -> None:
    seed(api, ["m", *OTHER])

    async def body(actuator: DeploymentActuator) -> DeploymentObservation:
        result = await actuator.apply(SpeculationSetting(2), await actuator.observe(1.0), dry_run=False)
        assert result.applied, result.detail
        return await actuator.observe(2.0)

    assert run(api.url, token_file, body, template=SPEC).setting == SpeculationSetting(2)
    assert spec_json(vllm_container(api)["args"]) == {**SPEC, "num_speculative_tokens": 2}


def test_turning_on_with_no_known_config_is_refused(api: FakeKubeApiServer, token_file: Path) -> None:
    seed(api, ["m", *OTHER])
    version = api.get(DEPLOYMENTS, NS, NAME)["metadata"]["resourceVersion"]

    async def body(actuator: DeploymentActuator) -> None:
        result = await actuator.apply(SpeculationSetting(2), await actuator.observe(1.0), dry_run=False)
        assert (result.applied, result.error) == (False, ActuatorError.NO_SPECULATIVE_CONFIG)
        assert ANNOTATION in result.detail

    run(api.url, token_file, body)
    assert api.get(DEPLOYMENTS, NS, NAME)["metadata"]["resourceVersion"] == version


def test_schedule_mode_writes_dynamic_sd_bands(api: FakeKubeApiServer, token_file: Path) -> None:
    seed(api, ["m", "--speculative-config", json.dumps(SPEC), *OTHER])
    desired = SpeculationSetting(4, schedule=((48, 4), (160, 2), (256, 0)))

    async def body(actuator: DeploymentActuator) -> DeploymentObservation:
        assert actuator.mode == "schedule"
        result = await actuator.apply(desired, await actuator.observe(1.0), dry_run=False)
        assert result.applied, result.detail
        return await actuator.observe(2.0)

    assert run(api.url, token_file, body, schedule_mode=True).setting == desired
    # Bands from batch 1, contiguous: 1-48 -> 4, 49-160 -> 2, 161-256 -> 0; num_speculative_tokens is the max, 4.
    assert spec_json(vllm_container(api)["args"]) == {
        **SPEC, "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 48, 4], [49, 160, 2],
                                                                                      [161, 256, 0]],
    }


def test_a_shell_command_is_edited_in_place(api: FakeKubeApiServer, token_file: Path) -> None:
    script = f"exec vllm serve m --port 8000 --speculative-config '{json.dumps(SPEC)}' --max-num-seqs 256"
    seed(api, [], command=["/bin/sh", "-c", script])

    async def body(actuator: DeploymentActuator) -> None:
        result = await actuator.apply(SpeculationSetting(0), await actuator.observe(1.0), dry_run=False)
        assert result.applied, result.detail

    run(api.url, token_file, body)
    assert vllm_container(api)["command"] == ["/bin/sh", "-c", "exec vllm serve m --port 8000 --max-num-seqs 256"]


def test_already_running_the_setting_sends_nothing(api: FakeKubeApiServer, token_file: Path) -> None:
    seed(api, ["m", "--speculative-config", json.dumps(SPEC)])

    async def body(actuator: DeploymentActuator) -> None:
        result = await actuator.apply(SpeculationSetting(3), await actuator.observe(1.0), dry_run=False)
        assert (result.applied, result.error, result.patch) == (False, None, None)

    run(api.url, token_file, body)
    assert not list(patches(api.requests))


# ----------------------------------------------------------------------------------------------------------------
# Rollout status
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "in_progress"),
    [
        ({}, False),
        ({"observedGeneration": 1, "updatedReplicas": 1}, True),  # 1 of 2 updated
        ({"observedGeneration": 1, "readyReplicas": 1}, True),
        ({"observedGeneration": 1, "availableReplicas": 1}, True),
        ({"observedGeneration": 1, "replicas": 3}, True),  # an old replica still terminating
        ({"observedGeneration": 1, "conditions": [{"type": "Progressing", "status": "True",
                                                   "reason": "ReplicaSetUpdated"}]}, True),
        ({"observedGeneration": 1, "conditions": [{"type": "Progressing", "status": "False",
                                                   "reason": "ProgressDeadlineExceeded"}]}, True),
        ({"observedGeneration": 0}, True),  # generation 1 not observed yet
    ],
)
def test_rollout_in_progress_like_kubectl_rollout_status(
    api: FakeKubeApiServer, token_file: Path, status: dict[str, Any], in_progress: bool
) -> None:
    seed(api, ["m"])

    def set_status(obj: dict[str, Any]) -> None:
        obj["status"].update(status)
        if status.get("conditions"):
            obj["status"]["conditions"] = status["conditions"]

    api.mutate(DEPLOYMENTS, NS, NAME, set_status)

    async def body(actuator: DeploymentActuator) -> DeploymentObservation:
        return await actuator.observe(1.0)

    observed = run(api.url, token_file, body)
    assert observed.error is None
    assert observed.rollout_in_progress is in_progress
    assert bool(observed.detail) is in_progress


# ----------------------------------------------------------------------------------------------------------------
# Dry run and failures: a reason, nothing changed
# ----------------------------------------------------------------------------------------------------------------


def test_dry_run_returns_the_exact_patch_and_sends_nothing(api: FakeKubeApiServer, token_file: Path) -> None:
    seed(api, ["m", "--speculative-config", json.dumps(SPEC), *OTHER])
    before = api.get(DEPLOYMENTS, NS, NAME)

    async def body(actuator: DeploymentActuator) -> Any:
        observed = await actuator.observe(1.0)
        result = await actuator.apply(SpeculationSetting(0), observed, dry_run=True)
        assert (result.applied, result.dry_run, result.error) == (False, True, None)
        assert result.patch_type == "application/strategic-merge-patch+json"
        return result.patch

    patch = run(api.url, token_file, body)
    assert api.get(DEPLOYMENTS, NS, NAME) == before
    assert not list(patches(api.requests))
    assert patch == {
        "metadata": {"resourceVersion": before["metadata"]["resourceVersion"],
                     "annotations": {ANNOTATION: json.dumps(SPEC)}},
        "spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": ["m", *OTHER]}]}}},
    }


def test_a_writer_between_observe_and_apply_is_a_conflict(api: FakeKubeApiServer, token_file: Path) -> None:
    seed(api, ["m", "--speculative-config", json.dumps(SPEC)])

    async def body(actuator: DeploymentActuator) -> None:
        observed = await actuator.observe(1.0)
        api.mutate(DEPLOYMENTS, NS, NAME, lambda d: d["metadata"].setdefault("labels", {}).update(team="b"))
        result = await actuator.apply(SpeculationSetting(0), observed, dry_run=False)
        assert (result.applied, result.error) == (False, ActuatorError.CONFLICT)

    run(api.url, token_file, body)
    assert not list(patches(api.requests))
    assert spec_json(vllm_container(api)["args"]) == SPEC


def test_a_writer_racing_the_patch_gets_a_409_not_an_overwrite(api: FakeKubeApiServer, token_file: Path) -> None:
    seed(api, ["m", "--speculative-config", json.dumps(SPEC)])

    def other_writer() -> None:  # someone edits vLLM's args between our read and our write
        api.mutate(DEPLOYMENTS, NS, NAME, lambda d: d["spec"]["template"]["spec"]["containers"][0]["args"].append(
            "--enforce-eager"))

    async def body(actuator: DeploymentActuator) -> None:
        observed = await actuator.observe(1.0)
        api.before_patch = other_writer
        result = await actuator.apply(SpeculationSetting(0), observed, dry_run=False)
        assert (result.applied, result.error) == (False, ActuatorError.CONFLICT)
        assert result.patch is not None  # it was sent, and refused as a whole

    run(api.url, token_file, body)
    assert len(list(patches(api.requests))) == 1
    assert vllm_container(api)["args"] == ["m", "--speculative-config", json.dumps(SPEC), "--enforce-eager"]


def test_forbidden_patch_is_a_reason_and_nothing_changes(token_file: Path) -> None:
    grants = {(USER, "get", "deployments", NAME)}  # get only
    with FakeKubeApiServer(tokens={TOKEN: USER}, grants=grants) as api:
        seed(api, ["m", "--speculative-config", json.dumps(SPEC)])
        before = api.get(DEPLOYMENTS, NS, NAME)

        async def body(actuator: DeploymentActuator) -> None:
            result = await actuator.apply(SpeculationSetting(0), await actuator.observe(1.0), dry_run=False)
            assert (result.applied, result.error) == (False, ActuatorError.FORBIDDEN)
            assert "cannot patch" in result.detail

        run(api.url, token_file, body)
        assert api.get(DEPLOYMENTS, NS, NAME) == before


def test_observe_failures_are_reasons(api: FakeKubeApiServer, token_file: Path, tmp_path: Path) -> None:
    async def observe(actuator: DeploymentActuator) -> DeploymentObservation:
        return await actuator.observe(1.0)

    missing = run(api.url, token_file, observe)  # nothing seeded
    assert (missing.error, missing.setting) == (ActuatorError.NOT_FOUND, None)
    seed(api, ["m"])
    assert run(api.url, None, observe).error is ActuatorError.UNAUTHORIZED  # no token
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token", encoding="utf-8")
    assert run(api.url, wrong, observe).error is ActuatorError.UNAUTHORIZED
    assert run(api.url, tmp_path / "absent", observe).error is ActuatorError.UNAUTHORIZED  # token file missing
    assert run(api.url, token_file, observe, container="engine").error is ActuatorError.NO_VLLM_CONTAINER


def test_an_unreachable_api_server_is_a_reason() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has nobody listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def body(actuator: DeploymentActuator) -> None:
        observed = await actuator.observe(1.0)
        assert (observed.error, observed.setting) == (ActuatorError.UNREACHABLE, None)
        refused = await actuator.apply(SpeculationSetting(0), observed, dry_run=False)
        assert (refused.applied, refused.error) == (False, ActuatorError.UNREACHABLE)

    run(f"http://127.0.0.1:{port}", None, body)


def test_malformed_args_are_refused_without_a_patch(api: FakeKubeApiServer, token_file: Path) -> None:
    seed(api, ["m", "--speculative-config", "{'method': 'eagle3'}"])

    async def body(actuator: DeploymentActuator) -> None:
        observed = await actuator.observe(1.0)
        assert observed.error is ActuatorError.MALFORMED_ARGS and "not valid JSON" in observed.detail
        assert observed.resource_version is not None  # the object was read
        result = await actuator.apply(SpeculationSetting(0), observed, dry_run=False)
        assert result.error is ActuatorError.MALFORMED_ARGS

    run(api.url, token_file, body)
    assert not list(patches(api.requests))
