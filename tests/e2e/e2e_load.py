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
