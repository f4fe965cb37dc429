"""The Grafana dashboard (structure, provisioning-readiness, what it shows) and, for every PromQL expression shipped in
deploy/ (panel queries, variables, annotations, Prometheus rules, Grafana alert rules), that each metric it names
really exists: in the sidecar's own /metrics (its registry rendered from a fully populated Board), in a real vLLM
0.32 capture (tests/fixtures/vllm/), in a recording rule of the same rule file, or among Prometheus' own series.

`@grafana/schema` (npm) ships TypeScript types and no JSON schema, so the dashboard is checked structurally here.

Metric names are found by `promql_selectors`, a small PromQL tokenizer: string literals, ranges/subqueries and
`offset` durations are skipped, `by`/`without`/`on`/`ignoring`/`group_left`/`group_right` label lists are skipped,
an identifier followed by `(` or in the PromQL function list is a function, any other identifier is a metric name,
and a following `{...}` is read as its label matchers. Its limits: it does not parse operator precedence (it needs
no tree to find names), refuses a selector without a metric name (`{__name__=...}`) instead of resolving it, knows
no `@` modifier, and checks matcher labels only for series whose label sets it knows (not recorded series or
ALERTS). Syntax itself is promtool's job: every panel query is also parsed by `promtool check rules`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import require_tool
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from policies.act.deployment import ApplyResult, DeploymentObservation, SpeculationSetting
from policies.act.gate import ActuationConfig
from policies.decide.audit import SpeculationController, audit_controller
from policies.types import (
    AcceptanceEvidence,
    CurvePoint,
    DataState,
    Decision,
    Evidence,
    GpuSnapshot,
)
from service.actuators.audit import AuditLog
from service.actuators.runner import ActuationRunner, RunnerOptions
from service.board import Board, Pricing
from service.exporter import build_registry

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "spec-advisor.json"
PROVIDER = ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "spec-advisor.yaml"
PLAIN_RULES = ROOT / "deploy" / "prometheus" / "spec-advisor.rules.yaml"
OPERATOR_RULES = ROOT / "deploy" / "prometheus" / "spec-advisor.prometheusrule.yaml"
GRAFANA_ALERTS = ROOT / "deploy" / "grafana" / "provisioning" / "alerting" / "spec-advisor-alerts.yaml"
VLLM_CAPTURES = sorted((ROOT / "tests" / "fixtures" / "vllm").glob("vllm-0.32.0-*.txt"))

# Series Prometheus itself writes, and labels its scrape adds (kubernetes_sd relabelling in a PodMonitor adds the
# Kubernetes ones).
PROMETHEUS_SERIES = {"up", "ALERTS", "ALERTS_FOR_STATE"}
SCRAPE_LABELS = {"job", "instance", "namespace", "pod", "container", "service", "endpoint", "node"}

NOW_S = 1_800_000_000.0


# ----------------------------------------------------------------------------------------------------------------
# A small PromQL tokenizer: which metric names (with which matchers) and which functions an expression uses
# ----------------------------------------------------------------------------------------------------------------

_LEXEME = re.compile(
    r"""
      (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    | (?P<comment>\#[^\n]*)
    | (?P<range>\[[^\]]*\])
    | (?P<duration>[0-9]+(?:ms|[smhdwy])(?:[0-9]+(?:ms|[smhdwy]))*(?![A-Za-z0-9_:]))
    | (?P<number>0x[0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
    | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<space>\s+)
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "avg_over_time", "ceil",
    "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time", "day_of_month", "day_of_week",
    "day_of_year", "days_in_month", "deg", "delta", "deriv", "exp", "floor", "histogram_quantile", "holt_winters",
    "hour", "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2",
    "max_over_time", "min_over_time", "minute", "month", "pi", "predict_linear", "present_over_time",
    "quantile_over_time", "rad", "rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_desc",
    "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector",
    "year",
    # aggregations
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}


@dataclass(frozen=True, slots=True)
class Selector:
    metric: str
    matchers: Mapping[str, tuple[str, str]]  # label -> (operator, value without quotes)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for match in _LEXEME.finditer(expr):
        kind = match.lastgroup or "other"
        if kind not in ("space", "comment"):
            out.append((kind, match.group()))
    return out


def _skip_parens(tokens: list[tuple[str, str]], start: int) -> int:
    """Index after the parenthesised list opening at `start`."""
    assert tokens[start][1] == "("
    close = next(i for i in range(start, len(tokens)) if tokens[i][1] == ")")
    return close + 1


def _matchers(tokens: list[tuple[str, str]], start: int) -> tuple[dict[str, tuple[str, str]], int]:
    """Label matchers of the `{...}` opening at `start`, and the index after it."""
    assert tokens[start][1] == "{"
    found: dict[str, tuple[str, str]] = {}
    i = start + 1
    while tokens[i][1] != "}":
        if tokens[i][1] == ",":
            i += 1
            continue
        label = tokens[i][1]
        assert tokens[i][0] == "ident", f"label name expected, got {tokens[i]!r}"
        operator = ""
        i += 1
        while tokens[i][0] == "other" and tokens[i][1] in "=!~":
            operator += tokens[i][1]
            i += 1
        assert operator in ("=", "!=", "=~", "!~"), f"bad matcher operator {operator!r}"
        assert tokens[i][0] == "string", f"matcher value expected, got {tokens[i]!r}"
        found[label] = (operator, tokens[i][1][1:-1])
        i += 1
    return found, i + 1


def promql_selectors(expr: str) -> tuple[list[Selector], set[str]]:
    """The metric selectors and the function names in `expr` (see the module docstring for the limits)."""
    tokens = _tokens(expr)
    selectors: list[Selector] = []
    functions: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "other" and text == "{":
            raise AssertionError(f"selector without a metric name in {expr!r}")
        if kind != "ident":
            i += 1
            continue
        lowered = text.lower()
        if lowered in GROUPING:
            i = _skip_parens(tokens, i + 1) if following == "(" else i + 1
        elif lowered in KEYWORDS:
            i += 2 if lowered == "offset" else 1
        elif text in FUNCTIONS or following == "(":
            functions.add(text)
            i += 1
        elif following == "{":
            found, i = _matchers(tokens, i + 1)
            selectors.append(Selector(text, found))
        else:
            selectors.append(Selector(text, {}))
            i += 1
    return selectors, functions


def test_tokenizer_finds_metrics_not_functions_labels_strings_or_durations() -> None:
    expr = (
        'sum by (le, step) (rate(a_seconds_bucket{job=~"x|y", model!="m"}[$__rate_interval])) '
        '/ ignoring (gamma) group_left (gamma) b:c:d offset 5m and on () count_values without () ("g", e) '
        '> 1e3 unless label_replace(f == 0, "state", "none_such", "", "") '
        "or max_over_time((g and h == 1)[6h:1m])"
    )
    selectors, functions = promql_selectors(expr)
    assert [s.metric for s in selectors] == ["a_seconds_bucket", "b:c:d", "e", "f", "g", "h"]
    assert selectors[0].matchers == {"job": ("=~", "x|y"), "model": ("!=", "m")}
    assert functions == {"sum", "rate", "count_values", "label_replace", "max_over_time"}


def test_tokenizer_refuses_a_selector_without_a_name() -> None:
    with pytest.raises(AssertionError, match="without a metric name"):
        promql_selectors('{__name__=~"specadvisor_.*"}')


# ----------------------------------------------------------------------------------------------------------------
# What really exists: the sidecar's registry, the vLLM captures, the recording rules
# ----------------------------------------------------------------------------------------------------------------


def _label_sets(text: str) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def _populated_board() -> Board:
    """One target with every optional field set, so every family the exporter can emit is emitted."""
    acceptance = AcceptanceEvidence(
        per_position=(0.8, 0.6, 0.4), per_position_low=(0.78, 0.57, 0.37), per_position_high=(0.82, 0.63, 0.43),
        drafts=1000.0, draft_tokens=3000.0, accepted_tokens=1800.0, mean_acceptance_length=2.8,
        acceptance_rate=0.6, mean_proposed_length=3.0, window_s=60.0,
    )
    gpu = GpuSnapshot(
        taken_at_s=NOW_S, source="nvml", device_name="NVIDIA H100 80GB HBM3", device_count=1, gpu_util_ratio=0.97,
        tensor_active_ratio=0.31, dram_active_ratio=0.72, sm_active_ratio=0.8, activity_source="gpm",
    )
    evidence = Evidence(
        target="llama", model="meta-llama/Llama-3.1-8B-Instruct", at_s=NOW_S, state=DataState.OK,
        speculation_on=True, deployed_k=3, acceptance=acceptance, batch=12.0, waiting=2.0, step_time_s=0.025,
        gpu=gpu,
    )
    point = CurvePoint(gamma=3, speedup=1.42, speedup_low=1.31, speedup_high=1.55, expected_accepted_length=2.8,
                       step_time_s=0.03)
    decision = Decision(
        target="llama", model="meta-llama/Llama-3.1-8B-Instruct", state=DataState.OK, enabled=True,
        num_speculative_tokens=3, expected_speedup=1.42, expected_speedup_low=1.31, expected_speedup_high=1.55,
        reason="on", evaluated_at_s=NOW_S, curve=(point,), objective="latency", calibration_error_ratio=0.1,
    )
    board = Board([("llama", None)], started_at_s=NOW_S - 100)
    board.publish("llama", evidence=evidence, decision=decision, good_scrape_s=NOW_S - 10,
                  pricing=Pricing(engine_activity={"tensor_active": 0.4, "dram_active": 0.7},
                                  audit=audit_controller(evidence, decision, None,
                                                         controller=SpeculationController.DYNAMIC_SD)))
    board.record_error("llama", "timeout", "slow")
    board.timings.observe("scrape", 0.01)
    board.finish_iteration(NOW_S)
    return board


class _IdleActuator:
    """An actuator that is never called: the exporter only reads the runner's per-target status."""

    mode = "kubernetes"
    target_ref = "deployment/llm/vllm"

    async def observe(self, now_s: float) -> DeploymentObservation:
        raise AssertionError("not called by the exporter")

    async def apply(
        self, desired: SpeculationSetting, observed: DeploymentObservation, *, dry_run: bool
    ) -> ApplyResult:
        raise AssertionError("not called by the exporter")


@pytest.fixture(scope="module")
def sidecar_metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """The sidecar's families with the auto-toggle on (an actuation runner over the board's target) and an
    iteration listener that has failed once, so the actuation families are in the inventory too."""
    board = _populated_board()
    board.record_listener_error("ActuationRunner")
    audit = AuditLog(tmp_path_factory.mktemp("state") / "actions.jsonl")
    audit.open()
    runner = ActuationRunner(board, {"llama": _IdleActuator()},
                             options=RunnerOptions(mode="kubernetes", config=ActuationConfig(dry_run=True)),
                             audit=audit)
    registry = build_registry(board, clock=lambda: NOW_S, version="test", actuation=runner)
    try:
        return _label_sets(generate_latest(registry).decode())
    finally:
        audit.close()


@pytest.fixture(scope="module")
def vllm_metrics() -> dict[str, set[str]]:
    assert VLLM_CAPTURES, "no real vLLM captures"
    names: dict[str, set[str]] = {}
    for capture in VLLM_CAPTURES:
        for name, labels in _label_sets(capture.read_text(encoding="utf-8")).items():
            names.setdefault(name, set()).update(labels)
    return names


def _rule_groups(path: Path) -> list[dict[str, Any]]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    groups: list[dict[str, Any]] = document["spec"]["groups"] if "spec" in document else document["groups"]
    return groups


def _recorded_names() -> set[str]:
    return {rule["record"] for group in _rule_groups(PLAIN_RULES) for rule in group["rules"] if "record" in rule}


@pytest.fixture(scope="module")
def known(sidecar_metrics: dict[str, set[str]], vllm_metrics: dict[str, set[str]]) -> dict[str, set[str] | None]:
    """Metric name -> its label names (None: labels not known, matchers not checked)."""
    names: dict[str, set[str] | None] = {**sidecar_metrics, **vllm_metrics}
    names.update(dict.fromkeys(_recorded_names() | PROMETHEUS_SERIES))
    return names


def test_the_inventory_is_the_real_one(sidecar_metrics: dict[str, set[str]], vllm_metrics: dict[str, set[str]]) -> None:
    # Spot checks that the inventory was built from real output, not an empty page.
    assert sidecar_metrics["specadvisor_acceptance_per_position_ratio"] >= {"target", "model", "position"}
    assert sidecar_metrics["specadvisor_gpu_utilization_ratio"] >= {"signal", "source"}
    assert "specadvisor_scrape_errors_total" in sidecar_metrics
    assert "specadvisor_loop_step_duration_seconds_bucket" in sidecar_metrics
    # The calibration alert's and panel's series, rendered from the board's decision.
    assert sidecar_metrics["specadvisor_calibration_relative_error_ratio"] >= {"target", "model"}
    assert sidecar_metrics["specadvisor_objective_info"] >= {"target", "model", "objective"}
    # The engine-controller audit's families (a Dynamic SD target whose controller runs the best static k).
    assert sidecar_metrics["specadvisor_engine_controller_worse"] >= {"target", "model", "controller"}
    assert sidecar_metrics["specadvisor_engine_controller_gain_ratio"] >= {"target", "model", "controller"}
    # The auto-toggle's families, from a real ActuationRunner.
    assert sidecar_metrics["specadvisor_actions_total"] >= {"target", "mode", "result"}
    assert sidecar_metrics["specadvisor_actions_skipped_total"] >= {"target", "reason"}
    assert sidecar_metrics["specadvisor_actuator_errors_total"] >= {"target", "reason"}
    assert sidecar_metrics["specadvisor_listener_errors_total"] >= {"listener"}
    assert "specadvisor_audit_write_errors_total" in sidecar_metrics
    for gauge in ("paused", "override_active", "cooldown_remaining_seconds", "dry_run"):
        assert sidecar_metrics[f"specadvisor_actuation_{gauge}"] >= {"target"}, gauge
    assert vllm_metrics["vllm:spec_decode_num_accepted_tokens_per_pos_total"] >= {"model_name", "position"}
    assert "vllm:inter_token_latency_seconds_sum" in vllm_metrics


def _check_expression(expr: str, known: Mapping[str, set[str] | None], where: str) -> list[str]:
    problems: list[str] = []
    selectors, functions = promql_selectors(expr)
    problems += [f"{where}: unknown function {name}()" for name in sorted(functions - FUNCTIONS)]
    for selector in selectors:
        if selector.metric not in known:
            problems.append(f"{where}: {selector.metric} is neither exported by the sidecar, nor in the vLLM "
                            "capture, nor recorded by our rules")
            continue
        labels = known[selector.metric]
        if labels is not None:
            unknown = set(selector.matchers) - labels - SCRAPE_LABELS
            problems += [f"{where}: {selector.metric} has no label {label}" for label in sorted(unknown)]
    return problems


# ----------------------------------------------------------------------------------------------------------------
# The dashboard
# ----------------------------------------------------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return document


def _panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())  # a collapsed row keeps its panels inside


def _queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target, variable query and annotation query."""
    for panel in _panels(dashboard):
        for target in panel.get("targets", ()):
            yield f"panel {panel['id']} '{panel['title']}' {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"])
            assert match, f"variable {variable['name']}: only label_values(selector, label) queries are used"
            yield f"variable {variable['name']}", match.group(1)
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            yield f"annotation {annotation['name']}", annotation["expr"]


def test_generated_dashboard_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "grafana" / "generate_dashboard.py"), "--check"],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_dashboard_is_provisioning_ready() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "spec-advisor" and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert "id" not in dashboard or dashboard["id"] is None, "a provisioned dashboard must not carry a database id"
    assert "__inputs" not in dashboard, "import-style ${DS_...} inputs do not resolve under file provisioning"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("target", "model"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert variables[name]["includeAll"] and variables[name]["multi"] and variables[name]["allValue"] == ".*"

    def datasources(node: object) -> Iterator[object]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "datasource":
                    yield value
                else:
                    yield from datasources(value)
        elif isinstance(node, list):
            for item in node:
                yield from datasources(item)

    # No hard-coded datasource uid anywhere: Prometheus through the variable, Grafana's built-in annotations.
    allowed = [{"type": "prometheus", "uid": "${datasource}"}, {"type": "grafana", "uid": "-- Grafana --"}]
    assert all(ds in allowed for ds in datasources(dashboard["panels"]) if ds is not None)
    assert all(ds in allowed for ds in datasources(dashboard["annotations"]))
    assert all(ds in allowed for ds in datasources(dashboard["templating"]))


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = list(_panels(_dashboard()))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    boxes = []
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        boxes.append((panel["title"], grid["x"], grid["y"], grid["x"] + grid["w"], grid["y"] + grid["h"]))
    for i, (name_a, ax0, ay0, ax1, ay1) in enumerate(boxes):
        for name_b, bx0, by0, bx1, by1 in boxes[i + 1 :]:
            assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, f"'{name_a}' overlaps '{name_b}'"


def test_every_panel_has_queries_and_a_description() -> None:
    known_types = {"row", "timeseries", "stat", "state-timeline", "bargauge"}
    for panel in _panels(_dashboard()):
        assert panel["type"] in known_types, panel["type"]
        if panel["type"] == "row":
            continue
        assert panel["description"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


def test_dashboard_shows_what_an_operator_needs() -> None:
    dashboard = _dashboard()
    used = {s.metric for _, expr in _queries(dashboard) for s in promql_selectors(expr)[0]}
    assert used >= {
        "specadvisor_recommended_enabled", "specadvisor_deployed_speculation_enabled",  # recommended vs actual
        "specadvisor_recommended_num_speculative_tokens", "specadvisor_deployed_num_speculative_tokens",  # gamma
        "specadvisor_expected_speedup", "specadvisor_expected_speedup_low", "specadvisor_expected_speedup_high",
        "specadvisor_predicted_speedup", "target:specadvisor_predicted_speedup:at_deployed_gamma",
        "specadvisor_acceptance_per_position_ratio",
        "model_name_position:vllm_spec_decode_acceptance_per_position:ratio_rate5m",
        "specadvisor_batch_requests",  # batch vs crossover
        "specadvisor_gpu_utilization_ratio",  # saturation
        "specadvisor_decision_state",
        "specadvisor_scrape_errors_total", "specadvisor_last_good_scrape_age_seconds",  # scrape health
        "specadvisor_calibration_relative_error_ratio",
        # the auto-toggle: what it did, what held it back, what failed, its switches
        "specadvisor_actions_total", "specadvisor_actions_skipped_total", "specadvisor_actuator_errors_total",
        "specadvisor_actuation_paused", "specadvisor_actuation_override_active", "specadvisor_actuation_dry_run",
        "specadvisor_actuation_cooldown_remaining_seconds", "specadvisor_audit_write_errors_total",
        "specadvisor_listener_errors_total",
    }
    alert_annotations = [a for a in dashboard["annotations"]["list"] if "ALERTS" in a.get("expr", "")]
    assert alert_annotations and alert_annotations[0]["enable"]


def test_dashboard_queries_filter_by_the_target_and_model_variables(known: dict[str, set[str] | None]) -> None:
    dashboard = _dashboard()
    for where, expr in _queries(dashboard):
        if where.startswith("variable"):
            continue
        for selector in promql_selectors(expr)[0]:
            labels = known.get(selector.metric) or set()
            if "target" in labels:
                assert selector.matchers.get("target") == ("=~", "$target"), f"{where}: {selector.metric}"
            if "model" in labels:  # the actuation families are per target, with no model label
                assert selector.matchers.get("model") == ("=~", "$model"), f"{where}: {selector.metric}"
            elif selector.metric.startswith("model_name"):
                assert selector.matchers.get("model_name") == ("=~", "$model"), f"{where}: {selector.metric}"


def test_dashboard_queries_reference_real_metrics(known: dict[str, set[str] | None]) -> None:
    problems = [p for where, expr in _queries(_dashboard()) for p in _check_expression(expr, known, where)]
    assert problems == []


def test_rule_expressions_reference_real_metrics(known: dict[str, set[str] | None]) -> None:
    problems: list[str] = []
    for path in (PLAIN_RULES, OPERATOR_RULES):
        for group in _rule_groups(path):
            for rule in group["rules"]:
                where = f"{path.name} {rule.get('alert') or rule.get('record')}"
                problems += _check_expression(rule["expr"], known, where)
    grafana = yaml.safe_load(GRAFANA_ALERTS.read_text(encoding="utf-8"))
    recorded = _recorded_names()
    without_recorded = {k: v for k, v in known.items() if k not in recorded}
    for group in grafana["groups"]:
        for rule in group["rules"]:
            for query in rule["data"]:
                if "expr" in query["model"]:
                    # Grafana's copies must not lean on recording rules: check them against raw series only.
                    problems += _check_expression(query["model"]["expr"], without_recorded,
                                                  f"{GRAFANA_ALERTS.name} {rule['title']}")
    assert problems == []


def _promtool() -> str:
    return require_tool("promtool", setup_script="scripts/setup-observability-tools.sh")


def test_every_dashboard_query_parses_with_promtool(tmp_path: Path) -> None:
    promtool = _promtool()
    substitutions = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$target": ".*",
                     "$model": ".*"}
    rules = []
    for index, (where, query) in enumerate(_queries(_dashboard())):
        expr = query
        for variable, value in substitutions.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"{where}: unhandled Grafana variable in {expr!r}"
        rules.append({"record": f"dashboard:query_{index}:check", "expr": expr})
    path = tmp_path / "dashboard-queries.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8")
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------------------------------------------
# Provisioning files
# ----------------------------------------------------------------------------------------------------------------


def test_dashboard_provider_is_a_file_provider() -> None:
    provider = yaml.safe_load(PROVIDER.read_text(encoding="utf-8"))
    assert provider["apiVersion"] == 1
    (entry,) = provider["providers"]
    assert entry["type"] == "file" and entry["folder"] and entry["options"]["path"].startswith("/")


def test_kustomizations_ship_the_generated_files() -> None:
    grafana = yaml.safe_load((ROOT / "deploy" / "grafana" / "kustomization.yaml").read_text(encoding="utf-8"))
    (generator,) = grafana["configMapGenerator"]
    assert generator["files"] == ["spec-advisor.json"]
    assert generator["options"]["labels"] == {"grafana_dashboard": "1"}
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "kustomization.yaml").read_text(encoding="utf-8"))
    assert prometheus["resources"] == [OPERATOR_RULES.name]


def test_panels_the_runbook_names_exist() -> None:
    """docs/runbook.md tells the on-call which panels to look at: those titles must be on the dashboard."""
    titles = {panel["title"] for panel in _panels(_dashboard())}
    runbook = (ROOT / "docs" / "runbook.md").read_text(encoding="utf-8")
    # "Dashboard: "A" (...), "B" ..." up to the end of that bullet or sentence group.
    named = [title for passage in re.findall(r"Dashboard: (.*?)(?:;|\n- |\n\n)", runbook, flags=re.DOTALL)
             for title in re.findall(r'"([^"]+)"', passage)]
    assert len(named) >= 8
    assert [title for title in named if title not in titles] == []
