"""Stopping background tasks for certain.

`task.cancel()` asks once, and the request can be lost: Python 3.11's `asyncio.wait_for` returns its inner result
when the cancellation lands in the same loop turn the inner call finishes (gh-86296), and a library's cancel scope
can do the same. A loop such as the leader election's attempt-sleep-attempt then goes on forever and whoever awaits
it (a shutdown, a test's teardown) hangs. `cancel_and_wait` asks again every `retry_s` until the task has ended.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any], *, retry_s: float = 0.1) -> None:
    """Cancel `task` and wait until it has ended, cancelling it again every `retry_s` seconds while it runs.

    What it raised, or its cancellation, is left on the task; a task already done is left as it is. Example: a task
    that swallows the first CancelledError and sleeps on is cancelled again during that sleep and ends there.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_s)
