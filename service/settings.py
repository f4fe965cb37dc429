"""The sidecar's one validated settings object: YAML file (``--config FILE``) < env vars < command-line flags.

Env vars use the prefix ``SPEC_ADVISOR_`` and ``__`` for nesting, e.g. ``SPEC_ADVISOR_SCRAPE_INTERVAL_S=10`` or
``SPEC_ADVISOR_DECIDE__DWELL_S=300``. Lists (``targets``) are given as JSON in env vars. Every field carries its
unit in its name and says why its default is what it is. Invalid settings fail at start-up with
`SettingsError`, whose message names each offending field (the CLI prints it and exits 2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as SourceParseError

from policies.act.gate import ActuationConfig
from policies.decide.audit import SpeculationController
from policies.decide.rule import DecideConfig
from policies.estimate.window import EstimatorConfig
from policies.model.calibrate import CalibrationConfig
from policies.model.objectives import ObjectiveConfig
from policies.types import DraftMethod
from service.sources.engines import EngineKind

# Each policy default is declared once, in its policy config; a setting states its bounds, unit and why.
_ESTIMATOR, _DECIDE, _CALIBRATION = EstimatorConfig(), DecideConfig(), CalibrationConfig()

TargetName = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$",
        description="Identity of the target in the API, logs and metric labels; keep it short and stable.",
    ),
]


class SettingsError(Exception):
    """Settings that cannot run the sidecar; the message is meant for a human at a terminal."""


def _check_http_url(value: str) -> str:
    """`value` when it is an http(s) URL with a host and a valid port; else ValueError naming it."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"'{value}' is not an http(s) URL with a host")
    try:
        _ = parts.port  # raises for a non-numeric or out-of-range port
    except ValueError as exc:
        raise ValueError(f"'{value}' has an invalid port") from exc
    return value


class _Section(BaseModel):
    # Unknown keys are typos (`dwell` for `dwell_s`): reject them instead of silently using a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DrafterSettings(_Section):
    method: DraftMethod = Field(
        default=DraftMethod.NGRAM,
        description="How drafts are made. Default ngram: the one method that needs no extra model, so the cheapest "
        "to turn on; set the method you would deploy.",
    )
    draft_model_profile: str | None = Field(
        default=None,
        description="Catalog name of the draft model; required for method draft_model (its cost is its own roofline).",
    )

    prefix_stable: bool | None = Field(
        default=None,
        description="Whether a shorter draft of this drafter is the prefix of a longer one, so that k' < k can be "
        "read off the k-run's per-position counters. Default: the method's (policies/model/drafter_semantics.py: "
        "false for suffix); set false for a drafter whose first positions change with k (a multi-layer MTP module "
        "reported 83.4% first-position acceptance at k=1 and 76.2% at k=8, a block drafter).",
    )
    allowed_k: list[Annotated[int, Field(ge=1, le=64)]] | None = Field(
        default=None,
        description="The numbers of draft tokens this deployment may run, when the drafter restricts them (an MTP "
        "module with n_predict > 1 needs a multiple of it; a DSpark or DFlash drafter its block size). The curve and "
        "the advice then offer only these k, off and the running k. Default: any k from 1 to decide.gamma_max.",
    )

    tensor_parallel: int | None = Field(
        default=None, ge=1, le=64,
        description="Only for method draft_model: the GPUs the draft model runs on (vLLM's "
        "speculative_config.draft_tensor_parallel_size, 1 or the target's). Default: the target's tensor_parallel.",
    )

    @model_validator(mode="after")
    def _draft_model_needs_profile(self) -> Self:
        if self.method == DraftMethod.DRAFT_MODEL and not self.draft_model_profile:
            raise ValueError("drafter.method 'draft_model' needs drafter.draft_model_profile (a catalog name)")
        if self.tensor_parallel is not None and self.method != DraftMethod.DRAFT_MODEL:
            raise ValueError(f"drafter.tensor_parallel applies to method draft_model only, not {self.method.value}")
        return self


# PromQL label matchers as written inside `{}`: `name op "value"`, comma-separated (op one of = != =~ !~).
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\\n]|\\.)*"\s*'
_SELECTOR = re.compile(rf"^(?:{_MATCHER}(?:,{_MATCHER})*,?\s*)?$")


class HardwareSpecSettings(_Section):
    """A GPU the catalog lacks, by its datasheet numbers (policies/model/profiles.py `hardware_from_spec`)."""

    name: str = Field(
        min_length=1, max_length=64,
        description="What to call this hardware where the profiles in use are shown (the API's `profiles`), e.g. "
        "'my-a10g'; any text.",
    )
    bf16_dense_tflops: float = Field(gt=0, description="Dense bf16/fp16 tensor TFLOP/s, without 2:4 sparsity.")
    mem_bandwidth_gbps: float = Field(gt=0, description="Peak memory bandwidth, GB/s.")
    memory_gb: float = Field(gt=0, description="Device memory, GB as the datasheet prints it.")
    fp8_dense_tflops: float | None = Field(default=None, gt=0, description="None: fp8 runs at the bf16 rate.")
    interconnect_gbps_per_direction: float | None = Field(
        default=None, gt=0, description="GPU-to-GPU link per direction, GB/s; None: PCIe Gen4 x16 (32)."
    )


class AuthorizationSettings(_Section):
    """An Authorization header of `type` with credentials from a file (Prometheus' scrape_config `authorization`)."""

    type: Literal["Bearer"] = Field(
        default="Bearer", description="The header's scheme: Authorization: Bearer <the file's content>."
    )
    credentials_file: Path = Field(
        description="File holding the token (a Kubernetes Secret or projected token volume); read on every scrape, "
        "so a rotated token is used from the next scrape on; surrounding whitespace is stripped.",
    )


class BasicAuthSettings(_Section):
    """HTTP basic authentication with the password from a file (Prometheus' scrape_config `basic_auth`)."""

    username: str = Field(min_length=1, description="The user name sent with each scrape.")
    password_file: Path = Field(
        description="File holding the password; read on every scrape, surrounding whitespace stripped."
    )

    @field_validator("username")
    @classmethod
    def _no_colon(cls, value: str) -> str:
        if ":" in value or any(c in value for c in "\r\n"):
            raise ValueError("username must not contain ':' or a line break (RFC 7617)")
        return value


class TargetSettings(_Section):
    name: TargetName
    url: str | None = Field(
        default=None,
        description="Pod mode: the inference server's base URL (http://host:8000) or its full /metrics URL; the "
        "base URL gets '/metrics' appended. Set this or prometheus_url, not both.",
    )
    prometheus_url: str | None = Field(
        default=None,
        description="Fleet mode: a Prometheus (or Thanos/Mimir) HTTP API base URL (http://prometheus:9090); the "
        "model's replicas are read from it with rate() over rate_window_s, summed by model_name, instead of "
        "scraping a pod. Needs `model`. Set this or url, not both.",
    )
    selector: str = Field(
        default="",
        description='Fleet mode: extra PromQL label matchers for the model\'s series, e.g. namespace="prod", '
        'deployment=~"llama-.*". Default empty: every series of the model in that Prometheus.',
    )
    rate_window_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Fleet mode: the range of rate(). 60 s holds 4 samples at Prometheus' common 15 s scrape "
        "interval (rate() needs 2; 4 rides out one missed scrape). Keep it >= 4x Prometheus' scrape interval.",
    )
    engine: EngineKind = Field(
        default=EngineKind.AUTO,
        description="Pod mode: the inference engine serving url: auto (told from the page's metric names), vllm, "
        "sglang (--enable-metrics), trtllm (url ending in /prometheus/metrics; return_perf_metrics and "
        "enable_iter_perf_stats on) or llamacpp (--metrics). A page of another engine is then a scrape error "
        "(mixed_engines). Fleet mode reads vLLM's series only.",
    )
    route: str | None = Field(
        default=None, min_length=1, max_length=64,
        description="The traffic this target serves (a gateway route, a traffic class such as code or chat, a "
        "pool). GET /v1/routes groups targets by it and says which routes belong on a speculation-on pool: "
        "acceptance differs 2-3x between code and prose.",
    )
    speculation_controller: SpeculationController = Field(
        default=SpeculationController.NONE,
        description="The engine's own speculation controller, when it runs one: adaptive_verification (vLLM "
        "enable_adaptive_verification), dynamic_sd (vLLM num_speculative_tokens_per_batch_size) or "
        "draft_len_schedule (TensorRT-LLM). /v1/audit then judges it against the best static k; engines do not "
        "export these settings, so they are declared here (with none, a drafter drafting short is reported as "
        "suspected_dynamic).",
    )
    model: str | None = Field(
        default=None,
        description="vLLM model_name label to advise on. Pod mode: optional when the server serves exactly one "
        "model (the usual case), required when it serves several. Fleet mode: required.",
    )
    hardware: str | HardwareSpecSettings = Field(
        default="auto",
        description="Hardware profile name, or 'auto': from the GPU device name reported by the GPU telemetry; when "
        "that is absent or unknown, `fallback_hardware` is used (and the evidence says so). For a GPU the catalog "
        "lacks, its datasheet numbers: {name, bf16_dense_tflops, mem_bandwidth_gbps, memory_gb, fp8_dense_tflops?, "
        "interconnect_gbps_per_direction?}.",
    )
    model_profile: str | None = Field(
        default=None,
        description="Model catalog name. When neither this nor model_config_path is set, the served model name is "
        "looked up in the catalog.",
    )
    model_config_path: Path | None = Field(
        default=None,
        description="A Hugging Face config.json describing the target model (for models not in the catalog).",
    )
    drafter: DrafterSettings = Field(default_factory=DrafterSettings)
    tensor_parallel: int = Field(
        default=1, ge=1, le=64, description="GPUs one model replica is sharded over (vLLM --tensor-parallel-size)."
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=1_048_576,
        description="The engine's most tokens per step (vLLM --max-num-batched-tokens): verified drafts share it "
        "with chunked prefill, so where steps fill it, speculation admits fewer prompts. Default None: unknown, "
        "and the budget is not priced (docs/model.md).",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, le=16384,
        description="The engine's most sequences per step (vLLM --max-num-seqs): it caps the batch a full step "
        "budget (max_num_batched_tokens) would hold, which plain decoding reaches first, and the batch any option "
        "is priced at; the range a live schedule covers. Default None: unknown; the budget's batch is then not "
        "capped and schedules cover actuation.schedule.max_num_seqs (docs/model.md).",
    )
    profile: Path | None = Field(
        default=None,
        description="A measured profile of this deployment (`spec-advisor profile`, docs/profile.md): its step "
        "times calibrate the cost model from the first tick. It must match the target's hardware, model profile, "
        "tensor-parallel degree and drafter method, and be younger than calibration.profile_max_age_s; otherwise "
        "the target is in the error state and says why.",
    )

    authorization: AuthorizationSettings | None = Field(
        default=None,
        description="Send Authorization: Bearer <token> to the target's url or prometheus_url, the token read from "
        "credentials_file at each scrape (e.g. a gateway in front of vLLM's /metrics, or a Prometheus behind an "
        "auth proxy). Set this or basic_auth, not both; never put credentials in the URL.",
    )
    basic_auth: BasicAuthSettings | None = Field(
        default=None,
        description="Send HTTP basic authentication to the target's url or prometheus_url, the password read from "
        "password_file at each scrape. Set this or authorization, not both.",
    )

    @field_validator("url", "prometheus_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return None if value is None else _check_http_url(value)

    @field_validator("selector")
    @classmethod
    def _promql_matchers(cls, value: str) -> str:
        if "\n" in value or not _SELECTOR.match(value):
            raise ValueError(
                f"'{value}' is not a list of PromQL label matchers such as namespace=\"prod\", deployment=~\"llama-.*\""
            )
        return value

    @model_validator(mode="after")
    def _one_evidence_source(self) -> Self:
        if (self.url is None) == (self.prometheus_url is None):
            raise ValueError("set exactly one of url (scrape the pod) and prometheus_url (fleet mode)")
        if self.prometheus_url is not None and not self.model:
            raise ValueError("fleet mode (prometheus_url) needs model: the vLLM model_name to read")
        if self.prometheus_url is not None and self.engine not in (EngineKind.AUTO, EngineKind.VLLM):
            raise ValueError(f"fleet mode (prometheus_url) reads vLLM's series only, not engine {self.engine.value}")
        if self.url is not None:
            # Compared with the defaults, not "was it given": a dumped-and-reloaded pod target carries them.
            defaults = type(self).model_fields
            fleet_only = [n for n in ("rate_window_s", "selector") if getattr(self, n) != defaults[n].default]
            if fleet_only:
                raise ValueError(f"{', '.join(fleet_only)} only apply with prometheus_url (fleet mode)")
        return self

    @model_validator(mode="after")
    def _one_auth(self) -> Self:
        if self.authorization is not None and self.basic_auth is not None:
            raise ValueError("set authorization or basic_auth, not both")
        return self

    @model_validator(mode="after")
    def _one_model_source(self) -> Self:
        if self.model_profile and self.model_config_path:
            raise ValueError("set model_profile or model_config_path, not both")
        if self.model_config_path is not None and not self.model_config_path.is_file():
            raise ValueError(f"model_config_path '{self.model_config_path}' is not a readable file")
        if self.profile is not None and not self.profile.is_file():
            raise ValueError(f"profile '{self.profile}' is not a readable file")
        draft_tp = self.drafter.tensor_parallel
        if draft_tp is not None and draft_tp not in (1, self.tensor_parallel):
            raise ValueError(f"drafter.tensor_parallel must be 1 or the target's tensor_parallel "
                             f"({self.tensor_parallel}), got {draft_tp}")
        return self

    @property
    def fleet(self) -> bool:
        """True in fleet mode (evidence from Prometheus), False when the pod is scraped."""
        return self.prometheus_url is not None

    @property
    def metrics_url(self) -> str:
        """The pod's /metrics URL; ValueError for a fleet-mode target (it has none)."""
        if self.url is None:
            raise ValueError(f"target {self.name} reads Prometheus (fleet mode): it has no /metrics URL")
        parts = urlsplit(self.url)
        path = parts.path.rstrip("/")
        if not path.endswith("/metrics"):
            path = f"{path}/metrics"
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class GpuSettings(_Section):
    telemetry: Literal["none", "nvml", "dcgm"] = Field(
        default="nvml",
        description="Where GPU telemetry comes from. Default nvml: local and cheap; on a machine without a GPU or "
        "driver it reports 'absent' and the advisor works from the engine's metrics alone.",
    )
    dcgm_url: str | None = Field(default=None, description="dcgm-exporter /metrics URL; required for telemetry 'dcgm'.")
    dcgm_label_match: dict[str, str] = Field(
        default_factory=dict,
        description="Only series whose labels match these, e.g. {pod: my-vllm-pod} on a node-level exporter (which "
        "lists every GPU of the node). Default empty: every series on the page, right for a per-pod exporter.",
    )
    timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="DCGM scrape timeout; small because GPU data is optional, never worth a stall.",
    )

    @field_validator("dcgm_url")
    @classmethod
    def _dcgm_http_url(cls, value: str | None) -> str | None:
        return None if value is None else _check_http_url(value)

    @model_validator(mode="after")
    def _dcgm_needs_url(self) -> Self:
        if self.telemetry == "dcgm" and not self.dcgm_url:
            raise ValueError("gpu.telemetry 'dcgm' needs gpu.dcgm_url (the dcgm-exporter /metrics URL)")
        return self


class EstimatorSettings(_Section):
    window_s: float = Field(
        default=_ESTIMATOR.window_s,
        gt=0,
        le=3600,
        description="Sliding window for counter deltas. 60 s holds thousands of drafts on a busy server yet follows "
        "a workload change within a minute.",
    )
    min_drafts: int = Field(
        default=_ESTIMATOR.min_drafts,
        ge=1,
        description="Below this many drafts in the window the state is insufficient_data: at 200 the binomial 95% "
        "interval on a 0.5 acceptance is about +-0.07.",
    )
    z: float = Field(
        default=_ESTIMATOR.z, gt=0, le=5, description="Normal quantile of the acceptance intervals; 1.96 = 95%."
    )
    stale_after_s: float = Field(
        default=_ESTIMATOR.stale_after_s,
        gt=0,
        description="No good scrape for this long makes the target stale: 6 missed scrapes at the 5 s default.",
    )

    def to_config(self) -> EstimatorConfig:
        """The estimator's policy config (policies/estimate/window.py)."""
        return EstimatorConfig(
            window_s=self.window_s, min_drafts=self.min_drafts, z=self.z, stale_after_s=self.stale_after_s
        )


_DEFAULT_CONFIRM_S = _DECIDE.confirm_s
# Decide settings that the single decision rule (policies/decide/rule.py) replaced, with what to use instead.
_REPLACED_DECIDE_SETTINGS = {
    "min_speedup_gain_to_change_gamma": "every change must promise `margin` (a relative gain at its band's low end)",
    "planned_confirm_s": "use confirm_s, the shortest wait of any change",
    "decisive_gain": "a change now waits change cost / expected gain, between confirm_s and dwell_s",
}


class DecideSettings(_Section):
    margin: float = Field(
        default=_DECIDE.margin,
        ge=0,
        le=1,
        description="The least gain a change must promise at the pessimistic end of its 90% band (a share of the "
        "service): to switch on, the speedup's low end must clear 1 + margin; to switch off, its high end must "
        "fall short of 1 by as much (policies/decide/rule.py).",
    )
    dwell_s: float = Field(
        default=_DECIDE.dwell_s,
        ge=0,
        description="The longest a change waits to be published, and the least time between two published changes "
        "(so one burst cannot flip the recommendation back and forth). A change waits its cost over its expected "
        "gain (change_cost_s / gain), between confirm_s and dwell_s.",
    )
    confirm_s: float = Field(
        default=_DEFAULT_CONFIRM_S,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="The shortest a change waits to be published: a grossly wrong setting is corrected after this "
        "long, so one bad scrape cannot change a deployment. At most dwell_s (the default follows a shorter "
        "dwell_s).",
    )
    gamma_max: int = Field(
        default=_DECIDE.gamma_max,
        ge=1,
        le=32,
        description="Largest gamma evaluated; past 8 drafts acceptance is rarely worth the cost.",
    )
    change_cost_s: float = Field(
        default=_DECIDE.change_cost_s,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds of service one change of the speculation config interrupts: about the engine's restart "
        "time (vLLM restarts to change it). A change is recommended only when its predicted gain x "
        "payback_horizon_s exceeds this plus the in-flight work a restart drops (about half a request's decode "
        "time, estimated live; policies/decide/change_cost.py). 0 = the engine adapts per batch, changes are free. "
        "Example: 20 (a 20 s rollout).",
    )
    payback_horizon_s: float = Field(
        default=_DECIDE.payback_horizon_s,
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="Seconds over which a change must pay back its cost: how long a recommendation is expected to "
        "hold before the load or workload moves again. Example: 600 (a 3% gain wins back 18 s).",
    )
    explore: bool = Field(
        default=_DECIDE.explore,
        description="While off on a remembered acceptance profile, recommend turning speculation on now and then to "
        "measure it again when the expected gain pays for it (policies/decide/probe.py probe_for).",
    )
    probe_timeout_s: float = Field(
        default=_DECIDE.probe_timeout_s,
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="A re-measuring probe nobody applied within this many seconds is dropped.",
    )
    probe_backoff_s: float = Field(
        default=_DECIDE.probe_backoff_s,
        ge=0,
        le=7 * 86400,
        allow_inf_nan=False,
        description="After a dropped probe, no new probe is recommended for this many seconds.",
    )
    @model_validator(mode="before")
    @classmethod
    def _default_confirm_follows_dwell(cls, data: Any) -> Any:
        # Settings the one decision rule replaced are named with their replacement, not as unknown keys.
        if isinstance(data, dict):
            for key, instead in _REPLACED_DECIDE_SETTINGS.items():
                if key in data:
                    raise ValueError(f"decide.{key} was replaced: {instead}")
            if "itl_slo_s" in data:
                raise ValueError("decide.itl_slo_s moved: use objective.itl_slo_s")
        # The default confirm follows a shorter dwell (the demo's 10 s); a value the operator wrote is checked below.
        if isinstance(data, dict) and "confirm_s" not in data and "dwell_s" in data:
            try:
                dwell = float(data["dwell_s"])  # a number, or its text from an environment variable
            except (TypeError, ValueError):
                return data  # the field's own validation names the problem
            if 0 <= dwell < _DEFAULT_CONFIRM_S:
                return {**data, "confirm_s": dwell}
        return data

    @model_validator(mode="after")
    def _confirm_within_dwell(self) -> Self:
        # The confirm is the shortest wait and the dwell the longest.
        if self.confirm_s > self.dwell_s:
            raise ValueError(
                f"decide.confirm_s ({self.confirm_s:g}) must not exceed decide.dwell_s ({self.dwell_s:g}): "
                "a change waits its cost over its expected gain, between the two"
            )
        return self

    def to_config(self) -> DecideConfig:
        """The decision rule's policy config (policies/decide/rule.py); `probe_min_s` keeps its default (60 s,
        the default estimator window)."""
        return DecideConfig(
            margin=self.margin, dwell_s=self.dwell_s, confirm_s=self.confirm_s, gamma_max=self.gamma_max,
            change_cost_s=self.change_cost_s, payback_horizon_s=self.payback_horizon_s, explore=self.explore,
            probe_timeout_s=self.probe_timeout_s, probe_backoff_s=self.probe_backoff_s,
        )


class ObjectiveSettings(_Section):
    """What the options are compared by (policies/model/objectives.py)."""

    itl_slo_s: float | None = Field(
        default=None,
        gt=0,
        le=60,
        allow_inf_nan=False,
        description="The inter-token-latency SLO in seconds (mean time between a request's output tokens, e.g. "
        "0.05 = 50 ms). When set, options are compared by goodput: tokens/s of requests meeting it. Default None: "
        "no SLO, so speculation is judged by throughput (per sequence, or of the whole server while requests "
        "queue).",
    )

    def to_config(self) -> ObjectiveConfig:
        """The objective's policy config (policies/model/objectives.py): the ITL SLO, when set."""
        return ObjectiveConfig(itl_slo_s=self.itl_slo_s)


class CalibrationSettings(_Section):
    half_life_s: float = Field(
        default=_CALIBRATION.half_life_s,
        gt=0,
        le=7 * 24 * 3600,
        description="The cost model's online calibration weighs each observed step time down by half every this "
        "many seconds. 15 min follows a redeploy or a driver update within the hour yet rides out a burst.",
    )
    profile_max_age_s: float = Field(
        default=30 * 24 * 3600.0,
        gt=0,
        le=366 * 24 * 3600.0,
        description="A target's measured profile older than this (seconds) is refused: the target goes to the error "
        "state saying so, until it is measured again. 30 days: engines, drivers and kernels change within months.",
    )

    def to_config(self) -> CalibrationConfig:
        """The online calibration's policy config (policies/model/calibrate.py)."""
        return CalibrationConfig(half_life_s=self.half_life_s)


# A Kubernetes object name (RFC 1123 DNS subdomain; Deployments and HTTPRoutes use it).
_K8S_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
K8sName = Annotated[str, Field(pattern=_K8S_NAME, description="A Kubernetes object name.")]
ActuationMode = Literal["recommend-only", "shadow", "kubernetes", "schedule", "routing"]


class ActuatedTargetSettings(_Section):
    """One advised target the sidecar may change, and the Kubernetes object it changes."""

    target: TargetName = Field(description="The name of a configured target (its recommendation drives the action).")
    deployment: K8sName | None = Field(
        default=None,
        description="kubernetes/schedule modes: the vLLM Deployment to patch (in actuation.kubernetes.namespace).",
    )
    container: str | None = Field(
        default=None,
        description="kubernetes/schedule modes: the vLLM container's name. Default None: the one container that "
        "runs vLLM (refused when none or several do).",
    )
    speculative_config: dict[str, Any] | None = Field(
        default=None,
        description="kubernetes/schedule modes: the --speculative-config JSON to start from when turning "
        "speculation on and the Deployment has none (e.g. {method: eagle3, model: yuhuili/EAGLE3-LLaMA3.1-"
        "Instruct-8B}); num_speculative_tokens (and the schedule) are filled in. Default None: turn on only "
        "deployments that already carry one.",
    )
    route: K8sName | None = Field(default=None, description="routing mode: the Gateway API HTTPRoute to re-weight.")
    on_backend: K8sName | None = Field(
        default=None, description="routing mode: the backendRef (Service) of the speculation-on pool."
    )
    off_backend: K8sName | None = Field(
        default=None, description="routing mode: the backendRef (Service) of the speculation-off pool."
    )
    on_pool_k: int | None = Field(
        default=None, ge=1, le=32, description="routing mode: the num_speculative_tokens the on-pool runs."
    )

    def check_mode(self, mode: str) -> list[str]:
        """The problems of this entry under `mode` (empty when it fits)."""
        problems: list[str] = []
        kube_fields = ("deployment", "container", "speculative_config")
        route_fields = ("route", "on_backend", "off_backend", "on_pool_k")
        if mode == "shadow":  # nothing is changed, so no object is named
            extra = [name for name in (*kube_fields, *route_fields) if getattr(self, name) is not None]
        elif mode in ("kubernetes", "schedule"):
            if not self.deployment:
                problems.append(f"target {self.target}: mode {mode} needs deployment (the vLLM Deployment's name)")
            extra = [name for name in route_fields if getattr(self, name) is not None]
        else:  # routing
            missing = [name for name in route_fields if getattr(self, name) is None]
            if missing:
                problems.append(f"target {self.target}: mode routing needs {', '.join(missing)}")
            elif self.on_backend == self.off_backend:
                problems.append(f"target {self.target}: on_backend and off_backend must differ")
            extra = [name for name in kube_fields if getattr(self, name) is not None]
        if extra:
            problems.append(f"target {self.target}: {', '.join(extra)} do not apply in mode {mode}")
        return problems


class GateSettings(_Section):
    """How often and how soon the sidecar may act on a target (policies/act/gate.py `ActuationConfig`)."""

    dwell_s: float = Field(
        default=300.0,
        ge=0,
        le=7 * 24 * 3600,
        description="The wanted setting must hold on good data this long before an action (on top of "
        "decide.dwell_s): a rollout restarts pods, so only a sustained change is worth one.",
    )
    cooldown_s: float = Field(
        default=900.0,
        ge=0,
        le=7 * 24 * 3600,
        description="Minimum time between two actions on a target: 15 min lets a large model's rollout finish "
        "and the new setting show in the evidence before the next change.",
    )
    max_actions_per_hour: int = Field(default=2, ge=1, le=60, description="Actions per target per sliding hour.")
    max_actions_per_day: int = Field(default=8, ge=1, le=1000, description="Actions per target per sliding day.")
    min_schedule_change_share: float = Field(
        default=0.10,
        gt=0,
        le=1,
        description="schedule mode: roll out a new schedule only when k moved over at least this share of the "
        "batch range, log-weighted so each doubling of the batch counts the same (docs/actuation.md).",
    )
    skip_log_interval_s: float = Field(
        default=600.0,
        ge=0,
        le=86400,
        description="A skipped action with an unchanged reason is written to the audit log at most once per this "
        "many seconds per target (a new reason is written at once).",
    )

    @model_validator(mode="after")
    def _day_holds_the_hour(self) -> Self:
        if self.max_actions_per_day < self.max_actions_per_hour:
            raise ValueError("max_actions_per_day must be at least max_actions_per_hour")
        return self

    def to_config(self, *, dry_run: bool) -> ActuationConfig:
        """The gate's policy config (policies/act/gate.py); `min_schedule_k_delta` keeps its default. `dry_run` is
        the section above's (the runner reads it; the gate behaves the same either way)."""
        return ActuationConfig(
            dwell_s=self.dwell_s, cooldown_s=self.cooldown_s, max_actions_per_hour=self.max_actions_per_hour,
            max_actions_per_day=self.max_actions_per_day, min_schedule_change_share=self.min_schedule_change_share,
            dry_run=dry_run,
        )


class ScheduleSettings(_Section):
    """schedule mode: the engine the per-batch schedule is written for."""

    max_num_seqs: int = Field(
        default=256, ge=1, le=16384,
        description="schedule mode: the engine's --max-num-seqs (the schedule's range), for a target whose own "
        "targets[].max_num_seqs is unset.",
    )


class KubernetesSettings(_Section):
    """The Kubernetes API the actuators read and patch through."""

    api_url: str | None = Field(
        default=None,
        description="Kubernetes API server URL. Default None: in-cluster configuration, else the kubeconfig.",
    )
    kubeconfig: Path | None = Field(default=None, description="A kubeconfig file (outside a cluster).")
    token_file: Path | None = Field(
        default=None, description="A bearer token file for api_url (default: the ServiceAccount's in a pod)."
    )
    namespace: K8sName = Field(default="default", description="The namespace of the Deployments/HTTPRoutes.")
    timeout_s: float = Field(default=10.0, gt=0, le=300, description="Kubernetes API request timeout.")

    @field_validator("api_url")
    @classmethod
    def _kube_url(cls, value: str | None) -> str | None:
        return None if value is None else _check_http_url(value)


class ActionsApiSettings(_Section):
    """The write endpoints (POST /v1/actions/pause|resume|override) and their bearer token."""

    write_endpoints: bool = Field(
        default=True,
        description="Serve POST /v1/actions/pause|resume|override and DELETE /v1/actions/override (bearer token "
        "required). The sidecar refuses to start with them enabled and no token.",
    )
    write_token_file: Path | None = Field(
        default=None, description="File holding the write endpoints' bearer token (e.g. a mounted Secret)."
    )
    write_token_env: str = Field(
        default="SPEC_ADVISOR_ACTIONS_TOKEN",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the token when write_token_file is not set.",
    )
    max_override_s: float = Field(
        default=24 * 3600.0,
        gt=0,
        le=30 * 86400,
        description="Longest expires_in_s a manual override may ask for: an override forgotten for a day is enough.",
    )


class LeaderElectionSettings(_Section):
    """Several replicas, one actor: a coordination.k8s.io/v1 Lease decides which replica acts; the others advise
    only (docs/actuation.md, "Several replicas"). client-go's leader election semantics and defaults."""

    enabled: bool = Field(
        default=False,
        description="Act only while holding the Lease. Off by default: one replica acts without asking. Turn it "
        "on whenever more than one advisor (replicas, or the sidecars of a Deployment with several replicas) acts "
        "on the same objects; needs the Lease RBAC (deploy/kubernetes/rbac-lease).",
    )
    lease_name: K8sName = Field(
        default="spec-advisor-actuation",
        description="The Lease's name; every replica that acts on the same objects must use the same one.",
    )
    namespace: K8sName | None = Field(
        default=None,
        description="The Lease's namespace. Default None: actuation.kubernetes.namespace (the acted-on objects').",
    )
    lease_duration_s: int = Field(
        default=15,
        ge=1,
        le=3600,
        description="Whole seconds a lease lasts after its holder last renewed it, as judged on each replica's own "
        "clock from when it saw the renewal (never by comparing clocks): how long a crashed leader leaves the "
        "objects without an actor. 15 s, client-go's default.",
    )
    renew_deadline_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="The leader stops acting when it has not renewed the lease for this long; shorter than "
        "lease_duration_s, so it stops before any other replica may take over. 10 s, client-go's default.",
    )
    retry_period_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="Time between two attempts to renew (leader) or acquire (the others, plus up to 1.2x jitter); "
        "the renew deadline must exceed 1.2x it. 2 s, client-go's default.",
    )

    @model_validator(mode="after")
    def _deadline_within_the_lease(self) -> Self:
        if not self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                f"renew_deadline_s ({self.renew_deadline_s:g}) must be shorter than lease_duration_s "
                f"({self.lease_duration_s}): a leader that cannot renew must stop acting before another may take over"
            )
        if not self.renew_deadline_s > 1.2 * self.retry_period_s:
            raise ValueError(
                f"renew_deadline_s ({self.renew_deadline_s:g}) must exceed 1.2 x retry_period_s "
                f"({self.retry_period_s:g}): the leader needs more than one attempt within the deadline"
            )
        return self


# Flat actuation settings that moved into a section, with their new place (refused, naming it).
_MOVED_ACTUATION_SETTINGS = {
    **{key: f"gate.{key}" for key in GateSettings.model_fields},
    "schedule_max_num_seqs": "schedule.max_num_seqs",
    **{key: f"kubernetes.{key}" for key in ("api_url", "kubeconfig", "token_file", "namespace")},
    "kube_timeout_s": "kubernetes.timeout_s",
    **{key: f"api.{key}" for key in ActionsApiSettings.model_fields},
}


class ActuationSettings(_Section):
    """Opt-in acting on the recommendation (docs/actuation.md). Default recommend-only: nothing is changed."""

    mode: ActuationMode = Field(
        default="recommend-only",
        description="recommend-only (publish only), shadow (run the gate, record each action without sending it "
        "and score it later against the load that came; needs no Kubernetes access), kubernetes (patch the "
        "Deployment's --speculative-config), schedule (write vLLM's per-batch schedule into the Deployment) or "
        "routing (shift HTTPRoute weights).",
    )
    dry_run: bool = Field(
        default=False,
        description="Run the whole gate and log the exact patch each action would send, without sending it. Try "
        "a mode with dry_run: true first.",
    )
    targets: list[ActuatedTargetSettings] = Field(
        default_factory=list, description="The targets acted on (at least one outside recommend-only)."
    )
    state_dir: Path = Field(
        default=Path("/var/lib/spec-advisor"),
        description="Where the audit log (actions.jsonl) and the acceptance memory live; mount a volume that "
        "outlives the pod to keep them across restarts.",
    )
    actuator_timeout_s: float = Field(
        default=30.0, gt=0, le=600, description="Longest wait for one read or patch of the Kubernetes object."
    )
    gate: GateSettings = Field(default_factory=GateSettings)
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    api: ActionsApiSettings = Field(default_factory=ActionsApiSettings)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        # A flat key that moved into a section is named with its new place, not silently ignored or unknown.
        if isinstance(data, dict):
            moved = [f"actuation.{key} moved: use actuation.{new}"
                     for key, new in _MOVED_ACTUATION_SETTINGS.items() if key in data]
            if moved:
                raise ValueError("; ".join(moved))
        return data

    @model_validator(mode="after")
    def _targets_fit_mode(self) -> Self:
        if self.mode == "recommend-only":
            if self.leader_election.enabled:
                raise ValueError("leader_election.enabled needs an acting mode: recommend-only acts on nothing")
            return self
        if not self.targets:
            raise ValueError(f"actuation.mode {self.mode} needs actuation.targets (the targets it may change)")
        problems = [problem for target in self.targets for problem in target.check_mode(self.mode)]
        names = [target.target for target in self.targets]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            problems.append(f"each target at most once; repeated: {', '.join(repeated)}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def enabled(self) -> bool:
        return self.mode != "recommend-only"

    @property
    def lease_namespace(self) -> str:
        """The namespace of the leader election's Lease (its own setting, else the acted-on objects')."""
        return self.leader_election.namespace or self.kubernetes.namespace


class Settings(BaseSettings):
    """Everything the sidecar needs to run; built once by `load_settings` and never mutated."""

    model_config = SettingsConfigDict(
        env_prefix="SPEC_ADVISOR_", env_nested_delimiter="__", extra="forbid", frozen=True, populate_by_name=True
    )

    targets: list[TargetSettings] = Field(min_length=1, description="Inference servers to advise on.")
    scrape_interval_s: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="Time between iterations. 5 s gives 12 samples per 60 s window at a negligible cost to vLLM.",
    )
    scrape_timeout_s: float = Field(
        default=4.0, gt=0, le=600, description="Per-scrape timeout; below the interval so a slow target cannot pile up."
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Largest /metrics body read; real vLLM pages are ~100 KB, 8 MiB bounds memory on a wrong URL.",
    )
    stall_after_intervals: int = Field(
        default=3, ge=2, le=100, description="/healthz fails after this many intervals without a finished iteration."
    )
    host: str = Field(
        default="127.0.0.1",
        description="Listen address. Loopback by default (safe); a pod needs 0.0.0.0 for Prometheus to reach it.",
    )
    port: int = Field(default=8321, ge=0, le=65535, description="Listen port; 8321 avoids vLLM's 8000 in the same pod.")
    api_max_connections: int = Field(
        default=256,
        ge=1,
        le=65536,
        description="Most API connections open at once; one more is closed as soon as it is accepted (counted as "
        "api_connections_closed_total{reason=\"over_limit\"}). 256 is far more than the API's readers hold "
        "(Prometheus, probes, a few dashboards and people) and far below the usual open-file limit of 1024, so a "
        "flood of connections cannot use up the process's file descriptors. Keep it below `ulimit -n`.",
    )
    api_request_read_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description="Seconds a client has to send a whole request (head and body), from opening the connection or "
        "from the first byte of its next request on a kept-alive one; a connection still short of it is closed "
        "(api_connections_closed_total{reason=\"read_timeout\"}). 10 s lets the largest request (a 256 KiB what-if "
        "body) through at 26 KB/s and bounds how long a client sending nothing, or a byte at a time, holds a "
        "connection. Idle kept-alive connections are closed after 75 s instead.",
    )
    fallback_hardware: str = Field(
        default="h100-sxm",
        description="Hardware profile used by targets with hardware 'auto' when no GPU name is known: the most "
        "common serving GPU, so the cost model is in the right ballpark until configured.",
    )
    log_format: Literal["text", "json"] = Field(default="text", description="json for log collectors, text for people.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Least severity logged; debug adds every repeated scrape failure (info warns once "
        "per outage)."
    )
    gpu: GpuSettings = Field(default_factory=GpuSettings)
    estimator: EstimatorSettings = Field(default_factory=EstimatorSettings)
    decide: DecideSettings = Field(default_factory=DecideSettings)
    objective: ObjectiveSettings = Field(default_factory=ObjectiveSettings)
    calibration: CalibrationSettings = Field(default_factory=CalibrationSettings)
    actuation: ActuationSettings = Field(default_factory=ActuationSettings)

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        if self.estimator.window_s < 2 * self.scrape_interval_s:
            raise ValueError(
                f"estimator.window_s ({self.estimator.window_s:g}) must be at least 2 x scrape_interval_s "
                f"({self.scrape_interval_s:g}): a window needs two scrapes to hold a delta"
            )
        if self.scrape_timeout_s > self.scrape_interval_s:
            raise ValueError(
                f"scrape_timeout_s ({self.scrape_timeout_s:g}) must not exceed scrape_interval_s "
                f"({self.scrape_interval_s:g})"
            )
        if self.estimator.stale_after_s <= self.scrape_interval_s:
            raise ValueError(
                f"estimator.stale_after_s ({self.estimator.stale_after_s:g}) must exceed scrape_interval_s "
                f"({self.scrape_interval_s:g}), or every scrape would look stale"
            )
        names = [target.name for target in self.targets]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"target names must be unique; repeated: {', '.join(duplicates)}")
        unknown = sorted({t.target for t in self.actuation.targets} - set(names))
        if unknown:
            raise ValueError(f"actuation.targets name targets that are not configured: {', '.join(unknown)}")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) beat env, env beats the file (added by load_settings); no .env or secrets dir magic.
        return (init_settings, env_settings)


MIN_WRITE_TOKEN_CHARS = 16


def write_token(actuation: ActuationSettings, environ: Mapping[str, str]) -> str | None:
    """The write endpoints' bearer token from `api.write_token_file` (stripped) or the env var; None when neither
    holds one. Raises SettingsError when the file cannot be read or the token is shorter than
    MIN_WRITE_TOKEN_CHARS."""
    if actuation.api.write_token_file is not None:
        try:
            token = actuation.api.write_token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SettingsError(
                f"actuation.api.write_token_file: cannot read {actuation.api.write_token_file}: {exc.strerror or exc}"
            ) from None
        source = f"actuation.api.write_token_file {actuation.api.write_token_file}"
    else:
        token = environ.get(actuation.api.write_token_env, "").strip()
        source = f"env {actuation.api.write_token_env}"
    if token and len(token) < MIN_WRITE_TOKEN_CHARS:
        # A short token can be guessed; the write endpoints can pause acting or force a setting.
        raise SettingsError(
            f"{source}: the write token has {len(token)} characters, fewer than {MIN_WRITE_TOKEN_CHARS}; use a "
            "long random one (e.g. `openssl rand -hex 32`)"
        )
    return token or None


def target_name_for_url(url: str) -> str:
    """A stable target name for a bare `--target URL`: host and port ('127.0.0.1:8000')."""
    parts = urlsplit(url)
    host = parts.hostname or "target"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host


def load_settings(config_file: Path | None = None, *, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Build the settings from an optional YAML file, the environment and `overrides` (highest priority).

    Raises `SettingsError` with one line per problem; never a traceback-worthy exception for bad input.
    """
    file_values = _read_yaml(config_file) if config_file is not None else {}

    class _FromFile(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, InitSettingsSource(settings_cls, init_kwargs=file_values))

    try:
        loaded = _FromFile(**dict(overrides or {}))
    except ValidationError as exc:
        raise SettingsError(format_validation_error(exc, config_file)) from None
    except SourceParseError as exc:
        # pydantic-settings could not decode an env var (lists and sections are JSON there): bad input, not a bug.
        cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
        raise SettingsError(
            f"invalid settings (env SPEC_ADVISOR_*): {exc}{cause}. Lists and sections in env vars are JSON, e.g. "
            """SPEC_ADVISOR_TARGETS='[{"name": "a", "url": "http://vllm:8000"}]'"""
        ) from None
    except ValueError as exc:  # anything else a settings source rejects (ValidationError is handled above)
        raise SettingsError(f"invalid settings: {exc}") from None
    # Hand out the plain class so nothing downstream sees the loader's subclass.
    return Settings.model_construct(**{name: getattr(loaded, name) for name in Settings.model_fields})


def format_validation_error(exc: ValidationError, config_file: Path | None = None) -> str:
    sources = "env SPEC_ADVISOR_*, flags"
    where = f" (config file {config_file}, {sources})" if config_file else f" ({sources})"
    lines = [f"invalid settings{where}:"]
    for error in exc.errors(include_url=False):
        location = ".".join(str(part) for part in error["loc"]) or "settings"
        message = str(error["msg"]).removeprefix("Value error, ")  # pydantic's prefix for our own ValueErrors
        lines.append(f"  {location}: {message}")
    return "\n".join(lines)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold a mapping of settings at the top level")
    return data
