"""policies/estimate/memory.py: what is remembered, how it ages, when it stops being usable."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from costmodel_builders import make_acceptance, make_evidence

from policies.estimate.memory import (
    AcceptanceMemory,
    MemoryConfig,
    RememberedAcceptance,
    effective_drafts,
    format_age,
    recall,
    remember,
)
from policies.types import DataState

NOW = 1_800_000_000.0
CONFIG = MemoryConfig()  # half-life 1800 s, cap 2000, floor 30, max age 6 h, min drafts 200, z 1.96
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # costmodel_builders.make_evidence's model


def entry(
    per_position: tuple[float, ...] = (0.8, 0.6, 0.45),
    *,
    drafts: float = 9000.0,
    age_s: float = 0.0,
    cold_start: bool = False,
) -> RememberedAcceptance:
    return RememberedAcceptance(
        model=MODEL,
        per_position=per_position,
        per_position_low=per_position,
        per_position_high=per_position,
        drafts=drafts,
        mean_proposed_length=float(len(per_position)),
        measured_at_s=NOW - age_s,
        cold_start=cold_start,
    )


# ------------------------------------------------------------------------------------------------------------
# remember
# ------------------------------------------------------------------------------------------------------------


def test_ok_evidence_while_speculating_is_remembered_with_its_counts_k_and_time() -> None:
    evidence = make_evidence(at_s=NOW, acceptance=make_acceptance((0.8, 0.6, 0.45), drafts=900.0))
    memory = remember(AcceptanceMemory(), evidence, config=CONFIG, now_s=NOW)
    got = memory.get(MODEL)
    assert got is not None
    assert got.per_position == (0.8, 0.6, 0.45)
    assert got.drafts == 900.0
    assert got.k == 3
    assert got.measured_at_s == NOW
    assert not got.cold_start


@pytest.mark.parametrize(
    "overrides",
    [
        {"state": DataState.INSUFFICIENT_DATA},
        {"state": DataState.STALE},
        {"speculation_on": False, "deployed_k": 0, "acceptance": None},
        {"acceptance": make_acceptance((0.8, 0.6, 0.45), drafts=150.0)},  # 150 < min_drafts 200
    ],
    ids=["insufficient", "stale", "speculation-off", "too-few-drafts"],
)
def test_untrusted_evidence_leaves_the_memory_as_it_was(overrides: dict[str, object]) -> None:
    before = AcceptanceMemory(entries=(entry(age_s=600.0),))
    after = remember(before, make_evidence(at_s=NOW, **overrides), config=CONFIG, now_s=NOW)
    assert after is before


def test_a_new_window_replaces_the_old_profile_of_the_same_model_and_keeps_other_models() -> None:
    other = replace(entry(), model="other-model")
    before = AcceptanceMemory(entries=(entry(age_s=600.0), other))
    evidence = make_evidence(at_s=NOW, acceptance=make_acceptance((0.5, 0.2), drafts=400.0), deployed_k=2)
    after = remember(before, evidence, config=CONFIG, now_s=NOW)
    assert [e.model for e in after.entries] == sorted([MODEL, "other-model"])
    mine = after.get(MODEL)
    assert mine is not None and mine.per_position == (0.5, 0.2) and mine.k == 2
    assert after.get("other-model") == other


def test_cold_start_counts_do_not_replace_a_usable_windowed_profile_but_fill_an_empty_or_unusable_one() -> None:
    cold = make_evidence(at_s=NOW, acceptance=replace(make_acceptance((0.3,), drafts=5000.0), cold_start=True))
    # A windowed profile 10 min old is still usable: lifetime counters (possibly days of other traffic) lose.
    usable = AcceptanceMemory(entries=(entry(age_s=600.0),))
    assert remember(usable, cold, config=CONFIG, now_s=NOW) is usable
    # Nothing remembered: the cold start is better than nothing, and is marked as such.
    filled = remember(AcceptanceMemory(), cold, config=CONFIG, now_s=NOW).get(MODEL)
    assert filled is not None and filled.cold_start and filled.per_position == (0.3,)
    # A windowed profile 7 h old is past max_age_s (6 h): the cold start replaces it.
    old = AcceptanceMemory(entries=(entry(age_s=7 * 3600.0),))
    replaced = remember(old, cold, config=CONFIG, now_s=NOW).get(MODEL)
    assert replaced is not None and replaced.cold_start


# ------------------------------------------------------------------------------------------------------------
# ageing
# ------------------------------------------------------------------------------------------------------------


def test_effective_drafts_are_capped_then_halve_every_half_life() -> None:
    # min(9000, cap 2000) = 2000 at age 0; 2000 / 2 = 1000 after one half-life (1800 s); 2000 / 4 = 500 after two.
    assert effective_drafts(entry(age_s=0.0), config=CONFIG, now_s=NOW) == pytest.approx(2000.0)
    assert effective_drafts(entry(age_s=1800.0), config=CONFIG, now_s=NOW) == pytest.approx(1000.0)
    assert effective_drafts(entry(age_s=3600.0), config=CONFIG, now_s=NOW) == pytest.approx(500.0)
    # Below the cap the measured count itself decays: 300 x 2^(-1) = 150.
    assert effective_drafts(entry(drafts=300.0, age_s=1800.0), config=CONFIG, now_s=NOW) == pytest.approx(150.0)
    # A clock behind the measurement counts as age 0, never as a gain.
    assert effective_drafts(entry(age_s=-100.0), config=CONFIG, now_s=NOW) == pytest.approx(2000.0)


def test_aged_interval_is_the_wilson_interval_at_the_effective_count() -> None:
    # n_eff = 500 (one hour, see above); r_1 = 0.8 -> 400 successes of 500: z^2/n = 3.8416 / 500 = 0.0076832,
    # centre = (0.8 + 0.0038416) / 1.0076832 = 0.79770, half = 1.96 / 1.0076832 x sqrt(0.16 / 500 + 3.8416 / 1e6)
    # = 1.94506 x 0.017996 = 0.035003 -> (0.76270, 0.83270).
    got = recall(entry(age_s=3600.0), config=CONFIG, now_s=NOW)
    assert got.usable and got.acceptance is not None
    assert got.acceptance.per_position_low[0] == pytest.approx(0.76270, abs=2e-5)
    assert got.acceptance.per_position_high[0] == pytest.approx(0.83270, abs=2e-5)
    # The points themselves are kept: 1 + 0.8 + 0.6 + 0.45 = 2.85 tokens per verification.
    assert got.acceptance.per_position == (0.8, 0.6, 0.45)
    assert got.acceptance.mean_acceptance_length == pytest.approx(2.85)
    assert got.age_s == 3600.0 and got.effective_drafts == pytest.approx(500.0)


def test_intervals_only_widen_with_age() -> None:
    ages = [0.0, 600.0, 1800.0, 3600.0, 7200.0, 10_800.0]
    lows, highs = [], []
    for age in ages:
        got = recall(entry(age_s=age), config=CONFIG, now_s=NOW)
        assert got.acceptance is not None
        lows.append(got.acceptance.per_position_low)
        highs.append(got.acceptance.per_position_high)
    for earlier, later in itertools.pairwise(lows):
        assert all(b < a for a, b in zip(earlier, later, strict=True))
    for earlier, later in itertools.pairwise(highs):
        assert all(b > a for a, b in zip(earlier, later, strict=True))


def test_the_measured_interval_is_never_narrowed_by_recall() -> None:
    # A thin measurement (wide interval 0.6..0.95) recalled at once: Wilson at n_eff = 250 would be narrower
    # (about 0.75..0.85), so the measured bounds stand.
    thin = replace(entry(drafts=250.0), per_position=(0.8,), per_position_low=(0.6,), per_position_high=(0.95,))
    got = recall(thin, config=CONFIG, now_s=NOW)
    assert got.acceptance is not None
    assert got.acceptance.per_position_low == (0.6,)
    assert got.acceptance.per_position_high == (0.95,)


def test_usable_until_the_effective_count_falls_below_the_floor_or_the_age_passes_the_limit() -> None:
    # 3 h = 6 half-lives: 2000 / 64 = 31.25 >= 30 -> usable.
    assert recall(entry(age_s=10_800.0), config=CONFIG, now_s=NOW).usable
    # 11 000 s: 2000 x 2^(-6.11) = 28.9 < 30 -> unusable, and the reason names the floor.
    late = recall(entry(age_s=11_000.0), config=CONFIG, now_s=NOW)
    assert not late.usable and late.acceptance is None
    assert "below 30" in late.why_not
    # A very long half-life keeps n_eff high, but the 6 h limit still applies: 7 h is too old.
    patient = MemoryConfig(half_life_s=1e9)
    old = recall(entry(age_s=7 * 3600.0), config=patient, now_s=NOW)
    assert not old.usable
    assert "7.0 h old, past the 6.0 h limit" in old.why_not
    assert "not used" in old.describe()


def test_describe_names_age_k_drafts_and_effective_count() -> None:
    # 12 min: n_eff = 2000 x 2^(-720 / 1800) = 2000 x 0.7579 = 1516.
    text = recall(entry(age_s=720.0), config=CONFIG, now_s=NOW).describe()
    assert text == "remembered acceptance from 12 min ago (k=3, 9000 drafts, aged to 1516 effective)"


def test_format_age() -> None:
    assert format_age(42.0) == "42 s"
    assert format_age(720.0) == "12 min"
    assert format_age(25_200.0) == "7.0 h"


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="half_life_s"):
        MemoryConfig(half_life_s=0.0)
    with pytest.raises(ValueError, match="min_effective_drafts"):
        MemoryConfig(min_effective_drafts=0.5)
