"""SGLang's page -> EngineSnapshot (service/sources/sglang.py). Expected numbers are worked by hand from the
fixture's values (its header states them)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.scraper import EngineScraper
from service.sources.sglang import K_NOT_SHOWN, parse_sglang_metrics

PAGE = (Path(__file__).parents[1] / "fixtures" / "sglang" / "sglang-0.5.23-eagle-k3.txt").read_text()
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LABELS = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0"'


def one(text: str) -> object:
    [snapshot] = parse_sglang_metrics(text, taken_at_s=1.0).values()
    return snapshot


def test_the_fixture_reads_as_verify_steps_and_accepted_drafts() -> None:
    snapshot = parse_sglang_metrics(PAGE, taken_at_s=1.0)[MODEL]
    assert snapshot.spec is not None
    assert snapshot.spec.drafts == 32771  # spec_verify_calls_total
    assert snapshot.spec.accepted_tokens == 88912 - 412 - 32771  # generated - requests - verify steps = 55729
    assert snapshot.spec.draft_tokens == 32771 * 3  # spec_num_draft_tokens 4 - 1 slots per verify
    assert snapshot.spec.deployed_k == 3 and not snapshot.spec.positions_measured
    assert (snapshot.num_requests_running, snapshot.num_requests_waiting) == (8, 2)
    assert snapshot.kv_cache_usage_ratio == pytest.approx(0.07)
    assert snapshot.kv_cache_capacity_tokens == 203472
    assert snapshot.created_s is None  # multiprocess mode writes no _created
    # ITL: 490.29 s over 88500 tokens at (88912 - 412) / 32771 = 2.7006 tokens per request-step -> 32770.6 steps
    assert snapshot.inter_token_latency is not None
    assert snapshot.inter_token_latency.sum == pytest.approx(490.29)
    assert snapshot.inter_token_latency.count == pytest.approx(32771, rel=1e-9)  # 88500 x 32771 / 88500


def page(*, steps: str | None = "3.0", verify: str | None = "100.0", generated: str = "400.0",
         requests: str = "50.0", accept_length: str = "2.5", extra: str = "") -> str:
    lines = [
        f"sglang:num_running_reqs{{{LABELS},tp_rank=\"0\"}} 4.0",
        f"sglang:num_queue_reqs{{{LABELS},tp_rank=\"0\"}} 1.0",
        f"sglang:spec_accept_length{{{LABELS},tp_rank=\"0\"}} {accept_length}",
        f'sglang:generation_tokens_total{{engine_type="unified",is_streaming="true",model_name="m"}} {generated}',
        f'sglang:num_requests_total{{engine_type="unified",is_streaming="true",model_name="m"}} {requests}',
    ]
    if steps is not None:
        lines.append(f"sglang:spec_num_steps{{{LABELS},tp_rank=\"0\"}} {steps}")
    if verify is not None:
        lines.append(f'sglang:spec_verify_calls_total{{engine_type="unified",model_name="m"}} {verify}')
    return "\n".join(lines) + "\n" + extra


def test_speculation_off_is_k_zero_with_no_verify_step_or_no_gauges() -> None:
    assert one(page(steps="0.0", verify=None, accept_length="0.0")).spec is None  # type: ignore[attr-defined]
    assert one(page(steps=None, verify=None, accept_length="0.0")).spec is None  # type: ignore[attr-defined]


def test_before_the_first_finished_request_the_counts_are_zero_not_off() -> None:
    spec = one(page(verify=None, generated="0", requests="0")).spec  # type: ignore[attr-defined]
    assert spec is not None and spec.drafts == 0 and spec.deployed_k == 3


def test_streaming_and_non_streaming_counters_add_up() -> None:
    extra = ('sglang:generation_tokens_total{engine_type="unified",is_streaming="false",model_name="m"} 50.0\n'
             'sglang:num_requests_total{engine_type="unified",is_streaming="false",model_name="m"} 10.0\n')
    spec = one(page(extra=extra)).spec  # type: ignore[attr-defined]
    # (400 + 50) generated - (50 + 10) requests - 100 verify steps = 290 accepted drafts
    assert spec.accepted_tokens == 290


def test_an_old_sglang_with_speculation_on_but_no_verify_counter_is_a_missing_family() -> None:
    with pytest.raises(ScrapeError) as caught:
        parse_sglang_metrics(page(steps=None, verify=None), taken_at_s=1.0)
    assert caught.value.reason is ScrapeErrorReason.MISSING_FAMILY
    assert "0.5.13" in caught.value.detail


@pytest.mark.parametrize(
    ("generated", "requests", "verify"),
    [("100.0", "50.0", "100.0"),  # fewer tokens than one per request plus one per verify step
     ("10000.0", "0.0", "100.0")],  # 9900 accepted > MAX_K (64) x 100 verify steps
)
def test_counts_sglang_cannot_produce_are_invalid(generated: str, requests: str, verify: str) -> None:
    with pytest.raises(ScrapeError) as caught:
        parse_sglang_metrics(page(generated=generated, requests=requests, verify=verify), taken_at_s=1.0)
    assert caught.value.reason is ScrapeErrorReason.INVALID_VALUE


def test_a_fractional_k_is_invalid() -> None:
    with pytest.raises(ScrapeError) as caught:
        parse_sglang_metrics(page(steps="2.5"), taken_at_s=1.0)
    assert caught.value.reason is ScrapeErrorReason.INVALID_VALUE


def test_every_tp_rank_exporting_is_read_once_per_dp_rank() -> None:
    # --enable-metrics-for-all-schedulers: tp ranks 0 and 1 of dp ranks 0 and 1 all export num_running_reqs.
    lines = [
        f'sglang:num_running_reqs{{dp_rank="{dp}",{LABELS},tp_rank="{tp}"}} {5.0 + dp}'
        for dp in (0, 1) for tp in (0, 1)
    ] + [f'sglang:num_queue_reqs{{dp_rank="{dp}",{LABELS},tp_rank="0"}} 1.0' for dp in (0, 1)]
    snapshot = one("\n".join(lines) + "\n")
    assert snapshot.num_requests_running == 5.0 + 6.0  # type: ignore[attr-defined]
    assert snapshot.engines == 2  # type: ignore[attr-defined]


def test_an_adaptive_tier_of_zero_steps_is_speculating_with_k_not_shown() -> None:
    spec = one(page(steps="0.0")).spec  # type: ignore[attr-defined]
    assert spec is not None and spec.declared_k == K_NOT_SHOWN and spec.drafts == 100
    assert spec.accepted_tokens == 400 - 50 - 100


def test_the_scraper_takes_a_hidden_k_from_the_last_page_that_showed_it() -> None:
    pages = iter([page(steps="0.0"), page(steps="3.0"), page(steps="0.0", verify="120.0", generated="500.0")])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=next(pages))

    async def scrape_three() -> list[object]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            scraper = EngineScraper(client, "http://sglang:30000/metrics")
            results: list[object] = []
            for t in (1.0, 2.0, 3.0):
                try:
                    results.append((await scraper.scrape(t))["m"].spec)
                except ScrapeError as exc:
                    results.append(exc.reason)
            return results

    first, second, third = asyncio.run(scrape_three())
    assert first is ScrapeErrorReason.MISSING_FAMILY  # no page has shown k yet
    assert second.deployed_k == 3  # type: ignore[attr-defined]
    assert third.deployed_k == 3 and third.draft_tokens == 120 * 3  # type: ignore[attr-defined]


def test_a_tier_change_never_lowers_the_draft_tokens_nor_refuses_the_page() -> None:
    # k 3 for 100 verify steps (2.5 accepted per step so far), then a tier of k 1 for 50 more: the lifetime mean
    # exceeds the new k, which is not an invalid page, and the draft tokens run on: 300 + 50 x 1 = 350.
    pages = iter([page(steps="3.0", verify="100.0", generated="400.0", requests="50.0"),
                  page(steps="1.0", verify="150.0", generated="500.0", requests="55.0")])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=next(pages))

    async def scrape_two() -> list[object]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            scraper = EngineScraper(client, "http://sglang:30000/metrics")
            return [(await scraper.scrape(t))["m"].spec for t in (1.0, 2.0)]

    first, second = asyncio.run(scrape_two())
    assert first.draft_tokens == 300 and first.deployed_k == 3  # type: ignore[attr-defined]
    assert second.deployed_k == 1 and second.draft_tokens == 350  # type: ignore[attr-defined]
    assert second.accepted_tokens == 500 - 55 - 150  # type: ignore[attr-defined]
