"""The shipped alert rules in a real monitoring stack: Debian's Prometheus scrapes the sidecar (`spec-advisor serve`,
a subprocess) and the simulated vLLM server, evaluates deploy/prometheus/spec-advisor.rules.yaml, and Alertmanager
delivers SpecAdvisorSpeculationCostsThroughput to a webhook once the simulated load pushes n-gram speculation into
losing territory; during the light-load phase before that it must stay silent.

Time is compressed three ways, all on the test's side: the simulator runs TIME_SCALE x wall time; the rule copy
Prometheus loads has 1 s group intervals and every alert's `for:` divided by FOR_DIVISOR (15m -> 3s; expressions,
labels and annotations untouched, see monitoring_stack.render_rules); the sidecar scrapes every 0.5 s over a 3 s
window with a 1 s dwell. Once the light phase has been observed the test skips simulated time ahead to the ramp.

The `vllm:` colons: prometheus-client >= 0.23 serving OpenMetrics escapes them for Prometheus 2.x (client_python
#1177). The simulator, like vLLM, answers text format 0.0.4 whatever Prometheus asks for, and that format keeps them;
the test checks the content type under Prometheus' own Accept header and then reads `vllm:` series (and a recording
rule built on them) back through the Prometheus HTTP API. The sidecar's own names have no colons.

Runs only with SPEC_ADVISOR_E2E=1 (like the real-vLLM tests); then a missing prometheus or alertmanager binary
FAILS the test (scripts/setup-observability-tools.sh installs both).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_processes import Started, free_port, start_process, stop_process, wait_ready
from e2e_vllm import E2E_ENV_VAR, e2e_enabled, record_timing
from monitoring_stack import (
    ALERTMANAGER_NAMES,
    PROMETHEUS_NAMES,
    PrometheusApi,
    RenderedRules,
    SimThread,
    WebhookReceiver,
    duration_s,
    log_tails,
    poll,
    render_rules,
    require_binary,
    sample_value,
    start_alertmanager,
    start_prometheus,
    wait_process_ready,
    write_alertmanager_config,
    write_prometheus_config,
)

from service.sim.physics import acceptance_at, expected_step_time_s, expected_tokens_per_verification
from service.sim.scenario import Scenario, UniformLength, load_scenario
from service.sim.world import World

REPO = Path(__file__).resolve().parents[2]
SCENARIO_PATH = REPO / "tests" / "fixtures" / "scenarios" / "ngram-overload.yaml"
RULES_PATH = REPO / "deploy" / "prometheus" / "spec-advisor.rules.yaml"
RUNBOOK_PATH = REPO / "docs" / "runbook.md"

ALERT = "SpecAdvisorSpeculationCostsThroughput"
TARGET = "sim"
SIDECAR_JOB = "spec-advisor"
VLLM_JOB = "vllm"

TIME_SCALE = 10.0
FOR_DIVISOR = 300
STACK_INTERVAL = "1s"  # Prometheus scrape/evaluation interval and every rule group's interval
SIDECAR_INTERVAL_S = 0.5
SIDECAR_WINDOW_S = 3.0

# What Prometheus 2.42 sends when it scrapes (scrape/scrape.go acceptHeader): OpenMetrics preferred.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


# ----------------------------------------------------------------------------------------------------------------
# The scenario's ground truth (the simulator's own physics, not the advisor's model)
# ----------------------------------------------------------------------------------------------------------------


def true_speedup(scenario: Scenario, *, gamma: int, batch: float, context_tokens: float) -> float:
    """S(gamma) = tokens/s with gamma drafts over tokens/s without, for a steady decode batch: tokens per
    verification (1 + expected accepted drafts) over the step time, both from service/sim/physics.py.
    """
    seqs = max(1, round(batch))

    def tokens_per_s(k: int) -> float:
        emitted = expected_tokens_per_verification(scenario.drafter, k, acceptance_at(scenario, 0.0, k))
        step = expected_step_time_s(
            scenario, num_seqs=seqs, num_speculative_tokens=k, mean_context_tokens=context_tokens
        )
        return emitted / step

    return tokens_per_s(gamma) / tokens_per_s(0)


def ramp_start_sim_s(scenario: Scenario) -> float:
    """The knot after which the arrival rate starts to climb: the end of the light phase."""
    points = scenario.workload.arrival_rate
    for before, after in itertools.pairwise(points):
        if after.requests_per_s > before.requests_per_s:
            return before.t_s
    raise AssertionError(f"{SCENARIO_PATH} has no rising load")


def mean_context_tokens(scenario: Scenario) -> float:
    # A decoding request holds its prompt plus the output so far: mean prompt + half the mean output.
    prompt, output = scenario.workload.prompt_tokens, scenario.workload.output_tokens
    assert isinstance(prompt, UniformLength) and isinstance(output, UniformLength)
    return (prompt.min_tokens + prompt.max_tokens) / 2 + (output.min_tokens + output.max_tokens) / 4


def test_scenario_pays_at_light_load_and_loses_at_every_gamma_when_saturated() -> None:
    """The fixture's premise, checked with the simulator's physics: not an e2e test, it runs everywhere."""
    scenario = load_scenario(SCENARIO_PATH)
    k = scenario.drafter.num_speculative_tokens
    # Prompts 200..600 (mean 400) + half of 150..300 (mean 225) = 512.5 tokens of context per decoding request.
    ctx = mean_context_tokens(scenario)
    assert ctx == pytest.approx(512.5)
    # Light phase: 1 request/s of ~225 output tokens keeps about 2 requests running; memory-bound, drafts pay.
    light = {gamma: true_speedup(scenario, gamma=gamma, batch=2, context_tokens=ctx) for gamma in range(1, 9)}
    assert light[k] > 1.05, light  # clears the advisor's default 2% margin at the band's low end, with room
    # Overload: 45 requests/s x ~225 tokens = ~10k tokens/s asked of an engine that serves fewer, so the batch
    # sits at max_num_seqs; compute-bound there, every gamma loses.
    loaded = {
        gamma: true_speedup(scenario, gamma=gamma, batch=scenario.engine.max_num_seqs, context_tokens=ctx)
        for gamma in range(1, 9)
    }
    assert all(s < 1.0 for s in loaded.values()), loaded
    capacity_tokens_per_s = (
        scenario.engine.max_num_seqs
        * expected_tokens_per_verification(scenario.drafter, k, acceptance_at(scenario, 0.0, k))
        / expected_step_time_s(
            scenario, num_seqs=scenario.engine.max_num_seqs, num_speculative_tokens=k, mean_context_tokens=ctx
        )
    )
    output = scenario.workload.output_tokens
    assert isinstance(output, UniformLength)
    peak = max(p.requests_per_s for p in scenario.workload.arrival_rate)
    assert peak * (output.min_tokens + output.max_tokens) / 2 > capacity_tokens_per_s


# ----------------------------------------------------------------------------------------------------------------
# The stack
# ----------------------------------------------------------------------------------------------------------------


def write_sidecar_settings(path: Path, *, sim_url: str, model: str, port: int) -> None:
    """The advisor's profiles match the scenario (an 8B Llama-like model on an H100-like GPU); short everything."""
    document: dict[str, Any] = {
        "targets": [
            {
                "name": TARGET,
                "url": sim_url,
                "model": model,
                "hardware": "h100-sxm",
                "model_profile": "llama-3.1-8b",
                "drafter": {"method": "ngram"},
            }
        ],
        "scrape_interval_s": SIDECAR_INTERVAL_S,
        "scrape_timeout_s": SIDECAR_INTERVAL_S,
        "host": "127.0.0.1",
        "port": port,
        "gpu": {"telemetry": "none"},
        "estimator": {"window_s": SIDECAR_WINDOW_S, "stale_after_s": 6 * SIDECAR_INTERVAL_S},
        "decide": {"dwell_s": 1.0},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def start_sidecar(config: Path, *, log_path: Path) -> Started:
    cli = Path(sys.executable).with_name("spec-advisor")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPEC_ADVISOR_")}
    return start_process("spec-advisor", [str(cli), "serve", "--config", str(config)], env=env, log_path=log_path)


def alert_named(alerts: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [a for a in alerts if a["labels"].get("alertname") == name]


def describe_alerts(alerts: list[dict[str, Any]]) -> str:
    return ", ".join(f"{a['labels'].get('alertname')}({a['state']})" for a in alerts) or "none"


@dataclass(frozen=True, slots=True)
class Stack:
    """Everything running for one test, and what a failure message should show about it."""

    scenario: Scenario
    rules: RenderedRules
    sim: SimThread
    sidecar_url: str
    prom: PrometheusApi
    webhook: WebhookReceiver
    processes: tuple[Started, ...]

    def diagnostics(self) -> str:
        try:
            alerts = describe_alerts(self.prom.alerts())
        except httpx.HTTPError as exc:
            alerts = f"<{exc}>"
        world = self.sim.world
        return (
            f"sim t={self.sim.elapsed_sim_s():.0f} s, {world.num_running} running / {world.num_waiting} waiting; "
            f"Prometheus alerts: {alerts}; webhook payloads: {len(self.webhook.payloads())}\n"
            f"{log_tails(self.processes)}"
        )


@contextlib.contextmanager
def running_stack(tmp_path: Path, *, prometheus_bin: Path, alertmanager_bin: Path) -> Iterator[Stack]:
    """Webhook, Alertmanager, the simulator, the sidecar and Prometheus, each ready; all stopped on exit (process
    groups killed after a grace period), in reverse order.
    """
    scenario = load_scenario(SCENARIO_PATH)
    rules = render_rules(
        RULES_PATH, tmp_path / "spec-advisor.rules.yaml", group_interval=STACK_INTERVAL, for_divisor=FOR_DIVISOR
    )
    with contextlib.ExitStack() as stack:
        webhook = WebhookReceiver()
        webhook.start()
        stack.callback(webhook.stop)
        am_port, prom_port, sidecar_port = free_port(), free_port(), free_port()

        am_config = tmp_path / "alertmanager.yml"
        write_alertmanager_config(am_config, webhook_url=webhook.url, group_wait="1s", group_interval="1s")
        alertmanager = start_alertmanager(
            alertmanager_bin, config=am_config, storage=tmp_path / "am-data", port=am_port,
            log_path=tmp_path / "alertmanager.log",
        )  # fmt: skip
        stack.callback(stop_process, alertmanager, grace_s=10.0)

        sim = SimThread(World(scenario, seed=0, start_s=time.time()), time_scale=TIME_SCALE)
        sim.start()
        stack.callback(sim.stop)

        sidecar_config = tmp_path / "spec-advisor.yaml"
        write_sidecar_settings(sidecar_config, sim_url=sim.url, model=scenario.model_name, port=sidecar_port)
        sidecar = start_sidecar(sidecar_config, log_path=tmp_path / "spec-advisor.log")
        stack.callback(stop_process, sidecar, grace_s=10.0)

        prom_config = tmp_path / "prometheus.yml"
        write_prometheus_config(
            prom_config,
            scrape_targets={SIDECAR_JOB: f"127.0.0.1:{sidecar_port}", VLLM_JOB: sim.url.removeprefix("http://")},
            rule_file=rules.path,
            alertmanager=f"127.0.0.1:{am_port}",
            interval=STACK_INTERVAL,
        )
        prometheus = start_prometheus(
            prometheus_bin, config=prom_config, storage=tmp_path / "prom-data", port=prom_port,
            log_path=tmp_path / "prometheus.log",
        )  # fmt: skip
        stack.callback(stop_process, prometheus, grace_s=10.0)
        prom = PrometheusApi(f"http://127.0.0.1:{prom_port}")
        stack.callback(prom.close)

        # All three start together above; wait for them only now.
        wait_process_ready(alertmanager, f"http://127.0.0.1:{am_port}")
        wait_process_ready(prometheus, prom.base_url)
        sidecar_url = f"http://127.0.0.1:{sidecar_port}"
        wait_ready(sidecar, f"{sidecar_url}/readyz", timeout_s=60.0)
        yield Stack(
            scenario=scenario,
            rules=rules,
            sim=sim,
            sidecar_url=sidecar_url,
            prom=prom,
            webhook=webhook,
            processes=(alertmanager, sidecar, prometheus),
        )


def check_scrapes_keep_vllm_colons(stack: Stack) -> float:
    """Both targets up; `vllm:` series readable as such through the API; returns the acceptance-length recording
    rule's value (a rule over the colon names).
    """
    prom, model = stack.prom, stack.scenario.model_name

    def both_up() -> bool | None:
        health = {t["labels"]["job"]: t["health"] for t in prom.active_targets()}
        return True if health == {SIDECAR_JOB: "up", VLLM_JOB: "up"} else None

    poll("both scrape targets up", both_up, timeout_s=60.0, diagnostics=stack.diagnostics)
    page = httpx.get(f"{stack.sim.url}/metrics", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=5.0)
    assert page.headers["content-type"].startswith("text/plain; version=0.0.4"), page.headers
    drafts = prom.query("vllm:spec_decode_num_drafts_total")
    assert [s["metric"]["__name__"] for s in drafts] == ["vllm:spec_decode_num_drafts_total"], drafts
    assert drafts[0]["metric"]["model_name"] == model
    assert drafts[0]["metric"]["job"] == VLLM_JOB
    assert prom.query('{__name__=~"vllm_.+"}') == []  # no escaped twin of any family

    def acceptance_length() -> float | None:
        result = prom.query(f'model_name:vllm_spec_decode_mean_acceptance_length:rate5m{{model_name="{model}"}}')
        return sample_value(result[0]) if result else None

    mean_length = poll(
        "the acceptance-length recording rule", acceptance_length, timeout_s=30.0, diagnostics=stack.diagnostics
    )
    # Tokens per verification: the bonus token plus 0..k accepted drafts.
    assert 1.0 < mean_length <= 1.0 + stack.scenario.drafter.num_speculative_tokens
    return mean_length


AT_DEPLOYED = "target:specadvisor_predicted_speedup:at_deployed_gamma"


def observe_light_phase(stack: Stack) -> tuple[float, set[str]]:
    """Wait for the advisor's light-load decision (ok, on, S at the deployed gamma >= 1) to reach Prometheus, then
    watch longer than the alert would need to fire, re-checking at every poll that the light phase still holds.
    Returns S at the deployed gamma and the names of any other alerts seen meanwhile.
    """
    prom, sim, k = stack.prom, stack.sim, stack.scenario.drafter.num_speculative_tokens
    ramp_s = ramp_start_sim_s(stack.scenario)

    def established() -> float | None:
        ok = prom.query(f'specadvisor_decision_state{{target="{TARGET}",state="ok"}} == 1')
        on = prom.query(f'specadvisor_recommended_enabled{{target="{TARGET}"}} == 1')
        deployed = prom.query(f'specadvisor_deployed_speculation_enabled{{target="{TARGET}"}} == 1')
        speedup = prom.query(f'{AT_DEPLOYED}{{target="{TARGET}"}}')
        if not (ok and on and deployed and speedup):
            return None
        assert speedup[0]["metric"]["gamma"] == str(k), speedup
        return sample_value(speedup[0])

    light_speedup = poll(
        "the advisor's light-load decision in Prometheus", established, timeout_s=60.0, diagnostics=stack.diagnostics
    )
    assert light_speedup >= 1.0, f"the advisor predicts S({k})={light_speedup} at light load"

    # The alert's `for:`, plus one evaluation of the recording-rule group and one of the alert group, with margin.
    quiet_s = duration_s(stack.rules.test_for[ALERT]) + 6.0
    quiet_start = time.monotonic()
    others: set[str] = set()
    while time.monotonic() - quiet_start < quiet_s:
        assert sim.elapsed_sim_s() < ramp_s, (
            f"the light phase ended (sim t={sim.elapsed_sim_s():.0f} s >= {ramp_s:.0f} s) before it was observed "
            f"for {quiet_s:.0f} s: the machine is too slow for TIME_SCALE={TIME_SCALE:g}\n{stack.diagnostics()}"
        )
        alerts = prom.alerts()
        assert alert_named(alerts, ALERT) == [], f"{ALERT} at light load:\n{stack.diagnostics()}"
        others.update(a["labels"]["alertname"] for a in alerts)
        still = prom.query(f'{AT_DEPLOYED}{{target="{TARGET}"}} >= 1')
        assert still, f"the predicted speedup at the deployed gamma fell below 1 at light load\n{stack.diagnostics()}"
        time.sleep(0.5)

    rule_states = {
        rule["name"]: (rule["health"], rule.get("state"), rule.get("lastError", ""))
        for group in prom.rule_groups()
        for rule in group["rules"]
    }
    bad = {name: state for name, state in rule_states.items() if state[0] != "ok"}
    assert not bad, f"shipped rules failing to evaluate: {bad}"
    assert rule_states[ALERT][1] == "inactive", rule_states[ALERT]
    assert stack.webhook.delivered(ALERT) == []
    return light_speedup, others


def overload_until_delivered(stack: Stack) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Skip the simulator to the ramp; return the alert as Prometheus fires it, and (payload, alert) as the webhook
    received it from Alertmanager.
    """
    stack.sim.skip_to(ramp_start_sim_s(stack.scenario))
    httpx.get(f"{stack.sim.url}/sim/state", timeout=30.0).raise_for_status()  # simulate the skipped span now

    def firing() -> dict[str, Any] | None:
        found = [a for a in alert_named(stack.prom.alerts(), ALERT) if a["state"] == "firing"]
        return found[0] if found else None

    fired = poll(f"{ALERT} firing in Prometheus", firing, timeout_s=90.0, diagnostics=stack.diagnostics)

    def delivered() -> tuple[dict[str, Any], dict[str, Any]] | None:
        found = [(p, a) for p, a in stack.webhook.delivered(ALERT) if a.get("status") == "firing"]
        return found[0] if found else None

    payload, alert = poll(f"{ALERT} at the webhook", delivered, timeout_s=30.0, diagnostics=stack.diagnostics)
    return fired, payload, alert


@pytest.mark.e2e
def test_prometheus_fires_and_alertmanager_delivers_when_speculation_costs_throughput(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Read at run time, like the real-vLLM fixtures (e2e_vllm.require_enabled, whose skip reason names vLLM).
    if not e2e_enabled():
        pytest.skip(f"the monitoring-stack test runs real Prometheus and Alertmanager: set {E2E_ENV_VAR}=1")
    prometheus_bin = require_binary("Prometheus", PROMETHEUS_NAMES, env_var="SPEC_ADVISOR_PROMETHEUS_BIN")
    alertmanager_bin = require_binary("Alertmanager", ALERTMANAGER_NAMES, env_var="SPEC_ADVISOR_ALERTMANAGER_BIN")
    t_start = time.monotonic()

    with running_stack(tmp_path, prometheus_bin=prometheus_bin, alertmanager_bin=alertmanager_bin) as stack:
        assert ALERT in stack.rules.test_for, f"{RULES_PATH} defines no {ALERT}"
        scenario, k = stack.scenario, stack.scenario.drafter.num_speculative_tokens

        mean_length = check_scrapes_keep_vllm_colons(stack)
        record_timing(request.config, "monitoring stack up", time.monotonic() - t_start)

        light_speedup, light_others = observe_light_phase(stack)
        record_timing(request.config, "light phase observed", time.monotonic() - t_start)

        overload_start = time.monotonic()
        fired, payload, alert = overload_until_delivered(stack)
        record_timing(request.config, "overload to webhook", time.monotonic() - overload_start)

        assert payload["receiver"] == "test-webhook"
        assert payload["status"] == "firing"
        labels, annotations = alert["labels"], alert["annotations"]
        assert labels == fired["labels"], (labels, fired["labels"])
        assert labels["alertname"] == ALERT
        assert labels["severity"] == "warning"
        assert labels["target"] == TARGET
        assert labels["model"] == scenario.model_name
        assert labels["gamma"] == str(k)  # the deployed k, turned into a label by count_values in the recording rule
        assert labels["job"] == SIDECAR_JOB
        assert TARGET in annotations["summary"] and scenario.model_name in annotations["summary"], annotations
        description = annotations["description"]
        assert f"num_speculative_tokens={k}" in description, description
        # `{{ $value | printf "%.2f" }}`: the predicted speedup at the deployed gamma, with two decimals.
        match = re.search(r"speedup of (\d+\.\d\d)x", description)
        assert match is not None, description
        assert 0.0 < float(match.group(1)) < 1.0, description
        assert annotations["runbook_url"].rpartition("#")[2] == ALERT.lower(), annotations["runbook_url"]
        assert f"\n## {ALERT}\n" in RUNBOOK_PATH.read_text(encoding="utf-8")

        # The operating point the advisor measured really is losing territory for every gamma (the world's truth).
        [evidence] = httpx.get(f"{stack.sidecar_url}/v1/evidence", timeout=5.0).raise_for_status().json()["targets"]
        assert evidence["batch"] > 0.9 * scenario.engine.max_num_seqs, evidence
        truth = {
            gamma: true_speedup(
                scenario, gamma=gamma, batch=evidence["batch"], context_tokens=evidence["context_tokens_per_seq"]
            )
            for gamma in range(1, 9)
        }
        assert all(s < 1.0 for s in truth.values()), truth

        print(
            f"\nmonitoring stack: light-load S({k})={light_speedup:.2f}, acceptance length {mean_length:.2f}, other "
            f"alerts at light load: {sorted(light_others) or 'none'}; delivered: {description!r}; alerts at the end: "
            f"{describe_alerts(stack.prom.alerts())}; test for: {dict(stack.rules.test_for)} (shipped "
            f"{dict(stack.rules.shipped_for)})",
            file=sys.stderr,
        )
