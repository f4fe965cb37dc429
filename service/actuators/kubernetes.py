"""Modes `kubernetes` (a fixed number of draft tokens) and `schedule` (vLLM Dynamic SD per-batch bands): edit the
vLLM container's `--speculative-config` in a Deployment's pod template, which rolls the pods out.

The write is a strategic merge patch that names the container (merged by name: the other containers and every
other field stay as they are) and carries `metadata.resourceVersion`: the API server answers 409 if anything wrote
the Deployment since we read it, so a concurrent change is never overwritten. Turning speculation off stores the
config it removes in the annotation `spec-advisor.io/speculative-config` in the same patch, so turning it back on
restores the operator's config (drafter model, method, ...) even after the advisor restarts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.apps_v1 import Deployment
from lightkube.types import PatchType

from policies.act.deployment import ActuatorError, ApplyResult, DeploymentObservation, SpeculationSetting
from service.actuators.guarded_patch import GuardedWrite, PatchRefusedError, guarded_apply
from service.actuators.kube_errors import (
    error_for_exception,
    failed_observation,
)
from service.actuators.vllm_args import (
    ArgsError,
    config_for,
    read_vllm_command,
    select_vllm_container,
    setting_from_config,
    with_speculative_config,
)

ANNOTATION = "spec-advisor.io/speculative-config"
PATCH_TYPE = PatchType.STRATEGIC


def rollout_status(deployment: Mapping[str, Any]) -> tuple[bool, str]:
    """(in progress, why) the way `kubectl rollout status` judges a Deployment: the controller has not observed the
    latest generation; fewer updated, ready or available replicas than wanted; old replicas still terminating; or a
    Progressing condition other than NewReplicaSetAvailable (a rollout under way, paused, or past its deadline).

    Example: generation 4, status.observedGeneration 3 -> (True, "... has not observed generation 4 yet ...").
    """
    metadata = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    generation = int(metadata.get("generation") or 0)
    observed = int(status.get("observedGeneration") or 0)
    if observed < generation:
        return True, f"the controller has not observed generation {generation} yet (observed {observed})"
    wanted = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
    counts = {name: int(status.get(f"{name}Replicas") or 0) for name in ("updated", "ready", "available")}
    for name, count in counts.items():
        if count < wanted:
            return True, f"{count} of {wanted} replicas {name}"
    total = int(status.get("replicas") or 0)
    if total > counts["updated"]:
        return True, f"{total - counts['updated']} old replicas are pending termination"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("reason") != "NewReplicaSetAvailable":
            return True, f"Progressing is {condition.get('reason')}: {condition.get('message', '')}".rstrip(": ")
    return False, ""


class DeploymentActuator:
    """Reads and patches the vLLM container of one Deployment. Never raises: failures are reasons (see base.py)."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        namespace: str,
        deployment: str,
        container: str | None,
        schedule_mode: bool,
        speculative_config: Mapping[str, object] | None,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._deployment = deployment
        self._container = container
        self._schedule_mode = schedule_mode
        self._template = dict(speculative_config) if speculative_config is not None else None

    @property
    def mode(self) -> str:
        return "schedule" if self._schedule_mode else "kubernetes"

    @property
    def target_ref(self) -> str:
        return f"deployment/{self._namespace}/{self._deployment}"

    async def _read(self) -> dict[str, Any]:
        deployment = await self._client.get(Deployment, self._deployment, namespace=self._namespace)
        return deployment.to_dict()

    async def observe(self, now_s: float) -> DeploymentObservation:
        try:
            deployment = await self._read()
        except Exception as exc:  # every failure of the call is a reason, never an exception to the runner
            return failed_observation(now_s, *error_for_exception(exc, target=self.target_ref))
        version = (deployment.get("metadata") or {}).get("resourceVersion")
        in_progress, why = rollout_status(deployment)
        try:
            container = select_vllm_container(_containers(deployment), self._container)
            command = read_vllm_command(container.get("command") or [], container.get("args") or [],
                                        _literal_env(container))
            setting = setting_from_config(command.speculative_config)
        except ArgsError as exc:
            return DeploymentObservation(
                at_s=now_s, setting=None, rollout_in_progress=in_progress, resource_version=version,
                error=exc.reason, detail=f"{self.target_ref}: {exc.detail}",
            )
        return DeploymentObservation(
            at_s=now_s, setting=setting, rollout_in_progress=in_progress, resource_version=version, detail=why,
            engine=command.engine,
        )

    def patch_for(self, deployment: Mapping[str, Any], desired: SpeculationSetting) -> dict[str, Any] | None:
        """The strategic merge patch that makes `deployment` run `desired`, guarded by its resourceVersion; None
        when it already does. Raises ArgsError when the container or its args cannot be edited safely."""
        container = select_vllm_container(_containers(deployment), self._container)
        command = list(container.get("command") or [])
        args = list(container.get("args") or [])
        current = read_vllm_command(command, args).speculative_config
        metadata = deployment.get("metadata") or {}
        on = desired.enabled if self._schedule_mode else desired.num_speculative_tokens > 0
        if on:
            base = current or _remembered(metadata) or self._template
            if base is None:
                raise ArgsError(
                    ActuatorError.NO_SPECULATIVE_CONFIG,
                    "speculation is off and no speculative config is known: none was removed by the advisor (no "
                    f"{ANNOTATION} annotation) and none is configured for the actuator",
                )
            wanted: dict[str, Any] | None = config_for(base, desired, schedule=self._schedule_mode)
        else:
            wanted = None
        if wanted == current:
            return None
        new_command, new_args = with_speculative_config(command, args, wanted)
        changed: dict[str, Any] = {"name": container["name"]}
        if new_command != command:
            changed["command"] = new_command
        if new_args != args:
            changed["args"] = new_args
        patch_metadata: dict[str, Any] = {"resourceVersion": metadata.get("resourceVersion")}
        if wanted is None and current is not None:
            patch_metadata["annotations"] = {ANNOTATION: json.dumps(current)}
        return {"metadata": patch_metadata, "spec": {"template": {"spec": {"containers": [changed]}}}}

    async def apply(
        self, desired: SpeculationSetting, observed: DeploymentObservation, *, dry_run: bool
    ) -> ApplyResult:
        def patch_for(deployment: dict[str, Any]) -> dict[str, Any] | None:
            try:
                return self.patch_for(deployment, desired)
            except ArgsError as exc:
                raise PatchRefusedError(exc.reason, f"{self.target_ref}: {exc.detail}") from exc

        async def send(patch: dict[str, Any]) -> str | None:
            result = await self._client.patch(
                Deployment, self._deployment, patch, namespace=self._namespace, patch_type=PATCH_TYPE
            )
            return result.metadata.resourceVersion if result.metadata is not None else None

        write = GuardedWrite(
            target_ref=self.target_ref, read=self._read, patch_for=patch_for, send=send, patch_type=PATCH_TYPE.value,
            unchanged=f"{self.target_ref} already runs the desired setting; nothing to send",
        )
        return await guarded_apply(write, observed, dry_run=dry_run)

def _literal_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's env variables whose (last) entry has a literal `value`, which Kubernetes substitutes for
    `$(NAME)` in the command and args. One set by `valueFrom` (a ConfigMap, a Secret, a field) is not known here,
    nor is a value that refers to another variable: both are left out, so a reference to them stays unread."""
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        value = entry.get("value")
        if value is not None and "$(" not in str(value):
            env[entry["name"]] = str(value)
        else:
            env.pop(entry["name"], None)  # the last entry wins, in the kubelet too
    return env


def _containers(deployment: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = (((deployment.get("spec") or {}).get("template") or {}).get("spec")) or {}
    containers = spec.get("containers") or []
    return [c for c in containers if isinstance(c, dict)]


def _remembered(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    text = (metadata.get("annotations") or {}).get(ANNOTATION)
    if text is None:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArgsError(
            ActuatorError.MALFORMED_ARGS, f"the {ANNOTATION} annotation is not valid JSON ({exc}); fix or delete it"
        ) from exc
    if not isinstance(config, dict):
        raise ArgsError(ActuatorError.MALFORMED_ARGS, f"the {ANNOTATION} annotation is not a JSON object")
    return config
