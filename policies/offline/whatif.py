"""What-if: price a hypothetical workload with the same cost model the advisor uses on live evidence.

Input: hardware (catalog name), tensor-parallel degree, target model (catalog name or a parsed Hugging Face
`config.json`), drafter (method, plus a draft model for `draft_model`), acceptance (exactly one of: per-position
r_i, a mean acceptance length measured at some k, or an i.i.d. per-token rate alpha), and lists of batch sizes,
context lengths and gamma values. Output, for every (batch, context, gamma):

    step_time_s            = T_draft(gamma) + T_target(B, q = 1 + c gamma)   (gamma 0: T_target(B, 1); a tree
                             drafter of `tree_tokens` N: q = N + 1 at every gamma >= 1, gamma = its depth)
    tokens_per_s_per_seq   = E_c[L](gamma) / step_time_s                     (E_c[L] = 1 + c (E[L] - 1); 1 at 0)
    tokens_per_s_total     = B x tokens_per_s_per_seq
    speedup                = tokens_per_s_per_seq / tokens_per_s_per_seq(gamma 0)   (policies/model/costmodel.py S)

plus the best gamma per (batch, context) (speculation off, gamma 0, is always a candidate) and, per (context,
gamma), the crossover batch: the smallest batch at which S(gamma) <= 1. It is searched on a geometric grid
(x CROSSOVER_GRID_FACTOR from batch 1 to CROSSOVER_SEARCH_MAX_BATCH), then bisected to CROSSOVER_RELATIVE_TOL, so it
is the first crossing the grid sees (S is not monotone in B for every MoE model, and the grid is what we promise).

Every sequence-step is priced as drafted unless `acceptance.draft_coverage` c (0..1] says otherwise: 1 is right for
EAGLE/MTP/draft models; an n-gram or suffix drafter drafts only where the context matches (the live sidecar
measures c as Δdrafts / ΔITL count, /v1/evidence `draft_coverage`), and then a step verifies q = 1 + c gamma
tokens per sequence and emits 1 + c (E[L] - 1) (policies/model/costmodel.py). Example: c = 0.58, E[L](3) = 2.54 ->
E_c[L](3) = 1.89 tokens per step, q = 2.74.

Acceptance inputs, as r_i = P(at least i drafts accepted):
- `per_position` (r_1..r_k, non-increasing, each in [0, 1]): used as measured; gamma > k extrapolates
  conservatively (policies/model/acceptance.py) and the points say so (`extrapolated`, `extrapolated_share`).
- `mean_acceptance_length` L at `measured_at_k` k (vLLM's 1 + accepted/drafts, bonus token included, in
  [1, k + 1]): converted to the i.i.d. alpha with (1 - alpha^(k+1)) / (1 - alpha) = L (bisection), r_i = alpha^i
  for i <= k; beyond k extrapolated as above.
  Example: L = 2.79 at k = 3 -> alpha = 0.763 (1 + 0.763 + 0.582 + 0.444 = 2.79).
- `iid_rate` alpha in [0, 1] (Leviathan et al.'s per-token acceptance; NOT vLLM's accepted/draft-tokens
  "acceptance rate", which averages over positions): r_i = alpha^i for every gamma asked, nothing extrapolated.

No online calibration here (nothing is observed): the profiles' physics and overhead defaults are used as they are
(policies/model/profiles.py documents each constant). Everything is pure: the caller parses JSON and files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from policies import iid
from policies.model.acceptance import AcceptancePoint, acceptance_curve
from policies.model.calibrate import (
    UNIDENTIFIED_WITHOUT_PLAIN,
    CalibrationConfig,
    for_drafter,
    prior_covariance,
    split_observed,
    unidentified,
)
from policies.model.costmodel import ModelContext, chunked_shape
from policies.model.kv_capacity import VLLM_GPU_MEMORY_UTILIZATION, MemoryFit, memory_fit
from policies.model.measured_profile import MeasuredProfile, ProfileError, fit_profile, observations
from policies.model.profiles import (
    DrafterProfile,
    HardwareProfile,
    ModelProfile,
    drafter_for,
    hardware_by_name,
    hardware_from_spec,
    model_by_name,
    model_from_hf_config,
)
from policies.model.roofline import CostScales, Shape
from policies.model.token_budget import curve_within_budget, verified_tokens
from policies.model.uncertainty import Spread, banded
from policies.offline.schedule import ScheduleInputs
from policies.types import AcceptanceEvidence, CurvePoint, DraftMethod

GAMMA_LIMIT = 16  # deepest chain priced; vLLM's EAGLE/MTP deployments use k <= ~8
MAX_POINTS = 2048  # batch sizes x context lengths x gammas in one request
MAX_BATCH_SIZES = 64
MAX_CONTEXT_LENGTHS = 8
MAX_BATCH = 65536.0
MAX_CONTEXT_TOKENS = 4_194_304.0  # 4M tokens: longer than any served context window today
MAX_PREFILL_TOKENS_PER_STEP = 1_048_576.0
MAX_TENSOR_PARALLEL = 64
MAX_BATCHED_TOKENS = 1_048_576  # vLLM's --max-num-batched-tokens: far above any served step
# The most tokens one step runs inside a CUDA graph on vLLM by default: max_cudagraph_capture_size = min(2 x
# max_num_seqs x (1 + num_speculative_tokens), 512), then at most max_num_batched_tokens (vllm/config/vllm.py
# `_set_cudagraph_sizes`); a larger step is dispatched without a graph (CUDAGraphMode.NONE, vllm/v1/cudagraph_
# dispatcher.py), every kernel launched from the host. 512 whenever max_num_seqs x (1 + k) >= 256.
VLLM_CUDAGRAPH_MAX_TOKENS = 512
MAX_TREE_TOKENS = 256  # SGLang and TensorRT-LLM trees verify up to a few dozen to ~100 tokens per sequence
CROSSOVER_SEARCH_MAX_BATCH = 4096.0
CROSSOVER_GRID_FACTOR = 1.25
CROSSOVER_RELATIVE_TOL = 0.005
# A profile built from an inline config.json must stay in physical ranges: beyond these the numbers are a typo.
_MAX_PARAMS = 1e14
_MAX_DIM = 1_000_000
_POSITIVE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "vocab_size")


class WhatIfInputError(ValueError):
    """An input the model cannot price; `field` is the dotted input field (e.g. "target_model", "drafter")."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


ModelSpec = str | Mapping[str, object]
HardwareSpec = str | Mapping[str, object]


@dataclass(frozen=True, slots=True)
class AcceptanceSpec:
    """Exactly one of `per_position`, `mean_acceptance_length` (with `measured_at_k`) or `iid_rate` (module doc),
    and the draft coverage c in (0, 1]: the share of sequence-steps that carry a draft (1 unless stated)."""

    per_position: tuple[float, ...] | None = None
    mean_acceptance_length: float | None = None
    measured_at_k: int | None = None
    iid_rate: float | None = None
    draft_coverage: float = 1.0


@dataclass(frozen=True, slots=True)
class WhatIfInput:
    """A hypothetical deployment and the grid to price it on (units: tokens, sequences; see module docstring)."""

    hardware: HardwareSpec
    target_model: ModelSpec
    drafter_method: DraftMethod
    acceptance: AcceptanceSpec
    batch_sizes: tuple[float, ...]
    context_lengths: tuple[float, ...]
    gammas: tuple[int, ...]
    tensor_parallel: int = 1
    draft_model: ModelSpec | None = None
    prefill_tokens_per_step: float = 0.0
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    tree_tokens: int | None = None
    draft_tensor_parallel: int | None = None
    max_num_batched_tokens: int | None = None
    prompt_tokens: float | None = None


@dataclass(frozen=True, slots=True)
class WhatIfPoint:
    """One priced (batch, context, gamma). Times in seconds, throughputs in tokens per second."""

    batch: float
    context_tokens: float
    gamma: int
    step_time_s: float
    expected_accepted_length: float
    tokens_per_s_per_seq: float
    tokens_per_s_total: float
    speedup: float
    speedup_low: float
    speedup_high: float
    extrapolated: bool
    extrapolated_share: float
    fits_in_memory: bool = True
    max_batch_in_memory: float | None = None


@dataclass(frozen=True, slots=True)
class BestGamma:
    """The gamma with the highest predicted speedup at one (batch, context) among those whose KV fits (all of them
    when none does: then `fits_in_memory` is False); gamma 0 = leave speculation off."""

    batch: float
    context_tokens: float
    gamma: int
    speedup: float
    tokens_per_s_total: float
    fits_in_memory: bool = True


@dataclass(frozen=True, slots=True)
class Crossover:
    """Where S(gamma) falls to 1 at one context: `batch` None = still > 1 at `searched_up_to_batch`; `batch` 1.0
    with `helps_at_batch_1` False = it does not help at batch 1. `helps_between`: every batch range on the search
    grid where S(gamma) > 1, as (from, to) with `to` None = up to the search end; empty = it never helps. Long
    contexts can make S rise with batch (each sequence's KV reads keep the step memory-bound while drafting's
    fixed costs are shared), so a gamma that loses at batch 1 can win from some batch on."""

    context_tokens: float
    gamma: int
    batch: float | None
    helps_at_batch_1: bool
    searched_up_to_batch: float
    helps_between: tuple[tuple[float, float | None], ...] = ()


@dataclass(frozen=True, slots=True)
class WhatIfResult:
    """Everything a what-if answers, plus the profiles and the acceptance it rested on."""

    context: ModelContext
    acceptance: tuple[AcceptancePoint, ...]
    measured_positions: int
    points: tuple[WhatIfPoint, ...]
    best: tuple[BestGamma, ...]
    crossovers: tuple[Crossover, ...]
    notes: tuple[str, ...]


# ------------------------------------------------------------------------------------------------------------
# Profiles
# ------------------------------------------------------------------------------------------------------------


def resolve_hardware(spec: HardwareSpec, *, field: str = "hardware") -> HardwareProfile:
    """The catalog hardware profile `spec` names (case-insensitive, aliases allowed), or an operator's datasheet
    numbers for a GPU the catalog lacks (`profiles.hardware_from_spec`); WhatIfInputError naming `field` (and the
    known names) otherwise. Example: "H100" -> h100-sxm (3.35e12 bytes/s)."""
    try:
        return hardware_by_name(spec) if isinstance(spec, str) else hardware_from_spec(spec)
    except ValueError as exc:
        raise WhatIfInputError(field, str(exc)) from None


def resolve_model(spec: ModelSpec, *, field: str) -> ModelProfile:
    """A catalog model (by name or Hugging Face id) or a parsed `config.json` mapping -> ModelProfile.

    A mapping must describe a decoder in physical ranges: params in (0, 1e14], layers/hidden/heads/KV heads/head
    dim >= 1 and <= 1e6; anything else (missing fields, zero heads, strings where numbers belong) raises
    WhatIfInputError naming `field`. The mapping's `_name_or_path` (if any) names the profile.
    Example: {"hidden_size": 4096, "num_hidden_layers": 32, ...} (Llama-3.1-8B's config) -> params ~ 8.03e9.
    """
    if isinstance(spec, str):
        try:
            return model_by_name(spec)
        except ValueError as exc:
            raise WhatIfInputError(field, str(exc)) from None
    for key in _POSITIVE_KEYS:  # the profile builder would divide by them: say which one is wrong
        value = spec.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and not value > 0:
            raise WhatIfInputError(field, f"config.json {key} = {value} must be > 0")
    name_value = spec.get("_name_or_path")
    name = name_value if isinstance(name_value, str) and name_value else "inline config.json"
    try:
        profile = model_from_hf_config(spec, name=name, source=f"inline config.json ({field})")
    except (ValueError, TypeError, KeyError, ZeroDivisionError, OverflowError, AttributeError) as exc:
        raise WhatIfInputError(field, f"config.json cannot be read as a decoder: {exc}") from None
    _check_profile(profile, field=field)
    return profile


def _check_profile(profile: ModelProfile, *, field: str) -> None:
    dims = {
        "num_hidden_layers": profile.layers,
        "hidden_size": profile.hidden,
        "num_attention_heads": profile.num_heads,
        "num_key_value_heads": profile.num_kv_heads,
        "head_dim": profile.head_dim,
    }
    for key, value in dims.items():
        if not 1 <= value <= _MAX_DIM:
            raise WhatIfInputError(field, f"config.json {key} = {value} is outside 1..{_MAX_DIM}")
    for key, number in (("parameter count", profile.params), ("active parameter count", profile.active_params)):
        if not (math.isfinite(number) and 0 < number <= _MAX_PARAMS):
            raise WhatIfInputError(field, f"config.json gives a {key} of {number:.3g}, outside (0, {_MAX_PARAMS:g}]")
    if not (0 < profile.dtype_bytes <= 8 and 0 < profile.kv_dtype_bytes <= 8):
        raise WhatIfInputError(field, "config.json weight/KV dtype must be 0.5..8 bytes per element")


def build_context(inp: WhatIfInput) -> ModelContext:
    """Profiles for `inp`: hardware, target model, the method's default drafter for it, TP degree.

    `draft_model` is required for DraftMethod.DRAFT_MODEL and rejected for other methods (it would be silently
    ignored otherwise). Raises WhatIfInputError naming the field. Example: h100, llama-3.1-8b, eagle3, TP 1 ->
    an EAGLE-3 head of ~3.995e8 parameters (policies/model/profiles.py `drafter_for`).
    """
    if not 1 <= inp.tensor_parallel <= MAX_TENSOR_PARALLEL:
        raise WhatIfInputError("tensor_parallel", f"must be 1..{MAX_TENSOR_PARALLEL}, got {inp.tensor_parallel}")
    hardware = resolve_hardware(inp.hardware)
    model = resolve_model(inp.target_model, field="target_model")
    drafter = _drafter(inp, model)
    budget = inp.max_num_batched_tokens
    return ModelContext(hardware=hardware, model=model, drafter=drafter, tensor_parallel=inp.tensor_parallel,
                        step_token_budget=None if budget is None else float(budget))


def _drafter(inp: WhatIfInput, model: ModelProfile) -> DrafterProfile:
    if inp.drafter_method == DraftMethod.DRAFT_MODEL:
        if inp.draft_model is None:
            raise WhatIfInputError("drafter.draft_model", "method draft_model needs a draft model (name or config)")
        draft = resolve_model(inp.draft_model, field="drafter.draft_model")
        degree = inp.draft_tensor_parallel
        if degree is not None and degree not in (1, inp.tensor_parallel):
            raise WhatIfInputError(
                "drafter.tensor_parallel", f"must be 1 or tensor_parallel ({inp.tensor_parallel}), got {degree}"
            )
        return drafter_for(inp.drafter_method, model, draft_model=draft, draft_tensor_parallel=degree or 0)
    for name, value in (("drafter.draft_model", inp.draft_model), ("drafter.tensor_parallel",
                                                                    inp.draft_tensor_parallel)):
        if value is not None:
            raise WhatIfInputError(name, f"only used with method draft_model, not {inp.drafter_method.value}")
    return drafter_for(inp.drafter_method, model)


# ------------------------------------------------------------------------------------------------------------
# Acceptance
# ------------------------------------------------------------------------------------------------------------


def iid_rate_for_mean_length(mean_length: float, k: int) -> float:
    """The i.i.d. alpha in [0, 1] whose mean accepted length at k drafts is `mean_length` (in [1, k + 1], k >= 1):
    `policies.iid.iid_rate_for_mean_length`, raising WhatIfInputError naming the input outside the ranges.
    Example: mean_length 2.952, k 3 -> 0.8 (1 + 0.8 + 0.64 + 0.512 = 2.952).
    """
    if k < 1:
        raise WhatIfInputError("acceptance.measured_at_k", f"must be >= 1, got {k}")
    if not (math.isfinite(mean_length) and 1.0 <= mean_length <= k + 1.0):
        raise WhatIfInputError(
            "acceptance.mean_acceptance_length",
            f"must be in [1, {k + 1}] at k={k} (1 + accepted drafts, at most all k plus the bonus token), "
            f"got {mean_length}",
        )
    return iid.iid_rate_for_mean_length(mean_length, k)


def acceptance_positions(spec: AcceptanceSpec, *, gamma_max: int) -> tuple[float, ...]:
    """The r_i the spec states as known (module docstring): per_position as given, alpha^1..alpha^k for a mean
    length at k, alpha^1..alpha^gamma_max for an i.i.d. rate. Raises WhatIfInputError unless exactly one form is
    given with values in range. Example: iid_rate 0.5, gamma_max 3 -> (0.5, 0.25, 0.125).
    """
    given = [
        name
        for name, value in (
            ("per_position", spec.per_position),
            ("mean_acceptance_length", spec.mean_acceptance_length),
            ("iid_rate", spec.iid_rate),
        )
        if value is not None
    ]
    if len(given) != 1:
        what = ", ".join(given) if given else "none"
        raise WhatIfInputError(
            "acceptance", f"give exactly one of per_position, mean_acceptance_length, iid_rate (got: {what})"
        )
    if spec.per_position is not None:
        return _checked_positions(spec.per_position)
    if spec.iid_rate is not None:
        alpha = spec.iid_rate
        if not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
            raise WhatIfInputError("acceptance.iid_rate", f"must be in [0, 1], got {alpha}")
        return iid.iid_positions(alpha, max(gamma_max, 1))
    assert spec.mean_acceptance_length is not None
    if spec.measured_at_k is None:
        raise WhatIfInputError(
            "acceptance.measured_at_k", "required with mean_acceptance_length (the k it was measured at)"
        )
    if not 1 <= spec.measured_at_k <= GAMMA_LIMIT:
        raise WhatIfInputError("acceptance.measured_at_k", f"must be 1..{GAMMA_LIMIT}, got {spec.measured_at_k}")
    alpha = iid_rate_for_mean_length(spec.mean_acceptance_length, spec.measured_at_k)
    return iid.iid_positions(alpha, spec.measured_at_k)


def _checked_positions(values: Sequence[float]) -> tuple[float, ...]:
    if not 1 <= len(values) <= GAMMA_LIMIT:
        raise WhatIfInputError("acceptance.per_position", f"needs 1..{GAMMA_LIMIT} values, got {len(values)}")
    previous = 1.0
    for index, value in enumerate(values):
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise WhatIfInputError("acceptance.per_position", f"r_{index + 1} = {value} is not a probability in [0, 1]")
        if value > previous:
            raise WhatIfInputError(
                "acceptance.per_position",
                f"r_{index + 1} = {value} > r_{index} = {previous}: r_i = P(at least i drafts accepted) cannot grow",
            )
        previous = value
    return tuple(float(v) for v in values)


def acceptance_evidence(positions: Sequence[float], *, draft_coverage: float = 1.0) -> AcceptanceEvidence:
    """Stated r_i as AcceptanceEvidence with a zero-width band (nothing was counted, so no binomial interval), and
    the stated draft coverage (checked by `checked_coverage`).

    Example: (0.8, 0.6) -> mean_acceptance_length 2.4, acceptance_rate (0.8 + 0.6) / 2 = 0.7, k = 2.
    """
    k = len(positions)
    total = float(sum(positions))
    return AcceptanceEvidence(
        per_position=tuple(positions),
        per_position_low=tuple(positions),
        per_position_high=tuple(positions),
        drafts=0.0,
        draft_tokens=0.0,
        accepted_tokens=0.0,
        mean_acceptance_length=1.0 + total,
        acceptance_rate=total / k if k else 0.0,
        mean_proposed_length=float(k),
        window_s=0.0,
        draft_coverage=draft_coverage,
    )


def checked_coverage(spec: AcceptanceSpec) -> float:
    """The spec's draft coverage, or WhatIfInputError("acceptance.draft_coverage") unless finite in (0, 1].
    Example: 0.58 (an n-gram drafter that found a match on 58% of sequence-steps) -> 0.58; 0 -> error."""
    c = spec.draft_coverage
    if isinstance(c, bool) or not (math.isfinite(c) and 0.0 < c <= 1.0):
        raise WhatIfInputError("acceptance.draft_coverage", f"must be in (0, 1], got {c}")
    return float(c)


# ------------------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------------------


def check_grid(inp: WhatIfInput) -> None:
    """Bounds on the work one what-if may ask for, each naming its field (limits are the module constants):
    batch sizes 1..MAX_BATCH_SIZES values in [1, 65536]; context lengths 1..MAX_CONTEXT_LENGTHS in [0, 4M] tokens;
    gammas 1..GAMMA_LIMIT + 1 distinct values in [0, GAMMA_LIMIT]; their product <= MAX_POINTS.
    Example: 64 batches x 8 contexts x 5 gammas = 2560 > 2048 -> WhatIfInputError("batch_sizes", ...).
    """
    _check_list("batch_sizes", inp.batch_sizes, MAX_BATCH_SIZES, low=1.0, high=MAX_BATCH)
    _check_list("context_lengths", inp.context_lengths, MAX_CONTEXT_LENGTHS, low=0.0, high=MAX_CONTEXT_TOKENS)
    if not 1 <= len(inp.gammas) <= GAMMA_LIMIT + 1:
        raise WhatIfInputError("gammas", f"needs 1..{GAMMA_LIMIT + 1} values, got {len(inp.gammas)}")
    for gamma in inp.gammas:
        if not 0 <= gamma <= GAMMA_LIMIT:
            raise WhatIfInputError("gammas", f"gamma {gamma} is outside 0..{GAMMA_LIMIT} (the deepest chain priced)")
    if len(set(inp.gammas)) != len(inp.gammas):
        raise WhatIfInputError("gammas", "values must be distinct")
    prefill = inp.prefill_tokens_per_step
    if not (math.isfinite(prefill) and 0 <= prefill <= MAX_PREFILL_TOKENS_PER_STEP):
        raise WhatIfInputError(
            "prefill_tokens_per_step", f"must be in [0, {MAX_PREFILL_TOKENS_PER_STEP:g}], got {prefill}"
        )
    _check_prompt(inp)
    utilization = inp.gpu_memory_utilization
    if not (math.isfinite(utilization) and 0 < utilization <= 1):
        raise WhatIfInputError("gpu_memory_utilization", f"must be in (0, 1], got {utilization}")
    _check_tree(inp)
    _check_budget(inp)
    points = len(inp.batch_sizes) * len(inp.context_lengths) * len(inp.gammas)
    if points > MAX_POINTS:
        raise WhatIfInputError(
            "batch_sizes",
            f"{len(inp.batch_sizes)} batch sizes x {len(inp.context_lengths)} context lengths x {len(inp.gammas)} "
            f"gammas = {points} points, more than the {MAX_POINTS} one what-if may price; split the request",
        )


def _check_prompt(inp: WhatIfInput) -> None:
    """`prompt_tokens`, when given, is a finite number of tokens in (0, MAX_CONTEXT_TOKENS], and needs prompt tokens
    in the steps (`prefill_tokens_per_step` > 0): it says how they are chunked. Example: prompt_tokens 2000 with
    prefill_tokens_per_step 0 -> refused."""
    prompt = inp.prompt_tokens
    if prompt is None:
        return
    if not (math.isfinite(prompt) and 0 < prompt <= MAX_CONTEXT_TOKENS):
        raise WhatIfInputError("prompt_tokens", f"must be in (0, {MAX_CONTEXT_TOKENS:g}], got {prompt}")
    if inp.prefill_tokens_per_step <= 0:
        raise WhatIfInputError(
            "prompt_tokens", "needs prefill_tokens_per_step > 0: with no prompt tokens in the steps there is no chunk "
            "to price")


def grid_shape(inp: WhatIfInput, *, batch: float, context: float) -> Shape:
    """The step shape one grid point prices: `batch` sequences at `context` tokens, P = `prefill_tokens_per_step`
    prompt tokens per step on average, and, with `prompt_tokens` given, carried in chunks of
    c = costmodel.prefill_chunk(prompt, P, B decode tokens, max_num_batched_tokens) = min(prompt, max(P, budget -
    B)) tokens: a share P / c of the steps carry a chunk, the rest none (a MoE's expert bytes are priced per step,
    policies/model/roofline.py; a dense model's step does not change). The chunk is the plain step's, shared by
    every gamma at the point, as the live model shares the running step's: where a budget leaves a drafting step
    less room (N - B q < c) its chunks are smaller and more frequent, so for a MoE its expert bytes are understated
    there and S(gamma) is optimistic (a step the budget fills carries exactly P, token_budget.py). Without
    `prompt_tokens` every step carries P. Example: prompt 2000, P 200, batch 64, budget 512 -> c = min(2000,
    max(200, 448)) = 448: 45% of the steps carry 448 prompt tokens."""
    budget = inp.max_num_batched_tokens
    return chunked_shape(batch=batch, context_tokens=context, prefill_tokens=inp.prefill_tokens_per_step,
                         prompt_tokens=inp.prompt_tokens, budget=None if budget is None else float(budget))


def _check_budget(inp: WhatIfInput) -> None:
    """A step budget (1..MAX_BATCHED_TOKENS) must hold the prompt tokens of a step and one whole sequence at the
    deepest gamma priced (1 + gamma, or the tree's nodes + 1; policies/model/token_budget.py). Example: budget 64,
    prefill 60, gammas up to 5 -> refused (4 tokens left, 6 needed)."""
    budget = inp.max_num_batched_tokens
    if budget is None:
        return
    if not 1 <= budget <= MAX_BATCHED_TOKENS:
        raise WhatIfInputError("max_num_batched_tokens", f"must be 1..{MAX_BATCHED_TOKENS}, got {budget}")
    deepest = max(inp.gammas)
    needed = 1 + (inp.tree_tokens if inp.tree_tokens is not None and deepest > 0 else deepest)
    if budget - inp.prefill_tokens_per_step < needed:
        raise WhatIfInputError(
            "max_num_batched_tokens",
            f"{budget} tokens a step leave {budget - inp.prefill_tokens_per_step:g} beside "
            f"{inp.prefill_tokens_per_step:g} prompt tokens: not one sequence at gamma {deepest} ({needed:g} tokens)",
        )


def _check_tree(inp: WhatIfInput) -> None:
    """A tree of `tree_tokens` draft tokens (1..MAX_TREE_TOKENS) is at least as many nodes as it is levels deep
    (every gamma asked is a depth), and n-gram / suffix lookups propose one continuation, not a tree."""
    tree = inp.tree_tokens
    if tree is None:
        return
    if not 1 <= tree <= MAX_TREE_TOKENS:
        raise WhatIfInputError("drafter.tree_tokens", f"must be in 1..{MAX_TREE_TOKENS}, got {tree}")
    if inp.drafter_method in (DraftMethod.NGRAM, DraftMethod.SUFFIX):
        raise WhatIfInputError(
            "drafter.tree_tokens", f"{inp.drafter_method.value} proposes a chain; trees are for eagle, eagle3, mtp "
            "and draft_model"
        )
    if max(inp.gammas) > tree:
        raise WhatIfInputError(
            "drafter.tree_tokens",
            f"a tree of {tree} draft tokens cannot be {max(inp.gammas)} levels deep (gammas are the tree's depth)",
        )


def _check_list(field: str, values: Sequence[float], limit: int, *, low: float, high: float) -> None:
    if not 1 <= len(values) <= limit:
        raise WhatIfInputError(field, f"needs 1..{limit} values, got {len(values)}")
    for value in values:
        if not (math.isfinite(value) and low <= value <= high):
            raise WhatIfInputError(field, f"{value} is outside [{low:g}, {high:g}]")


def evaluate_whatif(inp: WhatIfInput, profile: MeasuredProfile | None = None) -> WhatIfResult:
    """Price every (batch, context, gamma) of `inp`, the best gamma per (batch, context) and the crossover batch
    per (context, gamma >= 1). Raises WhatIfInputError (naming the field) for anything it cannot price.

    Without `profile` the cost model is uncalibrated and the bands carry the calibration prior. With a measured
    profile of this deployment (policies/model/measured_profile.py; WhatIfInputError on field "profile" when it measured
    another one) every price uses the scales fitted to its steps and the bands that fit's posterior covariance.

    Example: H100 SXM, Llama-3.1-8B, EAGLE-3, iid_rate 0.76, batch 1, context 512, gamma 3: E[L] = 1 + 0.76 +
    0.578 + 0.439 = 2.78; T_target(q=1) ~ 6.8 ms, T_draft(3) + T_target(q=4) ~ 10 ms -> S(3) ~ 1.9, and
    tokens_per_s_per_seq = 2.78 / 0.010 ~ 280.
    """
    check_grid(inp)
    ctx = build_context(inp)
    calibration = _calibration(profile, ctx)
    scales = calibration.scales
    gamma_max = max(inp.gammas)
    positions = acceptance_positions(inp.acceptance, gamma_max=gamma_max)
    # An i.i.d. rate states every position, so nothing past it is an extrapolation.
    measured = len(positions)
    acceptance = acceptance_curve(
        acceptance_evidence(positions, draft_coverage=checked_coverage(inp.acceptance)),
        method=inp.drafter_method, gamma_max=gamma_max,
    )
    points: list[WhatIfPoint] = []
    best: list[BestGamma] = []
    pricing = WhatIfPricing(ctx, acceptance, tree_tokens=inp.tree_tokens, scales=scales)
    for context in inp.context_lengths:
        for batch in inp.batch_sizes:
            at = grid_shape(inp, batch=batch, context=context)
            curve, base = _curve(pricing, at)
            curve = with_band(pricing, curve, at, calibration=calibration)
            fits = {
                gamma: memory_fit(
                    ctx, batch=batch, context_tokens=context, gamma=gamma,
                    gpu_memory_utilization=inp.gpu_memory_utilization, tree_tokens=inp.tree_tokens,
                )
                for gamma in {0, *inp.gammas}
            }
            for gamma in inp.gammas:
                points.append(_point(curve[gamma], batch=batch, context=context, base=base, fit=fits[gamma]))
            best.append(_best(curve, inp.gammas, batch=batch, context=context, base=base, fits=fits))
    drafting = sorted(gamma for gamma in inp.gammas if gamma > 0)
    crossovers = tuple(
        crossover
        for context in inp.context_lengths
        for crossover in _crossovers(pricing, inp, gammas=drafting, context=context)
    )
    return WhatIfResult(
        context=ctx,
        acceptance=acceptance,
        measured_positions=measured,
        points=tuple(points),
        best=tuple(best),
        crossovers=crossovers,
        notes=_notes(inp, measured=measured, gamma_max=gamma_max, points=points, calibration=calibration,
                     acceptance=acceptance),
    )


@dataclass(frozen=True, slots=True)
class WhatIfCalibration:
    """The cost scales a what-if prices with, their covariance (the band's source), and where they come from:
    the prior (no profile: scales 1, the prior's covariance) or a measured profile's fit (`profile` its summary)."""

    scales: CostScales
    covariance: tuple[tuple[float, ...], ...]
    profile: MeasuredProfile | None = None
    # The fit's largest relative step error on the profile's points: the form error every band carries.
    form_error: float = 0.0
    # The other split of the profile's steps when they verify one tokens-per-sequence value (the band covers it).
    split_alternative: CostScales | None = None


def _calibration(profile: MeasuredProfile | None, ctx: ModelContext) -> WhatIfCalibration:
    if profile is None:
        return WhatIfCalibration(CostScales(), _prior_covariance(ctx))
    try:
        fitted = fit_profile(profile, ctx, config=CalibrationConfig())
    except ProfileError as exc:
        raise WhatIfInputError("profile", str(exc)) from None
    return WhatIfCalibration(
        fitted.fit.scales, fitted.fit.covariance or _prior_covariance(ctx), profile=profile,
        form_error=fitted.max_error_ratio, split_alternative=fitted.fit.split_alternative,
    )


@dataclass(frozen=True, slots=True)
class WhatIfPricing:
    """What every price in one what-if shares: the cost model's profiles, the acceptance curve (gamma 0..max), the
    tree a tree drafter proposes (None: a chain) and the cost scales."""

    ctx: ModelContext
    acceptance: Sequence[AcceptancePoint]
    tree_tokens: int | None = None
    scales: CostScales = field(default_factory=CostScales)

    def curve_at(self, at: Shape, scales: CostScales | None = None) -> tuple[tuple[CurvePoint, ...], float]:
        """`curve_for` at `at` with these profiles, at `scales` (None: the pricing's own), under the context's step
        token budget where it is set (policies/model/token_budget.py `curve_within_budget`)."""
        tree = None if self.tree_tokens is None else float(self.tree_tokens)
        return curve_within_budget(self.ctx, self.acceptance, at, tree_tokens=tree, scales=scales or self.scales)


def _curve(pricing: WhatIfPricing, at: Shape) -> tuple[tuple[CurvePoint, ...], float]:
    batch, context = at.batch, at.context_tokens
    try:
        curve, base = pricing.curve_at(at)
    except ValueError as exc:  # the cost model's own range checks: report, never crash
        raise WhatIfInputError("batch_sizes", f"cannot price batch {batch} at context {context}: {exc}") from None
    numbers = [base] + [p.speedup for p in curve] + [p.step_time_s for p in curve]
    if not all(math.isfinite(n) and n > 0 for n in numbers):
        raise WhatIfInputError(
            "target_model", f"the profiles give a non-finite or zero step time at batch {batch}, context {context}"
        )
    return curve, base


def with_band(
    pricing: WhatIfPricing, curve: tuple[CurvePoint, ...], at: Shape, *, calibration: WhatIfCalibration
) -> tuple[CurvePoint, ...]:
    """The curve (priced at `calibration.scales`) with the model's uncertainty, `calibration.covariance` and
    `calibration.form_error`, propagated into its bands by policies/model/uncertainty.py. Without a profile that is the
    calibration prior's covariance: nothing is measured, so the band spans what the profiles' constants could be
    (a verification priced compute-bound at the per-token and compute scales' high ends is inside it)."""
    return banded(
        lambda scales: pricing.curve_at(at, scales)[0], calibration.scales,
        Spread(calibration.covariance, calibration.form_error, calibration.split_alternative), base=curve,
    )


def with_prior_band(pricing: WhatIfPricing, curve: tuple[CurvePoint, ...], at: Shape) -> tuple[CurvePoint, ...]:
    """`with_band` under the calibration prior (policies/model/calibrate.py `prior_covariance`): the band of a what-if
    without a measured profile."""
    return with_band(pricing, curve, at, calibration=WhatIfCalibration(CostScales(), _prior_covariance(pricing.ctx)))


def _prior_covariance(ctx: ModelContext) -> tuple[tuple[float, ...], ...]:
    """The calibration prior's covariance for `ctx`'s drafter (policies/model/calibrate.py `for_drafter`)."""
    return prior_covariance(for_drafter(CalibrationConfig(), ctx.drafter))


def _point(point: CurvePoint, *, batch: float, context: float, base: float, fit: MemoryFit) -> WhatIfPoint:
    step = base if point.gamma == 0 else point.step_time_s
    per_seq = point.expected_accepted_length / step
    return WhatIfPoint(
        batch=batch,
        context_tokens=context,
        gamma=point.gamma,
        step_time_s=step,
        expected_accepted_length=point.expected_accepted_length,
        tokens_per_s_per_seq=per_seq,
        tokens_per_s_total=batch * per_seq,
        speedup=point.speedup,
        speedup_low=point.speedup_low,
        speedup_high=point.speedup_high,
        extrapolated=point.extrapolated,
        extrapolated_share=point.extrapolated_share,
        fits_in_memory=fit.fits,
        max_batch_in_memory=fit.max_batch if math.isfinite(fit.max_batch) else None,
    )


def _best(
    curve: Sequence[CurvePoint], gammas: Sequence[int], *, batch: float, context: float, base: float,
    fits: Mapping[int, MemoryFit],
) -> BestGamma:
    # Off (gamma 0) is always a candidate; ties go to the smaller gamma (less KV reserved, less to go wrong). An
    # option whose KV does not fit is no option, unless none fits (the batch itself is too large: say so).
    candidates = [0, *sorted(g for g in gammas if g > 0)]
    fitting = [g for g in candidates if fits[g].fits] or candidates
    winner = curve[fitting[0]]
    for gamma in fitting[1:]:
        if curve[gamma].speedup > winner.speedup:
            winner = curve[gamma]
    per_seq = winner.speedup / base
    return BestGamma(
        batch=batch, context_tokens=context, gamma=winner.gamma, speedup=winner.speedup,
        tokens_per_s_total=batch * per_seq, fits_in_memory=fits[winner.gamma].fits,
    )


def _speedup(pricing: WhatIfPricing, at: Shape, *, gamma: int) -> float:
    curve, _ = _curve(replace(pricing, acceptance=pricing.acceptance[: gamma + 1]), at)
    return curve[gamma].speedup


def _crossovers(pricing: WhatIfPricing, inp: WhatIfInput, *, gammas: Sequence[int], context: float) -> list[Crossover]:
    # One grid scan prices every gamma at every grid batch; each change of sign of S - 1 is bisected.
    top = CROSSOVER_SEARCH_MAX_BATCH
    grid = [1.0]
    while grid[-1] < top:
        grid.append(min(grid[-1] * CROSSOVER_GRID_FACTOR, top))
    speedups: list[tuple[float, ...]] = []
    for batch in grid:
        curve, _ = _curve(pricing, grid_shape(inp, batch=batch, context=context))
        speedups.append(tuple(point.speedup for point in curve))

    def boundary(gamma: int, low: float, high: float) -> float:
        """The batch in [low, high] where S(gamma) - 1 changes sign (to CROSSOVER_RELATIVE_TOL)."""
        def speedup(batch: float) -> float:
            return _speedup(pricing, grid_shape(inp, batch=batch, context=context), gamma=gamma)

        helps_low = speedup(low) > 1
        while high - low > CROSSOVER_RELATIVE_TOL * high:
            middle = 0.5 * (low + high)
            helps = speedup(middle)
            if (helps > 1) == helps_low:
                low = middle
            else:
                high = middle
        return high

    crossovers: list[Crossover] = []
    for gamma in gammas:
        helps = [row[gamma] > 1.0 for row in speedups]
        ranges: list[tuple[float, float | None]] = []
        start: float | None = 1.0 if helps[0] else None
        for index in range(1, len(grid)):
            if helps[index] == helps[index - 1]:
                continue
            edge = boundary(gamma, grid[index - 1], grid[index])
            if helps[index]:
                start = edge
            elif start is not None:
                ranges.append((start, edge))
                start = None
        if start is not None:
            ranges.append((start, None))
        # The first crossing down: the end of the range that starts at batch 1 (None: it never ends), 1.0 when S
        # is <= 1 at batch 1 already.
        crossing = ranges[0][1] if helps[0] else 1.0
        crossovers.append(Crossover(
            context, gamma, crossing, helps_at_batch_1=helps[0], searched_up_to_batch=top, helps_between=tuple(ranges),
        ))
    return crossovers


def _calibration_notes(calibration: WhatIfCalibration) -> list[str]:
    profile = calibration.profile
    if profile is None:
        return [
            "uncalibrated: the profiles' datasheet peaks, efficiencies and overhead defaults "
            "(policies/model/profiles.py); "
            "a live sidecar fits them to the server's measured step time",
            "speedup_low/high are 90% bands that include the cost model's own uncertainty (the calibration prior: "
            "per-token, compute, overhead, drafting and bookkeeping costs each unknown by 1.6-2.2x), not only the "
            "acceptance's; "
            "measure the deployment (spec-advisor profile) to narrow them",
        ]
    plain, speculative = profile.kinds_seen
    identity = profile.identity
    seen = "plain and speculative steps" if plain and speculative else ("plain steps only" if plain else
                                                                        "speculative steps only")
    notes = [
        f"calibrated on a measured profile: {len(profile.points)} levels of {seen}, batches "
        f"{min(p.batch for p in profile.points):.1f}-{max(p.batch for p in profile.points):.1f}, engine "
        f"{identity.engine} {identity.engine_version or '(version unknown)'}; the fitted model misses its "
        f"measured steps by at most {calibration.form_error:.1%}",
        "speedup_low/high are 90% bands from the fit's posterior covariance (what the profile's steps identify), "
        "that largest miss (the model's form error here) and the acceptance's uncertainty",
    ]
    points = observations(profile, at_s=profile.created_at_s)
    if unidentified(points) == UNIDENTIFIED_WITHOUT_PLAIN:
        notes.append(
            "the profile holds speculative steps at two k and no plain step, so the speculative bookkeeping's cost "
            "(what turning off saves besides the drafts) is still the prior's: profile the same deployment with "
            "speculation off and --append it"
        )
    if not split_observed(points):
        missing = (
            f"profile the same deployment with speculation {'on' if plain else 'off'} and --append it"
            if not (plain and speculative)
            else "its speculative steps verify nearly as few tokens as its plain ones (drafts on few steps); "
            "profile a k or prompts that draft more and --append it"
        )
        notes.append(
            "the profile holds steps at one tokens-per-sequence setting only (two drafting settings at least 25% "
            "apart in tokens verified identify it), so the marginal cost of a verified token is still the prior's "
            f"(the bands stay wide): {missing}"
        )
    if not profile.complete:
        notes.append("the profile is incomplete (its run stopped early): only the levels it holds were measured")
    return notes


def whatif_schedule_plan(
    inp: WhatIfInput, *, max_num_seqs: int, context_tokens: float | None = None, margin: float = 0.0,
    profile: MeasuredProfile | None = None,
) -> ScheduleInputs:
    """A schedule plan (policies/offline/schedule.py) for the what-if deployment: K up to max(gammas) (>= 1), at
    `context_tokens` or the first of `inp.context_lengths`, priced at the scales fitted to `profile` (a measured
    profile of this deployment), uncalibrated without one. Raises WhatIfInputError.
    Example: the example input of `evaluate_whatif` with gammas 0..5 -> a plan allowing K = 0..5 at ctx 512.
    """
    check_grid(inp)
    if inp.tree_tokens is not None:
        raise WhatIfInputError(
            "drafter.tree_tokens", "engine schedules set a chain's K per batch size; a tree has no such knob"
        )
    gamma_max = max(inp.gammas)
    if gamma_max < 1:
        raise WhatIfInputError("gammas", "a schedule needs at least one gamma >= 1 (the deepest K it may use)")
    context = inp.context_lengths[0] if context_tokens is None else context_tokens
    if not (math.isfinite(context) and 0.0 <= context <= MAX_CONTEXT_TOKENS):
        raise WhatIfInputError("context_lengths", f"{context} is outside [0, {MAX_CONTEXT_TOKENS:g}]")
    ctx = build_context(inp)
    positions = acceptance_positions(inp.acceptance, gamma_max=gamma_max)
    acceptance = acceptance_curve(
        acceptance_evidence(positions, draft_coverage=checked_coverage(inp.acceptance)),
        method=inp.drafter_method, gamma_max=gamma_max,
    )
    return ScheduleInputs(
        ctx=ctx, acceptance=acceptance, max_num_seqs=max_num_seqs, context_tokens=context,
        scales=_calibration(profile, ctx).scales, prefill_tokens=inp.prefill_tokens_per_step, margin=margin,
        prompt_tokens=inp.prompt_tokens,
    )


def graph_limit_tokens(inp: WhatIfInput) -> int:
    """The most tokens a step runs in a CUDA graph on vLLM by default (`VLLM_CUDAGRAPH_MAX_TOKENS`, and at most the
    step budget when one is given). Example: no budget -> 512; max_num_batched_tokens 256 -> 256."""
    budget = inp.max_num_batched_tokens
    return VLLM_CUDAGRAPH_MAX_TOKENS if budget is None else min(VLLM_CUDAGRAPH_MAX_TOKENS, budget)


def _graph_notes(
    inp: WhatIfInput, points: Sequence[WhatIfPoint], acceptance: Sequence[AcceptancePoint]
) -> list[str]:
    """A note when speculative points run steps past vLLM's default CUDA-graph capture while their plain step at
    the same batch does not: tokens per step B q + P against `graph_limit_tokens` (q the tokens a sequence verifies,
    token_budget.verified_tokens: 1 + c gamma with draft coverage c, a tree's N + 1; P the prefill tokens per step).
    The model prices every step as graphed, so there S is optimistic. Example: batch 256, gamma 3, no prefill:
    1024 tokens > 512, plain 256 -> noted; batch 64: 256 tokens -> not."""
    limit = graph_limit_tokens(inp)
    prefill = inp.prefill_tokens_per_step
    tree = None if inp.tree_tokens is None else float(inp.tree_tokens)
    per_seq = {a.gamma: verified_tokens(a, tree_tokens=tree) for a in acceptance}

    def tokens(point: WhatIfPoint) -> float:
        return point.batch * per_seq.get(point.gamma, 1.0 + point.gamma) + prefill

    past = [p for p in points if p.gamma > 0 and tokens(p) > limit >= p.batch + prefill]
    if not past:
        return []
    first = min(past, key=lambda p: (p.batch, p.gamma))
    return [
        f"{len(past)} of {sum(1 for p in points if p.gamma > 0)} speculative points run steps of more tokens than "
        f"vLLM captures in CUDA graphs by default ({limit}: 512, or the step's token budget when lower; vLLM's "
        "default is min(2 x max_num_seqs x (1 + k), 512)) while their plain step at the same batch does not, "
        "e.g. batch "
        f"{first.batch:g} at gamma {first.gamma}, {tokens(first):.0f} tokens per step. vLLM runs such a step "
        "without a graph, launching every kernel from the host; this model prices it as graphed, so there S is "
        "optimistic (compilation_config's max_cudagraph_capture_size or cudagraph_capture_sizes moves the limit)"
    ]


def _notes(
    inp: WhatIfInput, *, measured: int, gamma_max: int, points: Sequence[WhatIfPoint], calibration: WhatIfCalibration,
    acceptance: Sequence[AcceptancePoint],
) -> tuple[str, ...]:
    notes = _calibration_notes(calibration)
    if gamma_max > measured:
        notes.append(
            f"acceptance beyond position {measured} is extrapolated (policies/model/acceptance.py): points with "
            "gamma > "
            f"{measured} are flagged extrapolated, extrapolated_share says how much of E[L] rests on it"
        )
    acc = inp.acceptance
    if acc.mean_acceptance_length is not None and acc.measured_at_k is not None:
        alpha = iid_rate_for_mean_length(acc.mean_acceptance_length, acc.measured_at_k)
        notes.append(
            f"mean_acceptance_length {acc.mean_acceptance_length:g} at k={acc.measured_at_k} was read as an i.i.d. "
            f"per-token acceptance alpha = {alpha:.4f} (1 + alpha + ... + alpha^k = the mean length)"
        )
    if inp.prefill_tokens_per_step > 0 and inp.prompt_tokens is None:
        notes.append(
            "prefill tokens per step are priced into every step, with or without speculation; a MoE target's steps "
            "then touch more experts than steps that carry a whole prompt now and then (prompt_tokens prices those)")
    elif inp.prefill_tokens_per_step > 0:
        capped = "" if inp.max_num_batched_tokens is None else (
            ", at most what max_num_batched_tokens leaves beside the plain step's decode tokens (one chunk for every "
            "gamma at a point)")
        notes.append(
            f"prefill tokens per step arrive as whole prompts of {inp.prompt_tokens:g} tokens{capped}: a share "
            "prefill / chunk of the steps carry one and the rest none, and where the chunk is no larger than the "
            "prefill per step every step carries it (a MoE's experts are priced per step; a dense model's step is "
            "the same either way)")
    if inp.max_num_batched_tokens is not None:
        notes.append(
            f"step budget {inp.max_num_batched_tokens} tokens (max_num_batched_tokens): the prompt tokens of a step "
            "and 1 + gamma tokens per running sequence share it; where B (1 + gamma) passes what the prompt tokens "
            "leave, a step holds fewer than B sequences and step_time_s is the time between one sequence's steps "
            "(policies/model/token_budget.py)"
        )
    if inp.tree_tokens is not None:
        notes.append(
            f"tree drafting: the target verifies {inp.tree_tokens} draft tokens + 1 per sequence at every gamma >= 1 "
            "(gamma = the tree's depth, drafted in gamma passes), and each reserves a KV slot; the acceptance is "
            "read as the tree's (tokens per step, measured with that tree)"
        )
    notes.extend(_graph_notes(inp, points, acceptance))
    misfits = [p for p in points if not p.fits_in_memory]
    if misfits:
        worst = max(misfits, key=lambda p: (p.batch, p.context_tokens, p.gamma))
        room = worst.max_batch_in_memory or 0.0
        notes.append(
            f"{len(misfits)} of {len(points)} points do not fit in memory (fits_in_memory false; weights + KV for "
            f"context + gamma per sequence within {inp.gpu_memory_utilization:g} of the GPU's memory, "
            f"policies/model/kv_capacity.py): e.g. batch {worst.batch:g} at context {worst.context_tokens:g}, gamma "
            f"{worst.gamma}, where at most {room:.0f} sequences fit; they are priced, and best is chosen among the "
            "options that fit (where none fits, among all, with fits_in_memory false)"
        )
    return tuple(notes)
