"""Modes `schedule` and `routing` through the whole sidecar, as `kubernetes` is in test_actuation_end_to_end: the
sidecar scrapes a vLLM-format /metrics over real HTTP, advises, and its runner writes through lightkube to the
loopback kube-apiserver (real HTTP, bearer token, RBAC): vLLM's per-batch schedule into the Deployment, or the
HTTPRoute's weights between a speculation-on and a speculation-off pool. The audit log and /v1/actions show it.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import httpx
from kube_apiserver import DEPLOYMENTS, HTTPROUTES, FakeKubeApiServer, patches
from sidecar_http import FIXTURES, CaptureServer, serving, wait_for
from test_actuation_end_to_end import (
    DEPLOYED,
    KUBE_TOKEN,
    NAME,
    NS,
    OTHER_ARGS,
    USER,
    advisor_settings,
    speculative_config,
    vllm_deployment,
)

from service.app import build_sidecar
from service.sources.gpu import NoGpuSource

ON, OFF = "vllm-spec-on", "vllm-spec-off"


def http_route(on_weight: int, off_weight: int) -> dict[str, Any]:
    def ref(name: str, weight: int) -> dict[str, Any]:
        return {"group": "", "kind": "Service", "name": name, "port": 8000, "weight": weight}

    return {
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "parentRefs": [{"name": "inference-gateway"}],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                       "backendRefs": [ref(ON, on_weight), ref(OFF, off_weight)]}],
        },
    }


def act_once(
    api: FakeKubeApiServer, tmp_path: Path, *, target: dict[str, Any] | None = None, **actuation: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the sidecar on the eagle k=3 capture, acting through `api` as `actuation` says (`target`: more target
    settings), until one action is applied; return (that action's audit record, the recommendation then)."""
    token_file = tmp_path / "sa-token"
    token_file.write_text(KUBE_TOKEN, encoding="utf-8")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        capture = CaptureServer(FIXTURES / "synthetic-eagle-k3.txt")
        async with serving(capture) as capture_url:
            settings = advisor_settings(capture_url, api.url, token_file, tmp_path / "state", target=target,
                                        api={"write_endpoints": False}, **actuation)
            sidecar = build_sidecar(settings, gpu_source=NoGpuSource())
            async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                body = (await wait_for(client, "/v1/actions",
                                       lambda r: r.json()["targets"][0]["actions"].get("applied") == 1)).json()
                actions: list[dict[str, Any]] = [r for r in body["records"] if r["kind"] == "action"]
                (action,) = actions
                assert action["result"] == "applied"
                recommendation: dict[str, Any] = (await client.get("/v1/recommendation")).json()["targets"][0]
                return action, recommendation

    return asyncio.run(scenario())


def test_schedule_mode_writes_vllms_per_batch_schedule_into_the_deployment(tmp_path: Path) -> None:
    grants = {(USER, verb, "deployments", NAME) for verb in ("get", "patch")}
    with FakeKubeApiServer(tokens={KUBE_TOKEN: USER}, grants=grants) as api:
        api.put(DEPLOYMENTS, vllm_deployment())
        api.finish_rollout(NS, NAME)
        action, _ = act_once(api, tmp_path, mode="schedule")
        assert action["mode"] == "schedule"
        others, config = speculative_config(api.get(DEPLOYMENTS, NS, NAME))
        assert others == ["meta-llama/Llama-3.1-8B-Instruct", *OTHER_ARGS]  # nothing else moved
        schedule = action["desired"]["schedule"]
        if config is None:  # no band drafts at all: speculation removed (a restart), as the docs say
            assert not any(band[2] > 0 for band in schedule or [])
        else:
            # The deployed drafter stays; the bands are what the audit record says was wanted ([upper batch, K]
            # there), written as vLLM's [start_bs, end_bs, K] (inclusive), covering 1..max_num_seqs contiguously.
            assert config["method"] == DEPLOYED["method"] and config["model"] == DEPLOYED["model"]
            bands = config["num_speculative_tokens_per_batch_size"]
            assert [[band[1], band[2]] for band in bands] == schedule
            assert bands[0][0] == 1 and bands[-1][1] == 256
            assert all(nxt[0] == prev[1] + 1 for prev, nxt in itertools.pairwise(bands))
            assert config["num_speculative_tokens"] == max(band[2] for band in bands)
        (patch,) = list(patches(api.requests))
        assert patch.content_type == "application/strategic-merge-patch+json"


def test_schedule_mode_covers_the_targets_own_max_num_seqs(tmp_path: Path) -> None:
    grants = {(USER, verb, "deployments", NAME) for verb in ("get", "patch")}
    deployment = vllm_deployment()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    args[args.index("--max-num-seqs") + 1] = "128"  # the engine the settings describe (else: engine_mismatch)
    with FakeKubeApiServer(tokens={KUBE_TOKEN: USER}, grants=grants) as api:
        api.put(DEPLOYMENTS, deployment)
        api.finish_rollout(NS, NAME)
        action, _ = act_once(api, tmp_path, mode="schedule", target={"max_num_seqs": 128})
        schedule = action["desired"]["schedule"]
        assert schedule, "the capture's schedule drafts at some batch"
        assert schedule[-1][0] == 128  # [upper batch, K]: the engine's own 128, not schedule.max_num_seqs 256


def test_routing_mode_moves_the_traffic_between_the_pools_on_the_httproute(tmp_path: Path) -> None:
    grants = {(USER, verb, "httproutes", NAME) for verb in ("get", "patch")}
    route_target = {"target": "llama", "route": NAME, "on_backend": ON, "off_backend": OFF, "on_pool_k": 3}
    with FakeKubeApiServer(tokens={KUBE_TOKEN: USER}, grants=grants) as api:
        api.put(HTTPROUTES, http_route(0, 100))
        action, recommendation = act_once(api, tmp_path, mode="routing", targets=[route_target])
        assert action["mode"] == "routing"
        # All traffic on the off pool at start; the capture's drafts pay (eagle k=3 at 14 running requests), so
        # the advice is on and all of it moves to the on pool.
        (rule,) = api.get(HTTPROUTES, NS, NAME)["spec"]["rules"]
        weights = {ref["name"]: ref["weight"] for ref in rule["backendRefs"]}
        assert recommendation["enabled"] is True
        assert weights == {ON: 100, OFF: 0}
        assert action["observed"]["num_speculative_tokens"] == 0 and action["desired"]["num_speculative_tokens"] == 3
        (patch,) = list(patches(api.requests))
        assert patch.path == f"/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/httproutes/{NAME}"
