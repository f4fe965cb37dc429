"""The simulator's scenario file: the ground truth a simulated vLLM server runs on.

A scenario states what the advisor is supposed to discover: how long an engine step really takes on this
(simulated) accelerator, how often each draft position is really accepted and how that drifts, how load arrives.
The physics here is the simulator's own; it is deliberately written apart from the advisor's cost model
(`policies/`), so that a benchmark against it does not grade the model against itself.

Units are in the field names: `_s` seconds, `_bytes`, `_per_s` rates, `_tokens` token counts, `_ratio` 0..1.
Times inside the scenario (`t_s`, `drift_start_s`, ...) are seconds since the world's start, not epoch times.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# set_speculation() accepts 0..this; vLLM itself allows more, but no drafter in practice benefits beyond it.
MAX_SPECULATIVE_TOKENS = 16

DrafterMethod = Literal["ngram", "suffix", "eagle", "eagle3", "mtp", "draft_model"]

# Methods that look continuations up on the host (prompt/suffix lookup) and may find fewer than k tokens, or none.
LOOKUP_METHODS: frozenset[str] = frozenset({"ngram", "suffix"})

Ratio = Annotated[float, Field(ge=0.0, le=1.0)]


class ScenarioError(ValueError):
    """A scenario could not be read or is invalid; the message names the file and the offending field path."""


class _Model(BaseModel):
    # A scenario describes a finite world: inf or NaN in any number would only fail later, mid-run, unnamed.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class HardwareTruth(_Model):
    """How long one engine step really takes: the accelerator side.

    step = (overhead + per-token overhead x tokens + busy) x jitter, where busy is the p-norm of the memory time and
    the compute time (p = `overlap_exponent`; p -> infinity is a hard max, p = 1 a plain sum). The compute term
    counts tokens rounded up to whole `compute_tile_tokens` tiles (matmul tiles are padded on a real GPU) and its
    efficiency grows with the step's token count N: small + (achieved - small) x N / (N + half) (skinny matmuls
    reach a lower share of peak than big prefill chunks).
    """

    name: str = Field(default="simulated accelerator", description="Free text shown in the live view.")
    memory_bandwidth_bytes_per_s: float = Field(gt=0, description="Peak HBM bandwidth of the accelerator(s).")
    achieved_bandwidth_ratio: float = Field(
        gt=0, le=1, description="Fraction of peak bandwidth a decode step really streams at."
    )
    dense_flops_per_s: float = Field(gt=0, description="Peak dense FLOP/s at the model's dtype.")
    achieved_flops_ratio: float = Field(
        gt=0, le=1, description="Fraction of peak FLOP/s reached by steps with many tokens (big prefill chunks)."
    )
    small_step_flops_ratio: float | None = Field(
        default=None, gt=0, le=1, description="Fraction reached by a one-token step; None = achieved_flops_ratio."
    )
    flops_ratio_half_tokens: float = Field(
        default=1024.0, gt=0, description="Tokens per step at which efficiency is halfway from small to achieved."
    )
    step_overhead_s: float = Field(ge=0, description="Fixed cost per engine step: launches, scheduler, sampler.")
    overhead_per_token_s: float = Field(
        default=0.0, ge=0, description="Host/sampler cost per token in the step (logits, rejection sampling)."
    )
    overlap_exponent: float = Field(
        default=3.0, ge=1, le=64, description="p of the p-norm that blends memory and compute time."
    )
    compute_tile_tokens: int = Field(
        default=1, ge=1, le=4096, description="Compute counts tokens in whole tiles of this many tokens."
    )
    jitter_ratio: float = Field(
        default=0.0, ge=0, le=0.5, description="Log-normal sigma of the per-step multiplicative jitter (mean 1)."
    )

    @model_validator(mode="after")
    def _check_efficiency(self) -> HardwareTruth:
        if self.small_step_flops_ratio is not None and self.small_step_flops_ratio > self.achieved_flops_ratio:
            raise ValueError("small_step_flops_ratio must be <= achieved_flops_ratio")
        return self


class MixtureOfExperts(_Model):
    """A mixture-of-experts target: which expert weights a step streams depends on the tokens it runs.

    With uniform routing, a step over N tokens touches E x (1 - (1 - k/E)^N) distinct experts per layer (E =
    `num_experts`, k = `experts_per_token`), so verifying drafts streams more expert weights than decoding one
    token: speculation is far less free at batch 1 than on a dense model, and cheaper once a batch touches them all.
    """

    num_experts: int = Field(ge=2, le=4096, description="Routed experts per MoE layer.")
    experts_per_token: int = Field(ge=1, description="Experts each token is routed to (top-k).")
    expert_bytes: float = Field(gt=0, description="Bytes of ONE expert's weights summed over all MoE layers.")

    @model_validator(mode="after")
    def _check_routing(self) -> MixtureOfExperts:
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token must be <= num_experts")
        return self

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct experts (per layer) a step over `tokens` tokens reads; 0 tokens read none."""
        if tokens <= 0:
            return 0.0
        miss = 1.0 - self.experts_per_token / self.num_experts
        return float(self.num_experts * (1.0 - miss**tokens))


class ModelTruth(_Model):
    """The target model as the hardware sees it (what a step streams and computes).

    Dense models stream `weight_bytes` every step. With `moe`, `weight_bytes` is the always-read part (attention,
    embeddings, router, shared experts) and each step adds the routed experts its tokens touch (see
    `MixtureOfExperts`); `active_params` is then the parameters one token uses (shared + its top-k experts).
    """

    weight_bytes: float = Field(gt=0, description="Bytes of weights streamed once per step (per GPU).")
    moe: MixtureOfExperts | None = Field(default=None, description="Routed experts; None = a dense model.")
    active_params: float = Field(gt=0, description="Parameters used per token (active experts only for MoE).")
    kv_bytes_per_token: float = Field(gt=0, description="KV-cache bytes one token of context occupies.")
    attention_flops_per_token_ctx: float = Field(
        default=0.0, ge=0, description="Attention FLOPs per query token per context token."
    )


class DrafterTruth(_Model):
    """The speculative drafter: how it proposes, how often it is right, what it costs.

    Acceptance is conditional per position: `conditional_acceptance[i]` = P(draft i accepted | drafts 0..i-1
    accepted). Positions past the end of the list reuse its last value. When `conditional_acceptance_drift_to` is
    given, each position moves linearly from the first profile to the second between `drift_start_s` and
    `drift_end_s` (seconds since the world's start) and stays there.
    """

    method: DrafterMethod = Field(
        description="How drafts are made: eagle, eagle3, mtp, draft_model (a model), ngram or suffix (host lookups)."
    )
    num_speculative_tokens: int = Field(
        ge=0, le=MAX_SPECULATIVE_TOKENS, description="k at start-up; 0 = speculation off."
    )
    conditional_acceptance: tuple[Ratio, ...] = Field(
        min_length=1, max_length=MAX_SPECULATIVE_TOKENS,
        description="P(draft i accepted | drafts 0..i-1 accepted) per position i; the last repeats past the end.",
    )
    conditional_acceptance_drift_to: tuple[Ratio, ...] | None = Field(
        default=None, min_length=1, max_length=MAX_SPECULATIVE_TOKENS
    )
    drift_start_s: float = Field(default=0.0, ge=0, description="When the drift to the second profile starts (s).")
    drift_end_s: float = Field(default=0.0, ge=0, description="When the second profile is reached (s).")
    lookup_match_ratio: Ratio = Field(
        default=1.0, description="ngram/suffix only: share of verifications where the lookup proposes anything."
    )
    lookup_full_length_ratio: Ratio = Field(
        default=1.0,
        description="ngram/suffix only: share of proposals with all k tokens; the rest propose 1..k-1 uniformly.",
    )
    host_s_per_request: float = Field(
        default=0.0, ge=0, description="Host time per running request per step (lookup, bookkeeping)."
    )
    draft_step_overhead_s: float = Field(
        default=0.0, ge=0, description="Fixed cost of each of the k sequential draft forward passes."
    )
    draft_weight_bytes: float = Field(default=0.0, ge=0, description="Bytes the draft head/model streams per pass.")
    draft_active_params: float = Field(default=0.0, ge=0, description="Draft parameters used per token per pass.")
    request_acceptance_spread: float = Field(
        default=0.0, ge=0, le=1.5,
        description="Requests differ in how well the drafter predicts them: each request's conditional acceptance is "
        "the profile's times exp(spread x z) (at most 0.98), z the mean of one quartile of a standard normal "
        "(+-0.325, +-1.271), each quartile a quarter of the requests. 0 = every request alike.",
    )

    @model_validator(mode="after")
    def _check_method_fields(self) -> DrafterTruth:
        lookup = self.method in LOOKUP_METHODS
        if lookup and (self.draft_weight_bytes > 0 or self.draft_active_params > 0 or self.draft_step_overhead_s > 0):
            raise ValueError(f"method {self.method!r} has no draft model: draft_* costs must be 0")
        if not lookup and (self.lookup_match_ratio != 1.0 or self.lookup_full_length_ratio != 1.0):
            raise ValueError(f"lookup_* ratios only apply to ngram/suffix, not to method {self.method!r}")
        if self.conditional_acceptance_drift_to is not None and self.drift_end_s < self.drift_start_s:
            raise ValueError("drift_end_s must be >= drift_start_s")
        return self


class EngineLimits(_Model):
    """The vLLM engine's configuration: batch and KV-cache limits, and how long a reconfiguration takes."""

    max_num_seqs: int = Field(ge=1, le=4096, description="Most requests running in one batch.")
    max_num_batched_tokens: int = Field(ge=1, description="Token budget of one step (chunked prefill shares it).")
    kv_capacity_tokens: int = Field(ge=1, description="KV-cache capacity in tokens (num_gpu_blocks x block_size).")
    block_size: int = Field(default=16, ge=1, le=1024, description="Tokens per KV-cache block.")
    max_model_len: int = Field(ge=1, description="Longest prompt + output; also sets the token histograms' buckets.")
    restart_delay_s: float = Field(
        ge=0, description="How long one replica is down when speculation is reconfigured (a restart)."
    )
    replicas: int = Field(
        default=1, ge=1, le=64, description="Identical replicas behind a load balancer; the world simulates the "
        "average one (the workload's rate is per replica)."
    )
    reconfigure: Literal["restart", "rolling"] = Field(
        default="restart",
        description="restart: every replica restarts at once, nothing is served for restart_delay_s. rolling "
        "(replicas >= 2): one replica at a time, capacity drops by 1/replicas for restart_delay_s per replica.",
    )

    @model_validator(mode="after")
    def _check_blocks(self) -> EngineLimits:
        if self.kv_capacity_tokens < self.block_size:
            raise ValueError("kv_capacity_tokens must hold at least one block (>= block_size)")
        if self.reconfigure == "rolling" and self.replicas < 2:
            raise ValueError("reconfigure 'rolling' needs replicas >= 2 (a single replica can only restart)")
        return self


class RatePoint(_Model):
    """One knot of the piecewise-linear arrival-rate profile."""

    t_s: float = Field(ge=0, description="Seconds since the start of the period.")
    requests_per_s: float = Field(ge=0, le=100_000, description="Poisson arrival rate at this knot.")


class FixedLength(_Model):
    """Every request has the same length."""

    kind: Literal["fixed"]
    tokens: int = Field(ge=1)

    @property
    def max_tokens(self) -> int:
        return self.tokens


class UniformLength(_Model):
    """Lengths uniform over [min_tokens, max_tokens] (integers, both included)."""

    kind: Literal["uniform"]
    min_tokens: int = Field(ge=1)
    max_tokens: int = Field(ge=1)

    @model_validator(mode="after")
    def _check_range(self) -> UniformLength:
        if self.max_tokens < self.min_tokens:
            raise ValueError("max_tokens must be >= min_tokens")
        return self


class LogNormalLength(_Model):
    """Log-normal lengths with the given median and log-space sigma, clipped to [min_tokens, max_tokens]."""

    kind: Literal["lognormal"]
    median_tokens: float = Field(gt=0, description="exp(mu) of the log-normal.")
    sigma: float = Field(ge=0, le=4, description="Log-space standard deviation.")
    min_tokens: int = Field(ge=1)
    max_tokens: int = Field(ge=1)

    @model_validator(mode="after")
    def _check_range(self) -> LogNormalLength:
        if self.max_tokens < self.min_tokens:
            raise ValueError("max_tokens must be >= min_tokens")
        return self


LengthDistribution = Annotated[FixedLength | UniformLength | LogNormalLength, Field(discriminator="kind")]


class Workload(_Model):
    """How requests arrive (Poisson, with a periodic piecewise-linear rate) and how long they are.

    The rate interpolates linearly between knots; after the last knot it returns linearly to the first knot's
    rate at `period_s`, and the whole profile repeats every `period_s`.
    """

    arrival_rate: tuple[RatePoint, ...] = Field(
        min_length=1,
        description="Knots of a piecewise-linear rate over one period, repeated (steady, ramps, bursts, diurnal).",
    )
    period_s: float = Field(gt=0, description="Length of the repeating arrival-rate period (s).")
    prompt_tokens: LengthDistribution = Field(description="Prompt length per request (tokens).")
    output_tokens: LengthDistribution = Field(description="Output length per request (tokens, its max_tokens).")

    @model_validator(mode="after")
    def _check_profile(self) -> Workload:
        times = [p.t_s for p in self.arrival_rate]
        if times[0] != 0.0:
            raise ValueError("arrival_rate must start at t_s = 0")
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ValueError("arrival_rate t_s must be strictly increasing")
        if times[-1] >= self.period_s:
            raise ValueError("every arrival_rate t_s must be < period_s")
        return self


class Simulation(_Model):
    """How the simulator trades fidelity for speed (not part of the world being simulated)."""

    quantum_s: float = Field(
        default=0.25, gt=0, le=10, description="Engine steps are simulated in groups spanning about this long."
    )
    max_steps_per_group: int = Field(
        default=64, ge=1, le=10_000, description="Most engine steps simulated as one group."
    )


class Scenario(_Model):
    """A complete simulated deployment: model, accelerator, drafter, engine limits, workload, seed."""

    model_name: str = Field(min_length=1, description="Served model name (the `model_name` label).")
    seed: int = Field(default=0, description="Mixed with World(seed=...) to seed every random stream.")
    hardware: HardwareTruth
    model: ModelTruth
    drafter: DrafterTruth
    engine: EngineLimits
    workload: Workload
    simulation: Simulation = Simulation()

    @model_validator(mode="after")
    def _check_lengths(self) -> Scenario:
        longest = self.workload.prompt_tokens.max_tokens + self.workload.output_tokens.max_tokens
        if longest > self.engine.max_model_len:
            raise ValueError(
                f"longest prompt + output ({longest} tokens) exceeds engine.max_model_len ({self.engine.max_model_len})"
            )
        # Admission rounds up to whole blocks and reserves up to MAX_SPECULATIVE_TOKENS lookahead slots.
        if longest + MAX_SPECULATIVE_TOKENS + self.engine.block_size > self.engine.kv_capacity_tokens:
            raise ValueError("engine.kv_capacity_tokens cannot hold even one longest request")
        return self


def _format_location(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += part if not path else f".{part}"
    return path or "<root>"


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        # Discriminated unions add the tag to the location ("prompt_tokens.lognormal.sigma"); keep it, it says
        # which variant was checked. Model validators report at the model's own path.
        where = _format_location(tuple(item["loc"]))
        value = item["input"]
        scalar = value is None or isinstance(value, str | int | float | bool)
        got = f" (got {value!r})" if scalar and item["type"] != "missing" else ""
        lines.append(f"{where}: {item['msg']}{got}")
    return "; ".join(lines)


def scenario_from_mapping(data: Any, *, source: str = "<mapping>") -> Scenario:
    """Validate already-parsed scenario data (a mapping); raise ScenarioError naming each bad field's path."""
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: a scenario must be a mapping at the top level, got {type(data).__name__}")
    try:
        return Scenario.model_validate(dict(data))
    except ValidationError as exc:
        raise ScenarioError(f"{source}: invalid scenario: {_describe(exc)}") from exc


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario from YAML or JSON (by suffix; anything not `.json` is read as YAML)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{source}: cannot read scenario: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{source}: not valid {'JSON' if source.endswith('.json') else 'YAML'}: {exc}") from exc
    return scenario_from_mapping(data, source=source)


def default_scenario() -> Scenario:
    """The packaged demo scenario (`service/sim/scenarios/demo.yaml`)."""
    resource = resources.files("service.sim").joinpath("scenarios/demo.yaml")
    data = yaml.safe_load(resource.read_text(encoding="utf-8"))
    return scenario_from_mapping(data, source="service/sim/scenarios/demo.yaml")
