"""A page that lost families its engine served on the last good page, with no restart between, is refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from policies.types import EngineSnapshot
from service.sources.continuity import ACCEPT_AFTER_PAGES, CutDetector, present_fields, vanished_fields
from service.sources.vllm import parse_vllm_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURE = (FIXTURES / "vllm/vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt").read_text()
T = 1_800_000_000.0


def read(text: str) -> EngineSnapshot:
    return parse_vllm_metrics(text, taken_at_s=T)["tiny"]


def cut_after(text: str, family: str) -> str:
    """`text` cut at the line boundary after the last line of `family` (a complete line: no parse error)."""
    lines = text.split("\n")
    last = max(i for i, line in enumerate(lines) if line.startswith(family))
    return "\n".join(lines[: last + 1]) + "\n"


FULL = read(CAPTURE)
CUT = read(cut_after(CAPTURE, "vllm:prompt_tokens_total"))


def test_the_real_capture_cut_after_prompt_tokens_parses_but_lost_the_step_time_families() -> None:
    # The hole: on its own the cut page is a valid page; the ITL and generation families are simply absent.
    assert FULL.inter_token_latency is not None and FULL.generation_tokens is not None
    assert CUT.inter_token_latency is None and CUT.generation_tokens is None
    assert {"inter_token_latency", "generation_tokens"} <= set(vanished_fields(FULL, CUT))


def test_a_cut_page_of_the_same_engine_is_refused_and_the_next_whole_page_read() -> None:
    detector = CutDetector()
    assert detector.check({"tiny": FULL}) is None
    refused = detector.check({"tiny": CUT})
    assert refused is not None
    model, vanished = refused
    assert model == "tiny"
    assert "inter_token_latency" in vanished
    assert detector.check({"tiny": FULL}) is None


def test_the_first_page_has_nothing_to_lose() -> None:
    assert CutDetector().check({"tiny": CUT}) is None


def test_a_restart_that_turned_speculation_off_is_read_as_off() -> None:
    # The epoch moved by a process start-up (tens of seconds) and the counters restarted from zero.
    assert FULL.created_s is not None
    restarted = replace(FULL, spec=None, created_s=FULL.created_s + 40.0, generation_tokens=0.0)
    detector = CutDetector()
    detector.check({"tiny": FULL})
    assert detector.check({"tiny": restarted}) is None


def test_counters_that_went_down_mark_a_restart_without_any_epoch() -> None:
    no_epoch = replace(FULL, created_s=None)
    restarted = replace(no_epoch, spec=None, generation_tokens=0.0)
    assert vanished_fields(no_epoch, restarted) == ()
    # Without an epoch and with no counter going down, spec vanishing is a cut.
    assert vanished_fields(no_epoch, replace(no_epoch, spec=None)) == ("spec",)


def test_an_epoch_moved_by_less_than_a_second_is_the_same_engine() -> None:
    # A cut that drops the earliest-registered family moves the page's earliest `_created` by a millisecond.
    assert FULL.created_s is not None
    moved = replace(CUT, created_s=FULL.created_s + 0.001)
    assert "inter_token_latency" in vanished_fields(FULL, moved)


def test_the_same_shape_refused_several_times_in_a_row_becomes_the_engine_shape() -> None:
    detector = CutDetector()
    detector.check({"tiny": FULL})
    outcomes = [detector.check({"tiny": CUT}) for _ in range(ACCEPT_AFTER_PAGES)]
    assert all(o is not None for o in outcomes[:-1])
    assert outcomes[-1] is None
    # Now the reduced shape is the last good page: the next such page is read.
    assert detector.check({"tiny": CUT}) is None


def test_cuts_at_different_lines_keep_being_refused() -> None:
    other = read(cut_after(CAPTURE, "vllm:num_preemptions_total"))
    assert present_fields(other) != present_fields(CUT)
    detector = CutDetector()
    detector.check({"tiny": FULL})
    outcomes = [detector.check({"tiny": page}) for page in (CUT, other, CUT, other, CUT, other)]
    assert all(o is not None for o in outcomes)


def two_engines(text: str) -> str:
    """The capture as a data-parallel server's page: every engine="0" sample line followed by an engine="1" copy."""
    out: list[str] = []
    for line in text.split("\n"):
        out.append(line)
        if 'engine="0"' in line and not line.startswith("#"):
            out.append(line.replace('engine="0"', 'engine="1"'))
    return "\n".join(out)


def test_a_data_parallel_page_cut_between_two_engines_lines_is_refused() -> None:
    # The cut falls after engine 0's prompt_tokens line: that family's sum drops to engine 0's alone, which is not a
    # restart (the epoch is the same), and the ITL and generation families are gone.
    dp2 = two_engines(CAPTURE)
    whole = parse_vllm_metrics(dp2, taken_at_s=T)["tiny"]
    lines = dp2.split("\n")
    engine_0 = next(i for i, line in enumerate(lines) if line.startswith('vllm:prompt_tokens_total{engine="0"'))
    cut = parse_vllm_metrics("\n".join(lines[: engine_0 + 1]) + "\n", taken_at_s=T + 5)["tiny"]
    assert whole.engines == cut.engines == 2
    assert cut.prompt_tokens is not None and whole.prompt_tokens is not None
    assert cut.prompt_tokens < whole.prompt_tokens  # one engine's count, not both
    detector = CutDetector()
    assert detector.check({"tiny": whole}) is None
    refused = detector.check({"tiny": cut})
    assert refused is not None and "inter_token_latency" in refused[1]
