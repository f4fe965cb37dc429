"""Typed, frozen values that flow through the pipeline: observe -> estimate -> model -> decide.

These are the contracts between `service/` (which builds `EngineSnapshot`/`GpuSnapshot` from I/O) and the pure
`policies/` package. Units are in the field names (`_s` seconds, `_bytes`, `_ratio` for 0..1); times are Unix epoch
seconds passed in by the caller, never read from a clock here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class DataState(StrEnum):
    """How far the data behind a target's evidence and recommendation can be trusted: ok (a fresh, full window),
    insufficient_data (speculating with too few drafts in the window to trust the acceptance, or not evaluated
    yet), stale (no good scrape for a while), error (no usable data). The wire values are part of the REST
    contract, where the field is named `state`."""

    OK = "ok"
    INSUFFICIENT_DATA = "insufficient_data"
    STALE = "stale"
    ERROR = "error"


class DraftMethod(StrEnum):
    """How draft tokens are produced; decides the drafter's cost model."""

    NGRAM = "ngram"
    SUFFIX = "suffix"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    DRAFT_MODEL = "draft_model"


# ------------------------------------------------------------------------------------------------------------
# Observe: raw readings at one instant (built by service/sources, consumed by policies/estimate)
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistogramReading:
    """A cumulative Prometheus histogram at one instant, summed over engines.

    `buckets` holds (upper bound `le`, cumulative count) pairs in ascending `le`, the last one `inf`.
    """

    sum: float
    count: float
    buckets: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class SpecDecodeCounters:
    """An engine's speculative-decoding counters at one instant, summed over engines (vLLM's four `spec_decode_*`
    families, or what another engine's adapter derives: service/sources/).

    `drafts` counts verifications that carried a draft, `draft_tokens` the tokens proposed, `accepted_tokens` those
    accepted. `accepted_per_position[i]` counts verifications in which at least i+1 drafts were accepted; its length
    is the deployed k (vLLM creates every position series at start-up). Engines without per-position counters
    (SGLang) leave it empty and give the deployed k as `declared_k` (>= 1): only the mean accepted length is then
    measured.
    """

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: tuple[float, ...]
    declared_k: int = 0
    # Drafts that proposed at least i+1 tokens, where the engine counts them (TensorRT-LLM's drafted-per-position
    # counters); empty where it does not. With them the acceptance among drafts that reached a position is
    # measurable even where a schedule or controller shortened drafts.
    drafted_per_position: tuple[float, ...] = ()

    @property
    def deployed_k(self) -> int:
        return len(self.accepted_per_position) or self.declared_k

    @property
    def positions_measured(self) -> bool:
        """Whether the acceptance per position is counted (vLLM) rather than only its sum (other engines)."""
        return bool(self.accepted_per_position)


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """Everything read from one inference server's `/metrics` for one model at one instant.

    `spec is None` means the speculative families were absent: speculation is off (not an error).
    `created_s` is the earliest `*_created` timestamp of the counters read (the server's counter epoch); a change
    means the server restarted and every counter has a new baseline.
    Optional fields are None when the server does not export them (older vLLM, another engine).
    """

    taken_at_s: float
    model_name: str
    engines: int
    spec: SpecDecodeCounters | None
    num_requests_running: float
    num_requests_waiting: float
    created_s: float | None = None
    kv_cache_usage_ratio: float | None = None
    kv_cache_capacity_tokens: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    inter_token_latency: HistogramReading | None = None
    iteration_tokens: HistogramReading | None = None
    # vllm:request_time_per_output_token_seconds: each finished request's own mean inter-token latency.
    request_itl: HistogramReading | None = None
    # vllm:time_to_first_token_seconds: one observation per request whose prompt was prefilled (its count is used).
    first_token_latency: HistogramReading | None = None
    # Finished requests with at most one output token (vllm:request_generation_tokens, le="1.0"), cumulative.
    # vLLM records each of them in request_itl with a mean ITL of 0.
    single_token_requests: float | None = None
    estimated_flops: float | None = None
    estimated_read_bytes: float | None = None
    naming: str = "vllm-v1"


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """GPU telemetry at one instant. `source` is "nvml", "dcgm" or "absent" (no local telemetry: not a failure).

    Activity signals are ratios in 0..1. `gpu_util_ratio` (NVML utilization.gpu / DCGM_FI_DEV_GPU_UTIL) only says a
    kernel was running; `tensor_active_ratio` and `dram_active_ratio` (GPM or DCGM PROF fields) measure saturation.
    """

    taken_at_s: float
    source: str
    device_name: str | None = None
    device_count: int = 0
    gpu_util_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    sm_active_ratio: float | None = None
    activity_source: str | None = None  # "gpm" or "dcgm" when the activity ratios are present
    error: str | None = None


# ------------------------------------------------------------------------------------------------------------
# Estimate: windowed evidence with uncertainty (built by policies/estimate)
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AcceptanceEvidence:
    """Acceptance measured over a window at the deployed k.

    `per_position[i]` is r_{i+1} = P(at least i+1 drafts accepted) (monotone non-increasing), with a binomial
    confidence interval (`per_position_low/high`). `mean_acceptance_length` = 1 + accepted/drafts (tokens emitted
    per verification, bonus token included). `acceptance_rate` = accepted/draft_tokens (what vLLM users quote).
    `cold_start` marks an estimate from lifetime counters (the first scrape) rather than a window delta.
    `draft_coverage` (0..1]: the share of decoding sequence-steps that carried a draft, Δdrafts / Δ(inter-token-
    latency count) (one ITL observation per sequence per decode step). A drafter that proposes only where it finds
    a match (n-gram, suffix) leaves the rest of the steps plain: 58% of sequence-steps carried a draft for an
    untied tiny model on vLLM 0.32 CPU, so its tokens per sequence-step were 1 + 0.58 x 1.54, not E[L] = 2.54.
    1.0 when the ITL count is not exported.
    `positions_measured` False: the engine counts only the accepted total (SGLang), so
    `per_position` is the i.i.d. profile alpha^i whose sum is the measured mean accepted drafts (exact at the
    deployed k only; policies/model/acceptance.py bounds the other gammas without it) and `per_position_low/high`
    the same fit to the mean's interval.
    """

    per_position: tuple[float, ...]
    per_position_low: tuple[float, ...]
    per_position_high: tuple[float, ...]
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    mean_acceptance_length: float
    acceptance_rate: float
    mean_proposed_length: float
    window_s: float
    cold_start: bool = False
    draft_coverage: float = 1.0
    positions_measured: bool = True
    # Where the engine counts drafts per position: r_{i+1} among the drafts that reached position i,
    # Δaccepted[i] / Δdrafted[i], with Wilson bounds. Acceptance stops at the first rejection and does not depend on
    # how far a draft was scheduled to run, so this is the profile of full-length drafts even where a
    # draft_len_schedule or controller cut some short (per_position then understates the deep positions).
    per_position_given_drafted: tuple[float, ...] = ()
    per_position_given_drafted_low: tuple[float, ...] = ()
    per_position_given_drafted_high: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the estimator concluded about one target at `at_s`; the decision's only view of the world."""

    target: str
    model: str
    at_s: float
    state: DataState
    speculation_on: bool
    deployed_k: int
    acceptance: AcceptanceEvidence | None
    batch: float
    waiting: float
    kv_cache_usage_ratio: float | None = None
    context_tokens_per_seq: float | None = None
    step_time_s: float | None = None
    step_samples: float = 0.0
    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    achieved_flops_per_s: float | None = None
    achieved_read_bytes_per_s: float | None = None
    gpu: GpuSnapshot | None = None
    window_s: float = 0.0
    reason: str = ""
    # Prompt (prefill) tokens computed per engine step on average (chunked prefill shares each step with decode):
    # Δprompt_tokens / Δsteps, steps from the iteration-tokens histogram count. None when not measurable.
    prefill_tokens_per_step: float | None = None
    # Prompt tokens computed per prefilled request: Δprompt_tokens / Δ(count of vllm:time_to_first_token_seconds,
    # one per request whose prompt was prefilled). The chunk a prompt arrives in (a whole prompt per step under the
    # token budget), so prefill_tokens_per_step / this is the share of steps that carry one. None when not measurable.
    prompt_tokens_per_request: float | None = None
    # Sequences decoding per engine step on average: Δ(inter-token-latency histogram count) / Δsteps. vLLM observes
    # one inter-token latency per request per step that gave it tokens, so this is the batch each step actually
    # verified, free of the idle time and prefilling requests that the running-requests gauge averages in.
    # None when not measurable (no steps in the window, or an engine without those histograms).
    decode_seqs_per_step: float | None = None
    # Data-parallel engines whose counters the evidence sums (vLLM's `engine` label); steps run concurrently on them.
    engines: int = 1
    # The requests that finished in the window by their own mean inter-token latency (s): the window's change in
    # vllm:request_time_per_output_token_seconds, cumulative buckets, without the requests of at most one output
    # token (vLLM records those as 0). None when not exported or not differenceable.
    request_itl: HistogramReading | None = None


# ------------------------------------------------------------------------------------------------------------
# Model and decide
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """Predicted speedup at one gamma (gamma=0 is plain decoding, speedup 1.0 by definition).

    `speedup_low/high` is the band from the acceptance uncertainty (and extrapolation beyond the deployed k);
    `extrapolated` says the point rests on acceptance positions that were not measured;
    `extrapolated_share` (0..1) is how much of `expected_accepted_length` comes from them (all of E[L] - 1 when
    the acceptance is a prior: nothing was measured), so 0.0 means fully measured.
    `slo_share` (0..1, or None when no ITL SLO is configured) is the share of this option's delivered tokens
    predicted to meet the SLO (policies/model/objectives.py); the speedup is then in SLO goodput.
    `gain_sd` (>= 0) is the sd of log(S(gamma) / S(running)) from the cost model's own uncertainty, where running is
    the option the server runs now (policies/model/uncertainty.py): how sure the model is that this option beats or
    trails what runs; 0 for the running option itself and where it was not computed.
    `speedup_low/high` is the 90% band: the acceptance's and, once policies/model/uncertainty.py has added it, the cost
    model's own uncertainty (what the calibration has not identified), in quadrature.
    """

    gamma: int
    speedup: float
    speedup_low: float
    speedup_high: float
    expected_accepted_length: float
    step_time_s: float
    extrapolated: bool = False
    extrapolated_share: float = 0.0
    slo_share: float | None = None
    gain_sd: float = 0.0


class WhyCode(StrEnum):
    """The causes a decision names: a bounded set, so each can label a gauge. Gammas in their numbers are 0 for
    off; gains are shares of the service (0.04 = 4%); times are seconds."""

    BASELINE = "baseline"  # the first decision adopts the deployment as found
    BEST = "best"  # the best gamma on this tick's curve {gamma, speedup, low, high, batch}
    GAIN = "gain"  # a change is worth making {to_gamma, gain, cost_s, wait_s}
    BELOW_MARGIN = "below_margin"  # the best alternative gains less than the margin {to_gamma, gain, margin}
    COST = "cost"  # the best alternative does not pay back what the change costs {to_gamma, gain, cost_s}
    KEPT_MEASURING = "kept_measuring"  # a turn-off goes to the best measured gamma instead {gamma, speedup}
    TRIAL = "trial"  # a move to more drafts goes to the gamma worth most to try {gamma, value_s, against_s, expected}
    OFF_CURVE = "off_curve"  # the running gamma is past the priced range {to_gamma}
    WAITING = "waiting"  # the change waits its turn {to_gamma, waited_s, wait_s}
    SPACING = "spacing"  # the last change is too recent {left_s}
    CHANGED = "changed"  # a change is published on this tick {from_gamma, to_gamma, waited_s}
    WITHDRAWN = "withdrawn"  # a pending change no longer pays {to_gamma}
    PROBE = "probe"  # switching on to measure the acceptance again {gamma}
    PROBE_HELD = "probe_held"  # a published probe waits for the engine to run it {gamma, held_s}
    PROBE_BACKOFF = "probe_backoff"  # no probe for a while after one nobody applied {left_s}
    INSUFFICIENT_DATA = "insufficient_data"  # too few drafts in the window {age_s of the kept decision, if any}
    STALE = "stale"  # the last scrape failed {age_s}
    ERROR = "error"  # no good scrape for too long, or no cost model {age_s}
    REMEMBERED = "remembered_acceptance"  # priced from a remembered profile {age_s}
    VERIFICATION_UNMEASURED = "verification_unmeasured"  # one k only seen: a verified token's cost is the prior's
    PLAIN_UNMEASURED = "plain_unmeasured"  # two k, no plain step seen: the speculative bookkeeping's is the prior's


@dataclass(frozen=True, slots=True)
class Why:
    """One structured cause of a decision: its `code` and the numbers it rests on, as (name, value) pairs."""

    code: WhyCode
    numbers: tuple[tuple[str, float], ...] = ()

    def number(self, name: str, default: float = math.nan) -> float:
        """The value named `name` (`default` when absent)."""
        return next((value for key, value in self.numbers if key == name), default)


@dataclass(frozen=True, slots=True)
class Decision:
    """The published recommendation for one target. Field names match the `/v1/recommendation` contract."""

    target: str
    model: str
    state: DataState  # the data's trust (DataState); `state` in /v1/recommendation
    enabled: bool
    num_speculative_tokens: int
    expected_speedup: float
    expected_speedup_low: float
    expected_speedup_high: float
    reason: str
    evaluated_at_s: float
    curve: tuple[CurvePoint, ...] = ()
    changed_at_s: float | None = None
    # Which objective the curve's speedups measure ("latency", "capacity", "goodput_slo"; "" = not evaluated) and
    # the cost model's online calibration error (median |predicted / observed step time - 1| over recent points).
    objective: str = ""
    calibration_error_ratio: float | None = None
    # One sentence for an operator (<= 120 characters, policies/decide/summary.py) and the causes it is made of;
    # `reason` keeps the full arithmetic.
    summary: str = ""
    why: tuple[Why, ...] = ()

    def named(self, code: WhyCode) -> Why | None:
        """The cause with this code, if the decision names it."""
        return next((why for why in self.why if why.code is code), None)
