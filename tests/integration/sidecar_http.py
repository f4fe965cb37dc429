"""Real HTTP on 127.0.0.1 for the sidecar's integration tests: run any ASGI app under uvicorn on an ephemeral port,
a stdlib HTTP server in a thread (a stand-in peer), and a capture server that replays a vLLM /metrics capture with
its speculative counters growing per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from http.server import HTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn

_Server = TypeVar("_Server", bound=HTTPServer)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@contextlib.contextmanager
def served_in_thread(server: _Server) -> Iterator[_Server]:
    """`server` answering from a daemon thread until the block ends; then shut down, closed and joined."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Run `app` under uvicorn on 127.0.0.1:0 (lifespan on); yields its base URL and shuts it down after."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="auto")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # uvicorn gave up: surface why
            raise RuntimeError("uvicorn stopped before starting")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


class CaptureServer:
    """Serves a capture at /metrics. Request n (1-based) multiplies every `vllm:spec_decode_*_total` sample and
    `vllm:generation_tokens_total` by n, so each scrape sees the capture's acceptance ratios again over a fresh
    delta (a static page would give a zero delta), and the page stays one a real engine could serve (every
    verification emits a token: drafts never pass the generated tokens). `status` can be set to make it fail.
    """

    def __init__(self, capture: Path) -> None:
        self._lines = capture.read_text(encoding="utf-8").splitlines()
        self.requests = 0
        self.status = 200

    def body(self, factor: int) -> str:
        out: list[str] = []
        for line in self._lines:
            if line.startswith(("vllm:spec_decode_", "vllm:generation_tokens_total")) and "_total{" in line:
                series, value = line.rsplit(" ", 1)
                out.append(f"{series} {float(value) * factor}")
            else:
                out.append(line)
        return "\n".join(out) + "\n"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()  # lifespan.startup
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.requests += 1
        if self.status != 200:
            payload, status = b"unavailable\n", self.status
        else:
            payload, status = self.body(self.requests).encode(), 200
        headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


async def wait_for(
    client: httpx.AsyncClient,
    url: str,
    accept: Callable[[httpx.Response], bool],
    *,
    deadline_s: float = 20.0,
) -> httpx.Response:
    """Poll `url` until `accept(response)`; fails after `deadline_s` (a bound on waiting, not a timing assertion)."""
    give_up = time.monotonic() + deadline_s
    while True:
        response = await client.get(url)
        if accept(response):
            return response
        if time.monotonic() > give_up:
            raise AssertionError(f"{url} never reached the expected state; last answer {response.status_code}: "
                                 f"{response.text[:500]}")
        await asyncio.sleep(0.05)
