"""`service.tasks.cancel_and_wait`: a task that loses a cancellation is cancelled again until it ends; and the
leader election's stop, which hung a CI run when Python 3.11's `wait_for` swallowed the one cancel it sent."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from lightkube import AsyncClient

from policies.act.leader import ElectionConfig
from service.actuators.leader import Clocks, LeaseElector, LeaseName
from service.tasks import cancel_and_wait


async def _swallows_first_cancel(swallowed: list[int]) -> None:
    """What a loop around 3.11's `wait_for` does when the cancel lands as the inner call finishes: it goes on."""
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(1)


def test_a_task_that_swallows_a_cancel_is_cancelled_again_and_ends() -> None:
    async def scenario() -> tuple[bool, int, BaseException | None]:
        swallowed: list[int] = []
        task = asyncio.create_task(_swallows_first_cancel(swallowed))
        await asyncio.sleep(0)
        async with asyncio.timeout(10):  # a hang fails here instead of stalling the run
            error = await cancel_and_wait(task, retry_s=0.01)
        return task.cancelled(), len(swallowed), error

    cancelled, swallowed, error = asyncio.run(scenario())
    assert cancelled and swallowed == 1 and error is None


def test_a_finished_task_keeps_its_result_and_an_error_is_returned() -> None:
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    async def scenario() -> tuple[int, BaseException | None, BaseException | None]:
        finished = asyncio.create_task(asyncio.sleep(0, result=7))
        await finished
        done_error = await cancel_and_wait(finished)
        failing = asyncio.create_task(fails_when_cancelled())
        await asyncio.sleep(0)
        return finished.result(), done_error, await cancel_and_wait(failing)

    result, done_error, error = asyncio.run(scenario())
    assert result == 7 and done_error is None
    assert isinstance(error, RuntimeError) and str(error) == "cleanup failed"


def test_cancelling_the_waiter_propagates() -> None:
    async def scenario() -> None:
        task = asyncio.create_task(_swallows_first_cancel([]))
        await asyncio.sleep(0)
        waiter = asyncio.create_task(cancel_and_wait(task, retry_s=3600))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await cancel_and_wait(task, retry_s=0.01)  # leave nothing running

    asyncio.run(scenario())


def test_the_leader_election_stops_although_an_attempt_swallowed_the_cancel() -> None:
    """stop() cancels run() while an attempt is in flight; the attempt returns instead of raising (3.11's wait_for
    when the inner call finishes in the same loop turn), so run() sleeps and attempts again. One cancel and an await
    never returned; stop() must."""

    async def scenario() -> int:
        config = ElectionConfig(identity="a_0001", lease_duration_s=2, renew_deadline_s=1.0, retry_period_s=0.05)
        # No jitter: a pause of exactly 0.05 s, so the loop usually starts a second attempt before the next cancel
        # (which lands either in that pause or in that attempt: both must end the loop).
        elector = LeaseElector(cast(AsyncClient, object()), lease=LeaseName("ns", "lease"), config=config,
                               clocks=Clocks(jitter=lambda: 0.0))
        attempts: list[int] = []

        async def attempt() -> bool:
            attempts.append(1)
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if len(attempts) == 1:
                    return False  # the first cancel is lost
                raise
            return False

        cast(Any, elector).attempt = attempt
        elector.start()
        await asyncio.sleep(0.01)
        async with asyncio.timeout(10) as bound:  # a hang ends here (and a cancel-swallowing stop eats it)
            await elector.stop()
        assert not bound.expired()
        return len(attempts)

    assert asyncio.run(scenario()) >= 1  # the first attempt lost the cancel; stop() ended the loop anyway
