"""The cost model against published measurements (tests/fixtures/published/, each file's header naming its sources)
and the physics' known consequences.

Measured acceptance lengths (AL) go in; the model predicts the step times, hence the speedup. Tolerances are what
the model honestly achieves without fitting to these rows (the constants in policies/model/profiles.py are derived from
one point of the eagle3 sweep and the K=0 overhead file, not fitted to the sweep's shape):
- vLLM EAGLE k-sweep, batch 1, H100 (vllm-eagle-k-sweep-bs1.csv): every row within 20% (observed: eagle3 +8..+16%,
  eagle1 -8..-16%; the heads' real costs sit between our two head profiles), and the best k within one of the
  measured best.
- Spec-Bench batch 1 (specbench-batch1.csv; HF-transformers loops, trees for EAGLE): every row the model can
  represent (eagle, pld, sps on A100 x vicuna-7b/13b/33b and RTX 3090 x vicuna-7b) within its method's tolerance
  (SPECBENCH_REL_TOL, where the observed errors are listed), and per target the methods ranked as measured where
  the measured speedups differ by more than 0.3.
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest
from costmodel_builders import make_acceptance, make_context, make_evidence

from policies.model.acceptance import AcceptancePoint
from policies.model.costmodel import ModelContext, curve_for, speedup_curve
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.model.roofline import Shape
from policies.types import DraftMethod

PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "published"
PLAIN_TPOT_MS = 7.07  # vllm-eagle-k-sweep-bs1.csv header: vanilla TPOT

def _rows(name: str) -> list[dict[str, str]]:
    lines = [line for line in (PUBLISHED / name).read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def _chain(gamma: int, mean_length: float) -> list[AcceptancePoint]:
    # Only E[L] at the deployed gamma matters for S(gamma); lower gammas are filled linearly.
    points = [AcceptancePoint(0, 1.0, 1.0, 1.0, False)]
    for g in range(1, gamma + 1):
        value = 1.0 + (mean_length - 1.0) * g / gamma
        points.append(AcceptancePoint(g, value, value, value, False))
    return points


@pytest.mark.parametrize(("drafter", "method"), [("eagle3", DraftMethod.EAGLE3), ("eagle1", DraftMethod.EAGLE)])
def test_vllm_eagle_k_sweep_at_batch_1(drafter: str, method: DraftMethod) -> None:
    ctx = make_context(method=method)
    predicted: dict[int, float] = {}
    measured: dict[int, float] = {}
    for row in _rows("vllm-eagle-k-sweep-bs1.csv"):
        if row["drafter"] != drafter:
            continue
        k, al = int(row["k"]), float(row["acceptance_length"])
        curve, _ = curve_for(ctx, _chain(k, al), Shape(batch=1.0, context_tokens=512.0))
        predicted[k] = curve[k].speedup
        measured[k] = PLAIN_TPOT_MS / float(row["tpot_ms"])  # e.g. eagle3 k=3: 7.07 / 4.09 = 1.729
        assert predicted[k] == pytest.approx(measured[k], rel=0.20), (drafter, k)
    best_predicted = max(predicted, key=lambda k: predicted[k])
    best_measured = max(measured, key=lambda k: measured[k])
    assert abs(best_predicted - best_measured) <= 1


def test_plain_batch1_step_matches_the_published_tpot() -> None:
    # H100, Llama-3.1-8B, plain: weights 5.30 ms blended with the 1.65 ms one-tile compute floor -> 5.31 ms,
    # + 1.52 ms overhead = 6.83 ms vs the measured 7.07 ms.
    _, base = curve_for(make_context(), _chain(1, 1.5), Shape(batch=1.0, context_tokens=512.0))
    assert base == pytest.approx(PLAIN_TPOT_MS * 1e-3, rel=0.05)


# The CSV's names resolve as they are: its targets are catalog models (policies/model/catalog.py, lmsys/vicuna-*-v1.3),
# and its "a100-80gb" (the leaderboard's "A100 80GB", no form factor) is the SXM card by alias (S is a ratio of step
# times, so the PCIe card's 5% lower bandwidth barely moves it).
SPECBENCH_TARGETS = ("vicuna-7b", "vicuna-13b", "vicuna-33b")

# Methods with a drafter of that kind in policies/. Out: medusa / hydra (parallel heads on the target's last hidden
# state, no DraftMethod for them), rest (retrieval datastore), lookahead (Jacobi iteration inside the target's own
# forward). eagle2 is EAGLE-1's head with a dynamic, re-ranked tree whose size the leaderboard does not state (EAGLE-2's
# default budget is ~60 tokens); priced as a 59-token tree 5 deep its 3090 row comes out 2.56 vs 2.25 measured
# (+14%; 2.47 at depth 6, 2.74 with 48 tokens), but the size would be our guess, so the row is left out.
SPECBENCH_METHODS = {"eagle": DraftMethod.EAGLE, "pld": DraftMethod.NGRAM, "sps": DraftMethod.DRAFT_MODEL}
# Spec-Bench's defaults: EAGLE depth-5 tree (priced as that tree), sps gamma 4, pld up to 10 tokens.
SPECBENCH_GAMMA = {"eagle": 5, "sps": 4, "pld": 10}
# EAGLE's default tree (SafeAILab/EAGLE model/choices.py mc_sim_7b_63, as copied in xformers' tree-attention tests):
# 25 draft nodes, 5 levels deep; the target verifies 26 tokens per step. The other methods draft chains.
SPECBENCH_TREE_TOKENS = {"eagle": 25.0}
# Every included row is over-predicted; the model's overhead constants come from vLLM (CUDA graphs), while Spec-Bench
# runs eager HF-transformers loops whose per-step Python and launch costs are larger. Tolerance = worst observed error
# plus a margin for constant changes elsewhere (A100 rows for 7b / 13b / 33b, then the RTX 3090 7b row):
# - pld: +0.1 / +8.1 / +6.7%, 3090 +6.5%. No drafter weights, so only the verify step's pricing is in play: 12%.
# - eagle: -0.4 / +11.9 / +12.8%, 3090 +16.7%, priced as its tree (SPECBENCH_TREE_TOKENS). What is left is HF's
#   per-step tree bookkeeping (masks, top-k re-ranking, many small launches in an eager loop): 20%. (As a 6-token
#   chain the rows were +0.4 / +13.0 / +14.1 / +23.2%: on the 3090, half the A100's FLOP per byte, the tree's
#   nodes are real math.)
# - sps: +16.4 / +24.4 / +16.1%, 3090 +9.6%. The 2-layer vicuna-68m draft is launch-bound in an eager loop, four
#   times a step, where the model charges 0.5 ms a draft step (vLLM's figure): 30%.
SPECBENCH_REL_TOL = {"eagle": 0.20, "pld": 0.12, "sps": 0.30}


def _specbench_context(gpu: str, target_name: str, method: str) -> ModelContext:
    target = model_by_name(target_name)
    hardware = hardware_by_name(gpu)
    kind = SPECBENCH_METHODS[method]
    if kind == DraftMethod.DRAFT_MODEL:
        draft = model_by_name("vicuna-68m")  # Spec-Bench's sps draft, double7/vicuna-68m
        return ModelContext(hardware, target, drafter_for(kind, target, draft_model=draft))
    return ModelContext(hardware, target, drafter_for(kind, target))


def _specbench_predicted(row: dict[str, str]) -> float:
    gamma = SPECBENCH_GAMMA[row["method"]]
    curve, _ = curve_for(
        _specbench_context(row["gpu"], row["target"], row["method"]), _chain(gamma, float(row["mean_accepted_tokens"])),
        Shape(batch=1.0, context_tokens=512.0), tree_tokens=SPECBENCH_TREE_TOKENS.get(row["method"]),
    )
    return curve[gamma].speedup


def _has_hardware(gpu: str) -> bool:
    try:
        hardware_by_name(gpu)
    except ValueError:
        return False
    return True


def _specbench_params() -> list[object]:
    params: list[object] = []
    for row in _rows("specbench-batch1.csv"):
        if row["method"] not in SPECBENCH_METHODS:
            continue
        # A GPU without a catalog profile (none today) is skipped, not silently priced on another card.
        marks = () if _has_hardware(row["gpu"]) else pytest.mark.skip(
            reason=f"no hardware profile for {row['gpu']} (policies/model/catalog.py HARDWARE_ROWS)"
        )
        params.append(pytest.param(row, id=f"{row['gpu']}-{row['target']}-{row['method']}", marks=marks))
    return params


@pytest.mark.parametrize("row", _specbench_params())
def test_specbench_row_at_batch_1(row: dict[str, str]) -> None:
    predicted = _specbench_predicted(row)
    measured = float(row["overall_speedup"])
    tolerance = SPECBENCH_REL_TOL[row["method"]]
    assert predicted == pytest.approx(measured, rel=tolerance), (
        f"{row['gpu']} {row['target']} {row['method']}: predicted {predicted:.2f}, measured {measured:.2f}, "
        f"tolerance {tolerance:.0%}"
    )


def test_specbench_a100_ranks_the_methods_as_measured() -> None:
    # Only pairs measured more than 0.3 apart: pld and sps are 0.10 / 0.01 / 0.19 apart on 7b / 13b / 33b, closer
    # than the model's own error, and on 7b the model puts sps (1.73) above pld (1.59) where the measurement has
    # pld 1.59 > sps 1.49.
    by_target: dict[str, dict[str, tuple[float, float]]] = {}
    for row in _rows("specbench-batch1.csv"):
        if row["gpu"] == "a100-80gb" and row["method"] in SPECBENCH_METHODS:
            by_target.setdefault(row["target"], {})[row["method"]] = (
                _specbench_predicted(row), float(row["overall_speedup"]),
            )
    assert set(by_target) == set(SPECBENCH_TARGETS)
    for target, methods in by_target.items():
        assert set(methods) == set(SPECBENCH_METHODS), target
        for a, (predicted_a, measured_a) in methods.items():
            for b, (predicted_b, measured_b) in methods.items():
                if measured_a - measured_b > 0.3:
                    assert predicted_a > predicted_b, (target, a, b)


# ---------------------------------------------------------------------------------------------------------------
# Known consequences of the physics
# ---------------------------------------------------------------------------------------------------------------


def _s(batch: float, *, ctx_tokens: float = 128.0, gamma: int = 3, context: ModelContext | None = None,
       per_position: tuple[float, ...] = (0.78, 0.58, 0.43)) -> float:
    evidence = make_evidence(batch=batch, context_tokens_per_seq=ctx_tokens, acceptance=make_acceptance(per_position))
    return speedup_curve(evidence, context or make_context(), gamma_max=gamma)[gamma].speedup


def _crossover(*, ctx_tokens: float, per_position: tuple[float, ...] = (0.78, 0.58, 0.43)) -> float:
    batches = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0]
    for b in batches:
        if _s(b, ctx_tokens=ctx_tokens, per_position=per_position) < 1.0:
            return b
    return float("inf")


def test_speedup_falls_with_batch_at_short_context() -> None:
    values = [_s(b) for b in (16.0, 64.0, 128.0, 256.0)]
    assert values == sorted(values, reverse=True)
    assert values[-1] < 0.7 * _s(1.0)


def test_long_context_raises_the_crossover_batch() -> None:
    # KV reads grow with B x ctx and keep the step memory-bound, so verification stays cheap to larger batches.
    assert _crossover(ctx_tokens=8192.0) > _crossover(ctx_tokens=128.0)


def test_a_larger_k_helps_less_at_high_batch() -> None:
    r = (0.78, 0.58, 0.43, 0.33, 0.25)
    gain_b1 = _s(1.0, gamma=5, per_position=r) / _s(1.0, gamma=2, per_position=r)
    gain_b256 = _s(256.0, gamma=5, per_position=r) / _s(256.0, gamma=2, per_position=r)
    assert gain_b256 < gain_b1
    assert gain_b256 < 1.0  # at B=256 the extra verified tokens cost more than they return


def test_a_better_drafter_moves_the_crossover_up() -> None:
    worse = _crossover(ctx_tokens=512.0, per_position=(0.6, 0.36, 0.22))
    better = _crossover(ctx_tokens=512.0, per_position=(0.9, 0.81, 0.73))
    assert better > worse


def test_leviathan_batch1_formula_when_verification_costs_one_step() -> None:
    # Leviathan et al. 2023: with i.i.d. acceptance alpha, gamma drafts and a drafter costing c target steps,
    # S = (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)). With no drafting cost (c = 0, host n-gram at zero
    # host time, no speculative overhead and no per-draft-token cost) and a verify step costing one plain step
    # (B=1, memory-bound, the extra 3 tokens hide under the weight stream), S(3) at alpha 0.7 = (1 - 0.7^4) / 0.3
    # = 2.533.
    base = make_context(method=DraftMethod.NGRAM)
    free = ModelContext(
        hardware=replace(base.hardware, spec_step_overhead_s=0.0, spec_per_request_overhead_s=0.0,
                         per_token_step_s=0.0),
        model=base.model,
        drafter=replace(base.drafter, host_time_per_request_s=0.0),
    )
    alpha = 0.7
    positions = tuple(alpha**i for i in range(1, 4))
    evidence = make_evidence(acceptance=make_acceptance(positions), context_tokens_per_seq=512.0)
    s3 = speedup_curve(evidence, free, gamma_max=3)[3].speedup
    assert s3 == pytest.approx((1 - alpha**4) / (1 - alpha), rel=0.01)
