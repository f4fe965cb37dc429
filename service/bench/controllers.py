"""The policies the benchmark compares, as controllers: at each decision tick, the k the engine should run.

A controller returns the desired number of draft tokens (0 = off); the runner restarts the world only when that
differs from what it runs. Static policies need no controller: they are a world built with their configuration
from the start (see `runner.PolicySpec`).
"""

from __future__ import annotations

from typing import Protocol

from service.sim.world import World


class Controller(Protocol):
    """Decides at each tick from what it may see; `world` is the truth (only the oracle reads more than load)."""

    async def choose(self, world: World, now_s: float) -> int: ...
