"""The shipped Prometheus rules: generated from one source, parsed and unit-tested by promtool, and the same alerts in
the PrometheusRule wrapper and in Grafana's provisioning file.

promtool comes from Debian's `prometheus` package (scripts/setup-observability-tools.sh). Without it these tests
skip, except when SPEC_ADVISOR_DEPLOY_TOOLS=1 (CI), where a missing tool is a failure.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from deploy_tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "deploy" / "rules_source.yaml"
PLAIN = ROOT / "deploy" / "prometheus" / "spec-advisor.rules.yaml"
OPERATOR = ROOT / "deploy" / "prometheus" / "spec-advisor.prometheusrule.yaml"
GRAFANA = ROOT / "deploy" / "grafana" / "provisioning" / "alerting" / "spec-advisor-alerts.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
PROMTOOL_TESTS = sorted((Path(__file__).resolve().parent / "promtool").glob("*.yaml"))
SEVERITIES = {"critical", "warning", "info"}
# Alerts whose value is only an indicator (up == 0; a one-hot state): their numbers are in the labels they print.
INDICATOR_ALERTS = {
    "SpecAdvisorDown", "SpecAdvisorDecisionError", "SpecAdvisorActuationPausedLong", "SpecAdvisorOverrideActiveLong",
}


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_rules", ROOT / "deploy" / "generate_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses resolve their annotations through sys.modules while the module executes.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_tool("promtool", setup_script="scripts/setup-observability-tools.sh")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)


def _alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def _records(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {rule["record"]: rule for group in groups for rule in group["rules"] if "record" in rule}


# ----------------------------------------------------------------------------------------------------------------
# Generated files and promtool
# ----------------------------------------------------------------------------------------------------------------


def test_generated_rule_files_are_up_to_date() -> None:
    result = _run(sys.executable, str(ROOT / "deploy" / "generate_rules.py"), "--check")
    assert result.returncode == 0, result.stderr


def test_promtool_accepts_the_plain_rules_and_the_prometheusrule_groups(promtool: str, tmp_path: Path) -> None:
    # The PrometheusRule's spec is a rule file's content: check it as one, so the wrapper is parsed as well.
    unwrapped = tmp_path / "from-prometheusrule.yaml"
    unwrapped.write_text(yaml.safe_dump(_load(OPERATOR)["spec"]), encoding="utf-8")
    result = _run(promtool, "check", "rules", str(PLAIN), str(unwrapped))
    assert result.returncode == 0, result.stdout + result.stderr
    # 12 recording rules + 8 advisor alerts + 6 auto-toggle alerts, counted in deploy/rules_source.yaml.
    assert result.stdout.count("SUCCESS: 26 rules found") == 2, result.stdout


def test_promtool_unit_tests_pass(promtool: str) -> None:
    assert PROMTOOL_TESTS, "no promtool unit tests found"
    result = _run(promtool, "test", "rules", *map(str, PROMTOOL_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    tested_exprs: list[str] = []
    for path in PROMTOOL_TESTS:
        for test in _load(path)["tests"]:
            for case in test.get("alert_rule_test", ()):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
            tested_exprs.extend(case["expr"] for case in test.get("promql_expr_test", ()))
    alerts = set(_alerts(_load(PLAIN)["groups"]))
    assert alerts - firing == set(), "alerts without a firing case"
    assert alerts - quiet == set(), "alerts without a not-firing case"
    untested = {name for name in _records(_load(PLAIN)["groups"]) if not any(name in e for e in tested_exprs)}
    assert untested == set(), "recording rules without a promql_expr_test"


def test_grafana_alert_expressions_behave_like_the_prometheus_ones(promtool: str, tmp_path: Path) -> None:
    """Grafana's copies have the recording rules inlined (subqueries for ranges): run the same promtool unit tests
    against a rule file whose alerts use Grafana's expressions, so an inlining mistake fails a test."""
    grafana_exprs = {
        rule["title"]: rule["data"][0]["model"]["expr"]
        for group in _load(GRAFANA)["groups"] for rule in group["rules"]
    }
    plain = _load(PLAIN)
    for group in plain["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["expr"] = grafana_exprs[rule["alert"]]
    rules = tmp_path / "grafana-exprs.rules.yaml"
    rules.write_text(yaml.safe_dump(plain, sort_keys=False), encoding="utf-8")
    copies = []
    for path in PROMTOOL_TESTS:
        document = _load(path)
        document["rule_files"] = [str(rules)]
        copy = tmp_path / path.name
        copy.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        copies.append(str(copy))
    result = _run(promtool, "test", "rules", *copies)
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------------------------------------------
# Content every alert must carry
# ----------------------------------------------------------------------------------------------------------------


def _runbook_sections() -> dict[str, str]:
    text = RUNBOOK.read_text(encoding="utf-8")
    parts = re.split(r"^## (\S+)\s*$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_every_alert_has_severity_numbers_and_a_runbook_section() -> None:
    sections = _runbook_sections()
    alerts = _alerts(_load(PLAIN)["groups"])
    assert set(alerts) >= {
        "SpecAdvisorSpeculationCostsThroughput", "SpecAdvisorAcceptanceCollapsed", "SpecAdvisorDown",
        "SpecAdvisorStale", "SpecAdvisorDecisionError", "SpecAdvisorCalibrationErrorHigh",
        "SpecAdvisorRecommendationNotApplied",
        # the opt-in auto-toggle (docs/actuation.md)
        "SpecAdvisorActuatorErrors", "SpecAdvisorAuditWriteFailing", "SpecAdvisorListenerErrors",
        "SpecAdvisorActuationPausedLong", "SpecAdvisorOverrideActiveLong",
    }
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert "$labels." in annotations["summary"], name
        # "With the numbers": the value, and the labels that say where.
        assert "$labels." in annotations["description"], name
        assert ("$value" in annotations["description"]) is (name not in INDICATOR_ALERTS), name
        assert annotations["runbook_url"].endswith(f"docs/runbook.md#{name.lower()}"), name
        section = sections.get(name)
        assert section is not None, f"docs/runbook.md has no `## {name}`"
        for part in ("**Meaning.**", "**Likely causes.**", "**Check.**", "**What to do.**"):
            assert part in section, f"{name}: runbook section lacks {part}"
        assert re.match(r"^\d+[mh]$", rule["for"]), f"{name}: alerts must be sustained (`for`)"


def test_rule_names_follow_the_conventions() -> None:
    for name in _records(_load(PLAIN)["groups"]):
        assert not name.startswith("vllm:"), name
        assert len(name.split(":")) == 3, f"{name} is not level:metric:operations"
    for name in _alerts(_load(PLAIN)["groups"]):
        assert name.startswith("SpecAdvisor"), name


def test_prometheusrule_wraps_the_same_groups() -> None:
    operator = _load(OPERATOR)
    assert operator["apiVersion"] == "monitoring.coreos.com/v1"
    assert operator["kind"] == "PrometheusRule"
    assert operator["metadata"]["name"] == "spec-advisor"
    assert operator["spec"]["groups"] == _load(PLAIN)["groups"]


def test_grafana_alerts_are_the_prometheus_alerts() -> None:
    document = _load(GRAFANA)
    assert document["apiVersion"] == 1
    source_uid = _load(SOURCE)["grafana"]["datasource_uid"]
    prometheus = _alerts(_load(PLAIN)["groups"])
    recorded = set(_records(_load(PLAIN)["groups"]))
    seen: set[str] = set()
    for group in document["groups"]:
        assert group["folder"] and group["interval"] and group["orgId"] == 1
        for rule in group["rules"]:
            name = rule["title"]
            seen.add(name)
            expected = prometheus[name]
            assert re.fullmatch(r"[a-z0-9_-]{1,40}", rule["uid"]), rule["uid"]
            assert rule["for"] == expected["for"]
            assert rule["labels"] == expected["labels"]
            assert rule["noDataState"] == "OK", "a filtering PromQL alert returns no data when all is well"
            refs = {query["refId"]: query for query in rule["data"]}
            assert rule["condition"] in refs
            query = refs["A"]
            assert query["datasourceUid"] == source_uid
            assert query["model"]["datasource"] == {"type": "prometheus", "uid": source_uid}
            assert query["model"]["instant"] is True
            # Recording rules are inlined: Grafana alerting must not depend on them being loaded.
            assert not recorded & set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", query["model"]["expr"])), name
            assert (refs["B"]["model"]["type"], refs["B"]["model"]["expression"]) == ("reduce", "A")
            annotations = rule["annotations"]
            # Grafana expands ${VAR} from the environment in provisioning files: no `$` may reach it.
            assert all("$" not in text for text in annotations.values()), name
            assert annotations["runbook_url"] == expected["annotations"]["runbook_url"]
            assert ".Labels." in annotations["description"], name
            assert (".Values.B.Value" in annotations["description"]) is (name not in INDICATOR_ALERTS), name
    assert seen == set(prometheus)


# ----------------------------------------------------------------------------------------------------------------
# The generator's own rules
# ----------------------------------------------------------------------------------------------------------------


def test_inlining_expands_recorded_series_and_ranges_into_subqueries() -> None:
    recorded = {"a:b:rate5m": "sum(rate(x_total[5m]))", "c:d:ratio": "a:b:rate5m / 2"}
    inline = GEN.inline_recorded
    assert inline("c:d:ratio > 1", recorded, resolution="1m") == "((sum(rate(x_total[5m]))) / 2) > 1"
    assert inline("avg_over_time(a:b:rate5m[6h])", recorded, resolution="1m") == (
        "avg_over_time((sum(rate(x_total[5m])))[6h:1m])"
    )
    # Names inside strings are data, not series.
    assert inline('label_replace(y, "l", "a:b:rate5m", "", "")', recorded, resolution="1m") == (
        'label_replace(y, "l", "a:b:rate5m", "", "")'
    )
    with pytest.raises(GEN.SourceError):
        inline('a:b:rate5m{job="x"}', recorded, resolution="1m")


def test_grafana_templates_use_the_data_dot_form() -> None:
    assert GEN.grafana_template('{{ $labels.target }} at {{ $value | printf "%.2f" }}') == (
        '{{ .Labels.target }} at {{ .Values.B.Value | printf "%.2f" }}'
    )
    with pytest.raises(GEN.SourceError):
        GEN.grafana_template("{{ $externalLabels.cluster }}")


@pytest.mark.parametrize(
    ("rule", "complaint"),
    [
        ({"record": "vllm:my_rule:rate5m", "expr": "x"}, "never `vllm:"),
        ({"record": "plain_name", "expr": "x"}, "level:metric:operations"),
        ({"alert": "SpecAdvisorX", "expr": "x", "for": "5m", "severity": "page", "summary": "s",
          "description": "d"}, "severity"),
        ({"alert": "SpecAdvisorX", "expr": "x", "for": "soon", "severity": "info", "summary": "s",
          "description": "d"}, "duration"),
        ({"alert": "SpecAdvisorX", "expr": "x", "for": "5m", "severity": "info", "summary": "s"}, "description"),
    ],
)
def test_generator_rejects_a_bad_rule(rule: dict[str, str], complaint: str, tmp_path: Path) -> None:
    source = _load(SOURCE)
    source["groups"] = [{"name": "g", "rules": [rule]}]
    path = tmp_path / "rules_source.yaml"
    path.write_text(yaml.safe_dump(source), encoding="utf-8")
    with pytest.raises(GEN.SourceError, match=re.escape(complaint)):
        GEN.load_source(path)


def test_generator_requires_a_runbook_section_per_alert(tmp_path: Path) -> None:
    runbook = tmp_path / "runbook.md"
    runbook.write_text("# Runbook\n\n## SpecAdvisorDown\n\ntext\n", encoding="utf-8")
    with pytest.raises(GEN.SourceError, match="SpecAdvisorStale"):
        GEN.check_runbook(GEN.load_source(), runbook)
