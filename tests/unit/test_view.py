"""The demo's terminal view: what each line says for the states an operator meets (warm-up, off, kept, ok)."""

from __future__ import annotations

from dataclasses import replace

from costmodel_builders import make_evidence, make_off_evidence

from policies.types import DataState, Decision
from service.board import BoardEntry
from service.cli.view import render

NOW = 1_800_000_000.0
LONG_REASON = "; ".join(
    [
        "on, gamma 3: best S(3)=1.63 [1.09..2.44] at batch 1.4",
        "stays: on, gamma 2 S(2)=1.61 [1.14..2.27] gains -1.4% expected (a free move) < margin 2%",
        "objective latency (latency-bound: no queue, KV 0%)",
        "verification cost not measured yet (no plain steps seen, nor another k): bands cover the prior's per-token "
        "and drafting costs, and a window with speculation off or at another k measures them",
        "model calibration error 9.9% over 2 points",
    ]
)


def _decision(**overrides: object) -> Decision:
    base = Decision(
        target="sim", model="demo", state=DataState.OK, enabled=True, num_speculative_tokens=3,
        expected_speedup=1.63, expected_speedup_low=1.09, expected_speedup_high=2.44, reason=LONG_REASON,
        evaluated_at_s=NOW, changed_at_s=NOW - 30.0,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def _screen(status: BoardEntry) -> str:
    return render([status], now_s=NOW, header=["spec-advisor demo"], color=False)


def test_every_line_fits_120_columns_and_the_view_shows_the_sentence_not_the_arithmetic() -> None:
    sentence = "Keep speculation on, k=3: expected 1.63x (1.09-2.44x) at batch 1; no other setting does clearly better."
    status = BoardEntry(target="sim", model="demo", evidence=make_evidence(window_s=60.0),
                          decision=_decision(summary=sentence))
    long_line = "simulated vLLM: http://127.0.0.1:40000/metrics   model demo-llama-8b on 'h100-sxm'   " * 3
    header = ["spec-advisor demo", long_line]
    screen = render([status], now_s=NOW, header=header, color=False)
    assert max(len(line) for line in screen.splitlines()) <= 120
    assert "RECOMMEND: speculation ON, num_speculative_tokens=3   expected 1.63x [1.09..2.44]   state ok" in screen
    assert f"\n  {sentence}\n" in screen
    assert "objective latency" not in screen  # the reason's clauses are the API's
    # The load is labelled with the window it is a mean over.
    assert "load, mean over the last 60 s: 1.0 running, 0.0 waiting" in screen


def test_warm_up_shows_the_deployment_not_a_recommendation() -> None:
    # Nothing published yet: the decision only mirrors the deployment; it must not read as a green "ON 1.00x".
    held = _decision(
        state=DataState.INSUFFICIENT_DATA, expected_speedup=1.0, expected_speedup_low=1.0,
        expected_speedup_high=1.0, changed_at_s=None,
        reason="insufficient_data: nothing published yet, showing the current deployment (on, gamma 3)",
    )
    thin = make_evidence(acceptance=None, state=DataState.INSUFFICIENT_DATA, reason="40 drafts in 10s, need 200")
    screen = _screen(BoardEntry(target="sim", model="demo", evidence=thin, decision=held))
    assert "NO RECOMMENDATION YET (deployed: speculation ON, num_speculative_tokens=3)   state insufficient_data" in (
        screen
    )
    assert "RECOMMEND:" not in screen and "1.00x" not in screen
    assert "acceptance: not measured yet (40 drafts in 10s, need 200)" in screen
    assert "speculation off" not in screen


def test_a_kept_recommendation_says_it_is_kept() -> None:
    stale = _decision(state=DataState.STALE, reason="stale: keeping on, gamma 3 from the last good decision 12s ago")
    screen = _screen(BoardEntry(target="sim", model="demo", evidence=make_evidence(), decision=stale))
    assert "KEEPING the last recommendation: speculation ON, num_speculative_tokens=3" in screen
    assert "state stale" in screen and "RECOMMEND:" not in screen


def test_off_says_where_the_acceptance_comes_from() -> None:
    off = _decision(enabled=False, num_speculative_tokens=0, expected_speedup=1.0, expected_speedup_low=1.0,
                    expected_speedup_high=1.0, reason="off: best S(3)=0.80 [0.70..0.90] at batch 200.0; stays")
    screen = _screen(BoardEntry(target="sim", model="demo", evidence=make_off_evidence(), decision=off))
    assert "deployed: speculation off" in screen
    assert "acceptance: not measured while speculation is off" in screen
    assert "RECOMMEND: speculation OFF" in screen
