"""Each hysteresis helper alone: bounds, minimum change, dwell."""

from __future__ import annotations

import pytest

from policies.hysteresis import apply_dwell, clears_min_change, hysteresis_on

# ---- bounds


@pytest.mark.parametrize(
    ("low", "expected"),
    [
        (1.06, True),  # 1.06 >= 1 + 0.05
        (1.05, True),  # exactly on the bar counts as clearing it
        (1.04, False),  # 1.04 < 1.05
        (0.90, False),
    ],
)
def test_off_switches_on_only_when_low_end_clears_one_plus_margin(low: float, expected: bool) -> None:
    assert hysteresis_on(currently_on=False, low=low, high=2.0, margin=0.05) is expected


@pytest.mark.parametrize(
    ("high", "expected"),
    [
        (0.99, False),  # 0.99 < 1 -> off
        (1.00, True),  # not below 1 -> stays on
        (1.20, True),
    ],
)
def test_on_switches_off_only_when_high_end_falls_below_one(high: float, expected: bool) -> None:
    assert hysteresis_on(currently_on=True, low=0.5, high=high, margin=0.05) is expected


def test_band_between_thresholds_keeps_either_state() -> None:
    # band 0.97..1.10 with margin 0.05: low 0.97 < 1.05 (no switch on), high 1.10 >= 1 (no switch off)
    assert hysteresis_on(currently_on=False, low=0.97, high=1.10, margin=0.05) is False
    assert hysteresis_on(currently_on=True, low=0.97, high=1.10, margin=0.05) is True


def test_zero_margin_switches_on_at_one() -> None:
    assert hysteresis_on(currently_on=False, low=1.0, high=1.1, margin=0.0) is True


# ---- minimum change


def test_min_change_needs_the_full_gain() -> None:
    # 1.43 - 1.40 = 0.03 >= 0.02; 1.41 - 1.40 = 0.01 < 0.02
    assert clears_min_change(current=1.40, proposed=1.43, min_gain=0.02) is True
    assert clears_min_change(current=1.40, proposed=1.41, min_gain=0.02) is False


def test_min_change_counts_equality_and_rejects_losses() -> None:
    # 1.5 - 1.0 = 0.5 == 0.5 clears; with min_gain 0 a loss (1.0 - 1.2 = -0.2) still does not
    assert clears_min_change(current=1.0, proposed=1.5, min_gain=0.5) is True
    assert clears_min_change(current=1.2, proposed=1.0, min_gain=0.0) is False


def test_min_change_equality_survives_float_rounding() -> None:
    # 1.42 - 1.40 evaluates to 0.0199999... in binary floating point; the gain is 0.02 and should clear 0.02
    assert clears_min_change(current=1.40, proposed=1.42, min_gain=0.02) is True


# ---- dwell


def test_new_candidate_starts_waiting_now() -> None:
    out = apply_dwell(
        published="off", candidate="on", pending=None, pending_since_s=None, now_s=1000.0, dwell_s=120
    )
    assert (out.publish, out.changed, out.pending, out.pending_since_s, out.waited_s) == (
        "off",
        False,
        "on",
        1000.0,
        0.0,
    )


def test_same_candidate_publishes_once_the_dwell_is_served() -> None:
    # seen since 1000: at 1119 waited 119 < 120; at 1120 waited 120 >= 120
    before = apply_dwell(
        published="off", candidate="on", pending="on", pending_since_s=1000.0, now_s=1119.0, dwell_s=120
    )
    assert (before.publish, before.pending, before.waited_s) == ("off", "on", 119.0)
    at = apply_dwell(
        published="off", candidate="on", pending="on", pending_since_s=1000.0, now_s=1120.0, dwell_s=120
    )
    assert (at.publish, at.changed, at.pending, at.pending_since_s) == ("on", True, None, None)


def test_different_candidate_restarts_the_clock() -> None:
    out = apply_dwell(
        published="off", candidate="on-4", pending="on-3", pending_since_s=1000.0, now_s=1110.0, dwell_s=120
    )
    assert (out.publish, out.pending, out.pending_since_s, out.waited_s) == ("off", "on-4", 1110.0, 0.0)


def test_candidate_back_to_published_clears_pending() -> None:
    out = apply_dwell(
        published="off", candidate="off", pending="on", pending_since_s=1000.0, now_s=1100.0, dwell_s=120
    )
    assert (out.publish, out.changed, out.pending, out.pending_since_s) == ("off", False, None, None)


def test_zero_dwell_publishes_a_new_candidate_at_once() -> None:
    out = apply_dwell(
        published="off", candidate="on", pending=None, pending_since_s=None, now_s=1000.0, dwell_s=0
    )
    assert (out.publish, out.changed, out.pending) == ("on", True, None)


def test_clock_running_backwards_counts_as_no_wait() -> None:
    # since 1000, now 900: a negative wait is clamped to 0, not published, not stuck either
    out = apply_dwell(
        published="off", candidate="on", pending="on", pending_since_s=1000.0, now_s=900.0, dwell_s=120
    )
    assert (out.publish, out.pending, out.pending_since_s, out.waited_s) == ("off", "on", 1000.0, 0.0)
