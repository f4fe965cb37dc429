"""Generate the spec-advisor Grafana dashboard, deploy/grafana/spec-advisor.json.

    python deploy/grafana/generate_dashboard.py            write it
    python deploy/grafana/generate_dashboard.py --check    exit 1 when the JSON on disk differs from this builder

Provisioning-ready: every query names its datasource as `${datasource}` (a variable of type datasource, Prometheus),
so the same file works in any Grafana without editing a uid; `$target` and `$model` filter the advisor's series
(labels `target`, `model`), `$model` also filters vLLM's (label `model_name`). Alerts appear as annotations from
Prometheus' `ALERTS` series (rules from deploy/prometheus/) and Grafana's own (built-in annotation).

Panels are built from a few small helpers so that ids and the grid layout are computed, not hand-numbered.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).resolve().parent / "spec-advisor.json"
UID = "spec-advisor"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24

# Label filters, written once: the advisor's per-target series and vLLM's per-model series. The auto-toggle's
# series (A) carry a target and no model label, so $model does not filter them.
T = 'target=~"$target", model=~"$model"'
V = 'model_name=~"$model"'
A = 'target=~"$target"'

Json = dict[str, Any]


def q(expr: str, legend: str, *, instant: bool = False) -> Json:
    """One Prometheus query of a panel; refIds are assigned by the panel."""
    return {"expr": expr, "legendFormat": legend, "instant": instant, "range": not instant}


@dataclass(slots=True)
class Layout:
    """Places panels left to right in rows of GRID_WIDTH columns, and numbers them."""

    panels: list[Json] = field(default_factory=list)
    x: int = 0
    y: int = 0
    row_height: int = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({
            "type": "row", "title": title, "id": len(self.panels) + 1, "collapsed": False, "panels": [],
            "gridPos": {"x": 0, "y": self.y, "w": GRID_WIDTH, "h": 1},
        })
        self.y += 1

    def add(self, panel: Json, *, w: int, h: int) -> None:
        if self.x + w > GRID_WIDTH:
            self._newline()
        panel["id"] = len(self.panels) + 1
        panel["gridPos"] = {"x": self.x, "y": self.y, "w": w, "h": h}
        for index, target in enumerate(panel.get("targets", [])):
            target["refId"] = chr(ord("A") + index)
            target["datasource"] = dict(DATASOURCE)
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)

    def _newline(self) -> None:
        self.y += self.row_height
        self.x = 0
        self.row_height = 0


@dataclass(frozen=True, slots=True)
class Axis:
    """A panel's value axis: Grafana's unit id and the bounds (None: Grafana picks them from the data)."""

    unit: str = "short"
    minimum: float | None = None
    maximum: float | None = None


def _field_config(
    *, axis: Axis = Axis(), thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),),
    custom: Json | None = None, mappings: Sequence[Json] = (), overrides: Sequence[Json] = (),
) -> Json:
    defaults: Json = {
        "unit": axis.unit,
        "thresholds": {"mode": "absolute", "steps": [{"value": v, "color": c} for v, c in thresholds]},
        "mappings": list(mappings),
        "custom": custom or {},
    }
    if axis.minimum is not None:
        defaults["min"] = axis.minimum
    if axis.maximum is not None:
        defaults["max"] = axis.maximum
    return {"defaults": defaults, "overrides": list(overrides)}


def timeseries(
    title: str, description: str, targets: Sequence[Json], *, axis: Axis = Axis(),
    threshold_line: tuple[float, str] | None = None, overrides: Sequence[Json] = (),
) -> Json:
    custom: Json = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "never", "spanNulls": False}
    thresholds: list[tuple[float | None, str]] = [(None, "green")]
    if threshold_line is not None:
        # A dashed line at the value that matters (speedup 1, the alert's threshold), not a colour band.
        custom["thresholdsStyle"] = {"mode": "dashed"}
        thresholds = [(None, "transparent"), threshold_line]
    return {
        "type": "timeseries", "title": title, "description": description, "datasource": dict(DATASOURCE),
        "targets": list(targets),
        "fieldConfig": _field_config(axis=axis, thresholds=thresholds, custom=custom, overrides=overrides),
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
    }


def _value_map(*entries: tuple[int, str, str]) -> Json:
    return {"type": "value", "options": {str(v): {"text": text, "color": color, "index": i}
                                         for i, (v, text, color) in enumerate(entries)}}


def state_timeline(title: str, description: str, targets: Sequence[Json], mapping: Json) -> Json:
    return {
        "type": "state-timeline", "title": title, "description": description, "datasource": dict(DATASOURCE),
        "targets": list(targets),
        "fieldConfig": _field_config(custom={"fillOpacity": 80, "lineWidth": 0}, mappings=[mapping],
                                     thresholds=[(None, "text")]),
        "options": {"showValue": "auto", "mergeValues": True, "rowHeight": 0.8,
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False}},
    }


def bargauge(title: str, description: str, targets: Sequence[Json], *, thresholds: Sequence[tuple[float | None, str]],
             minimum: float, maximum: float) -> Json:
    return {
        "type": "bargauge", "title": title, "description": description, "datasource": dict(DATASOURCE),
        "targets": list(targets),
        "fieldConfig": _field_config(axis=Axis("suffix:x", minimum, maximum), thresholds=thresholds),
        "options": {"orientation": "vertical", "displayMode": "gradient", "showUnfilled": True,
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
    }


def stat(title: str, description: str, targets: Sequence[Json], *, text_mode: str = "value_and_name",
         thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),)) -> Json:
    return {
        "type": "stat", "title": title, "description": description, "datasource": dict(DATASOURCE),
        "targets": list(targets),
        "fieldConfig": _field_config(thresholds=thresholds),
        "options": {"textMode": text_mode, "colorMode": "background", "graphMode": "none", "justifyMode": "auto",
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
    }


def _decision_state_code() -> str:
    # One number per target from the one-hot decision_state gauge, so a state timeline shows one row per target:
    # 1 ok, 2 insufficient_data, 3 stale, 4 error, 0 no decision yet.
    parts = [f'{code} * max without (state) (specadvisor_decision_state{{{T}, state="{state}"}})'
             for code, state in ((1, "ok"), (2, "insufficient_data"), (3, "stale"), (4, "error"))]
    return "\n  + ".join(parts)


def _actuation_row(layout: Layout) -> None:
    # Empty for an advisor in recommend-only (the default): these families exist only with actuation.mode set.
    layout.row("Actuation")
    layout.add(timeseries(
        "Actions by result",
        "Actions on the Deployment/HTTPRoute in the last hour, by result: applied, dry_run (computed and written to "
        "the audit log, not sent) and failed (see Actuator errors). Capped by actuation.gate.max_actions_per_hour. "
        "Empty in recommend-only.",
        [q(f"sum by (target, mode, result) (increase(specadvisor_actions_total{{{A}}}[1h]))",
           "{{target}} {{mode}} {{result}}")],
        axis=Axis(minimum=0),
    ), w=8, h=8)
    layout.add(timeseries(
        "Skipped actions by reason",
        "Ticks on which the safety gate held an action back, by the first rule that held it (paused, "
        "rollout_in_progress, engine_mismatch, stale, insufficient_data, already_applied, dwell, cooldown, "
        "hourly_cap, daily_cap, ...), per $__rate_interval; already_applied is the quiet steady state. Only "
        "reasons that occurred are drawn.",
        [q(f"sum by (target, reason) (increase(specadvisor_actions_skipped_total{{{A}}}[$__rate_interval])) > 0",
           "{{target}} {{reason}}")],
        axis=Axis(minimum=0),
    ), w=8, h=8)
    layout.add(timeseries(
        "Actuator errors by reason",
        "Failed reads or patches of the managed object in the last 30 minutes, by reason (forbidden, not_found, "
        "unreachable, conflict, malformed_args, ...); SpecAdvisorActuatorErrors fires above 0. Nothing is "
        "half-applied.",
        [q(f"sum by (target, reason) (increase(specadvisor_actuator_errors_total{{{A}}}[30m])) > 0",
           "{{target}} {{reason}}")],
        axis=Axis(minimum=0),
    ), w=8, h=8)
    layout.add(state_timeline(
        "Auto-toggle state",
        "Per target: dry run (actions logged, not sent; the shipped default), paused by an operator "
        "(SpecAdvisorActuationPausedLong after 6 h), and a manual override in force (SpecAdvisorOverrideActiveLong "
        "after 6 h).",
        [q(f"specadvisor_actuation_dry_run{{{A}}}", "dry run {{target}}"),
         q(f"specadvisor_actuation_paused{{{A}}}", "paused {{target}}"),
         q(f"specadvisor_actuation_override_active{{{A}}}", "override {{target}}")],
        _value_map((0, "no", "text"), (1, "yes", "orange")),
    ), w=12, h=7)
    layout.add(timeseries(
        "Cooldown remaining",
        "Seconds until the cooldown (actuation.gate.cooldown_s after the last action) allows the next action on "
        "the target; 0 = free to act when the other rules allow.",
        [q(f"specadvisor_actuation_cooldown_remaining_seconds{{{A}}}", "{{target}}")],
        axis=Axis("s", minimum=0),
    ), w=12, h=7)
    layout.add(timeseries(
        "Audit log and listener errors",
        "Audit records the advisor could not write (SpecAdvisorAuditWriteFailing: the safety record is "
        "incomplete) and exceptions that escaped an iteration listener (SpecAdvisorListenerErrors: a bug), in the "
        "last 15 minutes, per advisor.",
        [q("sum by (instance) (increase(specadvisor_audit_write_errors_total[15m]))", "audit {{instance}}"),
         q("sum by (instance, listener) (increase(specadvisor_listener_errors_total[15m]))",
           "{{listener}} {{instance}}")],
        axis=Axis(minimum=0),
    ), w=24, h=6)


def build() -> Json:
    layout = Layout()

    layout.row("Recommendation")
    on_off = _value_map((0, "off", "text"), (1, "on", "green"))
    layout.add(state_timeline(
        "Speculation: recommended vs deployed",
        "Whether speculative decoding is recommended (the advisor's published decision, after its margin and wait) "
        "and whether the engine runs it. A lasting difference is SpecAdvisorRecommendationNotApplied; deployed on "
        "while recommended off is SpecAdvisorSpeculationCostsThroughput.",
        [q(f"specadvisor_recommended_enabled{{{T}}}", "recommended {{target}}"),
         q(f"specadvisor_deployed_speculation_enabled{{{T}}}", "deployed {{target}}")],
        on_off,
    ), w=12, h=6)
    layout.add(state_timeline(
        "Decision state",
        "ok: fresh decision. insufficient_data: too few drafts in the window to decide. stale: the last scrape "
        "failed, the last good decision is kept. error: no good scrape for too long, or no cost model. "
        "none: nothing published since start-up.",
        [q(_decision_state_code(), "{{target}}")],
        _value_map((0, "none", "text"), (1, "ok", "green"), (2, "insufficient_data", "blue"),
                   (3, "stale", "orange"), (4, "error", "red")),
    ), w=12, h=6)
    layout.add(timeseries(
        "γ: recommended vs deployed",
        "num_speculative_tokens recommended by the advisor and run by the engine (0 = off).",
        [q(f"specadvisor_recommended_num_speculative_tokens{{{T}}}", "recommended {{target}}"),
         q(f"specadvisor_deployed_num_speculative_tokens{{{T}}}", "deployed {{target}}")],
        axis=Axis(minimum=0),
    ), w=8, h=8)
    # The band as two dashed lines: a filled band (fillBelowTo) names one series literally, which cannot follow a
    # multi-valued $target.
    band = {"matcher": {"id": "byRegexp", "options": "^(low|high) .*"},
            "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                           {"id": "custom.lineWidth", "value": 1}]}
    layout.add(timeseries(
        "Expected speedup",
        "Predicted throughput of the recommendation over plain decoding, with its band (from the acceptance "
        "intervals), and the predicted speedup at the gamma the engine runs now. Below the dashed line at 1, "
        "speculation costs throughput.",
        [q(f"specadvisor_expected_speedup{{{T}}}", "recommended {{target}}"),
         q(f"specadvisor_expected_speedup_low{{{T}}}", "low {{target}}"),
         q(f"specadvisor_expected_speedup_high{{{T}}}", "high {{target}}"),
         q(f"target:specadvisor_predicted_speedup:at_deployed_gamma{{{T}}}", "at deployed γ={{gamma}} {{target}}")],
        axis=Axis("suffix:x"), threshold_line=(1.0, "red"), overrides=[band],
    ), w=8, h=8)
    layout.add(bargauge(
        "Predicted speedup by γ (now)",
        "The curve S(γ) the last decision was made on, at the current batch and acceptance.",
        [q(f"specadvisor_predicted_speedup{{{T}}}", "{{target}} γ={{gamma}}", instant=True)],
        thresholds=[(None, "red"), (1.0, "yellow"), (1.05, "green")], minimum=0.5, maximum=2.0,
    ), w=8, h=8)

    layout.row("Acceptance")
    layout.add(timeseries(
        "Acceptance per position (advisor window)",
        "r_i = P(at least i+1 drafts accepted) per verification over the advisor's window; position 0-based as in "
        "vLLM. Monotone non-increasing by construction.",
        [q(f"specadvisor_acceptance_per_position_ratio{{{T}}}", "{{target}} pos {{position}}")],
        axis=Axis("percentunit", minimum=0, maximum=1),
    ), w=12, h=8)
    layout.add(timeseries(
        "Acceptance per position (vLLM counters, 5m)",
        "The same ratio from vLLM's own counters through the recording rules, summed over engines and pods per "
        "model: independent of the advisor.",
        [q(f"model_name_position:vllm_spec_decode_acceptance_per_position:ratio_rate5m{{{V}}}",
           "{{model_name}} pos {{position}}")],
        axis=Axis("percentunit", minimum=0, maximum=1),
    ), w=12, h=8)
    layout.add(timeseries(
        "Mean acceptance length",
        "Tokens emitted per verification, 1 + accepted drafts (E[L] at the deployed γ): the advisor's window and "
        "vLLM's counters over 5 minutes.",
        [q(f"specadvisor_mean_acceptance_length_tokens{{{T}}}", "advisor {{target}}"),
         q(f"model_name:vllm_spec_decode_mean_acceptance_length:rate5m{{{V}}}", "vLLM {{model_name}}")],
        axis=Axis(minimum=1),
    ), w=12, h=7)
    layout.add(timeseries(
        "Acceptance rate",
        "Accepted / proposed draft tokens (vLLM's 'acceptance rate', not Leviathan's α).",
        [q(f"specadvisor_acceptance_rate_ratio{{{T}}}", "advisor {{target}}"),
         q(f"model_name:vllm_spec_decode_acceptance_rate:ratio_rate5m{{{V}}}", "vLLM {{model_name}}")],
        axis=Axis("percentunit", minimum=0, maximum=1),
    ), w=12, h=7)

    layout.row("Load and saturation")
    layout.add(timeseries(
        "Batch vs crossover",
        "Running requests (the continuous batch) and queued requests. The sidecar exports no crossover gauge yet, "
        "so the crossover is bracketed from the advisor's own decisions over the last 6 hours: the largest batch "
        "at which speculation was recommended on and the smallest at which it was recommended off. The margin and "
        "the wait before a change widen that bracket, and acceptance changes move the crossover itself.",
        [q(f"specadvisor_batch_requests{{{T}}}", "batch {{target}}"),
         q(f"specadvisor_waiting_requests{{{T}}}", "waiting {{target}}"),
         q(f"max_over_time((specadvisor_batch_requests{{{T}}} and specadvisor_recommended_enabled{{{T}}} == 1)"
           "[6h:1m])", "largest batch recommended on (6h) {{target}}"),
         q(f"min_over_time((specadvisor_batch_requests{{{T}}} and specadvisor_recommended_enabled{{{T}}} == 0)"
           "[6h:1m])", "smallest batch recommended off (6h) {{target}}")],
        axis=Axis(minimum=0),
    ), w=12, h=8)
    layout.add(timeseries(
        "Saturation signals",
        "GPU activity by signal and source. gpu_util only says a kernel ran (it reads ~100% at batch 1); "
        "tensor_active, dram_active and sm_active measure saturation (nvml/gpm, dcgm); source engine = vLLM's "
        "own estimated FLOP/s and bytes/s over the hardware peak.",
        [q(f"specadvisor_gpu_utilization_ratio{{{T}}}", "{{target}} {{signal}} ({{source}})")],
        axis=Axis("percentunit", minimum=0, maximum=1),
    ), w=12, h=8)
    layout.add(timeseries(
        "Step time",
        "Engine step time: the advisor's window (mean inter-token latency) and vLLM's histogram over 5 minutes.",
        [q(f"specadvisor_step_time_seconds{{{T}}}", "advisor {{target}}"),
         q(f"model_name:vllm_inter_token_latency_seconds:mean5m{{{V}}}", "vLLM {{model_name}}")],
        axis=Axis("s", minimum=0),
    ), w=12, h=7)
    layout.add(timeseries(
        "Cost model calibration error",
        "Median |predicted / measured step time - 1| of the roofline model; SpecAdvisorCalibrationErrorHigh "
        "fires above the dashed line for 30 minutes.",
        [q(f"specadvisor_calibration_relative_error_ratio{{{T}}}", "{{target}}")],
        axis=Axis("percentunit", minimum=0), threshold_line=(0.25, "orange"),
    ), w=12, h=7)

    layout.add(timeseries(
        "Engine controller vs best static k",
        "Where the engine chooses its draft length itself (vLLM adaptive verification or Dynamic SD, TensorRT-LLM's "
        "draft_len_schedule, or suspected): the best static k's predicted service over the controller's, with the "
        "low end of its 90% band. Above the dashed line a static k serves more; SpecAdvisorEngineControllerWorse "
        "fires while the low end clears 1.03 for 30 minutes. GET /v1/audit says which k and what to do.",
        [q(f"specadvisor_engine_controller_gain_ratio{{{T}}}", "gain {{target}} ({{controller}})"),
         q(f"specadvisor_engine_controller_gain_low_ratio{{{T}}}", "low {{target}} ({{controller}})")],
        axis=Axis("suffix:x"), threshold_line=(1.0, "orange"),
    ), w=12, h=7)

    layout.row("Advisor health")
    layout.add(timeseries(
        "Scrape errors by reason (per second)",
        "Failed scrapes of the engine's /metrics by reason (timeout, connect, protocol, http_status, credentials, "
        "body_too_large, too_many_series, parse, invalid_value, missing_family, model_missing, unknown_engine, "
        "mixed_engines; internal = a bug of ours).",
        [q(f"sum by (target, reason) (rate(specadvisor_scrape_errors_total{{{T}}}[$__rate_interval]))",
           "{{target}} {{reason}}")],
        axis=Axis(minimum=0),
    ), w=8, h=7)
    layout.add(timeseries(
        "Last good scrape age",
        "Seconds since each target's last good scrape; SpecAdvisorStale fires above the dashed line for 5 minutes.",
        [q(f"specadvisor_last_good_scrape_age_seconds{{{T}}}", "{{target}}")],
        axis=Axis("s", minimum=0), threshold_line=(120.0, "orange"),
    ), w=8, h=7)
    layout.add(timeseries(
        "Loop step duration (p95)",
        "95th percentile duration of each step of the advisor's loop (gpu, scrape, estimate, advise, publish).",
        [q("histogram_quantile(0.95, sum by (le, step, instance) "
           "(rate(specadvisor_loop_step_duration_seconds_bucket[$__rate_interval])))", "{{instance}} {{step}}")],
        axis=Axis("s", minimum=0),
    ), w=8, h=7)
    layout.add(stat(
        "Firing spec-advisor alerts",
        "Alerts from deploy/prometheus/spec-advisor.rules.yaml firing now (Prometheus' ALERTS series).",
        [q('count by (alertname) (ALERTS{alertname=~"SpecAdvisor.*", alertstate="firing"})', "{{alertname}}",
           instant=True)],
        thresholds=[(None, "orange")],
    ), w=12, h=4)
    layout.add(stat(
        "Advisor build",
        "Version of each advisor Prometheus scrapes.",
        [q("count by (version) (specadvisor_build_info)", "{{version}}", instant=True)],
        text_mode="name", thresholds=[(None, "blue")],
    ), w=12, h=4)

    _actuation_row(layout)

    query_variable: Json = {"type": "query", "datasource": dict(DATASOURCE), "refresh": 2, "includeAll": True,
                            "multi": True, "allValue": ".*", "sort": 1, "current": {}, "hide": 0, "regex": ""}
    return {
        "uid": UID,
        "title": "spec-advisor",
        "description": "Speculative decoding advisor: recommendation vs deployment, acceptance, load, advisor health. "
                       "Generated by deploy/grafana/generate_dashboard.py: edit that, not this file.",
        "tags": ["spec-advisor", "vllm", "speculative-decoding"],
        "editable": True,
        "graphTooltip": 1,
        "timezone": "",
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "schemaVersion": 39,
        "version": 1,
        "links": [],
        "annotations": {"list": [
            {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
             "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
            {"name": "spec-advisor alerts", "datasource": dict(DATASOURCE), "enable": True, "iconColor": "red",
             "expr": 'ALERTS{alertname=~"SpecAdvisor.*", alertstate="firing"}', "step": "60s",
             "titleFormat": "{{alertname}}", "textFormat": "{{severity}} {{target}} {{model}}{{model_name}}",
             "tagKeys": "alertname,severity", "useValueForTime": False},
        ]},
        "templating": {"list": [
            {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "regex": "", "includeAll": False, "multi": False},
            {**query_variable, "name": "target", "label": "Target",
             "query": "label_values(specadvisor_decision_state, target)",
             "definition": "label_values(specadvisor_decision_state, target)"},
            {**query_variable, "name": "model", "label": "Model",
             "query": 'label_values(specadvisor_decision_state{target=~"$target"}, model)',
             "definition": 'label_values(specadvisor_decision_state{target=~"$target"}, model)'},
        ]},
        "panels": layout.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate deploy/grafana/spec-advisor.json.")
    parser.add_argument("--check", action="store_true", help="fail when the JSON on disk is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != text:
            print("out of date: deploy/grafana/spec-advisor.json (run: python deploy/grafana/generate_dashboard.py)",
                  file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
