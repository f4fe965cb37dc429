"""Scenario builders for the decide tests: a plausible default plus the one field a test cares about."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from policies.types import AcceptanceEvidence, CurvePoint, DataState, Evidence

T0 = 1_700_000_000.0  # a fixed epoch; tests advance it by hand


def make_acceptance(**overrides: Any) -> AcceptanceEvidence:
    base = AcceptanceEvidence(
        per_position=(0.8, 0.6, 0.45),
        per_position_low=(0.78, 0.57, 0.42),
        per_position_high=(0.82, 0.63, 0.48),
        drafts=900.0,
        draft_tokens=2700.0,
        accepted_tokens=1665.0,
        mean_acceptance_length=2.85,
        acceptance_rate=0.62,
        mean_proposed_length=3.0,
        window_s=60.0,
    )
    return replace(base, **overrides)


def make_evidence(**overrides: Any) -> Evidence:
    """Good evidence for a target running with speculation off at batch 6; override any field."""
    base = Evidence(
        target="http://127.0.0.1:8000",
        model="meta-llama/Llama-3.1-8B-Instruct",
        at_s=T0,
        state=DataState.OK,
        speculation_on=False,
        deployed_k=0,
        acceptance=make_acceptance(),
        batch=6.0,
        waiting=0.0,
        window_s=60.0,
    )
    return replace(base, **overrides)


Band = float | tuple[float, float, float]


def make_point(
    gamma: int,
    band: Band,
    *,
    expected_accepted_length: float | None = None,
    extrapolated: bool = False,
) -> CurvePoint:
    """A point from a bare speedup (band +-0.05) or an explicit (low, speedup, high) triple."""
    low, mid, high = (band - 0.05, band, band + 0.05) if isinstance(band, float | int) else band
    return CurvePoint(
        gamma=gamma,
        speedup=mid,
        speedup_low=low,
        speedup_high=high,
        expected_accepted_length=(
            1.0 + 0.5 * gamma if expected_accepted_length is None else expected_accepted_length
        ),
        step_time_s=0.020 + 0.001 * gamma,
        extrapolated=extrapolated,
    )


def make_curve(*bands: Band, extrapolated_above: int | None = None) -> tuple[CurvePoint, ...]:
    """Gamma 0 (exactly 1.0) followed by one point per band for gamma 1, 2, ...

    `extrapolated_above=k` flags every gamma > k as extrapolated (what the cost model does beyond the deployed
    k).
    """
    zero = CurvePoint(
        gamma=0,
        speedup=1.0,
        speedup_low=1.0,
        speedup_high=1.0,
        expected_accepted_length=1.0,
        step_time_s=0.020,
    )
    points = [
        make_point(g, band, extrapolated=extrapolated_above is not None and g > extrapolated_above)
        for g, band in enumerate(bands, start=1)
    ]
    return (zero, *points)
