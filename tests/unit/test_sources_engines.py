"""Telling the engine from the page, and each adapter's reading of its engine's exposition (fixtures in
tests/fixtures/<engine>/, each naming the engine version and source file it follows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.sources.engines import EngineKind, engines_on, parse_engine_page
from service.sources.errors import ScrapeError, ScrapeErrorReason

FIXTURES = Path(__file__).parents[1] / "fixtures"
SGLANG = FIXTURES / "sglang" / "sglang-0.5.23-eagle-k3.txt"
TRTLLM = FIXTURES / "trtllm" / "trtllm-050f80d-eagle3-k3.txt"
VLLM = FIXTURES / "vllm" / "vllm-0.32.0-cpu-ngram-k3-idle.txt"


def reason(text: str, engine: EngineKind = EngineKind.AUTO) -> tuple[ScrapeErrorReason, str]:
    with pytest.raises(ScrapeError) as caught:
        parse_engine_page(text, taken_at_s=1.0, engine=engine)
    return caught.value.reason, caught.value.detail


@pytest.mark.parametrize(
    ("path", "kind", "naming"),
    [(SGLANG, EngineKind.SGLANG, "sglang"), (TRTLLM, EngineKind.TRTLLM, "trtllm"), (VLLM, EngineKind.VLLM, "vllm-v1")],
)
def test_each_fixture_is_told_and_read_by_its_adapter(path: Path, kind: EngineKind, naming: str) -> None:
    text = path.read_text()
    assert engines_on(text) == [kind]
    [snapshot] = parse_engine_page(text, taken_at_s=5.0).values()
    assert snapshot.naming == naming
    assert snapshot.taken_at_s == 5.0
    # The same page with the engine set explicitly reads the same.
    assert parse_engine_page(text, taken_at_s=5.0, engine=kind) == parse_engine_page(text, taken_at_s=5.0)


def test_a_page_mixing_two_engines_is_refused_naming_both() -> None:
    mixed = VLLM.read_text() + SGLANG.read_text()
    why, detail = reason(mixed)
    assert why is ScrapeErrorReason.MIXED_ENGINES
    assert "vllm" in detail and "sglang" in detail


def test_a_page_of_another_engine_than_the_target_says_is_refused() -> None:
    why, detail = reason(SGLANG.read_text(), EngineKind.VLLM)
    assert why is ScrapeErrorReason.MIXED_ENGINES
    assert "sglang" in detail and "the target says vllm" in detail


def test_a_page_of_no_known_engine_names_what_it_carries() -> None:
    page = (
        "# HELP tgi_request_count Requests\n# TYPE tgi_request_count counter\ntgi_request_count 12\n"
        "tgi_queue_size 3\nprocess_cpu_seconds_total 1.5\n"
    )
    why, detail = reason(page)
    assert why is ScrapeErrorReason.UNKNOWN_ENGINE
    assert "tgi_" in detail and "process_" in detail
    assert "vllm:" in detail and "sglang:" in detail  # what it looked for


def test_garbage_is_a_parse_error_not_an_unknown_engine() -> None:
    assert reason("<html><body>502 Bad Gateway</body></html>\n")[0] is ScrapeErrorReason.PARSE


def test_a_prefix_inside_a_label_value_or_comment_does_not_count() -> None:
    # Only sample lines starting with the prefix tell the engine.
    page = '# HELP x mentions vllm:num_requests_running\nx{note="sglang:spec"} 1\n'
    assert engines_on(page) == []


@pytest.mark.parametrize(
    "line",
    ['sglang:num_running_reqs{{model_name="m{i}",tp_rank="0"}} 1.0',
     'trtllm_num_requests_running{{engine_type="pytorch",model_name="m{i}",pid="1"}} 1.0'],
)
def test_a_page_naming_many_models_is_refused(line: str) -> None:
    page = "".join(line.format(i=i) + "\n" for i in range(9))
    why, detail = reason(page)
    assert why is ScrapeErrorReason.TOO_MANY_SERIES and "MAX_MODELS_PER_PAGE" in detail
