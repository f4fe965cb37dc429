"""service/loadgen.py against an in-process stand-in for vLLM's /v1/completions (httpx.MockTransport).

Levels run in simulated time: the stand-in advances a fake clock by each request's service time, so a level's
deadline, its drain and the dead-server rule follow the requests, not the wall clock, and no assertion depends on
how fast this machine is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import httpx
import pytest

from service.loadgen import DEAD_AFTER_S, ClosedLoop, LevelResult, run_closed_loop

BASE_URL = "http://vllm.test"
MODEL = "tiny"
PROMPTS = ("the cat sat on the mat", "a b c d", "def main():")
TOKENS = 64
# The level the tests run unless they say otherwise: 4 clients for 10 s of fake time.
LOAD = ClosedLoop(
    model=MODEL, concurrency=4, duration_s=10.0, max_tokens=TOKENS, prompts=PROMPTS, request_timeout_s=30.0
)


@dataclass
class FakeClock:
    now_s: float = 1000.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class StandIn:
    """A completions server: each request takes `service_s` of fake time; `answer` decides what it returns."""

    clock: FakeClock
    service_s: float = 0.5
    answer: Callable[[int], httpx.Response | Exception] = field(
        default=lambda _: httpx.Response(200, json={"usage": {"completion_tokens": TOKENS}})
    )
    bodies: list[dict[str, object]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    served_ok: int = 0
    hang: bool = False

    async def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.method == "POST"
        assert request.url == f"{BASE_URL}/v1/completions"
        index = len(self.bodies)
        self.bodies.append(json.loads(request.content))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            for _ in range(3):  # let the other clients' requests arrive while this one is "running"
                await asyncio.sleep(0)
            self.clock.now_s += self.service_s
            if self.hang:
                await asyncio.Event().wait()
            outcome = self.answer(index)
        finally:
            self.in_flight -= 1
        if isinstance(outcome, Exception):
            raise outcome
        if outcome.status_code == 200:
            self.served_ok += 1
        return outcome


def _run(
    stand_in: StandIn, load: ClosedLoop = LOAD, *, on_progress: Callable[[float], None] | None = None
) -> LevelResult:
    async def go() -> LevelResult:
        transport = httpx.MockTransport(stand_in.handle)
        async with httpx.AsyncClient(transport=transport) as client:
            return await run_closed_loop(client, BASE_URL, load, on_progress=on_progress, clock=stand_in.clock)

    return asyncio.run(go())


def test_counts_requests_and_tokens_the_server_served() -> None:
    stand_in = StandIn(FakeClock())
    result = _run(stand_in, replace(LOAD, concurrency=4, duration_s=10.0))

    # Every answered request is counted once, with the tokens its usage reported; nothing failed.
    assert result.errors == 0
    assert not result.stopped_early
    assert result.concurrency == 4
    assert result.requests == stand_in.served_ok == len(stand_in.bodies)
    assert result.completion_tokens == TOKENS * result.requests
    # 4 clients kept 4 requests in flight, never more.
    assert stand_in.max_in_flight == 4
    # The level ran at least its duration of (fake) time, and tokens/s is tokens over that time.
    assert result.duration_s >= 10.0
    assert result.tokens_per_s == pytest.approx(result.completion_tokens / result.duration_s)


def test_request_bodies_are_greedy_completions_cycling_through_the_prompts() -> None:
    stand_in = StandIn(FakeClock())
    _run(stand_in, replace(LOAD, concurrency=2, duration_s=5.0, max_tokens=17))

    assert len(stand_in.bodies) >= 2 * len(PROMPTS)
    for i, body in enumerate(stand_in.bodies):
        assert body == {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 17, "temperature": 0.0}


def test_requests_in_flight_at_the_deadline_are_awaited_and_counted() -> None:
    # Each request takes 3 s of a 1 s level: every client sends exactly one, which ends after the deadline.
    stand_in = StandIn(FakeClock(), service_s=3.0)
    result = _run(stand_in, replace(LOAD, concurrency=5, duration_s=1.0))

    assert len(stand_in.bodies) == 5
    assert result.requests == 5
    assert result.completion_tokens == 5 * TOKENS
    assert result.errors == 0
    assert result.duration_s > 1.0  # the drain is part of the level's time


def test_http_errors_and_unusable_bodies_are_counted_not_raised() -> None:
    def answer(index: int) -> httpx.Response:
        if index % 3 == 1:
            return httpx.Response(500, json={"error": "boom"})
        if index % 3 == 2:
            return httpx.Response(200, json={"choices": []})  # no usage: unusable
        return httpx.Response(200, json={"usage": {"completion_tokens": TOKENS}})

    stand_in = StandIn(FakeClock(), answer=answer)
    result = _run(stand_in, replace(LOAD, concurrency=3, duration_s=10.0))

    sent = len(stand_in.bodies)
    good = sum(1 for i in range(sent) if i % 3 == 0)
    assert result.requests == good
    assert result.errors == sent - good
    assert result.completion_tokens == TOKENS * good
    assert not result.stopped_early  # successes keep arriving: the server is not dead


def test_a_transport_error_is_retried_once() -> None:
    # Every odd attempt fails with a reset connection and the retry that follows it succeeds: no errors, and
    # the server saw two attempts per counted request.
    def answer(index: int) -> httpx.Response | Exception:
        if index % 2 == 0:
            return httpx.ReadError("connection reset")
        return httpx.Response(200, json={"usage": {"completion_tokens": TOKENS}})

    stand_in = StandIn(FakeClock(), answer=answer)
    result = _run(stand_in, replace(LOAD, concurrency=1, duration_s=5.0))

    assert result.errors == 0
    assert result.requests > 0
    assert len(stand_in.bodies) == 2 * result.requests


def test_a_transport_error_that_repeats_on_the_retry_is_one_failed_request() -> None:
    answers: list[httpx.Response | Exception] = [
        httpx.ConnectError("refused"), httpx.ConnectError("refused"),  # request 1: attempt and retry fail
        httpx.Response(200, json={"usage": {"completion_tokens": 7}}),  # request 2
    ]  # fmt: skip

    def answer(index: int) -> httpx.Response | Exception:
        return answers[index] if index < len(answers) else httpx.Response(200, json={"usage": {"completion_tokens": 7}})

    stand_in = StandIn(FakeClock(), answer=answer)
    result = _run(stand_in, replace(LOAD, concurrency=1, duration_s=2.0))

    assert result.errors == 1
    assert result.requests == len(stand_in.bodies) - 2
    assert result.completion_tokens == 7 * result.requests


def test_a_request_past_its_timeout_is_a_failure() -> None:
    stand_in = StandIn(FakeClock(), service_s=2.0, hang=True)  # answers nothing, ever
    result = _run(stand_in, replace(LOAD, concurrency=3, duration_s=1.0, request_timeout_s=0.05))

    assert result.requests == 0
    assert result.errors == 3
    assert result.completion_tokens == 0


def test_stops_early_when_the_server_is_dead() -> None:
    # Connection refused on every attempt, 1 s of fake time each: after DEAD_AFTER_S of nothing but failures the
    # level ends long before its hour.
    stand_in = StandIn(FakeClock(), service_s=1.0, answer=lambda _: httpx.ConnectError("refused"))
    result = _run(stand_in, replace(LOAD, concurrency=2, duration_s=3600.0))

    assert result.stopped_early
    assert result.requests == 0
    assert result.errors > 0
    assert result.duration_s < 3600.0


def test_stops_early_when_the_server_dies_mid_level_and_keeps_what_it_had() -> None:
    served_before_death = 6

    def answer(index: int) -> httpx.Response | Exception:
        if index < served_before_death:
            return httpx.Response(200, json={"usage": {"completion_tokens": TOKENS}})
        return httpx.ConnectError("refused")

    stand_in = StandIn(FakeClock(), service_s=1.0, answer=answer)
    result = _run(stand_in, replace(LOAD, concurrency=2, duration_s=3600.0))

    assert result.stopped_early
    assert result.requests == served_before_death
    assert result.completion_tokens == served_before_death * TOKENS
    assert result.errors > 0
    assert result.duration_s < 3600.0


def test_a_short_failure_streak_does_not_stop_the_level() -> None:
    # Failures for less than DEAD_AFTER_S of fake time (2 x 1 s), then the server recovers: the level runs on.
    def answer(index: int) -> httpx.Response | Exception:
        if 4 <= index < 8:  # two requests of one client, each an attempt and its retry
            return httpx.ConnectError("refused")
        return httpx.Response(200, json={"usage": {"completion_tokens": TOKENS}})

    stand_in = StandIn(FakeClock(), service_s=1.0, answer=answer)
    assert 2 * stand_in.service_s < DEAD_AFTER_S
    result = _run(stand_in, replace(LOAD, concurrency=1, duration_s=20.0))

    assert not result.stopped_early
    assert result.errors == 2
    assert result.duration_s >= 20.0


def test_progress_is_reported_as_a_fraction_ending_at_one() -> None:
    fractions: list[float] = []
    result = _run(StandIn(FakeClock()), replace(LOAD, concurrency=2, duration_s=10.0), on_progress=fractions.append)

    assert result.errors == 0
    assert fractions, "no progress was reported"
    assert all(0.0 <= f <= 1.0 for f in fractions)
    assert fractions == sorted(fractions)
    assert fractions[-1] == 1.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 513}, "concurrency"),
        ({"concurrency": 2.0}, "concurrency"),
        ({"duration_s": 0.5}, "duration_s"),
        ({"duration_s": 3601.0}, "duration_s"),
        ({"duration_s": float("nan")}, "duration_s"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 4097}, "max_tokens"),
        ({"prompts": ()}, "prompts"),
        ({"prompts": "one prompt"}, "prompts"),
        ({"request_timeout_s": 0.0}, "request_timeout_s"),
    ],
)
def test_bad_arguments_raise_value_error_before_any_request(overrides: dict[str, object], message: str) -> None:
    stand_in = StandIn(FakeClock())
    arguments: dict[str, object] = {
        "concurrency": 2, "duration_s": 5.0, "max_tokens": 8, "prompts": PROMPTS, "request_timeout_s": 30.0,
    }  # fmt: skip
    arguments.update(overrides)

    async def go() -> LevelResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(stand_in.handle)) as client:
            return await run_closed_loop(client, BASE_URL, ClosedLoop(model=MODEL, **arguments), clock=stand_in.clock)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match=message):
        asyncio.run(go())
    assert stand_in.bodies == []


def test_level_result_tokens_per_s() -> None:
    # 2560 tokens in 10.5 s = 243.8 tokens/s; a level that took no time reports 0, not a division error.
    assert LevelResult(2, 10.5, 40, 2560, 0).tokens_per_s == pytest.approx(2560 / 10.5)
    assert LevelResult(1, 0.0, 0, 0, 0).tokens_per_s == 0.0
