"""An HTTP face for the simulated world, shaped like a vLLM server: `/metrics`, `/health`, `/v1/models`; and, at
`/dcgm/metrics`, the page a dcgm-exporter beside it would serve (the sidecar's telemetry "dcgm" reads it).

Plus the actuation a real deployment would receive, `POST /sim/speculation` (a restart with a new
`num_speculative_tokens`), and `GET /sim/state` for a live view. Simulated time runs off an injected wall clock:
`sim = world start + (clock() - clock at construction) x time_scale`; the world is advanced lazily on each request,
so an idle server costs nothing and a fake clock makes tests exact.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4
from pydantic import BaseModel, ConfigDict, Field

from service.sim.scenario import MAX_SPECULATIVE_TOKENS
from service.sim.world import EngineUnavailableError, World
from service.tasks import cancel_and_wait

_STOP_GRACE_S = 5.0  # s uvicorn gets to finish open requests at stop() before its task is cancelled


class SpeculationRequest(BaseModel):
    """Body of POST /sim/speculation: the new k (0 turns speculation off)."""

    model_config = ConfigDict(extra="forbid")

    num_speculative_tokens: int = Field(ge=0, le=MAX_SPECULATIVE_TOKENS)


class SimServer:
    """Serves one World over HTTP on `host:port` (port 0 = an ephemeral port, read back through `url`)."""

    def __init__(
        self,
        world: World,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self._world = world
        self._host = host
        self._port = port
        self._time_scale = time_scale
        self._clock = clock
        self._clock_origin = clock()
        self._sim_origin = world.now_s
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._bound_port: int | None = None
        self.app = self._build_app()

    @property
    def url(self) -> str:
        if self._bound_port is None:
            raise RuntimeError("SimServer is not started")
        return f"http://{self._host}:{self._bound_port}"

    def sim_now_s(self) -> float:
        """The simulated time that corresponds to the clock's current reading."""
        return self._sim_origin + (self._clock() - self._clock_origin) * self._time_scale

    async def start(self) -> None:
        """Bind, start serving in a background task, and return once the server accepts connections."""
        if self._task is not None:
            raise RuntimeError("SimServer already started")
        # Binding here (not inside uvicorn) makes port 0 resolve before start() returns.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, self._port))
        except OSError:
            sock.close()
            raise
        self._bound_port = int(sock.getsockname()[1])
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # re-raise why it stopped
                raise RuntimeError("simulated server exited during start-up")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop serving and wait for the server task to finish."""
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        failed = await cancel_and_wait(self._task, grace_s=_STOP_GRACE_S)  # uvicorn finishes open requests first
        self._server = None
        self._task = None
        if failed is not None:
            raise RuntimeError("the simulated server's task failed") from failed

    def _advance(self) -> float:
        now = self.sim_now_s()
        self._world.advance_to(now)
        return now

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="spec-advisor simulated vLLM server", docs_url=None, redoc_url=None)
        world = self._world

        @app.get("/metrics")
        async def metrics() -> Response:
            self._advance()
            try:
                body = world.exposition()
            except EngineUnavailableError as exc:
                return _unavailable(exc)
            return PlainTextResponse(body, media_type=CONTENT_TYPE_PLAIN_0_0_4)

        @app.get("/dcgm/metrics")
        async def dcgm_metrics() -> Response:
            # What a dcgm-exporter next to the engine serves; the GPU stays up while the engine restarts.
            self._advance()
            return PlainTextResponse(world.dcgm_exposition(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

        @app.get("/health")
        async def health() -> Response:
            self._advance()
            if not world.serving:
                return _unavailable(EngineUnavailableError(world.now_s + world.restart_remaining_s))
            return Response(status_code=200)

        @app.get("/v1/models")
        async def models() -> Response:
            self._advance()
            if not world.serving:
                return _unavailable(EngineUnavailableError(world.now_s + world.restart_remaining_s))
            return JSONResponse(
                {"object": "list", "data": [{"id": world.model_name, "object": "model", "owned_by": "vllm"}]}
            )

        @app.post("/sim/speculation", status_code=202)
        async def set_speculation(body: SpeculationRequest) -> dict[str, Any]:
            now = self._advance()
            world.set_speculation(body.num_speculative_tokens, now_s=now)
            return self._state()

        @app.get("/sim/state")
        async def state() -> dict[str, Any]:
            self._advance()
            return self._state()

        return app

    def _state(self) -> dict[str, Any]:
        w = self._world
        life = w.lifetime
        return {
            "model_name": w.model_name,
            "sim_time_s": w.now_s,
            "serving": w.serving,
            "restart_remaining_s": w.restart_remaining_s,
            "num_speculative_tokens": w.num_speculative_tokens,
            "arrival_rate_per_s": w.arrival_rate_per_s,
            "num_requests_running": w.num_running,
            "num_requests_waiting": w.num_waiting,
            "kv_cache_usage_ratio": w.kv_cache_usage_ratio,
            "conditional_acceptance": list(w.conditional_acceptance),
            "completed_requests": life.completed_requests,
            "generated_tokens": life.generated_tokens,
            "lost_requests": life.lost_requests,
        }


def _unavailable(exc: EngineUnavailableError) -> Response:
    return PlainTextResponse(str(exc), status_code=503, headers={"Retry-After": "1"})
