#!/usr/bin/env bash
# REST latency under concurrent load, and the sidecar's RSS, while it scrapes the simulated server every second.
# Prints figures; asserts nothing.   bash benchmarks/bench_rest.sh [RATE_PER_S] [DURATION]
# The simulated vLLM server runs in its own process so the RSS is the sidecar's alone.
# Needs `hey` (Debian package `hey`: apt-get install -y hey).
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-1000}
DURATION=${2:-20s}
WORKERS=20
PORT=${PORT:-18321}
SIM_PORT=${SIM_PORT:-18000}
VENV=${SPEC_ADVISOR_VENV:-.venv}
command -v hey >/dev/null || { echo "hey is not installed (apt-get install -y hey)"; exit 2; }
WORK=$(mktemp -d)
cat >"$WORK/config.yaml" <<YAML
targets:
  - {name: sim, url: "http://127.0.0.1:$SIM_PORT", hardware: h100-sxm, model_profile: llama-3.1-8b, drafter: {method: eagle}}
scrape_interval_s: 1
scrape_timeout_s: 1
port: $PORT
gpu: {telemetry: none}
YAML

"$VENV/bin/spec-advisor" simulate --port "$SIM_PORT" >"$WORK/sim.log" 2>&1 &
SIM=$!
"$VENV/bin/spec-advisor" serve --config "$WORK/config.yaml" >"$WORK/sidecar.log" 2>&1 &
PID=$!
trap 'kill $PID $SIM 2>/dev/null; wait $PID $SIM 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 1 150); do
  curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null || { echo "sidecar did not become ready"; tail -20 "$WORK/sidecar.log"; exit 1; }

for path in /v1/recommendation /v1/evidence /metrics; do
  echo "== GET $path at $RATE req/s for $DURATION ($WORKERS workers)"
  hey -z "$DURATION" -c "$WORKERS" -q $((RATE / WORKERS)) "http://127.0.0.1:$PORT$path" \
    | grep -E 'Requests/sec|Average|Slowest|(50|90|99)% in|^ *\[[0-9]{3}\]|Error' || true
done
ITER=$(curl -fsS "http://127.0.0.1:$PORT/metrics" | awk '/^specadvisor_loop_iterations_total/ {print $2}')
echo "== loop iterations finished meanwhile: $ITER"
echo "== sidecar RSS: $(( $(awk '/VmRSS/ {print $2}' "/proc/$PID/status") / 1024 )) MiB" \
     "(peak $(( $(awk '/VmHWM/ {print $2}' "/proc/$PID/status") / 1024 )) MiB)"
