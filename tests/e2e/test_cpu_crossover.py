"""The CPU crossover benchmark (benchmarks/cpu_crossover.py) runs its --quick plan end to end on a real vLLM server.

Behaviour only: every level of both arms completed without a failed request, the sidecar's S(3) was read at every
level of the speculating arm, the server was profiled with and without speculation and a second sidecar predicted
from that profile, and the JSON holds the fields the report and the hardware-profile fit read. Accuracy and speed
are the benchmark's figures to print, not this test's to assert.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_vllm import SKIP_REASON, e2e_cache, e2e_enabled, vllm_python

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not e2e_enabled(), reason=SKIP_REASON)]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "untied"
QUICK_LEVELS = [1, 4, 16]
PROFILE_LEVELS = [2, 8]
UNMEASURED = "verification cost not measured yet"
# Four vLLM starts (~30-60 s each), a model build on a cold cache, 2 x 3 levels of 8 s and 2 x 2 profile levels of
# 6 s (+2 s warm-up each): a few minutes; the bound only keeps a hung run from hanging CI.
RUN_TIMEOUT_S = 1500.0

POINT_FIELDS = {
    "model", "concurrency", "on", "off", "true_speedup_per_seq", "true_speedup_total", "predicted_speedup",
    "predicted_low", "predicted_high", "pred_over_true", "inside_band", "predictions", "implied_plain_step_s",
}  # fmt: skip
ARM_FIELDS = {"tokens_per_s", "tokens_per_s_per_seq", "running_mean", "step_time_s", "decode_seqs_per_step", "errors"}
SUMMARY_FIELDS = {"median_abs_pred_over_true_minus_1", "sign_right", "sign_judged", "inside_band_share"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    vllm_python()  # fails the test with a clear message when the vLLM venv is missing
    out = tmp_path_factory.mktemp("cpu-crossover")
    env = dict(os.environ, SPEC_ADVISOR_BENCH_CACHE=str(e2e_cache() / "bench"))
    argv = [sys.executable, "-m", "benchmarks.cpu_crossover", "--quick", "--models", MODEL, "--out", str(out)]
    try:
        result = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the quick benchmark ran over {RUN_TIMEOUT_S:.0f} s:\n{exc.stderr!s:.6000}", pytrace=False)
    if result.returncode != 0:
        pytest.fail(
            f"the quick benchmark exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}",
            pytrace=False,
        )
    document: dict[str, Any] = json.loads((out / "cpu-crossover.json").read_text(encoding="utf-8"))
    return document, result.stdout


def test_every_level_of_both_arms_completed_without_errors(quick_run: tuple[dict[str, Any], str]) -> None:
    document, _ = quick_run
    assert document["failures"] == []
    assert document["plan"]["name"] == "quick"
    runs = document["runs"]
    for arm in ("on", "off"):
        levels = [run for run in runs if run["arm"] == arm]
        assert sorted(run["concurrency"] for run in levels) == QUICK_LEVELS, (arm, levels)
        for run in levels:
            client = run["client"]
            assert client["errors"] == 0, run
            assert client["requests"] > 0, run
            assert client["completion_tokens"] > 0, run
            assert not client["stopped_early"], run
            assert run["engine"] is not None, run  # the server's own /metrics were read over the level
            assert run["engine"]["step_time_s"] is not None, run
    # The speculating arm's engine saw drafts; the plain arm's saw none.
    assert all(run["engine"]["drafts"] for run in runs if run["arm"] == "on")
    assert all(run["engine"]["drafts"] is None for run in runs if run["arm"] == "off")


def test_a_prediction_was_read_at_every_level(quick_run: tuple[dict[str, Any], str]) -> None:
    document, _ = quick_run
    for run in (run for run in document["runs"] if run["arm"] == "on"):
        reading = run["reading"]
        assert reading is not None, run
        gammas = [int(point["gamma"]) for point in reading["recommendation"]["curve"]]
        assert document["deployed_k"] in gammas, reading
    for point in document["points"]:
        assert point["predicted_speedup"] is not None, point
        assert point["predicted_low"] <= point["predicted_speedup"] <= point["predicted_high"], point


def test_the_json_and_the_printout_have_the_fields(quick_run: tuple[dict[str, Any], str]) -> None:
    document, stdout = quick_run
    points = document["points"]
    assert [(p["model"], p["concurrency"]) for p in points] == [(MODEL, level) for level in QUICK_LEVELS]
    for point in points:
        assert point.keys() >= POINT_FIELDS, POINT_FIELDS - point.keys()
        for arm in ("on", "off"):
            assert point[arm].keys() >= ARM_FIELDS, (arm, ARM_FIELDS - point[arm].keys())
            assert point[arm]["errors"] == 0
        assert point["true_speedup_per_seq"] is not None and point["true_speedup_per_seq"] > 0
        assert isinstance(point["inside_band"], bool)
    for name in (MODEL, "all"):
        assert document["summary"][name].keys() >= SUMMARY_FIELDS
    assert document["models"][MODEL]["tie_word_embeddings"] is False
    for heading in ("True speedup of n-gram k=3", "Engine per level and arm", "Plain step: measured", "Summary",
                    "Summary with the measured profile"):
        assert heading in stdout


def test_the_profile_measured_both_kinds_of_step_and_its_sidecar_predicted_from_them(
    quick_run: tuple[dict[str, Any], str],
) -> None:
    document, _ = quick_run
    profile = document["profiles"][MODEL]
    assert profile["complete"] is True
    assert profile["identity"]["hardware"] == "cpu" and profile["identity"]["drafter_method"] == "ngram"
    by_kind: dict[bool, list[int]] = {True: [], False: []}  # speculative (drafting passes > 0) or plain
    for point in profile["points"]:
        by_kind[point["draft_passes"] > 0].append(point["concurrency"])
    assert sorted(by_kind[True]) == PROFILE_LEVELS and sorted(by_kind[False]) == PROFILE_LEVELS, by_kind
    for run in (run for run in document["runs"] if run["arm"] == "on"):
        live, profiled = run["reading"], run["profiled"]
        assert profiled is not None, run
        # The reason names what is unmeasured only on a decision made on good data.
        assert live["recommendation"]["state"] == "ok" and profiled["recommendation"]["state"] == "ok", run
        assert document["deployed_k"] in [int(point["gamma"]) for point in profiled["recommendation"]["curve"]]
        # One kind of step live: the live sidecar says the verification cost is its prior's; the profile has
        # measured it, so the sidecar given the profile does not.
        assert UNMEASURED in live["recommendation"]["reason"], live["recommendation"]["reason"]
        assert UNMEASURED not in profiled["recommendation"]["reason"], profiled["recommendation"]["reason"]
    for point in document["points"]:
        judged = point["profiled"]
        assert judged is not None, point
        assert judged["predicted_low"] <= judged["predicted_speedup"] <= judged["predicted_high"], judged
        assert isinstance(judged["inside_band"], bool)
    assert document["profiled_summary"]["all"].keys() >= SUMMARY_FIELDS
