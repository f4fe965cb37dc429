"""A deployment's measured step times (`spec-advisor profile`): the calibration a deployment is advised from.

One measurement plan drives a server through closed-loop concurrency levels and records, per level, the engine's
mean step at the batch its steps verified (the estimator's evidence over the level: policies/estimate/window.py,
`costmodel.observed_step_s`), with the tokens verified per sequence and the drafting passes of the setting it ran.
Run once with speculation as deployed and once with it off (`--append`), the table holds steps at two tokens-per-
sequence values, which is what identifies the marginal cost of a verified token (policies/model/calibrate.py): the
sidecar (`serve`, a target's `profile`) and `whatif --profile` fit the cost model to it and price from data.

File (JSON, `FORMAT`):
    {"format": "spec-advisor-profile/1", "created_at_s": 1.8e9,
     "identity": {"hardware": "h100-sxm", "model_profile": "llama-3.1-8b", "tensor_parallel": 1,
                  "drafter_method": "eagle3", "drafter_params": 2.5e8, "drafter_tensor_parallel": 1,
                  "engine": "vllm", "engine_version": "0.32.0", "served_model": "m"},
     "points": [{"concurrency": 8, "deployed_k": 3, "batch": 7.6, "tokens_per_seq": 4.0, "draft_passes": 3,
                 "context_tokens": 412.0, "prefill_tokens": 31.0, "step_s": 0.0123, "step_samples": 2411,
                 "mean_accepted_length": 2.6, "prefill_chunk_tokens": 396.0}, ...],
     "complete": true}

Identity: a profile prices only the deployment it measured. The cost model's inputs (hardware, model profile,
tensor-parallel degree, drafter method, the drafter's size in parameters: another draft model or EAGLE head is
another deployment, and the GPUs a drafter with weights runs on) must match the target's or the what-if's, or the
profile is refused with the field that differs. The engine and its version (vLLM's /version) are recorded; `profile
--append` refuses to mix versions, but the sidecar cannot see a running engine's version in /metrics, so after an
engine upgrade measure again (the engine's overheads are what the fit learns). A profile older than the operator's
limit is refused, never silently used. An incomplete profile (the server died mid-plan) is usable for the levels it
holds and says so. A file with more than 1000 points is refused (`merged` refuses to grow one past that).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from policies.model.calibrate import (
    CalibrationConfig,
    CalibrationFit,
    CalibrationState,
    StepObservation,
    fit,
    point_errors,
    with_anchors,
)
from policies.model.costmodel import ModelContext

FORMAT = "spec-advisor-profile/1"
IDENTITY_FIELDS = ("hardware", "model_profile", "tensor_parallel", "drafter_method", "drafter_params",
                   "drafter_tensor_parallel")
_PARAMS_TOLERANCE = 0.01  # drafter sizes within 1% are the same drafter (profiles round differently)
MAX_PROFILE_POINTS = 1000
_MAX_POINTS = MAX_PROFILE_POINTS
_MAX_BATCH = 65536.0
_MAX_STEP_S = 600.0


class ProfileError(ValueError):
    """A profile file that cannot be used: unreadable, from another deployment, too old. The message names why."""


@dataclass(frozen=True, slots=True)
class ProfileIdentity:
    """What the profile measured: the cost model's inputs, and the engine that ran them."""

    hardware: str
    model_profile: str
    tensor_parallel: int
    drafter_method: str
    drafter_params: float | None = None  # the drafter's weights (0 for n-gram/suffix); None: not recorded
    drafter_tensor_parallel: int | None = None  # the GPUs a drafter with weights runs on; None: not recorded
    engine: str = "vllm"
    engine_version: str = ""
    served_model: str = ""


@dataclass(frozen=True, slots=True)
class ProfilePoint:
    """One measured level: `batch` sequences per engine step (>= 0.5) at `context_tokens`, verifying
    `tokens_per_seq` tokens each (1 = speculation off) after `draft_passes` drafting passes, with `prefill_tokens`
    prompt tokens per step carried in chunks of `prefill_chunk_tokens` (None: not measured; roofline.Shape), took
    `step_s` seconds per step on average over `step_samples` ITL samples."""

    concurrency: int
    deployed_k: int
    batch: float
    tokens_per_seq: float
    draft_passes: int
    context_tokens: float
    prefill_tokens: float
    step_s: float
    step_samples: float
    mean_accepted_length: float | None = None
    prefill_chunk_tokens: float | None = None


@dataclass(frozen=True, slots=True)
class MeasuredProfile:
    identity: ProfileIdentity
    created_at_s: float
    points: tuple[ProfilePoint, ...]
    complete: bool = True
    format: str = field(default=FORMAT)

    @property
    def kinds_seen(self) -> tuple[bool, bool]:
        """(plain steps measured, speculative steps measured)."""
        return any(p.draft_passes == 0 for p in self.points), any(p.draft_passes > 0 for p in self.points)

    def to_json(self) -> dict[str, object]:
        """The file's content (module docstring)."""
        return {
            "format": self.format, "created_at_s": self.created_at_s, "identity": asdict(self.identity),
            "points": [asdict(p) for p in self.points], "complete": self.complete,
        }


def merged(old: MeasuredProfile, new: MeasuredProfile) -> MeasuredProfile:
    """`new`'s points added to `old`'s (the same deployment measured again, e.g. with speculation off): the newest
    creation time, complete only when both are. Raises ProfileError when the identities' cost-model fields or their
    (known) engine versions differ.

    Example: a k=3 profile of levels 1..16 merged with a plain one of the same levels -> 10 points, both kinds.
    """
    check_identity(old, _fields(new.identity), what="the profile being appended")
    before, now = old.identity.engine_version, new.identity.engine_version
    if before and now and before != now:
        raise ProfileError(
            f"profile measured engine version {before!r}, this measurement {now!r}: the engine's overheads are part "
            "of what a profile measures; write a new profile for the new version"
        )
    total = len(old.points) + len(new.points)
    if total > _MAX_POINTS:
        raise ProfileError(
            f"appending would make {total} points, past the {_MAX_POINTS} a profile holds: write a new profile"
        )
    return MeasuredProfile(
        identity=new.identity, created_at_s=max(old.created_at_s, new.created_at_s),
        points=(*old.points, *new.points), complete=old.complete and new.complete,
    )


def _fields(identity: ProfileIdentity) -> dict[str, object]:
    return {name: getattr(identity, name) for name in IDENTITY_FIELDS}


def identity_of(ctx: ModelContext) -> dict[str, object]:
    """The cost-model fields (`IDENTITY_FIELDS`) a context prices with: what a profile must have measured.
    Example: llama-3.1-8b on h100-sxm, TP 1, EAGLE-3 -> {"hardware": "h100-sxm", "model_profile": "llama-3.1-8b",
    "tensor_parallel": 1, "drafter_method": "eagle3", "drafter_params": 2.5e8 (the head's weights),
    "drafter_tensor_parallel": 1}."""
    return {
        "hardware": ctx.hardware.name, "model_profile": ctx.model.name, "tensor_parallel": ctx.tensor_parallel,
        "drafter_method": str(ctx.drafter.method), "drafter_params": float(ctx.drafter.params),
        "drafter_tensor_parallel": drafter_degree(ctx),
    }


def drafter_degree(ctx: ModelContext) -> int | None:
    """The GPUs the drafter's passes run on (`DrafterProfile.degree`), or None for a drafter without weights
    (n-gram, suffix: no passes to place). Example: a 1B draft model on one of 4 GPUs -> 1; an EAGLE head -> 4."""
    return ctx.drafter.degree(ctx.tensor_parallel) if ctx.drafter.params > 0 else None


def check_identity(profile: MeasuredProfile, wanted: Mapping[str, object], *, what: str) -> None:
    """Raise ProfileError naming the first cost-model field (`IDENTITY_FIELDS`) where `wanted` (what the caller
    prices: a target's resolved profiles, a what-if's input) differs from the profile's. Names compare
    case-insensitively, the drafter's size within 1%; a field either side does not state is not compared.
    Example: profile hardware "h100-sxm", wanted "cpu" -> "profile measured hardware 'h100-sxm', but <what> uses
    'cpu'"."""
    for name in IDENTITY_FIELDS:
        have = getattr(profile.identity, name)
        want = wanted.get(name)
        if want is None or have is None:
            continue
        if not _same(have, want):
            raise ProfileError(
                f"profile measured {name} {have!r}, but {what} uses {want!r}: a profile prices only the deployment "
                "it measured; measure this one (spec-advisor profile)"
            )


def _same(have: object, want: object) -> bool:
    if isinstance(have, float) and isinstance(want, int | float):
        return abs(have - float(want)) <= _PARAMS_TOLERANCE * max(abs(have), abs(float(want)))
    return str(have).strip().lower() == str(want).strip().lower()


def check_age(profile: MeasuredProfile, *, now_s: float, max_age_s: float) -> None:
    """Raise ProfileError when the profile is older than `max_age_s` (s, > 0) at `now_s` (Unix s), or from the
    future. Example: created 40 days ago with a 30-day limit -> "profile is 40.0 days old, past the 30.0-day
    limit"."""
    age = now_s - profile.created_at_s
    if age < -60.0:
        raise ProfileError(f"profile was created {-age:.0f} s in the future: check the clocks")
    if age > max_age_s:
        raise ProfileError(
            f"profile is {age / 86400:.1f} days old, past the {max_age_s / 86400:.1f}-day limit: measure again"
        )


def observations(profile: MeasuredProfile, *, at_s: float) -> tuple[StepObservation, ...]:
    """The profile's points as calibration observations stamped `at_s` (the fitter's anchors do not decay). A
    step verifies at least one sequence, so a level measured below one sequence per step (an engine idle part of
    the time, 0.5..1) is priced at batch 1, as the live operating point is (policies/model/costmodel.py).
    Example: batch 0.97 -> StepObservation(batch=1.0, ...); batch 7.7 -> batch 7.7."""
    return tuple(
        StepObservation(
            at_s=at_s, batch=max(p.batch, 1.0), tokens_per_seq=p.tokens_per_seq, draft_passes=p.draft_passes,
            context_tokens=p.context_tokens, prefill_tokens=p.prefill_tokens, step_s=p.step_s,
            prefill_chunk_tokens=p.prefill_chunk_tokens,
        )
        for p in profile.points
    )


def parse_profile(data: object) -> MeasuredProfile:
    """A MeasuredProfile from the parsed JSON of a profile file; ProfileError naming the field otherwise.

    Checks: the format string, every identity field present and typed (counts integral, engine fields strings,
    `complete` a boolean), 1..1000 points, each point's numbers finite and in physical ranges (batch 0.5..65536,
    tokens_per_seq >= 1, step 0 < s <= 600, integral draft passes >= 0, context and prefill >= 0), speculative
    points with tokens_per_seq > 1 and plain ones with exactly 1.
    """
    if not isinstance(data, Mapping):
        raise ProfileError("a profile is a JSON object")
    if data.get("format") != FORMAT:
        raise ProfileError(f"format: expected {FORMAT!r}, got {data.get('format')!r}")
    created = _number(data, "created_at_s", low=0.0)
    identity_data = data.get("identity")
    if not isinstance(identity_data, Mapping):
        raise ProfileError("identity: missing")
    identity = ProfileIdentity(
        hardware=_text(identity_data, "hardware", "identity."),
        model_profile=_text(identity_data, "model_profile", "identity."),
        tensor_parallel=_integer(identity_data, "tensor_parallel", low=1, high=64, path="identity."),
        drafter_method=_text(identity_data, "drafter_method", "identity."),
        drafter_params=None if identity_data.get("drafter_params") is None else _number(
            identity_data, "drafter_params", low=0.0, high=1e13, path="identity."),
        drafter_tensor_parallel=None if identity_data.get("drafter_tensor_parallel") is None else _integer(
            identity_data, "drafter_tensor_parallel", low=1, high=64, path="identity."),
        engine=_optional_text(identity_data, "engine", "vllm", "identity."),
        engine_version=_optional_text(identity_data, "engine_version", "", "identity."),
        served_model=_optional_text(identity_data, "served_model", "", "identity."),
    )
    raw = data.get("points")
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not 1 <= len(raw) <= _MAX_POINTS:
        raise ProfileError(f"points: 1..{_MAX_POINTS} measured levels expected")
    points = tuple(_point(item, f"points.{i}.") for i, item in enumerate(raw))
    complete = data.get("complete", True)
    if not isinstance(complete, bool):
        raise ProfileError(f"complete: true or false expected, got {complete!r}")
    return MeasuredProfile(identity, created, points, complete=complete)


def _point(item: object, path: str) -> ProfilePoint:
    if not isinstance(item, Mapping):
        raise ProfileError(f"{path[:-1]}: a JSON object expected")
    passes = _integer(item, "draft_passes", low=0, high=64, path=path)
    q = _number(item, "tokens_per_seq", low=1.0, high=257.0, path=path)
    if (passes == 0) != (q == 1.0):
        raise ProfileError(f"{path}tokens_per_seq: {q:g} with {passes} drafting passes (plain steps verify 1)")
    accepted, chunk = item.get("mean_accepted_length"), item.get("prefill_chunk_tokens")
    return ProfilePoint(
        concurrency=_integer(item, "concurrency", low=1, high=100_000, path=path),
        deployed_k=_integer(item, "deployed_k", low=0, high=64, path=path),
        batch=_number(item, "batch", low=0.5, high=_MAX_BATCH, path=path),
        tokens_per_seq=q,
        draft_passes=passes,
        context_tokens=_number(item, "context_tokens", low=0.0, high=4_194_304.0, path=path),
        prefill_tokens=_number(item, "prefill_tokens", low=0.0, high=1_048_576.0, path=path),
        step_s=_number(item, "step_s", low=1e-7, high=_MAX_STEP_S, path=path),
        step_samples=_number(item, "step_samples", low=0.0, path=path),
        mean_accepted_length=None if accepted is None else _number(item, "mean_accepted_length", low=1.0,
                                                                   high=65.0, path=path),
        prefill_chunk_tokens=None if chunk is None else _number(item, "prefill_chunk_tokens", low=1.0,
                                                                high=4_194_304.0, path=path),
    )


def _number(data: Mapping[str, object], key: str, *, low: float, high: float = math.inf, path: str = "") -> float:
    value = data.get(key)
    try:
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise ProfileError(f"{path}{key}: a finite number expected, got {_shown(value)}")
    if not low <= number <= high:
        raise ProfileError(f"{path}{key}: {number:g} is outside [{low:g}, {high:g}]")
    return number


def _integer(data: Mapping[str, object], key: str, *, low: int, high: int, path: str) -> int:
    number = _number(data, key, low=float(low), high=float(high), path=path)
    if number != int(number):
        raise ProfileError(f"{path}{key}: a whole number expected, got {number:g}")
    return int(number)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _optional_text(data: Mapping[str, object], key: str, default: str, path: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ProfileError(f"{path}{key}: a string expected, got {_shown(value)}")
    return value


def _text(data: Mapping[str, object], key: str, path: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(f"{path}{key}: a non-empty string expected")
    return value.strip()


@dataclass(frozen=True, slots=True)
class ProfileFit:
    """The calibration fitted to a profile alone, and its largest |predicted / measured - 1| over the profile's
    points: the model's form error on this deployment, which a band priced from the fit must carry."""

    fit: CalibrationFit
    max_error_ratio: float


def fit_profile(profile: MeasuredProfile, ctx: ModelContext, *, config: CalibrationConfig) -> ProfileFit:
    """The calibration fit (policies/model/calibrate.py) of `ctx`'s cost model to the profile's points alone, after the
    identity check (ProfileError when the profile measured another deployment): the scales and covariance a
    what-if or a schedule prices with. Example: an H100 profile of plain and k=3 steps at batches 1..64 whose
    verification costs like compute (the k=3 step 2.5x the plain one at 64) -> a per-token scale ~2, every step
    within ~7%, and the what-if's S(3) at batch 64 ~1.1 where the prior said 1.2."""
    check_identity(profile, identity_of(ctx), what="the what-if")
    at_s = profile.created_at_s
    state = with_anchors(CalibrationState(), observations(profile, at_s=at_s))
    fitted, summary = fit(state, ctx, now_s=at_s, config=config)
    errors = point_errors(fitted)
    return ProfileFit(summary, max((abs(e) for e in errors), default=0.0))
