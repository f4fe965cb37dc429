"""Load for the real vLLM server: /v1/completions with greedy decoding over a fixed mix of prompts.

The tiny random model falls into repetition loops under greedy decoding, so n-gram drafts from repetitive prompts
are mostly accepted; prose and code openings without repeats are not. Mixing both gives partial acceptance at
every position, which is what makes the per-position comparisons meaningful.
"""

from __future__ import annotations

import asyncio
import time

import httpx

MAX_TOKENS = 64
# vLLM's uvicorn closes a keep-alive connection idle for 5 s; a client that reuses one just as it closes reads
# nothing back (httpx.ReadError). Expire ours first, and retry a request once on such a transport error: a real
# client does the same, and the load, not the connection handling, is what these tests measure.
LIMITS = httpx.Limits(keepalive_expiry=2.0)

PROMPTS: tuple[str, ...] = (
    "the cat sat on the mat " * 6,
    "a b c d a b c d a b c d ",
    "for i in range(10): print(i)\n" * 4,
    "import os\nimport sys\ndef main():\n    parser = argparse",
    "class Foo(object):\n    def __init__(self, x, y):",
    "Once upon a time in a land far away there lived",
    "def fibonacci(n): return n if n < 2 else",
    "SELECT name, price FROM items WHERE price > 10 ORDER BY",
)


async def complete(
    client: httpx.AsyncClient, base_url: str, *, model: str, prompt: str, max_tokens: int = MAX_TOKENS
) -> int:
    """One greedy completion; returns the completion tokens the server reports."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    try:
        response = await client.post(f"{base_url}/v1/completions", json=body)
    except (httpx.ReadError, httpx.RemoteProtocolError):
        response = await client.post(f"{base_url}/v1/completions", json=body)
    response.raise_for_status()
    tokens: int = response.json()["usage"]["completion_tokens"]
    return tokens


async def run_requests(base_url: str, *, model: str, count: int, concurrency: int) -> int:
    """`count` requests cycling through PROMPTS, at most `concurrency` in flight; returns the tokens generated."""
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120.0, limits=LIMITS) as client:

        async def one(index: int) -> int:
            async with semaphore:
                return await complete(client, base_url, model=model, prompt=PROMPTS[index % len(PROMPTS)])

        results = await asyncio.gather(*(one(i) for i in range(count)))
    return sum(results)


async def run_for(
    base_url: str, *, model: str, concurrency: int, duration_s: float, max_tokens: int = MAX_TOKENS
) -> int:
    """Closed-loop load: `concurrency` workers each send one request after the other until `duration_s` passed
    (requests in flight then finish). Bounded in time by construction; returns the requests completed.
    """
    deadline = time.monotonic() + duration_s
    async with httpx.AsyncClient(timeout=120.0, limits=LIMITS) as client:

        async def worker(offset: int) -> int:
            done = 0
            while time.monotonic() < deadline:
                prompt = PROMPTS[(offset + done) % len(PROMPTS)]
                await complete(client, base_url, model=model, prompt=prompt, max_tokens=max_tokens)
                done += 1
            return done

        results = await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return sum(results)


async def run_waves(
    base_url: str, *, model: str, wave: int, period_s: float, duration_s: float, max_tokens: int = MAX_TOKENS
) -> int:
    """Open-loop load: `wave` requests sent together every `period_s` until `duration_s` passed, whether or not
    the previous wave has finished (a wave is skipped while more than two waves are still out). Returns the
    requests completed.

    Why not closed-loop: on 2 cores vLLM's CPU engine ran one request at a time for seconds on end under a closed
    loop of 32 clients (its log: 'Running: 1 reqs' for 5-15 s between 1-2 s bursts of 32): its front end shares a
    core with the engine's loop and admits what has piled up in bursts. Waves keep up to three waves outstanding,
    so each burst admits more (46-75 running in the log of a wave run); the pauses between bursts remain.
    """
    deadline = time.monotonic() + duration_s
    async with httpx.AsyncClient(timeout=120.0, limits=LIMITS) as client:
        tasks: set[asyncio.Task[int]] = set()
        done = 0
        sent = 0
        while time.monotonic() < deadline:
            finished = {t for t in tasks if t.done()}
            done += sum(t.result() > 0 for t in finished)
            tasks -= finished
            if len(tasks) <= 2 * wave:
                for _ in range(wave):
                    prompt = PROMPTS[sent % len(PROMPTS)]
                    tasks.add(asyncio.create_task(
                        complete(client, base_url, model=model, prompt=prompt, max_tokens=max_tokens)
                    ))
                    sent += 1
            await asyncio.sleep(period_s)
        results = await asyncio.gather(*tasks)
    return done + sum(r > 0 for r in results)
