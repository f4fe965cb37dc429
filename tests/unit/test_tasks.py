"""`service.tasks.cancel_and_wait`: a task that loses a cancellation is cancelled again until it ends."""

from __future__ import annotations

import asyncio

import pytest

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
    async def scenario() -> tuple[bool, int]:
        swallowed: list[int] = []
        task = asyncio.create_task(_swallows_first_cancel(swallowed))
        await asyncio.sleep(0)
        async with asyncio.timeout(10):  # a hang fails here instead of stalling the run
            await cancel_and_wait(task, retry_s=0.01)
        return task.cancelled(), len(swallowed)

    cancelled, swallowed = asyncio.run(scenario())
    assert cancelled and swallowed == 1


def test_a_single_cancel_would_not_end_it() -> None:
    """The case the helper exists for: one `cancel()` and an await never return."""

    async def scenario() -> bool:
        task = asyncio.create_task(_swallows_first_cancel([]))
        await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.2)
        task.cancel()
        await asyncio.wait({task})
        return bool(done)

    assert asyncio.run(scenario()) is False


def test_a_finished_task_keeps_its_result_and_an_error_stays_on_the_task() -> None:
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    async def scenario() -> tuple[int, BaseException | None]:
        finished = asyncio.create_task(asyncio.sleep(0, result=7))
        await finished
        await cancel_and_wait(finished)
        failing = asyncio.create_task(fails_when_cancelled())
        await asyncio.sleep(0)
        await cancel_and_wait(failing)
        return finished.result(), failing.exception()

    result, error = asyncio.run(scenario())
    assert result == 7
    assert isinstance(error, RuntimeError) and str(error) == "cleanup failed"


def test_cancelling_the_waiter_propagates() -> None:
    async def scenario() -> None:
        task = asyncio.create_task(_swallows_first_cancel([1, 1]))
        await asyncio.sleep(0)
        waiter = asyncio.create_task(cancel_and_wait(task, retry_s=3600))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    asyncio.run(scenario())
