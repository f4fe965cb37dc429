"""A measured profile file: parsing with errors that name the field, identity and age checks, appending."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from policies.model.calibrate import CalibrationConfig
from policies.model.costmodel import ModelContext
from policies.model.measured_profile import (
    FORMAT,
    MeasuredProfile,
    ProfileError,
    ProfileIdentity,
    ProfilePoint,
    check_age,
    check_identity,
    fit_profile,
    identity_of,
    merged,
    observations,
    parse_profile,
)
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.types import DraftMethod

DAY_S = 86400.0
CREATED_S = 1_800_000_000.0


def _document(**overrides: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "format": FORMAT,
        "created_at_s": CREATED_S,
        "identity": {
            "hardware": "cpu", "model_profile": "tiny-llama", "tensor_parallel": 1, "drafter_method": "ngram",
            "engine": "vllm", "engine_version": "0.32.0", "served_model": "tiny",
        },
        "points": [
            {"concurrency": 1, "deployed_k": 3, "batch": 1.0, "tokens_per_seq": 3.8, "draft_passes": 3,
             "context_tokens": 180.0, "prefill_tokens": 4.0, "step_s": 0.0061, "step_samples": 900.0,
             "mean_accepted_length": 3.5},
            {"concurrency": 8, "deployed_k": 0, "batch": 7.7, "tokens_per_seq": 1.0, "draft_passes": 0,
             "context_tokens": 190.0, "prefill_tokens": 20.0, "step_s": 0.0102, "step_samples": 4100.0},
        ],
        "complete": True,
    }
    document.update(overrides)
    return document


def _tiny_cpu() -> ModelContext:
    model = model_by_name("tiny-llama")
    return ModelContext(
        hardware=hardware_by_name("cpu"), model=model, drafter=drafter_for(DraftMethod.NGRAM, model), tensor_parallel=1
    )


def test_a_written_profile_reads_back_equal() -> None:
    profile = parse_profile(_document())
    assert parse_profile(profile.to_json()) == profile
    assert profile.kinds_seen == (True, True)
    assert profile.points[0].mean_accepted_length == 3.5
    assert profile.points[1].mean_accepted_length is None


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("format",), "spec-advisor-profile/0", "format: expected"),
        (("created_at_s",), "yesterday", "created_at_s: a finite number expected"),
        (("identity", "hardware"), "", "identity.hardware: a non-empty string expected"),
        (("identity", "tensor_parallel"), 0, "identity.tensor_parallel: 0 is outside"),
        (("points", 0, "step_s"), math.nan, "points.0.step_s: a finite number expected"),
        (("points", 0, "step_s"), 0.0, "points.0.step_s: 0 is outside"),
        (("points", 0, "step_s"), 1e9, "points.0.step_s: 1e+09 is outside"),
        (("points", 1, "batch"), 1e12, "points.1.batch: 1e+12 is outside"),
        (("points", 1, "tokens_per_seq"), 2.0, "points.1.tokens_per_seq: 2 with 0 drafting passes"),
        (("points", 0, "tokens_per_seq"), 1.0, "points.0.tokens_per_seq: 1 with 3 drafting passes"),
        (("points", 0, "batch"), True, "points.0.batch: a finite number expected"),
        (("points",), [], "points: 1..1000 measured levels expected"),
        (("points", 0, "step_s"), 10**400, "points.0.step_s: a finite number expected"),
        (("points", 0, "draft_passes"), 2.5, "points.0.draft_passes: a whole number expected"),
        (("identity", "tensor_parallel"), 1.5, "identity.tensor_parallel: a whole number expected"),
        (("identity", "engine_version"), 32, "identity.engine_version: a string expected"),
        (("identity", "drafter_params"), -1.0, "identity.drafter_params: -1 is outside"),
        (("complete",), "false", "complete: true or false expected"),
    ],
)
def test_bad_fields_are_named(path: tuple[Any, ...], value: object, message: str) -> None:
    document = copy.deepcopy(_document())
    holder: Any = document
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    with pytest.raises(ProfileError, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse_profile(document)


def test_not_an_object_is_refused() -> None:
    with pytest.raises(ProfileError, match="a JSON object"):
        parse_profile([1, 2])


def test_identity_matches_the_context_it_was_measured_for() -> None:
    profile = parse_profile(_document())
    check_identity(profile, identity_of(_tiny_cpu()), what="the target")  # the same deployment: no error


def test_identity_of_another_gpu_or_model_is_refused_naming_the_field() -> None:
    profile = parse_profile(_document())
    other_gpu = {**identity_of(_tiny_cpu()), "hardware": "h100-sxm"}
    with pytest.raises(ProfileError, match="profile measured hardware 'cpu', but the target uses 'h100-sxm'"):
        check_identity(profile, other_gpu, what="the target")
    other_model = {**identity_of(_tiny_cpu()), "model_profile": "llama-3.1-8b"}
    with pytest.raises(ProfileError, match="model_profile 'tiny-llama'"):
        check_identity(profile, other_model, what="the what-if")
    other_tp = {**identity_of(_tiny_cpu()), "tensor_parallel": 2}
    with pytest.raises(ProfileError, match="tensor_parallel 1"):
        check_identity(profile, other_tp, what="the what-if")


def test_another_draft_model_is_another_deployment() -> None:
    measured = _document()
    measured["identity"] = {**measured["identity"], "drafter_method": "draft_model", "drafter_params": 1.1e9}
    profile = parse_profile(measured)
    same = {**identity_of(_tiny_cpu()), "drafter_method": "draft_model", "drafter_params": 1.1e9 * 1.005}
    check_identity(profile, same, what="the target")  # rounding of the same drafter's size: no error
    bigger = {**same, "drafter_params": 3.0e9}
    with pytest.raises(ProfileError, match=r"drafter_params 1100000000\.0, but the target uses 3000000000\.0"):
        check_identity(profile, bigger, what="the target")


def test_a_draft_model_on_other_gpus_is_another_deployment() -> None:
    measured = _document()
    measured["identity"] = {**measured["identity"], "drafter_method": "draft_model", "drafter_params": 1.1e9,
                            "drafter_tensor_parallel": 4}
    profile = parse_profile(measured)
    assert profile.identity.drafter_tensor_parallel == 4
    same = {**identity_of(_tiny_cpu()), "drafter_method": "draft_model", "drafter_params": 1.1e9,
            "drafter_tensor_parallel": 4}
    check_identity(profile, same, what="the target")
    with pytest.raises(ProfileError, match="drafter_tensor_parallel 4, but the target uses 1"):
        check_identity(profile, {**same, "drafter_tensor_parallel": 1}, what="the target")
    # An n-gram drafter has no passes to place: nothing to compare.
    assert identity_of(_tiny_cpu())["drafter_tensor_parallel"] is None


def test_a_profile_without_the_drafter_size_is_not_checked_on_it() -> None:
    profile = parse_profile(_document())  # written before the size was recorded
    assert profile.identity.drafter_params is None
    check_identity(profile, {**identity_of(_tiny_cpu()), "drafter_params": 5e8}, what="the target")


def test_age_limit() -> None:
    profile = parse_profile(_document())
    check_age(profile, now_s=CREATED_S + 29 * DAY_S, max_age_s=30 * DAY_S)
    with pytest.raises(ProfileError, match=r"40.0 days old, past the 30.0-day limit"):
        check_age(profile, now_s=CREATED_S + 40 * DAY_S, max_age_s=30 * DAY_S)
    with pytest.raises(ProfileError, match="in the future"):
        check_age(profile, now_s=CREATED_S - 3600.0, max_age_s=30 * DAY_S)


def test_appending_the_same_deployment_keeps_both_kinds_and_the_newest_time() -> None:
    profile = parse_profile(_document())
    spec_only = MeasuredProfile(profile.identity, CREATED_S, profile.points[:1])
    plain_only = MeasuredProfile(profile.identity, CREATED_S + 600.0, profile.points[1:], complete=False)
    both = merged(spec_only, plain_only)
    assert both.points == profile.points
    assert both.created_at_s == CREATED_S + 600.0
    assert both.complete is False
    assert both.kinds_seen == (True, True)


def test_appending_another_deployment_or_engine_version_is_refused() -> None:
    profile = parse_profile(_document())
    other_gpu = ProfileIdentity("h100-sxm", "tiny-llama", 1, "ngram", engine_version="0.32.0")
    with pytest.raises(ProfileError, match="hardware"):
        merged(profile, MeasuredProfile(other_gpu, CREATED_S, profile.points))
    newer_engine = ProfileIdentity("cpu", "tiny-llama", 1, "ngram", engine_version="0.33.0")
    with pytest.raises(ProfileError, match=r"engine version '0\.32\.0', this measurement '0\.33\.0'"):
        merged(profile, MeasuredProfile(newer_engine, CREATED_S, profile.points))


def test_appending_past_the_point_limit_is_refused_not_truncated() -> None:
    profile = parse_profile(_document())
    big = MeasuredProfile(profile.identity, CREATED_S, profile.points * 400)  # 800 points
    with pytest.raises(ProfileError, match="appending would make 1002 points, past the 1000"):
        merged(big, MeasuredProfile(profile.identity, CREATED_S, profile.points * 101))
    assert len(merged(big, MeasuredProfile(profile.identity, CREATED_S, profile.points * 100)).points) == 1000


def test_points_become_calibration_observations() -> None:
    profile = parse_profile(_document())
    points = observations(profile, at_s=5.0)
    assert [(p.batch, p.tokens_per_seq, p.draft_passes, p.step_s) for p in points] == [
        (1.0, 3.8, 3, 0.0061), (7.7, 1.0, 0, 0.0102)
    ]
    assert all(p.at_s == 5.0 for p in points)


def test_a_level_below_one_sequence_per_step_is_fitted_at_batch_one() -> None:
    # A file the parser accepts (batch 0.5..1: the engine idle part of the level) must fit, not crash the pricing.
    document = _document()
    document["points"][0]["batch"] = 0.97
    profile = parse_profile(document)
    assert profile.points[0].batch == 0.97  # the file's figure is kept as measured
    assert observations(profile, at_s=5.0)[0].batch == 1.0
    fitted = fit_profile(profile, _tiny_cpu(), config=CalibrationConfig())
    assert fitted.fit.points == 2


def test_point_fields_are_what_the_file_says() -> None:
    point = parse_profile(_document()).points[1]
    assert point == ProfilePoint(
        concurrency=8, deployed_k=0, batch=7.7, tokens_per_seq=1.0, draft_passes=0, context_tokens=190.0,
        prefill_tokens=20.0, step_s=0.0102, step_samples=4100.0,
    )
