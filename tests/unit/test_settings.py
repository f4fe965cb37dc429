"""Settings: YAML < env < overrides, constrained fields, cross-field rules, readable errors."""

from __future__ import annotations

import os
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from policies.types import DraftMethod, GpuSnapshot
from service.app import context_resolver
from service.settings import Settings, SettingsError, load_settings, target_name_for_url

ONE_TARGET = [{"name": "a", "url": "http://127.0.0.1:8000"}]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's shell must not leak settings into these tests.
    for key in list(os.environ):
        if key.startswith("SPEC_ADVISOR_"):
            monkeypatch.delenv(key)


def test_defaults_with_one_target() -> None:
    settings = load_settings(overrides={"targets": ONE_TARGET})
    assert isinstance(settings, Settings)
    assert settings.scrape_interval_s == 5.0
    assert settings.estimator.window_s == 60.0
    assert settings.decide.dwell_s == 120.0
    assert settings.targets[0].hardware == "auto"
    assert settings.targets[0].drafter.method is DraftMethod.NGRAM
    assert settings.gpu.telemetry == "nvml"


def test_itl_slo_and_calibration_reach_the_policy_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = load_settings(overrides={"targets": ONE_TARGET})
    assert defaults.objective.itl_slo_s is None  # no SLO: judged by throughput
    assert defaults.objective.to_config().itl_slo_s is None
    assert defaults.calibration.to_config().half_life_s == 900.0

    monkeypatch.setenv("SPEC_ADVISOR_OBJECTIVE__ITL_SLO_S", "0.05")
    monkeypatch.setenv("SPEC_ADVISOR_CALIBRATION__HALF_LIFE_S", "300")
    settings = load_settings(overrides={"targets": ONE_TARGET})
    assert settings.objective.itl_slo_s == 0.05
    assert settings.objective.to_config().itl_slo_s == 0.05
    assert settings.calibration.to_config().half_life_s == 300.0


def test_the_slo_under_decide_is_refused_with_its_new_place(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match=r"decide.itl_slo_s moved: use objective.itl_slo_s"):
        load_settings(overrides={"targets": ONE_TARGET, "decide": {"itl_slo_s": 0.05}})
    monkeypatch.setenv("SPEC_ADVISOR_DECIDE__ITL_SLO_S", "0.05")
    with pytest.raises(SettingsError, match=r"decide.itl_slo_s moved: use objective.itl_slo_s"):
        load_settings(overrides={"targets": ONE_TARGET})


def test_yaml_file_env_and_overrides_layer_in_that_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(
        tmp_path / "advisor.yaml",
        """
targets:
  - name: llama
    url: http://vllm:8000
    model: meta-llama/Llama-3.1-8B-Instruct
    hardware: h100-sxm
    drafter: {method: eagle3}
scrape_interval_s: 10
port: 9000
decide:
  margin: 0.1
  dwell_s: 300
""",
    )
    monkeypatch.setenv("SPEC_ADVISOR_DECIDE__DWELL_S", "600")  # env beats the file, nested with __
    monkeypatch.setenv("SPEC_ADVISOR_PORT", "9001")
    settings = load_settings(config, overrides={"port": 9002})  # flags beat env

    assert settings.decide.dwell_s == 600.0
    assert settings.decide.margin == 0.1  # untouched file value survives the nested env merge
    assert settings.scrape_interval_s == 10.0
    assert settings.port == 9002
    assert settings.targets[0].drafter.method is DraftMethod.EAGLE3
    assert settings.targets[0].metrics_url == "http://vllm:8000/metrics"


def test_targets_from_env_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ADVISOR_TARGETS", '[{"name": "x", "url": "http://h:1/metrics"}]')
    settings = load_settings()
    assert [t.name for t in settings.targets] == ["x"]
    assert settings.targets[0].metrics_url == "http://h:1/metrics"  # a /metrics URL is kept as is


def test_window_must_hold_two_scrapes() -> None:
    # 5 s interval -> the window needs >= 2 x 5 = 10 s; 9 s is one scrape short.
    with pytest.raises(SettingsError, match=r"window_s \(9\) must be at least 2 x scrape_interval_s \(5\)"):
        load_settings(overrides={"targets": ONE_TARGET, "estimator": {"window_s": 9}})


def test_target_names_must_be_unique() -> None:
    with pytest.raises(SettingsError, match="repeated: a"):
        load_settings(overrides={"targets": [*ONE_TARGET, {"name": "a", "url": "http://other:8000"}]})


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"targets": []}, "targets"),
        ({"targets": [{"name": "a", "url": "ftp://x"}]}, "targets.0.url"),
        ({"targets": [{"name": "bad name", "url": "http://x"}]}, "targets.0.name"),
        ({"targets": ONE_TARGET, "scrape_interval_s": 0}, "scrape_interval_s"),
        ({"targets": ONE_TARGET, "port": 70000}, "port"),
        ({"targets": ONE_TARGET, "log_format": "xml"}, "log_format"),
        ({"targets": ONE_TARGET, "decide": {"dwell": 3}}, "decide.dwell"),  # typo of dwell_s
        ({"targets": ONE_TARGET, "gpu": {"telemetry": "dcgm"}}, "gpu"),
        ({"targets": [{"name": "a", "url": "http://x", "drafter": {"method": "draft_model"}}]}, "targets.0.drafter"),
        ({"targets": [{"name": "a", "url": "http://x", "tensor_parallel": 0}]}, "targets.0.tensor_parallel"),
        ({"targets": [{"name": "a", "url": "http://x", "max_num_seqs": 0}]}, "targets.0.max_num_seqs"),
        ({"targets": [{"name": "a", "url": "http://x", "max_num_batched_tokens": 0}]},
         "targets.0.max_num_batched_tokens"),
        ({"targets": ONE_TARGET, "gpu": {"telemetry": "dcgm", "dcgm_url": "notaurl"}}, "gpu.dcgm_url"),
        ({"targets": ONE_TARGET, "gpu": {"dcgm_url": "ftp://dcgm:9400/metrics"}}, "gpu.dcgm_url"),
        ({"targets": ONE_TARGET, "gpu": {"dcgm_url": "http://dcgm:notaport/metrics"}}, "gpu.dcgm_url"),
        ({"targets": ONE_TARGET, "gpu": {"dcgm_label_match": {"pod": 3}}}, "gpu.dcgm_label_match.pod"),
        ({"targets": ONE_TARGET, "objective": {"itl_slo_s": 0}}, "objective.itl_slo_s"),
        ({"targets": ONE_TARGET, "objective": {"itl_slo_s": -0.05}}, "objective.itl_slo_s"),
        ({"targets": ONE_TARGET, "objective": {"itl_slo_s": "inf"}}, "objective.itl_slo_s"),
        ({"targets": ONE_TARGET, "objective": {"itl_slo_s": "nan"}}, "objective.itl_slo_s"),
        ({"targets": ONE_TARGET, "calibration": {"half_life_s": 0}}, "calibration.half_life_s"),
        ({"targets": ONE_TARGET, "calibration": {"half_life": 60}}, "calibration.half_life"),  # typo of half_life_s
    ],
)
def test_invalid_values_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(overrides=overrides)
    assert f"  {field}" in str(caught.value)


@pytest.mark.parametrize(
    ("var", "value", "field"),
    [
        ("SPEC_ADVISOR_TARGETS", "notjson", "targets"),
        ("SPEC_ADVISOR_GPU", "{", "gpu"),
        ("SPEC_ADVISOR_DECIDE", "[1,", "decide"),
    ],
)
def test_bad_json_in_an_env_var_is_our_settings_error(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, field: str
) -> None:
    # pydantic-settings raises its own SettingsError here; the CLI only turns ours into "exit 2 + message".
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as caught:
        load_settings(overrides={"targets": ONE_TARGET} if field != "targets" else None)
    assert type(caught.value) is SettingsError
    message = str(caught.value)
    assert f'"{field}"' in message and "JSON" in message


def test_dcgm_url_and_label_match(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ADVISOR_GPU__DCGM_LABEL_MATCH", '{"pod": "vllm-0"}')
    settings = load_settings(
        overrides={"targets": ONE_TARGET, "gpu": {"telemetry": "dcgm", "dcgm_url": "http://dcgm:9400/metrics"}}
    )
    assert settings.gpu.dcgm_url == "http://dcgm:9400/metrics"
    assert settings.gpu.dcgm_label_match == {"pod": "vllm-0"}
    monkeypatch.delenv("SPEC_ADVISOR_GPU__DCGM_LABEL_MATCH")
    assert load_settings(overrides={"targets": ONE_TARGET}).gpu.dcgm_label_match == {}


def test_missing_targets_is_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="targets: Field required"):
        load_settings()


def test_bad_config_files(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings(tmp_path / "absent.yaml")
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings(write(tmp_path / "broken.yaml", "targets: [\n"))
    with pytest.raises(SettingsError, match="mapping of settings"):
        load_settings(write(tmp_path / "list.yaml", "- a\n- b\n"))


def test_model_sources_are_exclusive(tmp_path: Path) -> None:
    config_json = write(tmp_path / "config.json", "{}")
    target = {"name": "a", "url": "http://x", "model_profile": "llama-3.1-8b", "model_config_path": str(config_json)}
    with pytest.raises(SettingsError, match="not both"):
        load_settings(overrides={"targets": [target]})


def test_target_name_for_url() -> None:
    assert target_name_for_url("http://127.0.0.1:8000/metrics") == "127.0.0.1:8000"
    assert target_name_for_url("http://vllm") == "vllm"


FLEET = {"name": "llama-fleet", "prometheus_url": "http://prometheus:9090", "model": "meta-llama/Llama-3.1-8B-Instruct"}


def test_fleet_target_from_yaml(tmp_path: Path) -> None:
    config = write(
        tmp_path / "fleet.yaml",
        """
targets:
  - name: llama-fleet
    prometheus_url: http://prometheus.monitoring:9090
    model: meta-llama/Llama-3.1-8B-Instruct
    selector: 'namespace="prod", deployment=~"llama-.*"'
    rate_window_s: 120
""",
    )
    (target,) = load_settings(config).targets
    assert target.fleet and target.url is None
    assert target.selector == 'namespace="prod", deployment=~"llama-.*"'
    assert target.rate_window_s == 120.0
    with pytest.raises(ValueError, match="no /metrics URL"):
        _ = target.metrics_url
    (default,) = load_settings(overrides={"targets": [FLEET]}).targets
    assert default.rate_window_s == 60.0 and default.selector == ""


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"name": "x"}, "exactly one of url"),
        ({**FLEET, "url": "http://vllm:8000"}, "exactly one of url"),
        ({k: v for k, v in FLEET.items() if k != "model"}, "needs model"),
        ({**FLEET, "prometheus_url": "prometheus:9090"}, "not an http(s) URL"),
        ({**FLEET, "selector": "namespace=prod"}, "PromQL label matchers"),
        ({**FLEET, "selector": 'a="b"} or vector(1) or up{c="d"'}, "PromQL label matchers"),
        ({**FLEET, "rate_window_s": 0}, "rate_window_s"),
        ({"name": "x", "url": "http://vllm:8000", "selector": 'a="b"'}, "only apply with prometheus_url"),
        ({"name": "x", "url": "http://vllm:8000", "rate_window_s": 30}, "only apply with prometheus_url"),
    ],
)
def test_fleet_settings_are_validated(target: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(overrides={"targets": [target]})


def test_the_example_files_fleet_target_is_valid_uncommented() -> None:
    # deploy/config.example.yaml documents fleet mode as a commented-out second target: uncommented, it loads.
    example = (Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml").read_text(encoding="utf-8")
    start = example.index("  # - name: llama-8b-fleet")
    block = example[start : example.index("\n\n", start)]
    text = "targets:\n" + "\n".join(line.replace("  # ", "  ", 1) for line in block.splitlines())
    (target,) = load_settings(overrides=yaml.safe_load(text)).targets
    assert target.fleet and target.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert target.selector == 'namespace="inference", deployment=~"llama-8b-.*"'


def test_dumped_settings_load_again_in_both_modes() -> None:
    # A dump carries every default (selector "", rate_window_s 60) also for a pod target: that is not a fleet
    # field given by mistake.
    for targets in (ONE_TARGET, [FLEET]):
        settings = load_settings(overrides={"targets": targets})
        assert load_settings(overrides=settings.model_dump()) == settings


def test_a_target_on_a_gpu_the_catalog_lacks_gives_its_datasheet_numbers(tmp_path: Path) -> None:
    config = write(tmp_path / "c.yaml", """
targets:
  - name: a
    url: http://127.0.0.1:8000
    model_profile: llama-3.1-8b
    hardware: {name: a10g, bf16_dense_tflops: 70, mem_bandwidth_gbps: 600, memory_gb: 24}
""")
    [target] = load_settings(config).targets
    resolve = context_resolver(target, fallback_hardware="h100-sxm")
    ctx = resolve("whatever-is-served", GpuSnapshot(taken_at_s=0.0, source="absent"))
    assert (ctx.hardware.name, ctx.hardware.mem_bandwidth_bytes_per_s) == ("a10g", 600e9)
    # A number that is not one is refused at start-up, naming the field.
    bad = write(tmp_path / "bad.yaml", config.read_text().replace("memory_gb: 24", "memory_gb: -24"))
    with pytest.raises(SettingsError, match="memory_gb"):
        load_settings(bad)


def _leaf_settings(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str | None]]:
    leaves: list[tuple[str, str | None]] = []
    for name, info in model.model_fields.items():
        sections = [a for a in (typing.get_args(info.annotation) or (info.annotation,))
                    if isinstance(a, type) and issubclass(a, BaseModel)]
        if sections:
            for section in sections:
                leaves += _leaf_settings(section, f"{prefix}{name}.")
        else:
            leaves.append((prefix + name, info.description))
    return leaves


def test_every_setting_an_operator_can_write_says_what_it_is() -> None:
    leaves = _leaf_settings(Settings)
    assert len(leaves) > 70  # the walk reaches into every section (targets, decide, actuation.gate, ...)
    undescribed = [path for path, description in leaves if not description]
    assert undescribed == [], f"settings without a description: {undescribed}"


def test_a_draft_model_on_fewer_gpus_reaches_the_cost_model_and_other_drafters_refuse_it() -> None:
    target = {**ONE_TARGET[0], "model_profile": "llama-3.1-70b", "tensor_parallel": 4,
              "drafter": {"method": "draft_model", "draft_model_profile": "llama-3.2-1b", "tensor_parallel": 1}}
    [loaded] = load_settings(overrides={"targets": [target]}).targets
    ctx = context_resolver(loaded, fallback_hardware="h100-sxm")("x", GpuSnapshot(taken_at_s=0.0, source="absent"))
    assert ctx.drafter.degree(ctx.tensor_parallel) == 1
    more = {**target, "drafter": {**target["drafter"], "tensor_parallel": 2}}  # type: ignore[dict-item]
    with pytest.raises(SettingsError, match="must be 1 or the target's tensor_parallel"):
        load_settings(overrides={"targets": [more]})
    head = {**target, "drafter": {"method": "eagle3", "tensor_parallel": 1}}
    with pytest.raises(SettingsError, match="draft_model only"):
        load_settings(overrides={"targets": [head]})


def test_the_engine_limits_reach_the_cost_model() -> None:
    target = {**ONE_TARGET[0], "model_profile": "llama-3.1-8b", "max_num_batched_tokens": 2048, "max_num_seqs": 128}
    [loaded] = load_settings(overrides={"targets": [target]}).targets
    ctx = context_resolver(loaded, fallback_hardware="h100-sxm")("x", GpuSnapshot(taken_at_s=0.0, source="absent"))
    assert (ctx.step_token_budget, ctx.max_num_seqs) == (2048, 128)
    [bare] = load_settings(overrides={"targets": [ONE_TARGET[0]]}).targets
    assert (bare.max_num_batched_tokens, bare.max_num_seqs) == (None, None)
