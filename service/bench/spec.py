"""A benchmark scenario: a simulator scenario file plus an optional `bench:` section saying how to run and grade it.

The `bench:` section is read here and removed before the rest goes to `service.sim.scenario` (which forbids unknown
keys), so plain simulator scenarios run in the benchmark unchanged, with the defaults below.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.sim.scenario import MAX_SPECULATIVE_TOKENS, Scenario, ScenarioError, scenario_from_mapping

DEFAULT_DURATION_S = 1200.0


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# Sidecar settings the benchmark sets itself; a scenario that sets them would be silently overridden.
RESERVED_SETTINGS = ("targets", "gpu", "scrape_interval_s", "scrape_timeout_s")
RESERVED_SETTINGS_HINT = ("the target's fields are bench.advisor's own: hardware, model_profile, model_config_path, "
                          "tensor_parallel, drafter_method, draft_model_profile, draft_tensor_parallel; the tick is "
                          "bench.decision_interval_s; the SLO is bench.itl_slo_s")


class AdvisorSection(_Section):
    """How the advisor is configured for this world: its profiles (the advisor's own guesses about the simulated
    hardware and model; the world's truth stays in the scenario) and any other sidecar settings."""

    hardware: str = Field(default="h100-sxm", description="Advisor hardware profile (catalog name).")
    model_profile: str | None = Field(
        default="llama-3.1-8b", description="Advisor model profile (catalog name); null with model_config_path.",
    )
    model_config_path: str | None = Field(
        default=None, description="A Hugging Face config.json for a model the catalog lacks (a path relative to "
        "the scenario file); set model_profile to null with it.",
    )
    tensor_parallel: int = Field(
        default=1, ge=1, le=64, description="GPUs one replica is sharded over, as the advisor is told (the "
        "target's tensor_parallel).",
    )
    drafter_method: str | None = Field(default=None, description="Advisor drafter method; None = the world's.")
    draft_model_profile: str | None = Field(
        default=None, description="Catalog name of the draft model (drafter method draft_model only)."
    )
    draft_tensor_parallel: int | None = Field(
        default=None, ge=1, le=64, description="GPUs the draft model runs on, as the advisor is told (drafter "
        "method draft_model only: vLLM's draft_tensor_parallel_size, 1 or tensor_parallel); None = tensor_parallel.",
    )
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra sidecar settings (as in the settings file, e.g. {decide: {dwell_s: 60}}). "
        f"{', '.join(RESERVED_SETTINGS)} and objective.itl_slo_s are the benchmark's and are refused here: "
        f"{RESERVED_SETTINGS_HINT}.",
    )

    @model_validator(mode="after")
    def _check(self) -> AdvisorSection:
        if (self.model_profile is None) == (self.model_config_path is None):
            raise ValueError("set exactly one of model_profile and model_config_path")
        reserved = [key for key in RESERVED_SETTINGS if key in self.settings]
        objective = self.settings.get("objective")
        if isinstance(objective, Mapping) and "itl_slo_s" in objective:
            reserved.append("objective.itl_slo_s")
        if reserved:
            raise ValueError(f"settings.{reserved[0]} is set by the benchmark ({RESERVED_SETTINGS_HINT})")
        return self


class BenchSection(_Section):
    """How long to run, how often to decide, what the grid searches try, and the optional ITL SLO."""

    duration_s: float = Field(
        default=DEFAULT_DURATION_S, gt=0, le=7 * 24 * 3600, description="Simulated seconds per policy run.",
    )
    decision_interval_s: float = Field(
        default=5.0, gt=0, le=600, description="Tick of the advisor (its scrape interval), the oracle and baselines."
    )
    itl_slo_s: float | None = Field(
        default=None, gt=0, le=60, description="Per-request mean inter-token latency SLO; also given to the advisor."
    )
    objective: Literal["throughput", "slo_goodput", "latency"] | None = Field(
        default=None, description="What policies are graded by: throughput (goodput), slo_goodput (tokens/s of "
        "requests meeting itl_slo_s; needs it) or latency (1 / mean ITL at a throughput floor: "
        "latency_floor_ratio). None = slo_goodput with an SLO, else throughput.",
    )
    latency_floor_ratio: float = Field(
        default=0.98, gt=0, le=1, description="objective latency: the share of the best static run's goodput a "
        "run must deliver to be graded on latency alone; below it, its score falls in proportion.",
    )
    gamma_max: int | None = Field(
        default=None, ge=1, le=MAX_SPECULATIVE_TOKENS, description="Largest gamma of the grids and the oracle, "
        "and the advisor's decide.gamma_max where above its default (8); None = max(the scenario's k, 5).",
    )
    batch_thresholds: tuple[int, ...] | None = Field(
        default=None, min_length=1, description="disable_by_batch_size values tried; None = powers of 4 below "
        "max_num_seqs and max_num_seqs / 2.",
    )
    oracle_segment_s: float = Field(
        default=60.0, gt=0, le=3600, description="How often the hindsight oracle may change gamma (a multiple of "
        "decision_interval_s): each boundary runs every gamma to the end of the run, so halving it doubles its cost.",
    )
    seed: int = Field(default=0, description="World seed, the same for every policy.")
    advisor: AdvisorSection = Field(default_factory=AdvisorSection, description="The advisor's own configuration.")

    @property
    def objective_kind(self) -> Literal["throughput", "slo_goodput", "latency"]:
        """The objective the scenario states, or its default (slo_goodput with an SLO, else throughput)."""
        if self.objective is not None:
            return self.objective
        return "slo_goodput" if self.itl_slo_s is not None else "throughput"

    @model_validator(mode="after")
    def _check(self) -> BenchSection:
        if self.decision_interval_s * 2 > self.duration_s:
            raise ValueError("duration_s must span at least two decision intervals")
        if self.objective == "slo_goodput" and self.itl_slo_s is None:
            raise ValueError("objective slo_goodput needs itl_slo_s")
        if self.objective in ("throughput", "latency") and self.itl_slo_s is not None:
            raise ValueError(f"objective {self.objective} with itl_slo_s: an SLO is graded as slo_goodput")
        if self.oracle_segment_s >= self.duration_s:
            raise ValueError("oracle_segment_s must be shorter than duration_s (the oracle would never move)")
        ratio = self.oracle_segment_s / self.decision_interval_s
        if abs(ratio - round(ratio)) > 1e-9 or round(ratio) < 1:
            raise ValueError("oracle_segment_s must be a whole multiple of decision_interval_s")
        if self.batch_thresholds is not None and any(b < 1 for b in self.batch_thresholds):
            raise ValueError("batch_thresholds must all be >= 1")
        return self


@dataclass(frozen=True, slots=True)
class BenchScenario:
    """One scenario to benchmark: its name (the file's stem), the world's truth, and the bench section."""

    name: str
    source: str
    scenario: Scenario
    bench: BenchSection

    @property
    def gamma_max(self) -> int:
        return self.bench.gamma_max or max(self.scenario.drafter.num_speculative_tokens, 5)

    @property
    def drafter_k(self) -> int:
        """The k the scenario's drafter is deployed with (always-on runs it); at least 1."""
        return max(1, self.scenario.drafter.num_speculative_tokens)

    @property
    def batch_thresholds(self) -> tuple[int, ...]:
        if self.bench.batch_thresholds is not None:
            return self.bench.batch_thresholds
        # Powers of 4 from 4, plus half of max_num_seqs: 4 runs instead of 6 for the usual 256 (the suite's time
        # budget), still within a factor of 2 of any best threshold in the upper half.
        top = self.scenario.engine.max_num_seqs
        grid, b = [], 4
        while b < top:
            grid.append(b)
            b *= 4
        if top >= 8 and top // 2 not in grid:
            grid.append(top // 2)
        return tuple(sorted(grid)) or (top,)


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"])
        parts.append(f"bench.{where}: {item['msg']}" if where else f"bench: {item['msg']}")
    return "; ".join(parts)


def bench_scenario_from_mapping(data: Any, *, source: str) -> BenchScenario:
    """Validate parsed data (a mapping with an optional `bench` key); raise ScenarioError naming file and field."""
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: a scenario must be a mapping at the top level, got {type(data).__name__}")
    rest = dict(data)
    raw_bench = rest.pop("bench", None)
    scenario = scenario_from_mapping(rest, source=source)
    try:
        bench = BenchSection.model_validate(raw_bench or {})
    except ValidationError as exc:
        raise ScenarioError(f"{source}: invalid bench section: {_describe(exc)}") from exc
    config = bench.advisor.model_config_path
    if config is not None and not Path(config).is_absolute():
        advisor = bench.advisor.model_copy(update={"model_config_path": str(Path(source).parent / config)})
        bench = bench.model_copy(update={"advisor": advisor})
    return BenchScenario(name=Path(source).stem, source=source, scenario=scenario, bench=bench)


def load_bench_scenario(path: str | Path) -> BenchScenario:
    """Read a benchmark scenario from YAML or JSON (by suffix); raise ScenarioError naming the file and field."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{source}: cannot read scenario: {exc}") from exc
    try:
        data = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{source}: not valid {'JSON' if source.endswith('.json') else 'YAML'}: {exc}") from exc
    return bench_scenario_from_mapping(data, source=source)


def bench_scenario_json_schema() -> dict[str, Any]:
    """The JSON Schema of a benchmark scenario file: the simulator's scenario (service/sim/scenario.py) plus the
    optional `bench` section, with every field's bounds and description (docs/scenario.schema.json is this)."""
    schema = Scenario.model_json_schema()
    bench = BenchSection.model_json_schema()
    definitions = {**schema.get("$defs", {}), **bench.pop("$defs", {}), "BenchSection": bench}
    schema["$defs"] = dict(sorted(definitions.items()))
    schema["properties"]["bench"] = {"$ref": "#/$defs/BenchSection", "description": "How the benchmark runs it "
                                     "(optional; removed before the simulator sees the file)."}
    schema["title"] = "spec-advisor benchmark scenario"
    return schema

