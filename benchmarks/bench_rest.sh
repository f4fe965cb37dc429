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

echo "== load before: $(uptime | sed 's/.*load average/load average/')"
# The sidecar's CPU time (user + system, in clock ticks) so far: CPU per request is a figure a busy box distorts
# far less than latency percentiles are.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
TICK_US=$(( 1000000 / $(getconf CLK_TCK) ))
for path in /v1/recommendation /v1/evidence /metrics; do
  echo "== GET $path at $RATE req/s for $DURATION ($WORKERS workers)"
  before=$(cpu_ticks)
  OUT=$(hey -z "$DURATION" -c "$WORKERS" -q $((RATE / WORKERS)) "http://127.0.0.1:$PORT$path")
  used_us=$(( ($(cpu_ticks) - before) * TICK_US ))
  grep -E 'Requests/sec|Average|Slowest|(50|90|99)% in|^ *\[[0-9]{3}\]|Error' <<<"$OUT" || true
  served=$(awk '/^ *\[200\]/ {print $2}' <<<"$OUT")
  [ -n "$served" ] && [ "$served" -gt 0 ] && echo "  sidecar CPU per request: $(( used_us / served )) us (loop included)"
done
PAGE=$(curl -fsS "http://127.0.0.1:$PORT/metrics")
echo "== loop iterations finished meanwhile: $(awk '/^specadvisor_loop_iterations_total/ {print $2}' <<<"$PAGE")"
# Steps without an await (estimate, advise, publish) block the event loop the API shares for their whole duration;
# scrape and gpu include awaited I/O, so their mean bounds the blocking part from above.
echo "== loop steps (mean; share finished within 5 ms):"
"$VENV/bin/python" -c '
import sys
from prometheus_client.parser import text_string_to_metric_families
steps = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    if family.name == "specadvisor_loop_step_duration_seconds":
        for s in family.samples:
            key = s.labels.get("le") or s.name.rsplit("_", 1)[1]
            steps.setdefault(s.labels["step"], {})[key] = s.value
for step, e in sorted(steps.items()):
    n, total, fast = e.get("count", 0.0), e.get("sum", 0.0), e.get("0.005", 0.0)
    if n:
        print(f"   {step:<9} n={n:<6.0f} mean {1e3 * total / n:7.3f} ms   <=5 ms {100 * fast / n:5.1f}%")
' <<<"$PAGE"
echo "== load after: $(uptime | sed 's/.*load average/load average/')"
echo "== sidecar RSS: $(( $(awk '/VmRSS/ {print $2}' "/proc/$PID/status") / 1024 )) MiB" \
     "(peak $(( $(awk '/VmHWM/ {print $2}' "/proc/$PID/status") / 1024 )) MiB)"
