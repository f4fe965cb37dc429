"""`spec-advisor backtest` against a REAL Prometheus holding history recorded from the simulator.

Debian's `prometheus` scrapes the simulated vLLM server (tests/fixtures/scenarios/ngram-overload.yaml at 10x:
n-gram k=3 that pays at light load and loses at every k once the batch saturates; the premise is checked with the
simulator's physics in test_monitoring_stack.py) through a light phase and, after a skip to the ramp, an overload.
The backtest then replays that window from Prometheus' history: it must recommend speculation on in the light phase,
off once the overload has settled, and its gate must have acted to turn it off after the ramp, not before.

Runs only with SPEC_ADVISOR_E2E=1 (like every e2e test, see e2e_vllm.py). Every wait is bounded; every process
started here is stopped at teardown.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_processes import free_port, stop_process
from e2e_vllm import E2E_ENV_VAR, e2e_enabled
from monitoring_stack import (
    PROMETHEUS_NAMES,
    PrometheusApi,
    SimThread,
    log_tails,
    poll,
    require_binary,
    start_prometheus,
    wait_process_ready,
)
from test_monitoring_stack import SCENARIO_PATH, ramp_start_sim_s

from service.cli.command import main
from service.sim.scenario import load_scenario
from service.sim.world import World

pytestmark = pytest.mark.e2e

TIME_SCALE = 10.0
LIGHT_WALL_S = 25.0  # 250 simulated seconds of light load (the ramp is at 600)
OVERLOAD_WALL_S = 30.0
SETTLE_S = 12.0  # the rate window + the estimator window after the skip, before the overload is judged
RATE_WINDOW_S = 4.0


def _write_prometheus_config(path: Path, sim_address: str) -> None:
    document = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [sim_address]}]}],
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def _write_backtest_settings(path: Path, *, prometheus_url: str, model: str) -> None:
    document: dict[str, Any] = {
        "targets": [{
            "name": "fleet", "prometheus_url": prometheus_url, "model": model, "selector": 'job="vllm"',
            "rate_window_s": RATE_WINDOW_S, "hardware": "h100-sxm", "model_profile": "llama-3.1-8b",
            "drafter": {"method": "ngram"},
        }],
        "scrape_interval_s": 1.0,
        "scrape_timeout_s": 1.0,
        "estimator": {"window_s": 6.0, "min_drafts": 100, "stale_after_s": 30.0},
        "decide": {"dwell_s": 0.0},
        "actuation": {"gate": {"dwell_s": 3.0, "cooldown_s": 10.0}},
        "gpu": {"telemetry": "none"},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def _setting(row: dict[str, Any]) -> int | None:
    if row["state"] != "ok":
        return None
    return row["num_speculative_tokens"] if row["enabled"] else 0


def test_backtest_replays_a_real_prometheus_through_light_load_and_overload(tmp_path: Path) -> None:
    if not e2e_enabled():
        pytest.skip(f"the backtest test runs a real Prometheus: set {E2E_ENV_VAR}=1")
    binary = require_binary("Prometheus", PROMETHEUS_NAMES, env_var="SPEC_ADVISOR_PROMETHEUS_BIN")
    scenario = load_scenario(SCENARIO_PATH)
    sim = SimThread(World(scenario, seed=0, start_s=time.time()), time_scale=TIME_SCALE)
    sim.start()
    prometheus = None
    try:
        config = tmp_path / "prometheus.yml"
        _write_prometheus_config(config, sim.url.removeprefix("http://"))
        port = free_port()
        prometheus = start_prometheus(binary, config=config, storage=tmp_path / "tsdb", port=port,
                                      log_path=tmp_path / "prometheus.log")
        url = f"http://127.0.0.1:{port}"
        wait_process_ready(prometheus, url)
        api = PrometheusApi(url)
        diagnostics = lambda: log_tails([prometheus])  # noqa: E731
        poll("the simulator's series in Prometheus", lambda: api.query("vllm:spec_decode_num_drafts_total") or None,
             timeout_s=30.0, diagnostics=diagnostics)
        start_s = time.time()
        time.sleep(LIGHT_WALL_S)
        assert sim.elapsed_sim_s() < ramp_start_sim_s(scenario), "the light phase ended before it was recorded"
        sim.skip_to(ramp_start_sim_s(scenario))
        httpx.get(f"{sim.url}/sim/state", timeout=30.0).raise_for_status()  # simulate the skipped span now
        ramp_s = time.time()
        time.sleep(OVERLOAD_WALL_S)
        end_s = time.time() - 2.0  # the last scrape is ingested
        api.close()

        settings, out, png = tmp_path / "backtest.yaml", tmp_path / "backtest.json", tmp_path / "backtest.png"
        _write_backtest_settings(settings, prometheus_url=url, model=scenario.model_name)
        code = main(["backtest", "--config", str(settings), "--from", f"{start_s:.3f}", "--to", f"{end_s:.3f}",
                     "--step", "1", "--json", str(out), "--plot", str(png)])
    finally:
        if prometheus is not None:
            stop_process(prometheus, grace_s=10.0)
        sim.stop()

    assert code == 0
    document = json.loads(out.read_text())
    rows = document["rows"]
    light = [_setting(r) for r in rows if start_s + SETTLE_S <= r["at_s"] < ramp_s]
    overload = [_setting(r) for r in rows if r["at_s"] >= ramp_s + SETTLE_S]
    light_ok = [k for k in light if k is not None]
    overload_ok = [k for k in overload if k is not None]
    assert len(light_ok) >= len(light) // 2 and len(overload_ok) >= len(overload) // 2, (light, overload)
    # Light load: speculation pays (the simulator's truth), and history's k 3 is kept: no action before the ramp.
    assert sum(k > 0 for k in light_ok) >= 0.8 * len(light_ok), light
    assert all(a["at_s"] > ramp_s for a in document["would_act"]), document["would_act"]
    # Saturated, every k loses (the simulator's truth): the replay recommends less speculation than history ran
    # (fewer drafts or off), and the gate acts on it after the ramp. (Whether it goes all the way to off is the
    # decision rule's business, judged by the bench, not the replay's.)
    assert sum(k < 3 for k in overload_ok) >= 0.8 * len(overload_ok), overload
    fewer = [a for a in document["would_act"] if a["wanted_k"] < a["running_k"] == 3]
    assert fewer, document["would_act"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
