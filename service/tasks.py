"""Stopping background tasks for certain.

`task.cancel()` asks once, and the request can be lost: Python 3.11's `asyncio.wait_for` returns its inner result
when the cancellation lands in the same loop turn the inner call finishes (gh-86296), and a library's cancel scope
can do the same. A loop such as the leader election's attempt-sleep-attempt then goes on forever and whoever awaits
it (a shutdown, a test's teardown) hangs. `cancel_and_wait` asks again every `retry_s` until the task has ended.
"""

from __future__ import annotations

import asyncio
from typing import Any

from service.logs import fields, get_logger

_log = get_logger("tasks")
_SLOW_STOP_S = 1.0  # cancelling for this long without the task ending is logged (once): a bug somewhere below


async def cancel_and_wait(
    task: asyncio.Task[Any], *, grace_s: float = 0.0, retry_s: float = 0.1
) -> BaseException | None:
    """Let `task` finish by itself for up to `grace_s` seconds, then cancel it and wait until it has ended,
    cancelling it again every `retry_s` seconds while it runs; the exception it ended with (None when it was
    cancelled, returned, or was already done with no error), retrieved so the caller decides whether to log it.
    Cancelling the caller cancels the wait (the task is left cancelling).

    Example: a task that swallows the first CancelledError and sleeps on is cancelled again during that sleep and
    ends there; cancel_and_wait returns None.
    """
    if grace_s > 0.0 and not task.done():
        await asyncio.wait({task}, timeout=grace_s)
    waited_s, logged = 0.0, False
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_s)
        waited_s += retry_s
        if waited_s >= _SLOW_STOP_S and not logged and not task.done():
            logged = True
            _log.warning("a background task keeps running after being cancelled; cancelling it again every "
                         f"{retry_s:g} s", extra=fields(task=task.get_name()))
    return None if task.cancelled() else task.exception()
