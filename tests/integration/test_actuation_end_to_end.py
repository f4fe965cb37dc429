"""The whole auto-toggle path with nothing faked but the Kubernetes API server: the sidecar scrapes a vLLM-format
/metrics over real HTTP, advises, and its runner patches a Deployment through lightkube on the loopback
kube-apiserver (real HTTP, bearer token, RBAC, resourceVersion); the audit log on disk and /v1/actions show it, a
rollout in progress holds further actions back, and pause (with the bearer token) stops acting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from kube_apiserver import DEPLOYMENTS, FakeKubeApiServer, patches
from prometheus_client.parser import text_string_to_metric_families
from sidecar_http import FIXTURES, CaptureServer, serving, wait_for

from service.app import build_sidecar
from service.settings import Settings, load_settings
from service.sources.gpu import NoGpuSource

NS = "llm-serving"
NAME = "vllm-llama-8b"
USER = "system:serviceaccount:llm-serving:spec-advisor"
KUBE_TOKEN = "kube-sa-token"
WRITE_TOKEN = "write-endpoints-token"
# An implausible k, so whatever the advisor recommends from the eagle k=3 capture, the runner has a change to make.
DEPLOYED = {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 7}
OTHER_ARGS = ["--port", "8000", "--max-num-seqs", "256", "--gpu-memory-utilization", "0.92"]


def vllm_deployment() -> dict[str, Any]:
    args = ["meta-llama/Llama-3.1-8B-Instruct", *OTHER_ARGS, "--speculative-config", json.dumps(DEPLOYED)]
    return {
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "vllm"}},
            "template": {
                "metadata": {"labels": {"app": "vllm"}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                                         "command": ["vllm", "serve"], "args": args}]},
            },
        },
    }


def speculative_config(deployment: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
    """(the args other than the speculative config, the parsed config or None when absent)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    if "--speculative-config" not in args:
        return args, None
    i = args.index("--speculative-config")
    config: dict[str, Any] = json.loads(args[i + 1])
    return args[:i] + args[i + 2:], config


def advisor_settings(
    capture_url: str, api_url: str, token_file: Path, state: Path, *, target: dict[str, Any] | None = None,
    **actuation: Any,
) -> Settings:
    """A fast-ticking sidecar on the capture, acting in mode kubernetes on NAME through the loopback API server;
    `target` adds to the target's settings."""
    return load_settings(overrides={
        "targets": [{"name": "llama", "url": capture_url, "hardware": "h100-sxm", "drafter": {"method": "eagle"},
                     **(target or {})}],
        "scrape_interval_s": 0.1,
        "scrape_timeout_s": 0.1,
        "estimator": {"window_s": 0.4, "stale_after_s": 1.0},
        "decide": {"dwell_s": 0},
        "gpu": {"telemetry": "none"},
        "actuation": {
            "mode": "kubernetes", "dry_run": False, "gate": {"dwell_s": 0.3, "cooldown_s": 0},
            "state_dir": str(state), "kubernetes": {"api_url": api_url, "token_file": str(token_file), "namespace": NS},
            "targets": [{"target": "llama", "deployment": NAME}], **actuation,
        },
    })


DEPLOYMENT_GRANTS = {(USER, verb, "deployments", NAME) for verb in ("get", "patch")}


@contextlib.asynccontextmanager
async def acting_sidecar(api: FakeKubeApiServer, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The sidecar on the eagle k=3 capture, acting on NAME through `api` (audit log under tmp_path/state), and a
    client on its API."""
    token_file = tmp_path / "sa-token"
    token_file.write_text(KUBE_TOKEN, encoding="utf-8")
    async with serving(CaptureServer(FIXTURES / "synthetic-eagle-k3.txt")) as capture_url:
        settings = advisor_settings(capture_url, api.url, token_file, tmp_path / "state")
        sidecar = build_sidecar(settings, gpu_source=NoGpuSource(), environ={"SPEC_ADVISOR_ACTIONS_TOKEN": WRITE_TOKEN})
        async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
            yield client


def test_the_sidecar_patches_the_deployment_through_the_gate_and_records_it(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def scenario(api: FakeKubeApiServer) -> None:
        async with acting_sidecar(api, tmp_path) as client:
            body = (await wait_for(client, "/v1/actions",
                                   lambda r: r.json()["targets"][0]["actions"].get("applied") == 1)).json()
            (action,) = [r for r in body["records"] if r["kind"] == "action"]
            assert action["result"] == "applied" and action["observed"]["num_speculative_tokens"] == 7

            # What the API server now holds is what the audit record says was wanted, and nothing else moved.
            others, config = speculative_config(api.get(DEPLOYMENTS, NS, NAME))
            assert others == ["meta-llama/Llama-3.1-8B-Instruct", *OTHER_ARGS]
            wanted = action["desired"]["num_speculative_tokens"]
            if wanted == 0:
                assert config is None
            else:
                assert config == {**DEPLOYED, "num_speculative_tokens": wanted}
            (patch,) = list(patches(api.requests))
            # Authenticated as the ServiceAccount the RBAC names, as a strategic merge patch of the Deployment.
            assert patch.user == USER and patch.path == f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}"
            assert patch.content_type == "application/strategic-merge-patch+json"

            # The rollout has not finished (the fake's status lags until told): nothing more is sent.
            await wait_for(client, "/v1/actions", lambda r: any(
                rec.get("skip") == "rollout_in_progress" or rec.get("reason") == "rollout_in_progress"
                for rec in r.json()["records"]))
            assert len(list(patches(api.requests))) == 1

            # Pausing needs the write token; once paused, the runner says so for every later tick.
            pause = {"target": "llama", "reason": "maintenance window"}
            denied = await client.post("/v1/actions/pause", json=pause)
            assert denied.status_code == 401
            paused = await client.post("/v1/actions/pause", json=pause,
                                       headers={"Authorization": f"Bearer {WRITE_TOKEN}"})
            assert paused.status_code == 200
            api.finish_rollout(NS, NAME)
            await wait_for(client, "/v1/actions", lambda r: r.json()["targets"][0]["paused"] is True)
            await asyncio.sleep(0.5)  # several ticks after the rollout finished, while paused
            assert len(list(patches(api.requests))) == 1

        # Every record is on disk as one JSON line; the applied action is among them.
        lines = (state / "actions.jsonl").read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines]
        assert [r["result"] for r in records if r["kind"] == "action"] == ["applied"]

    with FakeKubeApiServer(tokens={KUBE_TOKEN: USER}, grants=DEPLOYMENT_GRANTS) as api:
        api.put(DEPLOYMENTS, vllm_deployment())
        api.finish_rollout(NS, NAME)  # a settled Deployment: its status caught up with its spec
        asyncio.run(scenario(api))


def test_a_forbidden_patch_is_recorded_counted_and_the_advice_keeps_flowing(tmp_path: Path) -> None:
    # RBAC that forgot `patch`: the advisor can read the Deployment but not change it.
    token_file = tmp_path / "sa-token"
    token_file.write_text(KUBE_TOKEN, encoding="utf-8")
    state = tmp_path / "state"
    grants = {(USER, "get", "deployments", NAME)}

    async def scenario(api: FakeKubeApiServer) -> None:
        capture = CaptureServer(FIXTURES / "synthetic-eagle-k3.txt")
        async with serving(capture) as capture_url:
            settings = advisor_settings(capture_url, api.url, token_file, state, api={"write_endpoints": False})
            sidecar = build_sidecar(settings, gpu_source=NoGpuSource())
            async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                body = (await wait_for(client, "/v1/actions",
                                       lambda r: r.json()["targets"][0]["actions"].get("failed", 0) >= 1)).json()
                (failed, *_) = [r for r in body["records"] if r["kind"] == "action"]
                assert failed["result"] == "failed" and failed["error"] == "forbidden"
                assert failed["patch"] is not None  # what it tried to send is on record
                metrics = (await client.get("/metrics")).text
                assert 'specadvisor_actuator_errors_total{reason="forbidden",target="llama"}' in metrics
                recommendation = await client.get("/v1/recommendation")
                assert recommendation.status_code == 200
                assert recommendation.json()["targets"][0]["state"] == "ok"

        # Nothing changed on the server: the only write was refused whole.
        _, config = speculative_config(api.get(DEPLOYMENTS, NS, NAME))
        assert config == DEPLOYED

    with FakeKubeApiServer(tokens={KUBE_TOKEN: USER}, grants=grants) as api:
        api.put(DEPLOYMENTS, vllm_deployment())
        api.finish_rollout(NS, NAME)
        asyncio.run(scenario(api))


def test_a_deployment_running_another_engine_than_priced_is_never_patched(tmp_path: Path) -> None:
    """The Deployment runs vLLM at tensor parallelism 2 while the target is priced at the default 1: the runner
    holds every change back and names the setting to fix; the advice keeps flowing."""
    deployment = vllm_deployment()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container["args"] = [*container["args"], "--tensor-parallel-size", "2"]

    async def scenario(api: FakeKubeApiServer) -> None:
        async with acting_sidecar(api, tmp_path) as client:
            body = (await wait_for(client, "/v1/actions", lambda r: any(
                rec.get("reason") == "engine_mismatch" for rec in r.json()["records"]))).json()
            (skip, *_) = [r for r in body["records"] if r.get("reason") == "engine_mismatch"]
            assert "--tensor-parallel-size 2" in skip["detail"] and "tensor_parallel to 2" in skip["detail"]
            # Ten skips at 0.1 s ticks: well past the gate's 0.3 s dwell, where an agreeing engine is patched.
            await wait_for(client, "/metrics", lambda r: _skips(r.text, "engine_mismatch") >= 10)
            assert list(patches(api.requests)) == []
            recommendation = (await client.get("/v1/recommendation")).json()
            assert recommendation["targets"][0]["state"] == "ok"

    with FakeKubeApiServer(tokens={KUBE_TOKEN: USER}, grants=DEPLOYMENT_GRANTS) as api:
        api.put(DEPLOYMENTS, deployment)
        api.finish_rollout(NS, NAME)
        asyncio.run(scenario(api))


def _skips(page: str, reason: str) -> float:
    """specadvisor_actions_skipped_total for `reason` on a /metrics page (0 when absent)."""
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "specadvisor_actions_skipped_total" and sample.labels.get("reason") == reason:
                return sample.value
    return 0.0
