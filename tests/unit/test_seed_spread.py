"""benchmarks/seed_spread.py: the table of advisor / best static by seed, and its counts."""

from __future__ import annotations

import math

from benchmarks.seed_spread import SeedResult, summary


def test_the_table_gives_each_scenarios_seeds_min_max_and_spread() -> None:
    results = [
        SeedResult("steady", 0, 1.000), SeedResult("steady", 1, 0.998), SeedResult("steady", 2, 1.004),
        SeedResult("behind", 0, 0.950), SeedResult("behind", 1, 0.990), SeedResult("behind", 2, 0.930),
        SeedResult("straddles", 0, 0.980), SeedResult("straddles", 1, 1.010), SeedResult("straddles", 2, 0.990),
    ]
    lines = summary(results)
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:-1]}
    # Per scenario: its ratios in seed order, then min, max, spread.
    assert rows["steady"] == ["1.000", "0.998", "1.004", "0.998", "1.004", "0.006"]
    assert rows["behind"] == ["0.950", "0.990", "0.930", "0.930", "0.990", "0.060"]
    assert rows["straddles"] == ["0.980", "1.010", "0.990", "0.980", "1.010", "0.030"]
    # "behind" is under 0.995 on every seed, "straddles" on some, "steady" on none (its least, 0.998, is above).
    # Spreads 0.006, 0.060, 0.030: median 0.030, max 0.060.
    assert lines[-1] == (
        "3 scenarios x 3 seeds: below 0.995 on every seed: 1; on some seeds only: 1; spread median 0.030, max 0.060"
    )


def test_a_seed_no_static_policy_served_is_left_out_and_said() -> None:
    lines = summary([SeedResult("idle", 0, math.nan), SeedResult("busy", 0, 0.99), SeedResult("busy", 1, 0.97)])
    assert "idle" in lines[1] and "nothing to compare" in lines[1]
    assert lines[2].split()[1:] == ["0.990", "0.970", "0.970", "0.990", "0.020"]
