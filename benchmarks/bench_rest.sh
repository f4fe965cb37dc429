#!/usr/bin/env bash
# REST latency under concurrent load, and the sidecar's RSS, while it scrapes the simulated server every second.
# Prints figures; asserts nothing.   bash benchmarks/bench_rest.sh [RATE_PER_S] [DURATION]
# Needs `hey` (Debian package `hey`: apt-get install -y hey).
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-1000}
DURATION=${2:-20s}
WORKERS=20
PORT=${PORT:-18080}
VENV=${SPEC_ADVISOR_VENV:-.venv}
command -v hey >/dev/null || { echo "hey is not installed (apt-get install -y hey)"; exit 2; }

"$VENV/bin/spec-advisor" demo --no-view --port "$PORT" --sim-port 0 --scrape-interval-s 1 >/tmp/bench-rest-sidecar.log 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null || { echo "sidecar did not become ready"; tail -20 /tmp/bench-rest-sidecar.log; exit 1; }

for path in /v1/recommendation /metrics; do
  echo "== GET $path at $RATE req/s for $DURATION ($WORKERS workers)"
  hey -z "$DURATION" -c "$WORKERS" -q $((RATE / WORKERS)) "http://127.0.0.1:$PORT$path" \
    | grep -E 'Requests/sec|Average|Slowest|(50|90|99)% in|\[2|\[4|\[5|Error' || true
done
RSS_KB=$(awk '/VmRSS/ {print $2}' "/proc/$PID/status")
HWM_KB=$(awk '/VmHWM/ {print $2}' "/proc/$PID/status")
echo "== sidecar+simulator process RSS: $((RSS_KB / 1024)) MiB (peak $((HWM_KB / 1024)) MiB)"
