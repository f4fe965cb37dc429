"""The one Kubernetes API client the actuators share, built from explicit settings (no global config, no cache)."""

from __future__ import annotations

from pathlib import Path

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User

FIELD_MANAGER = "spec-advisor"  # names our writes in the objects' managedFields


def kube_client(
    *, api_url: str | None, kubeconfig: Path | None, token_file: Path | None, namespace: str, timeout_s: float
) -> AsyncClient:
    """An async client for one namespace, from (first that applies):
    - `api_url`: that server, with the bearer token in `token_file` (re-read on every 401, as the kubelet rotates
      projected tokens) or no credentials;
    - `kubeconfig`: that file's current context;
    - else the pod's service account (in-cluster: KUBERNETES_SERVICE_HOST/PORT and the mounted token and CA).
    `timeout_s` bounds each request (connect and read). Raises `lightkube.ConfigError` when the configuration
    cannot be loaded (missing kubeconfig, not in a cluster), so a misconfigured actuator fails at start-up.
    """
    if api_url is not None:
        user = User(token_file=str(token_file)) if token_file is not None else User()  # User(): no credentials
        config = KubeConfig.from_one(cluster=Cluster(server=api_url), user=user, namespace=namespace)
    elif kubeconfig is not None:
        config = KubeConfig.from_file(kubeconfig)
    else:
        config = KubeConfig.from_service_account()
    return AsyncClient(
        config=config, namespace=namespace, timeout=httpx2.Timeout(timeout_s), field_manager=FIELD_MANAGER
    )
